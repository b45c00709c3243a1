// Mint a vault key: a form that builds the policy, with the API's field errors
// next to their fields; afterwards the token is shown once.

import {get, post, ApiError} from '../api.js';
import {h, replace} from '../dom.js';
import {field, showErrors, clearErrors, tokenPanel, errorBox} from '../ui.js';

// nextMonth is the first instant of next month, UTC, as a datetime-local value:
// the end of a calendar-month billing period that starts now.
function nextMonth() {
  const now = new Date();
  const d = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1));
  return d.toISOString().slice(0, 16);
}

// utc turns a datetime-local value, read as UTC, into RFC 3339.
function utc(local) {
  return local ? `${local.length === 16 ? `${local}:00` : local}Z` : undefined;
}

// lines splits a textarea into its non-empty lines (commas separate too).
function lines(text) {
  return text.split(/[\n,]/).map((x) => x.trim()).filter(Boolean);
}

export function mount(main, ctx) {
  document.title = 'Mint a key · keybrake';
  const region = h('div');
  main.append(h('p', {class: 'crumbs'}, h('a', {href: '#/keys'}, 'Keys'), ' › Mint'), h('h1', null, 'Mint a vault key'), region);

  const text = (name, attrs = {}) => h('input', {name, type: 'text', autocomplete: 'off', spellcheck: 'false', ...attrs});
  const area = (name, attrs = {}) => h('textarea', {name, rows: 3, spellcheck: 'false', autocomplete: 'off', class: 'mono', ...attrs});
  const c = {
    name: text('name', {required: true, placeholder: 'vault_key_cust_123_2026_09'}),
    upstream: h('select', {name: 'upstream'}, h('option', {value: 'default'}, 'default')),
    labels: area('labels', {placeholder: 'customer_id=cust_123\nbilling_period=2026-09'}),
    currency: text('currency', {value: 'usd', maxlength: 3, size: 4, class: 'short'}),
    daily: text('daily_cap', {inputmode: 'decimal', placeholder: '99.00', class: 'short'}),
    period: text('period_cap', {inputmode: 'decimal', placeholder: '110.00', class: 'short'}),
    perRequest: text('per_request_cap', {inputmode: 'decimal', placeholder: '99.00', class: 'short'}),
    timezone: text('timezone', {value: 'UTC', list: 'kb-zones'}),
    periodStart: h('input', {name: 'period_start', type: 'datetime-local'}),
    expiresAt: h('input', {name: 'expires_at', type: 'datetime-local', required: true, value: nextMonth()}),
    operations: area('operations', {placeholder: 'charges.create\npayment_intents.create\n*.read'}),
    customers: area('customers', {placeholder: 'cus_123'}),
    accounts: area('stripe_accounts', {placeholder: 'acct_123'}),
    idemMode: h('select', {name: 'idempotency_mode'},
      h('option', {value: 'require'}, 'require the caller\'s key'),
      h('option', {value: 'derive'}, 'derive from request fields')),
    idemFields: text('idempotency_fields', {placeholder: 'customer, metadata[billing_period]'}),
    mode: h('select', {name: 'mode'},
      h('option', {value: 'enforce'}, 'enforce'),
      h('option', {value: 'report'}, 'report (dry run)')),
    renewals: h('select', {name: 'renewals'},
      h('option', {value: 'pause_over_cap'}, 'pause a renewal over a cap at Stripe'),
      h('option', {value: 'count'}, 'count it and alert, never touch the invoice')),
  };
  const zones = h('datalist', {id: 'kb-zones'}, (Intl.supportedValuesOf ? Intl.supportedValuesOf('timeZone') : ['UTC']).map((z) => h('option', {value: z})));
  const idemFieldsField = field({name: 'policy.idempotency.fields', label: 'Derive from fields', control: c.idemFields,
    hint: 'Form parameters, separated by commas.'});
  const syncIdem = () => { idemFieldsField.hidden = c.idemMode.value !== 'derive'; };
  c.idemMode.addEventListener('change', syncIdem);
  syncIdem();

  const submit = h('button', {type: 'submit', class: 'button primary'}, 'Mint the key');
  const form = h('form', {class: 'form mint-form', method: 'post', novalidate: true},
    h('fieldset', null, h('legend', null, 'Key'),
      field({name: 'name', label: 'Name', control: c.name, hint: 'Unique; up to 200 characters.'}),
      field({name: 'upstream', label: 'Upstream', control: c.upstream, hint: 'The Stripe account it spends through.'}),
      field({name: 'labels', label: 'Labels', control: c.labels, wide: true, hint: 'One key=value per line, to filter keys by.'})),
    h('fieldset', null, h('legend', null, 'Caps'),
      h('p', {class: 'hint'}, 'Amounts in the major unit of the currency (dollars for USD). At least one cap.'),
      field({name: 'policy.currency', label: 'Currency', control: c.currency}),
      field({name: 'policy.daily_cap', label: 'Daily cap', control: c.daily, hint: 'Per calendar day in the time zone below.'}),
      field({name: 'policy.period_cap', label: 'Period cap', control: c.period, hint: 'Over the whole billing period.'}),
      field({name: 'policy.per_request_cap', label: 'Per-request cap', control: c.perRequest, hint: 'What one request (one money object) may move.'})),
    h('fieldset', null, h('legend', null, 'Billing period'),
      field({name: 'policy.timezone', label: 'Time zone', control: c.timezone, hint: 'IANA name; where the daily cap\'s day starts and ends.'}), zones,
      field({name: 'policy.period_start', label: 'Period starts (UTC)', control: c.periodStart, hint: 'Empty: now.'}),
      field({name: 'policy.expires_at', label: 'Expires (UTC)', control: c.expiresAt, hint: 'Required, in the future.'})),
    h('fieldset', null, h('legend', null, 'What it may do'),
      field({name: 'policy.operations', label: 'Operations', control: c.operations, wide: true,
        hint: 'One per line, resource.verb, * allowed. Empty: every read, and charges and payment intents with a known amount. Refunds, transfers and payouts must be named.'}),
      field({name: 'policy.customers', label: 'Customers', control: c.customers, hint: 'One per line. Empty: any.'}),
      field({name: 'policy.stripe_accounts', label: 'Connected accounts', control: c.accounts, hint: 'One per line. Empty: the platform account only.'}),
      field({name: 'policy.idempotency.mode', label: 'Idempotency', control: c.idemMode,
        hint: 'Require: money-moving requests must carry an Idempotency-Key. Derive: keybrake computes it from fields of the request, ignoring the caller\'s.'}),
      idemFieldsField,
      field({name: 'policy.mode', label: 'Mode', control: c.mode,
        hint: 'Report lets through what the policy would refuse and logs it as would_refuse (caps still count).'}),
      field({name: 'policy.renewals', label: 'Renewals', control: c.renewals,
        hint: 'What a renewal of a subscription this key started does when it would exceed a cap.'})),
    h('div', {class: 'actions'}, submit, h('a', {class: 'button link', href: '#/keys'}, 'Cancel')));

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    const labels = {};
    const badLabels = [];
    for (const line of c.labels.value.split('\n').map((x) => x.trim()).filter(Boolean)) {
      const eq = line.indexOf('=');
      if (eq <= 0) badLabels.push(line);
      else labels[line.slice(0, eq).trim()] = line.slice(eq + 1).trim();
    }
    const val = (el) => el.value.trim() || undefined;
    const list = (el) => (lines(el.value).length ? lines(el.value) : undefined);
    const body = {
      name: c.name.value.trim(),
      upstream: c.upstream.value,
      labels,
      policy: {
        vendor: 'stripe',
        currency: val(c.currency),
        daily_cap: val(c.daily),
        period_cap: val(c.period),
        per_request_cap: val(c.perRequest),
        timezone: val(c.timezone),
        period_start: utc(c.periodStart.value),
        expires_at: utc(c.expiresAt.value),
        operations: list(c.operations),
        customers: list(c.customers),
        stripe_accounts: list(c.accounts),
        idempotency: {mode: c.idemMode.value, fields: c.idemMode.value === 'derive' ? list(c.idemFields) : undefined},
        mode: c.mode.value,
        renewals: c.renewals.value,
      },
    };
    if (badLabels.length) {
      showErrors(form, new ApiError(0, {title: 'Invalid labels', detail: 'Labels are key=value lines.',
        errors: badLabels.map((l) => ({field: 'labels', message: `"${l}" is not key=value`}))}), 'The key was not minted');
      return;
    }
    submit.disabled = true;
    try {
      const key = await post('/keys', body);
      replace(region,
        tokenPanel({key, title: `${key.name} is minted`}),
        h('p', {class: 'actions'},
          h('a', {class: 'button primary', href: `#/keys/${encodeURIComponent(key.id)}`}, 'Open the key'),
          h('a', {class: 'button secondary', href: '#/mint', onclick: (e) => { e.preventDefault(); replace(main); mount(main, ctx); }}, 'Mint another')));
      region.querySelector('input.token').focus({preventScroll: true});
      region.querySelector('.token-panel').scrollIntoView();
    } catch (err) {
      submit.disabled = false;
      if (err.status !== 401) showErrors(form, err, 'The key was not minted');
    }
  });

  replace(region, form);
  c.name.focus({preventScroll: true}); // the page opens at its top, navigation included

  get('/upstreams').then((res) => {
    if (res.upstreams.length === 0) {
      form.prepend(h('div', {class: 'message warn'}, h('p', null, 'No upstream is registered yet: ',
        h('a', {href: '#/upstreams'}, 'register your Stripe secret key'), ' before minting.')));
      return;
    }
    replace(c.upstream, res.upstreams.map((u) => h('option', {value: u.name, selected: u.name === 'default'}, `${u.name} (…${u.secret_last4})`)));
  }).catch((err) => {
    if (err.status !== 401) form.prepend(errorBox(err, 'The upstreams could not be loaded'));
  });
  return {};
}

