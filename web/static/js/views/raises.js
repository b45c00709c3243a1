// Raise requests from vault keys: the pending ones, with (for admins) buttons
// that approve or decline each, and the ones decided lately.

import {get, post, query, pathId} from '../api.js';
import {h, replace, table, timeEl, money, ago, announce, keepFocus, changes, keyLink, badge} from '../dom.js';
import {errorBox, confirm, message} from '../ui.js';

const WINDOWS = {daily: 'daily cap', period: 'period cap', per_request: 'per-request cap'};

export function mount(main, ctx) {
  document.title = 'Raise requests · keybrake';
  const notice = h('div', {class: 'notice-region'});
  const pendingRegion = h('div', {class: 'pending-region'}, h('p', {class: 'loading'}, 'Loading…'));
  const decidedRegion = h('div', {class: 'decided-region'});
  main.append(h('h1', null, 'Raise requests'),
    h('div', {class: 'explain'},
      h('p', null, 'Vault keys (agents) ask here for more room on one of their caps, for a while and with a reason. Nothing changes until an admin approves: the raise is then added to the key and ends by itself at its end time. A key may have at most 5 requests pending.')),
    notice,
    h('section', null, h('h2', null, 'Pending'), pendingRegion),
    h('section', null, h('h2', null, 'Decided lately'), decidedRegion));

  const changed = changes();

  async function load() {
    let pending;
    let decided;
    try {
      [pending, decided] = await Promise.all([
        get(`/raise-requests${query({state: 'pending', limit: 500})}`),
        get(`/raise-requests${query({limit: 50})}`),
      ]);
    } catch (err) {
      replace(pendingRegion, errorBox(err, 'The raise requests could not be loaded'));
      changed.reset();
      return;
    }
    const done = decided.raise_requests.filter((r) => r.state !== 'pending');
    if (!changed([pending, done])) return;
    const common = [
      {label: 'Asked', cell: (r) => [timeEl(r.created_at), h('br'), h('span', {class: 'muted'}, ago(r.created_at))]},
      {label: 'Key', cell: (r) => keyLink(r.key_id, r.key_name)},
      {label: 'Raise', cell: (r) => [money(r.amount, r.currency), ` more on the ${WINDOWS[r.window] || r.window}`]},
      {label: 'Until', cell: (r) => timeEl(r.until)},
      {label: 'Reason', cell: (r) => r.reason || h('span', {class: 'muted'}, 'none given')},
    ];
    keepFocus(pendingRegion, () => replace(pendingRegion, table({
      caption: 'Pending raise requests, newest first',
      empty: 'No raise request is pending.',
      columns: [...common,
        ctx.isAdmin ? {label: 'Decide', cell: (r) => h('div', {class: 'actions'},
          h('button', {type: 'button', class: 'button secondary small', 'data-action': 'approve', 'data-focus-id': `approve:${r.id}`, onclick: () => decide(r, true)}, 'Approve'),
          h('button', {type: 'button', class: 'button secondary small', 'data-action': 'decline', 'data-focus-id': `decline:${r.id}`, onclick: () => decide(r, false)}, 'Decline'))} : null,
      ].filter(Boolean),
      rows: pending.raise_requests,
    })));
    replace(decidedRegion, table({
      caption: 'Raise requests decided lately, newest first',
      empty: 'No raise request was decided yet.',
      columns: [...common,
        {label: 'Decision', cell: (r) => [badge(r.state, r.state === 'approved' ? 'ok' : 'bad'), ' by ', r.decided_by,
          r.note ? [h('br'), h('span', {class: 'muted'}, r.note)] : null]},
      ],
      rows: done,
    }));
  }

  async function decide(r, approve) {
    const what = `${money(r.amount, r.currency)} more on the ${WINDOWS[r.window] || r.window} of ${r.key_name}`;
    const ok = await confirm({
      title: approve ? 'Approve this raise?' : 'Decline this raise?',
      content: [h('p', null, approve
        ? `${what} until ${new Date(r.until).toLocaleString()}. The cap is back by itself then; what is spent meanwhile stays counted.`
        : `The key keeps its caps as they are (${what} was asked).`)],
      action: approve ? 'Approve' : 'Decline',
      danger: !approve,
    });
    if (!ok) return;
    try {
      await post(`/raise-requests/${pathId(r.id)}/${approve ? 'approve' : 'decline'}`, {});
      replace(notice, message('success', h('p', null, approve ? `Approved: ${what}.` : `Declined: ${what}.`)));
      announce(approve ? 'Approved.' : 'Declined.');
    } catch (err) {
      replace(notice, errorBox(err, 'The raise request was not decided'));
    }
    await load();
  }

  load();
  return {refresh: load};
}
