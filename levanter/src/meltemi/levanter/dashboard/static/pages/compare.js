// Compare runs: overlaid curves of one metric, and the config difference key by key with sources.
import { api, q } from "../lib/api.js";
import { lineChart } from "../lib/chart.js";
import { badge, el, panel } from "../lib/util.js";

export async function comparePage(view, { query }) {
  const picked = (query.get("runs") || "").split(",").filter(Boolean);
  const metric = query.get("metric") || "train/loss";
  const { runs } = await api("/api/runs");
  const go = (ids, m) => { location.hash = `#/compare?runs=${ids.map(encodeURIComponent).join(",")}&metric=${encodeURIComponent(m)}`; };
  const chooser = el("div", { class: "pick" }, runs.map((r) => el("label", { class: "inline" },
    el("input", { type: "checkbox", value: r.id, checked: picked.includes(r.id), class: "pick-run" }), r.id, " ", badge(r.state))));
  const selectedIds = () => [...chooser.querySelectorAll(".pick-run:checked")].map((c) => c.value);
  view.replaceChildren(el("h1", {}, "Compare runs"),
    el("div", { class: "sub" }, "Pick two or more runs: their curves overlaid, and every config key that differs with where its value came from."),
    panel("Runs", chooser, el("div", { style: "margin-top:10px" },
      el("button", { "data-testid": "compare-go", onclick: () => go(selectedIds(), metric) }, "Compare"))));
  if (picked.length < 1) return;

  const all = await Promise.all(picked.map((id) => api(`/api/runs/${q(id)}/metrics`, { keys: metric })));
  const keys = [...new Set((await api(`/api/runs/${q(picked[0])}/metrics`, { keys: "train/loss", max_points: 10 })).keys)];
  const select = el("select", { "data-testid": "metric", onchange: (e) => go(picked, e.target.value) },
    keys.map((k) => el("option", { value: k, selected: k === metric }, k)));
  const chartBox = panel(null, el("div", { class: "toolbar" }, el("h2", { style: "margin:0" }, "Overlay"), select));
  view.append(chartBox);
  lineChart(chartBox, {
    name: "compare", height: 300,
    series: all.map((m, i) => ({ label: picked[i], steps: m.series[metric]?.steps || [], values: m.series[metric]?.values || [] })),
  });

  if (picked.length >= 2) {
    const diff = await api("/api/compare", { runs: picked.join(",") });
    const show = (v) => el("span", { class: "mono" }, v === undefined ? "(absent)" : JSON.stringify(v));
    view.append(panel(`Config difference (${diff.diff.length} keys differ, ${diff.same} equal)`,
      el("table", { class: "diff", "data-testid": "diff" },
        el("thead", {}, el("tr", {}, el("th", {}, "key"), picked.map((id) => el("th", {}, id)))),
        el("tbody", {}, diff.diff.map((d) => el("tr", { "data-key": d.key }, el("td", { class: "mono" }, d.key),
          d.values.map((v, i) => el("td", { class: "val" }, show(v), el("span", { class: `src ${d.sources[i]}` }, d.sources[i] || "default")))))))));
  }
}
