"""The live seat map page served at ``/``: one self-contained HTML file (SVG, no framework).

The page draws the showing's seats from the ``seats`` server-sent events of
``/v1/showings/{slot}/events``, and holds, confirms and releases through the
same ``/v1`` API every client uses, with the API key it was given (in the URL
fragment ``#key=…``, which never reaches a server log, or typed in). What is
"yours" is known only to the page, from its own claims: the stream never names
a holder.
"""

from __future__ import annotations

import json

__all__ = ["seat_map_page"]

HOLD_SECONDS = 120


def seat_map_page(slot: str, slots: list[str]) -> str:
    """The page for showing ``slot`` (``slots``: every showing, for the switcher)."""

    def js(value: object) -> str:
        return json.dumps(value).replace("<", "\\u003c")

    return (
        _PAGE.replace("__SLOT__", js(slot))
        .replace("__SLOTS__", js(slots))
        .replace("__HOLD__", str(HOLD_SECONDS))
    )


_PAGE = r"""<!doctype html>
<html lang="en">
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dibs — seat map</title>
<style>
  body { font: 15px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .4em; }
  #map { max-width: 56em; width: 100%; height: auto; user-select: none; }
  g.seat { cursor: pointer; }
  g.seat rect { stroke: #555; stroke-width: 1; rx: 5; }
  g[data-state=free] rect { fill: #e8f5e9; }
  g[data-state=held] rect { fill: #ffcc80; }
  g[data-state=confirmed] rect { fill: #e57373; cursor: not-allowed; }
  g[data-state=mine-held] rect { fill: #90caf9; stroke: #0d47a1; stroke-width: 3; }
  g[data-state=mine-confirmed] rect { fill: #1e88e5; stroke: #0d47a1; stroke-width: 3; }
  g[data-state=held], g[data-state=confirmed] { cursor: not-allowed; }
  g.seat text { font-size: 11px; text-anchor: middle; pointer-events: none; }
  g.seat text.t { font-size: 9px; }
  g.flash rect { stroke: #b71c1c; stroke-width: 4; }
  #status { min-height: 1.5em; padding: .4em .6em; border-radius: 4px; margin: .6em 0; }
  #status[data-kind=taken], #status[data-kind=error] { background: #ffebee; color: #b71c1c; }
  #status[data-kind=held] { background: #e3f2fd; }
  #status[data-kind=confirmed] { background: #e8f5e9; }
  .legend span { display: inline-block; width: 1em; height: 1em; vertical-align: -2px;
                 border: 1px solid #555; margin: 0 .3em 0 1em; border-radius: 3px; }
  #live { font-size: .85em; color: #666; }
  button { font: inherit; padding: .3em .9em; margin-right: .4em; }
</style>
<h1>Seat map — <span id="slot"></span> <span id="live">connecting…</span></h1>
<form id="login" hidden>
  <label>API key <input id="key" size="60" autocomplete="off"></label>
  <button>Use key</button> <small>(<code>dibs keys create --holder you</code>)</small>
</form>
<div class="legend">
  <span style="background:#e8f5e9"></span>free <span style="background:#ffcc80"></span>held
  <span style="background:#e57373"></span>confirmed
  <span style="background:#90caf9"></span>your hold
  <span style="background:#1e88e5"></span>yours
</div>
<div id="status" role="status" aria-live="polite"></div>
<div id="actions" hidden>
  <button id="confirm">Confirm</button><button id="release">Release</button>
</div>
<svg id="map" xmlns="http://www.w3.org/2000/svg"></svg>
<script>
"use strict";
const SLOT = __SLOT__, HOLD = __HOLD__, ROWS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const NS = "http://www.w3.org/2000/svg";
const mine = new Map();          // seat -> {id, fence, state, expires_at}
let snap = null, offset = 0, selected = null, key = null;

function readKey() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) {
    sessionStorage.setItem("dibs-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  key = sessionStorage.getItem("dibs-key");
  document.getElementById("login").hidden = !!key;
}
document.getElementById("login").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("dibs-key", document.getElementById("key").value.trim());
  readKey(); loadMine();
});

function say(kind, text) {
  const s = document.getElementById("status");
  s.dataset.kind = kind; s.textContent = text;
}
function label(seat) { return seat.replace(/^seat-/, ""); }
function nowMs() { return Date.now() + offset; }

async function api(method, path, body, extra) {
  const headers = {"Authorization": "Bearer " + key, ...(extra || {})};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const payload = body === undefined ? undefined : JSON.stringify(body);
  const r = await fetch(path, {method, headers, body: payload});
  let doc = null;
  try { doc = await r.json(); } catch (e) { doc = null; }
  return {status: r.status, doc};
}

async function loadMine() {
  if (!key) return;
  const r = await api("GET", "/v1/claims?holder=me");
  if (r.status !== 200) { say("error", "Your API key was refused (" + r.status + ")."); return; }
  for (const c of r.doc.claims)
    for (const t of c.targets)
      if (t.slot === SLOT && "slot" in t) mine.set(t.resource, c);
  draw();
}

function stateOf(seat) {
  const s = snap ? snap.seats[seat] : {state: "free", expires_at: null};
  const m = mine.get(seat);
  if (m) {
    const dead = m.state === "held" && m.expires_at && Date.parse(m.expires_at) <= nowMs();
    if (dead) { mine.delete(seat); }
    else return {state: "mine-" + m.state, expires_at: m.state === "held" ? m.expires_at : null};
  }
  if (s.state === "held" && s.expires_at && Date.parse(s.expires_at) <= nowMs())
    return {state: "free", expires_at: null};
  return s;
}

function build() {
  const svg = document.getElementById("map");
  svg.replaceChildren();
  const W = 46, H = 40;
  svg.setAttribute("viewBox", `0 0 ${snap.cols * W + 30} ${snap.rows * H + 40}`);
  const stage = document.createElementNS(NS, "text");
  stage.setAttribute("x", (snap.cols * W + 30) / 2); stage.setAttribute("y", 14);
  stage.setAttribute("text-anchor", "middle"); stage.textContent = "stage";
  svg.appendChild(stage);
  for (let r = 0; r < snap.rows; r++) {
    for (let c = 0; c < snap.cols; c++) {
      const seat = `seat-${ROWS[r]}${c + 1}`;
      const g = document.createElementNS(NS, "g");
      g.setAttribute("class", "seat"); g.dataset.seat = seat;
      g.setAttribute("transform", `translate(${20 + c * W},${26 + r * H})`);
      const rect = document.createElementNS(NS, "rect");
      rect.setAttribute("width", W - 6); rect.setAttribute("height", H - 6);
      const t = document.createElementNS(NS, "text");
      t.setAttribute("x", (W - 6) / 2); t.setAttribute("y", 15); t.textContent = label(seat);
      const cd = document.createElementNS(NS, "text");
      cd.setAttribute("class", "t"); cd.setAttribute("x", (W - 6) / 2); cd.setAttribute("y", 28);
      const title = document.createElementNS(NS, "title");
      g.append(rect, t, cd, title);
      g.addEventListener("click", () => clickSeat(seat));
      svg.appendChild(g);
    }
  }
}

function draw() {
  if (!snap) return;
  const svg = document.getElementById("map");
  const grid = `${snap.rows}x${snap.cols}`;
  if (svg.dataset.grid !== grid) { build(); svg.dataset.grid = grid; }
  for (const g of svg.querySelectorAll("g.seat")) {
    const s = stateOf(g.dataset.seat);
    g.dataset.state = s.state;
    const left = s.expires_at
      ? Math.max(0, Math.ceil((Date.parse(s.expires_at) - nowMs()) / 1000)) : null;
    g.children[2].textContent = left === null ? "" : left + "s";
    g.children[3].textContent = label(g.dataset.seat) + ": " + s.state.replace("mine-", "your ");
  }
  const m = selected && mine.get(selected);
  document.getElementById("actions").hidden = !m;
  if (m) document.getElementById("confirm").hidden = m.state !== "held";
}

async function clickSeat(seat) {
  const s = stateOf(seat);
  if (s.state.startsWith("mine-")) { selected = seat; draw(); return; }
  if (s.state !== "free") { say("taken", `Seat ${label(seat)} is taken.`); return; }
  if (!key) { say("error", "Enter an API key first."); return; }
  const uuid = crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2);
  const idem = '"' + uuid + '"';
  const r = await api("POST", "/v1/claims", {targets: [{resource: seat, slot: SLOT}], ttl: HOLD},
                      {"Idempotency-Key": idem});
  if (r.status === 201) {
    mine.set(seat, r.doc); selected = seat;
    say("held", `Seat ${label(seat)} is held for you for ${HOLD} s — confirm to keep it.`);
  } else if (r.status === 409) {
    if (snap) snap.seats[seat] = {state: "held", expires_at: null};
    const g = document.querySelector(`g[data-seat="${seat}"]`);
    if (g) { g.classList.add("flash"); setTimeout(() => g.classList.remove("flash"), 1500); }
    say("taken", `Sorry — seat ${label(seat)} was just taken by someone else.`);
  } else {
    say("error", `Could not hold ${label(seat)}: ${r.doc ? r.doc.message : r.status}`);
  }
  draw();
}

document.getElementById("confirm").addEventListener("click", async () => {
  const seat = selected, m = mine.get(seat);
  if (!m) return;
  const r = await api("POST", `/v1/claims/${m.id}/confirm`, {fence: m.fence});
  if (r.status === 200) {
    mine.set(seat, r.doc); say("confirmed", `Seat ${label(seat)} is yours.`);
  } else if (r.status === 409) {
    mine.delete(seat); say("taken", `Too late for ${label(seat)}: hold ${r.doc.reason}.`);
  }
  else say("error", `Could not confirm: ${r.doc ? r.doc.message : r.status}`);
  draw();
});
document.getElementById("release").addEventListener("click", async () => {
  const seat = selected, m = mine.get(seat);
  if (!m) return;
  const r = await api("DELETE", `/v1/claims/${m.id}`, {fence: m.fence});
  if (r.status === 200 || r.status === 409) {
    mine.delete(seat); say("", `Released ${label(seat)}.`);
  }
  else say("error", `Could not release: ${r.doc ? r.doc.message : r.status}`);
  selected = null; draw();
});

function connect() {
  const es = new EventSource(`/v1/showings/${encodeURIComponent(SLOT)}/events`);
  es.addEventListener("seats", (e) => {
    snap = JSON.parse(e.data);
    offset = Date.parse(snap.now) - Date.now();
    document.getElementById("live").textContent = "live · v" + snap.version;
    document.body.dataset.version = snap.version;
    draw();
  });
  es.onerror = () => { document.getElementById("live").textContent = "reconnecting…"; };
}

document.getElementById("slot").textContent = SLOT;
readKey(); loadMine(); connect();
setInterval(draw, 250);
</script>
</html>
"""
