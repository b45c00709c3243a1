// Money arrives from the API as decimal strings ("99.00"). The page never does
// arithmetic on them in floating point: proportions are computed on integers
// (BigInt) and numbers are shown as the API wrote them.

import {h, money} from './dom.js';

// decimals returns how many digits follow the point.
function decimals(str) {
  const dot = str.indexOf('.');
  return dot < 0 ? 0 : str.length - dot - 1;
}

// toUnits converts a decimal string to a BigInt of 10^-scale units.
export function toUnits(str, scale) {
  const neg = str.startsWith('-');
  const [int, frac = ''] = (neg ? str.slice(1) : str).split('.');
  const v = BigInt(int + frac.padEnd(scale, '0').slice(0, scale));
  return neg ? -v : v;
}

// scaleOf is the scale that represents every one of strs exactly.
export function scaleOf(...strs) {
  return Math.max(0, ...strs.filter((x) => typeof x === 'string').map(decimals));
}

// percent returns part / whole × 100 with one decimal, as a Number for layout
// and display (0 when whole is 0).
export function percent(part, whole) {
  const scale = scaleOf(part, whole);
  const w = toUnits(whole, scale);
  if (w <= 0n) return 0;
  return Number((toUnits(part, scale) * 1000n) / w) / 10;
}

// add sums decimal strings exactly, written with the largest scale among them.
export function add(...strs) {
  const scale = scaleOf(...strs);
  let sum = 0n;
  for (const x of strs) sum += toUnits(x, scale);
  const neg = sum < 0n;
  let digits = (neg ? -sum : sum).toString().padStart(scale + 1, '0');
  if (scale > 0) digits = `${digits.slice(0, -scale)}.${digits.slice(-scale)}`;
  return neg ? `-${digits}` : digits;
}

// isZero reports whether a decimal string is zero.
export function isZero(str) {
  return toUnits(str, scaleOf(str)) === 0n;
}

// NEAR is the share of a cap (in percent) from which a window is "near" it.
export const NEAR = 80;

// windowState says how full a window is: 'full' at or over its cap, 'near' from
// NEAR percent, else ''.
export function windowState(win) {
  if (!win || win.cap === null || win.cap === undefined) return '';
  const used = percent(add(win.committed, win.held), win.cap);
  if (used >= 100) return 'full';
  if (used >= NEAR) return 'near';
  return '';
}

// usageBar shows one window: a bar of committed, held and remaining against the
// cap, and the same numbers as text (the bar's colours are never the only
// carrier of the information).
//
// mode is the key's policy mode: a report-mode window at or past its cap is
// not a broken cap but what would have been refused, and is worded so.
export function usageBar(win, currency, name, mode) {
  if (!win) return h('span', {class: 'muted'}, '—');
  const cur = currency ? currency.toUpperCase() : '';
  if (win.cap === null || win.cap === undefined) {
    return h('div', {class: 'usage no-cap'},
      h('div', {class: 'usage-text'}, h('strong', null, win.committed), ` committed, ${win.held} held ${cur}`),
      h('div', {class: 'usage-sub muted'}, 'no cap'));
  }
  const report = mode === 'report';
  const state = windowState(win);
  const pc = Math.min(100, percent(win.committed, win.cap));
  const ph = Math.min(100 - pc, percent(win.held, win.cap));
  const used = percent(add(win.committed, win.held), win.cap);
  const label = `${name}: ${win.committed} committed and ${win.held} held of a ${win.cap} ${cur} cap, ${win.remaining} remaining (${used} % used)`;
  const committed = h('span', {class: 'seg seg-committed', dataset: {percent: String(pc)}});
  const held = h('span', {class: 'seg seg-held', dataset: {percent: String(ph)}});
  committed.style.width = `${pc}%`;
  held.style.width = `${ph}%`;
  return h('div', {class: ['usage', state && `usage-${state}`, report && 'usage-report'], dataset: {window: name.toLowerCase()}},
    h('div', {class: 'bar', role: 'img', 'aria-label': label}, committed, held),
    h('div', {class: 'usage-text'},
      h('strong', {class: 'committed'}, win.committed),
      isZero(win.held) ? null : h('span', {class: 'held'}, ` + ${win.held} held`),
      h('span', {class: 'of'}, ` of ${win.cap} ${cur}`),
      state === 'full' && report ? h('span', {class: 'badge badge-info'}, `${Math.floor(used)} % · report mode`)
        : state === 'full' ? h('span', {class: 'badge badge-bad'}, 'at cap')
          : state === 'near' ? h('span', {class: 'badge badge-warn'}, `${Math.floor(used)} %`) : null),
    h('div', {class: 'usage-sub muted'}, report && state === 'full'
      ? `over the cap: an enforcing key would have refused ${money(overCap(win), currency)} of it`
      : `${money(win.remaining, currency)} left`));
}

// overCap is how far committed + held is past the window's cap ("0" when not).
export function overCap(win) {
  const over = add(win.committed, win.held, `-${win.cap}`);
  return over.startsWith('-') ? add('0', `-${win.cap}`, win.cap) : over;
}
