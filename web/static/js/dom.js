// DOM helpers. Every piece of data reaches the page as text nodes or attribute
// values, never as HTML: nothing the API returns can become markup.

const PROPS = new Set(['hidden', 'disabled', 'checked', 'selected', 'readOnly', 'required', 'value', 'open', 'multiple']);

function applyProps(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') {
      el.setAttribute('class', Array.isArray(value) ? value.filter(Boolean).join(' ') : value);
    } else if (key === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (PROPS.has(key)) {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// h builds an HTML element: h('a', {href: '#/'}, 'text', child, [more]).
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  applyProps(el, props);
  return append(el, children);
}

const SVG_NS = 'http://www.w3.org/2000/svg';

// s builds an SVG element.
export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyProps(el, props);
  return append(el, children);
}

// replace empties el and fills it with children.
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let uid = 0;
// id returns a fresh element id with the given prefix.
export function id(prefix) {
  uid += 1;
  return `${prefix}-${uid}`;
}

// announce says msg to screen readers through the page's live region.
export function announce(msg) {
  const live = document.querySelector('.live');
  if (live) {
    live.textContent = '';
    // A new text node in a later task is announced even when it repeats.
    setTimeout(() => { live.textContent = msg; }, 50);
  }
}

// ---- formatting ----

const timeFormats = new Map();

function timeFormat(timeZone) {
  const key = timeZone || '';
  if (!timeFormats.has(key)) {
    let f;
    try {
      f = new Intl.DateTimeFormat('en-US', {
        timeZone: timeZone || undefined, year: 'numeric', month: '2-digit', day: '2-digit',
        hour: '2-digit', minute: '2-digit', hourCycle: 'h23', timeZoneName: 'short',
      });
    } catch {
      f = null; // an unknown zone: fall back to the browser's
    }
    timeFormats.set(key, f);
  }
  return timeFormats.get(key) || timeFormat('');
}

// fmtTime renders an RFC 3339 time as "2026-09-14 12:00 UTC" in timeZone (the
// browser's zone when none).
export function fmtTime(iso, timeZone) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const p = Object.fromEntries(timeFormat(timeZone).formatToParts(d).map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute} ${p.timeZoneName}`;
}

// timeEl is a <time> showing iso in timeZone, with the exact UTC instant as its title.
export function timeEl(iso, timeZone) {
  if (!iso) return h('span', {class: 'muted'}, '—');
  return h('time', {datetime: iso, title: iso}, fmtTime(iso, timeZone));
}

// ago renders how long ago iso was: "3 min ago", "2 h ago", "5 days ago".
export function ago(iso, now = Date.now()) {
  const secs = Math.max(0, Math.round((now - new Date(iso).getTime()) / 1000));
  if (secs < 90) return `${secs} s ago`;
  if (secs < 90 * 60) return `${Math.round(secs / 60)} min ago`;
  if (secs < 36 * 3600) return `${Math.round(secs / 3600)} h ago`;
  return `${Math.round(secs / 86400)} days ago`;
}

// money renders a decimal string with its currency: "25.00 USD".
export function money(amount, currency) {
  if (amount === null || amount === undefined) return '—';
  return currency ? `${amount} ${currency.toUpperCase()}` : amount;
}

// badge is a small label; kind picks its colour, the text always says it.
export function badge(text, kind) {
  return h('span', {class: ['badge', kind && `badge-${kind}`]}, text);
}

const STATUS_KIND = {active: 'ok', revoked: 'bad', expired: 'muted'};

// statusBadge shows a key's status.
export function statusBadge(status) {
  return badge(status, STATUS_KIND[status] || 'muted');
}

// labelChips shows a key's labels, each a link that filters the key list by it.
export function labelChips(labels) {
  const entries = Object.entries(labels || {}).sort(([a], [b]) => a.localeCompare(b));
  if (entries.length === 0) return h('span', {class: 'muted'}, '—');
  return h('ul', {class: 'chips'}, entries.map(([k, v]) => h('li', null,
    h('a', {class: 'chip', href: `#/keys?label=${encodeURIComponent(`${k}:${v}`)}`,
      title: `Show keys labelled ${k}=${v}`}, `${k}=${v}`))));
}

// section is a titled region of a page.
export function section(title, ...children) {
  const hid = id('section');
  return h('section', {class: 'panel', 'aria-labelledby': hid}, h('h2', {id: hid}, title), ...children);
}

// table builds a table with a caption, column headers and rows of cells. Each
// cell gets the column's name as data-label, which narrow screens show beside it.
export function table({caption, columns, rows, empty, rowClass, captionHidden = true}) {
  if (rows.length === 0 && empty) return h('p', {class: 'empty'}, empty);
  return h('div', {class: 'table-wrap'}, h('table', {class: 'data'},
    caption && h('caption', {class: captionHidden ? 'visually-hidden' : null}, caption),
    h('thead', null, h('tr', null, columns.map((c) => h('th', {scope: 'col', class: c.class}, c.label)))),
    h('tbody', null, rows.map((row, i) => h('tr', {class: rowClass ? rowClass(row, i) : null},
      columns.map((c) => h('td', {'data-label': c.label, class: c.class}, oneItem(c.cell(row)))))))));
}

// oneItem wraps a cell of several parts in one span: narrow screens lay a cell
// out as a grid of its label and its content, and each part would be a grid
// item of its own.
function oneItem(content) {
  return Array.isArray(content) ? h('span', {class: 'cell'}, content) : content;
}

// changes returns a function that reports whether the value it is given differs
// from the one it was given last: a periodic refresh that brings nothing new
// leaves the page alone (open details, focus, selection). reset forgets the last.
export function changes() {
  let last;
  const changed = (value) => {
    const s = JSON.stringify(value);
    if (s === last) return false;
    last = s;
    return true;
  };
  changed.reset = () => { last = undefined; };
  return changed;
}

// keepFocus re-renders a region and puts the keyboard focus back on the element
// with the same data-focus-id, so that a periodic refresh does not lose the
// user's place.
export function keepFocus(region, render) {
  const active = document.activeElement;
  const fid = active && region.contains(active) ? active.dataset.focusId : undefined;
  render();
  if (fid) {
    const again = region.querySelector(`[data-focus-id="${CSS.escape(fid)}"]`);
    if (again) again.focus({preventScroll: true});
  }
}

// copyButton is a small button that copies text (a long id) to the clipboard,
// and says so.
export function copyButton(text, what = 'id') {
  const btn = h('button', {type: 'button', class: 'button copy small', title: `Copy the ${what}`, 'aria-label': `Copy the ${what} ${text}`}, 'Copy');
  btn.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(text);
      btn.textContent = 'Copied';
    } catch {
      btn.textContent = 'Select it';
    }
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  });
  return btn;
}

// idWithCopy shows a long id as code with a copy button beside it.
export function idWithCopy(text, what) {
  if (!text) return h('span', {class: 'muted'}, '—');
  return h('span', {class: 'id-copy'}, h('code', {class: 'break'}, text), copyButton(text, what));
}

// modeBadge marks a report-mode key: it is never refused for its caps, only
// logs what would have been.
export function modeBadge(mode) {
  return mode === 'report' ? h('span', {class: 'badge badge-info mode-report', title: 'Report mode: what the policy would refuse is let through and logged as would_refuse'}, 'report mode') : null;
}

// keyLink links to a key's page by its name, with the id on hover.
export function keyLink(id, name) {
  return h('a', {class: 'key-link', href: `#/keys/${encodeURIComponent(id)}`, title: id}, name || id);
}

// opCode shows an operation name that never breaks inside a word.
export function opCode(op) {
  return h('code', {class: 'op'}, op || '—');
}
