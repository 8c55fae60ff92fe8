/* isan lens: what the model reads. Plain JavaScript, no build step, no CDN; it uses only the
   server's own endpoints: /v1/stream (bits as you type), /v1/next, /v1/explain, /v1/sample. */
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const el = {
    input: $("input"), view: $("view"), status: $("status"), bpc: $("bpc"), model: $("model"),
    by: $("by"), target: $("target"), char: $("char"), other: $("other"), otherLabel: $("other-label"),
    colour: $("colour"), palette: $("palette"), file: $("file"), theme: $("theme"), permalink: $("permalink"),
    where: $("where"), next: $("next"), check: $("check"), attr: $("attr"), history: $("history"),
    cfSource: $("cf-source"), cfRepl: $("cf-repl"), cfGo: $("cf-go"), cf: $("cf"),
    beta: $("beta"), n: $("n"), seed: $("seed"), sample: $("sample"), insert: $("insert"), sampleOut: $("sample-out"),
    legendBar: $("legend-bar"), legendHi: $("legend-hi"), legendLo: $("legend-lo"), legendUnit: $("legend-unit"),
  };
  // ---- colour scales (viridis, cividis: readable with colour-blindness; 9 stops each) ----
  const SCALES = {
    viridis: ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"],
    cividis: ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8779", "#a69d75", "#c4b56c", "#e4cf5b"],
  };
  const hex = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
  function scaleColour(x) { // x in [0, 1]
    const stops = SCALES[el.palette.value] || SCALES.viridis;
    const t = Math.min(1, Math.max(0, x)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
    const a = hex(stops[i]), b = hex(stops[i + 1]);
    return a.map((v, k) => Math.round(v + f * (b[k] - v)));
  }
  // a visit whose link holds no text opens with the paper's Fig 3 sentence, the cursor on the final
  // 'n' of "revenue" (the prediction the paper explains), so that every panel shows something
  const EXAMPLE = "the annual revenue of the company was seven million dollars";
  const EXAMPLE_POS = EXAMPLE.indexOf("revenue") + 4;
  const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
  const textOn = (c) => (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 140 ? "#111" : "#fff");

  // ---- state ----
  const S = {
    symbols: [], unit: "char", V: 27, maxBits: 8, apiKey: sessionStorage.getItem("isan-lens-key") || "",
    sent: "",            // the text the stream has been sent (in order)
    tokOff: [], tokBits: [],  // every scored symbol: its input offset and bits
    checkpoints: [],     // {off, state, prefix}: a snapshot of the state after text[0:off]
    frames: [],          // frames in flight: {base, end, prefix, t0}
    ws: null, wsReady: false, queue: [],
    cursor: 0, wantPos: null, // the cursor's offset once the text is scored (a link's pos; kept over a reconnection)
    pinned: false, explainSeq: 0, explained: null, cfSpan: null, lastUpdateMs: null,
    sampleText: "", sampleAt: 0, renderFrom: Infinity, rebuildFrom: Infinity,
  };
  window.lensStats = { updates: [], explains: [] };

  function status(msg) { el.status.textContent = msg || ""; }
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (S.apiKey) h["X-API-Key"] = S.apiKey;
    return h;
  }
  async function post(path, body, signal) {
    const r = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body), signal });
    const j = await r.json().catch(() => ({ error: `the server answered ${r.status}` }));
    if (r.status === 401) askKey();
    if (!r.ok) throw new Error(j.error || `HTTP ${r.status}`);
    return j;
  }
  function askKey() {
    const k = window.prompt("This server needs an API key (it stays in this tab only):", "");
    if (k) { S.apiKey = k; sessionStorage.setItem("isan-lens-key", k); connect(); }
  }
  const fmt = (x, d = 3) => (x === null || x === undefined || !isFinite(x) ? "—" : Number(x).toFixed(d));
  const show = (s) => (s === " " ? "␣" : s === "\n" ? "↵" : s);

  // ---- the stream: bits as you type ----
  function wsUrl() {
    const u = new URL("/v1/stream", location.href);
    u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    if (S.apiKey) u.searchParams.set("api_key", S.apiKey);
    return u.href;
  }
  function connect() {
    if (S.ws) { try { S.ws.onclose = null; S.ws.close(); } catch (e) { /* closed */ } }
    S.wsReady = false; S.frames = []; S.sent = ""; S.checkpoints = []; S.tokOff = []; S.tokBits = [];
    const ws = new WebSocket(wsUrl());
    S.ws = ws;
    ws.onopen = () => {
      if (S.wantPos === null) S.wantPos = S.cursor; // the view is empty until the text is scored again
      S.wsReady = true; el.view.textContent = ""; render(0, 0);
      document.body.dataset.state = "ready"; document.body.dataset.scored = "0";
      update();
      if (!S.frames.length) S.wantPos = null; // nothing to score: the cursor stays at 0
    };
    ws.onmessage = (ev) => onFrame(ev.data);
    ws.onerror = () => status("the stream to the server failed; reconnecting…");
    ws.onclose = () => { S.wsReady = false; if (S.ws === ws) setTimeout(connect, 1000); };
  }
  function send(frame, base, end, prefix, safe = true) {
    S.frames.push({ base, end, prefix, safe, t0: performance.now() });
    S.ws.send(JSON.stringify(frame));
  }
  const CHUNK = 512; // a snapshot every 512 characters: an edit rescores at most that much before it
  // Characters and bytes are read one at a time, so the stream can stop anywhere and go on. A pair
  // or a word is read whole: a frame that ends inside one reads it cut (a pair padded, a word split),
  // so for those models the page goes on only from a snapshot taken where a symbol ends for sure
  // (words: after whitespace; pairs: the start) and rescores the rest on every edit.
  const continues = () => S.unit === "char" || S.unit === "byte";
  function sendTokens(first, base, text) {
    const cut = S.unit === "word" ? Math.max(text.lastIndexOf(" "), text.lastIndexOf("\n"), text.lastIndexOf("\t")) + 1 : 0;
    if (cut > base) {
      send({ ...first, text: text.slice(base, cut) }, base, cut, text.slice(0, cut), true);
      if (cut < text.length) send({ text: text.slice(cut), per_char: true, snapshot: true, unknown: "skip" }, cut, text.length, text, false);
    } else send({ ...first, text: text.slice(base) }, base, text.length, text, false);
  }
  function update() {
    if (!S.wsReady) return;
    const text = el.input.value;
    if (text === S.sent) return;
    let p = 0;
    const m = Math.min(text.length, S.sent.length);
    while (p < m && text.charCodeAt(p) === S.sent.charCodeAt(p)) p++;
    const opts = { per_char: true, snapshot: true, unknown: "skip" };
    let base;
    if (p === S.sent.length && continues()) { // typing at the end: only the new characters
      base = p;
    } else { // an edit inside: rescore from the last snapshot before it
      let cp = null;
      for (const c of S.checkpoints) if (c.off <= p && (!cp || c.off > cp.off) && text.startsWith(c.prefix)) cp = c;
      base = cp ? cp.off : 0;
      S.checkpoints = S.checkpoints.filter((c) => c.off <= base);
      const first = { ...opts };
      if (cp) first.restore = cp.state; else first.reset = true;
      if (base === text.length) { send(first, base, base, text); S.sent = text; return; }
      if (!continues()) {
        sendTokens(first, base, text);
        S.sent = text; S.rebuildFrom = Math.min(S.rebuildFrom, p); markPending(p);
        return;
      }
      const end = Math.min(text.length, base + 4 * CHUNK);
      first.text = text.slice(base, end);
      send(first, base, end, text.slice(0, end));
      base = end;
    }
    for (let a = base; a < text.length; a += CHUNK) {
      const b = Math.min(text.length, a + CHUNK);
      send({ text: text.slice(a, b), ...opts }, a, b, text.slice(0, b));
    }
    S.sent = text;
    S.rebuildFrom = Math.min(S.rebuildFrom, p);
    markPending(p);
  }
  function onFrame(data) {
    let j;
    try { j = JSON.parse(data); } catch (e) { return; }
    const f = S.frames.shift();
    if (!f) { if (j.error) status(j.error); return; }
    if (j.error) { status(j.error); if (j.status === 401) askKey(); return; }
    // symbols at or after the frame's start are replaced by the frame's
    S.renderFrom = Math.min(S.renderFrom, f.base);
    let k = lowerBound(S.tokOff, f.base);
    S.tokOff.length = k; S.tokBits.length = k;
    const offs = j.per_char_offsets || [], bits = j.per_char_bits || [];
    for (let i = 0; i < offs.length; i++) { S.tokOff.push(f.base + offs[i]); S.tokBits.push(bits[i]); }
    if (j.state && f.safe) {
      S.checkpoints = S.checkpoints.filter((c) => c.off < f.end);
      S.checkpoints.push({ off: f.end, state: j.state, prefix: f.prefix });
      if (S.checkpoints.length > 96) S.checkpoints.splice(1, 1); // keep the start, thin the oldest
    }
    el.bpc.dataset.bits = j.total_bits; el.bpc.dataset.chars = j.total_chars;
    el.bpc.dataset.bpc = j.total_bpc === null ? "" : j.total_bpc;
    el.bpc.textContent = j.total_chars ? `${fmt(j.total_bpc)} bits per ${S.unit} · ${j.total_chars} ${S.unit}s · ${fmt(j.total_bits, 1)} bits` : "—";
    if (S.frames.length === 0) {
      if (S.wantPos !== null) { S.cursor = S.wantPos; S.wantPos = null; } // render clamps it to the text
      const r0 = performance.now();
      render(Math.min(S.rebuildFrom, el.view.children.length), Math.min(S.renderFrom, el.view.children.length));
      S.rebuildFrom = Infinity;
      window.lensStats.lastRenderMs = performance.now() - r0;
      S.renderFrom = Infinity;
      const ms = performance.now() - f.t0;
      S.lastUpdateMs = ms; window.lensStats.updates.push(ms);
      document.body.dataset.state = "ready";
      document.body.dataset.scored = String(S.sent.length);
      scheduleExplain(150);
    }
  }
  function lowerBound(a, x) { let lo = 0, hi = a.length; while (lo < hi) { const m = (lo + hi) >> 1; if (a[m] < x) lo = m + 1; else hi = m; } return lo; }
  function markPending(from) {
    const spans = el.view.children;
    for (let i = from; i < spans.length; i++) spans[i].classList.add("pending");
    document.body.dataset.state = "busy";
  }

  // ---- the coloured view ----
  // each input character is a span; its bits are the sum of the symbols read at its offset
  function charInfo(text) {
    const n = text.length, bits = new Float64Array(n), count = new Int32Array(n), owner = new Int32Array(n).fill(-1);
    for (let i = 0; i < S.tokOff.length; i++) {
      const o = S.tokOff[i];
      if (o < n) { bits[o] += S.tokBits[i]; count[o] += 1; if (owner[o] < 0) owner[o] = i; }
    }
    // characters without a symbol of their own belong to the symbol they follow (a pair, or dropped by the normaliser)
    let last = -1;
    for (let o = 0; o < n; o++) { if (owner[o] >= 0) last = owner[o]; else if (count[o] === 0) owner[o] = -2 - last; }
    return { bits, count, owner };
  }
  let info = null;
  function render(from, colourFrom) {
    const text = S.sent;
    if (colourFrom === undefined) colourFrom = from;
    info = charInfo(text);
    const view = el.view;
    while (view.children.length > from) view.removeChild(view.lastChild);
    const frag = document.createDocumentFragment();
    for (let o = from; o < text.length; o++) {
      const s = document.createElement("span");
      s.id = "c" + o; s.dataset.off = o; s.setAttribute("role", "option");
      s.textContent = text[o] === "\n" ? "↵\n" : text[o];
      frag.appendChild(s);
    }
    const end = document.createElement("span");
    end.id = "c" + text.length; end.dataset.off = text.length; end.className = "end"; end.setAttribute("role", "option");
    end.setAttribute("aria-label", "end of the text: the next prediction");
    if (view.lastChild && view.lastChild.classList.contains("end")) view.removeChild(view.lastChild);
    frag.appendChild(end);
    view.appendChild(frag);
    colourAll(Math.min(from, colourFrom));
    if (S.cursor > text.length) S.cursor = text.length;
    markCursor();
  }
  function colourAll(from) {
    const spans = el.view.children, text = S.sent, attr = el.colour.value === "attr" && S.explained;
    const amap = attr ? attrMap() : null;
    for (let o = from; o < text.length; o++) {
      const s = spans[o];
      if (!s) break;
      s.classList.remove("pending", "unread");
      const c = info.count[o];
      const own = c > 0 ? o : (info.owner[o] <= -2 ? (-2 - info.owner[o] >= 0 ? S.tokOff[-2 - info.owner[o]] : -1) : -1);
      const b = c > 0 ? info.bits[o] : null;
      s.dataset.bits = b === null ? "" : b;
      s.dataset.tokens = c;
      let col = null;
      if (amap) {
        const v = amap[o];
        if (v !== undefined) col = diverging(v / amap.max);
      } else if (c > 0) col = scaleColour(b / S.maxBits);
      else if (own >= 0) { col = scaleColour(info.bits[own] / S.maxBits); }
      if (c === 0 && own < 0) { s.classList.add("unread"); }
      s.style.background = col ? rgb(col) : "";
      s.style.color = col ? textOn(col) : "";
      const ch = JSON.stringify(text[o]);
      s.setAttribute("aria-label", c > 0 ? `${ch}: ${fmt(b, 2)} bits${c > 1 ? ` (${c} ${S.unit}s)` : ""}` :
        own >= 0 ? `${ch}: read with the ${S.unit} at offset ${own}` : `${ch}: not read (normalised away)`);
    }
  }
  function diverging(x) { // -1 orange .. 0 neutral .. +1 blue (colour-blind safe pair; the bars of the list alike)
    const neg = [224, 123, 0], pos = [33, 102, 172];
    const mid = document.documentElement.dataset.theme === "dark" ? [43, 47, 54] : [240, 240, 240];
    const t = Math.min(1, Math.abs(x)), end = x < 0 ? neg : pos;
    return mid.map((v, k) => Math.round(v + t * (end[k] - v)));
  }
  function attrMap() { // input offset -> contribution of its source
    const e = S.explained, m = {}; let max = 1e-12;
    e.sources.forEach((src, i) => {
      if (i === 0) return;
      const [a, b] = e.source_offsets[i];
      for (let o = a; o < b; o++) m[o] = e.contributions[i];
      max = Math.max(max, Math.abs(e.contributions[i]));
    });
    m.max = max;
    return m;
  }
  function legend() {
    const stops = SCALES[el.palette.value];
    if (el.colour.value === "attr") {
      el.legendBar.style.background = "linear-gradient(90deg, rgb(224,123,0), var(--neutral), rgb(33,102,172))";
      el.legendLo.textContent = "−"; el.legendHi.textContent = "+"; el.legendUnit.textContent = "contribution to the target";
    } else {
      el.legendBar.style.background = `linear-gradient(90deg, ${stops.join(", ")})`;
      el.legendLo.textContent = "0"; el.legendHi.textContent = `≥ ${S.maxBits}`;
      el.legendUnit.textContent = `bits per ${S.unit} (surprisal: −log₂ p)`;
    }
  }

  // ---- the cursor ----
  function symbolAt(o) { // the offset whose first symbol is explained for a cursor at o
    const n = S.sent.length;
    if (o >= n || !info) return n;
    if (info.count[o] > 0) return o;
    const own = info.owner[o] <= -2 ? -2 - info.owner[o] : -1;
    if (own >= 0) return S.tokOff[own];
    for (let k = o; k < n; k++) if (info.count[k] > 0) return k;
    return n;
  }
  function markCursor() {
    const old = el.view.querySelector(".cursor");
    if (old) { old.classList.remove("cursor"); old.removeAttribute("aria-selected"); }
    const s = S.sent ? $("c" + S.cursor) : null; // an empty text has no character to mark
    if (s) { s.classList.add("cursor"); s.setAttribute("aria-selected", "true"); el.view.setAttribute("aria-activedescendant", s.id); }
  }
  function setCursor(o, fromTextarea) {
    o = Math.max(0, Math.min(S.sent.length, o));
    if (o === S.cursor && S.explained && S.explained.offset === o) return;
    S.cursor = o;
    markCursor();
    const s = $("c" + o);
    if (s && !fromTextarea) s.scrollIntoView({ block: "nearest" });
    scheduleExplain();
    savePermalink();
  }
  function moveBy(delta, word) {
    const t = S.sent;
    let o = S.cursor;
    if (word) {
      if (delta > 0) { while (o < t.length && t[o] !== " ") o++; while (o < t.length && t[o] === " ") o++; }
      else { o--; while (o > 0 && t[o] === " ") o--; while (o > 0 && t[o - 1] !== " ") o--; }
    } else o += delta;
    setCursor(o);
  }

  // ---- the explanation at the cursor ----
  // one explanation in flight at a time: a request made meanwhile runs when it returns (the server
  // computes every request it is sent, so aborting would not spare it)
  let explainTimer = null, explainBusy = false, explainAgain = false;
  function scheduleExplain(delay) {
    clearTimeout(explainTimer);
    explainTimer = setTimeout(explainNow, delay === undefined ? 30 : delay);
  }
  async function explainNow() {
    if (!S.wsReady || S.frames.length) return; // after the stream has caught up
    if (explainBusy) { explainAgain = true; return; }
    explainBusy = true; explainAgain = false;
    const text = S.sent, cur = S.cursor, o = symbolAt(cur), t0 = performance.now();
    const by = el.by.value, target = el.target.value, chr = el.char.value, other = el.other.value;
    const body = { text: text.slice(0, Math.min(text.length, o + 64)), offset: o, by, target, unknown: "skip" };
    if (chr) body.char = chr;
    if (target === "logit_diff") body.other = other || S.symbols[0];
    const nextBody = { k: Math.min(S.V, 256), unknown: "skip" };
    if (o > 0) nextBody.text = text.slice(0, o);
    document.body.dataset.explain = "busy";
    try {
      const [e, nx] = await Promise.all([post("/v1/explain", body), post("/v1/next", nextBody)]);
      const stale = text !== S.sent || cur !== S.cursor || by !== el.by.value || target !== el.target.value ||
        chr !== el.char.value || other !== el.other.value;
      if (!stale) {
        S.explained = e;
        drawWhere(e, o);
        drawNext(nx.next, e);
        drawAttr(e);
        drawHistory(e.history);
        if (el.colour.value === "attr") colourAll(0);
        const ms = performance.now() - t0;
        window.lensStats.explains.push(ms);
        document.body.dataset.explainMs = ms.toFixed(1);
        document.body.dataset.explain = "ready";
        document.body.dataset.explainOffset = String(cur);
        status("");
      } else explainAgain = true;
    } catch (err) {
      document.body.dataset.explain = "error";
      status(err.message);
    } finally {
      explainBusy = false;
      if (explainAgain) scheduleExplain(0);
    }
  }
  function drawWhere(e, o) {
    const label = e.actual === null ? "the end of the text" : `${JSON.stringify(e.actual)} (offset ${o}, ${S.unit} ${e.position})`;
    el.where.textContent = `Prediction of ${label}: ${fmt(e.bits)} bits for ${JSON.stringify(e.char)}`;
    el.where.dataset.offset = o; el.where.dataset.position = e.position;
  }
  function row(cls, cells) {
    const r = document.createElement("div");
    r.className = "r " + (cls || ""); r.setAttribute("role", "row");
    for (const c of cells) { const d = typeof c === "string" ? document.createElement("span") : c; if (typeof c === "string") d.textContent = c; d.setAttribute("role", "cell"); r.appendChild(d); }
    return r;
  }
  function barCell(x, neg) {
    const t = document.createElement("span"); t.className = "bar-track";
    const f = document.createElement("span"); f.className = "bar-fill" + (neg ? " neg" : "");
    f.style.width = `${Math.max(0, Math.min(1, x)) * 100}%`; t.appendChild(f); return t;
  }
  function drawNext(list, e) {
    el.next.textContent = "";
    el.next.appendChild(row("head", ["", "sym", "probability", "p", "bits"]));
    const top = list.slice(0, 10);
    const actual = e.actual;
    if (actual !== null && !top.some((x) => x.symbol === actual)) {
      const a = list.find((x) => x.symbol === actual);
      if (a) top.push(a);
    }
    for (const x of top) {
      const isA = x.symbol === actual;
      const r = row(isA ? "actual" : "", [isA ? "▸" : "", show(x.symbol), barCell(x.prob), fmt(x.prob, 4), fmt(x.bits, 2)]);
      r.dataset.symbol = x.symbol; r.dataset.prob = x.prob; r.dataset.bits = x.bits;
      r.setAttribute("aria-label", `${JSON.stringify(x.symbol)}: probability ${fmt(x.prob, 4)}, ${fmt(x.bits, 2)} bits${isA ? ", the actual next symbol" : ""}`);
      el.next.appendChild(r);
    }
  }
  function drawAttr(e) {
    const c = e.check;
    const what = { logit: "logit", logprob: "log p (nats)", logit_diff: "logit difference" }[e.target];
    const tgt = e.target === "logit_diff" ? `${JSON.stringify(e.char)} − ${JSON.stringify(e.other)}` : JSON.stringify(e.char);
    el.check.textContent = `${what} of ${tgt} = ${fmt(e.value, 4)} = base ${fmt(e.base, 4)} + Σ ${e.sources.length} sources ` +
      `${fmt(e.check.sum - e.base, 4)}  (|error| ${c.max_abs_error.toExponential(1)} ${c.ok ? "✓" : "✗"})`;
    el.check.className = "check small " + (c.ok ? "ok" : "bad");
    Object.assign(el.check.dataset, { value: e.value, base: e.base, sum: c.sum, error: c.max_abs_error, logit: e.logit });
    el.attr.textContent = "";
    el.attr.appendChild(row("head", ["", "source", "contribution", ""]));
    const order = e.contributions.map((v, i) => i).sort((a, b) => Math.abs(e.contributions[b]) - Math.abs(e.contributions[a]));
    const max = Math.max(1e-12, ...e.contributions.map(Math.abs));
    for (const i of order.slice(0, 40)) {
      const v = e.contributions[i], src = e.sources[i], [a, b] = e.source_offsets[i];
      const btn = document.createElement("button");
      btn.type = "button"; btn.textContent = "⇄"; btn.title = "counterfactual: remove or replace this source";
      btn.setAttribute("aria-label", `counterfactual for ${JSON.stringify(src)}`);
      btn.disabled = i === 0;
      btn.addEventListener("click", () => chooseCf(i));
      const name = i === 0 ? src : `${JSON.stringify(src)} @${a}`;
      const r = row(S.cfSpan && S.cfSpan[0] === a && S.cfSpan[1] === b && i ? "sel" : "", [btn, name, barCell(Math.abs(v) / max, v < 0), (v >= 0 ? "+" : "") + fmt(v, 4)]);
      r.dataset.source = src; r.dataset.index = i; r.dataset.contribution = v; r.dataset.span = `${a},${b}`;
      r.setAttribute("aria-label", `${i === 0 ? src : JSON.stringify(src)}: ${fmt(v, 4)}`);
      r.addEventListener("mouseenter", () => highlightSrc(a, b));
      r.addEventListener("mouseleave", () => highlightSrc(0, 0));
      el.attr.appendChild(r);
    }
    // every source (not only the top 40) for tests and copy-paste
    el.attr.dataset.contributions = JSON.stringify(e.contributions);
    el.attr.dataset.sources = JSON.stringify(e.sources);
  }
  function highlightSrc(a, b) {
    for (const s of el.view.querySelectorAll(".src")) s.classList.remove("src");
    for (let o = a; o < b; o++) { const s = $("c" + o); if (s) s.classList.add("src"); }
  }
  function drawHistory(h) {
    // T: a strip above the plot for the label of the dashed line, which the line never reaches
    const W = 320, H = 154, L = 34, B = 22, T = 20, bits = h.bits, n = bits.length;
    const ymax = Math.max(1, ...bits, h.full_bits) * 1.05;
    const x = (i) => L + (n > 1 ? (i / (n - 1)) * (W - L - 6) : 0), y = (v) => T + (1 - v / ymax) * (H - B - T);
    const pts = bits.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    el.history.innerHTML = `<svg viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg">
      <path class="axis" d="M${L},${T} V${H - B} H${W - 4}"/>
      <line class="full" x1="${L}" x2="${W - 4}" y1="${y(h.full_bits)}" y2="${y(h.full_bits)}"/>
      <polyline class="curve" points="${pts}"/>
      <text x="2" y="${T + 6}">${fmt(ymax, 1)}</text><text x="2" y="${H - B}">0</text>
      <text x="${L}" y="${H - 6}">0</text><text x="${W - 40}" y="${H - 6}">n = ${n - 1}</text>
      <text x="${L + 40}" y="${H - 6}">symbols of history kept</text>
      <text class="full-label" x="${W - 4}" y="12" text-anchor="end">dashed: full model ${fmt(h.full_bits, 2)} bits</text></svg>`;
    el.history.dataset.bits = JSON.stringify(bits);
    el.history.dataset.full = h.full_bits;
    el.history.setAttribute("aria-label", `Bits of the predicted symbol keeping the last n symbols: n=0 ${fmt(bits[0], 2)}, ` +
      `n=${Math.min(10, n - 1)} ${fmt(bits[Math.min(10, n - 1)], 2)}, all ${fmt(h.full_bits, 2)}`);
  }

  // ---- counterfactual: remove or replace a source and predict again ----
  function chooseCf(i) {
    const e = S.explained; if (!e || i === 0) return;
    S.cfSpan = e.source_offsets[i];
    el.cfSource.textContent = JSON.stringify(S.sent.slice(S.cfSpan[0], S.cfSpan[1]));
    el.cfSource.dataset.span = S.cfSpan.join(",");
    el.cfGo.disabled = false;
    drawAttr(e);
    el.cfRepl.focus();
  }
  async function counterfactual() {
    const e = S.explained; if (!e || !S.cfSpan) return;
    const o = e.offset, [a, b] = S.cfSpan, text = S.sent, repl = el.cfRepl.value;
    const before = text.slice(0, o), after = text.slice(0, a) + repl + text.slice(b, o);
    const k = Math.min(S.V, 1024);
    try {
      const [x, y] = await Promise.all([before ? post("/v1/next", { text: before, k, unknown: "skip" }) : post("/v1/next", { k }),
        after ? post("/v1/next", { text: after, k, unknown: "skip" }) : post("/v1/next", { k })]);
      const find = (l) => l.next.find((z) => z.symbol === e.char) || { prob: 0, bits: Infinity };
      const p0 = find(x), p1 = find(y);
      el.cf.textContent = "";
      const lines = [
        `${repl ? "replace" : "remove"} ${JSON.stringify(text.slice(a, b))}${repl ? " with " + JSON.stringify(repl) : ""}`,
        `p(${JSON.stringify(e.char)}): ${fmt(p0.prob, 4)} → ${fmt(p1.prob, 4)}   bits ${fmt(p0.bits, 2)} → ${fmt(p1.bits, 2)}`,
        `most likely: ${JSON.stringify(x.next[0].symbol)} (${fmt(x.next[0].prob, 3)}) → ${JSON.stringify(y.next[0].symbol)} (${fmt(y.next[0].prob, 3)})`,
        `text read: …${JSON.stringify(after.slice(-40))}`,
      ];
      for (const l of lines) { const d = document.createElement("div"); d.textContent = l; el.cf.appendChild(d); }
      Object.assign(el.cf.dataset, { probBefore: p0.prob, probAfter: p1.prob, topBefore: x.next[0].symbol,
        topAfter: y.next[0].symbol, text: after });
    } catch (err) { el.cf.textContent = err.message; }
  }

  // ---- sampling (Server-Sent Events from POST /v1/sample) ----
  let sampleAbort = null;
  async function sample() {
    if (sampleAbort) sampleAbort.abort();
    sampleAbort = new AbortController();
    const o = S.cursor, prompt = S.sent.slice(0, o);
    const body = { prompt, n: Math.max(1, Math.min(2000, parseInt(el.n.value, 10) || 120)),
      inverse_temperature: Math.max(0, Math.min(100, parseFloat(el.beta.value) || 0)), stream: true };
    if (el.seed.value !== "") body.seed = Math.max(0, parseInt(el.seed.value, 10) || 0);
    el.sampleOut.textContent = ""; el.insert.disabled = true; S.sampleText = ""; S.sampleAt = o;
    const pr = document.createElement("span"); pr.className = "prompt"; pr.textContent = prompt.slice(-60);
    const gen = document.createElement("span");
    el.sampleOut.append(pr, gen);
    el.sampleOut.dataset.state = "streaming"; el.sampleOut.dataset.events = "0";
    try {
      const r = await fetch("/v1/sample", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: sampleAbort.signal });
      if (!r.ok) { const j = await r.json().catch(() => ({})); throw new Error(j.error || `HTTP ${r.status}`); }
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "", events = 0;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          const ev = (block.match(/^event: (.*)$/m) || [])[1], data = JSON.parse((block.match(/^data: (.*)$/m) || [])[1] || "{}");
          events++;
          if (ev === "chars") {
            // a word model's sample is its words joined by spaces: one more space after a prompt that ends in a word
            const sep = S.unit === "word" && !S.sampleText && prompt && !/\s$/.test(prompt) && !/^\s/.test(data.text) ? " " : "";
            S.sampleText += sep + data.text; gen.textContent = S.sampleText;
          }
          else if (ev === "done") {
            el.sampleOut.dataset.seed = data.seed; el.sampleOut.dataset.bits = data.bits; el.sampleOut.dataset.text = data.text;
            status(`sampled ${data.chars} ${S.unit}s at β = ${body.inverse_temperature} (seed ${data.seed}): ${fmt(data.bits / Math.max(1, data.chars))} bits per ${S.unit}`);
          } else if (ev === "error") throw new Error(data.error);
          el.sampleOut.dataset.events = String(events);
        }
      }
      el.sampleOut.dataset.state = "done"; el.insert.disabled = !S.sampleText;
    } catch (err) {
      if (err.name !== "AbortError") { el.sampleOut.dataset.state = "error"; status(err.message); }
    }
  }
  function insertSample() {
    const t = el.input.value, o = S.sampleAt;
    el.input.value = t.slice(0, o) + S.sampleText + t.slice(o);
    update(); el.insert.disabled = true;
  }

  // ---- permalink, theme ----
  let linkTimer = null;
  function savePermalink() {
    clearTimeout(linkTimer);
    linkTimer = setTimeout(() => {
      const p = new URLSearchParams();
      p.set("t", el.input.value);
      for (const k of ["by", "target", "char", "other", "colour", "palette"]) if (el[k].value) p.set(k, el[k].value);
      p.set("pos", String(S.cursor));
      p.set("theme", document.documentElement.dataset.theme || "light");
      history.replaceState(null, "", "#" + p.toString());
    }, 150);
  }
  function loadPermalink() {
    const p = new URLSearchParams(location.hash.slice(1));
    if (p.has("t")) el.input.value = p.get("t");
    else { el.input.value = EXAMPLE; S.wantPos = EXAMPLE_POS; }
    for (const k of ["by", "target", "colour", "palette"]) if (p.has(k)) el[k].value = p.get(k);
    S.wantChar = p.get("char"); S.wantOther = p.get("other");
    if (p.has("pos")) S.wantPos = Math.max(0, parseInt(p.get("pos"), 10) || 0);
    const th = p.get("theme") || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
    setTheme(th);
  }
  function setTheme(t) {
    document.documentElement.dataset.theme = t;
    el.theme.textContent = t === "dark" ? "Light theme" : "Dark theme";
    el.theme.setAttribute("aria-pressed", t === "dark" ? "true" : "false");
    if (info) colourAll(0);
  }

  // ---- wiring ----
  function fillSymbols() {
    for (const sel of [el.char, el.other]) {
      for (const s of S.symbols.slice(0, 4096)) {
        const o = document.createElement("option"); o.value = s; o.textContent = JSON.stringify(s); sel.appendChild(o);
      }
    }
    if (S.wantChar && S.symbols.includes(S.wantChar)) el.char.value = S.wantChar;
    if (S.wantOther && S.symbols.includes(S.wantOther)) el.other.value = S.wantOther;
    el.otherLabel.hidden = el.target.value !== "logit_diff";
  }
  async function start() {
    loadPermalink();
    legend();
    for (;;) {
      try {
        const h = await (await fetch("/healthz")).json();
        if (h.status === "ready") { el.model.textContent = `${h.model.kind || "model"} ${h.model.source || ""} · d = ${h.model.d} · ${h.model.alphabet || ""}`; break; }
        if (h.status === "failed") { status("the model could not be loaded: " + h.error); return; }
        status("loading the model…");
      } catch (e) { status("waiting for the server…"); }
      await new Promise((r) => setTimeout(r, 700));
    }
    try {
      const r = await fetch("/tokenizer_info", { headers: headers() });
      if (r.status === 401) { askKey(); return; }
      const t = await r.json();
      S.symbols = t.symbols; S.unit = t.unit || "char"; S.V = t.symbols.length;
    } catch (e) { status("cannot read the model's symbols: " + e.message); return; }
    S.maxBits = Math.max(4, Math.ceil(Math.log2(Math.max(2, S.V)) * 1.5));
    fillSymbols(); legend(); status("");
    connect();
  }
  el.input.addEventListener("input", () => { update(); savePermalink(); });
  const caret = () => { if (document.activeElement === el.input) setCursor(el.input.selectionStart, true); };
  el.input.addEventListener("keyup", caret);
  el.input.addEventListener("click", caret);
  document.addEventListener("selectionchange", caret);
  el.view.addEventListener("mouseover", (ev) => {
    const s = ev.target.closest && ev.target.closest("span[data-off]");
    if (s && !S.pinned) setCursor(parseInt(s.dataset.off, 10));
  });
  el.view.addEventListener("click", (ev) => {
    const s = ev.target.closest && ev.target.closest("span[data-off]");
    if (s) { S.pinned = !S.pinned || S.cursor !== parseInt(s.dataset.off, 10); setCursor(parseInt(s.dataset.off, 10)); el.view.focus(); }
  });
  el.view.addEventListener("keydown", (ev) => {
    const keys = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: 1, ArrowUp: -1 };
    if (ev.key in keys) { moveBy(keys[ev.key], ev.ctrlKey || ev.altKey || ev.metaKey); S.pinned = true; ev.preventDefault(); }
    else if (ev.key === "Home") { setCursor(0); ev.preventDefault(); }
    else if (ev.key === "End") { setCursor(S.sent.length); ev.preventDefault(); }
    else if (ev.key === "Escape") { S.pinned = false; }
  });
  for (const k of ["by", "target", "char", "other"]) el[k].addEventListener("change", () => {
    el.otherLabel.hidden = el.target.value !== "logit_diff";
    scheduleExplain(); savePermalink();
  });
  el.colour.addEventListener("change", () => { legend(); if (info) colourAll(0); savePermalink(); });
  el.palette.addEventListener("change", () => { legend(); if (info) colourAll(0); savePermalink(); });
  el.theme.addEventListener("click", () => { setTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark"); savePermalink(); });
  el.permalink.addEventListener("click", async () => {
    clearTimeout(linkTimer);
    savePermalink(); await new Promise((r) => setTimeout(r, 200));
    try { await navigator.clipboard.writeText(location.href); status("link copied"); } catch (e) { status("the link is in the address bar"); }
  });
  el.file.addEventListener("change", async () => {
    const f = el.file.files[0]; if (!f) return;
    el.input.value = await f.text(); update(); savePermalink();
  });
  el.cfGo.addEventListener("click", counterfactual);
  el.cfRepl.addEventListener("keydown", (ev) => { if (ev.key === "Enter") counterfactual(); });
  el.sample.addEventListener("click", sample);
  el.insert.addEventListener("click", insertSample);
  window.addEventListener("hashchange", () => { /* the permalink is written by the page; reloads read it */ });
  start();
})();
