// The key list: filter by status and label, search by name, page through; each
// key's daily and period usage as bars with their numbers. Keys near or at a cap
// stand out.

import {get, query} from '../api.js';
import {h, replace, table, timeEl, statusBadge, labelChips, keepFocus, id, announce, changes, modeBadge, badge} from '../dom.js';
import {errorBox, field} from '../ui.js';
import {usageBar, windowState} from '../money.js';

const PAGE = 25;

export function mount(main, ctx) {
  document.title = 'Keys · keybrake';
  const filters = {
    status: ctx.query.get('status') || '',
    label: ctx.query.get('label') || '',
    q: ctx.query.get('q') || '',
  };
  const cursors = ['']; // the cursor of each page visited; the last is the current page
  const listRegion = h('div', {class: 'key-list', 'aria-live': 'off'});
  const pager = h('nav', {class: 'pager', 'aria-label': 'Pages of keys'});

  const status = h('select', {name: 'status'},
    [['', 'Any status'], ['active', 'Active'], ['revoked', 'Revoked'], ['expired', 'Expired']]
      .map(([v, l]) => h('option', {value: v, selected: v === filters.status}, l)));
  const label = h('input', {name: 'label', type: 'text', value: filters.label, placeholder: 'customer_id:cus_123', autocomplete: 'off', spellcheck: 'false'});
  const search = h('input', {name: 'q', type: 'search', value: filters.q, placeholder: 'vault_key_cust_', autocomplete: 'off', spellcheck: 'false'});
  const form = h('form', {class: 'filters', role: 'search', 'aria-label': 'Filter keys', method: 'post'},
    field({name: 'status', label: 'Status', control: status}),
    field({name: 'label', label: 'Label (key:value)', control: label}),
    field({name: 'q', label: 'Name starts with', control: search}),
    h('div', {class: 'actions'},
      h('button', {type: 'submit', class: 'button secondary'}, 'Apply'),
      h('a', {href: '#/keys', class: 'button link'}, 'Clear')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    ctx.navigate(`/keys${query({status: status.value, label: label.value.trim(), q: search.value.trim()})}`);
  });

  const titleId = id('keys');
  main.append(
    h('div', {class: 'page-head'},
      h('h1', {id: titleId}, 'Keys'),
      ctx.isAdmin ? h('a', {class: 'button primary', href: '#/mint', 'data-action': 'mint'}, 'Mint a key') : null),
    form, listRegion, pager);

  const changed = changes();

  async function load() {
    const cursor = cursors[cursors.length - 1];
    let list;
    let usage = new Map();
    let unknown = new Map();
    try {
      list = await get(`/keys${query({...filters, limit: PAGE, cursor})}`);
      if (list.keys.length > 0) {
        // Unknown holds are rare (each is a request Stripe did not answer):
        // one page of them flags the keys that need an operator.
        const [u, holds] = await Promise.all([
          get(`/usage${query({ids: list.keys.map((k) => k.id).join(',')})}`),
          get(`/holds${query({state: 'unknown', limit: 500})}`),
        ]);
        usage = new Map(u.usage.map((x) => [x.key_id, x]));
        unknown = unknownByKey(holds.holds);
      }
    } catch (err) {
      replace(listRegion, errorBox(err, 'The keys could not be loaded'));
      replace(pager);
      changed.reset();
      return;
    }
    if (!changed([cursors, list, [...usage.values()], [...unknown.entries()]])) return;
    keepFocus(listRegion, () => replace(listRegion, keyTable(list.keys, usage, unknown, filters)));
    keepFocus(pager, () => replace(pager,
      cursors.length > 1 ? h('button', {type: 'button', class: 'button secondary', 'data-focus-id': 'prev', onclick: () => {
        cursors.pop();
        load().then(() => announce(`Page ${cursors.length}`));
      }}, '← Previous') : null,
      cursors.length > 1 || list.next_cursor ? h('span', {class: 'muted'}, `Page ${cursors.length}`) : null,
      list.next_cursor ? h('button', {type: 'button', class: 'button secondary', 'data-focus-id': 'next', onclick: () => {
        cursors.push(list.next_cursor);
        load().then(() => announce(`Page ${cursors.length}`));
      }}, 'Next →') : null));
  }

  load();
  return {refresh: load};
}

// unknownByKey counts unknown holds per key id.
export function unknownByKey(holds) {
  const m = new Map();
  for (const hd of holds) m.set(hd.key_id, (m.get(hd.key_id) || 0) + 1);
  return m;
}

function keyTable(keys, usage, unknown, filters) {
  const filtered = filters.status || filters.label || filters.q;
  return table({
    caption: 'Vault keys',
    empty: filtered ? 'No key matches these filters.' : 'No vault key yet.',
    rowClass: (k) => {
      if (unknown.has(k.id)) return 'row-full row-unknown';
      const u = usage.get(k.id);
      const states = u ? [windowState(u.daily), windowState(u.period)] : [];
      if (k.policy.mode === 'report' && states.some(Boolean)) return 'row-report'; // what would be refused, not a broken cap
      if (states.includes('full')) return 'row-full';
      if (states.includes('near')) return 'row-near';
      return null;
    },
    columns: [
      {label: 'Name', cell: (k) => [h('a', {class: 'key-name', href: `#/keys/${encodeURIComponent(k.id)}`, 'data-focus-id': `key:${k.id}`}, k.name),
        modeBadge(k.policy.mode) ? [' ', modeBadge(k.policy.mode)] : null,
        unknown.has(k.id) ? [' ', h('a', {class: 'unknown-flag', href: '#/holds', title: 'Holds whose outcome is unknown: check them at Stripe and resolve them'},
          badge(`${unknown.get(k.id)} unknown ${unknown.get(k.id) === 1 ? 'hold' : 'holds'}`, 'bad'))] : null]},
      {label: 'Labels', cell: (k) => labelChips(k.labels)},
      {label: 'Status', cell: (k) => statusBadge(usage.get(k.id)?.status || k.status)},
      {label: 'Currency', cell: (k) => k.policy.currency.toUpperCase()},
      {label: 'Today', class: 'usage-cell', cell: (k) => usageBar(usage.get(k.id)?.daily, k.policy.currency, 'Daily', k.policy.mode)},
      {label: 'Period', class: 'usage-cell', cell: (k) => usageBar(usage.get(k.id)?.period, k.policy.currency, 'Period', k.policy.mode)},
      {label: 'Day resets', cell: (k) => timeEl(usage.get(k.id)?.daily?.reset_at, k.policy.timezone)},
      {label: 'Expires', cell: (k) => timeEl(k.policy.expires_at, k.policy.timezone)},
    ],
    rows: keys,
  });
}
