"use strict";
// The device status page: redraw from /v2/status (the same cells agent/api/status_page.py renders).
const gpuLine = (g) => {
  const parts = [];
  if (g.util_percent !== undefined) parts.push(`${g.util_percent} % busy`);
  if (g.memory_used_bytes !== undefined) {
    parts.push(`${Page.bytes(g.memory_used_bytes)} of ${Page.bytes(g.memory_total_bytes)}`);
  }
  if (g.power_w !== undefined) parts.push(`${Page.num(g.power_w, 1)} W`);
  return parts.join(", ") || "no figures";
};
Page.poll((doc) => {
  const { esc, num, bytes, spark, rows } = Page;
  const health = document.getElementById("health");
  health.textContent = doc.ready ? "Ready" : "Not ready";
  health.className = doc.ready ? "ok" : "bad";
  // A version running without the accelerators its config asks for (as status_page.py marks it).
  const fallback = (m) => (m.cpu_fallback ? ' <strong class="state-degraded">CPU fallback</strong>' : "");
  rows("models-body", doc.models || [], 4, (m) => `<tr><th scope="row">${esc(m.name)}</th>`
    + `<td>${esc(m.version)}</td><td class="state-${esc(m.state || "").toLowerCase()}">`
    + `${esc(m.state)}${fallback(m)}</td><td>${esc(m.reason || null)}</td></tr>`);
  const history = doc.history || {};
  const ms = (us) => (typeof us === "number" ? us / 1000 : null);
  rows("serving-body", doc.stats || [], 11, (m) => {
    const lat = m.latency_us || {};
    const p95s = (history[`${m.model}:${m.version}`] || []).map((s) => s.p95_us);
    return `<tr><th scope="row">${esc(m.model)}</th><td>${esc(m.version)}</td>`
      + `<td>${num(m.inferences_per_s, 2)}</td>`
      + ["p50", "p95", "p99"].map((q) => `<td>${num(ms(lat[q]), 2)}</td>`).join("")
      + `<td>${spark(p95s)}</td><td>${esc(m.pending)}</td><td>${num(m.mean_batch_size, 2)}</td>`
      + `<td>${esc(m.requests)}</td><td>${esc(m.failures)}</td></tr>`;
  });
  const memory = doc.memory || {};
  const sync = doc.sync;
  let syncState = "not configured";
  let syncError = null;
  if (sync) {
    syncState = sync.failing ? "failing" : "ok";
    syncError = sync.failing || Object.entries(sync.model_errors || {})
      .map(([k, v]) => `${k}: ${v}`).join("; ") || null;
  }
  const resources = [["Memory budget", bytes(memory.budget_bytes)],
    ["Memory used", bytes(memory.used_bytes)],
    ["Memory in flight", memory.inflight_capacity_bytes === undefined ? bytes(undefined)
      : `${bytes(memory.inflight_bytes)} of ${bytes(memory.inflight_capacity_bytes)}`
      + ` (peak ${bytes(memory.inflight_peak_bytes)}, ${esc(memory.inflight_refused)} refused)`],
    ["Cache on disk", bytes(doc.cache_disk_bytes)],
    ["Sync", esc(syncState)], ["Sync last error", esc(syncError)],
    ...(doc.gpu || []).map((g) => [`GPU ${esc(g.index)}`, esc(gpuLine(g))])];
  rows("resources-body", resources, 2, ([k, v]) => `<tr><th scope="row">${k}</th><td>${v}</td></tr>`);
  rows("canary-body", doc.canary || [], 6, (c) => `<tr><th scope="row">${esc(c.model)}</th>`
    + `<td>${esc(c.state)}</td><td>${esc(c.baseline)}</td><td>${esc(c.candidate)}</td>`
    + `<td>${esc(c.share)}</td><td>${esc(c.pinned_version)}</td></tr>`);
  rows("events-body", doc.events || [], 5, (e) => `<tr><td><time datetime="${esc(e.time)}">`
    + `${esc(e.time)}</time></td><td>${esc(e.event)}</td><td>${esc(e.model)}</td>`
    + `<td>${esc(e.version)}</td><td><code>${esc(JSON.stringify(e.detail || {}))}</code></td></tr>`);
});
