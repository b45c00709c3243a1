// Holds whose outcome is unknown, oldest first: what to look up at Stripe, and
// (for admins) a button that asks Stripe by sending the request again under the
// same idempotency key, and buttons that resolve each as committed or released.

import {get, post, query, pathId} from '../api.js';
import {h, replace, table, timeEl, money, ago, announce, keepFocus, changes, keyLink, opCode, idWithCopy} from '../dom.js';
import {errorBox, confirm, message} from '../ui.js';

// MAX_PAGES bounds how many pages of 500 the page reads (unknown holds are rare:
// each is a request Stripe did not answer).
const MAX_PAGES = 10;

export function mount(main, ctx) {
  document.title = 'Unknown holds · keybrake';
  const notice = h('div', {class: 'notice-region'});
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  main.append(h('h1', null, 'Holds whose outcome is unknown'),
    h('div', {class: 'explain'},
      h('p', null, 'keybrake sent these requests to Stripe and got no answer (a timeout, a dropped connection, a 5xx), so the money may or may not have moved. Their amounts stay held against the caps until a retry of the same request settles them or you resolve them here.'),
      h('p', null, 'To check one: in the Stripe Dashboard, open the request logs (Developers › Logs) and search for the ',
        h('strong', null, 'Stripe Idempotency-Key'), ' shown below. If a request with it succeeded, the money moved: resolve as ',
        h('strong', null, 'committed'), '. If there is none, or it failed, resolve as ', h('strong', null, 'released'), '.')),
    notice, region);

  const changed = changes();

  async function load() {
    const holds = [];
    let cursor = '';
    let truncated = false;
    try {
      for (let i = 0; ; i += 1) {
        if (i === MAX_PAGES) {
          truncated = true;
          break;
        }
        const page = await get(`/holds${query({state: 'unknown', limit: 500, cursor})}`);
        holds.push(...page.holds);
        cursor = page.next_cursor;
        if (!cursor) break;
      }
    } catch (err) {
      replace(region, errorBox(err, 'The holds could not be loaded'));
      changed.reset();
      return;
    }
    holds.sort((a, b) => new Date(a.created_at) - new Date(b.created_at));
    if (!changed([holds, truncated])) return;
    keepFocus(region, () => replace(region,
      truncated ? message('warn', h('p', null, `Only the newest ${holds.length} are listed.`)) : null,
      table({
        caption: 'Unknown holds, oldest first',
        empty: 'No hold has an unknown outcome: nothing to resolve.',
        columns: [
          {label: 'Sent', cell: (hd) => [timeEl(hd.created_at), h('br'), h('span', {class: 'muted'}, ago(hd.created_at))]},
          {label: 'Key', cell: (hd) => [keyLink(hd.key_id, hd.key_name), h('br'), h('code', {class: 'muted small-id'}, hd.key_id)]},
          {label: 'Operation', cell: (hd) => opCode(hd.operation)},
          {label: 'Amount', class: 'num', cell: (hd) => money(hd.amount, hd.currency)},
          {label: 'Stripe Idempotency-Key', cell: (hd) => idWithCopy(hd.upstream_idempotency_key, 'Stripe Idempotency-Key')},
          {label: "Caller's idempotency key", cell: (hd) => idWithCopy(hd.idempotency_key, 'idempotency key')},
          ctx.isAdmin ? {label: 'Resolve', cell: (hd) => h('div', {class: 'actions'},
            h('button', {type: 'button', class: 'button small', 'data-action': 'ask-stripe', 'data-focus-id': `ask:${hd.id}`, onclick: () => askStripe(hd)}, 'Ask Stripe'),
            h('button', {type: 'button', class: 'button secondary small', 'data-action': 'commit', 'data-focus-id': `commit:${hd.id}`, onclick: () => resolve(hd, 'committed')}, 'Committed'),
            h('button', {type: 'button', class: 'button secondary small', 'data-action': 'release', 'data-focus-id': `release:${hd.id}`, onclick: () => resolve(hd, 'released')}, 'Released'))} : null,
        ].filter(Boolean),
        rows: holds,
      })));
  }

  async function askStripe(hold) {
    const ok = await confirm({
      title: 'Ask Stripe?',
      content: [
        h('p', null, `keybrake sends this request to Stripe again, with the same Stripe Idempotency-Key, as the caller's own retry would be. If Stripe executed it the first time, it answers with that execution and no money moves again; if it never did, it executes it now and ${money(hold.amount, hold.currency)} may move on ${hold.key_name}.`),
        h('p', null, 'The hold is then settled from Stripe\'s answer, and you are told which of the two happened.'),
      ],
      action: 'Send it to Stripe again',
    });
    if (!ok) return;
    try {
      const res = await post(`/holds/${pathId(hold.id)}/ask-stripe`, {});
      const what = res.stripe === 'replayed'
        ? 'Stripe had executed it: it replayed its first answer, and no money moved again.'
        : 'Stripe had not executed it: it executed it now.';
      const kind = res.outcome === 'unknown' ? 'warn' : 'success';
      replace(notice, message(kind, h('p', {'data-ask-result': res.stripe}, what, ' ',
        res.outcome === 'unknown' ? 'Its answer still leaves the outcome unknown.' : `The hold of ${money(hold.amount, hold.currency)} is ${res.outcome}.`)));
      announce(`Asked Stripe: ${res.stripe}, ${res.outcome}.`);
    } catch (err) {
      replace(notice, errorBox(err, 'Stripe was not asked'));
    }
    await load();
  }

  async function resolve(hold, outcome) {
    const moved = outcome === 'committed';
    const ok = await confirm({
      title: `Resolve as ${outcome}?`,
      content: [
        h('p', null, moved
          ? `Stripe did execute this request: ${money(hold.amount, hold.currency)} counts as committed against the caps of ${hold.key_name}.`
          : `Stripe did not execute this request: the ${money(hold.amount, hold.currency)} held on ${hold.key_name} is released.`),
        h('p', null, 'A retry with the same idempotency key then gets an answer saying what you decided, and moves no money. This cannot be undone.'),
      ],
      action: moved ? 'Resolve as committed' : 'Resolve as released',
    });
    if (!ok) return;
    try {
      await post(`/holds/${pathId(hold.id)}/resolve`, {outcome});
      replace(notice, message('success', h('p', null, `The hold of ${money(hold.amount, hold.currency)} is resolved as ${outcome}.`)));
      announce(`Resolved as ${outcome}.`);
    } catch (err) {
      replace(notice, errorBox(err, 'The hold was not resolved'));
    }
    await load();
  }

  load();
  return {refresh: load};
}
