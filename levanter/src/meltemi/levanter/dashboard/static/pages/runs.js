// The runs list: every run under the folder, sortable, filterable by name, refreshed every 5 s.
import { api } from "../lib/api.js";
import { badge, el, fmtDuration, fmtInt, fmtLoss, fmtNum, fmtPct, fmtTime, isNum, setLive } from "../lib/util.js";

const COLUMNS = [
  { key: "name", label: "Run" },
  { key: "state", label: "State" },
  { key: "step", label: "Step / total", num: true },
  { key: "loss", label: "Loss", num: true },
  { key: "tokens_per_s", label: "Tokens/s", num: true },
  { key: "mfu", label: "MFU", num: true },
  { key: "eta_s", label: "ETA", num: true },
  { key: "start_time", label: "Started" },
  { key: "config_name", label: "Config" },
];

const sort = { key: "start_time", dir: -1 };
let filterText = "";

function cell(run, key) {
  switch (key) {
    case "name":
      return el("td", { "data-col": "name" },
        el("input", { type: "checkbox", class: "pick-run", value: run.id, title: "select to compare" }), " ",
        el("a", { href: `#/run/${encodeURIComponent(run.id)}` }, run.id),
        run.elastic ? el("a", { class: "src", href: `#/run/${encodeURIComponent(run.id)}/slices` }, "slices") : null,
        run.skipped_lines ? el("span", { class: "src", title: "corrupt metrics lines skipped" }, `${run.skipped_lines} bad lines`) : null);
    case "state": return el("td", { "data-col": "state" }, badge(run.state));
    case "step": return el("td", { class: "num", "data-col": "step" },
      `${fmtInt(run.step)} / ${isNum(run.total_steps) ? fmtInt(run.total_steps) : "?"}`);
    case "loss": return el("td", { class: "num", "data-col": "loss" }, fmtLoss(run.loss));
    case "tokens_per_s": return el("td", { class: "num", "data-col": "tokens_per_s" }, fmtNum(run.tokens_per_s));
    case "mfu": return el("td", { class: "num", "data-col": "mfu" }, fmtPct(run.mfu));
    case "eta_s": return el("td", { class: "num", "data-col": "eta_s" }, run.state === "running" ? fmtDuration(run.eta_s) : "—");
    case "start_time": return el("td", { "data-col": "start_time" }, fmtTime(run.start_time));
    case "config_name": {
      const short = (run.config_name || "").split("/").slice(-1)[0];
      return el("td", { "data-col": "config_name", class: "mono", title: run.config_name }, short || "—");
    }
  }
}

function compareValues(a, b) {
  const va = a[sort.key], vb = b[sort.key];
  if (va === vb) return a.id < b.id ? -1 : 1;
  if (va === null || va === undefined) return 1; // missing values last either way
  if (vb === null || vb === undefined) return -1;
  return (va < vb ? -1 : 1) * sort.dir;
}

export async function runsPage(view) {
  const toolbar = el("div", { class: "toolbar" });
  const filter = el("input", { type: "text", placeholder: "Filter runs by name…", "data-testid": "filter", value: filterText });
  const compareBtn = el("button", { class: "ghost", "data-testid": "compare-selected" }, "Compare selected");
  const count = el("span", { class: "muted", "data-testid": "count" });
  toolbar.append(filter, compareBtn, count);
  const tableBox = el("div", {});
  view.replaceChildren(
    el("h1", {}, "Runs"),
    el("div", { class: "sub" }, "Every run directory under the folder. Click a column to sort; tick runs to compare."),
    el("section", { class: "panel" }, toolbar, tableBox));

  let runs = [];
  const render = () => {
    const needle = filterText.toLowerCase();
    const shown = runs.filter((r) => r.id.toLowerCase().includes(needle) || r.name.toLowerCase().includes(needle))
      .sort(compareValues);
    const picked = new Set([...tableBox.querySelectorAll(".pick-run:checked")].map((c) => c.value));
    count.textContent = `${shown.length} of ${runs.length} runs`;
    tableBox.replaceChildren(el("table", { "data-testid": "runs" },
      el("thead", {}, el("tr", {}, COLUMNS.map((c) => el("th", {
        class: `sortable ${c.num ? "num" : ""} ${sort.key === c.key ? "sorted " + (sort.dir > 0 ? "asc" : "desc") : ""}`,
        "data-sort": c.key,
        onclick: () => { sort.dir = sort.key === c.key ? -sort.dir : 1; sort.key = c.key; render(); },
      }, c.label)))),
      el("tbody", {}, shown.map((r) => el("tr", { "data-run": r.id }, COLUMNS.map((c) => cell(r, c.key)))))));
    tableBox.querySelectorAll(".pick-run").forEach((c) => { c.checked = picked.has(c.value); });
  };
  filter.addEventListener("input", () => { filterText = filter.value; render(); });
  compareBtn.addEventListener("click", () => {
    const ids = [...tableBox.querySelectorAll(".pick-run:checked")].map((c) => c.value);
    location.hash = `#/compare?runs=${ids.map(encodeURIComponent).join(",")}`;
  });

  const load = async () => { runs = (await api("/api/runs")).runs; render(); };
  await load();
  setLive(runs.some((r) => r.state === "running"));
  const timer = setInterval(() => load().catch(() => {}), 5000);
  return () => clearInterval(timer);
}
