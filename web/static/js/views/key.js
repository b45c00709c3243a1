// A key: its usage, the money objects whose exposure it holds, spend per day
// over the billing period, policy, ledger (with the refusals easy to find) and
// audit trail; admins may refresh an object from Stripe, edit its caps, rotate
// its token and revoke it.

import {get, post, request, pathId, query} from '../api.js';
import {h, replace, section, table, timeEl, statusBadge, labelChips, money, badge, id, keepFocus, announce, changes,
  modeBadge, opCode, idWithCopy} from '../dom.js';
import {errorBox, confirm, openDialog, field, showErrors, tokenPanel, message} from '../ui.js';
import {usageBar, isZero, add} from '../money.js';
import {refusedText} from './overview.js';
import {spendChart} from '../chart.js';

const LEDGER_PAGE = 50;
const EXPOSURE_PAGE = 100;
const AUDIT_PAGES = 5;
// SEARCH_PAGES bounds how many older ledger pages a search reads.
const SEARCH_PAGES = 20;

export function mount(main, ctx) {
  const [keyId] = ctx.params;
  const enc = pathId(keyId);
  const head = h('div', {class: 'key-head'}, h('p', {class: 'loading'}, 'Loading…'));
  const notice = h('div', {class: 'notice-region'});
  const usageRegion = h('div', {class: 'usage-region'});
  const heldRegion = h('div', {class: 'held-region'});
  const exposureNotice = h('div', {class: 'notice-region exposure-notice'});
  const exposureRegion = h('div', {class: 'exposure-region'});
  const chartRegion = h('div', {class: 'chart-region'});
  const policyRegion = h('div');
  const ledgerRegion = h('div', {class: 'ledger-region'});
  const auditRegion = h('div');
  const refusalsOnly = h('input', {type: 'checkbox', id: id('refusals-only')});
  const searchId = id('ledger-search');
  const search = h('input', {type: 'search', id: searchId, class: 'ledger-search', autocomplete: 'off', spellcheck: 'false',
    placeholder: 'order-42, pi_…, req_…'});
  const searchMore = h('span', {class: 'search-more'});
  const ledgerTools = h('div', {class: 'ledger-tools'},
    h('label', {class: 'check'}, refusalsOnly, ' Refusals only'),
    h('span', {class: 'search-field'}, h('label', {for: searchId}, 'Find an idempotency key, object or Stripe request'), search),
    searchMore);
  const more = h('div', {class: 'more'});

  const exposureSection = section('Exposure', h('p', {class: 'hint'}, 'PaymentIntents, uncaptured charges, Checkout Sessions and invoices this key created or acted on that can still move money: their amounts count as held until an answer from Stripe through keybrake shows the money moved (committed) or cannot move any more (released). ',
      ctx.isAdmin ? 'Refresh asks Stripe about one now — for one cancelled in the Stripe Dashboard, abandoned or paid in a browser.' : null),
    exposureNotice, exposureRegion);
  exposureSection.classList.add('exposure-section');
  main.append(
    h('p', {class: 'crumbs'}, h('a', {href: '#/keys'}, 'Keys'), ' › ', h('span', {class: 'crumb-id'}, keyId)),
    head, notice,
    section('Usage', usageRegion, heldRegion),
    exposureSection,
    section('Spend per day this billing period', chartRegion),
    section('Ledger', h('p', {class: 'hint'}, 'Every metered request, newest first: what keybrake decided and why, and what Stripe answered.'), ledgerTools, ledgerRegion, more),
    section('Policy', policyRegion),
    section('Audit trail', h('p', {class: 'hint'}, 'Who changed this key, and how.'), auditRegion));

  let key = null;
  let events = [];
  let nextCursor = '';
  let pagesLoaded = 1;
  const changed = changes();
  let refreshFailed = false;
  let lastSpend = null;
  let exposures = null;
  let unknownHolds = [];
  // drawChart draws the chart for the width it has, keeping its table open if it was.
  const drawChart = () => {
    const open = chartRegion.querySelector('details')?.open;
    keepFocus(chartRegion, () => replace(chartRegion, spendChart(lastSpend, chartRegion.clientWidth)));
    if (open) chartRegion.querySelector('details').open = true;
  };
  // The chart is drawn for the width it has: redraw it when that changes.
  let resizeTimer = 0;
  const onResize = () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      if (lastSpend) drawChart();
    }, 150);
  };
  window.addEventListener('resize', onResize);

  refusalsOnly.addEventListener('change', () => renderLedger());
  search.addEventListener('input', () => renderLedger());

  function renderHead() {
    document.title = `${key.name} · keybrake`;
    const live = key.status === 'active';
    keepFocus(head, () => replace(head,
      h('div', {class: 'page-head'},
        h('h1', null, key.name, ' ', statusBadge(key.status), modeBadge(key.policy.mode) ? [' ', modeBadge(key.policy.mode)] : null),
        ctx.isAdmin && key.status !== 'revoked' ? h('div', {class: 'actions'},
          live ? h('button', {type: 'button', class: 'button secondary', 'data-action': 'edit-caps', 'data-focus-id': 'edit-caps', onclick: editCaps}, 'Edit caps') : null,
          h('button', {type: 'button', class: 'button secondary', 'data-action': 'rotate', 'data-focus-id': 'rotate', onclick: rotate}, 'Rotate token'),
          h('button', {type: 'button', class: 'button danger', 'data-action': 'revoke', 'data-focus-id': 'revoke', onclick: revoke}, 'Revoke')) : null),
      h('dl', {class: 'meta'},
        meta('Id', idWithCopy(key.id, 'key id')),
        meta('Token', h('code', null, `${key.token_prefix}…`)),
        meta('Upstream', key.upstream),
        meta('Labels', labelChips(key.labels)),
        meta('Created', timeEl(key.created_at, key.policy.timezone)),
        key.revoked_at ? meta('Revoked', timeEl(key.revoked_at, key.policy.timezone)) : null,
        meta('Expires', timeEl(key.policy.expires_at, key.policy.timezone))),
      key.refused ? message('warn', h('p', {class: 'key-refused'}, h('strong', null, 'Still in use: '),
        `${refusedText(key.refused, key.status)}.`)) : null,
      key.policy.mode === 'report' ? message('info', h('p', null, h('strong', null, 'Report mode: '),
        'this key is never refused for its caps or its policy. What an enforcing key would refuse is let through and logged as "would refuse"; usage past a cap is what would have been refused.')) : null));
  }

  function renderUsage() {
    const u = key.usage;
    const tz = key.policy.timezone;
    replace(usageRegion, h('div', {class: 'usage-grid'},
      h('div', {class: 'usage-block', 'data-window': 'daily'},
        h('h3', null, 'Today'), usageBar(u.daily, u.currency, 'Daily', key.policy.mode),
        h('p', {class: 'hint'}, 'Resets ', timeEl(u.daily.reset_at, tz))),
      h('div', {class: 'usage-block', 'data-window': 'period'},
        h('h3', null, 'Billing period'), usageBar(u.period, u.currency, 'Period', key.policy.mode),
        h('p', {class: 'hint'}, timeEl(u.period.start, tz), ' to ', timeEl(u.period.end, tz))),
      h('div', {class: 'usage-block'},
        h('h3', null, 'Per request'),
        h('p', null, u.per_request.cap === null ? h('span', {class: 'muted'}, 'no cap') : money(u.per_request.cap, u.currency)))),
      renderRaises(u));
  }

  // renderRaises lists the raises adding to the caps now, with End for admins.
  function renderRaises(u) {
    const rs = u.raises || [];
    if (rs.length === 0) return null;
    return h('div', {class: 'raises-region'}, h('h3', null, 'Raised for a while'),
      h('ul', {class: 'raises'}, rs.map((r) => h('li', {'data-raise': r.id},
        h('strong', null, `+${money(r.amount, r.currency)}`), ` on the ${r.window.replace('_', '-')} cap until `, timeEl(r.until, key.policy.timezone),
        r.reason ? ` — ${r.reason}` : null, h('span', {class: 'muted'}, ` (${r.created_by})`), ' ',
        ctx.isAdmin ? h('button', {type: 'button', class: 'button secondary small', 'data-action': 'end-raise', 'data-focus-id': `end:${r.id}`,
          onclick: () => endRaise(r)}, 'End now') : null))));
  }

  async function endRaise(r) {
    const ok = await confirm({
      title: 'End this raise now?',
      content: [h('p', null, `The ${r.window.replace('_', '-')} cap loses its ${money(r.amount, r.currency)} at once; what was spent under it stays counted.`)],
      action: 'End the raise',
      danger: true,
    });
    if (!ok) return;
    try {
      await request('DELETE', `/keys/${enc}/raises/${pathId(r.id)}`);
      replace(notice, message('success', h('p', null, 'The raise has ended.')));
      announce('The raise has ended.');
    } catch (err) {
      replace(notice, errorBox(err, 'The raise was not ended'));
    }
    await load();
  }

  // renderHeld says what the key's held money is: money objects' exposure,
  // requests whose outcome is unknown, and requests in flight, with links.
  function renderHeld() {
    const u = key.usage;
    const win = u.period || u.daily;
    if (!win || isZero(win.held)) {
      replace(heldRegion);
      return;
    }
    const cur = u.currency;
    const exp = exposures.exposures.map((x) => x.exposure);
    const expSum = exp.length ? add(...exp) : '0';
    const unk = unknownHolds.map((hd) => hd.amount);
    const unkSum = unk.length ? add(...unk) : '0';
    let rest = add(win.held, `-${expSum}`, `-${unkSum}`);
    if (rest.startsWith('-')) rest = add(rest, rest.slice(1)); // never below zero
    const toExposure = (ev) => {
      ev.preventDefault();
      exposureSection.scrollIntoView();
    };
    const items = [];
    if (exp.length) {
      items.push(h('li', {dataset: {held: 'exposure'}}, h('strong', null, money(expSum, cur)), ' as the exposure of ',
        h('a', {href: `#/keys/${encodeURIComponent(key.id)}`, onclick: toExposure}, `${exp.length} money ${exp.length === 1 ? 'object' : 'objects'}`),
        ' that can still move money'));
    }
    if (unk.length) {
      items.push(h('li', {dataset: {held: 'unknown'}}, h('strong', null, money(unkSum, cur)), ' in ',
        h('a', {href: '#/holds'}, `${unk.length} ${unk.length === 1 ? 'request' : 'requests'} whose outcome is unknown`),
        ': check them at Stripe and resolve them'));
    }
    if (!isZero(rest)) {
      items.push(h('li', {dataset: {held: 'in-flight'}}, h('strong', null, money(rest, cur)),
        ' in requests in flight (sent to Stripe, no answer yet)'));
    }
    replace(heldRegion, h('div', {class: 'held-breakdown'},
      h('h3', null, `What the ${money(win.held, cur)} held ${u.period ? 'this period' : 'today'} is`),
      h('ul', null, items)));
  }

  function renderExposure() {
    const tz = key.policy.timezone;
    const windows = (x) => h('ul', {class: 'plain'}, x.windows.map((w) => h('li', null, h('code', null, w.id), ' ', money(w.exposure, x.currency))));
    keepFocus(exposureRegion, () => replace(exposureRegion,
      table({
        caption: 'Money objects with exposure',
        empty: 'No money object has exposure on this key.',
        columns: [
          {label: 'Object', cell: (x) => [idWithCopy(x.object_id, 'object id'), h('br'), h('span', {class: 'muted'}, x.kind.replace(/_/g, ' '))]},
          {label: 'Exposure', class: 'num', cell: (x) => money(x.exposure, x.currency)},
          {label: 'Committed', class: 'num', cell: (x) => money(x.committed, x.currency)},
          {label: 'Held on', cell: windows},
          {label: 'Since', cell: (x) => timeEl(x.created_at, tz)},
          ctx.isAdmin ? {label: 'Stripe', cell: (x) => h('button', {type: 'button', class: 'button secondary small', 'data-action': 'refresh-exposure',
            'data-object': x.object_id, 'data-focus-id': `refresh:${x.object_id}`, onclick: (ev) => refreshExposure(x, ev.currentTarget)}, 'Refresh')} : null,
        ].filter(Boolean),
        rows: exposures.exposures,
      }),
      exposures.next_cursor ? h('p', {class: 'hint'}, `The first ${EXPOSURE_PAGE} objects, by id; the admin API lists them all (GET /api/v1/keys/${key.id}/exposures).`) : null));
  }

  async function refreshExposure(x, button) {
    button.disabled = true;
    try {
      const r = await post(`/keys/${enc}/exposures/${pathId(x.object_id)}/refresh`);
      const what = [];
      if (!isZero(r.committed)) what.push(`committed ${money(r.committed, x.currency)} (the money moved)`);
      if (!isZero(r.released)) what.push(`released ${money(r.released, x.currency)}`);
      let text = `Stripe shows ${x.object_id} can still move money: nothing changed; its ${money(r.after.exposure, x.currency)} stay held.`;
      if (r.changed) text = `Stripe's answer about ${x.object_id}: ${what.join(' and ')}. Its exposure is now ${money(r.after.exposure, x.currency)}.`;
      else if (isZero(r.after.exposure)) text = `${x.object_id} has no exposure left: nothing changed.`;
      replace(exposureNotice, message(r.changed ? 'success' : 'info', h('p', {class: 'exposure-result'}, text)));
      announce(text);
    } catch (err) {
      replace(exposureNotice, errorBox(err, `${x.object_id} was not refreshed`));
    }
    button.disabled = false;
    await load({withAudit: true});
  }

  function renderPolicy() {
    const p = key.policy;
    const list = (xs, none) => (xs && xs.length ? h('ul', {class: 'plain'}, xs.map((x) => h('li', null, h('code', null, x)))) : h('span', {class: 'muted'}, none));
    replace(policyRegion, h('dl', {class: 'facts'},
      h('dt', null, 'Currency'), h('dd', null, p.currency.toUpperCase()),
      h('dt', null, 'Daily cap'), h('dd', null, p.daily_cap ? money(p.daily_cap, p.currency) : h('span', {class: 'muted'}, 'none')),
      h('dt', null, 'Period cap'), h('dd', null, p.period_cap ? money(p.period_cap, p.currency) : h('span', {class: 'muted'}, 'none')),
      h('dt', null, 'Per-request cap'), h('dd', null, p.per_request_cap ? money(p.per_request_cap, p.currency) : h('span', {class: 'muted'}, 'none')),
      h('dt', null, 'Time zone'), h('dd', null, p.timezone),
      h('dt', null, 'Period'), h('dd', null, timeEl(p.period_start, p.timezone), ' to ', timeEl(p.expires_at, p.timezone)),
      h('dt', null, 'Operations'), h('dd', null, list(p.operations, 'the defaults: every read, and charges and payment intents with a known amount')),
      h('dt', null, 'Customers'), h('dd', null, list(p.customers, 'any')),
      h('dt', null, 'Connected accounts'), h('dd', null, list(p.stripe_accounts, 'none (the platform account only)')),
      h('dt', null, 'Idempotency'), h('dd', null, p.idempotency.mode,
        p.idempotency.fields?.length ? [' from ', p.idempotency.fields.map((f) => h('code', null, f)).reduce((a, b) => [a, ', ', b])] : null),
      h('dt', null, 'Mode'), h('dd', null, p.mode === 'report' ? badge('report: refusals are logged, not enforced', 'warn') : 'enforce')));
  }

  function renderLedger() {
    const q = search.value.trim();
    let shown = refusalsOnly.checked ? events.filter(isRefusal) : events;
    if (q) shown = shown.filter((e) => matches(e, q));
    replace(searchMore, q && shown.length === 0 && nextCursor
      ? h('button', {type: 'button', class: 'button secondary small', 'data-action': 'search-older', onclick: searchOlder}, 'Search older events') : null);
    const refusals = events.filter(isRefusal).length;
    const hasTool = events.some((e) => e.tool);
    const columns = [
      {label: 'Time', class: 'time', cell: (e) => timeEl(e.time, key.policy.timezone)},
      {label: 'Operation', cell: (e) => opCode(e.operation)},
      hasTool ? {label: 'MCP tool', cell: (e) => (e.tool ? h('code', null, e.tool) : h('span', {class: 'muted'}, '—'))} : null,
      {label: 'What happened', class: 'what', cell: (e) => [eventBadge(e), ' ', h('span', {class: 'what-text'}, whatHappened(e))]},
      {label: 'Amount', class: 'num', cell: (e) => money(e.amount, e.currency)},
      {label: 'Idempotency key', cell: (e) => (e.idempotency_key ? h('code', {class: 'break'}, e.idempotency_key) : h('span', {class: 'muted'}, '—'))},
      {label: 'Object', cell: (e) => (e.object_id ? h('code', {class: 'break'}, e.object_id) : h('span', {class: 'muted'}, '—'))},
      {label: 'Stripe', cell: (e) => (e.upstream_status || e.stripe_request_id
        ? [e.upstream_status ? String(e.upstream_status) : null, e.stripe_request_id ? [' ', h('code', {class: 'break'}, e.stripe_request_id)] : null]
        : h('span', {class: 'muted'}, '—'))},
    ].filter(Boolean);
    keepFocus(ledgerRegion, () => replace(ledgerRegion,
      h('p', {class: 'ledger-summary'}, refusals > 0
        ? badge(`${refusals} refused on this page`, 'bad') : h('span', {class: 'muted'}, 'No refusal on this page.')),
      table({
        caption: 'Ledger',
        empty: q ? `No event loaded matches "${q}".` : refusalsOnly.checked ? 'No refusal among the events loaded.' : 'No metered request yet.',
        columns,
        rows: shown,
        rowClass: (e) => (isRefusal(e) ? 'row-refused' : null),
      })));
    replace(more, nextCursor ? h('button', {type: 'button', class: 'button secondary', onclick: loadMore}, 'Load older events') : null);
  }

  async function loadMore() {
    try {
      const page = await get(`/keys/${enc}/events${query({limit: LEDGER_PAGE, cursor: nextCursor})}`);
      events = events.concat(page.events);
      nextCursor = page.next_cursor || '';
      pagesLoaded += 1;
      renderLedger();
      announce(`${page.events.length} older events loaded.`);
    } catch (err) {
      replace(more, errorBox(err, 'Older events could not be loaded'));
    }
  }

  // searchOlder loads older ledger pages until one matches the search (or the
  // ledger ends, or SEARCH_PAGES more were read).
  async function searchOlder() {
    const q = search.value.trim();
    for (let i = 0; i < SEARCH_PAGES && nextCursor; i += 1) {
      try {
        const page = await get(`/keys/${enc}/events${query({limit: 200, cursor: nextCursor})}`);
        events = events.concat(page.events);
        nextCursor = page.next_cursor || '';
        pagesLoaded += 1;
      } catch (err) {
        replace(searchMore, errorBox(err, 'Older events could not be loaded'));
        return;
      }
      if (events.some((e) => matches(e, q))) break;
    }
    renderLedger();
    announce(events.some((e) => matches(e, q)) ? `Found "${q}".` : `"${q}" is not in the ledger${nextCursor ? ' as far as it was read' : ''}.`);
  }

  async function loadAudit() {
    const entries = [];
    let cursor = '';
    try {
      // The audit log is newest first across all keys; this key's entries end
      // with its minting.
      for (let i = 0; i < AUDIT_PAGES; i += 1) {
        const page = await get(`/audit${query({limit: 200, cursor})}`);
        entries.push(...page.entries.filter((e) => e.target === keyId));
        cursor = page.next_cursor;
        const last = page.entries[page.entries.length - 1];
        if (!cursor || (last && key && new Date(last.time) < new Date(key.created_at))) break;
      }
    } catch (err) {
      replace(auditRegion, errorBox(err, 'The audit trail could not be loaded'));
      return;
    }
    replace(auditRegion, auditTable(entries, key?.policy?.timezone));
  }

  async function load({withAudit} = {}) {
    let spend;
    let first;
    let holds;
    try {
      [key, spend, first, exposures, holds] = await Promise.all([
        get(`/keys/${enc}`),
        get(`/keys/${enc}/spend`),
        pagesLoaded === 1 ? get(`/keys/${enc}/events${query({limit: LEDGER_PAGE})}`) : null,
        get(`/keys/${enc}/exposures${query({limit: EXPOSURE_PAGE})}`),
        get(`/holds${query({state: 'unknown', limit: 500})}`),
      ]);
      unknownHolds = holds.holds.filter((hd) => hd.key_id === keyId);
    } catch (err) {
      if (!key) {
        replace(head, errorBox(err, err.status === 404 ? 'No such key' : 'The key could not be loaded'));
      } else {
        replace(notice, errorBox(err, 'The key could not be refreshed'));
        refreshFailed = true;
      }
      return;
    }
    if (refreshFailed) {
      replace(notice);
      refreshFailed = false;
    }
    if (withAudit) loadAudit();
    if (!changed([key, spend, first, exposures, unknownHolds])) return;
    renderHead();
    renderUsage();
    renderHeld();
    renderExposure();
    lastSpend = spend;
    drawChart();
    renderPolicy();
    if (first) {
      events = first.events;
      nextCursor = first.next_cursor || '';
      renderLedger();
    }
  }

  async function revoke() {
    const ok = await confirm({
      title: `Revoke ${key.name}?`,
      content: [h('p', null, 'The next request with this key is refused (401 vault_key_revoked), at once and for good. A revoked key cannot be restored.'),
        h('p', null, 'Its usage and ledger are kept.')],
      action: 'Revoke the key',
      danger: true,
    });
    if (!ok) return;
    try {
      await post(`/keys/${enc}/revoke`);
      announce(`${key.name} revoked.`);
      replace(notice, message('success', h('p', null, `${key.name} is revoked.`)));
    } catch (err) {
      replace(notice, errorBox(err, 'The key was not revoked'));
    }
    await load({withAudit: true});
  }

  async function rotate() {
    const ok = await confirm({
      title: `Rotate the token of ${key.name}?`,
      content: h('p', null, 'The key gets a new token, shown once; the old token stops working at once. Usage and policy stay.'),
      action: 'Rotate the token',
      danger: true,
    });
    if (!ok) return;
    try {
      const rotated = await post(`/keys/${enc}/rotate`);
      replace(notice, tokenPanel({key: rotated, title: 'The new token'}));
      announce('Token rotated. Copy the new token now.');
    } catch (err) {
      replace(notice, errorBox(err, 'The token was not rotated'));
    }
    await load({withAudit: true});
    notice.querySelector('input.token')?.focus();
  }

  async function editCaps() {
    const p = key.policy;
    const input = (name, value) => h('input', {name, type: 'text', inputmode: 'decimal', value: value || '', autocomplete: 'off', spellcheck: 'false'});
    const daily = input('daily_cap', p.daily_cap);
    const period = input('period_cap', p.period_cap);
    const perRequest = input('per_request_cap', p.per_request_cap);
    const cur = p.currency.toUpperCase();
    const form = h('form', {class: 'form', method: 'post', novalidate: true},
      h('p', {class: 'hint'}, `Amounts in ${cur}; leave a field empty to remove that cap (at least one cap must remain). Usage is never reset.`),
      field({name: 'policy.daily_cap', label: `Daily cap (${cur})`, control: daily}),
      field({name: 'policy.period_cap', label: `Period cap (${cur})`, control: period}),
      field({name: 'policy.per_request_cap', label: `Per-request cap (${cur})`, control: perRequest}));
    const save = async () => {
      const val = (el) => (el.value.trim() === '' ? null : el.value.trim());
      try {
        await request('PATCH', `/keys/${enc}`, {policy: {daily_cap: val(daily), period_cap: val(period), per_request_cap: val(perRequest)}},
          {contentType: 'application/merge-patch+json'});
        return true;
      } catch (err) {
        if (err.status === 401) return true; // signed out: the page goes to sign-in
        showErrors(form, err, 'The caps were not changed');
        return false;
      }
    };
    const saved = await openDialog({
      title: `Edit the caps of ${key.name}`,
      content: form,
      buttons: [{label: 'Cancel', value: false, kind: 'secondary'}, {label: 'Save caps', value: true, kind: 'primary'}],
      onSubmit: save,
    });
    if (!saved) return;
    announce('Caps saved.');
    replace(notice, message('success', h('p', null, 'The caps are saved.')));
    await load({withAudit: true});
  }

  load({withAudit: true});
  return {refresh: () => load(), unmount: () => window.removeEventListener('resize', onResize)};
}

// meta is one term of a key's header.
function meta(term, ...value) {
  return h('div', null, h('dt', null, term), h('dd', null, ...value));
}

function isRefusal(e) {
  return e.decision === 'refused' || e.decision === 'would_refuse';
}

// matches reports whether an event carries q in one of the ids an operator
// searches for.
function matches(e, q) {
  const needle = q.toLowerCase();
  return [e.idempotency_key, e.object_id, e.stripe_request_id, e.hold_id, e.operation]
    .some((x) => x && x.toLowerCase().includes(needle));
}

// abs drops a decimal string's sign.
const abs = (x) => (x || '0').replace(/^-/, '');

// eventBadge names what happened to the event's money, in one or two words.
function eventBadge(e) {
  switch (e.decision) {
    case 'refused': return badge('refused', 'bad');
    case 'would_refuse': return badge('would refuse', 'warn');
    case 'allowed': return badge('held', 'info');
    case 'settled':
      if (e.reason === 'commit') return isZero(e.committed_delta) && e.object_id ? badge('held as exposure', 'info') : badge('committed', 'ok');
      if (e.reason === 'release') return badge('released', 'muted');
      if (e.reason === 'unknown') return badge('outcome unknown', 'bad');
      return badge(e.reason || 'settled', 'info');
    case 'resolved': return badge(isZero(e.committed_delta) ? 'released' : 'committed', isZero(e.committed_delta) ? 'muted' : 'ok');
    case 'exposure': return badge(e.reason === 'commit' ? 'committed' : 'released', e.reason === 'commit' ? 'ok' : 'muted');
    case 'carried': return badge('carried', 'muted');
    default: return badge(e.decision || '?', 'muted');
  }
}

// whatHappened words an event as what happened to the money.
function whatHappened(e) {
  const m = (x) => money(abs(x), e.currency);
  const obj = e.object_id || 'the object';
  switch (e.decision) {
    case 'refused':
      return `refused (${e.reason}${e.scope && e.scope !== e.key_id ? ` by budget ${e.scope}` : ''}) before Stripe: nothing held, nothing sent`;
    case 'would_refuse':
      return `report mode let it through; an enforcing key would have refused it (${e.reason})`;
    case 'allowed':
      return `${m(e.held_delta)} held while the request goes to Stripe`;
    case 'settled':
      switch (e.reason) {
        case 'commit':
          if (!isZero(e.committed_delta)) return `Stripe answered: ${m(e.committed_delta)} moved and is committed`;
          if (e.object_id) return `Stripe answered: the money stays held as the exposure of ${obj} until it moves or can move no more`;
          return 'Stripe answered: no money moved';
        case 'release':
          return `Stripe refused the request: ${m(e.held_delta)} released, nothing moved`;
        case 'unknown':
          return `no answer from Stripe: the money may have moved, so ${m(e.amount)} stays held until a retry or an operator settles it`;
        default:
          return `settled (${e.reason})`;
      }
    case 'resolved':
      return isZero(e.committed_delta)
        ? `an operator said it did not move: ${m(e.held_delta)} released`
        : `an operator said it moved: ${m(e.committed_delta)} committed`;
    case 'exposure':
      return e.reason === 'commit'
        ? `${m(e.committed_delta)} of ${obj} moved: committed`
        : `${m(e.held_delta)} of ${obj} released: it can move no more money`;
    case 'carried':
      return "the day's usage carried into the new time zone's day";
    default:
      return e.reason || '';
  }
}

// auditTable lists audit entries with their changes.
export function auditTable(entries, timeZone) {
  return table({
    caption: 'Audit trail',
    empty: 'No change recorded.',
    columns: [
      {label: 'Time', cell: (e) => timeEl(e.time, timeZone)},
      {label: 'Who', cell: (e) => e.actor},
      {label: 'Action', cell: (e) => h('code', null, e.action)},
      {label: 'Target', cell: (e) => auditTarget(e)},
      {label: 'Change', cell: (e) => changeDetails(e)},
    ],
    rows: entries,
  });
}

// auditTarget names an audit entry's target beside its id, linking a key (also
// the key of a resolved hold) to its page.
function auditTarget(e) {
  const doc = e.after || e.before || {};
  const keyId = e.target.startsWith('key_') ? e.target : doc.key_id || doc.KeyID;
  const name = doc.name && doc.name !== e.target ? doc.name : '';
  return [
    name ? [h('strong', null, name), h('br')] : null,
    e.target.startsWith('key_') ? h('a', {href: `#/keys/${encodeURIComponent(e.target)}`}, h('code', {class: 'break'}, e.target)) : h('code', {class: 'break'}, e.target),
    !e.target.startsWith('key_') && keyId ? [h('br'), h('span', {class: 'muted'}, 'key '), h('a', {href: `#/keys/${encodeURIComponent(keyId)}`}, h('code', null, keyId))] : null,
  ];
}

// changeDetails shows what an audit entry changed: the fields that differ, with
// the full before and after documents on demand.
function changeDetails(e) {
  let summary;
  if (e.before === null && e.after !== null) summary = 'created';
  else if (e.after === null && e.before !== null) summary = 'deleted';
  else {
    const diffs = diff(e.before, e.after);
    summary = diffs.length ? diffs.slice(0, 3).join(', ') + (diffs.length > 3 ? '…' : '') : 'no change';
  }
  return h('details', null,
    h('summary', null, summary),
    h('div', {class: 'before-after'},
      h('div', null, h('h4', null, 'Before'), h('pre', null, h('code', null, JSON.stringify(e.before, null, 2)))),
      h('div', null, h('h4', null, 'After'), h('pre', null, h('code', null, JSON.stringify(e.after, null, 2))))));
}

// diff names the leaves that differ between two JSON documents.
function diff(a, b, path = '') {
  if (JSON.stringify(a) === JSON.stringify(b)) return [];
  const obj = (x) => x && typeof x === 'object' && !Array.isArray(x);
  if (!obj(a) || !obj(b)) return [path || 'everything'];
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  return [...keys].sort().flatMap((k) => diff(a[k], b[k], path ? `${path}.${k}` : k));
}
