"use strict";
// Shared by the status page and the fleet dashboard: formats (the same as agent/pages.py),
// the sparkline, and the poll loop. The token from ?token= goes along as a Bearer header.
const Page = (() => {
  const token = new URLSearchParams(location.search).get("token");
  const DASH = "\u2013";
  const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;" };
  const esc = (v) => (v === null || v === undefined ? DASH
    : String(v).replace(/[&<>"']/g, (c) => ENTITIES[c]));
  const num = (v, digits) => (v === null || v === undefined || Number.isNaN(v) ? DASH
    : Number(v).toLocaleString("en-US", { minimumFractionDigits: digits,
      maximumFractionDigits: digits }));
  const bytes = (v) => {
    if (v === null || v === undefined) return DASH;
    let size = Number(v);
    for (const unit of ["B", "KiB", "MiB", "GiB"]) {
      if (Math.abs(size) < 1024 || unit === "GiB") return `${num(size, unit === "B" ? 0 : 1)} ${unit}`;
      size /= 1024;
    }
    return DASH;
  };
  const spark = (values, width = 120, height = 24) => {
    const top = Math.max(0, ...values.filter((v) => typeof v === "number")) || 1;
    const step = width / Math.max(1, values.length - 1);
    const coords = values.map((v, i) => (typeof v === "number"
      ? `${(i * step).toFixed(1)},${(height - 1 - (v / top) * (height - 2)).toFixed(1)}` : null))
      .filter((c) => c !== null).join(" ");
    return `<svg class="spark" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" `
      + `aria-hidden="true"><polyline points="${coords}"/></svg>`;
  };
  const rows = (id, list, cols, render) => {
    const body = document.getElementById(id);
    if (body) body.innerHTML = list.length ? list.map(render).join("")
      : `<tr><td colspan="${cols}">none</td></tr>`;
  };
  const get = async (url) => {
    const answer = await fetch(url, { cache: "no-store",
      headers: token ? { Authorization: `Bearer ${token}` } : {} });
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    return answer.json();
  };
  const poll = (render) => {
    const every = Number(document.body.dataset.interval) || 2000;
    const note = document.getElementById("updated");
    const tick = async () => {
      try {
        render(await get(document.body.dataset.url));
        if (note) note.textContent = `Updated ${new Date().toLocaleTimeString()}.`;
      } catch (error) {
        if (note) note.textContent = `Update failed (${error.message}); retrying.`;
      }
      setTimeout(tick, every);
    };
    setTimeout(tick, every);
  };
  return { esc, num, bytes, spark, rows, get, poll };
})();
