// One run: curves (log-x, smoothing), skipped steps, throughput, mixture, evals, checkpoints, config.
// Live: a running run follows /stream (server-sent events) and shows each new step within ~1 s.
import { api, apiUrl, q } from "../lib/api.js";
import { CHARTS, COLORS, lineChart } from "../lib/chart.js";
import {
  apiTable, badge, card, el, fmtDuration, fmtInt, fmtLoss, fmtNum, fmtPct, fmtTime, isNum, panel, setLive, table,
} from "../lib/util.js";

const view_opts = { logX: false, smoothing: 0 }; // kept across runs while the page is open

/** Chart definitions: which metric keys go on which chart. */
function chartDefs(keys) {
  const evalLoss = keys.filter((k) => /^eval\/.+\/loss$/.test(k));
  const fractions = keys.filter((k) => /^data\/.+\/fraction$/.test(k));
  const defs = [
    { name: "loss", title: "Loss", keys: ["train/loss", ...evalLoss], skips: true },
    { name: "lr", title: "Learning rate", keys: ["optim/learning_rate"], yFmt: (v) => v.toExponential(1) },
    { name: "norms", title: "Gradient and update norms", keys: ["optim/grad_norm", "optim/update_norm"], skips: true, logY: true },
    { name: "tokens", title: "Tokens per second", keys: ["throughput/tokens_per_second"], yFmt: fmtNum },
    { name: "mfu", title: "MFU", keys: ["throughput/mfu"], yFmt: (v) => fmtPct(v, 0) },
  ];
  if (fractions.length) defs.push({ name: "fractions", title: "Mixture fractions per step", keys: fractions, noSmooth: true });
  return defs.filter((d) => d.keys.some((k) => keys.includes(k)));
}

function seriesOf(metrics, keys) {
  return keys.filter((k) => metrics.series[k]).map((k) => ({
    label: k, steps: metrics.series[k].steps, values: metrics.series[k].values,
    points: k.startsWith("eval/") || metrics.series[k].steps.length < 40,
  }));
}

/** The weight of each mixture component in force at each logged step, beside its fraction. */
function weightSeries(metrics, stages) {
  const out = [];
  for (const k of Object.keys(metrics.series).filter((k) => /^data\/.+\/fraction$/.test(k))) {
    const comp = k.split("/")[1];
    const steps = metrics.series[k].steps;
    const at = (st) => [...stages].reverse().find((s) => s.step < st)?.weights[comp] ?? null;
    out.push({ label: `weight ${comp}`, steps, values: steps.map(at), points: false, dash: [6, 4], color: COLORS[out.length % COLORS.length] });
  }
  return out;
}

function mixturePanel(detail) {
  if (!detail.mixture.length) return null;
  const bar = (v, cls = "") => el("span", {}, el("span", { class: `bar ${cls}` }, el("span", { style: `width:${isNum(v) ? 100 * v : 0}%` })), " ", fmtPct(v));
  return panel("Data mixture: measured fractions against weights",
    table([
      { key: "component" }, { key: "source", fmt: (v) => el("span", { class: "mono" }, v) },
      { key: "weight", label: "weight (current stage)", fmt: (v) => bar(v, "w") },
      { key: "fraction", label: "fraction (current stage)", fmt: (v) => bar(v) },
      { key: "fraction_all", label: "fraction (all steps)", num: true, fmt: (v) => fmtPct(v) },
    ], detail.mixture, { rowAttrs: (r) => ({ "data-component": r.component }) }),
    el("p", { class: "legend-note" }, "Weight stages: ", detail.mixture_stages.map((s) =>
      `from step ${s.step}: ${Object.entries(s.weights).map(([c, w]) => `${c} ${w}`).join(", ")}`).join("; ")));
}

function checkpointsPanel(detail) {
  if (!detail.checkpoints.length) return panel("Checkpoints", el("p", { class: "muted" }, "No checkpoints."));
  const state = { checksums: "✓ checksums", sizes: "sizes only", incomplete: "✗ incomplete" };
  return panel("Checkpoints", table([
    { key: "step", num: true }, { key: "kind" }, { key: "path", fmt: (v) => el("span", { class: "mono" }, v) },
    { key: "time", fmt: fmtTime },
    { key: "checksum_state", label: "verified", fmt: (v) => el("span", { class: v === "checksums" ? "ok" : v === "incomplete" ? "bad" : "" }, state[v] || v) },
    { key: "eval", label: "eval.json", fmt: (v) => (v ? "yes" : "—") },
  ], detail.checkpoints, { rowAttrs: (r) => ({ "data-step": r.step }) }));
}

function configPanel(detail) {
  const rows = Object.entries(detail.config).sort().map(([k, v]) => ({ key: k, value: v, source: detail.provenance[k] || "default" }));
  const nonDefault = rows.filter((r) => r.source !== "default");
  const body = el("div", {});
  const render = (all) => body.replaceChildren(table([
    { key: "key", fmt: (v) => el("span", { class: "mono" }, v) },
    { key: "value", fmt: (v) => el("span", { class: "mono" }, JSON.stringify(v)) },
    { key: "source", fmt: (v) => el("span", { class: `src ${v}` }, v) },
  ], all ? rows : nonDefault));
  const toggle = el("label", { class: "inline" }, el("input", { type: "checkbox", onchange: (e) => render(e.target.checked) }), "show defaults too");
  render(false);
  return panel("Config", el("p", { class: "mono muted" }, detail.spec, " ", detail.overrides.map((o) => `--config.${o}`).join(" ")), toggle, body);
}

export async function runPage(view, { id }) {
  const [detail, metrics] = await Promise.all([api(`/api/runs/${q(id)}`), api(`/api/runs/${q(id)}/metrics`)]);
  const s = detail.summary;
  const link = (path, text) => el("a", { class: "src", href: `#/run/${encodeURIComponent(id)}${path}` }, text);
  const stepCard = card("Step", `${fmtInt(s.step)} / ${isNum(s.total_steps) ? fmtInt(s.total_steps) : "?"}`, "step");
  const progress = el("div", { class: "progress" }, el("span", {}));
  const setProgress = (step) => { progress.firstChild.style.width = `${isNum(s.total_steps) ? Math.min(100, 100 * step / s.total_steps) : 0}%`; };
  setProgress(s.step);
  stepCard.append(progress);
  const lossCard = card("Loss", fmtLoss(s.loss), "loss");
  const tokCard = card("Tokens/s", fmtNum(s.tokens_per_s), "tokens_per_s");
  const mfuCard = card("MFU", fmtPct(s.mfu), "mfu");
  const etaCard = card("ETA", s.state === "running" ? fmtDuration(s.eta_s) : "—", "eta");
  const stateBox = el("span", {}, badge(s.state));

  const partial = detail.partial || metrics.partial;
  const linesNote = el("span", { class: "muted", "data-testid": "lines" },
    partial ? `≈${fmtInt(metrics.lines)} lines (sampled preview: exact curves loading…)` : `${fmtInt(metrics.lines)} lines`);
  const logX = el("input", { type: "checkbox", "data-testid": "logx", checked: view_opts.logX });
  const slider = el("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: view_opts.smoothing, "data-testid": "smoothing" });
  const sliderVal = el("span", { class: "mono" }, view_opts.smoothing.toFixed(2));
  const controls = el("div", { class: "toolbar" },
    el("label", { class: "inline" }, logX, "log-scale steps"),
    el("label", { class: "inline" }, "smoothing", slider, sliderVal),
    linesNote,
    el("span", { class: "muted" },
      metrics.skipped_lines ? `, ${metrics.skipped_lines} corrupt lines skipped` : "",
      metrics.downsampled ? " (downsampled)" : ""));

  const grid = el("div", { class: "grid" });
  const skipList = el("ul", { class: "events", "data-testid": "skips" }, detail.skip_events.map((e) =>
    el("li", { "data-step": e.step }, el("span", { class: "skip" }, `step ${e.step}`), ` skipped: ${e.reason}`)));
  view.replaceChildren(
    el("h1", {}, s.name, stateBox, s.elastic ? link("/slices", "slices") : null, link("/data", "data provenance"),
      el("a", { class: "src", href: `#/compare?runs=${encodeURIComponent(id)}` }, "compare…")),
    el("div", { class: "sub mono" }, id, " · ", s.config_name || "no config", " · started ", fmtTime(s.start_time)),
    el("div", { class: "cards" }, stepCard, lossCard, tokCard, mfuCard, etaCard,
      card("Skipped steps", String(detail.skip_events.length), "skipped"),
      card("Checkpoints", String(detail.checkpoints.length), "checkpoints")),
    panel(null, controls),
    grid);

  const charts = [];
  const seriesFor = (d) => [...seriesOf(metrics, d.keys), ...(d.name === "fractions" ? weightSeries(metrics, detail.mixture_stages) : [])];
  const markers = detail.skip_events.map((e) => ({ step: e.step, label: `skip ${e.step}` }));
  const smoothingFor = (d) => (d.noSmooth ? 0 : view_opts.smoothing);
  for (const d of chartDefs(metrics.keys)) {
    const box = el("section", { class: "panel" }, el("div", { class: "chart-title" }, el("h2", {}, d.title)));
    grid.append(box);
    const c = lineChart(box, {
      name: d.name, series: seriesFor(d), logX: view_opts.logX, logY: d.logY,
      smoothing: smoothingFor(d), markers: d.skips ? markers : [], yFmt: d.yFmt,
    });
    if (d.skips && detail.skip_events.length) box.append(skipList.cloneNode(true));
    charts.push({ d, c });
  }
  const mix = mixturePanel(detail);
  const tables = [...detail.eval, ...detail.harness].filter((t) => t.rows.length && t.columns.length > 1);
  view.append(
    mix || "",
    tables.length ? el("div", { class: "grid" }, tables.map((t) => panel(t.name === "harness" ? "Harness results" : t.name === "eval" ? "Evaluation sets" : t.name, apiTable(t)))) : "",
    tables.length ? el("div", { style: "height:16px" }) : "",
    checkpointsPanel(detail),
    configPanel(detail));

  const redraw = () => charts.forEach(({ d, c }) => c.update({ series: seriesFor(d), logX: view_opts.logX, smoothing: smoothingFor(d) }));
  logX.addEventListener("change", () => { view_opts.logX = logX.checked; redraw(); });
  slider.addEventListener("input", () => { view_opts.smoothing = Number(slider.value); sliderVal.textContent = view_opts.smoothing.toFixed(2); redraw(); });

  // --- a long run opened before the server parsed it: a sample now, the exact page when parsed ---
  if (partial) {
    let stopped = false, timer = null, inner = null;
    const poll = async () => {
      if (stopped) return;
      try {
        const m = await api(`/api/runs/${q(id)}/metrics`, { keys: "step", max_points: 10 });
        if (!m.partial && !stopped) { inner = await runPage(view, { id }); if (stopped) inner(); return; }
      } catch { /* the next tick retries */ }
      if (!stopped) timer = setTimeout(poll, 1000);
    };
    timer = setTimeout(poll, 1000);
    return () => { stopped = true; clearTimeout(timer); if (inner) inner(); };
  }

  // --- live updates: append new steps from the event stream ---
  if (s.state !== "running" && s.state !== "degraded") return () => {};
  setLive(true);
  let last = metrics.last_step;
  const source = new EventSource(apiUrl(`/api/runs/${q(id)}/stream`, { since_step: last }));
  source.addEventListener("metrics", (ev) => {
    const upd = JSON.parse(ev.data);
    for (const [k, ser] of Object.entries(upd.series)) {
      const cur = metrics.series[k] || (metrics.series[k] = { steps: [], values: [] });
      ser.steps.forEach((st, i) => { if (st > (cur.steps.at(-1) ?? -Infinity)) { cur.steps.push(st); cur.values.push(ser.values[i]); } });
    }
    last = Math.max(last, upd.last_step);
    linesNote.textContent = `${fmtInt(upd.lines)} lines`;
    setProgress(last);
    const lastOf = (k) => metrics.series[k]?.values.at(-1);
    stepCard.querySelector(".v").textContent = `${fmtInt(last)} / ${isNum(s.total_steps) ? fmtInt(s.total_steps) : "?"}`;
    lossCard.querySelector(".v").textContent = fmtLoss(lastOf("train/loss"));
    tokCard.querySelector(".v").textContent = fmtNum(lastOf("throughput/tokens_per_second"));
    mfuCard.querySelector(".v").textContent = fmtPct(lastOf("throughput/mfu"));
    redraw();
  });
  // state and ETA come from the summary: refresh it now and then
  const timer = setInterval(async () => {
    try {
      const d = await api(`/api/runs/${q(id)}`);
      stateBox.replaceChildren(badge(d.summary.state));
      etaCard.querySelector(".v").textContent = d.summary.state === "running" ? fmtDuration(d.summary.eta_s) : "—";
    } catch { /* the next tick retries */ }
  }, 5000);
  return () => { source.close(); clearInterval(timer); };
}
export { CHARTS };
