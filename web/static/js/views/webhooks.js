// Webhooks: the endpoints keybrake sends signed events to, each with its
// recent deliveries. An admin can send a test event and retry a delivery.

import {get, post, pathId} from '../api.js';
import {h, replace, table, timeEl, announce, badge} from '../dom.js';
import {errorBox, message} from '../ui.js';

// RECENT is how many deliveries each endpoint shows.
const RECENT = 10;

export function mount(main, ctx) {
  document.title = 'Webhooks · keybrake';
  const notice = h('div', {class: 'notice-region'});
  const region = h('div', null, h('p', {class: 'loading'}, 'Loading…'));
  main.append(h('h1', null, 'Webhooks'),
    h('p', {class: 'hint'}, 'Endpoints that receive signed events (Standard Webhooks): thresholds crossed, refusals, unknown holds, expiring keys. Create them with POST /api/v1/webhooks.'),
    notice, region);

  async function load() {
    let res;
    try {
      res = await get('/webhooks');
    } catch (err) {
      replace(region, errorBox(err, 'The webhooks could not be loaded'));
      return;
    }
    if (res.webhooks.length === 0) {
      replace(region, h('p', {class: 'empty'}, 'No webhook endpoint yet.'));
      return;
    }
    const sections = await Promise.all(res.webhooks.map(async (w) => {
      let deliveries = [];
      try {
        deliveries = (await get(`/webhooks/${pathId(w.id)}/deliveries?limit=${RECENT}`)).deliveries;
      } catch (err) {
        return h('section', {class: 'panel'}, errorBox(err, `The deliveries of ${w.url} could not be loaded`));
      }
      return endpoint(w, deliveries);
    }));
    replace(region, ...sections);
  }

  function endpoint(w, deliveries) {
    const status = w.status === 'enabled' ? badge('enabled', 'ok') : badge(`disabled${w.disabled_reason ? ': ' + w.disabled_reason : ''}`, 'bad');
    return h('section', {class: 'panel webhook', 'data-webhook': w.id},
      h('h2', null, h('code', {class: 'break'}, w.url), ' ', status),
      h('p', {class: 'hint'}, `Events: ${w.events.join(', ')} · thresholds: ${w.thresholds.join('%, ')}% · secret ••••${w.secret_last4}`,
        w.description ? ` · ${w.description}` : ''),
      ctx.isAdmin && w.status === 'enabled'
        ? h('div', {class: 'actions'}, h('button', {type: 'button', class: 'button small', onclick: () => sendTest(w)}, 'Send a test event'))
        : null,
      table({
        caption: `Recent deliveries to ${w.url}`,
        empty: 'No delivery yet.',
        columns: [
          {label: 'Event', cell: (d) => h('code', null, d.event_type)},
          {label: 'State', cell: (d) => stateBadge(d)},
          {label: 'Attempts', cell: (d) => String(d.attempts)},
          {label: 'Last answer', cell: (d) => d.last_status ? String(d.last_status) + (d.last_error ? ` · ${d.last_error}` : '') : (d.last_error || '—')},
          {label: 'Created', cell: (d) => timeEl(d.created_at)},
          {label: 'Next attempt', cell: (d) => d.next_attempt_at ? timeEl(d.next_attempt_at) : '—'},
          ctx.isAdmin ? {label: 'Retry', cell: (d) => d.state === 'pending' ? '—'
            : h('button', {type: 'button', class: 'button small', 'data-retry': d.id, onclick: () => retry(w, d)}, 'Retry')} : null,
        ].filter(Boolean),
        rows: deliveries,
      }));
  }

  async function sendTest(w) {
    try {
      await post(`/webhooks/${pathId(w.id)}/test`);
      replace(notice, message('success', h('p', null, `A test event is on its way to ${w.url}.`)));
      announce('Test event queued.');
    } catch (err) {
      replace(notice, errorBox(err, 'The test event was not queued'));
    }
    await load();
  }

  async function retry(w, d) {
    try {
      await post(`/webhooks/${pathId(w.id)}/deliveries/${pathId(d.id)}/retry`);
      replace(notice, message('success', h('p', null, `The ${d.event_type} delivery is sent again.`)));
      announce('Delivery retried.');
    } catch (err) {
      replace(notice, errorBox(err, 'The delivery was not retried'));
    }
    await load();
  }

  load();
  return {refresh: load};
}

function stateBadge(d) {
  switch (d.state) {
    case 'delivered': return badge('delivered', 'ok');
    case 'failed': return badge('failed', 'bad');
    default: return badge('pending', 'warn');
  }
}
