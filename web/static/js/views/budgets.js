// Budgets: the tree of shared budgets, each window's bar, the raises adding to
// its caps now, and the keys that draw on each.

import {get, query} from '../api.js';
import {h, replace, money, timeEl, changes, keyLink, statusBadge} from '../dom.js';
import {usageBar} from '../money.js';
import {errorBox} from '../ui.js';

// MAX_PAGES bounds how many pages of 500 budgets and keys the page reads.
const MAX_PAGES = 10;

async function all(path, field) {
  const out = [];
  let cursor = '';
  for (let i = 0; i < MAX_PAGES; i += 1) {
    const page = await get(`${path}${query({limit: 500, cursor})}`);
    out.push(...page[field]);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  return out;
}

// raisesList shows the raises active now of a usage view.
export function raisesList(usage) {
  const rs = (usage && usage.raises) || [];
  if (rs.length === 0) return null;
  return h('ul', {class: 'raises'}, rs.map((r) => h('li', {'data-raise': r.id},
    h('strong', null, `+${money(r.amount, r.currency)}`), ` on the ${r.window.replace('_', '-')} cap until `, timeEl(r.until),
    r.reason ? ` — ${r.reason}` : null, h('span', {class: 'muted'}, ` (${r.created_by})`))));
}

export function mount(main) {
  document.title = 'Budgets · keybrake';
  const region = h('div', {class: 'budgets-region'}, h('p', {class: 'loading'}, 'Loading…'));
  main.append(h('h1', null, 'Budgets'),
    h('div', {class: 'explain'}, h('p', null, 'A budget is a set of caps several vault keys draw from (a team, an organisation). A money request holds on its key and on every budget above it, or is refused naming the scope that is full.')),
    region);
  const changed = changes();

  async function load() {
    let budgets;
    let keys;
    try {
      [budgets, keys] = await Promise.all([all('/budgets', 'budgets'), all('/keys', 'keys')]);
    } catch (err) {
      replace(region, errorBox(err, 'The budgets could not be loaded'));
      changed.reset();
      return;
    }
    if (!changed([budgets, keys])) return;
    const byParent = new Map();
    for (const b of budgets) {
      const p = b.parent || '';
      if (!byParent.has(p)) byParent.set(p, []);
      byParent.get(p).push(b);
    }
    const ids = new Set(budgets.map((b) => b.id));
    const node = (b, depth) => {
      const u = b.usage || {};
      const mine = keys.filter((k) => k.policy.budget === b.id);
      return h('li', {class: 'budget', 'data-budget': b.id, 'data-depth': String(depth)},
        h('h2', null, b.name, ' ', h('code', {class: 'muted small-id'}, b.id)),
        h('div', {class: 'usage-grid'},
          h('div', {class: 'usage-block', 'data-window': 'daily'}, h('h3', null, 'Today'), usageBar(u.daily, b.currency, 'Daily')),
          h('div', {class: 'usage-block', 'data-window': 'period'}, h('h3', null, 'Period'), usageBar(u.period, b.currency, 'Period'))),
        raisesList(u),
        h('p', {class: 'hint'}, mine.length === 0 ? 'No key draws on it directly.' : `${mine.length} ${mine.length === 1 ? 'key draws' : 'keys draw'} on it:`),
        mine.length ? h('ul', {class: 'budget-keys'}, mine.map((k) => h('li', null, keyLink(k.id, k.name), ' ', statusBadge(k.status)))) : null,
        (byParent.get(b.id) || []).length ? h('ul', {class: 'budget-tree'}, byParent.get(b.id).map((c) => node(c, depth + 1))) : null);
    };
    // Roots, and budgets whose parent is not in the listing (cut off by MAX_PAGES).
    const roots = budgets.filter((b) => !b.parent || !ids.has(b.parent));
    replace(region, roots.length === 0
      ? h('p', {class: 'empty'}, 'No budget yet. Create one with POST /api/v1/budgets.')
      : h('ul', {class: 'budget-tree'}, roots.map((b) => node(b, 0))));
  }

  load();
  return {refresh: load};
}
