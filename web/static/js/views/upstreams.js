// Upstreams: the Stripe secret keys vault keys spend through, and the webhook
// secrets Stripe signs their events with. A secret can be written, never read
// back: only its last four characters are shown.

import {get, post, request, pathId} from '../api.js';
import {h, replace, table, timeEl, announce, badge} from '../dom.js';
import {errorBox, confirm, field, showErrors, clearErrors, message} from '../ui.js';

export function mount(main, ctx) {
  document.title = 'Upstreams · keybrake';
  const notice = h('div', {class: 'notice-region'});
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  main.append(h('h1', null, 'Upstreams'),
    h('p', {class: 'hint'}, 'The real Stripe secret keys. They are sealed in the database; nobody can read one back.'),
    notice, region);

  let known = []; // the upstreams as last read, for the form's confirmation
  if (ctx.isAdmin) main.append(upstreamForm(), webhookForm());

  async function load() {
    let res;
    try {
      res = await get('/upstreams');
    } catch (err) {
      replace(region, errorBox(err, 'The upstreams could not be loaded'));
      return;
    }
    known = res.upstreams;
    replace(region, table({
      caption: 'Upstreams',
      empty: 'No upstream yet. Keys cannot be minted until one is registered.',
      columns: [
        {label: 'Name', cell: (u) => h('strong', null, u.name)},
        {label: 'Mode', cell: (u) => modeBadge(u.mode)},
        {label: 'Base URL', cell: (u) => h('code', {class: 'break'}, u.base_url || '—')},
        {label: 'Secret', cell: (u) => h('code', null, `••••${u.secret_last4}`)},
        {label: 'Webhook secrets', cell: (u) => (u.webhook_secrets_last4 || []).length
          ? h('span', {class: 'webhook-secrets'}, u.webhook_secrets_last4.map((l) => h('code', null, `••••${l}`)))
          : h('span', {class: 'muted'}, 'none: Stripe\'s events are refused')},
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
    // Not pre-filled: saving under the name of a registered upstream replaces
    // its secret, which must be a deliberate choice (and is confirmed below).
    const name = h('input', {name: 'name', type: 'text', autocomplete: 'off', spellcheck: 'false', placeholder: 'default'});
    const secret = h('input', {name: 'secret', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'sk_live_… or rk_live_…'});
    const form = h('form', {class: 'form', method: 'post', novalidate: true},
      h('h2', null, 'Register or replace an upstream'),
      field({name: 'name', label: 'Name', control: name, hint: 'Keys name it as their upstream; "default" is used when a key names none.'}),
      field({name: 'secret', label: 'Stripe secret key', control: secret, hint: 'Write-only: it is sealed and never shown again.'}),
      h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'button primary'}, 'Save the upstream')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      const existing = known.find((u) => u.name === name.value.trim());
      if (existing) {
        const ok = await confirm({
          title: `Replace the secret of ${existing.name}?`,
          content: h('p', null, `${existing.name} is registered (${existing.mode || 'unknown'} mode, secret ending ${existing.secret_last4}). `,
            'Every key that names it spends through the new secret from its next request.'),
          action: 'Replace the secret',
          danger: true,
        });
        if (!ok) return;
      }
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

  function webhookForm() {
    // The secrets Stripe signs the upstream's events with (Developers →
    // Webhooks → the endpoint → Signing secret). While rolling the secret at
    // Stripe, both the new and the old one are accepted.
    const name = h('input', {name: 'webhook_upstream', type: 'text', autocomplete: 'off', spellcheck: 'false', placeholder: 'default'});
    const current = h('input', {name: 'webhook_secret', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'whsec_…'});
    const previous = h('input', {name: 'webhook_secret_previous', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'whsec_… (optional)'});
    const form = h('form', {class: 'form webhook-secrets-form', method: 'post', novalidate: true},
      h('h2', null, 'Stripe\'s events: webhook signing secrets'),
      h('p', {class: 'hint'}, 'Register POST /keybrake/v1/stripe/events/{upstream} on the proxy as a webhook endpoint in Stripe, then save its signing secret here. Saving replaces the upstream\'s secrets; two empty secrets remove them.'),
      field({name: 'name', label: 'Upstream', control: name}),
      field({name: 'webhook_secrets[0]', label: 'Signing secret', control: current, hint: 'Write-only: sealed, never shown again.'}),
      field({name: 'webhook_secrets[1]', label: 'Previous signing secret', control: previous, hint: 'Only while Stripe rolls the secret: events signed with either are accepted.'}),
      h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'button primary'}, 'Save the webhook secrets')));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      const upstream = name.value.trim() || 'default';
      const secrets = [current.value, previous.value].filter((v) => v !== '');
      try {
        const u = await request('PATCH', `/upstreams/${pathId(upstream)}`, {webhook_secrets: secrets});
        current.value = '';
        previous.value = '';
        const n = (u.webhook_secrets_last4 || []).length;
        replace(notice, message('success', h('p', null, n
          ? `${u.name} accepts Stripe's events signed with ${n === 1 ? 'its secret' : 'either secret'} (ending ${u.webhook_secrets_last4.join(', ')}).`
          : `${u.name} has no webhook secret: its events are refused.`)));
        announce(`${u.name} webhook secrets saved.`);
        await load();
      } catch (err) {
        if (err.status !== 401) showErrors(form, err, 'The webhook secrets were not saved');
      }
    });
    return h('section', {class: 'panel'}, form);
  }

  load();
  return {};
}

// modeBadge shows an upstream's mode: live moves real money.
function modeBadge(mode) {
  switch (mode) {
    case 'live': return badge('live: real money', 'bad');
    case 'test': return badge('test', 'ok');
    case 'demo': return badge('demo: not Stripe', 'warn');
    default: return badge('unknown', 'muted');
  }
}
