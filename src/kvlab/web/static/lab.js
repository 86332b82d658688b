/* kvlab lab: draws the frames kvlab's simulator sends (live, from the server) or replays a recorded frame log
 * (the --html export). Nothing here simulates: every number on the page comes from a frame or from the server.
 * No dependencies, no network beyond the page's own origin. */
"use strict";
(function () {

// ---------------------------------------------------------------- colours and patterns
// Okabe & Ito's colour-blind-safe palette (without black, which reads as "token" of nobody). Conversation k gets
// PALETTE[k % 7]; the memory states differ by lightness and pattern as well as hue, so they read in grey too:
//   token: solid · reserved: pale tint · internal fragmentation: pale with diagonal stripes ·
//   allocator overhead: grey cross-hatch · free: plain grey.
const PALETTE = [
  [0xE6, 0x9F, 0x00], [0x56, 0xB4, 0xE9], [0x00, 0x9E, 0x73], [0xF0, 0xE4, 0x42],
  [0x00, 0x72, 0xB2], [0xD5, 0x5E, 0x00], [0xCC, 0x79, 0xA7],
];
const PALETTE_NAMES = ["orange", "sky blue", "green", "yellow", "blue", "vermillion", "purple"];
const PALE = 0.3; // reserved slots: the conversation's colour at 30% over white
const FREE_RGB = [0xD9, 0xD9, 0xD9];
const GAP_RGB = [0xFF, 0xFF, 0xFF];
const OVERHEAD_BG = [0xF4, 0xF4, 0xF4];
const OVERHEAD_LINE = [0x60, 0x60, 0x60];

const TOKEN = 0, RESERVED = 1, INTERNAL = 2, OVERHEAD = 3, FREE = 4;
const STATE_NAMES = ["tokens", "reserved, still empty", "internal fragmentation (never used)",
  "allocator overhead", "free"];

function pale(rgb, f) { return rgb.map(v => Math.round(255 - (255 - v) * f)); }
function hex(rgb) { return "#" + rgb.map(v => v.toString(16).padStart(2, "0")).join(""); }
// ImageData is RGBA bytes; read as little-endian 32-bit words they are ABGR.
function word(rgb) { return ((255 << 24) | (rgb[2] << 16) | (rgb[1] << 8) | rgb[0]) >>> 0; }

const SOLID32 = PALETTE.map(word);
const PALE32 = PALETTE.map(c => word(pale(c, PALE)));
const FREE32 = word(FREE_RGB), GAP32 = word(GAP_RGB);
const OVER_BG32 = word(OVERHEAD_BG), OVER_LINE32 = word(OVERHEAD_LINE);
const BOUNDARY32 = word([0x33, 0x33, 0x33]);

// The colour of one pixel at canvas position (x, y), for a slot state and a conversation colour.
// Patterns are anchored to the canvas, so stripes run on across neighbouring squares.
function pixel(state, colour, x, y) {
  switch (state) {
    case TOKEN: return SOLID32[colour];
    case RESERVED: return PALE32[colour];
    case INTERNAL: return (x + y) % 3 === 0 ? SOLID32[colour] : PALE32[colour];
    case OVERHEAD: return ((x + y) % 3 === 0 || (x - y + 3000) % 3 === 0) ? OVER_LINE32 : OVER_BG32;
    default: return FREE32;
  }
}

function colourOf(owner) { return owner >= 0 ? owner % PALETTE.length : 0; }

// ---------------------------------------------------------------- frames on the wire (see kvlab/web/frames.py)
function base64Bytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// Columns in wire order: owner i32, token u16, reserved u16, internal u16, overhead u16, shared u8.
function decodeBlocks(msg) {
  const buf = base64Bytes(msg.data).buffer;
  const m = msg.n;
  let off = 0, index = null;
  if (!msg.key) { index = new Uint32Array(buf, 0, m); off = 4 * m; }
  const owner = new Int32Array(buf, off, m); off += 4 * m;
  const token = new Uint16Array(buf, off, m); off += 2 * m;
  const reserved = new Uint16Array(buf, off, m); off += 2 * m;
  const internal = new Uint16Array(buf, off, m); off += 2 * m;
  const overhead = new Uint16Array(buf, off, m); off += 2 * m;
  const shared = new Uint8Array(buf, off, m);
  return { key: msg.key, index, owner, token, reserved, internal, overhead, shared };
}

// ---------------------------------------------------------------- the grid
// One square per block while squares of at least MIN_CELL pixels fit; past that, one square stands for k blocks
// and shows the sum of their states (its stripes are the mix) in the colour of the conversation holding most.
const MIN_CELL = 4, MAX_CELL = 32;

function chooseLayout(n, width, maxHeight) {
  for (let s = MAX_CELL; s >= MIN_CELL; s--) {
    const cols = Math.max(1, Math.floor(width / s));
    const rows = Math.ceil(n / cols);
    if (rows * s <= maxHeight) return { s, cols, rows, k: 1, cells: n };
  }
  const s = MIN_CELL;
  const cols = Math.max(1, Math.floor(width / s));
  const maxRows = Math.max(1, Math.floor(maxHeight / s));
  const k = Math.ceil(n / (cols * maxRows));
  const cells = Math.ceil(n / k);
  return { s, cols, rows: Math.ceil(cells / cols), k, cells };
}

class GridView {
  constructor(host, numBlocks, blockSize, maxHeight) {
    this.n = numBlocks;
    this.blockSize = blockSize;
    this.owner = new Int32Array(numBlocks).fill(-1);
    this.token = new Uint16Array(numBlocks);
    this.reserved = new Uint16Array(numBlocks);
    this.internal = new Uint16Array(numBlocks);
    this.overhead = new Uint16Array(numBlocks);
    this.shared = new Uint8Array(numBlocks);
    const width = Math.max(120, Math.floor(host.clientWidth || 600));
    this.layout = chooseLayout(numBlocks, width, maxHeight);
    const L = this.layout;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "grid";
    this.canvas.width = L.cols * L.s;
    this.canvas.height = L.rows * L.s;
    host.appendChild(this.canvas);
    this.ctx = this.canvas.getContext("2d");
    this.image = this.ctx.createImageData(this.canvas.width, this.canvas.height);
    this.px = new Uint32Array(this.image.data.buffer);
    this.px.fill(GAP32);
    this.dirty = new Uint8Array(L.cells);
    this.dirtyList = [];
    this.allDirty = true;
  }

  apply(msg) {
    const d = decodeBlocks(msg);
    if (d.key) {
      this.owner.set(d.owner); this.token.set(d.token); this.reserved.set(d.reserved);
      this.internal.set(d.internal); this.overhead.set(d.overhead); this.shared.set(d.shared);
      this.allDirty = true;
      return;
    }
    const k = this.layout.k;
    for (let j = 0; j < d.index.length; j++) {
      const b = d.index[j];
      this.owner[b] = d.owner[j]; this.token[b] = d.token[j]; this.reserved[b] = d.reserved[j];
      this.internal[b] = d.internal[j]; this.overhead[b] = d.overhead[j]; this.shared[b] = d.shared[j];
      this.markDirty((b / k) | 0);
      if (b + 1 < this.n) this.markDirty(((b + 1) / k) | 0); // its neighbour's boundary mark may change
    }
  }

  markDirty(c) {
    if (!this.dirty[c]) { this.dirty[c] = 1; this.dirtyList.push(c); }
  }

  // Sum of the states over the blocks of cell c, and the owner holding the most of them.
  cellState(c) {
    const k = this.layout.k, lo = c * k, hi = Math.min(this.n, lo + k);
    let t = 0, r = 0, i = 0, o = 0, owner = -1, best = -1;
    for (let b = lo; b < hi; b++) {
      t += this.token[b]; r += this.reserved[b]; i += this.internal[b]; o += this.overhead[b];
      const held = this.token[b] + this.reserved[b] + this.internal[b] + this.overhead[b];
      if (this.owner[b] >= 0 && held > best) { best = held; owner = this.owner[b]; }
    }
    const total = (hi - lo) * this.blockSize;
    return { lo, hi, t, r, i, o, f: Math.max(0, total - t - r - i - o), total, owner };
  }

  paintCell(c) {
    const L = this.layout, W = this.canvas.width;
    const x0 = (c % L.cols) * L.s, y0 = ((c / L.cols) | 0) * L.s;
    const w = L.s - 1, h = L.s - 1; // one pixel of white between squares
    const st = this.cellState(c);
    const area = w * h;
    // Fill the square column by column, left to right: tokens first, then reserved, internal, overhead, free,
    // each taking its share of the square's pixels.
    const b0 = Math.round(area * st.t / st.total);
    const b1 = Math.round(area * (st.t + st.r) / st.total);
    const b2 = Math.round(area * (st.t + st.r + st.i) / st.total);
    const b3 = Math.round(area * (st.t + st.r + st.i + st.o) / st.total);
    const colour = colourOf(st.owner);
    let p = 0;
    for (let x = 0; x < w; x++) {
      for (let y = 0; y < h; y++, p++) {
        const state = p < b0 ? TOKEN : p < b1 ? RESERVED : p < b2 ? INTERNAL : p < b3 ? OVERHEAD : FREE;
        this.px[(y0 + y) * W + x0 + x] = pixel(state, colour, x0 + x, y0 + y);
      }
    }
    // Two conversations of the same colour side by side would read as one: mark where the second begins.
    const prev = st.lo - 1;
    if (L.k === 1 && st.owner >= 0 && prev >= 0 && this.owner[prev] >= 0 && this.owner[prev] !== st.owner &&
        colourOf(this.owner[prev]) === colour && w >= 3) {
      for (let y = 0; y < h; y++) this.px[(y0 + y) * W + x0] = BOUNDARY32;
    }
  }

  draw() {
    if (this.allDirty) {
      for (let c = 0; c < this.layout.cells; c++) this.paintCell(c);
      this.allDirty = false;
      for (const c of this.dirtyList) this.dirty[c] = 0;
      this.dirtyList = [];
      this.ctx.putImageData(this.image, 0, 0);
      return true;
    }
    if (!this.dirtyList.length) return false;
    // Copy only the rows that changed to the canvas.
    const L = this.layout;
    let r0 = L.rows, r1 = -1;
    for (const c of this.dirtyList) {
      this.paintCell(c);
      this.dirty[c] = 0;
      const r = (c / L.cols) | 0;
      if (r < r0) r0 = r;
      if (r > r1) r1 = r;
    }
    this.dirtyList = [];
    this.ctx.putImageData(this.image, 0, 0, 0, r0 * L.s, this.canvas.width, (r1 - r0 + 1) * L.s);
    return true;
  }

  cellAt(evt) {
    const rect = this.canvas.getBoundingClientRect();
    const x = Math.floor((evt.clientX - rect.left) * this.canvas.width / rect.width);
    const y = Math.floor((evt.clientY - rect.top) * this.canvas.height / rect.height);
    const L = this.layout;
    const col = Math.floor(x / L.s), row = Math.floor(y / L.s);
    if (col < 0 || col >= L.cols || row < 0) return -1;
    const c = row * L.cols + col;
    return c < L.cells ? c : -1;
  }

  // The canvas position of a block's square (for tests and the tooltip).
  blockRect(b) {
    const L = this.layout, c = Math.floor(b / L.k);
    return { x: (c % L.cols) * L.s, y: Math.floor(c / L.cols) * L.s, w: L.s - 1, h: L.s - 1, cell: c };
  }

  describe(c, requests) {
    const st = this.cellState(c);
    const lines = [];
    lines.push(st.hi - st.lo === 1 ? `block ${st.lo}` : `blocks ${st.lo}–${st.hi - 1} (one square = ${st.hi - st.lo} blocks)`);
    if (st.owner < 0) {
      lines.push(`free: ${st.f} of ${st.total} slots`);
      return lines.join("\n");
    }
    const req = requests && requests.get(st.owner);
    const who = req ? `conversation ${st.owner}: prompt ${req[2]} + answer ${req[3]} tokens` : `conversation ${st.owner}`;
    lines.push(who + ` (${PALETTE_NAMES[colourOf(st.owner)]})`);
    if (st.hi - st.lo === 1 && this.shared[st.lo]) lines.push("shared with other conversations (same prefix)");
    const parts = [[st.t, "tokens"], [st.r, "reserved, still empty"], [st.i, "never to be used"],
      [st.o, "allocator overhead"], [st.f, "free"]].filter(([v]) => v > 0);
    lines.push(parts.map(([v, name]) => `${v} ${name}`).join(", ") + ` (of ${st.total} slots)`);
    return lines.join("\n");
  }
}

// A legend swatch drawn by the same pixel function as the grid, so the legend is what the grid shows.
function swatch(state, colour, size = 15) {
  const c = document.createElement("canvas");
  c.width = size; c.height = size;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(size, size);
  const px = new Uint32Array(img.data.buffer);
  for (let y = 0; y < size; y++) for (let x = 0; x < size; x++) px[y * size + x] = pixel(state, colour, x, y);
  ctx.putImageData(img, 0, 0);
  return c;
}

function buildLegend(host) {
  host.innerHTML = "";
  const add = (canvases, label, cls) => {
    const item = document.createElement("span");
    item.className = "item" + (cls ? " " + cls : "");
    for (const cv of canvases) item.appendChild(cv);
    item.appendChild(document.createTextNode(label));
    host.appendChild(item);
  };
  add([0, 1, 2].map(k => swatch(TOKEN, k)), "solid: tokens (one colour per conversation)", "legend-token");
  add([0, 1, 2].map(k => swatch(RESERVED, k)), "pale: reserved, still empty", "legend-reserved");
  add([0, 1, 2].map(k => swatch(INTERNAL, k)), "striped: reserved, never to be used", "legend-internal");
  add([swatch(OVERHEAD, 0)], "cross-hatched: allocator overhead", "legend-overhead");
  add([swatch(FREE, 0)], "grey: free", "legend-free");
}

// ---------------------------------------------------------------- formatting
const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const nf1 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const nf2 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
function gib(bytes) { return nf2.format(bytes / 2 ** 30) + " GiB"; }
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

async function api(path, options) {
  const resp = await fetch(path, options);
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const msg = body && body.error ? body.error : `the server answered ${resp.status}`;
    throw new Error(msg);
  }
  return body;
}

// Writing the same text or style again still costs the browser a layout: write only what changed.
function setText(node, text) { if (node.textContent !== text) node.textContent = text; }
function setData(node, key, value) { const v = String(value); if (node.dataset[key] !== v) node.dataset[key] = v; }

function showError(node, err) {
  if (!node) return;
  if (err) { node.textContent = err.message || String(err); node.hidden = false; }
  else { node.textContent = ""; node.hidden = true; }
}

// ---------------------------------------------------------------- what the questions point at
// The latest numbers per memory strategy, from whatever grid or race ran last.
const facts = {};

function noteFacts(info, grid, finish) {
  if (!grid.counters.step) return; // nothing has run yet
  const f = facts[info.allocator] = facts[info.allocator] || {};
  f.name = info.name;
  f.block_size = info.block_size;
  f.counters = grid.counters;
  f.usage = grid.usage;
  if (finish) f.summary = finish;
  answersDue = true;
}

// The answers are rewritten at most once per drawn frame (Player.scheduleDraw), not once per grid per frame.
let answersDue = false;

function pct(v) { return nf1.format(v) + "%"; }

function renderAnswers() {
  const q1 = document.querySelector('[data-answer="q1"]');
  const q2 = document.querySelector('[data-answer="q2"]');
  const q3 = document.querySelector('[data-answer="q3"]');
  if (q1 && facts.max) {
    const f = facts.max, u = f.usage, total = u.token + u.reserved + u.internal_fragmentation + u.overhead + u.free;
    let text = `What you just saw (${f.name}): ${pct(100 * u.token / total)} of the cache holds tokens, ` +
      `${pct(100 * u.internal_fragmentation / total)} is reserved for answer tokens that will never come, ` +
      `${pct(100 * u.reserved / total)} waits for tokens still to come, ${pct(100 * u.free / total)} is free.`;
    if (f.summary) {
      const s = f.summary.memory_shares;
      text += ` Over the whole run: ${pct(s.token)} tokens, ${pct(s.internal_fragmentation)} never used, ` +
        `${pct(s.external_fragmentation)} free or between slabs.`;
    }
    setText(q1, text);
  }
  if (q2 && facts.paged) {
    const f = facts.paged, c = f.counters;
    setText(q2, `What you just saw (${f.name}, ${f.block_size}-token pages): the most empty slots any ` +
      `conversation held at once was ${nf0.format(c.max_unfilled_per_request)}; the bound is ` +
      `${f.block_size - 1}. ${pct(c.token_share)} of the cache holds tokens right now.`);
  }
  if (q3 && facts.paged) {
    const c = facts.paged.counters;
    const done = c.num_output_tokens || 0;
    setText(q3, c.num_preemptions > 0
      ? `What you just saw (${facts.paged.name}): ${nf0.format(c.num_preemptions)} evictions; ` +
        `${nf0.format(c.num_recomputed_tokens)} tokens had to be computed again, work the GPU already did once ` +
        `(${done ? pct(100 * c.num_recomputed_tokens / done) : "—"} of the ${nf0.format(done)} tokens generated so far).`
      : `In your last paged run memory never ran out: 0 evictions. Press "show me" to shrink the cache and raise the rate.`);
  }
}

// ---------------------------------------------------------------- a player: views, counters, transport
const COUNTERS = [
  ["token_share", "memory holding tokens", v => pct(v)],
  ["num_running", "running", v => nf0.format(v)],
  ["num_waiting", "waiting", v => nf0.format(v)],
  ["num_finished", "finished", v => nf0.format(v)],
  ["num_preemptions", "evictions", v => nf0.format(v)],
  ["num_recomputed_tokens", "recomputed tokens", v => nf0.format(v)],
  ["throughput_tps", "throughput (tokens/s)", v => nf1.format(v)],
  ["num_rejected", "rejected", v => nf0.format(v)],
];

const stats = { framesApplied: 0, framesDrawn: 0, drawMs: 0, playAt: null, firstFrameAt: null, firstDrawAt: null };

class Player {
  constructor(section, kind) {
    this.section = section;
    this.kind = kind;
    this.panelsHost = section.querySelector(".panels");
    this.errorNode = section.querySelector(".error");
    this.transport = section.querySelector(".transport");
    this.finishNode = section.querySelector(".finish");
    this.views = [];
    this.panels = [];
    this.meta = null;
    this.requests = new Map();
    this.seq = -1;
    this.playing = false;
    this.done = false;
    this.drawPending = false;
    this.speed = Number(this.transport.querySelector('[data-act="speed"]').value);
    this.transport.addEventListener("click", e => {
      const act = e.target.closest("button") && e.target.closest("button").dataset.act;
      if (act === "play") this.toggle();
      else if (act === "step") this.step();
      else if (act === "finish") this.finish();
      else if (act === "reset") this.reset();
    });
    this.transport.querySelector('[data-act="speed"]').addEventListener("change", e => {
      this.speed = Number(e.target.value);
      if (this.playing) { this.pause(); this.play(); }
    });
    section.addEventListener("pointerdown", () => { activePlayer = this; });
    section.addEventListener("focusin", () => { activePlayer = this; });
  }

  build(meta) {
    this.meta = meta;
    this.requests = new Map(meta.requests.map(r => [r[0], r]));
    this.panelsHost.innerHTML = "";
    this.views = [];
    this.panels = [];
    if (this.finishNode) { this.finishNode.hidden = true; this.finishNode.innerHTML = ""; }
    const race = meta.grids.length > 1;
    const maxHeight = race ? 300 : 420;
    this.panelsHost.style.gridTemplateColumns = `repeat(${meta.grids.length}, minmax(0, 1fr))`;
    // All panels first, then the grids: each grid measures the width its panel really gets.
    const wraps = meta.grids.map(info => {
      const panel = el("div", { class: "panel", "data-strategy": info.name });
      panel.append(el("h3", {}, info.name + " ", el("span", { class: "desc", text: info.description || "" })));
      const wrap = el("div", { class: "gridwrap" });
      panel.append(wrap);
      this.panelsHost.append(panel);
      return [info, panel, wrap];
    });
    for (const [info, panel, wrap] of wraps) {
      const view = new GridView(wrap, meta.num_blocks, meta.block_size, maxHeight);
      const L = view.layout;
      panel.append(el("div", { class: "scale", text:
        `${nf0.format(meta.num_blocks)} blocks of ${meta.block_size} slots` +
        (L.k > 1 ? ` · one square = ${L.k} blocks` : " · one square = one block") +
        ` · ${nf0.format(meta.num_slots)} token slots` }));
      const bar = el("div", { class: "sharebar", title: "memory: tokens · reserved · never used · overhead · free" });
      for (const k of ["token", "reserved", "internal_fragmentation", "overhead"]) bar.append(el("span", { class: k }));
      panel.append(bar);
      const dl = el("dl", { class: "counters" });
      const fields = {};
      for (const [key, label] of COUNTERS) {
        const dd = el("dd", { "data-counter": key, text: "–" });
        dl.append(el("dt", { text: label }), dd);
        fields[key] = dd;
      }
      panel.append(dl);
      view.canvas.addEventListener("mousemove", e => this.hover(view, e));
      view.canvas.addEventListener("mouseleave", () => { tooltip.hidden = true; });
      this.views.push(view);
      this.panels.push({ panel, bar, fields, info });
    }
  }

  hover(view, e) {
    const c = view.cellAt(e);
    if (c < 0) { tooltip.hidden = true; return; }
    tooltip.textContent = view.describe(c, this.requests);
    tooltip.hidden = false;
    tooltip.style.left = Math.min(window.innerWidth - 350, e.clientX + 14) + "px";
    tooltip.style.top = (e.clientY + 14) + "px";
  }

  onFrame(frame) {
    this.seq = frame.seq;
    stats.framesApplied++;
    if (stats.playAt !== null && stats.firstFrameAt === null) stats.firstFrameAt = performance.now();
    frame.grids.forEach((g, i) => {
      this.views[i].apply(g.blocks);
      const p = this.panels[i];
      for (const [key, , fmt] of COUNTERS) {
        if (key in g.counters) { setText(p.fields[key], fmt(g.counters[key])); setData(p.fields[key], "value", g.counters[key]); }
      }
      const u = g.usage, total = u.token + u.reserved + u.internal_fragmentation + u.overhead + u.free;
      const spans = p.bar.children;
      ["token", "reserved", "internal_fragmentation", "overhead"].forEach((k, j) => {
        const width = (100 * u[k] / total).toFixed(2) + "%";
        if (spans[j].style.width !== width) spans[j].style.width = width;
      });
      const summary = frame.finish ? frame.finish.summaries[i] : null;
      noteFacts(p.info, g, summary);
    });
    const clock = this.transport.querySelector('[data-field="clock"]');
    setText(clock, `t = ${nf1.format(frame.t)} s` + (frame.done ? " · done" : ""));
    setData(clock, "value", frame.t);
    setData(this.section, "seq", frame.seq);
    if (frame.done) { this.done = true; this.setPlaying(false); }
    if (frame.finish) this.showFinish(frame.finish);
    this.scheduleDraw();
  }

  scheduleDraw() {
    if (this.drawPending) return;
    this.drawPending = true;
    requestAnimationFrame(() => {
      this.drawPending = false;
      const t0 = performance.now();
      let drew = false;
      for (const v of this.views) drew = v.draw() || drew;
      if (answersDue) { answersDue = false; renderAnswers(); }
      if (drew) {
        stats.framesDrawn++;
        stats.drawMs += performance.now() - t0;
        if (stats.playAt !== null && stats.firstDrawAt === null) stats.firstDrawAt = performance.now();
      }
    });
  }

  showFinish(finish) {
    if (!this.finishNode) return;
    const node = this.finishNode;
    node.innerHTML = "";
    node.append(el("p", { class: "verdict", text: finish.verdict }));
    const cols = [
      ["num_finished", "finished", v => nf0.format(v)],
      ["finish_time", "all served at (s)", v => nf1.format(v)],
      ["throughput_rps", "requests/s", v => nf2.format(v)],
      ["throughput_tps", "tokens/s", v => nf1.format(v)],
      ["token_share", "memory holding tokens (time avg.)", v => pct(v)],
      ["mean_batch_size", "mean batch", v => nf1.format(v)],
      ["preemptions", "evictions", v => nf0.format(v)],
      ["recomputed_tokens", "recomputed tokens", v => nf0.format(v)],
      ["normalized_latency_mean", "normalized latency (s/token)", v => nf2.format(v)],
    ];
    const table = el("table", { class: "summary" });
    const head = el("tr", {}, el("th", { text: "strategy" }));
    for (const [, label] of cols) head.append(el("th", { text: label }));
    table.append(head);
    finish.summaries.forEach((s, i) => {
      const row = el("tr", { "data-strategy": s.name }, el("td", { text: s.name + (s.name === finish.winner ? " ★" : "") }));
      const flat = flatSummary(s);
      for (const [key, , fmt] of cols) {
        const v = flat[key];
        row.append(el("td", { "data-key": key, "data-value": v === undefined || v === null ? "" : String(v),
          text: v === undefined || v === null ? "–" : fmt(v) }));
      }
      table.append(row);
    });
    node.append(table);
    node.hidden = false;
    this.panels.forEach(p => p.panel.classList.toggle("winner", p.info.name === finish.winner));
  }

  setPlaying(on) {
    this.playing = on;
    const b = this.transport.querySelector('[data-act="play"]');
    b.classList.toggle("playing", on);
    b.textContent = on ? "❚❚ pause" : "▶ play";
  }

  toggle() { if (this.playing) this.pause(); else this.play(); }
}

function flatSummary(s) {
  const nl = s.normalized_latency_s_per_token || {};
  return {
    num_finished: s.num_finished, finish_time: s.makespan_s, throughput_rps: s.throughput_rps,
    throughput_tps: s.throughput_tps, token_share: s.memory_shares && s.memory_shares.token,
    mean_batch_size: s.mean_batch_size, preemptions: s.preemptions, recomputed_tokens: s.recomputed_tokens,
    normalized_latency_mean: nl.mean,
  };
}

// Live: the engine runs on the server; frames arrive as server-sent events over a streaming fetch (so that an
// HTTP 400 carries its message to the page, which EventSource cannot do).
class LivePlayer extends Player {
  constructor(section, kind, form) {
    super(section, kind);
    this.form = form;
    this.session = null;
    this.abort = null;
    this.stale = true;
    this.timer = null;
    this.resetting = null;
    // A changed control starts a new run (shortly, so that typing a number does not start one per digit).
    form.addEventListener("change", () => {
      this.stale = true;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.reset(), 250);
    });
  }

  spec() {
    const data = Object.fromEntries(new FormData(this.form).entries());
    const spec = { kind: this.kind };
    if (this.kind === "grid") {
      spec.strategies = [`${data.batching}+${data.allocator}`];
      delete data.batching; delete data.allocator;
    } else {
      spec.strategies = data.strategies.split(",").map(s => s.trim()).filter(Boolean);
      delete data.strategies;
    }
    for (const [k, v] of Object.entries(data)) spec[k] = v;
    if (spec.num_blocks === "auto" || spec.num_blocks === "") delete spec.num_blocks;
    return spec;
  }

  reset() {
    clearTimeout(this.timer);
    if (!this.resetting) this.resetting = this.newRun().finally(() => { this.resetting = null; });
    return this.resetting;
  }

  async newRun() {
    this.pause();
    this.stale = false; // a control changed from here on makes the run stale again
    const old = this.session;
    this.session = null;
    if (old) fetch(`api/sessions/${old}`, { method: "DELETE" }).catch(() => {});
    this.setBusy(true);
    try {
      const meta = await api("api/sessions", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(this.spec()) });
      showError(this.errorNode, null);
      this.session = meta.session_id;
      this.section.dataset.session = meta.session_id;
      this.done = false;
      this.build(meta);
      this.onFrame(meta.frame);
    } catch (err) {
      showError(this.errorNode, err);
    } finally {
      this.setBusy(false);
    }
  }

  setBusy(on) { this.section.classList.toggle("busy", on); this.section.dataset.busy = on ? "1" : ""; }

  async ready() {
    if (this.resetting) await this.resetting;
    if (!this.session || this.stale) await this.reset();
    return this.session !== null;
  }

  async play() {
    if (this.playing || this.starting) return; // one stream at a time: two would interleave their deltas
    stats.playAt = performance.now(); stats.firstFrameAt = null; stats.firstDrawAt = null;
    this.starting = true;
    try {
      if (!(await this.ready()) || this.done) return;
    } finally {
      this.starting = false;
    }
    this.setPlaying(true);
    const ctrl = new AbortController();
    this.abort = ctrl;
    try {
      const resp = await fetch(`api/sessions/${this.session}/stream?speed=${this.speed}&have=${this.seq}`,
        { signal: ctrl.signal });
      if (!resp.ok) {
        let msg = `the server answered ${resp.status}`;
        try { msg = (await resp.json()).error || msg; } catch (e) { /* keep the status */ }
        throw new Error(msg);
      }
      showError(this.errorNode, null);
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let event = "message", data = "";
          for (const line of chunk.split("\n")) {
            if (line.startsWith("event: ")) event = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (event === "frame") this.onFrame(JSON.parse(data));
          else if (event === "error") throw new Error(JSON.parse(data).error);
        }
      }
    } catch (err) {
      if (err.name !== "AbortError") showError(this.errorNode, err);
    } finally {
      if (this.abort === ctrl) { this.abort = null; this.setPlaying(false); }
    }
  }

  pause() {
    if (this.abort) { this.abort.abort(); this.abort = null; }
    this.setPlaying(false);
  }

  async post(action) {
    this.pause();
    if (!(await this.ready())) return;
    try {
      const frame = await api(`api/sessions/${this.session}/${action}?have=${this.seq}`, { method: "POST" });
      showError(this.errorNode, null);
      this.onFrame(frame);
    } catch (err) {
      showError(this.errorNode, err);
    }
  }

  step() { return this.post("step"); }
  finish() { return this.post("finish"); }
}

// Replay: the --html export carries the frames of a finished race; the same views draw them on the same clock.
class LogPlayer extends Player {
  constructor(section, log) {
    super(section, "race");
    this.log = log;
    this.index = 0;
    this.clock = 0;
    this.raf = null;
    this.build(log.meta);
    this.applyNext();
  }

  applyNext() {
    if (this.index >= this.log.frames.length) return false;
    const frame = this.log.frames[this.index++];
    this.clock = frame.t;
    this.onFrame(frame);
    return true;
  }

  play() {
    if (this.playing) return;
    if (this.index >= this.log.frames.length) this.reset();
    stats.playAt = performance.now(); stats.firstFrameAt = null; stats.firstDrawAt = null;
    this.setPlaying(true);
    let last = performance.now();
    const tick = now => {
      if (!this.playing) return;
      this.clock += (now - last) / 1000 * this.speed;
      last = now;
      while (this.index < this.log.frames.length && this.log.frames[this.index].t <= this.clock) this.applyNext();
      if (this.index >= this.log.frames.length) { this.setPlaying(false); return; }
      this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  }

  pause() {
    this.setPlaying(false);
    if (this.raf) cancelAnimationFrame(this.raf);
    this.raf = null;
  }

  step() { this.pause(); this.applyNext(); }

  finish() { this.pause(); while (this.applyNext()) { /* every delta must be applied in order */ } }

  reset() {
    this.pause();
    this.index = 0;
    this.done = false;
    this.build(this.log.meta);
    this.applyNext();
  }
}

// ---------------------------------------------------------------- the calculator
async function setupCalculator(catalog) {
  const form = document.getElementById("calc-form");
  const modelSel = document.getElementById("calc-model"), gpuSel = document.getElementById("calc-gpu");
  for (const m of catalog.models) modelSel.append(el("option", { value: m.name, text: m.name }));
  for (const g of catalog.gpus) gpuSel.append(el("option", { value: g.name, text: g.name }));
  modelSel.value = catalog.defaults.model;
  gpuSel.value = catalog.defaults.gpu;
  const errorNode = document.getElementById("calc-error");
  const out = document.getElementById("calc-out");
  let serial = 0;
  const update = async () => {
    const mine = ++serial;
    const q = new URLSearchParams(new FormData(form));
    try {
      const r = await api("api/size?" + q.toString());
      if (mine !== serial) return;
      showError(errorNode, null);
      renderCalc(r);
      out.hidden = false;
    } catch (err) {
      if (mine !== serial) return;
      showError(errorNode, err);
    }
  };
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  await update();
}

function renderCalc(r) {
  const bar = document.getElementById("calc-bar");
  bar.innerHTML = "";
  // The paper's Figure 1: the GPU's memory by use, as `kvlab size` splits it.
  const split = r.memory_split;
  const total = split.gpu_memory_bytes;
  const parts = [["weights", split.weights_bytes, "weights"], ["kv", split.kv_cache_bytes, "KV cache"],
    ["other", split.other_bytes, "other"]];
  for (const [cls, v, label] of parts) {
    if (v <= 0) continue;
    const share = 100 * v / total;
    bar.append(el("span", { class: cls, style: `width:${share}%`, title: `${label}: ${gib(v)} (${nf1.format(share)}%)`,
      "data-part": cls, "data-value": String(v), text: share >= 8 ? `${label} ${nf0.format(share)}%` : "" }));
  }
  const set = (key, text, value) => {
    const dd = document.querySelector(`#calc-figures [data-key="${key}"]`);
    dd.textContent = text;
    dd.dataset.value = String(value);
    return dd;
  };
  set("kv_bytes_per_token", `${nf0.format(r.kv_bytes_per_token)} bytes (${nf0.format(r.kv_bytes_per_token / 1024)} KiB)`, r.kv_bytes_per_token);
  set("available_kv_bytes", gib(r.available_kv_bytes), r.available_kv_bytes);
  set("num_tokens", `${nf0.format(r.num_tokens)} tokens (${nf0.format(r.num_blocks)} blocks of ${r.block_size})`, r.num_tokens);
  set("weights_bytes", gib(r.weights_bytes), r.weights_bytes);
  set("max_concurrency", `${nf2.format(r.max_concurrency)}× for ${nf0.format(r.max_model_len)} tokens per request`, r.max_concurrency);
  set("needed", `${nf0.format(r.workload.num_tokens_needed)} tokens (${gib(r.workload.kv_bytes_needed)})`, r.workload.num_tokens_needed);
  const fit = set("num_fit", "", r.workload.num_fit);
  fit.innerHTML = "";
  const w = r.workload;
  fit.append(el("span", { class: w.fits ? "fits" : "nofit",
    text: w.fits ? `all ${nf0.format(w.concurrency)} fit; the cache holds ${nf0.format(w.num_fit)} of that length`
      : `only ${nf0.format(w.num_fit)} of ${nf0.format(w.concurrency)} fit: the rest wait, or are evicted mid-answer` }));
  document.getElementById("calc-log").textContent = r.log_lines.join("\n");
}

// ---------------------------------------------------------------- boot
const tooltip = document.getElementById("tooltip");
let activePlayer = null;

document.addEventListener("keydown", e => {
  if (!activePlayer || e.altKey || e.ctrlKey || e.metaKey) return;
  if (e.target.closest && e.target.closest("input, select, textarea, button")) return;
  if (e.key === " ") { e.preventDefault(); activePlayer.toggle(); }
  else if (e.key === "ArrowRight") { e.preventDefault(); activePlayer.step(); }
});

async function readLog(node) {
  // The export embeds the frame log gzip-compressed and base64-encoded; the browser's own DecompressionStream
  // unpacks it, so the page needs nothing from the network.
  const bytes = base64Bytes(node.textContent.trim());
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

async function boot() {
  window.kvlab = { stats, facts, palette: PALETTE.map(hex), paletteRgb: PALETTE, pale: PALE,
    freeRgb: FREE_RGB, players: {} };
  const logNode = document.getElementById("kvlab-log");
  if (logNode) {
    const log = await readLog(logNode);
    const race = new LogPlayer(document.getElementById("race"), log);
    window.kvlab.players.race = race;
    activePlayer = race;
    buildLegend(document.getElementById("race-legend"));
    document.body.dataset.ready = "1";
    return;
  }
  buildLegend(document.getElementById("grid-legend"));
  const catalog = await api("api/catalog");
  window.kvlab.catalog = catalog;
  for (const sel of document.querySelectorAll(".model-select")) {
    for (const m of catalog.models) sel.append(el("option", { value: m.name, text: m.name }));
    sel.value = catalog.defaults.model;
  }
  for (const sel of document.querySelectorAll(".gpu-select")) {
    for (const g of catalog.gpus) sel.append(el("option", { value: g.name, text: g.name }));
    sel.value = catalog.defaults.gpu;
  }
  for (const sel of document.querySelectorAll(".workload-select")) {
    for (const w of catalog.workloads) sel.append(el("option", { value: w.name, text: w.name, title: w.description || "" }));
    sel.value = catalog.defaults.workload;
  }
  const grid = new LivePlayer(document.getElementById("grid"), "grid", document.getElementById("grid-form"));
  const race = new LivePlayer(document.getElementById("race"), "race", document.getElementById("race-form"));
  window.kvlab.players = { grid, race };
  activePlayer = grid;
  setupQuestions(grid);
  await Promise.all([setupCalculator(catalog), grid.reset(), race.reset()]);
  document.body.dataset.ready = "1";
}

function setupQuestions(grid) {
  const form = grid.form;
  const set = values => {
    for (const [k, v] of Object.entries(values)) form.elements[k].value = String(v);
  };
  const presets = {
    q1: { allocator: "max", batching: "continuous", block_size: 16, num_blocks: "auto", rate: 2 },
    q2: { allocator: "paged", batching: "continuous", block_size: 16, num_blocks: "auto", rate: 2 },
    // A cache of 64 blocks (1,024 slots) under 20 requests/s: pages run out mid-answer.
    q3: { allocator: "paged", batching: "continuous", block_size: 16, num_blocks: 64, rate: 20 },
  };
  for (const button of document.querySelectorAll("[data-show]")) {
    button.addEventListener("click", async () => {
      button.blur(); // so that space then pauses the grid rather than pressing "show me" again
      set(presets[button.dataset.show]);
      activePlayer = grid;
      document.getElementById("grid").scrollIntoView({ behavior: "instant", block: "start" });
      await grid.reset();
      grid.play();
    });
  }
}

boot().catch(err => {
  const node = document.querySelector(".error");
  showError(node, err);
  document.body.dataset.ready = "error";
});

})();
