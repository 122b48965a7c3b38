// Slices of an elastic (multislice) run: per-slice state and the shrink/grow timeline.
import { api, q } from "../lib/api.js";
import { badge, el, fmtBytes, fmtDuration, fmtInt, fmtTime, panel, setLive, table } from "../lib/util.js";

function timeline(events) {
  if (!events.length) return el("p", { class: "muted" }, "No events.");
  const t0 = Math.min(...events.map((e) => e.time)), t1 = Math.max(...events.map((e) => e.time));
  const span = Math.max(t1 - t0, 1);
  return el("div", { class: "timeline", "data-testid": "timeline" }, events.map((e, i) => el("div", {
    class: `ev ${e.kind}`, style: `left:${3 + 94 * (e.time - t0) / span}%`, title: `${fmtTime(e.time)}: ${e.reason}`,
  }, el("span", { style: `bottom:${18 + 16 * (i % 2)}px` }, e.kind), el("i", {}))));
}

export async function slicesPage(view, { id }) {
  const render = (d) => {
    const job = d.job;
    view.replaceChildren(
      el("h1", {}, el("a", { href: `#/run/${encodeURIComponent(id)}` }, id), " · slices", job ? badge(job.state) : null),
      job ? el("div", { class: "sub", "data-testid": "job" },
        `${job.num_slices} of ${job.target_slices} slices (min ${job.min_slices}) · generation ${job.generation} · step ${fmtInt(job.step)}`,
        job.reason ? ` · ${job.reason}` : "", ` · updated ${fmtTime(job.updated_at)}`) : el("div", { class: "sub" }, "No status.json: not an elastic run."),
      panel("Slices", table([
        { key: "index", label: "slice", num: true }, { key: "state", fmt: (v) => badge(v) },
        { key: "pid", num: true, fmt: (v) => v ?? "—" }, { key: "last_exit", label: "last exit", fmt: (v) => v || "—" },
        { key: "restarts", num: true }, { key: "peak_memory_bytes", label: "peak memory", num: true, fmt: fmtBytes },
        { key: "step", num: true, fmt: fmtInt }, { key: "started_at", label: "started", fmt: fmtTime },
        { key: "duration_s", label: "up for", num: true, fmt: fmtDuration }, { key: "reason", fmt: (v) => v || "" },
      ], d.slices, { rowAttrs: (r) => ({ "data-slice": r.index }) })),
      panel("Timeline: slices lost, shrink and grow", timeline(d.events),
        el("ul", { class: "events", "data-testid": "events" }, d.events.map((e) =>
          el("li", { "data-kind": e.kind }, el("span", { class: "mono" }, fmtTime(e.time)), " ", el("b", {}, e.kind), " ", e.reason)))));
  };
  const d = await api(`/api/runs/${q(id)}/slices`);
  render(d);
  const live = d.job && !["done", "failed", "stopped"].includes(d.job.state);
  setLive(live);
  if (!live) return;
  const timer = setInterval(() => api(`/api/runs/${q(id)}/slices`).then(render).catch(() => {}), 3000);
  return () => clearInterval(timer);
}
