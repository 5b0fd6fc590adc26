// refinery dashboard: plain DOM, charts as inline SVG. Everything from the API is inserted
// with textContent / setAttribute, never as HTML, because stage names and drop reasons come
// from user-submitted DAGs.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const ACTIVE = new Set(["queued", "running"]);
let timer = null;

// ---------------------------------------------------------------------------------------------
// helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
const pct = (a, b) => (b ? (100 * a / b).toFixed(1) + "%" : "–");
const when = (ts) => (ts ? new Date(ts * 1000).toLocaleString() : "–");

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60), r = Math.round(s % 60);
  return m < 60 ? `${m} m ${r} s` : `${Math.floor(m / 60)} h ${m % 60} m`;
}

async function api(path, opts = {}) {
  const headers = Object.assign({"X-Refinery-CSRF": "1"}, opts.headers || {});
  const resp = await fetch(path, Object.assign({credentials: "same-origin"}, opts, {headers}));
  if (resp.status === 401) {  // cookie expired or token rotated: back to the sign-in form
    window.location.href = "/";
    throw new Error("signed out");
  }
  const body = (resp.headers.get("content-type") || "").includes("json") ? await resp.json() : await resp.text();
  if (!resp.ok) {
    const detail = body && body.detail !== undefined ? body.detail : body;
    throw new Error(`${resp.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return body;
}

function badge(state) {
  return el("span", {class: `badge state-${state}`, "data-state": state}, state);
}

function bar(fraction, label) {
  const w = 160, h = 14, f = Math.max(0, Math.min(1, fraction || 0));
  return svg("svg", {class: "bar", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img",
                     "aria-label": label || `${(100 * f).toFixed(0)}%`},
    svg("rect", {x: 0, y: 0, width: w, height: h, rx: 3, class: "bar-bg"}),
    svg("rect", {x: 0, y: 0, width: (w * f).toFixed(1), height: h, rx: 3, class: "bar-fg"}),
    svg("title", {}, label || `${(100 * f).toFixed(1)}%`));
}

function setMain(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes);
}

function schedule(fn, ms) {
  clearTimeout(timer);
  timer = setTimeout(fn, ms);
}

// ---------------------------------------------------------------------------------------------
// charts

// Horizontal bars; an item may be split into parts ({value, cls, name}) for stacked bars.
function hbarChart(id, title, items, opts = {}) {
  const width = 680, labelW = 240, valueW = 90, row = 22, top = 4;
  const maxChars = 34;  // ~7 px per character at 12 px: keeps labels inside labelW
  const plotW = width - labelW - valueW;
  const total = (it) => (it.parts ? it.parts.reduce((a, p) => a + p.value, 0) : it.value);
  const max = Math.max(1, ...items.map(total));
  const height = top * 2 + row * Math.max(items.length, 1);
  const chart = svg("svg", {id, class: "chart hbar", width: "100%", viewBox: `0 0 ${width} ${height}`,
                            role: "img", "aria-label": title, "data-items": items.length});
  items.forEach((it, i) => {
    const y = top + i * row;
    chart.append(svg("text", {x: labelW - 8, y: y + row * 0.68, class: "label", "text-anchor": "end"},
                     it.label.length > maxChars ? it.label.slice(0, maxChars - 1) + "…" : it.label));
    let x = labelW;
    for (const p of it.parts || [{value: it.value, cls: "bar-main", name: ""}]) {
      const w = (plotW * p.value) / max;
      const r = svg("rect", {x: x.toFixed(1), y: y + 3, width: Math.max(w, p.value ? 1 : 0).toFixed(1),
                             height: row - 6, class: p.cls});
      r.append(svg("title", {}, `${it.label}${p.name ? " — " + p.name : ""}: ${fmt(p.value)}`));
      chart.append(r);
      x += w;
    }
    chart.append(svg("text", {x: x + 6, y: y + row * 0.68, class: "value"}, opts.valueText ? opts.valueText(it) : fmt(total(it))));
  });
  return figure(title, chart, opts.legend);
}

// Vertical histogram over bins [{lo, hi, docs}].
function histogramChart(id, title, bins) {
  const width = 680, height = 220, left = 50, bottom = 34, top = 10, right = 10;
  const plotW = width - left - right, plotH = height - top - bottom;
  const max = Math.max(1, ...bins.map((b) => b.docs));
  const bw = plotW / Math.max(bins.length, 1);
  const chart = svg("svg", {id, class: "chart histogram", width: "100%", viewBox: `0 0 ${width} ${height}`,
                            role: "img", "aria-label": title, "data-items": bins.length});
  chart.append(svg("line", {x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis"}));
  chart.append(svg("text", {x: left - 6, y: top + 10, class: "value", "text-anchor": "end"}, fmt(max)));
  chart.append(svg("text", {x: left - 6, y: top + plotH, class: "value", "text-anchor": "end"}, "0"));
  bins.forEach((b, i) => {
    const h = (plotH * b.docs) / max;
    const r = svg("rect", {x: (left + i * bw + 1).toFixed(1), y: (top + plotH - h).toFixed(1),
                           width: Math.max(bw - 2, 1).toFixed(1), height: h.toFixed(1), class: "bar-main"});
    r.append(svg("title", {}, `${b.lo}–${b.hi}: ${fmt(b.docs)} docs`));
    chart.append(r);
    if (i % Math.ceil(bins.length / 5) === 0) {
      chart.append(svg("text", {x: left + i * bw, y: height - bottom + 16, class: "value"}, String(b.lo)));
    }
  });
  if (bins.length) {
    chart.append(svg("text", {x: left + plotW, y: height - bottom + 16, class: "value", "text-anchor": "end"},
                     String(bins[bins.length - 1].hi)));
  }
  return figure(title, chart);
}

function figure(title, chart, legend) {
  return el("figure", {class: "card"}, el("figcaption", {}, title), chart, legend || null);
}

function legend(entries) {
  return el("div", {class: "legend"}, entries.map(([cls, name]) =>
    el("span", {}, svg("svg", {width: 12, height: 12}, svg("rect", {width: 12, height: 12, class: cls})), " ", name)));
}

// ---------------------------------------------------------------------------------------------
// runs list

function submitForm() {
  const out = el("p", {class: "message", id: "submit-message"});
  const file = el("input", {type: "file", id: "dag-file", accept: ".yaml,.yml"});
  const text = el("textarea", {id: "dag-text", rows: 6, placeholder: "…or paste a pipeline DAG (YAML) here"});
  const form = el("form", {id: "submit-form", class: "card", onsubmit: async (ev) => {
    ev.preventDefault();
    const body = new FormData();
    if (file.files.length) body.append("dag", file.files[0]);
    else if (text.value.trim()) body.append("dag", new Blob([text.value], {type: "application/yaml"}), "pasted.yaml");
    else { out.textContent = "Choose a YAML file or paste one."; return; }
    out.textContent = "Submitting…";
    try {
      const run = await api("/runs", {method: "POST", body});
      window.location.hash = `#/runs/${encodeURIComponent(run.id)}`;
    } catch (e) {
      out.textContent = e.message;
      out.className = "message error";
    }
  }}, el("h2", {}, "Submit a pipeline"), file, text, el("button", {type: "submit"}, "Submit"), out);
  return form;
}

async function showRuns() {
  let runs;
  try {
    runs = await api("/runs");
  } catch (e) {
    setMain(el("p", {class: "error"}, e.message));
    return schedule(showRuns, 5000);
  }
  const rows = runs.map((r) => el("tr", {"data-run-id": r.id},
    el("td", {}, el("a", {href: `#/runs/${encodeURIComponent(r.id)}`, class: "run-link"}, r.id)),
    el("td", {}, r.name || ""),
    el("td", {}, badge(r.state)),
    el("td", {class: "progress"}, bar(r.progress, `${(100 * r.progress).toFixed(0)}%`), " ",
       el("span", {class: "muted"}, `${(100 * r.progress).toFixed(0)}%`)),
    el("td", {}, when(r.submitted || r.started)),
    el("td", {class: "num"}, duration(r.elapsed_s))));
  const table = el("table", {id: "runs-table"},
    el("thead", {}, el("tr", {}, ["Run", "Name", "State", "Progress", "Submitted", "Elapsed"].map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", {colspan: 6, class: "muted"}, "No runs yet."))));
  const existing = document.getElementById("submit-form");
  setMain(el("section", {class: "card"}, el("h2", {}, "Runs"), table), existing || submitForm());
  schedule(showRuns, runs.some((r) => ACTIVE.has(r.state)) ? 2000 : 10000);
}

// ---------------------------------------------------------------------------------------------
// one run

function stageTable(stages) {
  return el("table", {id: "stage-table"},
    el("thead", {}, el("tr", {}, ["Stage", "Type", "Shards", "Docs in", "Kept", "Rejected", "Kept %"].map((h) => el("th", {}, h)))),
    el("tbody", {}, stages.map((s) => el("tr", {"data-stage": s.stage},
      el("td", {}, el("a", {href: "#", class: "stage-link", onclick: (ev) => {
        ev.preventDefault();
        if (docBrowser) { docBrowser.selectStage(s.stage); docBrowser.section.scrollIntoView({block: "start"}); }
      }}, s.stage)), el("td", {}, s.type), el("td", {class: "num"}, fmt(s.shards)),
      el("td", {class: "num"}, fmt(s.docs_in)), el("td", {class: "num"}, fmt(s.kept)),
      el("td", {class: "num"}, fmt(s.rejected)), el("td", {class: "num"}, pct(s.kept, s.docs_in))))));
}

function reasonsTable(reasons) {
  if (!reasons.length) return el("p", {class: "muted"}, "No document was dropped.");
  return el("table", {id: "reasons-table"},
    el("thead", {}, el("tr", {}, ["Stage", "Reason", "Docs"].map((h) => el("th", {}, h)))),
    el("tbody", {}, reasons.map((r) => el("tr", {}, el("td", {}, r.stage), el("td", {}, r.reason),
                                               el("td", {class: "num"}, fmt(r.docs))))));
}

function sqlBox(id) {
  const q = el("textarea", {id: "sql-query", rows: 3},
               "select source, count(*) as docs, sum(length(text)) as chars from kept group by 1 order by 2 desc");
  const out = el("div", {id: "sql-result"});
  const run = async (ev) => {
    ev.preventDefault();
    out.replaceChildren(el("p", {class: "muted"}, "Running…"));
    try {
      const res = await api(`/runs/${encodeURIComponent(id)}/sql?limit=200&q=${encodeURIComponent(q.value)}`);
      const t = el("table", {class: "sql"},
        el("thead", {}, el("tr", {}, res.columns.map((c) => el("th", {}, c)))),
        el("tbody", {}, res.rows.map((row) => el("tr", {}, row.map((v) =>
          el("td", {}, v === null ? "∅" : typeof v === "object" ? JSON.stringify(v) : String(v)))))));
      out.replaceChildren(t, el("p", {class: "muted"},
        `${res.rows.length} row(s)${res.truncated ? ` (first ${res.limit})` : ""} in ${res.elapsed_s} s`));
    } catch (e) {
      out.replaceChildren(el("p", {class: "error"}, e.message));
    }
  };
  return el("form", {class: "card", id: "sql-form", onsubmit: run},
    el("h2", {}, "Query (read-only SQL over kept, rejected, manifest, <stage>)"), q,
    el("button", {type: "submit"}, "Run query"), out);
}

// ---------------------------------------------------------------------------------------------
// document browser: a stage's kept / rejected documents, page by page, and its signal histograms

const PAGE = 20;
const sqlString = (s) => "'" + String(s).replace(/'/g, "''") + "'";
const sqlIdent = (s) => '"' + String(s).replace(/"/g, '""') + '"';

function snippet(text, n = 160) {
  if (text === null || text === undefined) return "∅";
  const flat = String(text).replace(/\s*\n\s*/g, " ⏎ ");
  return flat.length > n ? flat.slice(0, n - 1) + "…" : flat;
}

function cellText(v) {
  if (v === null || v === undefined) return "∅";
  if (typeof v === "number") return Number.isInteger(v) ? fmt(v) : String(Number(v.toPrecision(6)));
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

// Whether value v falls on the dropping side of threshold t ({value, drops, op, note}).
function violates(v, t) {
  if (v === null || v === undefined) return t.op === "< or null";
  if (typeof v !== "number") return false;
  if (t.note === "0 passes" && v === 0) return false;
  return t.drops === "below" ? v < t.value : v > t.value;
}

function thresholdText(t) {
  return `${t.drops === "below" ? "<" : ">"} ${t.value} drops (${t.param}; ${t.reason})` + (t.note ? `, ${t.note}` : "");
}

class DocBrowser {
  constructor(runId) {
    this.runId = runId;
    this.base = `/runs/${encodeURIComponent(runId)}/stages`;
    this.stages = [];
    this.loading = false;
    this.doc = null;
    this.detail = null;
    this.stage = null;
    this.which = "kept";
    this.reason = "";
    this.offset = 0;
    this.page = null;
    this.column = null;
    this.clip = false;
    this.hist = null;
    this.marker = null;  // {column, value, label}: the opened document's value on the histogram

    this.stageSel = el("select", {id: "browse-stage", onchange: () => this.selectStage(this.stageSel.value)});
    this.whichSel = el("select", {id: "browse-which", onchange: () => { this.which = this.whichSel.value; this.reason = ""; this.offset = 0; this.renderControls(); this.loadPage(); }});
    this.reasonSel = el("select", {id: "browse-reason", onchange: () => {
      this.reason = this.reasonSel.value;
      this.offset = 0;
      this.loadPage();
      // the histogram follows the rule behind the reason, when that rule has a threshold
      const rule = (this.detail.rules || []).find((r) => r.reason === this.reason);
      const col = rule && rule.signals[0];
      if (col && this.detail.thresholds[col] && col !== this.column) {
        this.column = col;
        this.colSel.value = col;
        this.loadHistogram();
      }
    }});
    this.prev = el("button", {id: "page-prev", type: "button", onclick: () => { this.offset = Math.max(0, this.offset - PAGE); this.loadPage(); }}, "← Previous");
    this.next = el("button", {id: "page-next", type: "button", onclick: () => { this.offset += PAGE; this.loadPage(); }}, "Next →");
    this.pageInfo = el("span", {id: "page-info", class: "muted"});
    this.sqlBtn = el("button", {id: "browse-sql", type: "button", onclick: () => this.toSql()}, "Query in SQL");
    this.list = el("div", {id: "doc-list"}, el("p", {class: "muted"}, "Loading stages…"));
    this.view = el("div", {id: "doc-view", class: "doc-view", hidden: true});
    this.section = el("section", {class: "card", id: "browser"},
      el("h2", {}, "Documents"),
      el("div", {class: "controls"},
        el("label", {}, "Stage ", this.stageSel), el("label", {}, "Show ", this.whichSel),
        el("label", {}, "Reason ", this.reasonSel), this.sqlBtn),
      el("div", {class: "controls"}, this.prev, this.next, this.pageInfo),
      this.list, this.view);

    this.colSel = el("select", {id: "hist-column", onchange: () => { this.column = this.colSel.value; this.loadHistogram(); }});
    this.clipBox = el("input", {type: "checkbox", id: "hist-clip", onchange: () => { this.clip = this.clipBox.checked; this.loadHistogram(); }});
    this.chart = el("div", {id: "hist-chart"});
    this.histNote = el("p", {id: "hist-note", class: "muted"});
    this.histSection = el("section", {class: "card", id: "signals"},
      el("h2", {}, "Signal histogram (kept and rejected rows of the stage)"),
      el("div", {class: "controls"}, el("label", {}, "Signal ", this.colSel),
         el("label", {}, this.clipBox, " zoom to the 1st–99th percentile")),
      this.chart, this.histNote,
      legend([["bar-kept", "kept"], ["bar-rejected", "rejected"], ["threshold-swatch", "threshold (drops beyond the line)"],
              ["marker-swatch", "opened document"]]));
    this.init();
  }

  // Load (or, while the run goes on, refresh) the list of stages and their counts.
  async init() {
    if (this.loading) return;
    this.loading = true;
    try {
      this.stages = await api(this.base);
    } catch (e) {
      if (!this.stage) this.list.replaceChildren(el("p", {class: "error"}, e.message));
      return;
    } finally {
      this.loading = false;
    }
    const chosen = this.stage;
    this.stageSel.replaceChildren(...this.stages.map((s) => el("option", {value: s.stage},
      `${s.stage} (${s.type}) — ${fmt(s.kept)} kept, ${fmt(s.rejected)} rejected`)));
    if (chosen) {
      this.stageSel.value = chosen;
      return;
    }
    if (!this.stages.some((s) => s.shards)) {
      this.list.replaceChildren(el("p", {class: "muted"}, "No stage has committed shards yet."));
      return;
    }
    const first = this.stages.find((s) => s.rejected > 0) || this.stages.find((s) => s.kept > 0) || this.stages[0];
    this.selectStage(first.stage);
  }

  // Select a stage programmatically or from the stage table.
  async selectStage(stage, opts = {}) {
    this.stage = stage;
    this.stageSel.value = stage;
    const s = this.stages.find((x) => x.stage === stage) || {};
    this.which = opts.which || (s.rejected > 0 ? "rejected" : "kept");
    this.reason = opts.reason || "";
    this.offset = 0;
    this.detail = null;
    this.view.hidden = true;
    this.marker = null;
    this.list.replaceChildren(el("p", {class: "muted"}, "Loading…"));
    try {
      this.detail = await api(`${this.base}/${encodeURIComponent(stage)}`);
    } catch (e) {
      this.list.replaceChildren(el("p", {class: "error"}, e.message));
      return;
    }
    if (this.stage !== stage) return;  // another stage was chosen meanwhile
    this.renderControls();
    const withThr = this.detail.signals.filter((c) => this.detail.thresholds[c]);
    this.column = withThr[0] || this.detail.signals[0] || null;
    this.renderColumns();
    this.loadPage();
    this.loadHistogram();
  }

  renderControls() {
    const d = this.detail;
    this.whichSel.replaceChildren(
      el("option", {value: "kept"}, `kept (${fmt(d.kept)})` + (d.kept_written ? "" : " — not written")),
      el("option", {value: "rejected"}, `rejected (${fmt(d.rejected)})`));
    this.whichSel.value = this.which;
    this.reasonSel.replaceChildren(el("option", {value: ""}, "all reasons"),
      ...d.reasons.map((r) => el("option", {value: r.reason}, `${r.reason} (${fmt(r.docs)})`)));
    this.reasonSel.value = this.reason;
    this.reasonSel.disabled = this.which !== "rejected" || !d.reasons.length;
  }

  async loadPage() {
    const seq = this.pageSeq = (this.pageSeq || 0) + 1;  // only the latest request draws
    const stage = this.stage, params = new URLSearchParams({which: this.which, offset: this.offset, limit: PAGE, max_chars: 300});
    if (this.which === "rejected" && this.reason) params.set("reason", this.reason);
    let page;
    try {
      page = await api(`${this.base}/${encodeURIComponent(stage)}/documents?${params}`);
    } catch (e) {
      if (seq === this.pageSeq) this.list.replaceChildren(el("p", {class: "error"}, e.message));
      return;
    }
    if (seq !== this.pageSeq) return;
    this.page = page;
    const rejected = page.which === "rejected";
    const end = page.offset + page.documents.length;
    this.pageInfo.textContent = page.total ? `${fmt(page.offset + 1)}–${fmt(end)} of ${fmt(page.total)}` : "no documents";
    this.prev.disabled = page.offset <= 0;
    this.next.disabled = end >= page.total;
    if (!page.documents.length) {
      const why = !rejected && !this.detail.kept_written
        ? "This node's kept documents were not written (they went straight into the next stage)."
        : "No documents here.";
      this.list.replaceChildren(el("p", {class: "muted", id: "doc-empty"}, why));
      return;
    }
    const head = ["#", "id", "source"].concat(rejected ? ["reason"] : []).concat(["text"]);
    this.list.replaceChildren(el("table", {id: "doc-table"},
      el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
      el("tbody", {}, page.documents.map((d) => el("tr", {class: "doc-row", "data-index": d.index, tabindex: 0,
          onclick: () => this.openDoc(d.index), onkeydown: (ev) => { if (ev.key === "Enter") this.openDoc(d.index); }},
        el("td", {class: "num"}, fmt(d.index + 1)),
        el("td", {class: "doc-id"}, snippet(d.id, 48)),
        el("td", {}, d.fields.source === undefined ? "" : cellText(d.fields.source)),
        rejected ? el("td", {class: "doc-reason"}, d.reason || "") : null,
        el("td", {class: "doc-snippet"}, snippet(d.text)))))));
  }

  async openDoc(index) {
    const seq = this.docSeq = (this.docSeq || 0) + 1;
    const stage = this.stage, params = new URLSearchParams({which: this.which, offset: index, limit: 1, max_chars: 50000});
    if (this.which === "rejected" && this.reason) params.set("reason", this.reason);
    let page;
    try {
      page = await api(`${this.base}/${encodeURIComponent(stage)}/documents?${params}`);
    } catch (e) {
      this.view.replaceChildren(el("p", {class: "error"}, e.message));
      this.view.hidden = false;
      return;
    }
    const d = page.documents[0];
    if (!d || stage !== this.stage || seq !== this.docSeq) return;
    for (const tr of this.list.querySelectorAll("tr.doc-row")) tr.classList.toggle("selected", Number(tr.dataset.index) === index);
    const thr = this.detail.thresholds || {};
    const ruleSignals = new Set(this.detail.rule_signals || []);
    const numeric = new Set(this.detail.signals || []);
    const rows = Object.entries(d.fields).map(([k, v]) => {
      const ts = thr[k] || [];
      const bad = ts.filter((t) => violates(v, t));
      const cls = [ruleSignals.has(k) ? "rule-signal" : "", bad.length ? "violates" : ""].filter(Boolean).join(" ");
      return el("tr", {"data-column": k, class: cls || null},
        el("td", {}, numeric.has(k)
          ? el("a", {href: "#", class: "to-hist", onclick: (ev) => { ev.preventDefault(); this.showColumn(k); }}, k)
          : k),
        el("td", {class: typeof v === "number" ? "num" : "cell"},
           cellText(v).length > 200 ? el("div", {class: "long"}, cellText(v)) : cellText(v)),
        el("td", {class: "muted"}, ts.map((t) => el("div", {class: t.reason === d.reason ? "reason-rule" : null},
                                                    thresholdText(t)))));
    });
    const text = d.text === null || d.text === undefined ? null : String(d.text);
    this.view.replaceChildren(...[
      el("div", {class: "doc-head"},
        el("h3", {}, `Document ${fmt(d.index + 1)} of ${fmt(page.total)}`, " ", el("code", {id: "doc-id"}, cellText(d.id))),
        el("button", {type: "button", id: "doc-close", onclick: () => { this.view.hidden = true; this.marker = null; this.drawHistogram(); }}, "Close")),
      el("p", {class: "muted"}, `shard ${d.shard}, row ${fmt(d.row)}`,
         d.reason ? el("span", {}, " · dropped: ", el("span", {class: "badge state-failed", id: "doc-reason"}, d.reason)) : " · kept"),
      el("pre", {class: "doc-text", id: "doc-text"}, text === null ? "(no text column)" : text),
      d.text_truncated ? el("p", {class: "muted"}, `Showing ${fmt(text.length)} of ${fmt(d.text_chars)} characters.`) : null,
      el("table", {id: "doc-signals"},
        el("thead", {}, el("tr", {}, ["Column", "Value", "Threshold"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows))].filter(Boolean));
    this.view.hidden = false;
    this.doc = d;
    this.updateMarker();
    this.drawHistogram();
  }

  updateMarker() {
    const d = this.doc;
    this.marker = d && !this.view.hidden && typeof d.fields[this.column] === "number"
      ? {column: this.column, value: d.fields[this.column], label: `#${d.index + 1}`} : null;
  }

  showColumn(column) {
    this.column = column;
    this.colSel.value = column;
    this.loadHistogram();
    this.histSection.scrollIntoView({block: "start"});
  }

  renderColumns() {
    const d = this.detail;
    if (!d.signals.length) {
      this.colSel.replaceChildren(el("option", {value: ""}, "(no numeric column)"));
      this.colSel.disabled = true;
      return;
    }
    const own = new Set(d.rule_signals);
    this.colSel.disabled = false;
    this.colSel.replaceChildren(...d.signals.map((c) => el("option", {value: c},
      c + (d.thresholds[c] ? "  — threshold" : own.has(c) ? "  — rule" : ""))));
    this.colSel.value = this.column;
  }

  async loadHistogram() {
    this.updateMarker();
    if (!this.column) {
      this.histSeq = (this.histSeq || 0) + 1;
      this.hist = null;
      this.chart.replaceChildren(el("p", {class: "muted"}, "This stage has no numeric signal column."));
      this.histNote.textContent = "";
      return;
    }
    const seq = this.histSeq = (this.histSeq || 0) + 1;  // only the latest request draws
    const params = new URLSearchParams({column: this.column, bins: 30});
    if (this.clip) params.set("clip", "0.01");
    try {
      const h = await api(`${this.base}/${encodeURIComponent(this.stage)}/histogram?${params}`);
      if (seq !== this.histSeq) return;
      this.hist = h;
    } catch (e) {
      if (seq === this.histSeq) this.chart.replaceChildren(el("p", {class: "error"}, e.message));
      return;
    }
    this.drawHistogram();
  }

  drawHistogram() {
    const h = this.hist;
    if (!h) return;
    this.chart.replaceChildren(signalHistogram(h, this.marker && this.marker.column === h.column ? this.marker : null));
    const parts = [`${fmt(h.rows)} rows`];
    if (h.nulls) parts.push(`${fmt(h.nulls)} without a value`);
    if (h.below) parts.push(`${fmt(h.below)} below the range`);
    if (h.above) parts.push(`${fmt(h.above)} above it`);
    if (h.min !== null) parts.push(`min ${cellText(h.min)}, max ${cellText(h.max)}`);
    parts.push(h.thresholds.length ? h.thresholds.map(thresholdText).join("; ") : "no threshold of this stage on this column");
    this.histNote.textContent = parts.join(" · ");
  }

  toSql() {
    const box = document.getElementById("sql-query");
    if (!box) return;
    let q;
    if (this.which === "rejected") {
      q = `select * from rejected where stage = ${sqlString(this.stage)}` + (this.reason ? ` and reason = ${sqlString(this.reason)}` : "");
    } else {
      q = `select * from ${sqlIdent(this.stage)}`;
    }
    box.value = q + " limit 50";
    box.scrollIntoView({block: "center"});
    box.focus();
  }
}

// Histogram of one signal: stacked kept / rejected bars, the stage's thresholds as vertical
// lines with the dropping side shaded, and optionally the opened document's value.
function signalHistogram(h, marker) {
  const width = 680, height = 250, left = 54, bottom = 34, top = 30, right = 14;
  const plotW = width - left - right, plotH = height - top - bottom;
  const bins = h.bins;
  const chart = svg("svg", {id: "chart-signal", class: "chart histogram signal", width: "100%",
                            viewBox: `0 0 ${width} ${height}`, role: "img", "data-column": h.column,
                            "aria-label": `${h.column}: histogram`, "data-items": bins.length});
  if (!bins.length) {
    chart.append(svg("text", {x: left, y: top + 20, class: "value"}, "no values"));
    return chart;
  }
  const lo = h.lo, hi = h.hi, span = hi - lo || 1;
  const xOf = (v) => left + ((v - lo) / span) * plotW;
  const max = Math.max(1, ...bins.map((b) => b.docs));
  chart.append(svg("line", {x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, class: "axis"}));
  chart.append(svg("text", {x: left - 6, y: top + 10, class: "value", "text-anchor": "end"}, fmt(max)));
  chart.append(svg("text", {x: left - 6, y: top + plotH, class: "value", "text-anchor": "end"}, "0"));
  // the dropping side of each threshold, under the bars
  const lines = h.thresholds.map((t) => {
    const off = t.value < lo ? "below" : t.value > hi ? "above" : null;
    const x = Math.max(left, Math.min(left + plotW, xOf(t.value)));
    return {t, x, off};
  });
  for (const {t, x} of lines) {
    const x0 = t.drops === "below" ? left : x, x1 = t.drops === "below" ? x : left + plotW;
    if (x1 > x0) chart.append(svg("rect", {x: x0.toFixed(1), y: top, width: (x1 - x0).toFixed(1), height: plotH, class: "drop-zone"}));
  }
  bins.forEach((b) => {
    const x = xOf(b.lo) + 1, w = Math.max(xOf(b.hi) - xOf(b.lo) - 2, 1);
    const hk = (plotH * b.kept) / max, hr = (plotH * b.rejected) / max;
    const tip = `${b.lo} – ${b.hi}: ${fmt(b.docs)} docs (${fmt(b.kept)} kept, ${fmt(b.rejected)} rejected)`;
    const k = svg("rect", {x: x.toFixed(1), y: (top + plotH - hk).toFixed(1), width: w.toFixed(1), height: hk.toFixed(1),
                           class: "bar-kept", "data-docs": b.kept});
    const r = svg("rect", {x: x.toFixed(1), y: (top + plotH - hk - hr).toFixed(1), width: w.toFixed(1), height: hr.toFixed(1),
                           class: "bar-rejected", "data-docs": b.rejected});
    k.append(svg("title", {}, tip));
    r.append(svg("title", {}, tip));
    chart.append(k, r);
  });
  const ticks = Math.min(bins.length, 6);
  for (let i = 0; i <= ticks; i++) {
    const v = lo + (span * i) / ticks;
    chart.append(svg("text", {x: (left + (plotW * i) / ticks).toFixed(1), y: height - bottom + 16, class: "value",
                              "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle"},
                     cellText(h.integer ? Math.round(v) : Number(v.toPrecision(4)))));
  }
  chart.append(svg("text", {x: left + plotW / 2, y: height - 2, class: "value", "text-anchor": "middle"}, h.column));
  lines.forEach(({t, x, off}, i) => {
    const line = svg("line", {x1: x.toFixed(1), y1: top - 4, x2: x.toFixed(1), y2: top + plotH,
                              class: "threshold" + (off ? " off-scale" : ""), "data-value": t.value, "data-param": t.param});
    line.append(svg("title", {}, thresholdText(t)));
    const right = x < left + plotW * 0.65;
    const label = `${off === "below" ? "◂ " : ""}${t.param} ${t.drops === "below" ? "<" : ">"} ${t.value}${off === "above" ? " ▸" : ""}`;
    chart.append(line, svg("text", {x: (x + (right ? 4 : -4)).toFixed(1), y: top - 8 - 12 * (i % 2), class: "threshold-label",
                                    "text-anchor": right ? "start" : "end"}, label));
  });
  if (marker && typeof marker.value === "number" && isFinite(marker.value)) {
    const x = Math.max(left, Math.min(left + plotW, xOf(marker.value)));
    const m = svg("line", {x1: x.toFixed(1), y1: top, x2: x.toFixed(1), y2: top + plotH, class: "doc-marker",
                           "data-value": marker.value});
    m.append(svg("title", {}, `document ${marker.label}: ${marker.value}`));
    chart.append(m, svg("text", {x: (x + 3).toFixed(1), y: top + 12, class: "marker-label"}, marker.label));
  }
  return chart;
}

let docBrowser = null;  // one per opened run, kept across refreshes of the run page


async function action(id, verb) {
  try {
    await api(`/runs/${encodeURIComponent(id)}/${verb}`, {method: "POST"});
  } catch (e) {
    alert(e.message);
  }
  showRun(id, true);
}

const bytesText = (n) => (n === null || n === undefined ? "–"
  : n >= 1e9 ? `${(n / 1e9).toFixed(1)} GB` : n >= 1e6 ? `${(n / 1e6).toFixed(1)} MB`
  : n >= 1e3 ? `${(n / 1e3).toFixed(1)} kB` : `${Math.round(n)} B`);

// live figures of a phase (progress.json "live"): rates over the last minute, ETA, tasks
function liveCells(lv) {
  if (!lv) return [el("td", {}), el("td", {}), el("td", {}), el("td", {})];
  const tasks = `${fmt(lv.running)} running` + (lv.failed ? `, ${fmt(lv.failed)} failed` : "");
  return [el("td", {class: "num"}, `${fmt(Math.round(lv.docs_per_s_1m))} docs/s`),
          el("td", {class: "num"}, `${bytesText(lv.bytes_per_s_1m)}/s`),
          el("td", {class: "num"}, lv.eta_s === null ? "ETA ?" : `ETA ${duration(lv.eta_s)}`),
          el("td", {class: "num"}, tasks)];
}

function stragglerTable(live) {
  const rows = Object.entries(live || {}).flatMap(([phase, lv]) =>
    (lv.stragglers || []).map((s) => ({phase, ...s})));
  if (!rows.length) return null;
  rows.sort((a, b) => b.running_s - a.running_s);
  return el("section", {class: "card", id: "stragglers"}, el("h2", {}, "Slowest running tasks"),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "phase"), el("th", {}, "task"),
                                        el("th", {}, "running"), el("th", {}, "bytes"))),
       el("tbody", {}, rows.slice(0, 10).map((s) => el("tr", {}, el("td", {}, s.phase), el("td", {}, s.task),
         el("td", {class: "num"}, duration(s.running_s)), el("td", {class: "num"}, bytesText(s.bytes)))))));
}

// shuffle phases (progress.json "partitions"): partitions done, largest / median / smallest rows
function partitionTable(partitions) {
  const rows = Object.entries(partitions || {});
  if (!rows.length) return null;
  return el("section", {class: "card", id: "partitions"}, el("h2", {}, "Shuffle partitions (rows)"),
    el("table", {}, el("thead", {}, el("tr", {}, ["phase", "done", "largest", "median", "smallest", "largest / median"]
                                                   .map((h) => el("th", {}, h)))),
       el("tbody", {}, rows.map(([phase, x]) => el("tr", {"data-phase": phase}, el("td", {}, phase),
         el("td", {class: "num"}, fmt(x.done)), el("td", {class: "num"}, fmt(x.largest)),
         el("td", {class: "num"}, fmt(Math.round(x.median))), el("td", {class: "num"}, fmt(x.smallest)),
         el("td", {class: "num"}, x.skew === null ? "–" : x.skew.toFixed(2)))))));
}

// `refinery eval` reports (RUN/STAGE/_eval_<kind>.json): the latest per stage and kind, its
// headline figures and, folded, the tables the command printed
function figureText(f) {
  const v = f.value;
  if (v === null || v === undefined) return "–";
  if (f.unit === "share") return (100 * v).toFixed(1) + "%";
  if (f.unit === "rate") return `${fmt(Math.round(v))}/s`;
  return fmt(v);
}

function evalTable(t) {
  return el("table", {class: "eval-table"},
    el("caption", {}, t.title),
    el("thead", {}, el("tr", {}, t.columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, t.rows.map((row) => el("tr", {}, row.map((v) => el("td", {}, cellText(v)))))));
}

function evalPanel(reports) {
  if (!reports || !reports.length) return null;
  const rows = reports.map((r) => el("tr", {"data-stage": r.stage, "data-kind": r.kind},
    el("td", {}, r.stage), el("td", {}, r.kind),
    el("td", {class: "eval-headline"}, r.error ? el("span", {class: "error"}, r.error)
      : (r.headline || []).map((f) => el("span", {class: "figure", "data-name": f.name},
          el("span", {class: "muted"}, `${f.name} `), figureText(f)))),
    el("td", {class: "eval-when"}, when(r.modified))));
  const details = reports.filter((r) => (r.tables || []).length).map((r) =>
    el("details", {class: "eval-detail", "data-stage": r.stage, "data-kind": r.kind},
       el("summary", {}, `${r.stage} · ${r.kind}` + (r.target ? ` (${r.target})` : "")),
       r.tables.map(evalTable)));
  return el("section", {class: "card", id: "evals"},
    el("h2", {}, "Evaluations (latest report per stage and kind)"),
    el("table", {id: "eval-table"},
       el("thead", {}, el("tr", {}, ["Stage", "Kind", "Headline", "Written"].map((h) => el("th", {}, h)))),
       el("tbody", {}, rows)),
    details);
}

async function showRun(id, keepSql) {
  let run, stats, evals, live = {}, partitions = {}, retries = 0;
  try {
    let progress;
    [run, stats, progress, evals] = await Promise.all([api(`/runs/${encodeURIComponent(id)}`),
                                      api(`/runs/${encodeURIComponent(id)}/stats`).catch(() => null),
                                      api(`/runs/${encodeURIComponent(id)}/progress`).catch(() => null),
                                      api(`/runs/${encodeURIComponent(id)}/evals`).catch(() => null)]);
    live = (progress && progress.live) || {};
    partitions = (progress && progress.partitions) || {};
    retries = (progress && progress.retries) || 0;
  } catch (e) {
    setMain(el("p", {}, el("a", {href: "#/"}, "← runs")), el("p", {class: "error"}, e.message));
    return;
  }
  if (window.location.hash !== `#/runs/${encodeURIComponent(id)}`) return;  // navigated away
  const head = el("section", {class: "card", id: "run-header"},
    el("p", {}, el("a", {href: "#/"}, "← runs")),
    el("h2", {}, `${run.name || ""} `, el("code", {}, run.id), " ", badge(run.state)),
    el("p", {}, bar(run.progress, `${(100 * run.progress).toFixed(0)}%`), " ",
       `${(100 * run.progress).toFixed(0)}% · submitted ${when(run.submitted)} · elapsed ${duration(run.elapsed_s)}`,
       run.attempt > 1 ? ` · attempt ${run.attempt}` : "",
       retries ? ` · ${fmt(retries)} storage requests retried` : ""),
    el("p", {},
       el("button", {id: "cancel-button", disabled: !ACTIVE.has(run.state), onclick: () => action(id, "cancel")}, "Cancel"),
       " ",
       el("button", {id: "resume-button", disabled: !["failed", "cancelled"].includes(run.state),
                     onclick: () => action(id, "resume")}, "Resume")),
    run.error ? el("pre", {class: "error"}, run.error) : null,
    Object.keys(run.phases || {}).length
      ? el("table", {id: "phases"}, el("tbody", {}, Object.entries(run.phases).map(([name, p]) =>
          el("tr", {}, el("td", {}, name), el("td", {}, bar(p.total ? p.done / p.total : 0)),
             el("td", {class: "num"}, `${fmt(p.done)} / ${fmt(p.total)} shards`), ...liveCells(live[name])))))
      : null);
  const parts = [head];
  const slow = stragglerTable(live);
  if (slow) parts.push(slow);
  const shuffles = partitionTable(partitions);
  if (shuffles) parts.push(shuffles);
  if (stats) {
    const stages = stats.stages;
    parts.push(el("section", {class: "card"}, el("h2", {}, "Stages"), stageTable(stages)));
    parts.push(hbarChart("chart-stages", "Documents per stage: kept and rejected",
      stages.map((s) => ({label: s.stage, parts: [{value: s.kept, cls: "bar-kept", name: "kept"},
                                                  {value: s.rejected, cls: "bar-rejected", name: "rejected"}]})),
      {legend: legend([["bar-kept", "kept"], ["bar-rejected", "rejected"]]),
       valueText: (it) => `${fmt(it.parts[0].value)} / ${fmt(it.parts[0].value + it.parts[1].value)}`}));
    parts.push(el("section", {class: "card"}, el("h2", {}, "Top drop reasons"), reasonsTable(stats.top_reasons)));
    if (stats.top_reasons.length) {
      parts.push(hbarChart("chart-reasons", "Drop reasons",
        stats.top_reasons.map((r) => ({label: `${r.reason}`, value: r.docs}))));
    }
    const o = stats.output;
    const rows = o.rows !== undefined ? o.rows : o.docs;
    const summary = `Output: ${fmt(rows)} rows` + (o.chars !== undefined ? `, ${fmt(o.chars)} characters` : "")
      + (o.tokens !== undefined ? `, ${fmt(o.tokens)} tokens` : "");
    if (o.by_source) {
      parts.push(hbarChart("chart-sources", `${summary}; rows by source`,
        Object.entries(o.by_source).map(([s, n]) => ({label: s, value: n}))));
    } else {
      parts.push(el("section", {class: "card"}, el("p", {id: "output-summary"}, summary)));
    }
    if (stats.languages) {
      parts.push(hbarChart("chart-languages", "Languages (kept documents)",
        stats.languages.map((l) => ({label: l.lang, value: l.docs}))));
    }
    if (stats.quality_histogram) {
      parts.push(histogramChart("chart-quality", "Quality score (kept documents)", stats.quality_histogram));
    }
    if (stats.tokens_by_source) {
      parts.push(hbarChart("chart-tokens", "Tokens per source",
        Object.entries(stats.tokens_by_source).map(([s, n]) => ({label: s, value: n}))));
    }
  }
  const evalSection = evalPanel(evals);
  if (evalSection) parts.push(evalSection);
  if (run.state !== "queued") {  // a queued run has no run directory to browse yet
    if (!docBrowser || docBrowser.runId !== id || !keepSql) docBrowser = new DocBrowser(id);
    else if (ACTIVE.has(run.state)) docBrowser.init();  // counts grow as shards commit
    parts.push(docBrowser.section, docBrowser.histSection);
  }
  const existingSql = keepSql ? document.getElementById("sql-form") : null;
  parts.push(existingSql || sqlBox(id));
  if (run.log_tail) parts.push(el("details", {class: "card"}, el("summary", {}, "Run log (tail)"), el("pre", {}, run.log_tail)));
  setMain(...parts);
  if (ACTIVE.has(run.state)) schedule(() => showRun(id, true), 2000);
}

// ---------------------------------------------------------------------------------------------
// routing

function route() {
  clearTimeout(timer);
  const m = window.location.hash.match(/^#\/runs\/([^/]+)$/);
  if (m) showRun(decodeURIComponent(m[1]), false);
  else showRuns();
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", route);
