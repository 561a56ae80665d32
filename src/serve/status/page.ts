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
header{display:flex;flex-wrap:wrap;gap:0 1rem;align-items:baseline;padding:.8rem 1.2rem;border-bottom:1px solid var(--line);background:#fff}
h1{font-size:1.1rem;margin:0}h2{font-size:.95rem;margin:1.2rem 0 .4rem}
main{padding:0 1.2rem 1.2rem;max-width:1440px}
/* a table wider than the screen scrolls in its own box; shadows at the edges say there is more */
.scroll{overflow-x:auto;background:linear-gradient(to right,#fff 30%,rgba(255,255,255,0)),linear-gradient(to right,rgba(255,255,255,0),#fff 70%) 100% 0,radial-gradient(farthest-side at 0 50%,rgba(0,0,0,.18),rgba(0,0,0,0)),radial-gradient(farthest-side at 100% 50%,rgba(0,0,0,.18),rgba(0,0,0,0)) 100% 0;background-color:#fff;background-repeat:no-repeat;background-size:40px 100%,40px 100%,12px 100%,12px 100%;background-attachment:local,local,scroll,scroll}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid var(--line);white-space:nowrap}
td.wrap{white-space:normal;min-width:14rem}td.wrap-narrow{white-space:normal;min-width:7rem}
td.gpu-bar{width:45%}td.gpu-text{white-space:normal}
th{color:var(--muted);font-weight:500}.num{text-align:right;font-variant-numeric:tabular-nums}
.pill{display:inline-block;padding:0 .45rem;border-radius:.6rem;color:#fff;font-size:.8rem;white-space:nowrap}
.awake{background:var(--awake)}.asleep{background:var(--asleep)}.held{background:var(--held)}.failed{background:var(--failed)}.waking,.suspending{background:var(--suspend)}
.bar{display:flex;height:14px;border-radius:3px;overflow:hidden;background:var(--free);min-width:8rem}.bar span{display:block;height:100%}
#health.ok{color:var(--awake)}#health.degraded{color:var(--failed)}.muted{color:var(--muted)}
#login{display:none;flex-wrap:wrap;align-items:center;gap:.5rem;padding:1rem 1.2rem}#login.show{display:flex}
#login-error{color:var(--failed);font-weight:500}
.legend{display:flex;flex-wrap:wrap;gap:.2rem .8rem}.legend i{display:inline-block;width:12px;height:12px;margin-right:.3rem;border-radius:2px;vertical-align:-1px;box-shadow:inset 0 0 0 1px rgba(0,0,0,.25)}
/* pointing at (or focusing) a phase in the legend dims every other phase in the bars */
#phases [data-phase]{cursor:default;padding:0 .15rem;border-radius:3px}#phases [data-phase].on{background:var(--line);color:var(--fg)}
#chart.focus [data-phase]{opacity:.12}#chart.focus [data-phase].on{opacity:1}
#chart{font-size:11px}
.swap{display:flex;align-items:center;gap:.5rem;min-height:18px}
.swap-label{flex:0 0 14rem;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.swap-bar{flex:1 1 0;min-width:0;display:flex;height:13px}.swap-bar span{flex:0 1 auto;min-width:1px;height:100%}
.swap-value{flex:0 0 auto;white-space:nowrap}
.swap-error{flex:1 1 0;min-width:0;color:var(--failed);overflow-wrap:anywhere}
@media (max-width:640px){main,header,#login{padding-left:.6rem;padding-right:.6rem}.swap{flex-wrap:wrap;margin-bottom:.3rem}.swap-label{flex-basis:100%}#gpus td{display:block;width:auto;border-bottom:0}#gpus tr{display:block;border-bottom:1px solid var(--line);padding:.2rem 0}td.gpu-text{text-align:left}}
</style></head><body>
<header><h1>vsnap serve</h1><span id="health" class="muted">connecting…</span><span id="updated" class="muted"></span></header>
<form id="login"><label>Control token <input id="token" type="password" autocomplete="off"></label><button>Show</button><span class="muted">the status is behind the control token</span><span id="login-error" role="alert" hidden></span></form>
<main id="main" hidden>
<h2>Engines</h2>
<div class="scroll"><table><thead><tr><th>model</th><th>state</th><th>GPUs</th><th class="num">when awake</th><th class="num">when asleep</th><th class="num">requests</th><th class="num">queue</th><th>process</th></tr></thead><tbody id="engines"></tbody></table></div>
<h2>GPU budgets</h2><div class="legend muted"><span><i style="background:var(--awake)"></i>awake</span><span><i style="background:var(--held)"></i>held by asleep engines</span><span><i style="background:var(--free);border:1px solid var(--line)"></i>free</span></div>
<div class="scroll"><table><tbody id="gpus"></tbody></table></div>
<h2>RAM tier</h2><div id="ram" class="muted"></div>
<h2>Neighbour tier</h2><div id="neighbour" class="muted"></div>
<h2>Snapshots</h2>
<div class="scroll"><table><thead><tr><th>name</th><th>capture</th><th>created</th><th class="num">size</th><th class="num">stored</th><th class="num">captures</th><th>state</th></tr></thead><tbody id="snapshots"></tbody></table></div>
<h2>Queue</h2><div id="queue"></div>
<h2>Recent swaps</h2><div id="phases" class="legend muted"></div>
<div id="chart" role="list" aria-label="recent swaps"></div>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
// every value written into HTML goes through esc, numbers too (a report is data, never markup)
const bytes = (n) => { if (n == null) return "–"; if (typeof n !== "number") return esc(n); const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return (i ? n.toFixed(2) : n) + " " + u[i]; };
const ms = (s) => esc(typeof s === "number" ? (s * 1000).toFixed(0) + " ms" : s);
const num = (n) => esc(n);
let token = sessionStorage.getItem("vsnap-token") || "";
const headers = () => (token ? { authorization: "Bearer " + token } : {});

function render(r) {
  window.vsnapStatus = r;
  $("main").hidden = false;
  $("health").textContent = r.health.status === "ok" ? "healthy" : "degraded: " + r.health.degraded.map((d) => d.engine + " (" + d.reason + ")").join(", ");
  $("health").className = r.health.status;
  $("updated").textContent = "updated " + new Date(r.at).toLocaleTimeString();
  $("engines").innerHTML = r.engines.map((e) => {
    const held = e.state === "asleep" && e.weightsHeldBytes > 0;
    const notReady = e.readiness && !e.readiness.ready;
    const label = notReady ? "not ready (" + e.readiness.phase + ")" : held ? "weights held on the GPU" : e.state;
    const cls = notReady ? (e.readiness.phase === "failed" ? "failed" : "waking") : held ? "held" : e.state;
    return "<tr data-engine='" + esc(e.name) + "'><td>" + esc(e.name) + (e.pinned ? " <span class=muted>(pinned)</span>" : "") + "</td><td class=wrap><span class='pill " + esc(cls) + "'>" + esc(label) + "</span>" +
      (held ? " <span class=muted>" + bytes(e.weightsHeldBytes) + "</span>" : "") + (e.neighbourBytes > 0 ? " <span class=muted>" + bytes(e.neighbourBytes) + " parked on the neighbour</span>" : "") + (notReady ? " <span class=muted>" + esc(e.readiness.reason || "") + "</span>" : e.error ? " <span class=muted>" + esc(e.error) + "</span>" : "") +
      (e.snapshotProblem ? " <span class='pill failed'>snapshot damaged</span> <span class=muted>" + esc(e.snapshotProblem) + "</span>" : "") +
      (e.recovery ? " <span class='pill waking'>recovered</span> <span class=muted>" + esc("reloaded by the engine (" + e.recovery.reason + ", " + e.recovery.code + "); new snapshot: " + e.recovery.snapshot) + "</span>" : "") + "</td><td>" + esc([].concat(e.devices).join(", ")) +
      "</td><td class=num>" + bytes(e.memoryBytes) + " on GPU awake</td><td class=num>" + bytes(e.asleepBytes) + " on GPU asleep</td><td class=num>" + num(e.leases) + (e.leases === 1 ? " request" : " requests") + " in flight</td><td class=num>" + num(e.waiting) + " waiting</td><td class=wrap-narrow>" +
      (e.process ? esc(e.process.status) + (e.process.pid ? " (pid " + num(e.process.pid) + ")" : "") : "<span class=muted>external</span>") + "</td></tr>";
  }).join("");
  $("gpus").innerHTML = r.gpus.map((g) => {
    const total = g.budgetBytes || Math.max(g.usedBytes, 1);
    const pct = (n) => Math.max(0, Math.min(100, (n / total) * 100)).toFixed(2) + "%";
    return "<tr><td>GPU " + num(g.device) + "</td><td class=gpu-bar><div class=bar title='" + bytes(g.usedBytes) + " of " + bytes(g.budgetBytes) + "'><span style='width:" + pct(g.awakeBytes) + ";background:var(--awake)'></span><span style='width:" + pct(g.heldBytes) + ";background:var(--held)'></span></div></td><td class='num gpu-text'>" +
      bytes(g.awakeBytes) + " awake, " + bytes(g.heldBytes) + " held by asleep engines, " + (g.budgetBytes == null ? "no budget" : bytes(Math.max(0, g.budgetBytes - g.usedBytes)) + " free of " + bytes(g.budgetBytes)) + "</td></tr>";
  }).join("");
  $("ram").textContent = r.ramTier ? bytes(r.ramTier.usedBytes) + " of " + bytes(r.ramTier.budgetBytes) + " used, " + r.ramTier.entries.length + " snapshot(s): " + r.ramTier.entries.map((e) => e.name + (e.durable ? "" : " (not yet durable)")).join(", ") : "no RAM tier configured (ramTierGiB: 0)";
  $("neighbour").textContent = r.neighbourTier ? "GPU " + r.neighbourTier.device + ": " + bytes(r.neighbourTier.usedBytes) + " of " + bytes(r.neighbourTier.budgetBytes) + " used, " + r.neighbourTier.entries.length + " parked cop" + (r.neighbourTier.entries.length === 1 ? "y" : "ies") + (r.neighbourTier.entries.length ? ": " + r.neighbourTier.entries.map((e) => e.engine || e.id).join(", ") : "") : "no neighbour tier configured (neighbourTier)";
  $("snapshots").innerHTML = r.snapshots.length ? r.snapshots.map((s) => "<tr data-snapshot='" + esc(s.name) + "'><td>" + esc(s.name) + "</td><td class=muted>" + esc(s.id || "–") + "</td><td>" + (s.createdAt ? esc(new Date(s.createdAt).toLocaleString()) : "–") + "</td><td class=num>" + bytes(s.bytes) + "</td><td class=num>" + (s.storedBytes == null ? "–" : bytes(s.storedBytes) + " (" + (s.bytes ? s.storedBytes / s.bytes : 1).toFixed(2) + "x)") + "</td><td class=num>" + esc(s.versions ?? "–") + "</td><td>" +
    (s.damaged ? "<span class='pill failed'>damaged</span> <span class=muted>" + esc(s.reason || "") + "</span>" : s.durable === false ? "<span class='pill held'>not durable</span>" : "<span class='pill awake'>durable</span>") + "</td></tr>").join("") : "<tr><td colspan=7 class=muted>" + esc(r.snapshotsError || "no snapshots yet") + "</td></tr>";
  $("queue").textContent = r.queue.leases + " request(s) running, " + r.queue.waiting + " waiting for an engine";
  chart(r.swaps);
}

// One colour per phase name, kept for the page's life: Kelly's colours of maximum contrast first
// (no two alike), then hues a golden angle apart, which never repeat however many phases come.
const KELLY = ["#0067a5", "#be0032", "#f38400", "#008856", "#875692", "#a1caf1", "#f3c300", "#604e97", "#e68fac", "#8db600", "#882d17", "#848482", "#f99379", "#2b3d26", "#b3446c", "#c2b280", "#dcd300", "#654522", "#e25822", "#f6a600"];
const phaseColor = new Map();
const colorOf = (name) => {
  if (!phaseColor.has(name)) { const i = phaseColor.size; phaseColor.set(name, i < KELLY.length ? KELLY[i] : "hsl(" + ((i * 137.508) % 360).toFixed(1) + " 60% " + (i % 2 ? 40 : 60) + "%)"); }
  return phaseColor.get(name);
};

function chart(swaps) {
  const shown = swaps.slice(-20).reverse();
  // Phases can overlap (a restore's copy runs while the other engine suspends): the bars are drawn
  // end to end, so the scale is the longer of each swap's time and its phases' sum.
  const phasesOf = (s) => (s.phases && Object.keys(s.phases).length ? Object.entries(s.phases) : [[s.action, s.seconds || 0]]);
  const span = (s) => Math.max(s.seconds || 0, phasesOf(s).reduce((n, [, sec]) => n + sec, 0));
  const max = Math.max(0.001, ...shown.filter((s) => s.ok).map(span));
  const used = [];
  $("chart").innerHTML = shown.length ? shown.map((s) => {
    const label = new Date(s.at).toLocaleTimeString() + " " + s.action + " " + s.engine;
    const head = "<div class=swap role=listitem><span class=swap-label title='" + esc(label) + "'>" + esc(label) + "</span>";
    if (!s.ok) return head + "<span class=swap-error>failed: " + esc(s.error || "") + "</span></div>";
    const parts = phasesOf(s).map(([name, sec]) => {
      if (!used.includes(name)) used.push(name);
      return "<span data-phase='" + esc(name) + "' style='width:" + ((sec / max) * 100).toFixed(2) + "%;background:" + colorOf(name) + "' title='" + esc(name + " " + ms(sec)) + "'></span>";
    }).join("");
    return head + "<span class=swap-bar>" + parts + "</span><span class=swap-value>" + ms(s.seconds) + (s.tier ? " from " + esc(s.tier) : "") + "</span></div>";
  }).join("") : "<span class=muted>no swaps yet</span>";
  $("phases").innerHTML = used.map((n) => "<span data-phase='" + esc(n) + "' tabindex=0><i style='background:" + colorOf(n) + "'></i>" + esc(n) + "</span>").join("");
}

/** Points out one phase: its legend entry and its bar segments stay, every other phase dims. */
function focusPhase(name) {
  $("chart").classList.toggle("focus", name != null);
  for (const el of document.querySelectorAll("#chart [data-phase], #phases [data-phase]")) el.classList.toggle("on", el.dataset.phase === name);
}
for (const [ev, on] of [["mouseover", true], ["focusin", true], ["mouseout", false], ["focusout", false]]) {
  $("phases").addEventListener(ev, (e) => { const el = e.target.closest("[data-phase]"); focusPhase(on && el ? el.dataset.phase : null); });
}

/** The page's answer to a 401: ask for the token, and say so when the one given was refused. */
function needToken() {
  $("main").hidden = true; // no empty sections before the token
  $("login").classList.add("show");
  $("health").textContent = "needs the control token"; $("health").className = "muted";
  const refused = token !== "";
  $("login-error").hidden = !refused;
  $("login-error").textContent = refused ? "the agent refused this token (401): use the controlToken of its configuration" : "";
  if (refused) { sessionStorage.removeItem("vsnap-token"); $("token").select(); } else $("token").focus();
}

function tokenAccepted() {
  $("login").classList.remove("show");
  $("login-error").hidden = true;
}

async function poll() {
  const r = await fetch("api/status", { headers: headers() });
  if (r.status === 401) { needToken(); return false; }
  tokenAccepted();
  render(await r.json());
  return true;
}

async function live() {
  for (;;) {
    try {
      const r = await fetch("api/events", { headers: headers() });
      if (r.status === 401) { needToken(); return; }
      tokenAccepted();
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

$("login").addEventListener("submit", (ev) => { ev.preventDefault(); token = $("token").value; sessionStorage.setItem("vsnap-token", token); $("login-error").textContent = "checking…"; live(); });
live();
</script></body></html>
`;
