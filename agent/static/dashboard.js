"use strict";
// The fleet dashboard: redraw from /fleet/v1/state (the cells agent/manager/dashboard_page.py
// renders); a device's link opens its last telemetry below the table without leaving the page.
(() => {
  const { esc, num, rows, get, poll } = Page;
  const DASH = "\u2013";
  const ago = (ts, now) => {
    if (ts === null || ts === undefined) return DASH;
    const s = Math.max(0, Math.floor(now - ts));
    if (s < 120) return `${s} s ago`;
    return s < 7200 ? `${Math.floor(s / 60)} min ago` : `${Math.floor(s / 3600)} h ago`;
  };
  const stateCell = (v) => `class="state-${esc(v)}">${esc(v)}`;
  const table = (caption, head, body, id) => `<div class="scroll"><table><caption>${caption}`
    + `</caption><thead><tr>${head.map((h) => `<th scope="col">${h}</th>`).join("")}</tr></thead>`
    + `<tbody id="${id}">${body || `<tr><td colspan="${head.length}">none</td></tr>`}</tbody>`
    + "</table></div>";
  const wave = (w) => {
    const details = w.details || {};
    const title = (d) => (details[d] ? ` title="${esc(details[d])}"` : "");
    const back = w.rollback || {};
    const undo = (d) => (back[d]
      ? `, <span class="state-${esc(back[d])}">${esc(back[d])}</span>` : "");
    const devices = Object.entries(w.devices || {})
      .map(([d, s]) => `<span class="state-${esc(s)}"${title(d)}>${esc(d)}: ${esc(s)}`
        + `${undo(d)}</span>`)
      .join(" ");
    const gate = w.gate || {};
    const figures = gate.figures || {};
    const limits = gate.limits || {};
    const keys = [...new Set([...Object.keys(figures), ...Object.keys(limits)])].sort();
    const checks = keys.map((k) => `${esc(k)} ${esc(figures[k])} / ${esc(limits[k])}`).join("; ");
    return `<tr><th scope="row">${esc(w.name)}</th><td ${stateCell(w.state)}</td>`
      + `<td>${devices || DASH}</td><td>${checks || DASH}</td><td ${stateCell(gate.verdict)}</td></tr>`;
  };
  const rollouts = (state) => {
    if (state.rollouts_error) return `<p class="bad">Rollouts unavailable: ${esc(state.rollouts_error)}</p>`;
    if (!(state.rollouts || []).length) return "<p>No rollouts.</p>";
    return state.rollouts.map((r) => {
      const id = esc(r.id);
      return `<article class="rollout" aria-labelledby="r-${id}"><h3 id="r-${id}">${id}: `
        + `${esc(r.model)} v${esc(r.version)} <span class="state-${esc(r.state)}">${esc(r.state)}`
        + `</span>${r.reason ? ` (${esc(r.reason)})` : ""}</h3>`
        + table(`Waves of ${id}`, ["Wave", "State", "Devices", "Gate: figures against limits",
          "Verdict"], (r.waves || []).map(wave).join(""), `waves-${id}`) + "</article>";
    }).join("");
  };
  poll((state) => {
    const devices = state.devices || [];
    const online = devices.filter((d) => d.state === "online" || d.state === "degraded").length;
    document.getElementById("summary").textContent = `${online} of ${devices.length} devices online`;
    const broker = document.getElementById("broker");
    broker.textContent = state.broker ? "Broker connected" : "Broker not connected";
    broker.className = state.broker ? "ok" : "bad";
    rows("devices-body", devices, 7, (d) => {
      const name = esc(d.device);
      const versions = Object.entries(d.versions || {})
        .map(([m, vs]) => `${esc(m)}: ${vs.join(", ")}`).join(", ");
      return `<tr><th scope="row"><a class="device" href="fleet/v1/devices/${name}/telemetry" `
        + `data-device="${name}" aria-controls="telemetry">${name}</a></th>`
        + `<td ${stateCell(d.state)}${d.reason ? ` (${esc(d.reason)})` : ""}</td>`
        + `<td>${esc((d.groups || []).join(", ") || null)}</td><td>${versions || DASH}</td>`
        + `<td>${num(d.p95_us === null ? null : d.p95_us / 1000, 2)}</td>`
        + `<td>${d.error_rate === null ? DASH : `${num(d.error_rate * 100, 2)} %`}</td>`
        + `<td>${ago(d.last_seen, state.now)}</td></tr>`;
    });
    document.getElementById("rollouts").innerHTML = rollouts(state);
    rows("events-body", state.events || [], 6, (e) => `<tr><td>${esc(e.time)}</td>`
      + `<td>${esc(e.device)}</td><td>${esc(e.event)}</td><td>${esc(e.model)}</td>`
      + `<td>${esc(e.version)}</td><td><code>${esc(JSON.stringify(e.detail || {}))}</code></td></tr>`);
  });
  document.addEventListener("click", async (event) => {
    const link = event.target.closest("a.device");
    if (!link) return;
    event.preventDefault();
    const device = link.dataset.device;
    document.getElementById("telemetry-device").textContent = `of ${device}`;
    const out = document.getElementById("telemetry-json");
    try {
      out.textContent = JSON.stringify(await get(link.getAttribute("href")), null, 2);
    } catch (error) {
      out.textContent = `No telemetry from ${device} (${error.message}).`;
    }
    out.focus();
  });
})();
