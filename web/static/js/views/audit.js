// The audit log: every admin change, newest first, with before and after,
// filtered by actor, action and target.

import {get, query} from '../api.js';
import {h, replace, announce, id} from '../dom.js';
import {errorBox} from '../ui.js';
import {auditTable} from './key.js';

const PAGE = 100;

export function mount(main) {
  document.title = 'Audit log · keybrake';
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  const more = h('div', {class: 'more'});
  const input = (name, placeholder) => h('input', {name, type: 'search', id: id(`audit-${name}`), autocomplete: 'off', spellcheck: 'false', placeholder});
  const filters = {actor: input('actor', 'alice'), action: input('action', 'key.revoke'), target: input('target', 'key_… or a name')};
  const form = h('form', {class: 'filters audit-filters', role: 'search', 'aria-label': 'Filter the audit log', method: 'post'},
    Object.entries({actor: 'Who', action: 'Action', target: 'Target (id or name)'}).map(([k, label]) =>
      h('div', {class: 'field'}, h('label', {for: filters[k].id}, label), filters[k])));
  form.addEventListener('submit', (ev) => ev.preventDefault());
  main.append(h('h1', null, 'Audit log'),
    h('p', {class: 'hint'}, 'Who changed what, when: upstreams, keys, resolved holds. Newest first. The filters apply to the entries loaded.'),
    form, region, more);
  let entries = [];
  let next = '';
  for (const el of Object.values(filters)) el.addEventListener('input', () => render());

  function render() {
    const want = Object.fromEntries(Object.entries(filters).map(([k, el]) => [k, el.value.trim().toLowerCase()]));
    const shown = entries.filter((e) => (!want.actor || e.actor.toLowerCase().includes(want.actor))
      && (!want.action || e.action.toLowerCase().includes(want.action))
      && (!want.target || e.target.toLowerCase().includes(want.target) || targetName(e).toLowerCase().includes(want.target)));
    replace(region, auditTable(shown));
  }

  async function load(cursor) {
    let page;
    try {
      page = await get(`/audit${query({limit: PAGE, cursor})}`);
    } catch (err) {
      replace(cursor ? more : region, errorBox(err, 'The audit log could not be loaded'));
      return;
    }
    entries = cursor ? entries.concat(page.entries) : page.entries;
    next = page.next_cursor || '';
    render();
    replace(more, next ? h('button', {type: 'button', class: 'button secondary', onclick: () => load(next).then(() => announce('Older entries loaded.'))}, 'Load older entries') : null);
  }

  load('');
  return {};
}

// targetName is the name of an audit entry's target, from its documents: a
// key's or an upstream's name, or the key of a resolved hold.
export function targetName(e) {
  const doc = e.after || e.before || {};
  return doc.name || doc.key_name || '';
}
