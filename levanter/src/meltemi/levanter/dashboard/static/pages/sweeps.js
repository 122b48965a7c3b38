// Isoflop sweeps: loss against parameters per budget with the fitted parabolas, the scaling
// laws, and the preregistered prediction against the verified run.
import { api, q } from "../lib/api.js";
import { COLORS, scatterChart } from "../lib/chart.js";
import { card, el, fmtLoss, fmtNum, fmtPct, isNum, panel, table } from "../lib/util.js";

export async function sweepsPage(view) {
  const { sweeps } = await api("/api/sweeps");
  view.replaceChildren(el("h1", {}, "Sweeps"),
    el("div", { class: "sub" }, "Isoflop sweeps (directories with isoflop.json)."),
    panel(null, sweeps.length ? table([
      { key: "id", label: "sweep", fmt: (v) => el("a", { href: `#/sweep/${encodeURIComponent(v)}` }, v) },
      { key: "metric" }, { key: "runs", num: true, fmt: (v) => v.length },
      { key: "budgets", label: "budgets (FLOPs)", fmt: (v) => v.map((b) => b.toExponential(1)).join(", ") },
      { key: "has_prediction", label: "prediction", fmt: (v) => (v ? "yes" : "—") },
      { key: "has_verification", label: "verified", fmt: (v) => (v ? "yes" : "—") },
    ], sweeps, { rowAttrs: (s) => ({ "data-sweep": s.id }) }) : el("p", { class: "muted" }, "No sweeps.")));
}

export async function sweepPage(view, { id }) {
  const s = await api(`/api/sweeps/${q(id)}`);
  const budgets = [...new Set(s.points.map((p) => p.budget))].sort((a, b) => a - b);
  const color = (b) => COLORS[budgets.indexOf(b) % COLORS.length];
  const pts = budgets.map((b) => {
    const ps = s.points.filter((p) => p.budget === b);
    return { label: `C=${b.toExponential(0)} runs`, x: ps.map((p) => p.n_params), y: ps.map((p) => p.loss), color: color(b) };
  });
  const fitLines = s.fits.map((f) => ({ label: `fit C=${f.budget.toExponential(0)}`, x: f.curve.n, y: f.curve.loss, color: color(f.budget) }));
  const optima = { label: "fitted optimum", x: s.fits.map((f) => f.n_opt), y: s.fits.map((f) => f.l_opt), color: "#0f172a", size: 12 };
  view.replaceChildren(el("h1", {}, `Sweep ${s.id}`),
    el("div", { class: "sub" }, `${s.points.length} runs over ${budgets.length} compute budgets; metric ${s.metric}. Hover to read values; drag to zoom.`));
  const cards = el("div", { class: "cards" });
  view.append(cards);
  if (s.prediction) {
    cards.append(card("Predicted budget", s.prediction.budget.toExponential(1), "pred-budget"),
      card("Predicted N", fmtNum(s.prediction.n_opt), "pred-n"), card("Predicted loss", fmtLoss(s.prediction.loss), "pred-loss"),
      card("Interval", s.prediction.interval.map(fmtLoss).join(" – "), "pred-interval"));
  }
  if (s.verification) {
    const v = s.verification;
    cards.append(card("Verified loss", fmtLoss(v.actual), "actual-loss"),
      card("Relative error", fmtPct(v.relative_error, 2), "rel-error"),
      card("Inside interval", el("span", { class: v.inside_interval ? "ok" : "bad" }, v.inside_interval ? "yes" : "no"), "inside"));
  }
  const grid = el("div", { class: "grid" });
  view.append(grid);
  const isoBox = panel("Isoflop curves: loss against parameters");
  grid.append(isoBox);
  scatterChart(isoBox, { name: "isoflop", logX: true, xLabel: "parameters", yLabel: s.metric, lines: fitLines, points: [...pts, optima] });

  const laws = s.laws || {};
  if (laws.curve) {
    const lawBox = panel("Scaling law: optimal parameters and loss against compute");
    grid.append(lawBox);
    const points = [{ label: "fitted optima", x: s.fits.map((f) => f.budget), y: s.fits.map((f) => f.l_opt), color: "#2563eb" }];
    if (s.prediction) points.push({ label: "prediction", x: [s.prediction.budget], y: [s.prediction.loss], color: "#d97706", size: 13 });
    if (s.verification) points.push({ label: "verified", x: [s.verification.budget], y: [s.verification.actual], color: "#059669", size: 13 });
    scatterChart(lawBox, { name: "law", logX: true, xLabel: "compute (FLOPs)", yLabel: s.metric,
      lines: [{ label: "L(C) fit", x: laws.curve.budget, y: laws.curve.loss, color: "#94a3b8" }], points });
  }
  view.append(el("div", { style: "height:16px" }), panel("Fits per budget", table([
    { key: "budget", fmt: (v) => v.toExponential(1) }, { key: "n_opt", label: "N opt", num: true, fmt: (v) => fmtNum(v) },
    { key: "d_opt", label: "D opt (tokens)", num: true, fmt: (v) => fmtNum(v) }, { key: "l_opt", label: "loss at opt", num: true, fmt: fmtLoss },
    { key: "at_edge", label: "optimum at grid edge", fmt: (v) => (v ? "yes (extend the grid)" : "no") },
  ], s.fits)), panel("Runs", table([
    { key: "run", fmt: (v) => (v ? el("a", { href: `#/run/${encodeURIComponent(v)}` }, v) : "—") },
    { key: "budget", fmt: (v) => v.toExponential(1) }, { key: "n_params", num: true, fmt: (v) => fmtNum(v) },
    { key: "tokens", num: true, fmt: (v) => fmtNum(v) }, { key: "loss", num: true, fmt: fmtLoss },
  ], s.points, { rowAttrs: (p) => ({ "data-run": p.run }) })));
  if (laws.loss) view.append(panel("Fitted laws", el("p", { class: "mono" },
    laws.n_opt ? `N_opt = ${fmtNum(laws.n_opt.k)} · C^${laws.n_opt.a?.toFixed(3)}   ` : "",
    laws.d_opt ? `D_opt = ${fmtNum(laws.d_opt.k)} · C^${laws.d_opt.b?.toFixed(3)}   ` : "",
    `L(C) = ${laws.loss.E?.toFixed(3)} + ${fmtNum(laws.loss.A)} · (C/${fmtNum(laws.loss.C0)})^-${laws.loss.alpha?.toFixed(3)}`)));
  void isNum;
}
