"use strict";
// The live wall: the calls in progress, kept as the desk's stream says (/live/events), re-drawn at most
// every 250 ms whatever the rate of events, durations ticking each second. Text goes in as text only.
const body = document.getElementById("live-calls"), sortBy = document.getElementById("sort");
const count = document.getElementById("count"), state = document.getElementById("state");
const calls = new Map(), BARS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588";
let newest = "", due = false;
const clock = ms => { const s = Math.max(0, Math.floor(ms / 1000)); return Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0"); };
const spark = scores => scores.map(v => BARS[Math.max(0, Math.min(7, Math.round((v + 5) / 10 * 7)))]).join("");
const signed = v => (v > 0 ? "+" : "") + v.toFixed(1);
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }
function row(c) {
  const tr = document.createElement("tr"), td = document.createElement("td"), a = document.createElement("a");
  tr.dataset.call = c.call_id;
  if (c.call_id === newest) tr.className = "newest";
  a.href = "/live/" + encodeURIComponent(c.call_id); a.textContent = c.call_id; td.appendChild(a); tr.appendChild(td);
  cell(tr, c.agent_id || "\u2013"); cell(tr, c.queue || "\u2013");
  cell(tr, clock(Date.now() - c.started_at_ms), "num dur").dataset.start = c.started_at_ms;
  cell(tr, signed(c.customer_sentiment), "num sentiment"); cell(tr, spark(c.customer_scores), "spark");
  cell(tr, c.alerts ? c.alerts + " \u00b7 " + c.last_alert_rule : "\u2013", c.alerts ? "alerts" : "");
  cell(tr, c.on_hold ? "on hold" : "");
  return tr;
}
const order = {
  longest: (a, b) => a.started_at_ms - b.started_at_ms,
  sentiment: (a, b) => a.customer_sentiment - b.customer_sentiment || a.started_at_ms - b.started_at_ms,
  alerts: (a, b) => b.alerts - a.alerts || a.started_at_ms - b.started_at_ms,
};
function draw() {
  due = false;
  const list = [...calls.values()].sort(order[sortBy.value] || order.longest);
  body.replaceChildren(...list.map(row)); count.textContent = String(list.length);
}
const later = () => { if (!due) { due = true; setTimeout(draw, 250); } };
setInterval(() => { for (const td of body.querySelectorAll("td.dur")) td.textContent = clock(Date.now() - td.dataset.start); }, 1000);
sortBy.addEventListener("change", draw);
const stream = new EventSource("/live/events");
stream.addEventListener("snapshot", e => { calls.clear(); for (const c of JSON.parse(e.data).calls) calls.set(c.call_id, c); later(); });
stream.addEventListener("call", e => { const c = JSON.parse(e.data); calls.set(c.call_id, c); later(); });
stream.addEventListener("ended", e => { calls.delete(JSON.parse(e.data).call_id); later(); });
stream.addEventListener("alert", e => { newest = JSON.parse(e.data).call_id; later(); });
stream.onopen = () => { state.textContent = "live"; };
stream.onerror = () => { state.textContent = "reconnecting\u2026"; };
