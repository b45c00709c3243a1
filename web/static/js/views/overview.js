// The overview: what an operator opens first.

import {get} from '../api.js';
import {h, replace, section, table, timeEl, money, badge, ago, changes, keyLink, modeBadge, opCode} from '../dom.js';
import {errorBox} from '../ui.js';
import {NEAR} from '../money.js';

export function mount(main) {
  document.title = 'Overview · keybrake';
  const asOf = h('span');
  const body = h('div', {class: 'overview'}, h('p', {class: 'loading'}, 'Loading…'));
  main.append(h('h1', null, 'Overview'), body);
  const changed = changes();

  async function load() {
    let ov;
    try {
      ov = await get('/overview');
    } catch (err) {
      replace(body, errorBox(err, 'The overview could not be loaded'));
      changed.reset();
      return;
    }
    replace(asOf, timeEl(ov.time));
    if (!changed({...ov, time: null})) return;
    replace(body,
      h('p', {class: 'asof muted'}, 'As of ', asOf, '. Keys: ',
        h('a', {href: '#/keys?status=active'}, `${ov.keys.active} active`), ', ',
        h('a', {href: '#/keys?status=revoked'}, `${ov.keys.revoked} revoked`), ', ',
        h('a', {href: '#/keys?status=expired'}, `${ov.keys.expired} expired`), '.'),
      // What needs an operator comes first, above the fold of a phone.
      h('div', {class: 'cards'},
        unknownCard(ov),
        refusedKeysCard(ov),
        spendCards(ov)),
      section('Keys near their caps',
        h('p', {class: 'hint'}, `Active keys whose daily or period window is at ${ov.near_cap_percent ?? NEAR} % of its cap or more (committed + held), fullest first.`),
        table({
          caption: 'Keys near their caps',
          empty: 'No key is near its cap.',
          columns: [
            {label: 'Key', cell: (n) => [keyLink(n.key_id, n.name), ' ', modeBadge(n.mode)]},
            {label: 'Window', cell: (n) => n.window},
            {label: 'Used', class: 'num', cell: usedBadge},
            {label: 'Committed', class: 'num', cell: (n) => n.committed},
            {label: 'Held', class: 'num', cell: (n) => n.held},
            {label: 'Cap', class: 'num', cell: (n) => money(n.cap, n.currency)},
            {label: 'Resets', cell: (n) => timeEl(n.reset_at, n.timezone)},
          ],
          rows: ov.near_cap,
        }),
        ov.near_cap_total > ov.near_cap.length ? h('p', {class: 'hint'}, `${ov.near_cap_total - ov.near_cap.length} more not listed.`) : null),
      section('Refusals in the last hour',
        h('p', null, h('strong', {class: 'big-number'}, String(ov.refusals.total)),
          ` refused since `, timeEl(ov.refusals.since),
          ov.refusals.truncated ? ' (at least: the ledger was too busy to count all)' : ''),
        table({
          caption: 'Refusals in the last hour by reason',
          empty: 'Nothing was refused in the last hour.',
          columns: [
            {label: 'Reason', cell: (r) => h('code', null, r.reason || '—')},
            {label: 'Decision', cell: (r) => (r.decision === 'would_refuse' ? badge('would refuse (report mode)', 'warn') : badge('refused', 'bad'))},
            {label: 'Count', class: 'num', cell: (r) => String(r.count)},
          ],
          rows: ov.refusals.by_reason,
        })));
  }

  load();
  return {refresh: load};
}

function spendCards(ov) {
  if (ov.spend.length === 0) {
    return h('div', {class: 'card'}, h('h2', null, 'Spend'), h('p', {class: 'empty'}, 'No key has spent anything yet.'));
  }
  return ov.spend.map((c) => {
    const cur = c.currency.toUpperCase();
    return h('div', {class: 'card'},
      h('h2', null, `Spend in ${cur}`),
      h('p', null, h('strong', {class: 'big-number'}, c.today.committed), ` ${cur} committed today`),
      h('table', {class: 'spend'},
        h('caption', {class: 'visually-hidden'}, `Spend in ${cur}`),
        h('thead', null, h('tr', null, h('td'), h('th', {scope: 'col'}, 'Committed'), h('th', {scope: 'col'}, 'Held'))),
        h('tbody', null,
          h('tr', null, h('th', {scope: 'row'}, 'Today'), h('td', null, c.today.committed), h('td', null, c.today.held)),
          h('tr', null, h('th', {scope: 'row'}, 'This period'), h('td', null, c.period.committed), h('td', null, c.period.held)))),
      h('p', {class: 'hint'}, `${c.keys === 1 ? '1 key' : `${c.keys} keys`} in a current billing period. Today is each key's own day, in its time zone.`));
  });
}

function unknownCard(ov) {
  const u = ov.unknown_holds;
  return h('div', {class: ['card', u.count > 0 && 'card-alert']},
    h('h2', null, 'Outcome unknown'),
    h('p', null, h('strong', {class: 'big-number'}, String(u.count)),
      u.count === 1 ? ' hold whose outcome is unknown' : ' holds whose outcome is unknown'),
    u.count > 0 ? [
      h('p', {class: 'hint'}, 'Stripe did not answer these requests: the money may have moved. Check them at Stripe, then resolve them.'),
      h('ul', {class: 'plain unknown-list'}, u.oldest.map((hd) => h('li', null,
        keyLink(hd.key_id, hd.key_name), ': ', money(hd.amount, hd.currency), ' · ', opCode(hd.operation), ' · ', ago(hd.created_at)))),
      u.count > u.oldest.length ? h('p', {class: 'hint'}, `The ${u.oldest.length} oldest of ${u.count}.`) : null,
      h('p', null, h('a', {class: 'button secondary small', href: '#/holds'}, 'Review unknown holds')),
    ] : h('p', {class: 'hint'}, 'Nothing to resolve.'));
}

// usedBadge words a near-cap window: an enforcing key at its cap refuses; a
// report-mode key past it lets through what would have been refused.
function usedBadge(n) {
  if (n.mode === 'report') {
    return badge(n.used_percent >= 100 ? `${n.used_percent} % · would have been refused` : `${n.used_percent} %`, 'info');
  }
  return badge(n.used_percent >= 100 ? `${n.used_percent} % · at cap` : `${n.used_percent} %`, n.used_percent >= 100 ? 'bad' : 'warn');
}

// refusedKeysCard names the revoked and expired keys that requests still use,
// and counts the tokens that are no key's.
function refusedKeysCard(ov) {
  const r = ov.refused_keys;
  const u = ov.unknown_keys;
  const alert = r.total > 0;
  return h('div', {class: ['card', 'refused-keys', alert && 'card-warn']},
    h('h2', null, 'Refused vault keys'),
    r.total > 0 ? [
      h('p', null, h('strong', {class: 'big-number'}, String(r.total)),
        r.total === 1 ? ' revoked or expired key still in use' : ' revoked or expired keys still in use',
        h('span', {class: 'muted'}, ' (last 24 h)')),
      h('ul', {class: 'plain refused-list'}, r.keys.map((k) => h('li', null, keyLink(k.key_id, k.name), ': ', refusedText(k.refused, k.status)))),
    ] : h('p', {class: 'hint'}, 'No revoked or expired key was used in the last 24 hours.'),
    h('p', {class: 'hint unknown-tokens'}, u.count > 0
      ? [`${u.count} ${u.count === 1 ? 'request' : 'requests'} with a token that is no vault key's since this keybrake process started`,
        u.last ? [', the last ', ago(u.last), u.remote_addr ? ` from ${u.remote_addr}` : '', u.path ? ` (${u.path})` : ''] : null, '.']
      : 'No request with an unknown token since this keybrake process started.'));
}

// refusedText says how often a key was refused for its status, when last and
// from where: "refused 14 times since it was revoked, last 2 min ago, from 10.0.4.7".
export function refusedText(r, status) {
  const since = r.code === 'vault_key_expired' || status === 'expired' ? 'since it expired' : 'since it was revoked';
  return `refused ${r.count === 1 ? 'once' : `${r.count} times`} ${since}, last ${ago(r.last)}${r.remote_addr ? `, from ${r.remote_addr}` : ''}${r.path ? ` (${r.path})` : ''}`;
}
