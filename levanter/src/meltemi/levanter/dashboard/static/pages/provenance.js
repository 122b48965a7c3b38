// Data provenance: for a step and a row, the documents that fill it and the decoded text.
import { api, q } from "../lib/api.js";
import { el, fmtInt, panel, table } from "../lib/util.js";

export async function provenancePage(view, { id, query }) {
  const step = Number(query.get("step") || 1), row = Number(query.get("row") || 0);
  const stepIn = el("input", { type: "number", min: 1, value: step, "data-testid": "step-in", style: "width:90px" });
  const rowIn = el("input", { type: "number", min: 0, value: row, "data-testid": "row-in", style: "width:90px" });
  const go = () => { location.hash = `#/run/${encodeURIComponent(id)}/data?step=${stepIn.value}&row=${rowIn.value}`; };
  view.replaceChildren(
    el("h1", {}, el("a", { href: `#/run/${encodeURIComponent(id)}` }, id), " · data provenance"),
    el("div", { class: "sub" }, "Which documents fill one row of one training batch, and the text the model saw."),
    panel(null, el("div", { class: "toolbar" }, el("label", { class: "inline" }, "step", stepIn),
      el("label", { class: "inline" }, "row", rowIn), el("button", { onclick: go, "data-testid": "locate" }, "Locate"))));
  const p = await api(`/api/runs/${q(id)}/provenance`, { step, row });
  view.append(
    el("div", { class: "sub", "data-testid": "where" }, `step ${p.step}, row ${p.row} of ${p.batch_size} (global row ${fmtInt(p.global_row)})`),
    panel(`Documents (${p.documents.length})`, table([
      { key: "component", fmt: (v) => v ?? "—" }, { key: "source", fmt: (v) => el("span", { class: "mono" }, v) },
      { key: "document", num: true }, { key: "path", fmt: (v) => el("span", { class: "mono" }, v) },
      { key: "offset", label: "offset in doc", num: true }, { key: "row_offset", label: "at row position", num: true },
      { key: "tokens", num: true },
    ], p.documents, { rowAttrs: (d) => ({ "data-document": d.document }) })),
    panel("Decoded row (one colour per document)", el("pre", { class: "text", "data-testid": "row-text" },
      p.documents.map((d, i) => el("span", { class: `doc-${i % 4}`, title: `${d.path} @ ${d.offset}` }, d.text)))));
}
