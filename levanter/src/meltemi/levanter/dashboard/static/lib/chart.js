// Line and scatter charts on uPlot (vendored, see vendor/VERSIONS.json).
import uPlot from "../vendor/uPlot.esm.js";
import { el, isNum, smooth } from "./util.js";

export const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#475569"];

/** Every chart on the page by name, with the data it plots (browser tests read this). */
export const CHARTS = (window.__charts = window.__charts || {});

function markerPlugin(getMarkers) {
  // Vertical dashed lines at marked steps (skipped steps), labelled at the top.
  return {
    hooks: {
      draw: (u) => {
        const marks = getMarkers();
        if (!marks.length) return;
        const { ctx } = u;
        const { top, height } = u.bbox;
        ctx.save();
        ctx.strokeStyle = "#dc2626";
        ctx.fillStyle = "#dc2626";
        ctx.lineWidth = 1.5 * devicePixelRatio;
        ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
        ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
        for (const m of marks) {
          const x = Math.round(u.valToPos(m.step, "x", true));
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
          ctx.fillText(m.label, x + 4 * devicePixelRatio, top + 12 * devicePixelRatio);
        }
        ctx.restore();
      },
    },
  };
}

/**
 * A step chart of several series. spec = {name, series: [{label, steps, values}], logX, logY,
 * smoothing, markers: [{step, label}], height, yFmt}. Returns {update(spec), destroy()}.
 */
export function lineChart(container, spec) {
  const box = el("div", { class: "chart", "data-chart": spec.name });
  container.append(box);
  let state = { ...spec };
  let plot = null;

  function data() {
    const tables = state.series.map((s) => [s.steps, smooth(s.values, state.smoothing || 0)]);
    if (!tables.length) return [[]];
    const joined = tables.length === 1 ? tables[0] : uPlot.join(tables);
    if (state.logX) {
      // log x cannot show step 0: drop it
      const keep = joined[0].map((x) => x > 0);
      return joined.map((col) => col.filter((_, i) => keep[i]));
    }
    return joined;
  }

  function build() {
    if (plot) plot.destroy();
    const width = Math.max(320, box.clientWidth || container.clientWidth || 600);
    const opts = {
      width, height: state.height || 240,
      scales: { x: { time: false, distr: state.logX ? 3 : 1 }, y: { distr: state.logY ? 3 : 1 } },
      axes: [
        { label: state.xLabel || "step", stroke: "#475569", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#e2e8f0" } },
        { stroke: "#475569", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#e2e8f0" }, size: 60,
          values: state.yFmt ? (u, vals) => vals.map((v) => state.yFmt(v)) : undefined },
      ],
      series: [{ label: "step" }, ...state.series.map((s, i) => ({
        label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: 2, dash: s.dash,
        spanGaps: true, points: { show: s.points ?? (s.steps.length < 40) },
      }))],
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      plugins: [markerPlugin(() => state.markers || [])],
    };
    plot = new uPlot(opts, data(), box);
  }

  build();
  const ro = new ResizeObserver(() => {
    if (plot && Math.abs(plot.width - box.clientWidth) > 4) plot.setSize({ width: box.clientWidth, height: plot.height });
  });
  ro.observe(box);
  const api = {
    get spec() { return state; },
    /** The arrays uPlot draws (after smoothing and the log-x cut). */
    plotData() { return plot.data; },
    /** Replace series data (live updates) keeping the zoom unless the options changed. */
    update(next) {
      const rebuild = next.logX !== undefined && next.logX !== state.logX
        || next.series && next.series.length !== state.series.length;
      state = { ...state, ...next };
      if (rebuild) build(); else plot.setData(data());
    },
    destroy() { ro.disconnect(); plot && plot.destroy(); delete CHARTS[spec.name]; },
  };
  CHARTS[spec.name] = api;
  return api;
}

/**
 * A scatter plot with optional lines: spec = {name, points: [{label, x, y, color}],
 * lines: [{label, x, y, color, dash}], logX, xLabel, yLabel}.
 */
export function scatterChart(container, spec) {
  const box = el("div", { class: "chart", "data-chart": spec.name });
  container.append(box);
  const groups = [...(spec.lines || []).map((l) => ({ ...l, kind: "line" })),
    ...(spec.points || []).map((p) => ({ ...p, kind: "points" }))];
  const tables = groups.map((g) => {
    const order = g.x.map((_, i) => i).sort((a, b) => g.x[a] - g.x[b]);
    return [order.map((i) => g.x[i]), order.map((i) => g.y[i])];
  });
  const joined = uPlot.join(tables);
  const opts = {
    width: Math.max(320, container.clientWidth || 600), height: spec.height || 320,
    scales: { x: { time: false, distr: spec.logX ? 3 : 1 }, y: { distr: spec.logY ? 3 : 1 } },
    axes: [
      { label: spec.xLabel, stroke: "#475569", grid: { stroke: "#eef1f5" },
        values: (u, vals) => vals.map((v) => (isNum(v) ? v.toExponential(0).replace("e+", "e") : "")) },
      { label: spec.yLabel, stroke: "#475569", grid: { stroke: "#eef1f5" }, size: 60 },
    ],
    series: [{ label: spec.xLabel || "x" }, ...groups.map((g, i) => ({
      label: g.label, stroke: g.color || COLORS[i % COLORS.length], width: g.kind === "line" ? 2 : 0,
      dash: g.dash, spanGaps: true,
      paths: g.kind === "points" ? () => null : undefined,
      points: g.kind === "points"
        ? { show: true, size: g.size || 9, fill: g.color || COLORS[i % COLORS.length], stroke: "#fff", width: 1 }
        : { show: false },
    }))],
    legend: { live: true },
  };
  const plot = new uPlot(opts, joined, box);
  const ro = new ResizeObserver(() => {
    if (Math.abs(plot.width - box.clientWidth) > 4) plot.setSize({ width: box.clientWidth, height: plot.height });
  });
  ro.observe(box);
  const api = { spec, destroy() { ro.disconnect(); plot.destroy(); delete CHARTS[spec.name]; } };
  CHARTS[spec.name] = api;
  return api;
}
