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
];

const main = document.getElementById('main');
const nav = document.querySelector('.main-nav');
const who = document.querySelector('.session');

let current = null; // {view instance, route key}
let refreshing = false;

// parseHash splits "#/keys?status=active" into its path and query.
function parseHash() {
  const raw = location.hash.replace(/^#/, '');
  const [path, qs = ''] = raw.split('?');
  return {path: decodeURIComponent(path), query: new URLSearchParams(qs), raw};
}

// navigate goes to a dashboard route ("/keys/key_x").
export function navigate(route) {
  location.hash = `#${route}`;
}

function renderHeader() {
  const claims = session.claims();
  nav.hidden = !claims;
  who.hidden = !claims;
  if (!claims) return;
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
  if (current && current.instance.unmount) current.instance.unmount();
  current = null;
  for (const dlg of document.querySelectorAll('dialog')) dlg.remove();
  renderHeader();
  const {path, query} = parseHash();
  const ctx = {query, navigate, isAdmin: session.isAdmin()};
  main.replaceChildren();
  if (!session.token()) {
    document.title = 'Sign in · keybrake';
    current = {instance: signin.mount(main, ctx), key: 'signin'};
    return;
  }
  const route = routes.find((r) => r.pattern.test(path));
  if (!route) {
    document.title = 'Not found · keybrake';
    replace(main, h('h1', null, 'Page not found'),
      h('p', null, 'There is no such page. ', h('a', {href: '#/'}, 'Go to the overview.')));
    return;
  }
  if (route.admin && !ctx.isAdmin) {
    document.title = 'Not allowed · keybrake';
    replace(main, h('h1', null, 'Admins only'),
      h('p', null, 'This page changes keys, and your token has the viewer role: it may only read. ',
        h('a', {href: '#/keys'}, 'Back to the keys.')));
    return;
  }
  const params = path.match(route.pattern).slice(1).map(decodeURIComponent);
  try {
    const instance = route.view.mount(main, {...ctx, params});
    current = {instance, key: path};
  } catch (err) {
    main.append(errorBox(err, 'This page failed'));
  }
}

async function refresh() {
  if (refreshing || document.hidden || !current || !current.instance.refresh) return;
  if (document.querySelector('dialog[open]')) return; // do not move things under an open dialog
  refreshing = true;
  try {
    await current.instance.refresh();
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
  who.querySelector('.sign-out').addEventListener('click', () => {
    session.end('You signed out.');
    announce('Signed out.');
  });
  await signInFromFragment();
  session.onChange(() => mountCurrent());
  window.addEventListener('hashchange', () => {
    if (!location.hash.startsWith('#/') && location.hash !== '') return; // in-page anchors (skip link)
    mountCurrent().then(() => main.focus({preventScroll: false}));
  });
  session.resume();
  await mountCurrent();
  setInterval(refresh, REFRESH_MS);
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) refresh();
  });
}

start();
