"use strict";
// The fleet dashboard: redraw from /fleet/v1/state (the cells agent/manager/dashboard_page.py
// renders); a device's link opens its last telemetry below the table without leaving the page.
// Devices come a page at a time: the pager and the filter change which page the poll asks for
// (page, state, q in the address bar too, so a reload or a shared link shows the same page).
(() => {
  const { esc, num, rows, get, poll } = Page;
  const DASH = "\u2013";
  const opened = new URLSearchParams(location.search);
  const want = { page: Number(opened.get("page")) || 1, state: opened.get("state") || "",
    q: opened.get("q") || "", per_page: opened.get("per_page") || "" };
  const stateUrl = () => {
    const p = new URLSearchParams();
    if (want.page > 1) p.set("page", String(want.page));
    if (want.per_page) p.set("per_page", want.per_page);
    if (want.state) p.set("state", want.state);
    if (want.q) p.set("q", want.q);
    const qs = p.toString();
    return qs ? `fleet/v1/state?${qs}` : "fleet/v1/state";
  };
  const showInAddressBar = () => {
    const p = new URLSearchParams(location.search);
    for (const [key, value] of Object.entries(want)) {
      if (value && !(key === "page" && value === 1)) p.set(key, String(value)); else p.delete(key);
    }
    const qs = p.toString();
    history.replaceState(null, "", qs ? `?${qs}` : location.pathname);
  };
  const fmt = (n) => Number(n || 0).toLocaleString("en-US");
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
  const waveDevices = (w) => {
    const details = w.details || {};
    const title = (d) => (details[d] ? ` title="${esc(details[d])}"` : "");
    const back = w.rollback || {};
    const undo = (d) => (back[d]
      ? `, <span class="state-${esc(back[d])}">${esc(back[d])}</span>` : "");
    const listed = Object.entries(w.devices || {})
      .map(([d, s]) => `<span class="state-${esc(s)}"${title(d)}>${esc(d)}: ${esc(s)}`
        + `${undo(d)}</span>`)
      .join(" ");
    const more = Number(w.more || 0);
    if (!more) return listed;
    const counts = { ...(w.counts || {}), ...(w.rollback_counts || {}) };
    const tally = Object.entries(counts)
      .map(([s, n]) => `<span class="state-${esc(s)}">${esc(s)} ${fmt(n)}</span>`).join(", ");
    return `${tally}; ${listed ? `${listed}; ` : ""}${fmt(more)} more of ${fmt(w.size)} not listed`;
  };
  const wave = (w) => {
    const devices = waveDevices(w);
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
  const pagerText = (state) => {
    const matching = Number(state.devices_matching ?? (state.devices || []).length);
    const total = Number(state.devices_total ?? matching);
    const shown = matching === total ? `${fmt(matching)} devices`
      : `${fmt(matching)} of ${fmt(total)} devices`;
    return `Page ${state.page || 1} of ${state.pages || 1} (${shown})`;
  };
  const pager = (state) => {
    document.getElementById("page-of").textContent = pagerText(state);
    document.getElementById("page-prev").disabled = (state.page || 1) <= 1;
    document.getElementById("page-next").disabled = (state.page || 1) >= (state.pages || 1);
    const counts = state.counts || {};
    for (const option of document.getElementById("device-state").options) {
      if (option.value) option.textContent = `${option.value} (${fmt(counts[option.value])})`;
    }
  };
  // An answer to an older query (a poll in flight while the page changed) is not drawn.
  const current = (state) => (state.q || "") === want.q && (state.state_filter || "") === want.state
    && (state.page === want.page || want.page > (state.pages || 1));
  const render = (state) => {
    if (!current(state)) return;
    want.page = state.page || 1;
    const devices = state.devices || [];
    const counts = state.counts || {};
    const online = (counts.online || 0) + (counts.degraded || 0);
    document.getElementById("summary").textContent = `${fmt(online)} of `
      + `${fmt(state.devices_total ?? devices.length)} devices online`;
    pager(state);
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
  };
  const refresh = async () => {
    document.body.dataset.url = stateUrl();
    showInAddressBar();
    try {
      render(await get(document.body.dataset.url));
    } catch (error) {
      document.getElementById("updated").textContent = `Update failed (${error.message}).`;
    }
  };
  const turn = (step) => { want.page = Math.max(1, want.page + step); refresh(); };
  document.getElementById("page-prev").addEventListener("click", () => turn(-1));
  document.getElementById("page-next").addEventListener("click", () => turn(1));
  const filter = () => {
    want.q = document.getElementById("device-q").value.trim();
    want.state = document.getElementById("device-state").value;
    want.page = 1;
    refresh();
  };
  document.getElementById("device-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    filter();
  });
  document.getElementById("device-state").addEventListener("change", filter);
  document.body.dataset.url = stateUrl();
  poll(render);
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
