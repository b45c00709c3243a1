// The spend-per-day chart: an inline SVG drawn from GET /keys/{id}/spend, bars
// of committed and held money per day of the billing period against the daily
// cap, with the same numbers in a table for reading and for screen readers.

import {h, s, id, table, money} from './dom.js';
import {add, scaleOf, toUnits, isZero} from './money.js';

const H = 220;
const M = {top: 14, right: 12, bottom: 30, left: 64};

// axisMax picks a round maximum for the y axis at or above max (in units of
// 10^-scale), so that the ticks read well.
function axisMax(max) {
  if (max <= 0) return 1;
  const mag = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) {
    if (step * mag >= max) return step * mag;
  }
  return 10 * mag;
}

// fmtUnits writes a number of 10^-scale units with scale decimals.
function fmtUnits(n, scale) {
  return (n / 10 ** scale).toFixed(scale);
}

// spendChart returns a figure for spend (the API's answer), drawn width pixels
// wide (the SVG scales, but text stays legible when the drawing matches the
// space it gets).
export function spendChart(spend, width) {
  const W = Math.round(Math.max(300, Math.min(1000, width || 720)));
  const cur = spend.currency;
  const days = spend.days;
  const figure = h('figure', {class: 'chart'});
  if (days.length === 0) {
    figure.append(h('p', {class: 'empty'}, 'The billing period has not started yet.'));
    return figure;
  }
  const scale = scaleOf(spend.daily_cap, ...days.flatMap((d) => [d.committed, d.held]));
  const units = (str) => Number(toUnits(str, scale));
  const totals = days.map((d) => units(add(d.committed, d.held)));
  const cap = spend.daily_cap === null ? null : units(spend.daily_cap);
  const ymax = axisMax(Math.max(cap === null ? 0 : cap * 1.1, ...totals));
  const pw = W - M.left - M.right;
  const ph = H - M.top - M.bottom;
  const y = (v) => M.top + ph - (v / ymax) * ph;
  const step = pw / days.length;
  const bw = Math.max(1, Math.min(28, step * 0.7));

  const titleId = id('chart-title');
  const descId = id('chart-desc');
  const svg = s('svg', {class: 'spend-chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
    'aria-labelledby': titleId, 'aria-describedby': descId, preserveAspectRatio: 'xMidYMid meet'});
  const committedTotal = add('0', ...days.map((d) => d.committed));
  svg.append(
    s('title', {id: titleId}, `Spend per day, ${days[0].date} to ${days[days.length - 1].date}`),
    s('desc', {id: descId}, `${money(committedTotal, cur)} committed over ${days.length} days` +
      (spend.daily_cap === null ? ', no daily cap.' : `, daily cap ${money(spend.daily_cap, cur)}.`)),
    s('defs', null, s('pattern', {id: 'held-hatch', width: 6, height: 6, patternUnits: 'userSpaceOnUse',
      patternTransform: 'rotate(45)'}, s('rect', {width: 6, height: 6, class: 'hatch-bg'}),
    s('line', {x1: 0, y1: 0, x2: 0, y2: 6, class: 'hatch-line'}))));

  // Axis and grid: 0, half and the top.
  for (const v of [0, ymax / 2, ymax]) {
    svg.append(
      s('line', {class: 'grid', x1: M.left, x2: W - M.right, y1: y(v), y2: y(v)}),
      s('text', {class: 'tick', x: M.left - 6, y: y(v) + 4, 'text-anchor': 'end'}, fmtUnits(v, scale)));
  }
  const labelEvery = Math.max(1, Math.ceil(days.length / Math.max(2, Math.floor(pw / 48))));
  days.forEach((d, i) => {
    const x = M.left + i * step + (step - bw) / 2;
    const c = units(d.committed);
    const held = units(d.held);
    const over = cap !== null && totals[i] > cap;
    const g = s('g', {class: ['day', over && 'over'], dataset: {date: d.date}});
    g.append(s('title', null, `${d.date}: ${money(d.committed, cur)} committed, ${d.held} held`));
    if (c > 0) g.append(s('rect', {class: 'committed', x, width: bw, y: y(c), height: Math.max(1, y(0) - y(c))}));
    if (held > 0) g.append(s('rect', {class: 'held', fill: 'url(#held-hatch)', x, width: bw, y: y(c + held), height: Math.max(1, y(c) - y(c + held))}));
    if (c === 0 && held === 0) g.append(s('rect', {class: 'zero', x, width: bw, y: y(0) - 1, height: 1}));
    svg.append(g);
    if (i % labelEvery === 0 || i === days.length - 1) {
      svg.append(s('text', {class: 'tick', x: x + bw / 2, y: H - M.bottom + 16, 'text-anchor': 'middle'}, d.date.slice(5)));
    }
  });
  if (cap !== null) {
    svg.append(
      s('line', {class: 'cap-line', x1: M.left, x2: W - M.right, y1: y(cap), y2: y(cap)}),
      s('text', {class: 'cap-label', x: W - M.right, y: y(cap) - 5, 'text-anchor': 'end'}, `daily cap ${spend.daily_cap}`));
  }

  const legend = h('ul', {class: 'legend'},
    h('li', null, h('span', {class: 'swatch committed'}), 'committed'),
    h('li', null, h('span', {class: 'swatch held'}), 'held (in flight, outcome unknown, or exposure)'),
    cap !== null ? h('li', null, h('span', {class: 'swatch cap'}), `daily cap (${money(spend.daily_cap, cur)})`) : null);
  const rows = days.slice().reverse();
  const details = h('details', {class: 'chart-table'}, h('summary', null, 'Show the days as a table'),
    table({
      caption: 'Spend per day',
      columns: [
        {label: 'Day', cell: (d) => d.date},
        {label: 'Committed', class: 'num', cell: (d) => d.committed},
        {label: 'Held', class: 'num', cell: (d) => (isZero(d.held) ? '0' : d.held)},
      ],
      rows,
    }));
  figure.append(svg, legend);
  if (spend.truncated) {
    figure.append(h('p', {class: 'hint'}, 'The ledger is too long to sum in one go: the oldest days may show less than they moved.'));
  }
  figure.append(details);
  return figure;
}
