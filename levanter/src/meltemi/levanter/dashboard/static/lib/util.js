// DOM and number helpers shared by the pages.

/** el("td", {class: "num", "data-col": "loss"}, "1.23", child, ...) */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false)
    node.append(c instanceof Node ? c : String(c));
  return node;
}

export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

/** Loss-like numbers: 4 decimals (the tests compare with the file to 0.5e-4). */
export const fmtLoss = (v) => (isNum(v) ? v.toFixed(4) : "—");

/** A number in 4 significant digits, or with k/M/G suffix past 10,000. */
export function fmtNum(v, digits = 4) {
  if (!isNum(v)) return "—";
  const a = Math.abs(v);
  if (a >= 1e12) return (v / 1e12).toPrecision(3) + "T";
  if (a >= 1e9) return (v / 1e9).toPrecision(3) + "G";
  if (a >= 1e6) return (v / 1e6).toPrecision(3) + "M";
  if (a >= 1e4) return (v / 1e3).toPrecision(3) + "k";
  if (a !== 0 && (a < 1e-3)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

export const fmtInt = (v) => (isNum(v) ? Math.round(v).toLocaleString("en-US") : "—");
export const fmtPct = (v, d = 1) => (isNum(v) ? (100 * v).toFixed(d) + "%" : "—");

export function fmtBytes(v) {
  if (!isNum(v)) return "—";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${u[i]}`;
}

export function fmtDuration(s) {
  if (!isNum(s)) return "—";
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** Unix seconds as "2026-11-26 19:20" in local time. */
export function fmtTime(t) {
  if (!isNum(t)) return "—";
  const d = new Date(t * 1000);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export const badge = (state) => el("span", { class: `badge ${state}`, "data-testid": "state" }, state);

export function card(label, value, testid) {
  return el("div", { class: "card" }, el("div", { class: "k" }, label),
    el("div", { class: "v", "data-testid": testid }, value));
}

export function panel(title, ...children) {
  return el("section", { class: "panel" }, title ? el("h2", {}, title) : null, ...children);
}

/** A table from columns [{key, label, num, fmt}] and row objects; cells carry data-col. */
export function table(columns, rows, { rowAttrs = () => ({}) } = {}) {
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : "" }, c.label ?? c.key)))),
    el("tbody", {}, rows.map((r) => el("tr", rowAttrs(r), columns.map((c) => {
      const v = c.get ? c.get(r) : r[c.key];
      const shown = c.fmt ? c.fmt(v, r) : v ?? "—";
      return el("td", { class: c.num ? "num" : "", "data-col": c.key }, shown);
    })))));
}

/** A plain API Table {name, columns, rows} rendered; numbers in 4 decimals. */
export function apiTable(t) {
  const fmt = (v) => (isNum(v) ? (Number.isInteger(v) ? String(v) : v.toFixed(4)) : v ?? "—");
  return el("table", { "data-table": t.name },
    el("thead", {}, el("tr", {}, t.columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, t.rows.map((r) => el("tr", {}, r.map((v, i) =>
      el("td", { class: isNum(v) ? "num" : "", "data-col": t.columns[i] }, fmt(v)))))));
}

export function setLive(on) {
  const dot = document.getElementById("live-dot");
  if (dot) { dot.classList.toggle("on", !!on); dot.title = on ? "live: following new steps" : ""; }
}

/** Exponential moving average with debiasing (as TensorBoard's smoothing slider). */
export function smooth(values, weight) {
  if (!weight) return values;
  let last = 0, n = 0;
  return values.map((v) => {
    if (!isNum(v)) return v;
    last = last * weight + (1 - weight) * v;
    n++;
    return last / (1 - weight ** n);
  });
}
