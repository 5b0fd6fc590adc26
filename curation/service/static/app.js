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
      el("td", {}, s.stage), el("td", {}, s.type), el("td", {class: "num"}, fmt(s.shards)),
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

async function action(id, verb) {
  try {
    await api(`/runs/${encodeURIComponent(id)}/${verb}`, {method: "POST"});
  } catch (e) {
    alert(e.message);
  }
  showRun(id, true);
}

async function showRun(id, keepSql) {
  let run, stats;
  try {
    [run, stats] = await Promise.all([api(`/runs/${encodeURIComponent(id)}`),
                                      api(`/runs/${encodeURIComponent(id)}/stats`).catch(() => null)]);
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
       run.attempt > 1 ? ` · attempt ${run.attempt}` : ""),
    el("p", {},
       el("button", {id: "cancel-button", disabled: !ACTIVE.has(run.state), onclick: () => action(id, "cancel")}, "Cancel"),
       " ",
       el("button", {id: "resume-button", disabled: !["failed", "cancelled"].includes(run.state),
                     onclick: () => action(id, "resume")}, "Resume")),
    run.error ? el("pre", {class: "error"}, run.error) : null,
    Object.keys(run.phases || {}).length
      ? el("table", {id: "phases"}, el("tbody", {}, Object.entries(run.phases).map(([name, p]) =>
          el("tr", {}, el("td", {}, name), el("td", {}, bar(p.total ? p.done / p.total : 0)),
             el("td", {class: "num"}, `${fmt(p.done)} / ${fmt(p.total)} shards`)))))
      : null);
  const parts = [head];
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
