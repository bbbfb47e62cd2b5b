"""The live seat map page served at ``/``: one self-contained HTML file (no framework).

The page draws the showing's seats from the ``seats`` server-sent events of
``/v1/showings/{slot}/events``, and holds, confirms and releases through the
same ``/v1`` API every client uses, with the API key it was given (in the URL
fragment ``#key=…``, which never reaches a server log, or typed in). What is
"yours" is known only to the page, from its own claims: the stream never names
a holder.
"""

from __future__ import annotations

import json
from urllib.parse import quote

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
        .replace("__ICON__", _ICON)
    )


# A seat in the page's blue, as the tab's icon: inline, so it costs no request.
_ICON = "data:image/svg+xml," + quote(
    "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 32 32'>"
    "<rect x='6' y='3' width='20' height='17' rx='5' fill='#1e88e5'/>"
    "<rect x='2' y='15' width='6' height='12' rx='3' fill='#0d47a1'/>"
    "<rect x='24' y='15' width='6' height='12' rx='3' fill='#0d47a1'/>"
    "<rect x='6' y='18' width='20' height='8' rx='3' fill='#1565c0'/></svg>",
    safe=" =':/",
)


_PAGE = r"""<!doctype html>
<html lang="en">
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light">
<title>Seats — dibs</title>
<link rel="icon" type="image/svg+xml" href="__ICON__">
<style>
  :root {
    --free: #e8f5e9; --free-edge: #81c784; --held: #ffe0b2; --held-edge: #fb8c00;
    --taken: #eceff1; --taken-edge: #b0bec5; --mine: #bbdefb; --mine-edge: #1565c0;
    --yours: #1e88e5; --ink: #1c2430; --muted: #5f6b7a; --accent: #1565c0;
  }
  * { box-sizing: border-box; }
  body { font: 16px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
         color: var(--ink); background: #f6f8fb; }
  header { display: flex; flex-wrap: wrap; align-items: center; gap: .5em 1em;
           padding: .75em 1em; background: #fff; border-bottom: 1px solid #e3e8ef; }
  header h1 { font-size: 1.15em; margin: 0; flex: 1 1 auto; }
  header .bar { display: flex; flex-wrap: wrap; align-items: center; gap: .5em 1em; }
  main { max-width: 60em; margin: 0 auto; padding: .75em 1em 7em; }
  button, select, input { font: inherit; color: inherit; }
  .control { min-height: 44px; min-width: 44px; padding: 0 .9em; border-radius: 10px;
             white-space: nowrap;
             border: 1px solid #c9d3df; background: #fff; cursor: pointer; }
  .control:hover { border-color: var(--accent); }
  .primary { background: var(--accent); border-color: var(--accent); color: #fff;
             font-weight: 600; }
  .primary:hover { background: #0d47a1; }
  label.pick { display: inline-flex; align-items: center; gap: .4em; color: var(--muted); }
  #who { display: inline-flex; align-items: center; gap: .5em; color: var(--muted); }
  #who b { color: var(--ink); }
  #live { font-size: .9em; color: var(--muted); white-space: nowrap; }
  #live::before { content: ""; display: inline-block; width: .6em; height: .6em;
                  border-radius: 50%; margin-right: .4em; background: #b0bec5; }
  #live[data-state=live]::before { background: #43a047; box-shadow: 0 0 0 3px #c8e6c9; }
  #live[data-state=reconnecting]::before { background: #fb8c00; }
  #login { display: flex; flex-wrap: wrap; gap: .5em; align-items: center; margin: .5em 0 1em;
           padding: .75em; background: #fff; border: 1px solid #e3e8ef; border-radius: 12px; }
  #login input { min-height: 44px; flex: 1 1 16em; padding: 0 .7em; border-radius: 10px;
                 border: 1px solid #c9d3df; }
  #login small { flex-basis: 100%; color: var(--muted); }
  #status { min-height: 2.6em; padding: .55em .8em; border-radius: 10px; margin: .25em 0 .75em; }
  #status:empty { visibility: hidden; }
  #status[data-kind=taken], #status[data-kind=error] { background: #ffebee; color: #b71c1c; }
  #status[data-kind=held] { background: #e3f2fd; color: #0d47a1; }
  #status[data-kind=confirmed] { background: #e8f5e9; color: #1b5e20; }
  #status[data-kind=info] { background: #fff; }
  .hall { overflow-x: auto; padding: .5em 0 1em; -webkit-overflow-scrolling: touch; }
  /* The grid is as wide as its seats and centred by its margins, so that on a
     narrow screen it scrolls from its first seat instead of losing it. */
  .screen { margin: 0 auto 1.2em; width: min(100%, 40em); height: 1.6em;
            border-radius: 50% 50% 0 0 / 100% 100% 0 0;
            background: linear-gradient(#cfd8dc, #eceff1); color: var(--muted); font-size: .75em;
            letter-spacing: .3em; text-align: center; line-height: 1.8em; }
  #map { display: grid; gap: 6px; width: max-content; margin: 0 auto;
         grid-template-columns: 1.4em repeat(var(--cols), minmax(44px, 3.4em)) 1.4em; }
  #map .row { color: var(--muted); font-size: .8em; align-self: center; text-align: center; }
  .seat { position: relative; min-width: 44px; min-height: 44px; aspect-ratio: 1 / 1; padding: 0;
          border-radius: 10px 10px 6px 6px; border: 2px solid var(--free-edge);
          background: var(--free); cursor: pointer; display: flex; flex-direction: column;
          align-items: center; justify-content: center; line-height: 1.1;
          transition: background .25s, border-color .25s, transform .1s; }
  .seat:hover { transform: translateY(-1px); }
  .seat:focus-visible { outline: 3px solid #ffb300; outline-offset: 2px; }
  .seat .n { font-size: .8em; font-weight: 600; }
  .seat .t { font-size: .68em; font-variant-numeric: tabular-nums; min-height: 1.1em; }
  .seat[data-state=held] { background: var(--held); border-color: var(--held-edge);
                           cursor: not-allowed; }
  .seat[data-state=confirmed] { background: var(--taken); border-color: var(--taken-edge);
                                color: #90a4ae; cursor: not-allowed; }
  .seat[data-state=mine-held] { background: var(--mine); border-color: var(--mine-edge);
                                box-shadow: 0 0 0 2px #90caf9; }
  .seat[data-state=mine-confirmed] { background: var(--yours); border-color: #0d47a1; color: #fff; }
  .seat.just-taken { animation: taken .9s ease-out; }
  .seat.shake { animation: shake .45s ease-in-out; }
  @keyframes taken {
    0% { transform: scale(1); box-shadow: 0 0 0 0 rgba(251, 140, 0, .7); }
    35% { transform: scale(1.18); box-shadow: 0 0 0 10px rgba(251, 140, 0, .25); }
    100% { transform: scale(1); box-shadow: 0 0 0 16px rgba(251, 140, 0, 0); }
  }
  @keyframes shake { 0%, 100% { transform: none; } 25% { transform: translateX(-4px); }
                     75% { transform: translateX(4px); } }
  @media (prefers-reduced-motion: reduce) {
    .seat.just-taken, .seat.shake { animation-duration: .01s; }
  }
  .legend { display: flex; flex-wrap: wrap; gap: .4em 1.1em; justify-content: center;
            color: var(--muted); font-size: .85em; margin-top: .5em; }
  .legend i { display: inline-block; width: 1em; height: 1em; border-radius: 4px;
              vertical-align: -2px; margin-right: .35em; border: 2px solid; }
  #tray { position: fixed; left: 0; right: 0; bottom: 0; background: #fff;
          border-top: 1px solid #e3e8ef; box-shadow: 0 -4px 16px rgba(0, 0, 0, .06);
          padding: .6em 1em calc(.6em + env(safe-area-inset-bottom)); }
  #tray .inner { max-width: 60em; margin: 0 auto; display: flex; flex-wrap: wrap;
                 align-items: center; gap: .5em 1em; }
  #summary { flex: 1 1 14em; }
  #summary .seats { font-weight: 600; }
  #summary .left { color: var(--muted); font-variant-numeric: tabular-nums; }
  [hidden] { display: none !important; }
  @media (max-width: 480px) {
    header { padding: .6em .75em; }
    header h1 { flex-basis: 60%; }
    label.pick .word { display: none; }
    main { padding: .5em .75em 8em; }
    .hall { margin: 0 -.6em; padding-left: .1em; padding-right: .1em; }
    #map { gap: 4px; grid-template-columns: repeat(var(--cols), 44px); }
    #map .row { display: none; }
    #summary { flex-basis: 100%; }
    #tray button { flex: 1 1 0; white-space: nowrap; }
  }
</style>
<header>
  <h1>Seats for <span id="slot"></span></h1>
  <span id="live" data-state="connecting" aria-live="off">Connecting…</span>
  <div class="bar">
    <label class="pick"><span class="word">Showing</span>
      <select id="showing" class="control" aria-label="Showing"></select></label>
    <span id="who" hidden>You are <b id="me"></b>
      <button id="switch" class="control" type="button">Switch</button></span>
  </div>
</header>
<main>
  <form id="login" hidden>
    <input id="key" autocomplete="off" spellcheck="false" aria-label="API key"
           placeholder="Paste your API key">
    <button class="control primary">Use this key</button>
    <small>Pick seats with your API key.
      No key yet? <code>dibs keys create --holder you</code></small>
  </form>
  <div id="status" role="status" aria-live="polite"></div>
  <div class="hall">
    <div class="screen">SCREEN</div>
    <div id="map" role="group" aria-label="Seats"></div>
  </div>
  <div class="legend">
    <span><i style="background:var(--free);border-color:var(--free-edge)"></i>free</span>
    <span><i style="background:var(--held);border-color:var(--held-edge)"></i>on hold</span>
    <span><i style="background:var(--taken);border-color:var(--taken-edge)"></i>sold</span>
    <span><i style="background:var(--mine);border-color:var(--mine-edge)"></i>held for you</span>
    <span><i style="background:var(--yours);border-color:#0d47a1"></i>yours</span>
  </div>
</main>
<div id="tray" hidden>
  <div class="inner">
    <div id="summary"></div>
    <button id="release" class="control" type="button">Release</button>
    <button id="confirm" class="control primary" type="button">Confirm</button>
  </div>
</div>
<script>
"use strict";
const SLOT = __SLOT__, SLOTS = __SLOTS__, HOLD = __HOLD__, ROWS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const $ = (id) => document.getElementById(id);
const mine = new Map();          // seat -> the claim as the API returned it
const pending = new Set();       // seats this page is claiming right now
const ranOut = [];               // this page's holds that expired since the last draw
let snap = null, offset = 0, key = null, me = null, lastUpdate = null, connected = false;

function readKey() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) {
    sessionStorage.setItem("dibs-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  key = sessionStorage.getItem("dibs-key");
  $("login").hidden = !!key;
  if (!key) { $("who").hidden = true; }
}
$("login").addEventListener("submit", (e) => {
  e.preventDefault();
  const typed = $("key").value.trim();
  if (!typed) return;
  sessionStorage.setItem("dibs-key", typed);
  $("key").value = "";
  readKey();
  loadMine().then((ok) => { if (ok) say("info", `You are now ${me}. Pick your seats.`); });
});
$("switch").addEventListener("click", () => {
  sessionStorage.removeItem("dibs-key");
  key = null; me = null; mine.clear();
  readKey(); say("info", "Paste another API key to pick seats as someone else.");
  $("key").focus(); draw();
});

function say(kind, text) { const s = $("status"); s.dataset.kind = kind; s.textContent = text; }
function label(seat) { return seat.replace(/^seat-/, ""); }
function names(seats) {
  const l = seats.map(label);
  return l.length < 2 ? l.join("") : l.slice(0, -1).join(", ") + " and " + l[l.length - 1];
}
function plural(n, one, many) { return n === 1 ? one : many; }
function nowMs() { return Date.now() + offset; }
function mmss(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  return String(Math.floor(s / 60)).padStart(2, "0") + ":" + String(s % 60).padStart(2, "0");
}
function secondsLeft(expires) { return (Date.parse(expires) - nowMs()) / 1000; }

async function api(method, path, body, extra) {
  const headers = {"Authorization": "Bearer " + key, ...(extra || {})};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const payload = body === undefined ? undefined : JSON.stringify(body);
  try {
    const r = await fetch(path, {method, headers, body: payload});
    let doc = null;
    try { doc = await r.json(); } catch (e) { doc = null; }
    return {status: r.status, doc};
  } catch (e) {
    return {status: 0, doc: {message: "the service cannot be reached"}};
  }
}

async function loadMine() {
  if (!key) return false;
  const r = await api("GET", "/v1/claims?holder=me");
  if (r.status !== 200) {
    say("error", r.status === 401 ? "That API key was not accepted. Paste another one."
                                  : "Could not load your seats (" + r.status + ").");
    if (r.status === 401) { sessionStorage.removeItem("dibs-key"); readKey(); }
    return false;
  }
  me = r.doc.holder; $("me").textContent = me; $("who").hidden = false;
  mine.clear();
  for (const c of r.doc.claims)
    for (const t of c.targets)
      if ("slot" in t && t.slot === SLOT) mine.set(t.resource, c);
  draw();
  return true;
}

function stateOf(seat) {
  const s = snap && snap.seats[seat] ? snap.seats[seat] : {state: "free", expires_at: null};
  const m = mine.get(seat);
  if (m) {
    const dead = m.state === "held" && m.expires_at && Date.parse(m.expires_at) <= nowMs();
    if (dead) { mine.delete(seat); ranOut.push(seat); }
    else return {state: "mine-" + m.state, expires_at: m.state === "held" ? m.expires_at : null};
  }
  if (s.state === "held" && s.expires_at && Date.parse(s.expires_at) <= nowMs())
    return {state: "free", expires_at: null};
  return s;
}

function build() {
  const map = $("map");
  map.replaceChildren();
  map.style.setProperty("--cols", snap.cols);
  for (let r = 0; r < snap.rows; r++) {
    const left = document.createElement("span");
    left.className = "row"; left.textContent = ROWS[r];
    map.appendChild(left);
    for (let c = 0; c < snap.cols; c++) {
      const seat = `seat-${ROWS[r]}${c + 1}`;
      const b = document.createElement("button");
      b.type = "button"; b.className = "seat"; b.dataset.seat = seat;
      const n = document.createElement("span"); n.className = "n"; n.textContent = label(seat);
      const t = document.createElement("span"); t.className = "t";
      b.append(n, t);
      b.addEventListener("click", () => clickSeat(seat));
      b.addEventListener("animationend", () => b.classList.remove("just-taken", "shake"));
      map.appendChild(b);
    }
    map.appendChild(left.cloneNode(true));
  }
}

function animate(seat, name) {
  const b = document.querySelector(`.seat[data-seat="${seat}"]`);
  if (!b) return;
  b.classList.remove(name); void b.offsetWidth; b.classList.add(name);
  setTimeout(() => b.classList.remove(name), 1500);  // if animations are off
}

const WORDS = {"free": "free", "held": "on hold", "confirmed": "sold",
               "mine-held": "held for you", "mine-confirmed": "yours"};

function draw() {
  if (!snap) return;
  const map = $("map");
  const grid = `${snap.rows}x${snap.cols}`;
  if (map.dataset.grid !== grid) { build(); map.dataset.grid = grid; }
  for (const b of map.querySelectorAll(".seat")) {
    const s = stateOf(b.dataset.seat);
    if (b.dataset.state !== s.state) b.dataset.state = s.state;
    const left = s.expires_at ? mmss(secondsLeft(s.expires_at)) : "";
    if (b.lastChild.textContent !== left) b.lastChild.textContent = left;
    const words = `Seat ${label(b.dataset.seat)}, ${WORDS[s.state]}` +
                  (left ? `, ${left} left` : "");
    if (b.getAttribute("aria-label") !== words) {
      b.setAttribute("aria-label", words); b.title = words;
      b.setAttribute("aria-pressed", s.state.startsWith("mine-") ? "true" : "false");
    }
  }
  if (ranOut.length) {
    ranOut.sort();
    say("taken", `Your hold on ${names(ranOut)} ran out; tap a free seat to hold it again.`);
    ranOut.length = 0;
  }
  drawTray();
}

function drawTray() {
  const held = [], yours = [];
  for (const [seat, c] of mine) (c.state === "held" ? held : yours).push(seat);
  held.sort(); yours.sort();
  $("tray").hidden = !key || (held.length === 0 && yours.length === 0);
  const summary = $("summary");
  summary.replaceChildren();
  const add = (cls, text) => {
    const span = document.createElement("span"); span.className = cls; span.textContent = text;
    summary.appendChild(span);
  };
  if (held.length) {
    const soonest = Math.min(...held.map((s) => secondsLeft(mine.get(s).expires_at)));
    add("seats", `${held.length} ${plural(held.length, "seat", "seats")} held: ${names(held)}`);
    add("left", ` · ${mmss(soonest)} left to confirm`);
  }
  if (yours.length) {
    if (held.length) summary.appendChild(document.createElement("br"));
    add("yours", `Yours: ${names(yours)}`);
  }
  $("confirm").hidden = $("release").hidden = held.length === 0;
  $("confirm").textContent = held.length > 1 ? `Confirm ${held.length} seats` : "Confirm seat";
  $("release").textContent = held.length > 1 ? "Release all" : "Release";
}

async function clickSeat(seat) {
  const s = stateOf(seat);
  if (s.state === "mine-confirmed") { say("confirmed", `Seat ${label(seat)} is yours.`); return; }
  if (s.state === "mine-held") { await release([seat]); return; }
  if (s.state !== "free") {
    animate(seat, "shake");
    say("taken", `Seat ${label(seat)} is taken` +
        (s.state === "held" ? " (on hold for someone else)." : " (sold)."));
    return;
  }
  if (!key) { say("error", "Paste your API key first."); $("key").focus(); return; }
  const uuid = crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2);
  pending.add(seat);
  const r = await api("POST", "/v1/claims", {targets: [{resource: seat, slot: SLOT}], ttl: HOLD},
                      {"Idempotency-Key": '"' + uuid + '"'});
  pending.delete(seat);
  if (r.status === 201) {
    mine.set(seat, r.doc);
    const held = [...mine.values()].filter((c) => c.state === "held").length;
    say("held", `Seat ${label(seat)} is held for you for ${mmss(HOLD)}` +
        (held > 1 ? ` — ${held} seats held, confirm them together.` : " — confirm to keep it."));
  } else if (r.status === 409) {
    if (snap) snap.seats[seat] = {state: "held", expires_at: null};
    animate(seat, "shake");
    say("taken", `Sorry — seat ${label(seat)} was just taken by someone else.`);
  } else {
    say("error", `Could not hold ${label(seat)}: ${r.doc ? r.doc.message : r.status}`);
  }
  draw();
}

async function confirmAll() {
  const held = [...mine].filter(([, c]) => c.state === "held").map(([s]) => s).sort();
  if (!held.length) return;
  $("confirm").disabled = true;
  const results = await Promise.all(held.map((seat) => {
    const c = mine.get(seat);
    return api("POST", `/v1/claims/${c.id}/confirm`, {fence: c.fence}).then((r) => [seat, r]);
  }));
  $("confirm").disabled = false;
  const ok = [], lost = [], failed = [];
  for (const [seat, r] of results) {
    if (r.status === 200) { mine.set(seat, r.doc); ok.push(seat); }
    else if (r.status === 409) { mine.delete(seat); lost.push(seat); }
    else failed.push(seat);
  }
  const parts = [];
  if (ok.length) {
    const many = ok.length > 1;
    parts.push(`${many ? "Seats" : "Seat"} ${names(ok)} ${many ? "are" : "is"} yours.`);
  }
  if (lost.length) parts.push(`Too late for ${names(lost)}: the hold ran out.`);
  if (failed.length) parts.push(`Could not confirm ${names(failed)}; try again.`);
  say(lost.length || failed.length ? (ok.length ? "info" : "error") : "confirmed", parts.join(" "));
  draw();
}

async function release(seats) {
  const results = await Promise.all(seats.map((seat) => {
    const c = mine.get(seat);
    return api("DELETE", `/v1/claims/${c.id}`, {fence: c.fence}).then((r) => [seat, r]);
  }));
  const done = [];
  for (const [seat, r] of results)
    if (r.status === 200 || r.status === 409) { mine.delete(seat); done.push(seat); }
  if (done.length === seats.length) say("info", `Released ${names(done)}.`);
  else say("error", "Could not release every seat; try again.");
  draw();
}

$("confirm").addEventListener("click", confirmAll);
$("release").addEventListener("click", () =>
  release([...mine].filter(([, c]) => c.state === "held").map(([s]) => s)));

function ago(ms) {
  const s = Math.round(ms / 1000);
  return s < 5 ? "just now" : s < 60 ? `${s} s ago` : `${Math.floor(s / 60)} min ago`;
}
function drawLive() {
  const live = $("live");
  if (connected) {
    live.dataset.state = "live";
    live.textContent = "Live — updated " + (lastUpdate ? ago(Date.now() - lastUpdate) : "just now");
  } else if (lastUpdate) {
    live.dataset.state = "reconnecting";
    live.textContent = "Reconnecting… last updated " + ago(Date.now() - lastUpdate);
  }
}

function connect() {
  const es = new EventSource(`/v1/showings/${encodeURIComponent(SLOT)}/events`);
  es.addEventListener("open", () => { connected = true; drawLive(); });
  es.addEventListener("seats", (e) => {
    const next = JSON.parse(e.data);
    offset = Date.parse(next.now) - Date.now();
    if (snap) {
      // Another buyer took these: a free seat that is now held or sold, and not by this page.
      for (const [seat, s] of Object.entries(next.seats)) {
        const before = snap.seats[seat];
        if (s.state !== "free" && before && before.state === "free" &&
            !mine.has(seat) && !pending.has(seat)) animate(seat, "just-taken");
      }
    }
    snap = next; connected = true; lastUpdate = Date.now();
    document.body.dataset.version = snap.version;
    draw(); drawLive();
  });
  es.onerror = () => { connected = false; drawLive(); };
}

function pickers() {
  const select = $("showing");
  for (const slot of SLOTS) {
    const o = document.createElement("option");
    o.value = slot; o.textContent = slot; o.selected = slot === SLOT;
    select.appendChild(o);
  }
  select.disabled = SLOTS.length < 2;
  select.addEventListener("change", () => {
    location.assign("/?show=" + encodeURIComponent(select.value));
  });
}

$("slot").textContent = SLOT;
document.title = `Seats for ${SLOT} — dibs`;
pickers(); readKey(); loadMine(); connect();
setInterval(() => { draw(); drawLive(); }, 250);
</script>
</html>
"""
