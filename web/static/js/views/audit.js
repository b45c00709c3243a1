// The audit log: every admin change, newest first, with before and after.

import {get, query} from '../api.js';
import {h, replace, announce} from '../dom.js';
import {errorBox} from '../ui.js';
import {auditTable} from './key.js';

const PAGE = 100;

export function mount(main) {
  document.title = 'Audit log · keybrake';
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  const more = h('div', {class: 'more'});
  main.append(h('h1', null, 'Audit log'),
    h('p', {class: 'hint'}, 'Who changed what, when: upstreams, keys, resolved holds. Newest first.'),
    region, more);
  let entries = [];
  let next = '';

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
    replace(region, auditTable(entries));
    replace(more, next ? h('button', {type: 'button', class: 'button secondary', onclick: () => load(next).then(() => announce('Older entries loaded.'))}, 'Load older entries') : null);
  }

  load('');
  return {};
}
