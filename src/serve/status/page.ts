/**
 * The status page at `GET /` of `vsnap serve`: one self-contained HTML document (inlined here so it
 * ships inside the bundle), no framework, no external requests. It reads `/api/events` (server-sent
 * events over fetch, so the control token can go in the Authorization header) and falls back to
 * polling `/api/status` when the stream drops.
 * @internal
 */
export const STATUS_PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>vsnap serve</title>
<link rel="icon" href="data:,">
<style>
:root{--fg:#1d232a;--muted:#66707a;--line:#e3e7eb;--awake:#2f9e44;--held:#e8a33d;--asleep:#8a94a0;--failed:#d9480f;--free:#f1f3f5;--suspend:#748ffc}
body{font:14px/1.4 system-ui,sans-serif;color:var(--fg);margin:0;background:#fafbfc}
header{display:flex;gap:1rem;align-items:baseline;padding:.8rem 1.2rem;border-bottom:1px solid var(--line);background:#fff}
h1{font-size:1.1rem;margin:0}h2{font-size:.95rem;margin:1.2rem 0 .4rem}
main{padding:0 1.2rem 1.2rem;max-width:1100px}
table{border-collapse:collapse;width:100%;background:#fff}th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid var(--line)}
th{color:var(--muted);font-weight:500}.num{text-align:right;font-variant-numeric:tabular-nums}
.pill{display:inline-block;padding:0 .45rem;border-radius:.6rem;color:#fff;font-size:.8rem}
.awake{background:var(--awake)}.asleep{background:var(--asleep)}.held{background:var(--held)}.failed{background:var(--failed)}.waking,.suspending{background:var(--suspend)}
.bar{display:flex;height:14px;border-radius:3px;overflow:hidden;background:var(--free);min-width:200px}.bar span{display:block;height:100%}
#health.ok{color:var(--awake)}#health.degraded{color:var(--failed)}.muted{color:var(--muted)}
#login{display:none;gap:.5rem;padding:1rem 1.2rem}#login.show{display:flex}
.legend span{margin-right:.8rem}.legend i{display:inline-block;width:10px;height:10px;margin-right:.25rem;border-radius:2px}
</style></head><body>
<header><h1>vsnap serve</h1><span id="health" class="muted">connecting…</span><span id="updated" class="muted"></span></header>
<form id="login"><label>Control token <input id="token" type="password" autocomplete="off"></label><button>Show</button><span class="muted">the status is behind the control token</span></form>
<main>
<h2>Engines</h2>
<table><thead><tr><th>model</th><th>state</th><th>GPU</th><th class="num">memory awake</th><th class="num">asleep</th><th class="num">requests</th><th class="num">waiting</th><th>process</th></tr></thead><tbody id="engines"></tbody></table>
<h2>GPU budgets</h2><div class="legend muted"><span><i style="background:var(--awake)"></i>awake</span><span><i style="background:var(--held)"></i>held while asleep</span><span><i style="background:var(--free);border:1px solid var(--line)"></i>free</span></div>
<table><tbody id="gpus"></tbody></table>
<h2>RAM tier</h2><div id="ram" class="muted"></div>
<h2>Neighbour tier</h2><div id="neighbour" class="muted"></div>
<h2>Snapshots</h2>
<table><thead><tr><th>name</th><th>capture</th><th>created</th><th class="num">size</th><th class="num">captures</th><th>state</th></tr></thead><tbody id="snapshots"></tbody></table>
<h2>Queue</h2><div id="queue"></div>
<h2>Recent swaps</h2><div id="phases" class="legend muted"></div>
<svg id="chart" width="100%" height="40" role="img" aria-label="recent swaps"></svg>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const bytes = (n) => { if (n == null) return "–"; const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return (i ? n.toFixed(2) : n) + " " + u[i]; };
const ms = (s) => (s * 1000).toFixed(0) + " ms";
let token = sessionStorage.getItem("vsnap-token") || "";
const headers = () => (token ? { authorization: "Bearer " + token } : {});

function render(r) {
  window.vsnapStatus = r;
  $("health").textContent = r.health.status === "ok" ? "healthy" : "degraded: " + r.health.degraded.map((d) => d.engine + " (" + d.reason + ")").join(", ");
  $("health").className = r.health.status;
  $("updated").textContent = "updated " + new Date(r.at).toLocaleTimeString();
  $("engines").innerHTML = r.engines.map((e) => {
    const held = e.state === "asleep" && e.weightsHeldBytes > 0;
    const notReady = e.readiness && !e.readiness.ready;
    const label = notReady ? "not ready (" + e.readiness.phase + ")" : held ? "weights held on the GPU" : e.state;
    const cls = notReady ? (e.readiness.phase === "failed" ? "failed" : "waking") : held ? "held" : e.state;
    return "<tr data-engine='" + esc(e.name) + "'><td>" + esc(e.name) + (e.pinned ? " <span class=muted>(pinned)</span>" : "") + "</td><td><span class='pill " + esc(cls) + "'>" + esc(label) + "</span>" +
      (held ? " <span class=muted>" + bytes(e.weightsHeldBytes) + "</span>" : "") + (e.neighbourBytes > 0 ? " <span class=muted>" + bytes(e.neighbourBytes) + " parked on the neighbour</span>" : "") + (notReady ? " <span class=muted>" + esc(e.readiness.reason || "") + "</span>" : e.error ? " <span class=muted>" + esc(e.error) + "</span>" : "") +
      (e.snapshotProblem ? " <span class='pill failed'>snapshot damaged</span> <span class=muted>" + esc(e.snapshotProblem) + "</span>" : "") +
      (e.recovery ? " <span class='pill waking'>recovered</span> <span class=muted>" + esc("reloaded by the engine (" + e.recovery.reason + ", " + e.recovery.code + "); new snapshot: " + e.recovery.snapshot) + "</span>" : "") + "</td><td>" + e.devices.join(", ") + "</td><td class=num>" + bytes(e.memoryBytes) + "</td><td class=num>" + bytes(e.asleepBytes) +
      "</td><td class=num>" + e.leases + "</td><td class=num>" + e.waiting + "</td><td>" + (e.process ? esc(e.process.status) + (e.process.pid ? " (pid " + e.process.pid + ")" : "") : "<span class=muted>external</span>") + "</td></tr>";
  }).join("");
  $("gpus").innerHTML = r.gpus.map((g) => {
    const total = g.budgetBytes || Math.max(g.usedBytes, 1);
    const pct = (n) => Math.max(0, Math.min(100, (n / total) * 100)).toFixed(2) + "%";
    return "<tr><td>GPU " + g.device + "</td><td style='width:60%'><div class=bar title='" + bytes(g.usedBytes) + " of " + bytes(g.budgetBytes) + "'><span style='width:" + pct(g.awakeBytes) + ";background:var(--awake)'></span><span style='width:" + pct(g.heldBytes) + ";background:var(--held)'></span></div></td><td class=num>" +
      bytes(g.awakeBytes) + " awake, " + bytes(g.heldBytes) + " held, " + (g.budgetBytes == null ? "no budget" : bytes(Math.max(0, g.budgetBytes - g.usedBytes)) + " free of " + bytes(g.budgetBytes)) + "</td></tr>";
  }).join("");
  $("ram").textContent = r.ramTier ? bytes(r.ramTier.usedBytes) + " of " + bytes(r.ramTier.budgetBytes) + " used, " + r.ramTier.entries.length + " snapshot(s): " + r.ramTier.entries.map((e) => e.name + (e.durable ? "" : " (not yet durable)")).join(", ") : "no RAM tier configured (ramTierGiB: 0)";
  $("neighbour").textContent = r.neighbourTier ? "GPU " + r.neighbourTier.device + ": " + bytes(r.neighbourTier.usedBytes) + " of " + bytes(r.neighbourTier.budgetBytes) + " used, " + r.neighbourTier.entries.length + " parked cop" + (r.neighbourTier.entries.length === 1 ? "y" : "ies") + (r.neighbourTier.entries.length ? ": " + r.neighbourTier.entries.map((e) => e.engine || e.id).join(", ") : "") : "no neighbour tier configured (neighbourTier)";
  $("snapshots").innerHTML = r.snapshots.length ? r.snapshots.map((s) => "<tr data-snapshot='" + esc(s.name) + "'><td>" + esc(s.name) + "</td><td class=muted>" + esc(s.id || "–") + "</td><td>" + (s.createdAt ? esc(new Date(s.createdAt).toLocaleString()) : "–") + "</td><td class=num>" + bytes(s.bytes) + "</td><td class=num>" + (s.versions ?? "–") + "</td><td>" +
    (s.damaged ? "<span class='pill failed'>damaged</span> " + esc(s.reason || "") : s.durable === false ? "<span class='pill held'>not durable</span>" : "<span class='pill awake'>durable</span>") + "</td></tr>").join("") : "<tr><td colspan=6 class=muted>" + esc(r.snapshotsError || "no snapshots yet") + "</td></tr>";
  $("queue").textContent = r.queue.leases + " request(s) running, " + r.queue.waiting + " waiting for an engine";
  chart(r.swaps);
}

const PALETTE = ["#748ffc", "#2f9e44", "#e8a33d", "#d6336c", "#1098ad", "#7048e8", "#f76707", "#66a80f", "#868e96", "#c2255c"];
const phaseColor = new Map();
const colorOf = (name) => { if (!phaseColor.has(name)) phaseColor.set(name, PALETTE[phaseColor.size % PALETTE.length]); return phaseColor.get(name); };

function chart(swaps) {
  const svg = $("chart"), row = 18, left = 190, width = Math.max(svg.clientWidth || 800, 400) - left - 120;
  const max = Math.max(0.001, ...swaps.map((s) => s.seconds || 0));
  const shown = swaps.slice(-20).reverse();
  svg.setAttribute("height", String(Math.max(1, shown.length) * row + 4));
  svg.innerHTML = shown.length ? shown.map((s, i) => {
    const y = i * row + 2;
    let x = left, parts = "";
    const phases = s.phases && Object.keys(s.phases).length ? Object.entries(s.phases) : [[s.action, s.seconds || 0]];
    for (const [name, sec] of phases) { const w = (sec / max) * width; parts += "<rect x='" + x.toFixed(1) + "' y='" + y + "' width='" + Math.max(w, 1).toFixed(1) + "' height='" + (row - 5) + "' fill='" + colorOf(name) + "'><title>" + esc(name) + " " + ms(sec) + "</title></rect>"; x += w; }
    const label = new Date(s.at).toLocaleTimeString() + " " + s.action + " " + s.engine;
    return "<text x='0' y='" + (y + 11) + "' font-size='11'>" + esc(label.slice(0, 34)) + "</text>" + (s.ok ? parts + "<text x='" + (x + 4).toFixed(1) + "' y='" + (y + 11) + "' font-size='11'>" + ms(s.seconds) + (s.tier ? " from " + esc(s.tier) : "") + "</text>" : "<text x='" + left + "' y='" + (y + 11) + "' font-size='11' fill='var(--failed)'>failed: " + esc(s.error || "") + "</text>");
  }).join("") : "<text x='0' y='14' font-size='12' fill='var(--muted)'>no swaps yet</text>";
  $("phases").innerHTML = [...phaseColor.entries()].map(([n, c]) => "<span><i style='background:" + c + "'></i>" + esc(n) + "</span>").join("");
}

async function poll() {
  const r = await fetch("api/status", { headers: headers() });
  if (r.status === 401) { $("login").classList.add("show"); $("health").textContent = "needs the control token"; return false; }
  render(await r.json());
  return true;
}

async function live() {
  for (;;) {
    try {
      const r = await fetch("api/events", { headers: headers() });
      if (r.status === 401) { $("login").classList.add("show"); $("health").textContent = "needs the control token"; return; }
      $("login").classList.remove("show");
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\\n\\n")) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2);
          const data = ev.split("\\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\\n");
          if (ev.includes("event: status") && data) render(JSON.parse(data));
        }
      }
    } catch (e) { /* the agent went away: poll until it is back */ }
    $("health").textContent = "reconnecting…"; $("health").className = "muted";
    await new Promise((res) => setTimeout(res, 2000));
    try { if (!(await poll())) return; } catch (e) { /* still down */ }
  }
}

$("login").addEventListener("submit", (ev) => { ev.preventDefault(); token = $("token").value; sessionStorage.setItem("vsnap-token", token); $("login").classList.remove("show"); live(); });
live();
</script></body></html>
`;
