"use strict";
// One call in progress: its turns as they come (a partial shown provisional, replaced by its final), its
// alerts, its figures; when it ends, a link to its finished page. Text goes in as text only.
const turns = document.getElementById("turns"), alerts = document.getElementById("alerts");
const state = document.getElementById("state"), ended = document.getElementById("ended");
const callId = document.getElementById("call").dataset.call;
const clock = ms => { const s = Math.max(0, Math.floor(ms / 1000)); return Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0"); };
function span(parent, text, cls) { const s = document.createElement("span"); s.textContent = text; s.className = cls; parent.appendChild(s); }
function putTurn(t) {
  const div = document.createElement("div");
  div.className = "turn leg-" + t.leg + (t.final ? "" : " provisional"); div.id = "t-" + t.segment_id; div.dataset.start = t.start_ms;
  span(div, clock(t.start_ms), "when"); span(div, t.leg, "leg"); span(div, t.text, "text");
  span(div, t.final ? (t.sentiment > 0 ? "+" : "") + t.sentiment.toFixed(1) : "\u2026", "s");
  const old = document.getElementById(div.id);
  if (old) { old.replaceWith(div); return; }
  const after = [...turns.children].find(el => +el.dataset.start > t.start_ms);
  turns.insertBefore(div, after || null);
}
function putAlert(a) {
  const li = document.createElement("li");
  li.className = "fired"; li.textContent = clock(a.offset_ms) + " " + a.rule + " (" + a.leg + ", " + a.severity + "): " + a.text;
  for (const old of alerts.querySelectorAll("li.fired")) old.classList.remove("fired");
  alerts.appendChild(li);
}
function putFacts(c) {
  for (const [name, value] of Object.entries({
    duration: clock(c.call_ms), agent_talk: clock(c.agent_talk_ms), customer_talk: clock(c.customer_talk_ms),
    silence: clock(c.silence_ms), sentiment: (c.customer_sentiment > 0 ? "+" : "") + c.customer_sentiment.toFixed(1) + " " + c.customer_trend,
    hold: c.on_hold ? "on hold" : "no",
  })) { const el = document.getElementById("f-" + name); if (el) el.textContent = value; }
}
// A final read just after the call's end still comes (its end and its last turns travel apart): the stream
// stays open a little longer.
function over(page) { ended.hidden = false; ended.querySelector("a").href = page; state.textContent = "ended"; setTimeout(() => stream.close(), 10000); }
const stream = new EventSource("/live/events?call=" + encodeURIComponent(callId));
stream.addEventListener("snapshot", e => {
  const d = JSON.parse(e.data);
  if (d.ended) { over(d.page); return; }
  turns.replaceChildren(); alerts.replaceChildren();
  for (const t of d.turns) putTurn(t);
  for (const a of d.alerts) putAlert(a);
  putFacts(d.summary);
});
stream.addEventListener("turn", e => putTurn(JSON.parse(e.data)));
stream.addEventListener("alert", e => putAlert(JSON.parse(e.data)));
stream.addEventListener("call", e => putFacts(JSON.parse(e.data)));
stream.addEventListener("ended", e => over(JSON.parse(e.data).page));
stream.onopen = () => { state.textContent = "live"; };
stream.onerror = () => { if (ended.hidden) state.textContent = "reconnecting\u2026"; };
