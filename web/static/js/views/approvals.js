// The approvals inbox: money requests a key's policy holds for a person's
// decision, newest first, with (for admins) approve and decline, each with a
// note. Below it, the approvals decided lately.

import {get, post, query, pathId} from '../api.js';
import {h, replace, table, timeEl, money, ago, announce, keepFocus, changes, keyLink, opCode, badge} from '../dom.js';
import {errorBox, message, openDialog, field} from '../ui.js';

const stateBadge = {
  pending: 'badge-warn', approved: 'badge-info', used: 'badge-ok', declined: 'badge-bad', expired: 'badge-muted',
};

export function mount(main, ctx) {
  document.title = 'Approvals · keybrake';
  const notice = h('div', {class: 'notice-region'});
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  const recent = h('div');
  main.append(h('h1', null, 'Approvals'),
    h('div', {class: 'explain'},
      h('p', null, 'These requests are above their key\'s approval threshold. Their amounts are held against the caps and nothing was sent to Stripe. Approved, the caller\'s next retry of the same request is forwarded once; declined, the hold is released and every retry is refused.')),
    notice, region, h('h2', null, 'Decided lately'), recent);

  const changed = changes();

  async function load() {
    let pending;
    let all;
    try {
      pending = (await get(`/approvals${query({state: 'pending', limit: 500})}`)).approvals;
      all = (await get(`/approvals${query({limit: 50})}`)).approvals;
    } catch (err) {
      replace(region, errorBox(err, 'The approvals could not be loaded'));
      changed.reset();
      return;
    }
    const decided = all.filter((a) => a.state !== 'pending');
    if (!changed([pending, decided])) return;
    keepFocus(region, () => replace(region, table({
      caption: 'Pending approvals, newest first',
      empty: 'No request waits for a decision.',
      columns: [
        {label: 'Amount', class: 'num', cell: (a) => money(a.amount, a.currency)},
        {label: 'Key', cell: (a) => keyLink(a.key_id, a.key_name)},
        {label: 'Operation', cell: (a) => opCode(a.operation)},
        {label: 'Customer', cell: (a) => (a.customer ? h('code', null, a.customer) : h('span', {class: 'muted'}, '—'))},
        {label: 'Reason', cell: (a) => (a.reason ? h('span', {class: 'approval-reason'}, a.reason) : h('span', {class: 'muted'}, 'none given'))},
        {label: 'Age', cell: (a) => [h('span', null, ago(a.created_at)), h('br'), h('span', {class: 'muted'}, 'expires ', timeEl(a.expires_at))]},
        ctx.isAdmin ? {label: 'Decide', cell: (a) => h('div', {class: 'actions'},
          h('button', {type: 'button', class: 'button small', 'data-action': 'approve', 'data-focus-id': `approve:${a.id}`, onclick: () => decide(a, 'approve')}, 'Approve'),
          h('button', {type: 'button', class: 'button secondary small', 'data-action': 'decline', 'data-focus-id': `decline:${a.id}`, onclick: () => decide(a, 'decline')}, 'Decline'))} : null,
      ].filter(Boolean),
      rows: pending,
    })));
    replace(recent, table({
      caption: 'Approvals decided lately',
      empty: 'None yet.',
      columns: [
        {label: 'State', cell: (a) => badge(a.state, stateBadge[a.state])},
        {label: 'Amount', class: 'num', cell: (a) => money(a.amount, a.currency)},
        {label: 'Key', cell: (a) => keyLink(a.key_id, a.key_name)},
        {label: 'By', cell: (a) => a.decided_by || h('span', {class: 'muted'}, '—')},
        {label: 'Note', cell: (a) => a.note || ''},
        {label: 'Asked', cell: (a) => timeEl(a.created_at)},
      ],
      rows: decided,
    }));
  }

  async function decide(a, verb) {
    let detail;
    try {
      detail = await get(`/approvals/${pathId(a.id)}`);
    } catch (err) {
      replace(notice, errorBox(err, 'The approval could not be read'));
      return;
    }
    const note = h('input', {type: 'text', name: 'note', maxlength: '500', autocomplete: 'off'});
    const params = h('dl', {class: 'approval-params'},
      ...detail.parameters.flatMap((p) => [h('dt', null, h('code', null, p.name)), h('dd', null, h('code', null, p.value))]));
    let failed = null;
    const ok = await openDialog({
      title: `${verb === 'approve' ? 'Approve' : 'Decline'} ${money(a.amount, a.currency)} on ${a.key_name}?`,
      content: [
        h('p', null, verb === 'approve'
          ? 'The caller\'s next retry of this request, with the same idempotency key, is forwarded to Stripe once.'
          : 'The hold is released; the caller is told the request was declined, on every retry.'),
        detail.reason ? h('p', null, h('strong', null, 'Reason: '), detail.reason) : null,
        params,
        field({name: 'note', label: 'Note (kept in the audit log)', control: note}),
      ],
      buttons: [
        {label: 'Cancel', value: false, kind: 'secondary'},
        {label: verb === 'approve' ? 'Approve' : 'Decline', value: true, kind: verb === 'approve' ? 'primary' : 'danger'},
      ],
      onSubmit: async () => {
        try {
          await post(`/approvals/${pathId(a.id)}/${verb}`, {note: note.value});
          failed = null;
        } catch (err) {
          failed = err;
        }
        return true;
      },
    });
    if (!ok) return;
    if (failed) {
      replace(notice, errorBox(failed, 'The approval was not decided'));
    } else {
      const done = verb === 'approve' ? 'approved' : 'declined';
      replace(notice, message('success', h('p', null, `${money(a.amount, a.currency)} on ${a.key_name} is ${done}.`)));
      announce(`The approval is ${done}.`);
    }
    await load();
  }

  load();
  return {refresh: load};
}
