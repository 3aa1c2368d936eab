"""The web console: one server-rendered page whose small script polls the JSON API."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>walstream</title>
<style>
  :root { --fg:#1d2330; --muted:#6b7385; --line:#e3e6ec; --bg:#f6f7f9; --card:#fff;
          --ok:#1f8a4c; --warning:#b7791f; --error:#c53030; --paused:#5a67d8; --standby:#718096; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
         color:var(--fg); background:var(--bg); }
  header { display:flex; align-items:center; gap:16px; padding:14px 24px; background:var(--card);
           border-bottom:1px solid var(--line); position:sticky; top:0; z-index:1; }
  header h1 { font-size:18px; margin:0; letter-spacing:.2px; }
  header .spacer { flex:1; }
  header input { width:220px; padding:6px 8px; border:1px solid var(--line); border-radius:6px; }
  main { padding:20px 24px; display:grid; gap:20px; max-width:1400px; margin:0 auto; }
  section { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
  section h2 { font-size:15px; margin:0 0 10px; display:flex; gap:10px; align-items:center; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:7px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
  th { color:var(--muted); font-weight:600; font-size:12px; text-transform:uppercase; letter-spacing:.4px; }
  td.num, th.num { text-align:right; font-variant-numeric: tabular-nums; }
  tr:last-child td { border-bottom:none; }
  .badge { display:inline-block; padding:1px 8px; border-radius:999px; font-size:12px; font-weight:600;
           color:#fff; background:var(--muted); }
  .badge.ok { background:var(--ok); } .badge.warning { background:var(--warning); }
  .badge.error { background:var(--error); } .badge.paused { background:var(--paused); }
  .badge.standby { background:var(--standby); }
  .reasons { color:var(--muted); font-size:12px; max-width:520px; }
  .empty { color:var(--muted); padding:8px; }
  button { font:inherit; font-size:12px; padding:4px 10px; border-radius:6px; cursor:pointer;
           border:1px solid var(--line); background:#fff; }
  button:hover { background:#eef1f6; }
  button.danger { color:var(--error); border-color:#f1c8c8; }
  .bar { width:160px; height:8px; background:#e9ecf2; border-radius:4px; overflow:hidden; display:inline-block; vertical-align:middle; }
  .bar > span { display:block; height:100%; background:var(--ok); }
  #notice { font-size:13px; color:var(--muted); }
  #notice.bad { color:var(--error); }
  pre { background:#f3f4f7; padding:10px; border-radius:6px; overflow:auto; max-height:280px; margin:6px 0 0;
        white-space:pre-wrap; word-break:break-all; }
  select { padding:4px 6px; border:1px solid var(--line); border-radius:6px; font:inherit; font-size:12px; }
</style>
</head>
<body>
<header>
  <h1>walstream</h1>
  <span id="overall" class="badge" data-testid="overall">…</span>
  <span id="notice">loading…</span>
  <span class="spacer"></span>
  <label for="token" style="color:var(--muted);font-size:12px">API token (for actions)</label>
  <input id="token" type="password" autocomplete="off" placeholder="token (read or management)" title="server.read_token shows dead letters, backfills and errors; server.token also acts">
</header>
<main>
  <section><h2>Sources</h2>
    <table><thead><tr><th>source</th><th>status</th><th>role</th><th class="num">slot lag</th>
      <th class="num">WAL kept</th><th class="num">last report</th><th class="num">ingested</th>
      <th>why</th></tr></thead><tbody id="sources"></tbody></table>
  </section>
  <section><h2>Sinks</h2>
    <table><thead><tr><th>sink</th><th>type</th><th>status</th><th class="num">rate/s</th>
      <th class="num">delivered</th><th class="num">latency</th><th class="num">parked</th>
      <th class="num">dead letters</th><th>verified</th><th>why</th><th></th></tr></thead>
      <tbody id="sinks"></tbody></table>
  </section>
  <section><h2>Dead letters <select id="dl-sink"><option value="">all sinks</option></select>
      <span id="dl-total" class="reasons"></span></h2>
    <table><thead><tr><th>id</th><th>sink</th><th>group</th><th>lsn:seq</th><th>table</th>
      <th>action</th><th class="num">attempts</th><th>last error</th><th></th></tr></thead>
      <tbody id="dead"></tbody></table>
    <div id="dl-detail"></div>
  </section>
  <section><h2>Backfills</h2>
    <table><thead><tr><th>id</th><th>sink</th><th>table</th><th>status</th><th>progress</th>
      <th class="num">rows</th><th class="num">rate/s</th><th class="num">ETA</th><th></th></tr></thead>
      <tbody id="backfills"></tbody></table>
  </section>
</main>
<script>
const $ = (id) => document.getElementById(id);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
const num = (v) => v == null ? "–" : Number(v).toLocaleString("en");
const bytes = (v) => { if (v == null) return "–"; const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; } return (i ? v.toFixed(1) : v) + " " + u[i]; };
const secs = (v) => v == null ? "–" : v < 120 ? v.toFixed(1) + " s" : (v / 60).toFixed(1) + " min";
const group = (g) => esc(String(g ?? "").split("\u001f").join(" · "));
let shown = null;  // the dead letter whose details are open
const badge = (s) => `<span class="badge ${esc(s)}">${esc(s)}</span>`;
const ago = (iso) => iso ? secs((Date.now() - Date.parse(iso)) / 1000) + " ago" : "";
function verified(v) {  // the sink's newest verification (`walstream verify`, `verify:`)
  const tag = (cls, text) => `<span class="badge ${cls}">${esc(text)}</span>`;
  if (!v) return "–";
  if (v.status === "running") return `${tag("paused", "running")} ${esc(v.comparing || "")}`;
  if (v.status === "failed") return `${tag("warning", "could not compare")} ${ago(v.finished_at)}`;
  if (v.status === "cancelled") return `cancelled ${ago(v.finished_at)}`;
  return v.rows_different
    ? `${tag("error", num(v.rows_different) + " differ")} ${esc(v.tables_different.join(", "))} · ${ago(v.finished_at)}`
    : `${tag("ok", "equal")} ${num(v.tables_compared)} table(s) · ${ago(v.finished_at)}`;
}
const tokenBox = $("token");
tokenBox.value = sessionStorage.getItem("walstream-token") || "";
tokenBox.addEventListener("change", () => { sessionStorage.setItem("walstream-token", tokenBox.value); refresh(); });
const auth = () => tokenBox.value ? {"Authorization": "Bearer " + tokenBox.value} : {};
async function getJSON(path) {
  const r = await fetch(path, {headers: auth()});
  let body = {}; try { body = await r.json(); } catch (e) {}
  if (!r.ok) { const d = body.detail || {}; throw new Error(`${d.problem || r.statusText}${d.fix ? " — " + d.fix : ""}`); }
  return body;
}
const NEEDS_TOKEN = "enter a read token (server.read_token or server.token) above to see them";

let heldUntil = 0;  // an action's result stays up this long before "updated ..." replaces it
function notice(text, bad, hold) {
  const n = $("notice"); n.textContent = text; n.className = bad ? "bad" : "";
  if (hold) heldUntil = Date.now() + 5000;
}

async function act(path, label) {
  const r = await fetch(path, {method: "POST", headers: auth()});
  let body = {}; try { body = await r.json(); } catch (e) {}
  if (!r.ok) { const d = body.detail || {}; notice(`${label}: ${d.problem || r.statusText}${d.fix ? " — " + d.fix : ""}`, true, true); }
  else notice(`${label}: done`, false, true);
  refresh();
}

async function showLetter(id) {
  shown = id;
  const r = await fetch(`/api/dead-letters/${id}`, {headers: auth()});
  if (!r.ok) { $("dl-detail").innerHTML = ""; return; }
  const d = await r.json();
  $("dl-detail").innerHTML = `<h2>dead letter ${esc(d.id)}</h2><div class="reasons">key ${esc(d.key)} · idempotency key ${esc(d.idempotency_key)}</div>` +
    `<pre data-testid="dl-message">${esc(d.message)}</pre><pre>${esc(JSON.stringify(d.errors, null, 2))}</pre>`;
}

function render(health, dead, backfills) {
  $("overall").className = "badge " + health.status; $("overall").textContent = health.status;
  $("sources").innerHTML = health.sources.map((s) => `<tr data-testid="source-${esc(s.name)}">
    <td>${esc(s.name)}</td><td>${badge(s.status)}</td><td>${esc(s.role)}</td>
    <td class="num">${bytes(s.lag_bytes)}</td><td class="num">${bytes(s.retained_wal_bytes)}</td>
    <td class="num">${secs(s.last_report_age_seconds)}</td><td class="num">${num(s.ingested)}</td>
    <td class="reasons">${esc(s.reasons.join("; "))}</td></tr>`).join("") || `<tr><td class="empty" colspan="8">no sources</td></tr>`;
  $("sinks").innerHTML = health.sinks.map((k) => `<tr data-testid="sink-${esc(k.name)}">
    <td>${esc(k.name)}</td><td>${esc(k.type)}</td><td data-testid="sink-status">${badge(k.status)}</td>
    <td class="num">${num(k.rate_per_second)}</td><td class="num" data-testid="sink-delivered">${num(k.delivered)}</td>
    <td class="num">${secs(k.latency_seconds)}</td><td class="num">${num(k.parked)}</td>
    <td class="num">${num(k.dead_letters)}</td><td data-testid="sink-verified">${verified(k.verification)}</td>
    <td class="reasons">${esc(k.reasons.join("; "))}</td>
    <td>${k.status === "paused"
      ? `<button data-act="/api/sinks/${encodeURIComponent(k.name)}/resume" data-label="resume ${esc(k.name)}">Resume</button>`
      : `<button data-act="/api/sinks/${encodeURIComponent(k.name)}/pause" data-label="pause ${esc(k.name)}">Pause</button>`}</td></tr>`).join("");
  const sel = $("dl-sink"), chosen = sel.value;
  sel.innerHTML = `<option value="">all sinks</option>` + health.sinks.map((k) =>
    `<option value="${esc(k.name)}"${k.name === chosen ? " selected" : ""}>${esc(k.name)}</option>`).join("");
  if (dead === null) {
    $("dl-total").textContent = "";
    $("dead").innerHTML = `<tr><td class="empty" colspan="9">${esc(NEEDS_TOKEN)}</td></tr>`;
    $("backfills").innerHTML = `<tr><td class="empty" colspan="9">${esc(NEEDS_TOKEN)}</td></tr>`;
    shown = null; $("dl-detail").innerHTML = "";
    return;
  }
  $("dl-total").textContent = `${num(dead.total)} in all`;
  $("dead").innerHTML = dead.items.map((d) => `<tr data-testid="dead-${d.id}">
    <td><a href="#" data-show="${d.id}">${d.id}</a></td><td>${esc(d.sink)}</td><td>${group(d.group)}</td>
    <td>${d.lsn}:${d.seq}</td><td>${esc(d.table)}</td><td>${esc(d.action)}</td><td class="num">${d.attempts}</td>
    <td class="reasons">${esc(d.last_error || "(behind its group's head)")}</td>
    <td><button data-act="/api/dead-letters/${d.id}/retry" data-label="retry ${d.id}">Retry</button>
        <button class="danger" data-act="/api/dead-letters/${d.id}/discard" data-label="discard ${d.id}">Discard</button></td></tr>`).join("")
    || `<tr><td class="empty" colspan="9">no dead letters</td></tr>`;
  if (shown !== null && !dead.items.some((d) => String(d.id) === String(shown))) {
    shown = null; $("dl-detail").innerHTML = "";
  }
  $("backfills").innerHTML = backfills.map((b) => {
    const pct = b.status === "done" ? 100 : b.rows_estimated ? Math.min(100, 100 * b.rows_read / b.rows_estimated) : 0;
    return `<tr data-testid="backfill-${b.id}"><td>${b.id}</td><td>${esc(b.sink)}</td><td>${esc(b.table)}</td>
      <td><span class="badge ${({done: "ok", failed: "error", cancelled: "standby"})[b.status] || "paused"}">${esc(b.status)}</span></td>
      <td><span class="bar"><span style="width:${pct.toFixed(1)}%"></span></span> ${pct.toFixed(0)}%</td>
      <td class="num">${num(b.rows_read)} / ${num(b.rows_estimated)}</td><td class="num">${num(b.rate_per_second)}</td>
      <td class="num">${secs(b.eta_seconds)}</td>
      <td>${["pending", "running"].includes(b.status) ? `<button class="danger" data-act="/api/backfills/${b.id}/cancel" data-label="cancel backfill ${b.id}">Cancel</button>` : ""}</td></tr>`;
  }).join("") || `<tr><td class="empty" colspan="9">no backfills</td></tr>`;
}

async function refresh() {
  let h;
  try { h = await fetch("/health").then((r) => r.json()); }
  catch (e) { notice("cannot reach walstream: " + e, true); return; }
  if (!tokenBox.value) {  // /health alone: statuses and error kinds, no row values
    render(h, null, null);
    if (Date.now() > heldUntil) notice("updated " + new Date().toLocaleTimeString() + " · " + NEEDS_TOKEN);
    return;
  }
  try {
    const sink = $("dl-sink").value;
    const [sources, sinks, d, b] = await Promise.all([
      getJSON("/api/sources"), getJSON("/api/sinks"),
      getJSON("/api/dead-letters?limit=50" + (sink ? "&sink=" + encodeURIComponent(sink) : "")),
      getJSON("/api/backfills"),
    ]);
    render({status: h.status, sources, sinks}, d, b);
    if (Date.now() > heldUntil) notice("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    render(h, null, null);
    if (Date.now() > heldUntil) notice("token: " + e.message, true);
  }
}

document.addEventListener("click", (e) => {
  const a = e.target.closest("[data-act]");
  if (a) { e.preventDefault(); act(a.dataset.act, a.dataset.label); return; }
  const s = e.target.closest("[data-show]");
  if (s) { e.preventDefault(); showLetter(s.dataset.show); }
});
$("dl-sink").addEventListener("change", refresh);
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
