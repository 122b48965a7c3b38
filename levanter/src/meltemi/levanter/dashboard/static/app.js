// Meltemi dashboard: a hash-routed single page over the JSON API (B_api.md). No build step.
import { runsPage } from "./pages/runs.js";
import { runPage } from "./pages/run.js";
import { comparePage } from "./pages/compare.js";
import { slicesPage } from "./pages/slices.js";
import { provenancePage } from "./pages/provenance.js";
import { sweepsPage, sweepPage } from "./pages/sweeps.js";
import { el, setLive } from "./lib/util.js";
import { api } from "./lib/api.js";

// Route table: "#/run/ID?tab=x" -> runPage({id, query}). Run ids may contain slashes.
const ROUTES = [
  [/^\/?$/, runsPage, "runs"],
  [/^\/runs$/, runsPage, "runs"],
  [/^\/run\/(.+)\/slices$/, slicesPage, "runs"],
  [/^\/run\/(.+)\/data$/, provenancePage, "runs"],
  [/^\/run\/(.+)$/, runPage, "runs"],
  [/^\/compare$/, comparePage, "compare"],
  [/^\/sweeps$/, sweepsPage, "sweeps"],
  [/^\/sweep\/(.+)$/, sweepPage, "sweeps"],
];

let cleanup = null; // the current page's teardown (closes its EventSource, timers)

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  setLive(false);
  const hash = location.hash.replace(/^#/, "") || "/runs";
  const [path, qs] = hash.split("?");
  const query = new URLSearchParams(qs || "");
  const view = document.getElementById("view");
  for (const [re, page, nav] of ROUTES) {
    const m = path.match(re);
    if (!m) continue;
    document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
    view.replaceChildren(el("p", { class: "muted" }, "Loading…"));
    document.body.dataset.ready = "0";
    try {
      const out = await page(view, { id: m[1] ? decodeURIComponent(m[1]) : null, query });
      cleanup = typeof out === "function" ? out : null;
    } catch (e) {
      view.replaceChildren(el("div", { class: "error", "data-testid": "error" }, String(e.message || e)));
    }
    document.body.dataset.ready = "1"; // browser tests wait for this
    return;
  }
  view.replaceChildren(el("div", { class: "error" }, `No page at #${hash}.`));
  document.body.dataset.ready = "1";
}

window.addEventListener("hashchange", route);
api("/api/info").then((info) => {
  const dir = document.getElementById("runs-dir");
  dir.replaceChildren(el("bdi", {}, info.runs_dir)); // rtl clips the start, bdi keeps the order
  dir.title = info.runs_dir;
}).catch(() => {});
route();
