// InstantML dashboard: runs list, run page, and the Distributed tab.
// Untrusted text (metric keys, run names, config) only ever reaches the page through
// textContent, or, for chart labels, through esc() (plotly reads a few HTML tags).
"use strict";

const KEY_STORE = "instantml-api-key";
const REFRESH_MS = 5000;
const NONFINITE_COLOUR = "#e11d48";  // not in Viridis: a NaN cell never reads as a value
const main = document.getElementById("main");
let refreshTimer = null;
const plotlyReady = new Promise((resolve, reject) => {
  if (window.Plotly) return resolve();
  const script = document.getElementById("plotly-js");
  script.addEventListener("load", () => resolve());
  script.addEventListener("error", () => reject(new Error("could not load plotly.js")));
});
let renderToken = 0;

// ---------- helpers ----------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function esc(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) >= 1e5 || (Math.abs(value) < 1e-3 && value !== 0)) return value.toExponential(digits - 1);
  const text = value.toPrecision(digits);
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;  // 4080, not 408
}

function apiKey() { return localStorage.getItem(KEY_STORE); }

class AuthError extends Error {}

async function api(path) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${apiKey()}` } });
  if (response.status === 401) throw new AuthError("invalid API key");
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function parseHash() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query) };
}

function setHash(parts, params) {
  const query = params && [...params].length ? `?${params}` : "";
  const hash = `#/${parts.map(encodeURIComponent).join("/")}${query}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

function crumbs(...items) {
  const box = document.getElementById("crumbs");
  box.replaceChildren();
  items.forEach((item, i) => {
    if (i) box.append(" / ");
    box.append(item.href ? el("a", { href: item.href, text: item.text }) : el("span", { text: item.text }));
  });
}

function isLive(run) {
  return run.status === "running" && Date.now() / 1000 - run.updated_at < 120;
}

function statusText(run) {
  const lost = (run.ranks_lost || []).length;
  return lost ? `${run.status}, ${lost} rank${lost > 1 ? "s" : ""} lost` : run.status;
}

function statusBadge(run) {
  const lost = (run.ranks_lost || []);
  const title = lost.map((r) => `rank ${r.rank} last logged step ${r.last_step}`).join("; ");
  const wrap = el("span", {}, el("span", { class: `status ${run.status}${lost.length ? " lost" : ""}`, text: statusText(run), title }));
  if (isLive(run)) wrap.append(" ", el("span", { class: "live", text: "● live" }));
  return wrap;
}

// Plotly's tips ("Double-click to zoom back out") stay on the page once shown: off.
const PLOTLY_CONFIG = { displaylogo: false, responsive: true, showTips: false };

// A table that may be wider than its card scrolls inside it, never the page.
function tableWrap(t) {
  return el("div", { class: "table-wrap" }, t);
}

// A card's rows cut at its height say so, and that they scroll.
function scrollBox(t, short = false) {
  const box = el("div", { class: short ? "scroll short" : "scroll" }, t);
  const hint = el("p", { class: "muted scroll-hint", text: "more rows: scroll the table" });
  hint.hidden = true;
  requestAnimationFrame(() => { hint.hidden = box.scrollHeight <= box.clientHeight + 1; });
  return el("div", {}, box, hint);
}

function table(columns, rows, { sortable = false, id } = {}) {
  const head = el("tr");
  const body = el("tbody");
  const t = el("table", id ? { id } : {}, el("thead", {}, head), body);
  let order = { index: -1, dir: 1 };
  const draw = () => {
    const sorted = [...rows];
    if (order.index >= 0) {
      const get = columns[order.index].value;
      sorted.sort((a, b) => {
        const x = get(a), y = get(b);
        return (x === y ? 0 : x === null ? 1 : y === null ? -1 : x < y ? -1 : 1) * order.dir;
      });
    }
    body.replaceChildren(...sorted.map((row) => el("tr", {}, ...columns.map((c) => {
      const content = c.render ? c.render(row) : fmt(c.value(row));
      return el("td", { class: c.num ? "num" : "" }, content instanceof Node ? content : String(content));
    }))));
  };
  columns.forEach((c, index) => {
    const th = el("th", { class: `${c.num ? "num" : ""} ${sortable ? "sortable" : ""}`, text: c.title });
    if (sortable) th.addEventListener("click", () => {
      order = { index, dir: order.index === index ? -order.dir : 1 };
      head.querySelectorAll("th").forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
      th.classList.add(order.dir > 0 ? "sorted-asc" : "sorted-desc");
      draw();
    });
    head.append(th);
  });
  draw();
  return t;
}

// ---------- login ----------

function showLogin(message = "") {
  crumbs();
  document.getElementById("logout").hidden = true;
  main.replaceChildren(document.getElementById("login-template").content.cloneNode(true));
  document.getElementById("login-error").textContent = message;
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(KEY_STORE, document.getElementById("key").value.trim());
    route();
  });
}

// ---------- runs list ----------

async function showRuns(params) {
  crumbs({ text: "Runs" });
  const project = params.get("project") || "";
  const [all, shown] = await Promise.all([
    api("/api/runs?limit=1000"),
    api(`/api/runs?limit=1000${project ? `&project=${encodeURIComponent(project)}` : ""}`),
  ]);
  const projects = [...new Set(all.runs.map((r) => r.project))].sort();
  const select = el("select", { id: "project-filter" }, el("option", { value: "", text: "all projects" }),
    ...projects.map((p) => el("option", { value: p, text: p })));
  select.value = project;
  select.addEventListener("change", () => {
    location.hash = select.value ? `#/runs?project=${encodeURIComponent(select.value)}` : "#/runs";
  });
  // Runs ticked here open side by side in the compare view.
  const picked = new Set();
  const compareButton = el("button", { id: "compare", text: "Compare selected", disabled: "" });
  compareButton.addEventListener("click", () => {
    location.hash = `#/compare?${new URLSearchParams({ runs: [...picked].join(",") })}`;
  });
  const pick = (r) => {
    const box = el("input", { type: "checkbox", class: "pick", "data-run": r.id, "aria-label": `compare ${r.id}` });
    box.addEventListener("change", () => {
      if (box.checked) picked.add(r.id); else picked.delete(r.id);
      compareButton.disabled = picked.size < 2 || picked.size > 8;
    });
    return box;
  };
  const runs = table([
    { title: "", value: () => 0, render: pick },
    { title: "name", value: (r) => r.name || r.id,
      render: (r) => el("a", { href: `#/runs/${encodeURIComponent(r.id)}`, class: "run-link", text: r.name || r.id }) },
    { title: "project", value: (r) => r.project },
    { title: "status", value: (r) => r.status, render: statusBadge },
    { title: "health", value: (r) => HEALTH_ORDER[r.health] ?? 0, render: healthBadge },
    { title: "world size", value: (r) => r.world_size, num: true },
    { title: "last step", value: (r) => r.last_step, num: true },
    // What the run cost against the monthly limit, grouped by thousands.
    { title: "points", value: (r) => r.points, num: true,
      render: (r) => el("span", { class: "points", text: (r.points ?? 0).toLocaleString("en-US") }) },
    { title: "created", value: (r) => r.created_at, render: (r) => new Date(r.created_at * 1000).toLocaleString() },
    // The id beside a name; a run without one is shown by its id once, in "name".
    { title: "id", value: (r) => r.id, render: (r) => (r.name ? el("code", { text: r.id }) : "") },
  ], shown.runs, { sortable: true, id: "runs" });
  main.replaceChildren(el("div", { class: "card" },
    el("div", { class: "toolbar" }, el("h3", { text: `Runs (${shown.runs.length})` }), select, compareButton), tableWrap(runs)));
  main.dataset.ready = "runs";
}

// ---------- run health ----------

const HEALTH_ORDER = { ok: 0, warning: 1, critical: 2 };

function healthBadge(run) {
  const state = run.health || "ok";
  return el("span", { class: `health ${state}`, "data-health": state, text: state });
}

// Open alerts as a banner: each names its rank and step, and links to the Distributed tab
// at that step (with its key, when the alert has one).
function healthBanner(run, health) {
  const open = health.alerts.filter((a) => !a.resolved);
  if (!open.length) return null;
  const base = `#/runs/${encodeURIComponent(run.id)}/distributed`;
  const items = open.map((a) => {
    const params = new URLSearchParams();
    if (a.key) params.set("key", a.key);
    params.set("step_min", String(Math.max(0, a.since_step - 50)));
    params.set("step_max", String(a.since_step + 50));
    return el("li", { class: "alert", "data-kind": a.kind },
      el("b", { text: a.kind.replace("_", " ") }), " · ",
      el("a", { href: `${base}?${params}`, class: "alert-link",
        // A node's alert names the node (in its message); any other, its rank.
        text: `${a.kind === "node_missing" ? a.message.split(" is missing")[0] : `rank ${a.rank}`}${a.key ? ` · ${a.key}` : ""} · step ${a.since_step}` }),
      el("span", { class: "muted", text: ` — ${a.message}` }));
  });
  return el("div", { class: `card banner ${health.status}`, id: "health-banner" },
    el("h3", { text: `Run health: ${health.status} (${open.length} open alert${open.length > 1 ? "s" : ""})` }),
    el("ul", {}, ...items));
}

// ---------- run page ----------

async function showRun(runId, tab, params) {
  const [{ run }, { keys }, health] = await Promise.all([
    api(`/runs/${encodeURIComponent(runId)}`), api(`/api/runs/${encodeURIComponent(runId)}/keys`),
    api(`/api/runs/${encodeURIComponent(runId)}/health`),
  ]);
  crumbs({ text: "Runs", href: "#/runs" }, { text: run.project }, { text: run.name || run.id });
  const rankKeys = keys.filter((k) => k.kind === "rank").map((k) => k.key);
  const scalarKeys = keys.filter((k) => k.kind === "scalar").map((k) => k.key);
  const base = `#/runs/${encodeURIComponent(runId)}`;
  const tabs = el("nav", { class: "tabs" },
    el("a", { href: base, class: tab === "overview" ? "active" : "", text: "Overview" }),
    el("a", { href: `${base}/distributed`, id: "tab-distributed", class: tab === "distributed" ? "active" : "", text: "Distributed" }));
  const head = el("div", { class: "card" },
    el("h2", { text: run.name || run.id }),
    el("div", {}, statusBadge(run), " ", healthBadge(run), ` · project `, el("b", { text: run.project }), ` · id `, el("code", { text: run.id }),
      ` · world size ${fmt(run.world_size)} · last step ${fmt(run.last_step)}`));
  const body = el("div");
  const banner = healthBanner(run, health);
  main.replaceChildren(...(banner ? [head, banner] : [head]), tabs, body);
  if (tab === "distributed") await showDistributed(run, rankKeys, params, body);
  else await showOverview(run, scalarKeys, body);
  if (run.status === "running") {
    refreshTimer = setTimeout(() => route({ refresh: true }), REFRESH_MS);
  }
}

// The public SDK's async uploader reports its own health as scalars at step = unix time.
const HEALTH_PREFIX = "system/instantml/";
const HEALTH_ROWS = [
  ["upload_lag_seconds", "lag (oldest queued event)", (v) => `${fmt(v)} s`],
  ["queued_events", "queued", fmt],
  ["processed_events", "sent", fmt],
  ["failed_events", "failed", fmt],
  ["dropped_events", "dropped", fmt],
];
const LAG_WARN_SECONDS = 60;
const CONSOLE_LINES = 500;  // the run page shows the last lines; the API gives more

// One scalar key: its finite points as [step, value] and its non-finite marks as
// [step, "nan" | "inf" | "-inf"] (the API gives [step, value or mark, timestamp] rows).
async function scalarSeries(run, k) {
  const s = await api(`/api/runs/${encodeURIComponent(run.id)}/metrics?key=${encodeURIComponent(k)}`);
  const points = s.points.filter((p) => typeof p[1] === "number").map((p) => [p[0], p[1]]);
  const nonfinite = s.points.filter((p) => typeof p[1] === "string").map((p) => [p[0], p[1]]);
  return { key: s.key, points, nonfinite };
}

async function showOverview(run, scalarKeys, body) {
  body.append(el("div", { class: "card" }, el("h3", { text: "Config" }), el("pre", { id: "config", text: JSON.stringify(run.config, null, 2) })));
  const healthKeys = scalarKeys.filter((k) => k.startsWith(HEALTH_PREFIX));
  scalarKeys = scalarKeys.filter((k) => !k.startsWith(HEALTH_PREFIX));
  if (healthKeys.length) body.append(await uploadHealth(run, healthKeys));
  const charts = el("div", { class: "grid2" });
  body.append(charts);
  const series = await Promise.all(scalarKeys.map((k) => scalarSeries(run, k)));
  await plotlyReady;
  // A scalar logged once (a run's total_flos, train_runtime...) is a value, not a chart.
  const single = series.filter((s) => s.points.length + s.nonfinite.length === 1);
  if (single.length) {
    const values = table([
      { title: "key", value: (s) => s.key },
      { title: "value", value: (s) => (s.points.length ? s.points[0][1] : s.nonfinite[0][1]), num: true },
      { title: "step", value: (s) => (s.points.length ? s.points[0][0] : s.nonfinite[0][0]), num: true },
    ], single, { id: "single-values" });
    body.insertBefore(el("div", { class: "card" }, el("h3", { text: "Values logged once" }), tableWrap(values)), charts);
  }
  series.filter((s) => !single.includes(s)).forEach((s) => {
    const div = el("div", { class: "chart" });
    const marks = s.nonfinite.length
      ? el("p", { class: "callout-text", text: `Non-finite at ${s.nonfinite.length} step(s), first at step ${s.nonfinite[0][0]} (${s.nonfinite[0][1]})` })
      : "";
    charts.append(el("div", { class: "card" }, el("h3", { text: s.key }), marks, div));
    Plotly.newPlot(div, [{ x: s.points.map((p) => p[0]), y: s.points.map((p) => p[1]), mode: "lines", name: "value" }],
      { margin: { t: 10, r: 10, b: 30, l: 60 }, xaxis: { title: { text: "step" } }, yaxis: { exponentformat: "e" } },
      PLOTLY_CONFIG);
  });
  if (!scalarKeys.length) charts.append(el("p", { class: "muted", text: "No run-level scalars; see the Distributed tab." }));
  const logs = await api(`/api/runs/${encodeURIComponent(run.id)}/logs?limit=${CONSOLE_LINES}`);
  if (logs.total) {
    const shown = logs.total > logs.lines.length ? `last ${logs.lines.length} of ${logs.total} lines` : `${logs.total} lines`;
    body.append(el("div", { class: "card", id: "console" },
      el("h3", { text: "Console" }), el("p", { class: "muted", text: shown }),
      el("pre", { class: "console" }, ...logs.lines.map((line) =>
        el("div", { class: line.stream === "stderr" ? "stderr" : "stdout", text: line.message })))));
  }
  main.dataset.ready = "overview";
}

// A small panel: the uploader's latest health report, and a warning when it falls behind.
async function uploadHealth(run, healthKeys) {
  const series = await Promise.all(healthKeys.map((k) => scalarSeries(run, k)));
  const latest = {};
  let at = null;
  series.forEach((s) => {
    const last = s.points[s.points.length - 1];
    if (!last) return;
    latest[s.key.slice(HEALTH_PREFIX.length)] = last[1];
    at = at === null ? last[0] : Math.max(at, last[0]);
  });
  const rows = HEALTH_ROWS.filter(([name]) => name in latest).map(([name, label, show]) =>
    el("tr", { "data-health": name }, el("td", { text: label }), el("td", { class: "num", text: show(latest[name]) })));
  const problems = [];
  if (latest.failed_events > 0) problems.push(`${fmt(latest.failed_events)} event(s) failed to upload`);
  if (latest.dropped_events > 0) problems.push(`${fmt(latest.dropped_events)} event(s) dropped`);
  if (latest.upload_lag_seconds > LAG_WARN_SECONDS) problems.push(`uploads are ${fmt(latest.upload_lag_seconds)} s behind`);
  const when = at === null ? "" : ` · last report ${new Date(at * 1000).toISOString().replace("T", " ").slice(0, 19)} UTC`;
  return el("div", { class: "card", id: "upload-health" },
    el("h3", { text: "Uploads" }),
    el("p", { class: "muted", text: `the SDK's uploader, as it reported itself${when}` }),
    problems.length ? el("p", { class: "callout-text", id: "upload-problems", text: problems.join("; ") }) : "",
    el("table", { class: "compact", style: "width:auto;min-width:24em" }, el("tbody", {}, ...rows)));
}

// ---------- the Distributed tab ----------

async function showDistributed(run, rankKeys, params, body) {
  if (!rankKeys.length) {
    body.append(el("p", { class: "muted", text: "This run has no per-rank metrics yet." }));
    main.dataset.ready = "distributed";
    return;
  }
  // No key asked for (or one the run lacks): the server's default, a loss-like key.
  const asked = rankKeys.includes(params.get("key")) ? params.get("key") : null;
  const lo = params.get("step_min"), hi = params.get("step_max");
  // Heatmap rows grouped by node (by rank when no rank said its node).
  const query = new URLSearchParams({ max_points: "500", heatmap_steps: "200", order: "node" });
  if (asked !== null) query.set("key", asked);
  if (lo !== null) query.set("step_min", lo);
  if (hi !== null) query.set("step_max", hi);
  // Straggler scores of a timing key: the selected one if it is one, else perf/forward_ms.
  const timingKey = asked !== null && /^perf\/.*_ms$/.test(asked) ? asked : rankKeys.includes("perf/forward_ms") ? "perf/forward_ms" : null;
  const [s, strag] = await Promise.all([
    api(`/api/runs/${encodeURIComponent(run.id)}/distributed?${query}`),
    timingKey ? api(`/api/runs/${encodeURIComponent(run.id)}/stragglers?${new URLSearchParams(hi !== null ? { key: timingKey, step_max: hi } : { key: timingKey })}`) : null,
  ]);
  const key = s.key;
  const hashParams = new URLSearchParams({ key });
  if (lo !== null) hashParams.set("step_min", lo);
  if (hi !== null) hashParams.set("step_max", hi);
  setHash(["runs", run.id, "distributed"], hashParams);

  const select = el("select", { id: "key-select" }, ...rankKeys.map((k) => el("option", { value: k, text: k })));
  select.value = key;
  const go = (p) => { location.hash = `#/runs/${encodeURIComponent(run.id)}/distributed?${p}`; };
  select.addEventListener("change", () => go(new URLSearchParams({ key: select.value })));
  const reset = el("button", { id: "reset-zoom", text: "Show all steps" });
  reset.hidden = lo === null && hi === null;
  reset.addEventListener("click", () => go(new URLSearchParams({ key })));
  const range = s.step_range ? `steps ${s.step_range[0]}–${s.step_range[1]}` : "no steps in range";
  body.append(el("div", { class: "toolbar" }, el("label", { text: "metric " }, select), reset,
    el("span", { class: "muted", id: "range", text: `${range} · world size ${s.world_size}` +
      (s.bucket_size > 1 ? ` · ${s.bucket_size} steps per point (drag on a chart to zoom)` : " · drag on a chart to zoom") })));

  if (s.first_nonfinite) {
    const f = s.first_nonfinite;
    const look = el("a", { href: "#", text: "zoom there" });
    look.addEventListener("click", (event) => {
      event.preventDefault();
      go(new URLSearchParams({ key, step_min: String(Math.max(0, f.step - 10)), step_max: String(f.step + 10) }));
    });
    body.append(el("div", { class: "card callout", id: "first-nonfinite" },
      el("b", { text: `First non-finite value: rank ${f.rank} at step ${f.step} (${f.value}).` }),
      ` ${s.steps.reduce((n, p) => n + (p.nonfinite_total ?? p.nonfinite), 0)} non-finite values in this range; they are left out of every reducer and shown in red in the heatmap. `, look));
  }
  const band = el("div", { class: "chart tall", id: "band" });
  const coverage = el("div", { class: "chart", id: "coverage" });
  const heat = el("div", { class: "chart tall", id: "heatmap" });
  const missing = el("ul", { class: "missing", id: "missing" });
  const cov = s.coverage;
  body.append(
    el("div", { class: "card" }, el("h3", { text: "Across ranks: min · p05 · p50 · p95 · max, mean and weighted mean" }), band),
    el("div", { class: "grid2" },
      el("div", { class: "card" }, el("h3", { text: `Coverage: ${cov.full_steps} full, ${cov.partial_steps} partial steps` }), coverage, missing),
      el("div", { class: "card" }, el("h3", { text: "Ranks × steps" }), heat)));
  if (cov.missing.length) {
    for (const m of cov.missing) {
      missing.append(el("li", {}, el("span", { class: "rank", text: `rank ${m.rank}` }),
        m.last_seen_step === null ? ` never reported (missing from step ${m.first_missing_step})`
          : ` last seen at step ${m.last_seen_step}, missing from step ${m.first_missing_step}`));
    }
  } else if (!(cov.lagging || []).length) {
    missing.append(el("li", { class: "muted", text: "Every rank reported the last step." }));
  }
  for (const g of cov.lagging || []) {  // live: behind, but sending
    missing.append(el("li", { class: "lagging" }, el("span", { class: "rank", text: `rank ${g.rank}` }),
      ` behind at step ${g.last_step}, still sending (uploads lag)`));
  }

  if ((s.nodes || []).length) body.append(nodeCard(s.nodes, strag));
  if (strag) body.append(stragglerCard(strag));

  const outliers = table([
    { title: "step", value: (o) => o.step, num: true }, { title: "rank", value: (o) => o.rank, num: true },
    { title: "local rank", value: (o) => o.local_rank, num: true }, { title: "value", value: (o) => o.value, num: true },
    { title: "step mean", value: (o) => o.mean, num: true }, { title: "delta", value: (o) => o.delta, num: true },
    { title: "z", value: (o) => o.z, num: true }, { title: "robust z", value: (o) => o.robust_z, num: true },
  ], s.outliers, { sortable: true, id: "outliers" });
  const ranks = table([
    { title: "rank", value: (r) => r.rank, num: true }, { title: "node", value: (r) => r.node ?? "" },
    { title: "local rank", value: (r) => r.local_rank, num: true },
    { title: "steps", value: (r) => r.steps_reported, num: true }, { title: "last step", value: (r) => r.last_step, num: true },
    { title: "mean delta", value: (r) => r.mean_delta, num: true }, { title: "mean |z|", value: (r) => r.mean_abs_z, num: true },
    { title: "outlier steps", value: (r) => r.outlier_steps, num: true },
    { title: "non-finite steps", value: (r) => r.nonfinite_steps, num: true },
  ], s.ranks, { sortable: true, id: "ranks" });
  const shown = s.outliers.length < s.outliers_total ? `${s.outliers.length} of ${s.outliers_total}` : `${s.outliers_total}`;
  body.append(el("div", { class: "grid2" },
    el("div", { class: "card" }, el("h3", { id: "outliers-title", text: `Outliers (${shown}; |z| ≥ 3 or |robust z| ≥ 3.5)` }), scrollBox(outliers)),
    el("div", { class: "card" }, el("h3", { text: "Per rank (noisiest first)" }), scrollBox(ranks))));

  const x = s.steps.map((p) => p.step);
  const col = (name) => s.steps.map((p) => p[name]);
  const layout = (extra) => ({ margin: { t: 10, r: 10, b: 35, l: 55 }, xaxis: { title: { text: "step" } },
    legend: { orientation: "h" }, ...extra });
  const config = PLOTLY_CONFIG;
  const bandTraces = [
    { x, y: col("max"), mode: "lines", line: { width: 0 }, name: "max", hoverinfo: "skip", showlegend: false },
    { x, y: col("min"), mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(37,99,235,0.12)", name: "min–max" },
    { x, y: col("p95"), mode: "lines", line: { width: 0 }, name: "p95", showlegend: false },
    { x, y: col("p05"), mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(37,99,235,0.3)", name: "p05–p95" },
    { x, y: col("p50"), mode: "lines", line: { color: "#1e3a8a", width: 1 }, name: "p50" },
    { x, y: col("mean"), mode: "lines", line: { color: "#f97316", width: 2 }, name: "mean" },
    { x, y: col("weighted_mean"), mode: "lines", line: { color: "#16a34a", width: 2, dash: "dash" }, name: "weighted mean" },
  ];
  const covTrace = { x, y: s.steps.map((p) => (p.count + p.nonfinite) / p.expected), type: "scatter", mode: "lines", fill: "tozeroy",
    name: "reported / expected",
    customdata: s.steps.map((p) => `${p.count + p.nonfinite} of ${p.expected}` + (p.nonfinite ? ` (${p.nonfinite} non-finite)` : "")),
    hovertemplate: "step %{x}: %{customdata}<extra></extra>" };
  const buckets = s.heatmap.buckets;
  // A row's label: its rank, after its node's name when ranks said theirs.
  const rowNodes = s.heatmap.nodes || [];
  const rowLabels = s.heatmap.ranks.map((r, i) => (rowNodes[i] ? `${rowNodes[i]} · ${r}` : String(r)));
  // Bucketed, a column spans its bucket: cell edges at the multiples of the bucket size
  // from step 0 that the buckets are aligned to, the first and last clipped to the range.
  const hs = s.heatmap.bucket_size || 1;
  const heatX = hs > 1 && buckets.length
    ? [buckets[0][0], ...buckets.slice(1).map((b) => Math.floor(b[0] / hs) * hs), buckets[buckets.length - 1][1] + 1]
    : buckets.map((b) => b[0]);
  const heatTrace = { type: "heatmap", z: s.heatmap.values, x: heatX, y: rowLabels,
    customdata: s.heatmap.ranks.map(() => buckets.map((b) => (b[0] === b[1] ? `${b[0]}` : `${b[0]}–${b[1]}`))),
    hovertemplate: "rank %{y}<br>steps %{customdata}<br>value %{z}<extra></extra>", colorscale: "Viridis",
    hoverongaps: false };
  // Cells where a rank sent NaN or +-inf: a second layer in one colour that no value has.
  const marked = s.heatmap.ranks.map(() => buckets.map(() => null));
  for (const [i, j] of s.heatmap.nonfinite) marked[i][j] = 1;
  const nonfiniteTrace = { type: "heatmap", z: marked, x: heatTrace.x, y: heatTrace.y, name: "non-finite",
    customdata: heatTrace.customdata, colorscale: [[0, NONFINITE_COLOUR], [1, NONFINITE_COLOUR]], showscale: false,
    hovertemplate: "rank %{y}<br>steps %{customdata}<br>NaN or ±inf<extra></extra>", hoverongaps: false };
  await plotlyReady;
  await Promise.all([
    Plotly.newPlot(band, bandTraces, layout({ yaxis: { title: { text: esc(key) } } }), config),
    Plotly.newPlot(coverage, [covTrace], layout({ yaxis: { range: [0, 1.05], tickformat: ".0%" }, showlegend: false }), config),
    Plotly.newPlot(heat, s.heatmap.nonfinite.length ? [heatTrace, nonfiniteTrace] : [heatTrace],
      layout({ yaxis: { title: { text: rowNodes.some((n) => n) ? "" : "rank" }, type: "category" },
        margin: { t: 10, r: 10, b: 35, l: Math.min(220, 20 + 7 * Math.max(2, ...rowLabels.map((t) => t.length))) } }), config),
  ]);
  for (const chart of [band, coverage, heat]) {
    chart.on("plotly_relayout", (event) => {
      const a = event["xaxis.range[0]"], b = event["xaxis.range[1]"];
      if (a === undefined || b === undefined) return;
      const zoom = new URLSearchParams({ key, step_min: String(Math.max(0, Math.floor(a))), step_max: String(Math.ceil(b)) });
      go(zoom);
    });
  }
  main.dataset.key = key;
  main.dataset.ready = "distributed";
}

// Ranks grouped by the host they run on: a dead or slow node is one row, not eight.
function nodeCard(nodes, strag) {
  const scores = Object.fromEntries(((strag && strag.nodes) || []).map((n) => [n.node, n]));
  const rows = table([
    { title: "node", value: (n) => n.node ?? "(none said)" },
    { title: "ranks", value: (n) => n.ranks.length, render: (n) => rankRanges(n.ranks), num: true },
    { title: "missing", value: (n) => n.missing_ranks.length,
      render: (n) => el("span", { class: n.missing_ranks.length ? "bad" : "", text: n.missing_ranks.length ? rankRanges(n.missing_ranks) : "–" }), num: true },
    { title: "mean delta", value: (n) => n.mean_delta, num: true },
    { title: "mean |z|", value: (n) => n.mean_abs_z, num: true },
    { title: "outlier steps", value: (n) => n.outlier_steps, num: true },
    { title: "straggler score", value: (n) => scores[n.node]?.score ?? null, num: true,
      render: (n) => { const sc = scores[n.node]; return el("span", { class: sc?.straggler ? "bad" : "", text: sc ? fmt(sc.score, 3) : "–" }); } },
  ], nodes, { sortable: true, id: "nodes" });
  return el("div", { class: "card" }, el("h3", { text: `Nodes (${nodes.length})` }), scrollBox(rows, true));
}

function rankRanges(ranks) {
  const parts = [];
  for (const r of ranks) {
    const last = parts[parts.length - 1];
    if (last && last[1] === r - 1) last[1] = r; else parts.push([r, r]);
  }
  return parts.map(([a, b]) => (a === b ? `${a}` : `${a}–${b}`)).join(", ");
}

function stragglerCard(strag) {
  const flagged = strag.ranks.filter((r) => r.straggler);
  const verdict = flagged.length
    ? flagged.map((r) => `rank ${r.rank} is ${(1 / r.score).toFixed(2)}× the fastest rank's median`).join("; ")
    : "no straggler";
  const rows = table([
    { title: "rank", value: (r) => r.rank, num: true },
    { title: "node", value: (r) => r.node ?? "" },
    { title: "median ms", value: (r) => r.median, num: true },
    { title: "score", value: (r) => r.score, num: true,
      render: (r) => el("span", { class: r.straggler ? "bad" : "", text: fmt(r.score, 3) }) },
    { title: "steps", value: (r) => r.steps, num: true },
  ], strag.ranks, { sortable: true, id: "stragglers" });
  const span = strag.step_range ? `steps ${strag.step_range[0]}–${strag.step_range[1]}` : "no steps";
  return el("div", { class: "card" },
    el("h3", { text: `Stragglers on ${strag.key} (last ${strag.window} steps, ${span}; score = fastest median / rank's median, below ${strag.threshold} flagged)` }),
    el("p", { id: "straggler-verdict", class: flagged.length ? "callout-text" : "muted", text: verdict }),
    scrollBox(rows, true));
}

// ---------- runs side by side ----------

const RUN_COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

async function showCompare(params) {
  crumbs({ text: "Runs", href: "#/runs" }, { text: "Compare" });
  const ids = (params.get("runs") || "").split(",").filter(Boolean);
  const query = new URLSearchParams({ runs: ids.join(","), max_points: "500" });
  if (params.get("key")) query.set("key", params.get("key"));
  const [c, ...keyLists] = await Promise.all([
    api(`/api/compare?${query}`),
    ...ids.map((id) => api(`/api/runs/${encodeURIComponent(id)}/keys`)),
  ]);
  // The rank keys every run has: the ones they can be compared on.
  const shared = keyLists.map((k) => new Set(k.keys.filter((x) => x.kind === "rank").map((x) => x.key)))
    .reduce((a, b) => new Set([...a].filter((x) => b.has(x))));
  const select = el("select", { id: "compare-key" }, ...[...shared].sort().map((k) => el("option", { value: k, text: k })));
  select.value = c.key;
  select.addEventListener("change", () => {
    location.hash = `#/compare?${new URLSearchParams({ runs: ids.join(","), key: select.value })}`;
  });
  const band = el("div", { class: "chart tall", id: "compare-band" });
  main.replaceChildren(
    el("div", { class: "toolbar" }, el("label", { text: "metric " }, select),
      el("span", { class: "muted", text: `${c.runs.length} runs` })),
    el("div", { class: "card" }, el("h3", { text: "Across ranks: mean and p05–p95 of each run" }), band));
  const side = el("div", { class: "compare-grid", id: "compare-runs", style: `display:grid;grid-template-columns:repeat(${c.runs.length}, minmax(0, 1fr));gap:12px` });
  c.runs.forEach((r, i) => {
    const ranks = table([
      { title: "rank", value: (x) => x.rank, num: true }, { title: "node", value: (x) => x.node ?? "" },
      { title: "mean delta", value: (x) => x.mean_delta, num: true }, { title: "mean |z|", value: (x) => x.mean_abs_z, num: true },
      { title: "outlier steps", value: (x) => x.outlier_steps, num: true }, { title: "last step", value: (x) => x.last_step, num: true },
    ], r.ranks, { sortable: true, id: `ranks-${i}` });
    const card = el("div", { class: "card", "data-run": r.run.id },
      el("h3", {}, el("span", { style: `color:${RUN_COLOURS[i % RUN_COLOURS.length]}`, text: "■ " }),
        el("a", { href: `#/runs/${encodeURIComponent(r.run.id)}/distributed?${new URLSearchParams({ key: c.key })}`, text: r.run.name || r.run.id })),
      el("p", { class: "muted", text: `world size ${r.world_size} · ${r.coverage.full_steps} full steps · ${r.coverage.missing.length} missing` +
        (r.last ? ` · last mean ${fmt(r.last.mean)}` : "") }));
    if (r.nodes.length) card.append(nodeCard(r.nodes, r.stragglers));
    if (r.stragglers) card.append(stragglerCard(r.stragglers));
    card.append(el("h4", { text: "Per rank (noisiest first)" }), scrollBox(ranks, true));
    side.append(card);
  });
  main.append(side);
  const traces = [];
  c.runs.forEach((r, i) => {
    const colour = RUN_COLOURS[i % RUN_COLOURS.length];
    const x = r.steps.map((p) => p.step);
    const name = r.run.name || r.run.id;
    traces.push(
      { x, y: r.steps.map((p) => p.p95), mode: "lines", line: { width: 0, color: colour }, hoverinfo: "skip", showlegend: false, legendgroup: name },
      { x, y: r.steps.map((p) => p.p05), mode: "lines", line: { width: 0, color: colour }, fill: "tonexty", opacity: 0.2, name: `${name} p05–p95`, legendgroup: name },
      { x, y: r.steps.map((p) => p.mean), mode: "lines", line: { width: 2, color: colour }, name: `${name} mean`, legendgroup: name });
  });
  await plotlyReady;
  await Plotly.newPlot(band, traces, { margin: { t: 10, r: 10, b: 35, l: 55 }, xaxis: { title: { text: "step" } },
    yaxis: { title: { text: esc(c.key) } }, legend: { orientation: "h" } }, PLOTLY_CONFIG);
  main.dataset.ready = "compare";
}

// ---------- routing ----------

async function route({ refresh = false } = {}) {
  clearTimeout(refreshTimer);
  const token = ++renderToken;
  const url = new URL(location.href);
  if (url.searchParams.has("token")) {  // a sign-in link, as Jupyter prints: keep the key, drop it from the URL
    localStorage.setItem(KEY_STORE, url.searchParams.get("token"));
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + (url.search === "?" ? "" : url.search) + url.hash);
  }
  if (!apiKey()) return showLogin();
  document.getElementById("logout").hidden = false;
  if (!refresh) {
    main.dataset.ready = "";
    delete main.dataset.key;
  }
  const { parts, params } = parseHash();
  try {
    if (parts[0] === "runs" && parts[1]) await showRun(parts[1], parts[2] === "distributed" ? "distributed" : "overview", params);
    else if (parts[0] === "compare") await showCompare(params);
    else await showRuns(params);
  } catch (error) {
    if (token !== renderToken) return;
    if (error instanceof AuthError) {
      localStorage.removeItem(KEY_STORE);
      return showLogin("That API key was not accepted.");
    }
    main.replaceChildren(el("div", { class: "card error", id: "error", text: `Error: ${error.message}` }));
    main.dataset.ready = "error";
  }
}

document.getElementById("logout").addEventListener("click", () => { localStorage.removeItem(KEY_STORE); route(); });
window.addEventListener("hashchange", () => route());
route();  // a deferred script: the document is parsed; plotly.js may still be loading
