// Upstreams: the Stripe secret keys vault keys spend through. A secret can be
// written, never read back: only its last four characters are shown.

import {get, post, request, pathId} from '../api.js';
import {h, replace, table, timeEl, announce} from '../dom.js';
import {errorBox, confirm, field, showErrors, clearErrors, message} from '../ui.js';

export function mount(main, ctx) {
  document.title = 'Upstreams · keybrake';
  const notice = h('div', {class: 'notice-region'});
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  main.append(h('h1', null, 'Upstreams'),
    h('p', {class: 'hint'}, 'The real Stripe secret keys. They are sealed in the database; nobody can read one back.'),
    notice, region);

  if (ctx.isAdmin) main.append(upstreamForm());

  async function load() {
    let res;
    try {
      res = await get('/upstreams');
    } catch (err) {
      replace(region, errorBox(err, 'The upstreams could not be loaded'));
      return;
    }
    replace(region, table({
      caption: 'Upstreams',
      empty: 'No upstream yet. Keys cannot be minted until one is registered.',
      columns: [
        {label: 'Name', cell: (u) => h('strong', null, u.name)},
        {label: 'Vendor', cell: (u) => u.vendor},
        {label: 'Secret', cell: (u) => h('code', null, `••••${u.secret_last4}`)},
        {label: 'Registered', cell: (u) => timeEl(u.created_at)},
        {label: 'Changed', cell: (u) => timeEl(u.updated_at)},
        ctx.isAdmin ? {label: 'Delete', cell: (u) => h('button', {type: 'button', class: 'button danger small', onclick: () => remove(u)}, 'Delete')} : null,
      ].filter(Boolean),
      rows: res.upstreams,
    }));
  }

  async function remove(u) {
    const ok = await confirm({
      title: `Delete the upstream ${u.name}?`,
      content: h('p', null, 'Its sealed secret is erased. keybrake refuses while an active key spends through it.'),
      action: 'Delete',
      danger: true,
    });
    if (!ok) return;
    try {
      await request('DELETE', `/upstreams/${pathId(u.name)}`);
      replace(notice, message('success', h('p', null, `${u.name} is deleted.`)));
      announce(`${u.name} deleted.`);
    } catch (err) {
      replace(notice, errorBox(err, `${u.name} was not deleted`));
    }
    await load();
  }

  function upstreamForm() {
    const name = h('input', {name: 'name', type: 'text', value: 'default', autocomplete: 'off', spellcheck: 'false'});
    const secret = h('input', {name: 'secret', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'sk_live_… or rk_live_…'});
    const form = h('form', {class: 'form', method: 'post', novalidate: true},
      h('h2', null, 'Register or replace an upstream'),
      field({name: 'name', label: 'Name', control: name, hint: 'Keys name it as their upstream; "default" is used when a key names none.'}),
      field({name: 'secret', label: 'Stripe secret key', control: secret, hint: 'Write-only: it is sealed and never shown again.'}),
      h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'button primary'}, 'Save the upstream')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      try {
        const u = await post('/upstreams', {name: name.value.trim(), vendor: 'stripe', secret: secret.value});
        secret.value = '';
        replace(notice, message('success', h('p', null, `${u.name} is saved (secret ending ${u.secret_last4}).`)));
        announce(`${u.name} saved.`);
        await load();
      } catch (err) {
        if (err.status !== 401) showErrors(form, err, 'The upstream was not saved');
      }
    });
    return h('section', {class: 'panel'}, form);
  }

  load();
  return {};
}
