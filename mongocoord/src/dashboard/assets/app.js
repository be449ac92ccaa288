// Live updates: the server announces which section changed over server-sent
// events; the page re-fetches its live part (the same URL, with X-Fragment)
// and replaces it, without a reload. One fetch at a time; changes that arrive
// meanwhile cause one more. A refresh every 5 s keeps lease countdowns fresh.
"use strict";
(function () {
  const live = document.getElementById("live");
  const status = document.getElementById("status");
  if (!live) return;
  const wanted = (live.dataset.sections || "").split(" ").filter(Boolean);
  let busy = false, again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const r = await fetch(location.href, { headers: { "X-Fragment": "1" }, cache: "no-store" });
      if (r.ok) live.innerHTML = await r.text();
    } catch (e) { /* the next event or tick tries again */ }
    busy = false;
    if (again) { again = false; refresh(); }
  }
  if (wanted.length === 0) return;
  if (window.EventSource) {
    const es = new EventSource("/events");
    es.onopen = () => { if (status) status.className = "on"; };
    es.onerror = () => { if (status) status.className = "off"; };
    es.onmessage = (ev) => { if (ev.data === "*" || wanted.includes(ev.data)) refresh(); };
  }
  setInterval(refresh, 5000);
})();
