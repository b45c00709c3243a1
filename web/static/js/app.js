// The dashboard's shell: sign-in, the router (routes live in the URL fragment,
// "#/keys/key_..."), the header, and the refresh every few seconds of whatever
// page is open, without reloading it.

import {session, claimsOf} from './session.js';
import {get} from './api.js';
import {h, replace, announce, fmtTime} from './dom.js';
import {errorBox} from './ui.js';
import * as overview from './views/overview.js';
import * as keys from './views/keys.js';
import * as key from './views/key.js';
import * as mint from './views/mint.js';
import * as holds from './views/holds.js';
import * as upstreams from './views/upstreams.js';
import * as audit from './views/audit.js';
import * as webhooks from './views/webhooks.js';
import * as signin from './views/signin.js';

// REFRESH_MS is how often the open page re-reads its data.
const REFRESH_MS = 5000;

const routes = [
  {pattern: /^\/?$/, nav: 'overview', view: overview},
  {pattern: /^\/keys$/, nav: 'keys', view: keys},
  {pattern: /^\/keys\/([^/]+)$/, nav: 'keys', view: key},
  {pattern: /^\/mint$/, nav: 'keys', view: mint, admin: true},
  {pattern: /^\/holds$/, nav: 'holds', view: holds},
  {pattern: /^\/upstreams$/, nav: 'upstreams', view: upstreams},
  {pattern: /^\/audit$/, nav: 'audit', view: audit},
  {pattern: /^\/webhooks$/, nav: 'webhooks', view: webhooks},
];

const main = document.getElementById('main');
const demoBanner = document.querySelector('.demo-banner');
let demoChecked = '';
const nav = document.querySelector('.main-nav');
const who = document.querySelector('.session');

let current = null; // the open page: {refresh?, unmount?}
let refreshing = false;

// parseHash splits "#/keys?status=active" into its path and query.
// Any other fragment (an in-page anchor) is the overview.
function parseHash() {
  const raw = location.hash.startsWith('#/') ? location.hash.slice(1) : '/';
  const [path, qs = ''] = raw.split('?');
  return {path, query: new URLSearchParams(qs)};
}

// navigate goes to a dashboard route ("/keys/key_x").
export function navigate(route) {
  location.hash = `#${route}`;
}

// checkDemo shows the demo banner on every page when the server runs with
// --demo: its upstream is no Stripe. Asked once per token.
function checkDemo() {
  const token = session.token();
  if (!token || demoChecked === token) return;
  demoChecked = token;
  get('/overview').then((ov) => { demoBanner.hidden = !ov.demo; }).catch(() => {});
}

function renderHeader() {
  const claims = session.claims();
  nav.hidden = !claims;
  who.hidden = !claims;
  if (!claims) return;
  checkDemo();
  const exp = typeof claims.exp === 'number' ? new Date(claims.exp * 1000).toISOString() : null;
  replace(who.querySelector('.who'),
    h('span', {class: 'sub'}, claims.sub || '?'), ' ',
    h('span', {class: ['badge', claims.role === 'admin' ? 'badge-info' : 'badge-muted']}, claims.role || '?'),
    exp ? h('span', {class: 'exp muted'}, ` until ${fmtTime(exp)}`) : null);
  const {path} = parseHash();
  const route = routes.find((r) => r.pattern.test(path));
  for (const a of nav.querySelectorAll('a[data-nav]')) {
    if (route && a.dataset.nav === route.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

async function mountCurrent() {
  if (current && current.unmount) current.unmount();
  current = null;
  for (const dlg of document.querySelectorAll('dialog')) dlg.remove();
  renderHeader();
  const {path, query} = parseHash();
  const ctx = {query, navigate, isAdmin: session.isAdmin()};
  main.replaceChildren();
  if (!session.token()) {
    document.title = 'Sign in · keybrake';
    current = signin.mount(main, ctx);
    return;
  }
  const route = routes.find((r) => r.pattern.test(path));
  const notFound = () => {
    document.title = 'Not found · keybrake';
    replace(main, h('h1', null, 'Page not found'),
      h('p', null, 'There is no such page. ', h('a', {href: '#/'}, 'Go to the overview.')));
  };
  if (!route) {
    notFound();
    return;
  }
  if (route.admin && !ctx.isAdmin) {
    document.title = 'Not allowed · keybrake';
    replace(main, h('h1', null, 'Admins only'),
      h('p', null, 'This page changes keys, and your token has the viewer role: it may only read. ',
        h('a', {href: '#/keys'}, 'Back to the keys.')));
    return;
  }
  let params;
  try {
    params = path.match(route.pattern).slice(1).map(decodeURIComponent);
  } catch {
    params = null; // a malformed escape in the address
  }
  if (!params) {
    notFound();
    return;
  }
  try {
    current = route.view.mount(main, {...ctx, params});
  } catch (err) {
    main.append(errorBox(err, 'This page failed'));
  }
}

async function refresh() {
  if (refreshing || document.hidden || !current || !current.refresh) return;
  if (document.querySelector('dialog[open]')) return; // do not move things under an open dialog
  refreshing = true;
  try {
    await current.refresh();
  } finally {
    refreshing = false;
  }
}

// signInFromFragment takes the token of a sign-in link (#token=...), checks it
// with the API and keeps it; the token leaves the address bar and the history
// at once.
async function signInFromFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ''));
  const token = params.get('token');
  if (!token) return false;
  history.replaceState(null, '', `${location.pathname}#/`);
  if (!claimsOf(token)) {
    session.end('The sign-in link does not carry a valid token. Paste a token instead.');
    return true;
  }
  try {
    await get('/overview', {token});
    session.start(token);
  } catch (err) {
    session.end(`The sign-in link's token was refused: ${err.message}`);
  }
  return true;
}

async function start() {
  // The skip link moves the focus without touching the fragment, which is the route.
  document.querySelector('.skip-link').addEventListener('click', (ev) => {
    ev.preventDefault();
    main.focus();
  });
  who.querySelector('.sign-out').addEventListener('click', () => {
    session.end('You signed out.');
    announce('Signed out.');
  });
  await signInFromFragment();
  session.onChange(() => mountCurrent());
  window.addEventListener('hashchange', () => {
    // The focus moves to the new page for keyboards and screen readers, but
    // the page opens at its top, navigation included (a phone would otherwise
    // open it scrolled past the navigation).
    mountCurrent().then(() => {
      main.focus({preventScroll: true});
      window.scrollTo(0, 0);
    });
  });
  session.resume();
  await mountCurrent();
  setInterval(refresh, REFRESH_MS);
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) refresh();
  });
}

start();
