// gpunet portal: one page, no build step, no third-party code. Talks to the /v1 API with the token the user logs in
// with (kept in this tab's sessionStorage). Every value from the server is put into the page as text, never as HTML.
"use strict";

const TOKEN_KEY = "gpunet.token";
const STATES = ["pending", "running", "preempted", "restarting", "succeeded", "failed", "cancelled"];
const ACTIVE = new Set(["pending", "running", "preempted", "restarting"]);
const MODELS = ["K80", "P100", "P40", "T4", "V100-16GB", "V100-32GB", "A10", "L40S", "A100-40GB", "A100-80GB",
  "H100-80GB", "H200-141GB"];

const S = { token: null, me: null, page: null, refresh: null, stream: null, logs: null, timer: null };

// ---------------------------------------------------------------- helpers

/** Builds an element: h("a", {href: "#"}, "text", child). Attributes starting with "on" are listeners. */
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const kid of kids.flat()) if (kid) el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return el;
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "http_" + status;
    this.field = e.field || null;
  }
}

async function api(path, opts = {}) {
  const sent = S.token;
  // Logged out (a refresh or a page's draw that outlived its session): nothing is sent, and nothing is shown.
  if (!sent) throw new ApiError(401, { error: { code: "logged_out", message: "Not logged in." } });
  const headers = { authorization: "Bearer " + sent };
  if (opts.body !== undefined) headers["content-type"] = opts.type || "application/json";
  const r = await fetch(path, { method: opts.method || "GET", headers, body: opts.body, signal: opts.signal });
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = text; }
  if (!r.ok) {
    // Only a refusal of the token in use logs out: an answer to a request sent before a logout or another login
    // must not end the new session.
    if (r.status === 401 && !opts.login && sent && sent === S.token) {
      logout("Your token is no longer accepted; log in again.");
    }
    throw new ApiError(r.status, body);
  }
  return body;
}

function toast(msg, err) {
  const d = h("div", { class: err ? "err" : "" }, msg);
  document.getElementById("toast").append(d);
  setTimeout(() => d.remove(), 5000);
}

function fmtTime(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  const same = new Date().toDateString() === d.toDateString();
  return same ? d.toLocaleTimeString() : d.toLocaleString();
}

function fmtDur(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "—";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + (s % 60) + "s";
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + "h " + (m % 60) + "m";
  return Math.floor(hr / 24) + "d " + (hr % 24) + "h";
}

function eta(ms) {
  if (!ms) return "unknown";
  const d = ms - Date.now();
  return d <= 1000 ? "now" : "in " + fmtDur(d);
}

function money(x, currency = "USD") {
  // Small amounts (seconds of use) keep their cents' fractions. A currency code the browser does not know (the
  // server's price catalogue names it) is printed after the number.
  const digits = x > 0 && x < 1 ? 4 : 2;
  try {
    return x.toLocaleString(undefined, { style: "currency", currency, maximumFractionDigits: digits });
  } catch (_) {
    return `${x.toLocaleString(undefined, { maximumFractionDigits: digits })} ${currency}`;
  }
}
/** The allocated GPUs' average utilisation from a usage total (busy over sampled GPU-hours), "—" without samples. */
function utilisation(u) {
  return u.sampled_gpu_hours > 0 ? `${Math.round((100 * u.busy_gpu_hours) / u.sampled_gpu_hours)}%` : "—";
}
function num(x, d = 1) { return Number(x).toLocaleString(undefined, { maximumFractionDigits: d }); }
function badge(state) { return h("span", { class: "badge " + state }, state); }

/** A job's state badge, with "held" beside it while the job is held. */
function jobBadge(j) {
  return j.held ? h("span", {}, badge(j.state), " ", h("span", { class: "badge held" }, "held")) : badge(j.state);
}
function jobLink(id, text) { return h("a", { href: "#/jobs/" + id }, text || "job-" + id); }
function isAdmin() { return S.me && S.me.role === "admin"; }
/** Whether the session's token manages tokens: the admin (all) or a tenant admin (its tenant's). */
function managesTokens() { return isAdmin() || Boolean(S.me && S.me.token && S.me.token.role === "tenant-admin"); }
/** "alice · tenant team-a (tenant admin)": who the session is, from `/v1/whoami`. */
function whoText(me) {
  const t = me.token || {};
  const base = me.role === "admin" ? "admin" : "tenant " + me.tenant + (t.role === "tenant-admin" ? " (tenant admin)" : "");
  return t.user ? `${t.user} · ${base}` : base;
}

function table(headers, rows, empty) {
  const head = h("tr", {}, headers.map((c) => h("th", { scope: "col", class: c.num ? "num" : "" }, typeof c === "string" ? c : c.label)));
  if (!rows.length) {
    return h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, head),
      h("tbody", {}, h("tr", {}, h("td", { colspan: headers.length, class: "empty" }, empty || "Nothing here.")))));
  }
  const body = rows.map((r) => h("tr", {}, r.map((c, i) => h("td", { class: headers[i].num ? "num" : "" }, c))));
  return h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, head), h("tbody", {}, body)));
}

function setMain(title, ...kids) {
  const main = document.getElementById("main");
  main.replaceChildren(h("h1", {}, title), ...kids);
  document.title = title + " · gpunet";
}

function showError(e) {
  const main = document.getElementById("main");
  main.append(h("div", { class: "error-box", role: "alert" }, e.message || String(e)));
}

// ---------------------------------------------------------------- session

async function login(token) {
  S.token = token;
  S.me = await api("/v1/whoami", { login: true });
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("login").hidden = true;
  document.getElementById("app").hidden = false;
  document.getElementById("who").textContent = whoText(S.me);
  document.getElementById("nav-tokens").hidden = !managesTokens();
  startStream();
  route();
}

function logout(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  S.token = null;
  S.me = null;
  stopStream();
  stopLogs();
  // A refresh the event stream asked for belongs to the session that ended.
  clearTimeout(pending);
  pending = null;
  S.refresh = null;
  document.getElementById("app").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = msg || "";
  document.getElementById("login-token").value = "";
  document.getElementById("login-token").focus();
}

// Live updates: the server's event stream, read with fetch so that the token goes in a header.
function startStream() {
  stopStream();
  const ctl = new AbortController();
  S.stream = ctl;
  const live = document.getElementById("live");
  let backoff = 500;
  const run = async () => {
    while (!ctl.signal.aborted) {
      try {
        const r = await fetch("/v1/events", { headers: { authorization: "Bearer " + S.token }, signal: ctl.signal });
        if (!r.ok) throw new Error("HTTP " + r.status);
        live.textContent = "live";
        live.className = "live on";
        backoff = 500;
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            const frame = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
            if (data) onEvent(data);
          }
        }
      } catch (_) {
        if (ctl.signal.aborted) return;
      }
      live.textContent = "reconnecting";
      live.className = "live off";
      await new Promise((res) => setTimeout(res, backoff));
      backoff = Math.min(backoff * 2, 10000);
    }
  };
  run();
}

function stopStream() {
  if (S.stream) S.stream.abort();
  S.stream = null;
}

let pending = null;
function onEvent(data) {
  let ev = null;
  try { ev = JSON.parse(data); } catch (_) { return; }
  document.dispatchEvent(new CustomEvent("gpunet-event", { detail: ev }));
  // Coalesce bursts: refresh the page's data at most every 400 ms (the queue, which explains every entry, every 2 s).
  if (!S.refresh || pending) return;
  pending = setTimeout(() => {
    pending = null;
    if (S.refresh) S.refresh().catch(() => {});
  }, S.page === "queue" ? 2000 : 400);
}

// ---------------------------------------------------------------- routing

const PAGES = { overview, queue, jobs, job, submit, tenants, nodes, tokens };

function route() {
  if (!S.token) return;
  stopLogs();
  clearInterval(S.timer);
  S.timer = null;
  S.refresh = null;
  const raw = location.hash.replace(/^#\/?/, "") || "overview";
  const [path, qs] = raw.split("?");
  const parts = path.split("/");
  let name = parts[0];
  let arg = parts[1];
  if (name === "jobs" && arg) name = "job";
  if (!PAGES[name]) name = "overview";
  S.page = name;
  for (const a of document.querySelectorAll("nav a")) {
    const cur = a.dataset.page === name || (name === "job" && a.dataset.page === "jobs");
    if (cur) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.getElementById("main").replaceChildren(h("p", { class: "muted" }, "Loading…"));
  PAGES[name](arg, new URLSearchParams(qs || "")).catch((e) => showError(e));
}

// ---------------------------------------------------------------- overview

async function overview() {
  const kpis = h("div", { class: "grid kpis" });
  const heat = h("div", {});
  const totals = h("div", {});
  const charts = h("div", { class: "grid two" });
  const pools = h("div", {});
  setMain("Overview", kpis, h("h2", {}, "GPUs by zone and node"), heat, h("h2", {}, "Totals"), totals,
    h("h2", {}, "The last hours"), charts, pools);
  const draw = async () => {
    const [c, ns, hist, ps] = await Promise.all([api("/v1/cluster"), api("/v1/nodes"), api("/v1/cluster/history"),
      isAdmin() ? api("/v1/pools") : Promise.resolve([])]);
    pools.replaceChildren(...poolCharts(ps));
    // The charts end with the state of now.
    hist.push({ at_ms: Date.now(), gpus_total: c.gpus_total, gpus_allocated: c.gpus_allocated,
      queue_length: c.queue_length, running: c.jobs.running || 0 });
    const pct = c.gpus_total ? (100 * c.gpus_allocated) / c.gpus_total : 0;
    const ready = c.nodes.ready || 0;
    const nodeCount = Object.values(c.nodes).reduce((a, b) => a + b, 0);
    kpis.replaceChildren(
      kpi("GPUs allocated", `${c.gpus_allocated} / ${c.gpus_total}`, `${num(pct)}% of schedulable GPUs`),
      kpi("Queue", String(c.queue_length), "jobs waiting"),
      kpi("Running", String(c.jobs.running || 0), isAdmin() ? "jobs" : "of your jobs"),
      kpi("Nodes ready", `${ready} / ${nodeCount}`, nodeCount - ready ? `${nodeCount - ready} not ready` : "all ready"),
      kpi("Policy", c.policy, c.backfill ? "with backfill" : "no backfill"));
    heat.replaceChildren(heatmap(ns));
    totals.replaceChildren(totalsTable(ns));
    charts.replaceChildren(
      h("div", { class: "card chart" }, h("h3", {}, "GPU allocation"),
        lineChart(hist, [{ key: "gpus_allocated", cls: "s1", area: true, label: "allocated" },
          { key: "gpus_total", cls: "s2", label: "schedulable" }], "GPU allocation over time")),
      h("div", { class: "card chart" }, h("h3", {}, "Queue length"),
        lineChart(hist, [{ key: "queue_length", cls: "s3", label: "waiting jobs" }], "Queue length over time")));
  };
  S.refresh = draw;
  S.timer = setInterval(() => draw().catch(() => {}), 15000);
  await draw();
}

/** Each node pool: its size (as GPUs) and forecast demand at each decision, and its nodes now. */
function poolCharts(ps) {
  if (!ps.length) return [];
  const cards = ps.map((p) => {
    const pts = p.events.filter((e) => e.numbers && e.numbers.to !== undefined).map((e) => ({
      at_ms: e.at_ms, size: e.numbers.to * p.gpus_per_node, forecast: Math.round(e.numbers.forecast_gpus || 0) }));
    pts.push({ at_ms: Date.now(), size: p.target_nodes * p.gpus_per_node, forecast: Math.round(p.forecast_gpus) });
    const nodes = p.nodes.map((n) => `${n.name} (${n.phase})`).join(", ") || "no nodes";
    return h("div", { class: "card chart" },
      h("h3", {}, `pool ${p.name}`, h("span", { class: "muted" },
        ` ${p.lifecycle}, ${p.gpus_per_node}×${p.gpu_model}, ${p.min_nodes}..${p.max_nodes} nodes, zone: ${p.zone}`)),
      lineChart(pts, [{ key: "size", cls: "s1", area: true, label: "pool GPUs (target)" },
        { key: "forecast", cls: "s2", label: "forecast demand (GPUs)" }], `pool ${p.name}: size and forecast`),
      h("p", { class: "muted" }, nodes));
  });
  return [h("h2", {}, "Node pools"), h("div", { class: "grid pools" }, cards)];
}

function kpi(label, value, sub) {
  return h("div", { class: "card kpi" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value),
    h("div", { class: "muted" }, sub));
}

function heatmap(ns) {
  if (!ns.length) return h("p", { class: "empty" }, "No nodes have joined yet. Start an agent with gpunet agent.");
  const zones = new Map();
  for (const n of ns) {
    const z = n.labels.zone || "no zone";
    if (!zones.has(z)) zones.set(z, []);
    zones.get(z).push(n);
  }
  const me = S.me.tenant;
  const out = [h("div", { class: "legend", "aria-hidden": "true" }, h("span", { class: "l-free" }, "free"),
    h("span", { class: "l-alloc" }, "allocated"), me ? h("span", { class: "l-mine" }, "your jobs") : null,
    h("span", { class: "l-util" }, "utilisation (real GPUs)"), h("span", { class: "l-down" }, "node not ready"))];
  for (const [z, list] of [...zones.entries()].sort()) {
    const gpus = list.reduce((a, n) => a + n.devices.length, 0);
    const used = list.reduce((a, n) => a + n.devices.filter((d) => d.allocated).length, 0);
    out.push(h("section", { class: "zone card", "aria-label": "zone " + z },
      h("h3", {}, "zone " + z, h("span", { class: "muted" }, `${used} of ${gpus} GPUs allocated`)),
      h("div", { class: "nodes" }, list.map((n) => nodeBlock(n, me)))));
  }
  return h("div", {}, out);
}

function nodeBlock(n, me) {
  const down = n.state !== "ready";
  const cells = n.devices.map((d) => {
    let cls = "cell";
    let what = "free";
    if (down) { cls += " down"; what = "node " + n.state; }
    if (d.allocated) {
      cls += me && d.tenant === me ? " mine" : " alloc";
      what = d.job ? `job-${d.job} (${d.tenant})` : "allocated to another tenant";
    }
    const util = d.utilization_pct;
    const bits = [`${n.name} GPU ${d.index} ${d.model}: ${what}`];
    if (util !== undefined && util !== null) bits.push(`utilisation ${num(util, 0)}%`);
    if (d.memory_used_mib !== undefined && d.memory_used_mib !== null) bits.push(`memory used ${d.memory_used_mib} MiB`);
    if (n.fake) bits.push("fake GPU");
    const label = bits.join(", ");
    const attrs = { class: cls, title: label, "aria-label": label, role: "img" };
    if (util !== undefined && util !== null && !down) {
      // Utilisation shades the cell from light to deep blue.
      const l = 85 - Math.round(Math.min(100, util) * 0.55);
      attrs.class += " util";
      attrs["data-util"] = Math.round(util);
      const el = d.job ? h("a", { ...attrs, href: "#/jobs/" + d.job, role: null }, String(d.index))
        : h("div", attrs, String(d.index));
      el.style.background = `hsl(217 80% ${l}%)`;
      el.style.color = l < 55 ? "#fff" : "#0f172a";
      return el;
    }
    return d.job ? h("a", { ...attrs, href: "#/jobs/" + d.job, role: null }, String(d.index))
      : h("div", attrs, String(d.index));
  });
  return h("div", { class: "node" },
    h("div", { class: "node-head" }, h("strong", {}, n.name), h("span", {}, n.fake ? badge("fake") : null, " ",
      badge(n.state))),
    h("div", { class: "muted", style: null }, `${n.gpu_model || "no GPUs"} · ${n.gpus - n.free_gpus}/${n.gpus} used`),
    h("div", { class: "cells" }, cells));
}

function totalsTable(ns) {
  const rows = new Map();
  const add = (key, model, zone, d, ready) => {
    if (!rows.has(key)) rows.set(key, { model, zone, total: 0, alloc: 0, down: 0 });
    const r = rows.get(key);
    r.total += 1;
    if (d.allocated) r.alloc += 1;
    if (!ready) r.down += 1;
  };
  for (const n of ns) {
    for (const d of n.devices) add(d.model + "\u0000" + (n.labels.zone || "no zone"), d.model, n.labels.zone || "no zone",
      d, n.state === "ready");
  }
  const list = [...rows.values()].sort((a, b) => (a.model + a.zone).localeCompare(b.model + b.zone));
  const byModel = new Map();
  for (const r of list) {
    const m = byModel.get(r.model) || { total: 0, alloc: 0, down: 0 };
    m.total += r.total; m.alloc += r.alloc; m.down += r.down;
    byModel.set(r.model, m);
  }
  const line = (model, zone, r) => [model, zone, String(r.total), String(r.alloc), String(r.total - r.alloc - r.down),
    String(r.down), `${num(r.total ? (100 * r.alloc) / r.total : 0)}%`];
  const rowsOut = list.map((r) => line(r.model, r.zone, r));
  for (const [m, r] of byModel) rowsOut.push(line(h("strong", {}, m), h("strong", {}, "all zones"), r));
  return table([{ label: "GPU model" }, { label: "Zone" }, { label: "GPUs", num: true }, { label: "Allocated", num: true },
    { label: "Free", num: true }, { label: "Not ready", num: true }, { label: "Allocated %", num: true }], rowsOut,
    "No GPUs.");
}

function lineChart(points, series, title) {
  const W = 640, H = 220, L = 44, R = 12, T = 12, B = 28;
  if (!points.length) return h("p", { class: "empty" }, "No samples yet (one is taken every 15 seconds).");
  const t0 = points[0].at_ms;
  const t1 = Math.max(points[points.length - 1].at_ms, t0 + 60000);
  // A round top so that the four grid lines fall on whole numbers.
  const top = Math.max(4, ...points.flatMap((p) => series.map((s) => p[s.key])));
  const step = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000]
    .find((st) => st * 4 >= top) || Math.ceil(top / 4);
  const max = step * 4;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  const kids = [svg("title", {}, title)];
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    kids.push(svg("line", { class: "grid-line", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    kids.push(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, num(v, 0)));
  }
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    const d = new Date(t);
    kids.push(svg("text", { x: x(t), y: H - 8, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" },
      d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })));
  }
  kids.push(svg("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) }));
  for (const s of series) {
    const pts = points.map((p) => `${x(p.at_ms).toFixed(1)},${y(p[s.key]).toFixed(1)}`);
    if (pts.length === 1) pts.push(`${(W - R).toFixed(1)},${y(points[0][s.key]).toFixed(1)}`);
    if (s.area) {
      const first = pts[0].split(",")[0], last = pts[pts.length - 1].split(",")[0];
      kids.push(svg("polygon", { class: "area", points: `${first},${y(0)} ${pts.join(" ")} ${last},${y(0)}` }));
    }
    kids.push(svg("polyline", { class: s.cls, points: pts.join(" ") }));
  }
  const lastP = points[points.length - 1];
  const legend = h("div", { class: "legend" }, series.map((s) => h("span", { class: "l-" + s.cls },
    `${s.label}: ${lastP[s.key]}`)));
  return h("div", {}, svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title }, kids), legend);
}

// ---------------------------------------------------------------- queue

async function queue() {
  const head = h("p", { class: "muted" });
  const body = h("div", {});
  setMain("Queue", head, body);
  const draw = async () => {
    const q = await api("/v1/queue?limit=50");
    // What the caller may see: a tenant's own jobs (the whole queue's length counts every tenant's).
    const n = q.visible_length ?? q.queue_length;
    head.textContent = (isAdmin() ? `${n} job(s) waiting` : `${n} of your job(s) waiting (${q.queue_length} in the ` +
      "whole queue)") + `, in the order the ${q.policy} policy considers them` +
      (q.entries.length < n ? ` (the first ${q.entries.length} shown)` : "") + ".";
    const empty = !isAdmin() && q.queue_length > 0
      ? `None of your jobs is waiting (${q.queue_length} of other tenants' are).` : "The queue is empty.";
    body.replaceChildren(table(
      [{ label: "#", num: true }, { label: "Job" }, { label: "Tenant" }, { label: "State" }, { label: "GPUs", num: true },
        { label: "Priority", num: true }, { label: "Waiting" }, { label: "Why pending" }, { label: "Expected start" }],
      q.entries.map((e) => [String(e.position + 1), h("span", {}, jobLink(e.id), " ", h("span", { class: "muted" }, e.name)),
        e.tenant, badge(e.state), String(e.gpus), String(e.priority), fmtDur(Date.now() - e.submitted_ms),
        h("span", { class: "reason" }, e.message),
        e.eta_ms ? h("span", { title: fmtTime(e.eta_ms) }, eta(e.eta_ms)) : h("span", { class: "muted" }, "unknown")]),
      empty));
  };
  S.refresh = draw;
  S.timer = setInterval(() => draw().catch(() => {}), 10000);
  await draw();
}

// ---------------------------------------------------------------- jobs

async function jobs(_arg, params) {
  const tenantSel = h("select", { id: "f-tenant", name: "tenant" }, h("option", { value: "" }, "all tenants"));
  const stateSel = h("select", { id: "f-state", name: "state" }, h("option", { value: "" }, "any state"),
    STATES.map((s) => h("option", { value: s }, s)));
  const text = h("input", { id: "f-text", name: "q", type: "search", placeholder: "id, name, command" });
  const userIn = h("input", { id: "f-user", name: "user", type: "search", placeholder: "any user" });
  const list = h("div", {});
  const count = h("p", { class: "muted", "aria-live": "polite" });
  const filters = h("form", { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
    isAdmin() ? h("div", {}, h("label", { for: "f-tenant" }, "Tenant"), tenantSel) : null,
    h("div", {}, h("label", { for: "f-state" }, "State"), stateSel),
    h("div", {}, h("label", { for: "f-user" }, "User"), userIn),
    h("div", { style: null }, h("label", { for: "f-text" }, "Text"), text));
  setMain("Jobs", filters, count, list);
  if (isAdmin()) {
    for (const t of await api("/v1/tenants")) tenantSel.append(h("option", { value: t.name }, t.name));
  }
  tenantSel.value = params.get("tenant") || "";
  stateSel.value = params.get("state") || "";
  text.value = params.get("q") || "";
  userIn.value = params.get("user") || "";
  const draw = async () => {
    const q = new URLSearchParams();
    if (tenantSel.value) q.set("tenant", tenantSel.value);
    if (stateSel.value) q.set("state", stateSel.value);
    if (userIn.value.trim()) q.set("user", userIn.value.trim());
    // The newest first, with the count of all that match: the newest are never the ones left out.
    q.set("order", "newest");
    q.set("limit", "500");
    const page = await api("/v1/jobs?" + q.toString());
    let all = page.jobs;
    const total = page.total ?? all.length;
    const needle = text.value.trim().toLowerCase();
    if (needle) {
      all = all.filter((j) => ("job-" + j.id + " " + j.id + " " + j.name + " " + j.tenant + " " + (j.submitted_by || "") + " " +
        (j.spec.command || []).join(" ")).toLowerCase().includes(needle));
    }
    count.textContent = needle ? `${all.length} of the newest ${page.jobs.length} job(s) match` :
      page.jobs.length < total ? `The newest ${page.jobs.length} of ${total} job(s)` : `${total} job(s)`;
    list.replaceChildren(table(
      [{ label: "Job" }, { label: "Name" }, { label: "Tenant" }, { label: "By" }, { label: "State" },
        { label: "GPUs", num: true }, { label: "Submitted" }, { label: "Run time" }, { label: "Restarts", num: true },
        { label: "" }],
      all.slice(0, 500).map((j) => [jobLink(j.id), jobName(j), j.tenant, j.submitted_by || "—", jobBadge(j), String(j.gpus),
        fmtTime(j.submitted_ms),
        j.started_ms ? fmtDur((j.finished_ms || Date.now()) - j.started_ms) : "—", String(j.restarts),
        ACTIVE.has(j.state) ? h("button", { type: "button", class: "danger", "aria-label": `Cancel job-${j.id}`,
          onclick: () => cancelJob(j.id) }, "Cancel") : ""]),
      "No jobs match."));
  };
  const sync = () => {
    const q = new URLSearchParams();
    if (tenantSel.value) q.set("tenant", tenantSel.value);
    if (stateSel.value) q.set("state", stateSel.value);
    if (userIn.value) q.set("user", userIn.value);
    if (text.value) q.set("q", text.value);
    history.replaceState(null, "", "#/jobs" + (q.toString() ? "?" + q.toString() : ""));
    draw().catch((e) => toast(e.message, true));
  };
  tenantSel.addEventListener("change", sync);
  stateSel.addEventListener("change", sync);
  text.addEventListener("input", sync);
  userIn.addEventListener("change", sync);
  S.refresh = draw;
  await draw();
}

async function cancelJob(id) {
  if (!confirm(`Cancel job-${id}? Its processes get SIGTERM, then SIGKILL after the grace period.`)) return;
  try {
    await api(`/v1/jobs/${id}/cancel`, { method: "POST" });
    toast(`job-${id} cancelled`);
    if (S.refresh) await S.refresh();
  } catch (e) {
    toast(e.message, true);
  }
}

/** Holds (or, with `release`, releases) a queued job or array. */
async function holdJob(id, release) {
  const action = release ? "release" : "hold";
  try {
    await api(`/v1/jobs/${id}/${action}`, { method: "POST" });
    toast(`job-${id} ${release ? "released" : "held"}`);
    if (S.refresh) await S.refresh();
  } catch (e) {
    toast(e.message, true);
  }
}

async function job(id) {
  const head = h("div", { class: "row" });
  const facts = h("div", { class: "card" });
  const why = h("div", {});
  const place = h("div", {});
  const attempts = h("div", {});
  const evs = h("div", {});
  const ckpts = h("div", {});
  const spec = h("pre", { class: "spec", tabindex: "0", "aria-label": "Job spec" });
  const rankSel = h("select", { id: "log-rank", class: "inline" });
  const logs = h("pre", { id: "logs", tabindex: "0", "aria-label": "Log output", "aria-live": "off" });
  setMain("job-" + id, head, h("div", { class: "grid two" }, facts, h("div", {}, why, h("h2", {}, "Placement"), place)),
    h("h2", {}, "Attempts"), attempts, h("h2", {}, "Events"), evs, h("h2", {}, "Checkpoints"), ckpts,
    h("h2", { class: "row" }, "Logs ", h("label", { for: "log-rank", class: "muted", style: null }, "rank"), rankSel),
    logs, h("h2", {}, "Spec"), spec);
  let ranks = -1;
  let lastState = null;
  const draw = async () => {
    const [j, ev] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/events`)]);
    j.placement = j.placement || [];
    j.warnings = j.warnings || [];
    document.querySelector("main h1").textContent = `job-${j.id} · ${j.name}`;
    const queued = ACTIVE.has(j.state) && j.state !== "running";
    head.replaceChildren(h("span", { id: "job-state" }, jobBadge(j)), h("span", { class: "spacer" }),
      ...(queued ? [h("button", { type: "button", id: j.held ? "job-release" : "job-hold",
        onclick: () => holdJob(j.id, j.held) }, j.held ? "Release" : "Hold")] : []),
      ...(ACTIVE.has(j.state) ? [h("button", { type: "button", class: "danger", onclick: () => cancelJob(j.id) },
        "Cancel job")] : []));
    facts.replaceChildren(h("dl", { class: "facts" },
      fact("Tenant", j.tenant), fact("Submitted by", j.submitted_by || "—"), fact("Priority", j.priority), fact("Tasks × GPUs", `${j.tasks} × ${j.spec.gpus}`),
      fact("Command", shellJoin(j.spec.command || []) || "—"),
      fact("Submitted", fmtTime(j.submitted_ms)), fact("Started", fmtTime(j.started_ms)),
      fact("Finished", fmtTime(j.finished_ms)),
      fact("Run time", j.started_ms ? fmtDur((j.finished_ms || Date.now()) - j.started_ms) : "—"),
      fact("Restarts", `${j.restarts} of ${j.spec.max_restarts ?? 3}`), fact("Preemptions", j.preemptions),
      j.estimate ? fact("Run-time estimate", estimateText(j.estimate)) : null,
      j.array ? fact("Array", `${j.spec.array}: ${j.array.total} elements (ids ${j.id + 1}–${j.id + j.array.total}), ` +
        `${j.array.expanded} expanded, ${j.array.live} live, ${j.array.succeeded} succeeded, ${j.array.failed} failed, ` +
        `${j.array.cancelled} cancelled`) : null,
      j.array_job_id != null ? fact("Array element", `job-${j.array_job_id}[${j.array_index}]`) : null,
      j.spec.dependency ? fact("Dependency", j.spec.dependency) : null,
      j.end_reason ? fact("Ended because", j.end_reason) : null,
      j.warnings.length ? fact("Warnings", j.warnings.join("; ")) : null));
    if (ACTIVE.has(j.state) && j.state !== "running") {
      const e = await api(`/v1/jobs/${id}/explain`);
      why.replaceChildren(h("h2", {}, "Why pending"), h("div", { class: "card", id: "why" },
        h("p", { class: "reason" }, e.message),
        h("p", { class: "muted" }, `${e.position} job(s) ahead · expected start ${e.eta_ms ? eta(e.eta_ms) + " (" +
          fmtTime(e.eta_ms) + ")" : "unknown"}`)));
    } else {
      why.replaceChildren();
    }
    place.replaceChildren(table([{ label: "Rank", num: true }, { label: "Node" }, { label: "GPUs" }],
      j.placement.map((t, i) => [String(i), t.node, t.mig_slot !== undefined ? `MIG slot ${t.mig_slot}` :
        t.gpus.join(", ")]), "Not placed."));
    attempts.replaceChildren(table([{ label: "#", num: true }, { label: "Where" }, { label: "Started" },
      { label: "Ended" }, { label: "Ran" }, { label: "End" }, { label: "How" }],
    (j.attempts || []).map((a) => [String(a.attempt),
      a.placement.map((t) => `${t.node}: ${t.gpus.join(", ") || "no GPU"}`).join("; "), fmtTime(a.started_ms),
      a.ended_ms ? fmtTime(a.ended_ms) : "—", fmtDur((a.ended_ms || Date.now()) - a.started_ms),
      a.outcome ? badge(a.outcome) : badge("running") ,
      (a.exit_code != null ? `exit ${a.exit_code}` : a.signal != null ? `signal ${a.signal}` : "") +
        (a.message ? (a.exit_code != null || a.signal != null ? " · " : "") + a.message : "")]), "Not started yet."));
    evs.replaceChildren(table([{ label: "Time" }, { label: "Kind" }, { label: "What" }],
      ev.map((e) => [fmtTime(e.at_ms), badge(e.kind), e.message]), "No events."));
    const cks = ev.filter((e) => e.kind === "checkpoint");
    const tiers = j.spec.checkpoint_tiers || [];
    ckpts.replaceChildren(
      tiers.length ? h("p", { class: "muted" }, "Tiers: " + tiers.map((t) => `${t.name} every ${t.every}, keep ${t.keep}` +
        (t.url ? ` → ${t.url}` : "")).join("; ")) : h("p", { class: "muted" }, "No checkpoint tiers declared."),
      table([{ label: "Time" }, { label: "What" }], cks.map((e) => [fmtTime(e.at_ms), e.message]), "No checkpoints yet."));
    spec.textContent = JSON.stringify(j.spec, null, 2);
    if (ranks !== j.tasks) {
      ranks = j.tasks;
      rankSel.replaceChildren(...Array.from({ length: Math.max(1, j.tasks) }, (_, i) => h("option", { value: i }, String(i))));
    }
    if (lastState !== j.state) {
      // Restart the log stream when the job starts (a new attempt has a new log).
      if (lastState === null || j.state === "running") followLogs(id, rankSel.value || 0, logs);
      lastState = j.state;
    }
  };
  rankSel.addEventListener("change", () => followLogs(id, rankSel.value, logs));
  S.refresh = draw;
  await draw();
}

// An array element is shown as name[index], an array with its progress.
function jobName(j) {
  if (j.array_job_id != null && j.array_index != null) return `${j.name}[${j.array_index}]`;
  if (j.array) return `${j.name} [array: ${j.array.total} elements, ${j.array.live} live]`;
  return j.name;
}

function fact(k, v) { return [h("dt", {}, k), h("dd", {}, String(v))]; }

/** The run-time estimate a job is scheduled by (`EstimateView`), as the CLI's `show` says it. */
function estimateText(e) {
  const probe = (p) => `ranked as a ${fmtDur(p * 1000)} first stint (probe)`;
  if (e.source === "probe") return `no estimate: ${probe(e.seconds)}, then as running as long again as it has run`;
  if (e.source === "learned" && e.confidence != null && e.basis != null && e.samples != null) {
    const runs = e.samples === 1 ? "run" : "runs";
    const spread = e.spread != null ? `, spread ×${Math.exp(e.spread).toFixed(1)}` : "";
    const first = e.probe_s != null ? `; ${probe(e.probe_s)} until it has run that long` : "";
    return `${fmtDur(e.seconds * 1000)}, learned from ${e.basis} (${e.samples} ${runs}, confidence ` +
      `${Number(e.confidence).toFixed(2)}${spread})${first}`;
  }
  return `${fmtDur(e.seconds * 1000)} (${e.source})`;
}

/** A command line as a shell would need it typed: words with spaces or quotes are single-quoted. */
function shellJoin(words) {
  return words.map((w) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : "'" + w.replace(/'/g, "'\\''") + "'")).join(" ");
}

function stopLogs() {
  if (S.logs) S.logs.abort();
  S.logs = null;
}

async function followLogs(id, rank, pre) {
  stopLogs();
  const ctl = new AbortController();
  S.logs = ctl;
  pre.textContent = "";
  pre.dataset.empty = "waiting for output…";
  try {
    const r = await fetch(`/v1/jobs/${id}/logs?rank=${rank}&follow=true`,
      { headers: { authorization: "Bearer " + S.token }, signal: ctl.signal });
    if (!r.ok) { pre.textContent = (await r.text()) || "no log"; return; }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent += dec.decode(value, { stream: true });
      if (stick) pre.scrollTop = pre.scrollHeight;
    }
    if (!pre.textContent) pre.textContent = "(no output)";
  } catch (_) {
    // Aborted when leaving the page or switching rank.
  }
}

// ---------------------------------------------------------------- submit

const FORM_FIELDS = [
  { id: "name", label: "Name", type: "text", required: true },
  { id: "command", label: "Command", type: "text", required: true, wide: true,
    hint: "the program and its arguments; quote arguments with spaces" },
  { id: "tasks", label: "Tasks", type: "number", value: "1", min: "1", hint: "processes; more than one is a gang" },
  { id: "gpus", label: "GPUs per task", type: "number", value: "1", min: "0" },
  { id: "gpu_models", label: "GPU model", type: "select", options: ["", ...MODELS], none: "any model" },
  { id: "cpu", label: "CPU per task", type: "text", placeholder: "4 or 500m" },
  { id: "memory", label: "Memory per task", type: "text", placeholder: "16Gi" },
  { id: "priority", label: "Priority", type: "number", value: "0" },
  { id: "estimated_duration", label: "Estimated run time", type: "text", placeholder: "30m",
    hint: "helps shortest-job-first, backfill and the ETA" },
  { id: "max_restarts", label: "Max restarts", type: "number", value: "3", min: "0" },
  { id: "topology", label: "Topology", type: "select", options: ["", "zone", "rack", "node", "nvlink"],
    hint: "how close a gang's tasks must be; empty: the default" },
  { id: "preemptible", label: "Preemptible (may be evicted and resumed from its checkpoint)", type: "checkbox",
    checked: true },
];

const YAML_EXAMPLE = `# gpunet/v1 job, or a Kubernetes batch/v1 Job
name: train-resnet
command: [python, train.py, --epochs, "10"]
tasks: 1
gpus: 2
gpu_models: [A100-80GB]
memory: 32Gi
estimated_duration: 45m
`;

/** Splits a command line into words, honouring single and double quotes. */
function splitCommand(s) {
  const out = [];
  let cur = "", q = null, any = false;
  for (const c of s) {
    if (q) { if (c === q) q = null; else cur += c; }
    else if (c === "'" || c === '"') { q = c; any = true; }
    else if (/\s/.test(c)) { if (cur || any) out.push(cur); cur = ""; any = false; }
    else cur += c;
  }
  if (q) throw new ApiError(400, { error: { message: "the command has an unclosed quote", field: "command" } });
  if (cur || any) out.push(cur);
  return out;
}

async function submit() {
  const tabForm = h("button", { type: "button", role: "tab", id: "tab-form", "aria-selected": "true",
    "aria-controls": "panel-form" }, "Form");
  const tabYaml = h("button", { type: "button", role: "tab", id: "tab-yaml", "aria-selected": "false",
    "aria-controls": "panel-yaml", tabindex: "-1" }, "YAML");
  const result = h("div", { id: "submit-result", "aria-live": "polite" });
  const inputs = {};
  const errs = {};
  const grid = h("div", { class: "form-grid" });
  if (isAdmin()) {
    const sel = h("select", { id: "f-tenant-submit", name: "tenant", "aria-describedby": "err-tenant" });
    for (const t of await api("/v1/tenants")) sel.append(h("option", { value: t.name }, t.name));
    inputs.tenant = sel;
    errs.tenant = h("p", { class: "field-error", id: "err-tenant" });
    grid.append(h("div", {}, h("label", { for: "f-tenant-submit" }, "Tenant"), sel, errs.tenant));
  }
  for (const f of FORM_FIELDS) {
    const id = "f-" + f.id;
    let el;
    if (f.type === "select") {
      el = h("select", { id, name: f.id }, f.options.map((o) => h("option", { value: o }, o || f.none || "default")));
    } else {
      el = h("input", { id, name: f.id, type: f.type, value: f.value, min: f.min, placeholder: f.placeholder,
        required: f.required, checked: f.checked });
    }
    el.setAttribute("aria-describedby", "err-" + f.id + (f.hint ? " hint-" + f.id : ""));
    inputs[f.id] = el;
    errs[f.id] = h("p", { class: "field-error", id: "err-" + f.id });
    const hint = f.hint ? h("p", { class: "hint", id: "hint-" + f.id }, f.hint) : null;
    const box = f.type === "checkbox"
      ? h("div", {}, h("label", { for: id }, el, f.label), errs[f.id])
      : h("div", { class: f.wide ? "wide" : "" }, h("label", { for: id }, f.label), el, hint, errs[f.id]);
    grid.append(box);
  }
  const general = h("div", {});
  const formPanel = h("form", { id: "panel-form", role: "tabpanel", "aria-labelledby": "tab-form", class: "card",
    novalidate: true, onsubmit: (e) => { e.preventDefault(); send(false, "form"); } }, grid, general,
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Submit job"),
    h("button", { type: "button", id: "dry-run", onclick: () => send(true, "form") }, "Dry run")));
  const yaml = h("textarea", { id: "f-yaml", name: "yaml", spellcheck: "false", "aria-describedby": "err-yaml" });
  yaml.value = YAML_EXAMPLE;
  const yamlErr = h("div", { id: "err-yaml" });
  // An admin names the tenant here unless the spec does (`tenant:` in it wins).
  const yamlTenant = isAdmin() ? h("select", { id: "f-yaml-tenant", name: "tenant" },
    h("option", { value: "" }, "the spec's tenant"),
    (inputs.tenant ? Array.from(inputs.tenant.options) : []).map((o) => h("option", { value: o.value }, o.value))) : null;
  const yamlPanel = h("form", { id: "panel-yaml", role: "tabpanel", "aria-labelledby": "tab-yaml", class: "card",
    hidden: true, onsubmit: (e) => { e.preventDefault(); send(false, "yaml"); } },
  yamlTenant ? h("div", {}, h("label", { for: "f-yaml-tenant" }, "Tenant"), yamlTenant) : null,
  h("label", { for: "f-yaml" }, "Job spec (gpunet YAML or a Kubernetes Job)"), yaml, yamlErr,
  h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Submit YAML"),
    h("button", { type: "button", onclick: () => send(true, "yaml") }, "Dry run")));
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "How to describe the job" }, tabForm, tabYaml);
  const select = (yamlMode) => {
    tabForm.setAttribute("aria-selected", String(!yamlMode));
    tabYaml.setAttribute("aria-selected", String(yamlMode));
    tabForm.tabIndex = yamlMode ? -1 : 0;
    tabYaml.tabIndex = yamlMode ? 0 : -1;
    formPanel.hidden = yamlMode;
    yamlPanel.hidden = !yamlMode;
  };
  tabForm.addEventListener("click", () => select(false));
  tabYaml.addEventListener("click", () => select(true));
  tabs.addEventListener("keydown", (e) => {
    if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
      const y = tabForm.getAttribute("aria-selected") === "true";
      select(y);
      (y ? tabYaml : tabForm).focus();
    }
  });
  setMain("Submit a job", tabs, formPanel, yamlPanel, result);

  const clear = () => {
    for (const [k, el] of Object.entries(inputs)) { el.removeAttribute("aria-invalid"); errs[k].textContent = ""; }
    general.replaceChildren();
    yamlErr.replaceChildren();
    yaml.removeAttribute("aria-invalid");
    result.replaceChildren();
  };
  const build = () => {
    const v = (k) => inputs[k].value.trim();
    const spec = { name: v("name") };
    if (inputs.tenant) spec.tenant = inputs.tenant.value;
    spec.command = v("command") ? splitCommand(v("command")) : [];
    const int = (k) => {
      const s = v(k);
      if (s === "") return undefined;
      if (!/^-?\d+$/.test(s)) throw new ApiError(400, { error: { message: `${k} must be a whole number`, field: k } });
      return Number(s);
    };
    for (const k of ["tasks", "gpus", "priority", "max_restarts"]) { const n = int(k); if (n !== undefined) spec[k] = n; }
    if (v("gpu_models")) spec.gpu_models = [v("gpu_models")];
    for (const k of ["cpu", "memory", "estimated_duration", "topology"]) if (v(k)) spec[k] = v(k);
    spec.preemptible = inputs.preemptible.checked;
    return JSON.stringify(spec);
  };
  const fieldOf = (f) => {
    if (!f) return null;
    const base = f.split(/[.[]/)[0];
    return inputs[base] ? base : null;
  };
  async function send(dry, mode) {
    clear();
    let body;
    try {
      body = mode === "form" ? build() : yaml.value;
      const tq = mode === "yaml" && yamlTenant && yamlTenant.value ? "?tenant=" + encodeURIComponent(yamlTenant.value) : "";
      const path = (dry ? "/v1/jobs/dry-run" : "/v1/jobs") + tq;
      const r = await api(path, { method: "POST", body, type: mode === "form" ? "application/json" : "application/yaml" });
      if (dry) {
        r.placement = r.placement || [];
        result.replaceChildren(h("div", { class: r.placement.length ? "ok-box" : "warn-box", id: "dry-run-result" },
          h("h3", {}, r.placement.length ? "Fits now" : "Would wait"),
          h("p", {}, r.message),
          r.placement.length ? h("ul", {}, r.placement.map((t, i) =>
            h("li", {}, `rank ${i}: ${t.node} GPUs ${t.gpus.join(", ") || "none"}`))) : null,
          h("p", {}, "Expected start: ", r.eta_ms ? `${eta(r.eta_ms)} (${fmtTime(r.eta_ms)})` : "unknown"),
          r.estimate ? h("p", { id: "dry-run-estimate" }, "Run-time estimate: " + estimateText(r.estimate)) : null,
          r.warnings && r.warnings.length ? h("p", { class: "muted" }, "Warnings: " + r.warnings.join("; ")) : null));
      } else {
        toast(`job-${r.id} submitted`);
        location.hash = "#/jobs/" + r.id;
      }
    } catch (e) {
      if (!(e instanceof ApiError)) { result.replaceChildren(h("div", { class: "error-box", role: "alert" }, String(e))); return; }
      const f = mode === "form" ? fieldOf(e.field) : null;
      if (f) {
        inputs[f].setAttribute("aria-invalid", "true");
        errs[f].textContent = e.message;
        inputs[f].focus();
      } else if (mode === "yaml") {
        yaml.setAttribute("aria-invalid", "true");
        yamlErr.replaceChildren(h("div", { class: "error-box", role: "alert" },
          e.field ? h("strong", {}, e.field + ": ") : null, e.message));
      } else {
        general.replaceChildren(h("div", { class: "error-box", role: "alert" },
          e.field ? h("strong", {}, e.field + ": ") : null, e.message));
      }
    }
  }
}

// ---------------------------------------------------------------- statements

/** A CSV field as `gpunet report` writes it: a leading =, +, - or @ defused with a quote; quoted when it must be. */
function csvField(v) {
  let s = String(v);
  if (/^[=+\-@]/.test(s) && s !== "-") s = "'" + s;
  return /[",\n\r]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
}

/** A number as the CLI prints it (Rust's `{}` for an f64): the shortest digits that read back, never an exponent. */
function plainNum(x) {
  const s = String(x);
  const m = /^(-?)(\d)(?:\.(\d+))?e([+-]\d+)$/.exec(s);
  if (!m) return s;
  const [, sign, d, frac = "", e] = m;
  const exp = Number(e);
  if (exp < 0) return sign + "0." + "0".repeat(-exp - 1) + d + frac;
  return sign + d + frac + "0".repeat(Math.max(0, exp - frac.length));
}

/** The figures of one usage total, in the statement's column order. */
function usageCsv(u) {
  return [u.gpu_hours, u.cpu_hours, u.memory_gib_hours, u.gpu_cost, u.cpu_cost, u.mem_cost, u.cost]
    .map((x) => plainNum(x || 0)).join(",");
}

/**
 * A tenant's statement for a UTC month ("YYYY-MM") as CSV: the same lines as `gpunet report --statement --tenant
 * NAME --month YYYY-MM` (one per job billed in the month, from the billing ledger, then the total).
 */
async function statementCsv(tenant, month) {
  const [y, m] = month.split("-").map(Number);
  const from = Date.UTC(y, m - 1, 1), to = Date.UTC(y, m, 1);
  const t = encodeURIComponent(tenant);
  const usage = await api(`/v1/usage?from_ms=${from}&to_ms=${to}&tenant=${t}`);
  const jobs = new Map();
  for (let after = 0; ;) {
    const page = await api(`/v1/jobs?limit=1000&after=${after}&tenant=${t}`);
    for (const j of page.jobs) jobs.set(String(j.id), j);
    if (!page.next || page.next <= after) break;
    after = page.next;
  }
  const cur = csvField(usage.currency || "USD");
  const total = { gpu_hours: 0, cpu_hours: 0, memory_gib_hours: 0, gpu_cost: 0, cpu_cost: 0, mem_cost: 0, cost: 0 };
  let out = "tenant,month,job,name,user,state,gpu_hours,cpu_hours,memory_gib_hours,gpu_cost,cpu_cost,mem_cost,cost," +
    "currency\n";
  // Job ids ascending, as the ledger's map has them.
  const ids = Object.keys(usage.jobs || {}).sort((a, b) => Number(a) - Number(b));
  for (const id of ids) {
    const u = usage.jobs[id], j = jobs.get(id);
    out += [csvField(tenant), month, id, csvField(j ? j.name : ""), csvField(j ? (j.submitted_by || "-") : "-"),
      j ? j.state : "", usageCsv(u), cur].join(",") + "\n";
    for (const k of Object.keys(total)) total[k] += u[k] || 0;
  }
  return out + [csvField(tenant), month, "total", "", "", "", usageCsv(total), cur].join(",") + "\n";
}

/** Offers `text` as a file download named `name`. */
function download(name, text, type = "text/csv") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

/**
 * The monthly statement form: a tenant, a month, and its CSV. Built once per visit of the page (the page's refresh
 * keeps what was picked); `setTenants` brings its list up to date.
 */
function statementForm() {
  const now = new Date();
  const thisMonth = `${now.getUTCFullYear()}-${String(now.getUTCMonth() + 1).padStart(2, "0")}`;
  const sel = h("select", { id: "st-tenant", name: "tenant" });
  const month = h("input", { id: "st-month", name: "month", type: "month", value: thisMonth, required: true });
  const err = h("p", { class: "field-error", id: "err-st", role: "alert" });
  const go = async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    if (!/^\d{4}-(0[1-9]|1[0-2])$/.test(month.value)) { err.textContent = "month: pick a month (YYYY-MM)"; return; }
    try {
      download(`statement-${sel.value}-${month.value}.csv`, await statementCsv(sel.value, month.value));
    } catch (e) {
      err.textContent = e.message || String(e);
    }
  };
  const form = h("form", { id: "statement-form", class: "inline-form", onsubmit: go, novalidate: true },
    h("div", {}, h("label", { for: "st-tenant" }, "Tenant"), sel),
    h("div", {}, h("label", { for: "st-month" }, "Month (UTC)"), month),
    h("button", { type: "submit", id: "st-download" }, "Download statement (CSV)"), err);
  form.setTenants = (names) => {
    const picked = sel.value;
    sel.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    if (names.includes(picked)) sel.value = picked;
  };
  return form;
}

// ---------------------------------------------------------------- tenants

async function tenants() {
  const body = h("div", {});
  const statement = statementForm();
  setMain("Tenants", body, isAdmin() ? tenantAdmin() : null);
  const draw = async () => {
    const now = new Date();
    // The UTC month, as `gpunet report --month` and the statements count it.
    const month = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1);
    const [ts, usage] = await Promise.all([api("/v1/tenants"), api(`/v1/usage?from_ms=${month}`)]);
    statement.setTenants(ts.map((t) => t.name));
    body.replaceChildren(
      h("p", { class: "muted" }, `Spend is this month's (since ${new Date(month).toISOString().slice(0, 10)} UTC), from the ` +
        "billing ledger, per second of use, running jobs included; GPUs, CPU and memory are priced apart."),
      table([{ label: "Tenant" }, { label: "GPUs in use vs quota" }, { label: "Guarantee", num: true },
        { label: "Limit", num: true }, { label: "CPU guarantee", num: true }, { label: "CPU limit", num: true },
        { label: "Memory guarantee", num: true }, { label: "Memory limit", num: true },
        { label: "Running", num: true }, { label: "Queued", num: true },
        { label: "Weight", num: true }, { label: "Fair-share usage (GPU-h, decayed)", num: true },
        { label: "GPU-hours this month", num: true }, { label: "GPU spend", num: true },
        { label: "CPU spend", num: true }, { label: "Memory spend", num: true },
        { label: "Spend this month", num: true }],
      ts.map((t) => {
        const q = t.quota || {};
        const g = q.guarantee_gpus, l = q.limit_gpus ?? g;
        const u = usage.tenants[t.name] || { gpu_hours: 0, gpu_cost: 0, cpu_cost: 0, mem_cost: 0, cost: 0 };
        const cur = usage.currency || "USD";
        return [h("strong", {}, t.name), quotaBar(t.gpus_used, g, l), g ?? "—", l ?? "—",
          q.guarantee_cpu ?? "—", q.limit_cpu ?? q.guarantee_cpu ?? "—",
          q.guarantee_memory ?? "—", q.limit_memory ?? q.guarantee_memory ?? "—", String(t.running),
          String(t.queued), num(t.weight, 2), num(t.fair_share_usage_gpu_hours, 3), num(u.gpu_hours, 3),
          money(u.gpu_cost || 0, cur), money(u.cpu_cost || 0, cur), money(u.mem_cost || 0, cur), money(u.cost, cur)];
      }), "No tenants."),
      h("h2", {}, "Monthly statement"),
      h("p", { class: "muted" }, "One line per job billed in the month, then the total: the same CSV as `gpunet " +
        "report --statement --tenant NAME --month YYYY-MM`."),
      statement,
      h("h2", {}, "This month per user"),
      h("p", { class: "muted" }, "The same ledger figures as `gpunet report --by user --month YYYY-MM` (which adds " +
        "jobs, waits, failures and preemptions, as a table, JSON or CSV) and `gpunet report --statement --tenant " +
        "NAME --month YYYY-MM` (a tenant's monthly statement as CSV)."),
      table([{ label: "Tenant/user" }, { label: "GPU-hours", num: true }, { label: "GPU utilisation", num: true },
        { label: "GPU spend", num: true }, { label: "CPU spend", num: true }, { label: "Memory spend", num: true },
        { label: "Spend", num: true }],
      Object.entries(usage.by_user || {}).map(([k, u]) => {
        const cur = usage.currency || "USD";
        return [k, num(u.gpu_hours, 3), utilisation(u), money(u.gpu_cost || 0, cur), money(u.cpu_cost || 0, cur),
          money(u.mem_cost || 0, cur), money(u.cost, cur)];
      }), "No use this month."),
      h("h2", {}, "This month per GPU model and lifecycle"),
      h("p", { class: "muted" }, "On-demand, spot and reserved GPUs apart, as `gpunet bill --by model --month " +
        "YYYY-MM` shows them."),
      table([{ label: "Model/lifecycle" }, { label: "GPU-hours", num: true }, { label: "GPU utilisation", num: true },
        { label: "GPU spend", num: true }, { label: "CPU spend", num: true }, { label: "Memory spend", num: true },
        { label: "Spend", num: true }],
      Object.entries(usage.by_model || {}).map(([k, u]) => {
        const cur = usage.currency || "USD";
        return [k, num(u.gpu_hours, 3), utilisation(u), money(u.gpu_cost || 0, cur), money(u.cpu_cost || 0, cur),
          money(u.mem_cost || 0, cur), money(u.cost, cur)];
      }), "No use this month."));
  };
  S.refresh = draw;
  S.timer = setInterval(() => draw().catch(() => {}), 15000);
  await draw();
}

/** Admin tools: create a tenant (with a GPU quota) and issue tokens; a new token is shown once. */
function tenantAdmin() {
  const out = h("div", { id: "tenant-admin-result", "aria-live": "polite" });
  const field = (id, label, attrs) => {
    const err = h("p", { class: "field-error", id: "err-" + id });
    const el = h("input", { id, name: id, "aria-describedby": "err-" + id, ...attrs });
    return { el, err, box: h("div", {}, h("label", { for: id }, label), el, err) };
  };
  const name = field("t-name", "Name", { type: "text", required: true, placeholder: "team-a" });
  const weight = field("t-weight", "Fair-share weight", { type: "number", value: "1", step: "0.1", min: "0" });
  const guar = field("t-guarantee", "Guaranteed GPUs", { type: "number", min: "0", placeholder: "none" });
  const limit = field("t-limit", "GPU limit (with borrowing)", { type: "number", min: "0", placeholder: "= guarantee" });
  const cpu = field("t-cpu", "Guaranteed CPU (cores or 500m)", { type: "text", placeholder: "none" });
  const cpuLimit = field("t-cpu-limit", "CPU limit", { type: "text", placeholder: "= guarantee" });
  const mem = field("t-mem", "Guaranteed memory (256Gi)", { type: "text", placeholder: "none" });
  const memLimit = field("t-mem-limit", "Memory limit", { type: "text", placeholder: "= guarantee" });
  const fields = { name, weight, quota: guar, guarantee_gpus: guar, limit_gpus: limit, guarantee_cpu: cpu,
    limit_cpu: cpuLimit, guarantee_memory: mem, limit_memory: memLimit };
  const quotaFields = [["guarantee_gpus", guar, Number], ["limit_gpus", limit, Number], ["guarantee_cpu", cpu, String],
    ["limit_cpu", cpuLimit, String], ["guarantee_memory", mem, String], ["limit_memory", memLimit, String]];
  /** The quota fields filled in, over `base` (the fields left empty keep their values). */
  const quotaOf = (base) => {
    const q = { ...(base || {}) };
    for (const [k, f, conv] of quotaFields) if (f.el.value.trim()) q[k] = conv(f.el.value.trim());
    return q;
  };
  const showToken = (t) => out.replaceChildren(h("div", { class: "ok-box", role: "status" },
    h("p", {}, `Token for ${t.tenant} (shown once; only its hash is stored):`),
    h("pre", { class: "spec", id: "new-token", tabindex: "0" }, t.token)));
  const create = async (e) => {
    e.preventDefault();
    for (const f of [name, weight, guar, limit, cpu, cpuLimit, mem, memLimit]) {
      f.el.removeAttribute("aria-invalid"); f.err.textContent = "";
    }
    out.replaceChildren();
    const req = { name: name.el.value.trim() };
    if (weight.el.value) req.weight = Number(weight.el.value);
    const q = quotaOf({});
    if (Object.keys(q).length) req.quota = q;
    try {
      showToken(await api("/v1/tenants", { method: "POST", body: JSON.stringify(req) }));
      if (S.refresh) await S.refresh();
    } catch (x) {
      const key = x.field ? x.field.split(/[.[]/).pop() : null;
      const f = fields[key] || fields[x.field ? x.field.split(/[.[]/)[0] : ""];
      if (f) { f.el.setAttribute("aria-invalid", "true"); f.err.textContent = x.message; f.el.focus(); }
      else out.replaceChildren(h("div", { class: "error-box", role: "alert" }, x.message));
    }
  };
  return h("details", { class: "card", style: null },
    h("summary", {}, "Admin: create a tenant, set a quota or issue a token"),
    h("form", { id: "tenant-form", onsubmit: create, novalidate: true },
      h("div", { class: "form-grid" }, name.box, weight.box, guar.box, limit.box, cpu.box, cpuLimit.box, mem.box,
        memLimit.box),
      h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Create tenant"),
        h("button", { type: "button", onclick: async () => {
          const n = name.el.value.trim();
          if (!n) { name.err.textContent = "Enter the tenant's name."; name.el.focus(); return; }
          try { showToken(await api(`/v1/tenants/${encodeURIComponent(n)}/tokens`, { method: "POST" })); }
          catch (x) { out.replaceChildren(h("div", { class: "error-box", role: "alert" }, x.message)); }
        } }, "Issue another token for this name"),
        h("button", { type: "button", id: "set-quota", onclick: async () => {
          const n = name.el.value.trim();
          for (const f of [name, guar, limit, cpu, cpuLimit, mem, memLimit]) {
            f.el.removeAttribute("aria-invalid"); f.err.textContent = "";
          }
          if (!n) { name.err.textContent = "Enter the tenant's name."; name.el.focus(); return; }
          try {
            // The fields left empty keep the tenant's current values (as `gpunet quota` does).
            const cur = (await api("/v1/tenants")).find((t) => t.name === n);
            const q = quotaOf(cur && cur.quota);
            await api(`/v1/tenants/${encodeURIComponent(n)}/quota`, { method: "PUT", body: JSON.stringify(q) });
            out.replaceChildren(h("div", { class: "ok-box", role: "status" }, `Quota of ${n} set.`));
            if (S.refresh) await S.refresh();
          } catch (x) {
            const f = fields[x.field ? x.field.split(/[.[]/).pop() : ""];
            if (f) { f.el.setAttribute("aria-invalid", "true"); f.err.textContent = x.message; f.el.focus(); }
            else out.replaceChildren(h("div", { class: "error-box", role: "alert" }, x.message));
          }
        } }, "Set these quota fields on the tenant"))),
    out);
}

function quotaBar(used, guarantee, limit) {
  const cap = limit || guarantee || Math.max(used, 1);
  const w = Math.min(100, (100 * used) / cap);
  const over = guarantee !== undefined && guarantee !== null && used > guarantee;
  const label = `${used} GPUs in use` + (guarantee !== undefined && guarantee !== null ? `, guarantee ${guarantee}` : "") +
    (limit ? `, limit ${limit}` : ", no limit");
  const bar = h("div", { class: "bar", role: "img", "aria-label": label, title: label }, h("span", { class: over ? "over" : "" }));
  bar.firstChild.style.width = w + "%";
  if (guarantee && limit && limit > guarantee) {
    const mark = h("i", {});
    mark.style.left = (100 * guarantee) / limit + "%";
    bar.append(mark);
  }
  return h("div", {}, bar, h("span", { class: "muted" }, `${used}` + (limit ? ` / ${limit}` : "") + " GPUs"));
}

// ---------------------------------------------------------------- tokens

/** Tokens: the admin sees and manages every token, a tenant admin its tenant's; a new token is shown once. */
async function tokens() {
  if (!managesTokens()) {
    setMain("Tokens", h("p", { class: "muted" }, "Tokens are managed by the admin and by a tenant's admins."));
    return;
  }
  const body = h("div", { id: "token-list" });
  const out = h("div", { id: "token-result", "aria-live": "polite" });
  const field = (id, label, el) => {
    const err = h("p", { class: "field-error", id: "err-" + id });
    el.setAttribute("id", id);
    el.setAttribute("aria-describedby", "err-" + id);
    return { el, err, box: h("div", {}, h("label", { for: id }, label), el, err) };
  };
  const user = field("tok-user", "User", h("input", { type: "text", required: true, placeholder: "alice" }));
  const roles = isAdmin() ? ["tenant", "tenant-admin", "admin", "join"] : ["tenant", "tenant-admin"];
  const role = field("tok-role", "Role", h("select", {}, roles.map((r) => h("option", { value: r }, r))));
  const tenantSel = h("select", {}, h("option", { value: "" }, "—"));
  const tenant = field("tok-tenant", "Tenant", tenantSel);
  const expires = field("tok-expires", "Expires in", h("input", { type: "text", placeholder: "90d (empty: never)" }));
  const fields = { user, role, tenant, expires_in: expires };
  if (isAdmin()) {
    for (const t of await api("/v1/tenants")) tenantSel.append(h("option", { value: t.name }, t.name));
  } else {
    tenantSel.replaceChildren(h("option", { value: S.me.tenant }, S.me.tenant));
    tenantSel.disabled = true;
  }
  const draw = async () => {
    const list = await api("/v1/tokens");
    list.sort((a, b) => (b.created_ms || 0) - (a.created_ms || 0));
    const mine = S.me.token && S.me.token.id;
    body.replaceChildren(table([{ label: "Id" }, { label: "Role" }, { label: "Tenant" }, { label: "User" },
      { label: "Created" }, { label: "Expires" }, { label: "" }],
    list.map((t) => [h("code", {}, t.id), t.role, t.tenant || "—", t.user || "—", fmtTime(t.created_ms),
      t.expires_ms ? fmtTime(t.expires_ms) : "never",
      t.id === mine ? h("span", { class: "muted" }, "this session") : h("button", { type: "button", class: "danger",
        "aria-label": `Revoke token ${t.id}`, onclick: async () => {
          if (!confirm(`Revoke token ${t.id} (${t.user || t.role})? It stops working at once.`)) return;
          try {
            await api(`/v1/tokens/${encodeURIComponent(t.id)}/revoke`, { method: "POST" });
            toast(`Token ${t.id} revoked`);
            await draw();
          } catch (e) { toast(e.message, true); }
        } }, "Revoke")]), "No tokens."));
  };
  const create = async (e) => {
    e.preventDefault();
    for (const f of Object.values(fields)) { f.el.removeAttribute("aria-invalid"); f.err.textContent = ""; }
    out.replaceChildren();
    const req = { user: user.el.value.trim(), role: role.el.value };
    if (!req.user) { user.err.textContent = "Enter who the token is for."; user.el.focus(); return; }
    if (isAdmin() && (req.role === "tenant" || req.role === "tenant-admin")) req.tenant = tenantSel.value || undefined;
    if (expires.el.value.trim()) req.expires_in = expires.el.value.trim();
    try {
      const t = await api("/v1/tokens", { method: "POST", body: JSON.stringify(req) });
      out.replaceChildren(h("div", { class: "ok-box", role: "status" },
        h("p", {}, `Token for ${t.user}` + (t.tenant ? ` of ${t.tenant}` : "") + ` (${t.role}; shown once, only its hash is stored):`),
        h("pre", { class: "spec", id: "new-user-token", tabindex: "0" }, t.token)));
      await draw();
    } catch (x) {
      const f = fields[x.field ? x.field.split(/[.[]/)[0] : ""];
      if (f) { f.el.setAttribute("aria-invalid", "true"); f.err.textContent = x.message; f.el.focus(); }
      else out.replaceChildren(h("div", { class: "error-box", role: "alert" }, x.message));
    }
  };
  setMain("Tokens", h("details", { class: "card", open: true },
    h("summary", {}, isAdmin() ? "Create a token" : `Create a token for ${S.me.tenant}`),
    h("form", { id: "token-form", onsubmit: create, novalidate: true },
      h("div", { class: "form-grid" }, user.box, role.box, tenant.box, expires.box),
      h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Create token"))),
    out), body);
  S.refresh = draw;
  await draw();
}

// ---------------------------------------------------------------- nodes

async function nodes() {
  const body = h("div", {});
  setMain("Nodes", body);
  const draw = async () => {
    const ns = await api("/v1/nodes");
    body.replaceChildren(table([{ label: "Node" }, { label: "State" }, { label: "GPUs" }, { label: "Free", num: true },
      { label: "Isolation" }, { label: "Labels" }, { label: "Jobs" }, { label: isAdmin() ? "Actions" : "" }],
    ns.map((n) => [h("strong", {}, n.name), h("span", {}, badge(n.state), n.fake ? [" ", badge("fake")] : null),
      `${n.gpus} × ${n.gpu_model || "—"}`, String(n.free_gpus), n.labels.isolation || "none reported",
      h("div", {}, Object.entries(n.labels).filter(([k]) => k !== "isolation").map(([k, v]) => h("span", { class: "chip" },
        `${k}=${v}`))),
      h("div", {}, n.jobs.length ? n.jobs.map((j, i) => [i ? ", " : "", jobLink(j)]) : "—"),
      isAdmin() ? nodeActions(n) : ""]), "No nodes."));
  };
  S.refresh = draw;
  S.timer = setInterval(() => draw().catch(() => {}), 15000);
  await draw();
}

function nodeActions(n) {
  const act = (a, text, cls) => h("button", { type: "button", class: cls || "", "aria-label": `${text} ${n.name}`,
    onclick: async () => {
      if (a === "drain" && !confirm(`Drain ${n.name}? Its jobs are moved elsewhere under their restart policy.`)) return;
      try {
        await api(`/v1/nodes/${encodeURIComponent(n.name)}/${a}`, { method: "POST" });
        toast(`${n.name}: ${a} done`);
        if (S.refresh) await S.refresh();
      } catch (e) { toast(e.message, true); }
    } }, text);
  return h("div", { class: "row" }, n.state === "ready" ? [act("cordon", "Cordon"), act("drain", "Drain", "danger")]
    : n.state === "lost" ? null : act("uncordon", "Uncordon"));
}

// ---------------------------------------------------------------- start

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const input = document.getElementById("login-token");
    const err = document.getElementById("login-error");
    err.textContent = "";
    input.removeAttribute("aria-invalid");
    const t = input.value.trim();
    if (!t) { err.textContent = "Enter a token."; input.setAttribute("aria-invalid", "true"); return; }
    try {
      await login(t);
    } catch (x) {
      S.token = null;
      input.setAttribute("aria-invalid", "true");
      err.textContent = x.status === 401 ? "This token is not known to the server." : x.message;
      input.focus();
    }
  });
  document.getElementById("logout").addEventListener("click", () => logout());
  window.addEventListener("hashchange", route);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) {
    login(saved).catch(() => logout());
  } else {
    logout();
  }
});
