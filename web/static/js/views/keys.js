// The key list: filter by status and label, search by name, page through; each
// key's daily and period usage as bars with their numbers. Keys near or at a cap
// stand out.

import {get, query} from '../api.js';
import {h, replace, table, timeEl, statusBadge, labelChips, keepFocus, id, announce, changes} from '../dom.js';
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
    try {
      list = await get(`/keys${query({...filters, limit: PAGE, cursor})}`);
      if (list.keys.length > 0) {
        const u = await get(`/usage${query({ids: list.keys.map((k) => k.id).join(',')})}`);
        usage = new Map(u.usage.map((x) => [x.key_id, x]));
      }
    } catch (err) {
      replace(listRegion, errorBox(err, 'The keys could not be loaded'));
      replace(pager);
      changed.reset();
      return;
    }
    if (!changed([cursors, list, [...usage.values()]])) return;
    keepFocus(listRegion, () => replace(listRegion, keyTable(list.keys, usage, filters)));
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

function keyTable(keys, usage, filters) {
  const filtered = filters.status || filters.label || filters.q;
  return table({
    caption: 'Vault keys',
    empty: filtered ? 'No key matches these filters.' : 'No vault key yet.',
    rowClass: (k) => {
      const u = usage.get(k.id);
      const states = u ? [windowState(u.daily), windowState(u.period)] : [];
      if (states.includes('full')) return 'row-full';
      if (states.includes('near')) return 'row-near';
      return null;
    },
    columns: [
      {label: 'Name', cell: (k) => h('a', {class: 'key-name', href: `#/keys/${encodeURIComponent(k.id)}`, 'data-focus-id': `key:${k.id}`}, k.name)},
      {label: 'Labels', cell: (k) => labelChips(k.labels)},
      {label: 'Status', cell: (k) => statusBadge(usage.get(k.id)?.status || k.status)},
      {label: 'Currency', cell: (k) => k.policy.currency.toUpperCase()},
      {label: 'Today', class: 'usage-cell', cell: (k) => usageBar(usage.get(k.id)?.daily, k.policy.currency, 'Daily')},
      {label: 'Period', class: 'usage-cell', cell: (k) => usageBar(usage.get(k.id)?.period, k.policy.currency, 'Period')},
      {label: 'Day resets', cell: (k) => timeEl(usage.get(k.id)?.daily?.reset_at, k.policy.timezone)},
      {label: 'Expires', cell: (k) => timeEl(k.policy.expires_at, k.policy.timezone)},
    ],
    rows: keys,
  });
}
