/* kvlab lab: draws the frames kvlab's simulator sends (live, from the server) or replays a recorded frame log
 * (the --html export). Nothing here simulates: every number on the page comes from a frame or from the server,
 * and every panel's text is written from one frame at a time. No dependencies, no network beyond the page's own
 * origin. */
"use strict";
(function () {

// ---------------------------------------------------------------- colours and patterns
// Okabe & Ito's colour-blind-safe palette, without black (it reads as nobody's) and yellow (too light to tell
// from free memory). Conversation k gets PALETTE[k % 6]. The memory states differ by texture as well as colour,
// so that they read in grey and for colour-blind readers:
//   token: solid · reserved, still empty: stripes in a dark shade of the colour over its pale tint ·
//   reserved, never to be used: the same, cross-hatched · rounded up by the allocator: dark grey cross-hatch on
//   light grey · free: plain light grey.
// The stripes' ink is at least 3:1 against free grey in luminance (tests/web/test_lab_hero.py reads it off a
// screenshot), so "reserved but empty" never passes for "free".
const PALETTE = [
  [0xE6, 0x9F, 0x00], [0x56, 0xB4, 0xE9], [0x00, 0x9E, 0x73],
  [0x00, 0x72, 0xB2], [0xD5, 0x5E, 0x00], [0xCC, 0x79, 0xA7],
];
const PALETTE_NAMES = ["orange", "sky blue", "green", "blue", "vermillion", "purple"];
const PALE = 0.3; // the tint under the stripes: the conversation's colour at 30% over white
const INK = 0.45; // the stripes: the colour at 45% of its brightness
const FREE_RGB = [0xE4, 0xE4, 0xE4];
const GAP_RGB = [0xFF, 0xFF, 0xFF];
const OVERHEAD_BG = [0xE4, 0xE4, 0xE4];
const OVERHEAD_LINE = [0x4A, 0x4A, 0x4A];
const NOBODY = -1; // colour index of memory no conversation holds (the paged pool's null block)

const TOKEN = 0, RESERVED = 1, INTERNAL = 2, OVERHEAD = 3, FREE = 4;

function pale(rgb, f) { return rgb.map(v => Math.round(255 - (255 - v) * f)); }
function shade(rgb, f) { return rgb.map(v => Math.round(v * f)); }
function hex(rgb) { return "#" + rgb.map(v => v.toString(16).padStart(2, "0")).join(""); }
// ImageData is RGBA bytes; read as little-endian 32-bit words they are ABGR.
function word(rgb) { return ((255 << 24) | (rgb[2] << 16) | (rgb[1] << 8) | rgb[0]) >>> 0; }

const SOLID32 = PALETTE.map(word);
const PALETTE_HEX = PALETTE.map(hex);
const PALE32 = PALETTE.map(c => word(pale(c, PALE)));
const INK32 = PALETTE.map(c => word(shade(c, INK)));
const FREE32 = word(FREE_RGB), GAP32 = word(GAP_RGB);
const OVER_BG32 = word(OVERHEAD_BG), OVER_LINE32 = word(OVERHEAD_LINE);
const BOUNDARY32 = word([0x22, 0x22, 0x22]);

// The colour of one pixel at canvas position (x, y), for a slot state and a conversation colour. Patterns are
// anchored to the canvas, so stripes run on across neighbouring squares. ``simple`` (the first figure) draws all
// of a conversation's empty room one way: "reserved, still empty".
function pixel(state, colour, x, y, simple) {
  if (simple && colour !== NOBODY && (state === INTERNAL || state === OVERHEAD)) state = RESERVED;
  switch (state) {
    case TOKEN: return SOLID32[colour];
    case RESERVED: return (x + y) % 4 < 2 ? INK32[colour] : PALE32[colour];
    case INTERNAL: return ((x + y) % 4 === 0 || (x - y + 4000) % 4 === 0) ? INK32[colour] : PALE32[colour];
    case OVERHEAD: return ((x + y) % 3 === 0 || (x - y + 3000) % 3 === 0)
      ? (colour === NOBODY ? OVER_LINE32 : INK32[colour]) : OVER_BG32;
    default: return FREE32;
  }
}

function colourOf(owner) { return owner >= 0 ? owner % PALETTE.length : NOBODY; }

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

const FLASH_MS = 1400;
const FLASH_ALPHA = 0.85; // an evicted square's black at the flash's start
const SLOW_MS = 200; // a panel's text (numbers, notes, share bars, seats) is rewritten at most this often while playing
const LABEL_PX = 10, LABEL_SQUARE = 16; // the smallest type a number on a square is written in, and square
const MAX_FLASHES = 8; // evictions fading at once per grid (a cache that thrashes evicts every frame)

class GridView {
  constructor(wrap, numBlocks, blockSize, maxHeight, simple = false) {
    this.n = numBlocks;
    this.blockSize = blockSize;
    this.maxHeight = maxHeight;
    this.simple = simple;
    this.wrap = wrap;
    this.owner = new Int32Array(numBlocks).fill(-1);
    this.token = new Uint16Array(numBlocks);
    this.reserved = new Uint16Array(numBlocks);
    this.internal = new Uint16Array(numBlocks);
    this.overhead = new Uint16Array(numBlocks);
    this.shared = new Uint8Array(numBlocks);
    this.canvas = el("canvas", { class: "grid", tabindex: "0", role: "img" });
    this.overlay = el("canvas", { class: "overlay", "aria-hidden": "true" });
    wrap.append(this.canvas, this.overlay);
    this.ctx = this.canvas.getContext("2d");
    this.octx = this.overlay.getContext("2d");
    this.flashes = [];
    this.highlight = -1;
    this.labels = null; // Map(block -> text) written on the squares (the block table's logical numbers)
    this.labelsDrawn = 0; // how many of them were legible and written
    this.gap = null; // [first display block, count] of the free piece the allocator would hand out, outlined
    this.kbCell = -1;
    this.width = 0;
    this.overlayAt = 0;
    this.relayout(wrap.clientWidth || 600);
  }

  // Size the grid to the width it is given (on build and on every resize): same blocks, new squares.
  relayout(width) {
    width = Math.max(60, Math.floor(width));
    if (width === this.width) return false;
    this.width = width;
    this.layout = chooseLayout(this.n, width, this.maxHeight);
    const L = this.layout;
    for (const c of [this.canvas, this.overlay]) { c.width = L.cols * L.s; c.height = L.rows * L.s; }
    this.image = this.ctx.createImageData(this.canvas.width, this.canvas.height);
    this.px = new Uint32Array(this.image.data.buffer);
    this.px.fill(GAP32);
    this.dirty = new Uint8Array(L.cells);
    this.dirtyList = [];
    this.allDirty = true;
    this.overlayDirty = true;
    return true;
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
    if (this.highlight >= 0) this.overlayDirty = true;
  }

  // The same blocks as another view (the block table's copy of a grid drawn elsewhere on the page).
  copyFrom(v) {
    this.owner.set(v.owner); this.token.set(v.token); this.reserved.set(v.reserved);
    this.internal.set(v.internal); this.overhead.set(v.overhead); this.shared.set(v.shared);
    this.allDirty = true;
    this.overlayDirty = true;
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
    const colour = colourOf(st.owner), simple = this.simple;
    let p = 0;
    for (let x = 0; x < w; x++) {
      for (let y = 0; y < h; y++, p++) {
        const state = p < b0 ? TOKEN : p < b1 ? RESERVED : p < b2 ? INTERNAL : p < b3 ? OVERHEAD : FREE;
        this.px[(y0 + y) * W + x0 + x] = pixel(state, colour, x0 + x, y0 + y, simple);
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

  // The cells holding any block of conversation ``id``.
  cellsOf(id) {
    const k = this.layout.k, out = [];
    let last = -1;
    for (let b = 0; b < this.n; b++) {
      if (this.owner[b] === id) { const c = (b / k) | 0; if (c !== last) { out.push(c); last = c; } }
    }
    return out;
  }

  flash(ids, now) {
    const cells = [];
    for (const id of ids) cells.push(...this.cellsOf(id));
    if (cells.length) {
      this.flashes.push({ cells, t0: now });
      if (this.flashes.length > MAX_FLASHES) this.flashes.shift();
      this.overlayDirty = true;
    }
    return cells.length;
  }

  // What sits on top of the squares: a hovered conversation's blocks (the rest veiled), evicted pages flashing
  // out, the free piece outlined, the block table's numbers, the keyboard's cursor.
  drawOverlay(now) {
    const live = this.flashes.length > 0;
    if (!this.overlayDirty && !live) return;
    if (!this.overlayDirty && now - this.overlayAt < 120) return; // a fade needs no more than eight steps a second
    this.overlayDirty = false;
    this.overlayAt = now;
    const L = this.layout, ctx = this.octx, s = L.s;
    ctx.clearRect(0, 0, this.overlay.width, this.overlay.height);
    const at = c => [(c % L.cols) * s, ((c / L.cols) | 0) * s];
    if (this.gap && this.gap[1] > 0) {
      ctx.strokeStyle = "#1d1d1f"; ctx.lineWidth = 2; ctx.setLineDash([4, 3]);
      const c0 = (this.gap[0] / L.k) | 0, c1 = Math.min(L.cells - 1, ((this.gap[0] + this.gap[1] - 1) / L.k) | 0);
      for (let r = (c0 / L.cols) | 0; r <= ((c1 / L.cols) | 0); r++) {
        const a = Math.max(c0, r * L.cols), b = Math.min(c1, r * L.cols + L.cols - 1);
        ctx.strokeRect((a % L.cols) * s + 1, r * s + 1, (b - a + 1) * s - 2, s - 2);
      }
      ctx.setLineDash([]);
    }
    if (this.highlight >= 0) {
      const cells = this.cellsOf(this.highlight);
      ctx.fillStyle = "rgba(255,255,255,0.7)";
      ctx.fillRect(0, 0, this.overlay.width, this.overlay.height);
      ctx.strokeStyle = "#1d1d1f"; ctx.lineWidth = 2;
      for (const c of cells) { const [x, y] = at(c); ctx.clearRect(x, y, s, s); ctx.strokeRect(x + 1, y + 1, s - 2, s - 2); }
    }
    // A number is written on a square only where it is legible: squares of LABEL_SQUARE pixels or more, type of 12
    // down to LABEL_PX pixels, as wide as the square's outline. (A phone's squares are too small: the list beside
    // the grid says the same.)
    this.labelsDrawn = 0;
    if (this.labels && s >= LABEL_SQUARE) {
      ctx.textAlign = "center"; ctx.textBaseline = "middle";
      for (const [b, text] of this.labels) {
        let px = 12;
        for (; px >= LABEL_PX; px--) {
          ctx.font = `bold ${px}px system-ui, sans-serif`;
          if (ctx.measureText(text).width <= s - 2) break;
        }
        if (px < LABEL_PX) continue;
        const [x, y] = at((b / L.k) | 0);
        ctx.fillStyle = "rgba(255,255,255,0.85)"; ctx.fillRect(x + 2, y + 2, s - 5, s - 5);
        ctx.fillStyle = "#1d1d1f"; ctx.fillText(text, x + s / 2, y + s / 2 + 0.5);
        this.labelsDrawn++;
      }
    }
    this.flashes = this.flashes.filter(f => now - f.t0 < FLASH_MS);
    for (const f of this.flashes) {
      const a = 1 - (now - f.t0) / FLASH_MS;
      ctx.fillStyle = `rgba(0,0,0,${(FLASH_ALPHA * a).toFixed(3)})`;
      for (const c of f.cells) { const [x, y] = at(c); ctx.fillRect(x, y, s - 1, s - 1); }
    }
    const cursor = this.kbCell >= 0 && this.kbCell < L.cells;
    if (cursor) {
      const [x, y] = at(this.kbCell);
      ctx.strokeStyle = "#0072b2"; ctx.lineWidth = 3; ctx.strokeRect(x, y, s, s);
    }
    // Nothing on top: no layer to composite over the squares.
    const empty = !this.flashes.length && this.highlight < 0 && !cursor && !(this.gap && this.gap[1] > 0) &&
      !(this.labels && this.labels.size);
    if (this.overlay.hidden !== empty) this.overlay.hidden = empty;
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

  // A cell's position on the screen, in CSS pixels (the canvas may be drawn smaller than its pixels).
  cellClientRect(c) {
    const L = this.layout, rect = this.canvas.getBoundingClientRect(), f = rect.width / this.canvas.width;
    return { left: rect.left + (c % L.cols) * L.s * f, top: rect.top + ((c / L.cols) | 0) * L.s * f,
      size: L.s * f, scale: f };
  }

  describe(c, requests, scale) {
    const st = this.cellState(c);
    const lines = [];
    const per = scale > 1 ? ` (each square stands for ${scale} blocks of the pool)` : "";
    lines.push(st.hi - st.lo === 1 ? `block ${st.lo}${per}`
      : `blocks ${st.lo}–${st.hi - 1} (one square = ${st.hi - st.lo} blocks)${per}`);
    if (st.owner < 0) {
      if (st.o > 0) lines.push(`the null block: vLLM keeps one page aside as a placeholder; it never holds tokens (${st.o} slots)`);
      if (st.f > 0) lines.push(`free: ${st.f} of ${st.total} slots`);
      return lines.join("\n");
    }
    const req = requests && requests.get(st.owner);
    const who = req ? `conversation ${st.owner}: prompt ${req[2]} + answer ${req[3]} tokens` : `conversation ${st.owner}`;
    lines.push(who + ` (${PALETTE_NAMES[colourOf(st.owner)]})`);
    if (st.hi - st.lo === 1 && this.shared[st.lo]) lines.push("shared with other conversations (same prefix)");
    const parts = this.simple
      ? [[st.t, "tokens"], [st.r + st.i + st.o, "reserved, still empty"], [st.f, "free"]]
      : [[st.t, "tokens"], [st.r, "reserved, still empty"], [st.i, "reserved, never to be used"],
        [st.o, `rounded up by the allocator for conversation ${st.owner}`], [st.f, "free"]];
    lines.push(parts.filter(([v]) => v > 0).map(([v, name]) => `${v} ${name}`).join(", ") + ` (of ${st.total} slots)`);
    return lines.join("\n");
  }
}

// A legend swatch drawn by the same pixel function as the grid, so the legend is what the grid shows.
function swatch(state, colour, size = 15, simple = false) {
  const c = document.createElement("canvas");
  c.width = size; c.height = size;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(size, size);
  const px = new Uint32Array(img.data.buffer);
  for (let y = 0; y < size; y++) for (let x = 0; x < size; x++) px[y * size + x] = pixel(state, colour, x, y, simple);
  ctx.putImageData(img, 0, 0);
  c.setAttribute("aria-hidden", "true");
  return c;
}

// The first figure says three things; the explorer grid says all five (each defined in its own words).
function buildLegend(host, simple = false) {
  if (!host) return;
  host.innerHTML = "";
  const add = (canvases, label, cls) => {
    const item = el("span", { class: "item" + (cls ? " " + cls : "") });
    for (const cv of canvases) item.appendChild(cv);
    item.appendChild(el("span", { text: label }));
    host.appendChild(item);
  };
  add([0, 1, 2].map(k => swatch(TOKEN, k)), "solid: tokens (a colour per conversation)", "legend-token");
  add([0, 1, 2].map(k => swatch(RESERVED, k)), simple ? "striped: reserved for it, still empty"
    : "striped: reserved for tokens still to come", "legend-reserved");
  if (!simple) {
    add([0, 1, 2].map(k => swatch(INTERNAL, k)), "cross-hatched: reserved, never to be used (beyond the answer's end)",
      "legend-internal");
    add([swatch(OVERHEAD, 0), swatch(OVERHEAD, NOBODY)], "fine hatch: rounded up by the allocator (grey: nobody's)",
      "legend-overhead");
  }
  add([swatch(FREE, 0)], "plain grey: free", "legend-free");
  if (!simple) add([pieceSwatch()], "dashed outline: the largest free piece, where the next slab would go " +
    "(reserve the max)", "legend-piece");
  // Evicted pages flash black and fade (drawOverlay): said where they appear, not only in section 5.
  const more = document.getElementById("evictions") ? [", ", el("a", { href: "#evictions", text: "section 5" })] : [];
  host.appendChild(el("span", { class: "item legend-evicted" }, flashSwatch(), el("span", {},
    "flashing black: evicted (memory ran out mid-answer; its tokens are computed again later", ...more, ")")));
}

// The free piece's outline as drawOverlay draws it (GridView.gap), around two free squares.
function pieceSwatch(size = 15) {
  const c = document.createElement("canvas");
  c.width = 2 * size; c.height = size;
  const ctx = c.getContext("2d");
  ctx.fillStyle = hex(FREE_RGB); ctx.fillRect(0, 0, 2 * size, size);
  ctx.strokeStyle = "#1d1d1f"; ctx.lineWidth = 2; ctx.setLineDash([4, 3]);
  ctx.strokeRect(1, 1, 2 * size - 2, size - 2);
  c.setAttribute("aria-hidden", "true");
  return c;
}

// The eviction flash as drawOverlay draws it at its start, over a free square.
function flashSwatch(size = 15) {
  const c = swatch(FREE, 0, size), ctx = c.getContext("2d");
  ctx.fillStyle = `rgba(0,0,0,${FLASH_ALPHA})`;
  ctx.fillRect(0, 0, size, size);
  return c;
}

// The five shares as one bar, drawn with the legend's own pixels (tokens in the palette's colours in turn).
function drawShareBar(canvas, shares, width, simple, nobodys) {
  const w = Math.max(40, Math.floor(width)), h = 12;
  if (canvas.width !== w) canvas.width = w;
  if (canvas.height !== h) canvas.height = h;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(w, h);
  const px = new Uint32Array(img.data.buffer);
  const total = shares.reduce((a, b) => a + b, 0) || 1;
  const edges = [];
  let acc = 0;
  for (const v of shares) { acc += v; edges.push(Math.round(w * acc / total)); }
  for (let x = 0; x < w; x++) {
    let state = 0;
    while (state < 4 && x >= edges[state]) state++;
    const colour = state === OVERHEAD && (nobodys || !simple) ? NOBODY : ((x / 6) | 0) % PALETTE.length;
    for (let y = 0; y < h; y++) px[y * w + x] = pixel(state, colour, x, y, simple);
  }
  ctx.putImageData(img, 0, 0);
}

// The vLLM paper's Figure 2 (kvlab.paper.FIG2_PAPER, through the catalogue): the token share of the systems that
// reserve (Orca's three) against vLLM's.
function paperShares(fig2) {
  const reserve = Object.keys(fig2).filter(k => k.startsWith("orca")).map(k => fig2[k].token);
  return `The vLLM paper, time-averaged: ${nf1.format(Math.min(...reserve))}–${pct(Math.max(...reserve))} for systems ` +
    `that reserve (Orca), ${pct(fig2.vllm.token)} for vLLM's pages.`;
}

// ---------------------------------------------------------------- formatting and input
const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const nf1 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const nf2 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
function gib(bytes) { return nf2.format(bytes / 2 ** 30) + " GiB"; }
function pct(v) { return nf1.format(v) + "%"; }
function plural(n, one, many) { return `${nf0.format(n)} ${n === 1 ? one : (many || one + "s")}`; }
function blocks(n) { return plural(n, "block"); }
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

// The server answers the page's refusals in the body (HTTP 200, {"error", "refused": true}): a refused value is a
// line beside its control, and the browser logs nothing (it logs every 4xx response as a failed resource).
const REFUSALS = { "X-Kvlab-Refusals": "in-body" };
class Refusal extends Error {
  constructor(body) { super(body.error); this.advice = body.advice || []; }
}
async function api(path, options = {}) {
  const resp = await fetch(path, { ...options, headers: { ...(options.headers || {}), ...REFUSALS } });
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (body && body.refused) throw new Refusal(body);
  if (!resp.ok) {
    const msg = body && body.error ? body.error : `the server answered ${resp.status}`;
    throw new Error(msg);
  }
  return body;
}

// Writing the same text or style again still costs the browser a layout: write only what changed.
function setText(node, text) { if (node && node.textContent !== text) node.textContent = text; }
function setData(node, key, value) { const v = String(value); if (node && node.dataset[key] !== v) node.dataset[key] = v; }

// One section's error slot: the message, and (for a refusal) what to change among the page's controls.
function showError(node, err) {
  if (!node) return;
  if (err) {
    node.textContent = err.message || String(err);
    if (err.advice && err.advice.length) node.append(el("span", { class: "advice", text: "Try: " + err.advice.join("; or ") + "." }));
    node.hidden = false;
  } else { node.textContent = ""; node.hidden = true; }
}

const NUMBER_RE = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

// One field's value, checked in the page against the same ranges the server enforces (params.LIMITS), so that
// nothing is sent that the server would refuse. Returns [value or null for "auto", message or null].
function checkField(input) {
  const kind = input.dataset.kind;
  if (!kind) return [input.value, null];
  const raw = input.value.trim(), label = input.dataset.label || input.name;
  const lo = Number(input.dataset.min);
  const range = `${nf0.format(lo) === String(lo) ? lo : input.dataset.min} to ${input.dataset.max}`;
  const hi = Number(input.dataset.max);
  if (kind === "blocks" && (raw === "" || raw.toLowerCase() === "auto")) return [null, null];
  const what = kind === "number" ? "a number" : "a whole number";
  const also = kind === "blocks" ? ", or auto" : "";
  if (raw === "") return [null, `${label} (${input.name}) is empty: type ${what} from ${range}${also}`];
  if (!NUMBER_RE.test(raw) || !Number.isFinite(Number(raw))) {
    return [null, `${label} (${input.name}) "${raw}" is not ${what}: type one from ${range}${also}`];
  }
  const v = Number(raw);
  if (kind !== "number" && !Number.isInteger(v)) return [null, `${label} (${input.name}) ${raw} is not a whole number: type one from ${range}${also}`];
  if (v < lo || v > hi) return [null, `${label} (${input.name}) ${raw} is out of range: ${range}`];
  return [v, null];
}

// Every checked field of a form: the values, or the first message (and each bad field marked).
function checkForm(form) {
  let first = null;
  const values = {};
  for (const input of form.querySelectorAll("input[data-kind]")) {
    const [v, msg] = checkField(input);
    input.classList.toggle("invalid", !!msg);
    input.setAttribute("aria-invalid", msg ? "true" : "false");
    if (msg && !first) first = msg;
    values[input.name] = v;
  }
  return [values, first];
}

// What two setups differ in, in the page's words ("rate 4 against 20"); empty when they are the same.
const SETUP_WORDS = { model: "model", gpu: "GPU", workload: "workload", rate: "requests/s", num_requests: "requests",
  seed: "seed", block_size: "block size", num_gpu_blocks: "KV blocks", max_num_seqs: "seats (max_num_seqs)",
  max_model_len: "max_model_len", cost: "cost profile" };
function setupDifference(a, b) {
  return Object.keys(SETUP_WORDS).filter(k => a[k] !== b[k])
    .map(k => `${SETUP_WORDS[k]} ${typeof a[k] === "number" ? nf0.format(a[k]) : a[k]} against ` +
      `${typeof b[k] === "number" ? nf0.format(b[k]) : b[k]}`).join(", ");
}
function describeSetup(s) {
  if (!s || !s.model) return "";
  return `${s.model} on ${s.gpu} · ${nf0.format(s.num_gpu_blocks)} blocks of ${s.block_size} tokens · ` +
    `${nf0.format(s.num_requests)} requests at ${s.rate}/s (${s.workload}, seed ${s.seed}) · ` +
    `${nf0.format(s.max_num_seqs)} seats · cost profile ${s.cost}`;
}

// ---------------------------------------------------------------- what the questions point at
// Per memory strategy, the latest run the grid showed: its name, setup, counters, and (once it finished) the
// time-averaged summary the simulator computed over the whole run.
const facts = {};
let answersDue = false;

function noteFacts(info, grid, summary, meta) {
  if (!grid.counters.step) return; // nothing has run yet
  const f = facts[info.allocator] = facts[info.allocator] || {};
  if (f.name !== info.name || f.runId !== meta.runId) { delete f.summary; }
  f.name = info.name;
  f.runId = meta.runId;
  f.setup = meta.setup || {};
  f.setupKey = meta.setup_key;
  f.block_size = meta.kv_block_size || info.block_size;
  f.counters = grid.counters;
  f.note = grid.note || {};
  if (summary) f.summary = summary;
  answersDue = true;
}

const QUIZ = {
  q1: { right: "Right: a fifth or less.", wrong: "Not quite: a fifth or less." },
  q2: { right: "Right: 15 slots, never more.", wrong: "Not quite: 15 slots, the unfilled part of its last page." },
  q3: { right: "Right: it evicts and recomputes.", wrong: "Not quite: vLLM evicts the newest conversation and recomputes it later." },
};

function explainQ1() {
  const f = facts.max, paper = " The vLLM paper measured 20.4% for Orca (Max) and 96.3% for vLLM.";
  if (!f) return "Press \"show me\": the grid runs reserve-the-max, and this answer fills in with its numbers." + paper;
  if (!f.summary) {
    return `Your ${f.name} run is not over yet; right now ${pct(f.counters.token_share)} of the cache holds ` +
      "tokens. Run it to the end (▸▸) for the time-averaged numbers." + paper;
  }
  const s = f.summary.memory_shares;
  return `Your ${f.name} run, time-averaged over its ${nf0.format(f.summary.makespan_s)} s: ${pct(s.token)} of ` +
    `the memory held tokens, ${pct(s.internal_fragmentation)} was reserved for answer tokens that never came ` +
    `(cross-hatched), ${pct(s.reserved)} waited for tokens still to come (striped), and ` +
    `${pct(s.external_fragmentation)} was free or between slabs too small for the next conversation.` + paper;
}

function explainQ2() {
  const f = facts.paged;
  if (!f) return "Press \"show me\": the grid runs pages, and this answer fills in with its numbers.";
  const bound = f.block_size - 1, c = f.counters;
  let text = `Pages are handed out as the answer grows, so only a conversation's last page can be partly empty: at ` +
    `most block_size − 1 = ${bound} slots. In your ${f.name} run the most any one conversation held without ` +
    `tokens, in the frames looked at, was ${nf0.format(c.max_unfilled_per_request)} slots.`;
  const m = facts.max;
  if (m && m.setupKey === f.setupKey) {
    text += ` Under reserve-the-max, on the same settings, it was ${nf0.format(m.counters.max_unfilled_per_request)}.`;
  } else if (m) {
    text += ` (Your reserve-the-max run had other settings (${setupDifference(m.setup, f.setup)}): not compared.)`;
  }
  if (f.summary) text += ` Time-averaged over the run, ${pct(f.summary.memory_shares.token)} of the memory held tokens.`;
  return text;
}

function explainQ3() {
  const f = facts.paged;
  const how = "The newest running conversation is evicted whole and goes back to the front of the queue; its " +
    "pages go to the others, and when it returns its tokens are computed again.";
  if (!f) return how + " Press \"show me\" to shrink the cache and watch it happen.";
  const s = f.summary, c = f.counters, n = f.note;
  const evictions = s ? s.preemptions : c.num_preemptions, redo = s ? s.recomputed_tokens : c.num_recomputed_tokens;
  if (!evictions) return how + ` In your ${f.name} run memory never ran out: 0 evictions. Press "show me".`;
  let text = how + ` In your ${f.name} run${s ? "" : " so far"}: ${plural(evictions, "eviction")}; the engine has ` +
    `computed ${nf0.format(redo)} tokens a second time${s ? "" : " so far"} (prompts and answers, counted when a ` +
    "conversation comes back)";
  if (!s && n.tokens_to_recompute) text += `, and ${nf0.format(n.tokens_to_recompute)} more wait in the queue`;
  text += ".";
  if (s) text += ` It still served everyone in ${nf0.format(s.makespan_s)} s.`;
  return text;
}

function renderAnswers() {
  const explain = { q1: explainQ1, q2: explainQ2, q3: explainQ3 };
  for (const [q, fn] of Object.entries(explain)) {
    const node = document.querySelector(`[data-answer="${q}"]`);
    if (node && !node.closest(".reveal").hidden) setText(node, fn());
  }
}

function setupQuiz() {
  for (const q of document.querySelectorAll(".question")) {
    const reveal = q.querySelector(".reveal");
    q.querySelector(".options").addEventListener("change", e => {
      const choice = e.target.value, correct = q.dataset.correct;
      for (const label of q.querySelectorAll(".options label")) {
        const v = label.querySelector("input").value;
        label.classList.toggle("right", v === correct);
        label.classList.toggle("wrong", v === choice && v !== correct);
      }
      const verdict = reveal.querySelector(".verdict");
      verdict.textContent = QUIZ[q.id][choice === correct ? "right" : "wrong"];
      verdict.className = "verdict " + (choice === correct ? "right" : "wrong");
      reveal.hidden = false;
      renderAnswers();
    });
  }
}

// ---------------------------------------------------------------- a player: views, numbers, transport
// What each figure's panels show. ``big``: the numbers in large type; ``bar``: the memory bar; ``seats``: the
// running batch and the queue; ``counters``: the small numbers; ``note``: the line under the grid about the head of
// the queue; ``simple``: three states drawn (tokens, reserved and still empty, free); ``height``: the grid's share
// of the window's height.
const LOOKS = {
  hero: { big: ["num_running", "num_waiting"], bar: true, simple: true, height: 0.4, phoneHeight: 0.28, names: true },
  one: { big: ["held_slots", "token_slots"], bar: true, simple: true, height: 0.3, names: true },
  grid: { big: ["token_share", "num_preemptions"], bar: true, seats: true, counters: true, note: true, paper: true,
    height: 0.5 },
  evictions: { big: ["num_preemptions", "tokens_to_recompute", "num_recomputed_tokens"], seats: true, note: true,
    counters: true, height: 0.4 },
  race: { big: ["token_share", "num_preemptions"], bar: true, seats: true, counters: true, note: true, height: 0.35 },
};

// The big numbers: what each says, and where in the frame it comes from.
const BIG = {
  num_running: { what: () => "conversations at once", of: g => g.counters.num_running },
  num_waiting: { what: () => "waiting in the queue", of: g => g.counters.num_waiting },
  token_share: { what: () => "of the memory holds tokens right now", of: g => g.counters.token_share, fmt: pct },
  num_preemptions: {
    // (where the recomputed tokens are a big number of their own, they are not said again here)
    what: (g, look) => !g.counters.num_preemptions ? "evictions"
      : look && look.big.includes("num_recomputed_tokens") ? "evictions: sent back to the queue when pages ran out"
        : "evictions: sent back to the queue when pages ran out, " +
          `to be computed again (${nf0.format(g.counters.num_recomputed_tokens)} tokens so far)`,
    of: g => g.counters.num_preemptions },
  tokens_to_recompute: { what: () => "tokens dropped, waiting to be computed again", of: g => g.note.tokens_to_recompute },
  num_recomputed_tokens: { what: () => "tokens computed a second time so far", of: g => g.counters.num_recomputed_tokens },
  // (the paged pool's overhead is its null block, nobody's)
  held_slots: { what: () => "slots set aside for it", of: (g, info) => g.usage.token + g.usage.reserved +
    g.usage.internal_fragmentation + (info.allocator === "paged" ? 0 : g.usage.overhead) },
  token_slots: { what: () => "of them hold its tokens", of: g => g.usage.token },
};

const COUNTERS = [
  ["num_running", "running", v => nf0.format(v)],
  ["num_waiting", "waiting", v => nf0.format(v)],
  ["num_finished", "finished", v => nf0.format(v)],
  ["num_recomputed_tokens", "recomputed tokens", v => nf0.format(v)],
  ["throughput_tps", "tokens/s", v => nf1.format(v)],
  ["num_rejected", "rejected", v => nf0.format(v)],
];
const SETUP_FIELDS = {
  model: m => m.model,
  gpu: m => m.gpu,
  "num-blocks": m => nf0.format(m.num_gpu_blocks),
  "block-size": m => nf0.format(m.kv_block_size),
  "display-scale": m => (m.display_scale > 1 ? `, drawn ${nf0.format(m.display_scale)} to a square` : ""),
  rate: m => String(m.setup.rate),
  "slab-blocks": m => nf0.format(Math.ceil(m.max_model_len / m.kv_block_size)),
  "max-model-len": m => nf0.format(m.max_model_len),
  "kv-per-token": m => `${nf0.format(m.kv_bytes_per_token / 1024)} KiB (${nf0.format(m.kv_bytes_per_token)} bytes) ` +
    `per token for ${m.model}`,
};
const FRIENDLY = { max: "reserve the max", paged: "pages (vLLM)", pow2: "power of two", oracle: "oracle" };

// A lane's subtitle: the lesson's four (named batching+memory) in the words section 2 defines beside its buttons
// (continuous or static batching, reserve the max or pages); the others (the paper's systems, under "more") in
// their own description.
function describe(info) {
  const memory = { max: "reserve the max", paged: "pages" }[info.allocator];
  if (!memory || info.name !== `${info.batching}+${info.allocator}`) return info.description || "";
  return `${info.batching} batching, ${memory}` + (info.name === "continuous+paged" ? " (= vLLM)" : "");
}
const LANE_COLOURS = [PALETTE[3], PALETTE[4], PALETTE[2], PALETTE[0]].map(hex);
const LANE_DASHES = [[], [7, 4], [2, 3], [10, 3, 2, 3]];

const stats = { framesApplied: 0, framesDrawn: 0, drawMs: 0, playAt: null, firstFrameAt: null, firstDrawAt: null };
let runCounter = 0;

class Player {
  constructor(section, kind, look) {
    this.section = section;
    this.kind = kind;
    this.look = look || LOOKS[kind] || LOOKS.race;
    this.panelsHost = section.querySelector(".panels");
    this.errorNode = section.querySelector(".error");
    this.transport = section.querySelector(".transport");
    this.finishNode = section.querySelector(".finish");
    this.chart = section.querySelector(".chart");
    this.views = [];
    this.panels = [];
    this.meta = null;
    this.requests = new Map();
    this.seq = -1;
    this.t = 0;
    this.playing = false;
    this.done = false;
    this.drawPending = false;
    this.hoverAt = null; // {view, c, x, y}: refreshed after every frame drawn
    this.highlight = -1;
    this.listeners = []; // other figures drawn from this player's frames (the block table, the batching chart)
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
    new ResizeObserver(() => this.relayout()).observe(this.panelsHost);
  }

  build(meta) {
    meta.runId = ++runCounter;
    this.meta = meta;
    this.requests = new Map(meta.requests.map(r => [r[0], r]));
    this.panelsHost.innerHTML = "";
    this.panelsHost.dataset.lanes = String(meta.grids.length);
    this.views = [];
    this.panels = [];
    this.summaries = null;
    this.series = meta.grids.map(() => [[0, 0]]);
    this.hoverAt = null;
    this.highlight = -1;
    tooltip.hidden = true;
    if (this.finishNode) { this.finishNode.hidden = true; this.finishNode.innerHTML = ""; }
    // All panels first, then the grids: each grid measures the width its panel really gets.
    const built = meta.grids.map((info, i) => this.buildPanel(info, i));
    built.forEach(p => {
      p.view = new GridView(p.wrap, meta.num_blocks, meta.block_size, this.maxGridHeight(), !!this.look.simple);
      this.wireView(p.view, p);
      this.views.push(p.view);
      this.panels.push(p);
      this.caption(p);
    });
    if (this.chart) this.chart.hidden = meta.grids.length < 2;
    this.drawChart();
  }

  maxGridHeight() {
    const h = window.innerHeight || 800, w = window.innerWidth || 1000;
    const share = w < 640 && this.look.phoneHeight ? this.look.phoneHeight : this.look.height;
    return Math.max(100, Math.min(420, Math.round(h * share)));
  }

  buildPanel(info, i) {
    const look = this.look;
    const panel = el("div", { class: "panel", "data-strategy": info.name });
    const badge = el("span", { class: "badge", "data-field": "finish-time" });
    const title = look.names ? (FRIENDLY[info.allocator] || info.name) : info.name;
    // The first figures name each strategy in words; kvlab's names (continuous+max) come with section 2's
    // definitions and the race.
    panel.append(el("h3", {}, el("span", { class: "name", text: title }),
      el("span", { class: "desc", text: look.names ? "" : describe(info) }), badge));
    const fields = {}, whats = {};
    const big = el("div", { class: "bignums", role: "status", "aria-live": "polite", "aria-atomic": "false" });
    for (const key of look.big) {
      const node = el("span", { class: "big" + (key === "num_preemptions" ? " evictions" : ""), "data-counter": key,
        "data-value": "0", text: "–" });
      const what = el("span", { class: "what", text: BIG[key].what({ counters: { num_preemptions: 0 } }) });
      big.append(el("div", {}, node, what));
      fields[key] = node;
      whats[key] = what;
    }
    if (look.paper && catalog.paper) big.append(el("p", { class: "paper", text: paperShares(catalog.paper.figure2) }));
    panel.append(big);
    const wrap = el("div", { class: "gridwrap" });
    panel.append(wrap);
    const scale = el("div", { class: "scale" });
    const note = el("p", { class: "note" });
    const ended = el("p", { class: "ended" });
    ended.hidden = true;
    panel.append(ended, note, scale);
    const p = { panel, wrap, scale, fields, whats, info, note, ended, badge, lane: i, peak: 0, flashes: 0,
      lastShares: null, last: null };
    if (look.bar) {
      p.bar = el("canvas", { class: "sharebar", role: "img", "aria-label": "memory shares" });
      p.barLabel = el("div", { class: "sharebar-label", text: "memory right now" });
      panel.append(p.bar, p.barLabel);
    }
    if (look.seats) {
      p.seats = el("canvas", { class: "seats", role: "img", "aria-label": "running seats and waiting queue" });
      p.seatsLabel = el("div", { class: "seats-label" });
      panel.append(p.seats, p.seatsLabel);
    }
    if (look.counters) {
      const dl = el("dl", { class: "counters" });
      for (const [key, label] of COUNTERS) {
        if (look.big.includes(key)) continue;
        const dd = el("dd", { "data-counter": key, text: "–" });
        dl.append(el("div", {}, el("dt", { text: label }), dd));
        fields[key] = dd;
      }
      panel.append(dl);
    }
    this.panelsHost.append(panel);
    return p;
  }

  caption(p) {
    const m = this.meta, L = p.view.layout, k = L.k * (m.display_scale || 1);
    p.scale.textContent = `${nf0.format(m.num_gpu_blocks || m.num_blocks)} blocks of ${m.kv_block_size || m.block_size} ` +
      `tokens (${nf0.format(m.num_slots)} token slots) · ` + (k > 1 ? `display scale: one square = ${nf0.format(k)} blocks`
      : "one square = one block");
    p.view.canvas.setAttribute("aria-label", `KV cache of ${p.info.name}: ${p.scale.textContent}. ` +
      "Arrow keys move between squares; each is described below the grid.");
  }

  wireView(view, p) {
    view.canvas.addEventListener("mousemove", e => {
      const c = view.cellAt(e);
      this.hoverAt = c < 0 ? null : { view, c, x: e.clientX, y: e.clientY };
      this.refreshTooltip();
    });
    view.canvas.addEventListener("mouseleave", () => { this.hoverAt = null; this.refreshTooltip(); });
    view.canvas.addEventListener("click", e => {
      const c = view.cellAt(e);
      // A tap (a phone has no hover) says what the square is, as the pointer's hover does.
      if (c >= 0) { this.hoverAt = { view, c, x: e.clientX, y: e.clientY }; this.refreshTooltip(); }
      if (c >= 0 && this.onPick) this.onPick(view.cellState(c).owner, p);
    });
    view.canvas.addEventListener("blur", () => { view.kbCell = -1; view.overlayDirty = true; this.hoverAt = null; this.refreshTooltip(); });
    view.canvas.addEventListener("keydown", e => {
      const L = view.layout, moves = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: L.cols, ArrowUp: -L.cols,
        Home: -Infinity, End: Infinity };
      if (e.key === "Enter" && view.kbCell >= 0 && this.onPick) { this.onPick(view.cellState(view.kbCell).owner, p); return; }
      if (!(e.key in moves)) return;
      e.preventDefault();
      e.stopPropagation();
      const c = view.kbCell < 0 ? 0 : view.kbCell + moves[e.key];
      view.kbCell = Math.max(0, Math.min(L.cells - 1, Number.isFinite(c) ? c : (c > 0 ? L.cells - 1 : 0)));
      view.overlayDirty = true;
      const r = view.cellClientRect(view.kbCell);
      this.hoverAt = { view, c: view.kbCell, x: r.left + r.size, y: r.top + r.size, kb: true };
      this.refreshTooltip();
      this.scheduleDraw();
    });
  }

  // The tooltip says what is under the pointer (or the keyboard's cursor) now, so it is rewritten every frame.
  refreshTooltip() {
    const h = this.hoverAt;
    let id = -1;
    if (!h || !this.views.includes(h.view)) {
      if (tooltip.dataset.owner === this.kind) tooltip.hidden = true;
    } else {
      const text = h.view.describe(h.c, this.requests, this.meta.display_scale || 1);
      setText(tooltip, text);
      tooltip.dataset.owner = this.kind;
      tooltip.hidden = false;
      tooltip.style.left = Math.max(4, Math.min(window.innerWidth - tooltip.offsetWidth - 8, h.x + 14)) + "px";
      tooltip.style.top = Math.min(window.innerHeight - tooltip.offsetHeight - 8, h.y + 14) + "px";
      if (h.kb) setText(announce, text);
      id = h.view.cellState(h.c).owner;
    }
    if (id !== this.highlight) {
      // One conversation's blocks, highlighted in every grid of this section (its pages may lie anywhere).
      this.highlight = id;
      for (const v of this.views) { v.highlight = id; v.overlayDirty = true; }
      this.scheduleDraw();
    }
  }

  relayout() {
    if (!this.panels.length) return;
    let changed = false;
    for (const p of this.panels) {
      const w = p.wrap.clientWidth;
      if (w > 0 && p.view.relayout(w)) { changed = true; this.caption(p); }
    }
    if (this.chart && !this.chart.hidden) {
      const w = this.chart.querySelector("canvas").clientWidth;
      if (w && w !== this.chartWidth) { this.chartWidth = w; changed = true; }
    }
    if (changed) { for (const p of this.panels) p.lastShares = null; this.renderText(); this.drawChart(); this.scheduleDraw(); }
  }

  onFrame(frame) {
    this.seq = frame.seq;
    this.t = frame.t;
    stats.framesApplied++;
    if (stats.playAt !== null && stats.firstFrameAt === null) stats.firstFrameAt = performance.now();
    const now = performance.now();
    frame.grids.forEach((g, i) => {
      const p = this.panels[i], view = this.views[i], note = g.note || {};
      if (note.evicted && note.evicted.length) this.flashEvicted(p, view, note, now);
      view.apply(g.blocks);
      p.last = g;
      const series = this.series[i], fin = g.counters.num_finished || 0;
      if (frame.finish && frame.finish.finished_over_time) this.series[i] = frame.finish.finished_over_time[i];
      else if (!g.done && series[series.length - 1][1] !== fin) series.push([frame.t, fin]);
      if (this.kind === "grid") noteFacts(p.info, g, frame.finish ? frame.finish.summaries[i] : null, this.meta);
    });
    this.lastFrame = frame;
    if (frame.done) { this.done = true; this.setPlaying(false); }
    if (frame.finish) this.showFinish(frame.finish);
    this.textDue = true;
    this.chartDue = true;
    this.scheduleDraw();
  }

  flashEvicted(p, view, note, now) {
    const cells = view.flash(note.evicted, now);
    p.flashes += note.evicted.length;
    p.lastEvicted = note.evicted.map((id, j) => [id, (note.evicted_tokens || [])[j] || 0]);
    setData(p.panel, "flashes", p.flashes);
    setData(p.panel, "flashCells", cells);
    // The counter pulses (the Web Animations API restarts it without making the browser lay the page out).
    const ev = p.fields.num_preemptions;
    if (!ev) return;
    ev.classList.add("pulse");
    if (ev.animate) {
      ev.animate([{ transform: "scale(1.25)" }, { transform: "scale(1)" }], { duration: 900, easing: "ease-out" });
    }
  }

  // Every number of every panel, the clock, the notes and the strips, written from one frame: the last applied.
  // At most every SLOW_MS (a layout per frame would cost the grids their frame rate), except right after a stop.
  renderText() {
    const frame = this.lastFrame;
    if (!frame) return;
    const clock = this.transport.querySelector('[data-field="clock"]');
    setText(clock, `simulated time ${nf1.format(frame.t)} s` + (frame.done ? " · done" : ""));
    setData(clock, "value", frame.t);
    for (const p of this.panels) this.renderPanel(p, frame);
    setData(this.section, "seq", frame.seq);
    setData(this.section, "shownSeq", frame.seq);
    for (const f of this.listeners) f(this, frame);
    if (this.onRender) this.onRender(frame);
  }

  renderPanel(p, frame) {
    const g = p.last;
    if (!g) return;
    const s = this.summaries ? this.summaries[p.lane] : null;
    for (const key of this.look.big) {
      const node = p.fields[key], def = BIG[key];
      let v = def.of(g, p.info), what = def.what(g, this.look);
      if (s && key === "token_share") { v = s.memory_shares.token; what = "of the memory held tokens, time-averaged over the run"; }
      if (v === undefined || v === null) v = 0;
      setText(node, (def.fmt || (x => nf0.format(x)))(v));
      setData(node, "value", v);
      if (s && key === "token_share") setData(node, "average", v);
      setText(p.whats[key], what);
    }
    for (const [key, , fmt] of COUNTERS) {
      const node = p.fields[key];
      if (node && !this.look.big.includes(key) && key in g.counters) {
        setText(node, fmt(g.counters[key])); setData(node, "value", g.counters[key]);
      }
    }
    p.panel.classList.toggle("lane-done", !!g.done);
    setText(p.badge, g.done && g.finish_time !== null ? `done at ${nf1.format(g.finish_time)} s` : "");
    setData(p.panel, "finishTime", g.done && g.finish_time !== null ? g.finish_time : "");
    if (this.look.note) this.writeNote(p, g);
    else this.placeGap(p, null);
    if (p.bar) this.drawStrip(p, s);
    if (p.seats) {
      // Over, the seats say nothing the summary does not (the peak is of the frames drawn, and a jump draws none).
      p.seats.hidden = p.seatsLabel.hidden = !!s;
      if (!s) this.drawSeats(p);
    }
    if (s) {
      p.ended.hidden = false;
      setText(p.ended, `Run over: all ${nf0.format(s.num_finished)} served in ${nf1.format(s.makespan_s)} s; the cache ` +
        `is empty again. Over the run ${pct(s.memory_shares.token)} of the memory held tokens and ` +
        `${nf1.format(s.mean_batch_size)} conversations ran at once on average.`);
    } else p.ended.hidden = true;
    setData(p.panel, "seq", frame.seq);
  }

  placeGap(p, gap) {
    const view = p.view;
    if (String(gap) !== String(view.gap)) { view.gap = gap; view.overlayDirty = true; }
  }

  // Under the figure: who is next in the queue, what admitting it takes (the allocator's answer) and what keeps
  // it waiting; the free piece the allocator would hand out is outlined on the grid.
  writeNote(p, g) {
    const n = g.note || {}, scale = this.meta.display_scale || 1, bs = this.meta.kv_block_size || this.meta.block_size;
    const h = n.head;
    const piece = !g.done && h && h.one_piece && n.piece && n.piece[0] >= 0
      ? [Math.floor(n.piece[0] / scale), Math.ceil(n.piece[1] / scale)] : null;
    this.placeGap(p, piece);
    let text = "", waits = false;
    const evicted = p.lastEvicted && p.lastEvicted.length && !g.done ? p.lastEvicted : null;
    if (g.done) text = "";
    else if (h) {
      const need = Math.ceil(h.slots / bs), room = Math.floor(h.room_slots / bs);
      const who = h.evicted ? `evicted conversation ${h.id}, back at the head of the queue,`
        : `the next conversation (${h.id})`;
      const what = h.one_piece
        ? `needs ${h.slots === h.asked_slots ? "" : `${nf0.format(h.asked_slots)} slots, rounded up to `}` +
          `${blocks(need)} in one piece`
        : `needs ${blocks(need)} for its ${plural(h.num_tokens, "token")}${h.evicted ? ", all to compute again" : ""}`;
      const there = h.one_piece ? `the largest free piece is ${blocks(room)} (${nf0.format(n.free_blocks)} free in all)`
        : `${blocks(room)} free`;
      waits = h.waits !== "";
      const why = { memory: `: it waits, with ${nf0.format(g.counters.num_waiting)} in the queue`,
        seats: `, but every seat is taken (${nf0.format(g.counters.num_running)} running, max_num_seqs): it waits`,
        batch: ": static batching, so it waits for the whole running batch to finish",
        "": ": it joins at the next step" }[h.waits];
      text = `${who[0].toUpperCase()}${who.slice(1)} ${what}; ${there}${why}.`;
    } else if (g.counters.step > 0) {
      text = `${blocks(n.free_blocks)} free; nobody is waiting.`;
    }
    if (evicted) {
      text += ` Evicted since the last frame: ${evicted.slice(0, 3).map(([id, t]) => `conversation ${id}` +
        (t ? ` (${plural(t, "token")} to compute again)` : "")).join(", ")}` +
        `${evicted.length > 3 ? ` and ${nf0.format(evicted.length - 3)} more` : ""}.`;
    }
    p.note.classList.toggle("waits", waits && h && h.waits === "memory");
    setText(p.note, text.trim());
    setData(p.panel, "note", text.trim());
  }

  // The running batch as seats, the queue as a line: empty seats beside a waiting queue are static batching's
  // cost; seats refilled at once are continuous batching's. Seats: the most this engine has run at once.
  drawSeats(p) {
    const g = p.last;
    const running = g.counters.num_running || 0, waiting = g.counters.num_waiting || 0;
    p.peak = Math.max(p.peak, running);
    const canvas = p.seats, w = Math.max(60, p.view.width), h = 34;
    const ids = [];
    const seen = new Set(), owner = p.view.owner;
    for (let b = 0; b < owner.length; b++) { const o = owner[b]; if (o >= 0 && !seen.has(o)) { seen.add(o); ids.push(o); } }
    ids.sort((a, b) => a - b);
    const key = `${w} ${p.peak} ${running} ${waiting} ${ids.join(",")}`;
    if (key !== p.seatsKey) {
      p.seatsKey = key;
      if (canvas.width !== w) canvas.width = w;
      if (canvas.height !== h) canvas.height = h;
      const ctx = canvas.getContext("2d");
      ctx.clearRect(0, 0, w, h);
      const seatsW = Math.floor(w * 0.62), seats = Math.max(1, p.peak);
      const rows = seats * 6 > seatsW ? 2 : 1;
      const per = Math.ceil(seats / rows), s = Math.max(2, Math.min(14, Math.floor(seatsW / per)));
      // One path per colour (a canvas state change per seat would cost more than the drawing).
      const paths = PALETTE.map(() => new Path2D()), empty = new Path2D();
      for (let i = 0; i < seats; i++) {
        const x = (i % per) * s, y = ((i / per) | 0) * (s + 2) + 1;
        if (i < Math.min(running, ids.length)) paths[ids[i] % PALETTE.length].rect(x, y, s - 1, s - 1);
        else empty.rect(x + 0.5, y + 0.5, s - 2, s - 2);
      }
      paths.forEach((path, k) => { ctx.fillStyle = PALETTE_HEX[k]; ctx.fill(path); });
      ctx.strokeStyle = "#888"; ctx.lineWidth = 1; ctx.stroke(empty);
      const qx = seatsW + 10, room = Math.max(0, Math.floor((w - qx - 40) / 5));
      const queue = new Path2D();
      for (let i = 0; i < Math.min(waiting, room); i++) queue.rect(qx + i * 5, 12, 3, 10);
      ctx.fillStyle = "#5f6368";
      ctx.fill(queue);
      if (waiting > room) { ctx.font = "11px system-ui, sans-serif"; ctx.fillText(`+${nf0.format(waiting - room)}`, qx + room * 5 + 2, 21); }
    }
    setText(p.seatsLabel, `seats: ${nf0.format(running)} running of ${nf0.format(Math.max(1, p.peak))} (the most at ` +
      `once so far) · queue: ${nf0.format(waiting)} waiting`);
    setData(p.seats, "running", running);
    setData(p.seats, "waiting", waiting);
  }

  drawStrip(p, s) {
    const g = p.last, u = g.usage, simple = !!this.look.simple;
    const shares = s ? [s.memory_shares.token, s.memory_shares.reserved, s.memory_shares.internal_fragmentation, 0,
      s.memory_shares.external_fragmentation]
      : [u.token, u.reserved, u.internal_fragmentation, u.overhead, u.free];
    const key = shares.join(",") + "|" + p.view.width;
    if (key === p.lastShares) return;
    p.lastShares = key;
    // A paged pool's overhead is its null block, nobody's; a slab's is its owner's round-up.
    const paged = p.info.allocator === "paged";
    drawShareBar(p.bar, shares, p.view.width, simple, paged);
    // Shares of the whole, each rounded to a tenth of a percent from the frame's slot counts (the same
    // numbers as the big one: tokens / all slots).
    const total = shares.reduce((a, b) => a + b, 0) || 1, f = v => pct(100 * v / total);
    const named = simple ? (paged
      ? [[[0], "tokens"], [[1, 2], "reserved, still empty"], [[4], "free"],
        [[3], "vLLM's null block (one page it keeps aside as a placeholder, never holding tokens)"]]
      : [[[0], "tokens"], [[1, 2, 3], "reserved, still empty"], [[4], "free"]])
      : s ? [[[0], "tokens"], [[1], "reserved"], [[2], "never used"], [[4], "free or between slabs"]]
        : [[[0], "tokens"], [[1], "reserved"], [[2], "never used"], [[3], "rounded up"], [[4], "free"]];
    const parts = named.map(([js, name]) => [f(js.reduce((a, j) => a + shares[j], 0)), name]);
    const text = (s ? "memory over the whole run (time-averaged): " : "memory right now: ") +
      parts.map(([v, name]) => `${v} ${name}`).join(" · ");
    if (p.barLabel.textContent !== text) {
      // The waste (reserved and still empty) is the first figure's point: its share in bold.
      p.barLabel.textContent = "";
      p.barLabel.append(s ? "memory over the whole run (time-averaged): " : "memory right now: ");
      parts.forEach(([v, name], i) => {
        if (i) p.barLabel.append(" · ");
        p.barLabel.append(/reserved/.test(name) ? el("b", { "data-share": "reserved", text: `${v} ${name}` })
          : `${v} ${name}`);
      });
      p.bar.setAttribute("aria-label", text);
    }
  }

  scheduleDraw() {
    if (this.drawPending) return;
    this.drawPending = true;
    requestAnimationFrame(now => {
      this.drawPending = false;
      const t0 = performance.now();
      let drew = false;
      for (const v of this.views) drew = v.draw() || drew;
      let animating = false;
      // The text first: the note says where the free piece is, which the overlay outlines.
      if (this.textDue && (!this.textAt || now - this.textAt > SLOW_MS)) {
        this.textDue = false; this.textAt = now; this.renderText();
      } else if (this.textDue) animating = true;
      for (const v of this.views) { v.drawOverlay(now); animating = animating || v.flashes.length > 0; }
      if (this.chartDue && (!this.chartAt || now - this.chartAt > 250 || this.done || !this.playing)) {
        this.chartDue = false; this.chartAt = now; this.drawChart();
      } else if (this.chartDue) animating = true;
      if (answersDue) { answersDue = false; renderAnswers(); }
      if (this.hoverAt) this.refreshTooltip();
      if (drew) {
        stats.framesDrawn++;
        stats.drawMs += performance.now() - t0;
        if (stats.playAt !== null && stats.firstDrawAt === null) stats.firstDrawAt = performance.now();
      }
      if (animating) this.scheduleDraw();
    });
  }

  // Requests finished over time, one line per strategy: the race's finish line.
  drawChart() {
    if (!this.chart || this.chart.hidden || !this.meta) return;
    const canvas = this.chart.querySelector("canvas");
    if (!this.chartWidth) this.chartWidth = canvas.clientWidth;
    const w = Math.max(100, Math.floor(this.chartWidth || 300)), h = 200;
    if (canvas.width !== w) canvas.width = w;
    if (canvas.height !== h) canvas.height = h;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, w, h);
    const total = this.meta.requests.length || 1;
    const tMax = Math.max(1, ...this.series.map(s => s[s.length - 1][0]));
    const left = 40, bottom = h - 22, top = 8, right = w - 8;
    const X = t => left + (right - left) * t / tMax, Y = n => bottom - (bottom - top) * n / total;
    ctx.strokeStyle = "#d0d0d0"; ctx.lineWidth = 1; ctx.fillStyle = "#5f6368"; ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(left, top); ctx.lineTo(left, bottom); ctx.lineTo(right, bottom); ctx.stroke();
    ctx.fillText(nf0.format(total), 2, top + 8); ctx.fillText("0", 28, bottom);
    ctx.fillText(`${nf0.format(tMax)} s`, right - 40, h - 6); ctx.fillText("simulated time", left + 4, h - 6);
    this.series.forEach((s, i) => {
      ctx.strokeStyle = LANE_COLOURS[i % 4]; ctx.lineWidth = 2.5; ctx.setLineDash(LANE_DASHES[i % 4]);
      ctx.beginPath();
      s.forEach(([t, n], j) => { if (j === 0) ctx.moveTo(X(t), Y(n)); else ctx.lineTo(X(t), Y(n)); });
      ctx.stroke(); ctx.setLineDash([]);
      const g = this.panels[i] && this.panels[i].last;
      if (g && g.done && g.finish_time !== null) {
        ctx.fillStyle = LANE_COLOURS[i % 4];
        ctx.beginPath(); ctx.arc(X(g.finish_time), Y(s[s.length - 1][1]), 4, 0, 7); ctx.fill();
      }
    });
    const legend = this.chart.querySelector(".chart-legend");
    const names = this.meta.grids.map((g, i) => {
      const last = this.panels[i] && this.panels[i].last;
      return g.name + (last && last.done && last.finish_time !== null ? ` (all served at ${nf1.format(last.finish_time)} s)` : "");
    }).join("|");
    if (legend.dataset.names !== names) {
      legend.dataset.names = names;
      legend.innerHTML = "";
      names.split("|").forEach((name, i) => legend.append(el("span", {},
        el("i", { style: `border-top-color:${LANE_COLOURS[i % 4]};border-top-style:${i % 4 ? "dashed" : "solid"}` }), name)));
    }
  }

  // The end of a run: every conversation has left, so the grid is empty; the last frame stays, and beside it the
  // run's time-averaged summary (the simulator's, the same numbers `kvlab race --json` prints).
  showFinish(finish) {
    this.summaries = finish.summaries;
    for (const p of this.panels) p.lastShares = null;
    if (!this.finishNode) return;
    this.recordRuns(finish);
    const node = this.finishNode;
    node.innerHTML = "";
    node.append(el("p", { class: "verdict", text: this.verdictText(finish) }));
    const many = this.panels.length > 1;
    node.append(el("div", { class: "tablewrap" }, summaryTable(this.finishRows(finish), many ? finish.winner : null)));
    node.append(el("p", { class: "hint", text: "normalized latency: a request's time from arrival to its last token, " +
      "divided by its answer's tokens (the vLLM paper's measure), averaged over requests." }));
    node.hidden = false;
    this.panels.forEach(p => p.panel.classList.toggle("winner", many && p.info.name === finish.winner));
  }

  recordRuns() {}
  finishRows(finish) { return finish.summaries; }
  verdictText(finish) { return finish.verdict; }

  setPlaying(on) {
    this.playing = on;
    // Stopped: the last frame's numbers at once, and the next frame's (a step, a seek) too.
    if (!on && this.panels.length) { this.textDue = true; this.textAt = 0; this.scheduleDraw(); }
    const b = this.transport.querySelector('[data-act="play"]');
    b.classList.toggle("playing", on);
    b.textContent = on ? "❚❚ pause" : "▶ play";
  }

  toggle() { if (this.playing) this.pause(); else this.play(); }
}

const SUMMARY_COLS = [
  ["num_finished", "finished", v => nf0.format(v)],
  ["finish_time", "all served at (s)", v => nf1.format(v)],
  ["throughput_rps", "requests/s", v => nf2.format(v)],
  ["throughput_tps", "tokens/s", v => nf1.format(v)],
  ["token_share", "memory holding tokens (time avg.)", v => pct(v)],
  ["mean_batch_size", "conversations at once (avg.)", v => nf1.format(v)],
  ["preemptions", "evictions", v => nf0.format(v)],
  ["recomputed_tokens", "tokens computed again", v => nf0.format(v)],
  ["normalized_latency_mean", "normalized latency (s/token)", v => nf2.format(v)],
];

function flatSummary(s) {
  const nl = s.normalized_latency_s_per_token || {};
  return {
    num_finished: s.num_finished, finish_time: s.makespan_s, throughput_rps: s.throughput_rps,
    throughput_tps: s.throughput_tps, token_share: s.memory_shares && s.memory_shares.token,
    mean_batch_size: s.mean_batch_size, preemptions: s.preemptions, recomputed_tokens: s.recomputed_tokens,
    normalized_latency_mean: nl.mean,
  };
}

function summaryTable(summaries, winner) {
  const table = el("table", { class: "summary" });
  const head = el("tr", { class: "head" }, el("th", { text: "strategy" }));
  for (const [, label] of SUMMARY_COLS) head.append(el("th", { text: label }));
  table.append(head);
  for (const s of summaries) {
    const row = el("tr", { "data-strategy": s.name }, el("td", { text: s.name + (s.name === winner ? " ★" : "") }));
    const flat = flatSummary(s);
    for (const [key, label, fmt] of SUMMARY_COLS) {
      const v = flat[key];
      row.append(el("td", { "data-key": key, "data-label": label, "data-value": v === undefined || v === null ? ""
        : String(v), text: v === undefined || v === null ? "–" : fmt(v) }));
    }
    table.append(row);
  }
  return table;
}

// Live: the engine runs on the server; frames arrive as server-sent events over a streaming fetch (so that an
// HTTP 400 carries its message to the page, which EventSource cannot do).
class LivePlayer extends Player {
  // ``form``: the controls the run is made from (none: ``fixed`` gives the spec).
  constructor(section, kind, form, fixed, look) {
    super(section, kind, look);
    this.form = form;
    this.fixed = fixed || {};
    this.session = null;
    this.abort = null;
    this.stale = true;
    this.timer = null;
    this.resetting = null;
    this.until = null; // a stream asked to stop at this simulated time
    this.runs = new Map(); // the grid's finished runs this visit, keyed by setup and strategy
    if (form) {
      // A changed control starts a new run (shortly, so that typing a number does not start one per digit). A bad
      // value is refused here, with a message, and the old result is dimmed; nothing is sent.
      form.addEventListener("change", () => this.controlsChanged());
      form.addEventListener("input", e => { if (e.target.dataset.kind) this.validate(); });
    }
  }

  controlsChanged() {
    this.stale = true;
    clearTimeout(this.timer);
    if (!this.validate()) { this.pause(); return; }
    this.timer = setTimeout(() => this.reset(), 250);
  }

  // [spec, message]: the run the controls describe, or why they describe none.
  specOrError() {
    if (!this.form) return [{ ...this.fixed }, null];
    const [values, msg] = checkForm(this.form);
    if (msg) return [null, msg];
    const data = Object.fromEntries(new FormData(this.form).entries());
    const spec = { kind: this.kind === "race" ? "race" : "grid" };
    if (this.kind !== "race") {
      spec.strategies = [`${data.batching}+${data.allocator}`];
    } else {
      spec.strategies = Array.from(this.form.querySelectorAll('input[name="strategy"]:checked')).map(i => i.value);
      const max = catalog.limits.max_strategies;
      if (!spec.strategies.length) return [null, "pick at least one strategy to race"];
      if (spec.strategies.length > max) {
        return [null, `a race holds at most ${max} strategies; ${spec.strategies.length} are ticked: untick ` +
          `${spec.strategies.length - max}`];
      }
    }
    for (const k of ["workload", "block_size", "model", "gpu"]) spec[k] = data[k];
    for (const k of ["rate", "num_requests", "seed"]) spec[k] = values[k];
    if (values.num_blocks !== null) spec.num_blocks = values.num_blocks;
    return [spec, null];
  }

  validate() {
    const [, msg] = this.specOrError();
    this.setStale(!!msg || this.stale);
    if (msg) showError(this.errorNode, new Error(msg));
    else if (this.errorNode.dataset.local === "1" || !this.errorNode.hidden) showError(this.errorNode, null);
    this.errorNode.dataset.local = msg ? "1" : "";
    return !msg;
  }

  setStale(on) { this.section.classList.toggle("stale", on); this.section.dataset.stale = on ? "1" : ""; }

  reset() {
    clearTimeout(this.timer);
    if (!this.resetting) this.resetting = this.newRun().finally(() => { this.resetting = null; });
    return this.resetting;
  }

  async newRun() {
    this.pause();
    const [spec, msg] = this.specOrError();
    if (msg) { showError(this.errorNode, new Error(msg)); this.setStale(true); return; }
    this.stale = false; // a control changed from here on makes the run stale again
    const old = this.session;
    this.session = null;
    if (old) fetch(`api/sessions/${old}`, { method: "DELETE" }).catch(() => {});
    this.setBusy(true);
    try {
      const meta = await api("api/sessions", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(spec) });
      showError(this.errorNode, null);
      this.session = meta.session_id;
      this.section.dataset.session = meta.session_id;
      this.done = false;
      this.held = false;
      this.build(meta);
      this.writeSetup(meta);
      this.onFrame(meta.frame);
      this.setStale(false);
      if (this.onNewRun) this.onNewRun(meta);
    } catch (err) {
      showError(this.errorNode, err);
      this.setStale(true);
    } finally {
      this.setBusy(false);
    }
  }

  // The section's prose names the run it draws: each [data-field] of SETUP_FIELDS, from the run's meta (so a pool
  // drawn from the calculator, or another rate, is the one the text names).
  writeSetup(meta) {
    for (const node of this.section.querySelectorAll("[data-field]")) {
      const f = SETUP_FIELDS[node.dataset.field];
      if (f) { setText(node, f(meta)); setData(node, "value", node.textContent); }
    }
  }

  setBusy(on) {
    this.section.classList.toggle("busy", on);
    this.section.dataset.busy = on ? "1" : "";
    this.section.setAttribute("aria-busy", on ? "true" : "false");
  }

  async ready() {
    if (this.resetting) await this.resetting;
    if (!this.session || this.stale) await this.reset();
    return this.session !== null && !this.section.classList.contains("stale");
  }

  // Play; with ``until`` (simulated seconds), the stream's last frame is the one at that time, and it stays.
  async play(until) {
    if (this.playing || this.starting) return; // one stream at a time: two would interleave their deltas
    stats.playAt = performance.now(); stats.firstFrameAt = null; stats.firstDrawAt = null;
    this.starting = true;
    try {
      if (!(await this.ready()) || this.done) return;
    } finally {
      this.starting = false;
    }
    this.until = until === undefined ? null : until;
    this.setPlaying(true);
    if (this.onPlay) this.onPlay();
    const ctrl = new AbortController();
    this.abort = ctrl;
    try {
      const hold = this.until === null ? "" : `&until=${this.until}`;
      const resp = await fetch(`api/sessions/${this.session}/stream?speed=${this.speed}&have=${this.seq}${hold}`,
        { signal: ctrl.signal, headers: REFUSALS });
      if ((resp.headers.get("content-type") || "").startsWith("application/json")) {
        throw new Refusal(await resp.json()); // refused before the stream began (a run that expired)
      }
      if (!resp.ok) {
        let msg = `the server answered ${resp.status}`;
        try { msg = (await resp.json()).error || msg; } catch (e) { /* keep the status */ }
        throw new Error(msg);
      }
      showError(this.errorNode, null);
      await this.readStream(resp);
    } catch (err) {
      if (err.name !== "AbortError") showError(this.errorNode, err);
    } finally {
      if (this.abort === ctrl) { this.abort = null; this.setPlaying(false); }
    }
  }

  onFrame(frame) {
    super.onFrame(frame);
    if (frame.held) {
      this.held = true;
      if (this.onHeld) this.onHeld(frame);
    }
  }

  async readStream(resp) {
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
  }

  pause() {
    if (this.abort) { this.abort.abort(); this.abort = null; }
    this.setPlaying(false);
  }

  async post(action, query = "") {
    this.pause();
    if (!(await this.ready())) return;
    this.setBusy(true);
    try {
      const frame = await api(`api/sessions/${this.session}/${action}?have=${this.seq}${query}`, { method: "POST" });
      showError(this.errorNode, null);
      this.onFrame(frame);
    } catch (err) {
      showError(this.errorNode, err);
    } finally {
      this.setBusy(false);
    }
  }

  step() { return this.post("step"); }
  finish() { return this.post("finish"); }
  // Run on to t simulated seconds and show that frame: the same frame whatever the machine's speed.
  seek(t) { return this.post("seek", `&t=${t}`); }

  // From now on every frame carries conversation ``id``'s block table; the tables as they stand now come back.
  async follow(id) {
    if (!this.session) return null;
    const r = await api(`api/sessions/${this.session}/follow?id=${id}`, { method: "POST" });
    return r.tables;
  }

  // The grid keeps each strategy's last finished run per setup, so that the story compares like with like.
  recordRuns(finish) {
    if (this.kind !== "grid") return;
    for (const s of finish.summaries) {
      const key = `${this.meta.setup_key} ${s.name}`;
      this.runs.delete(key);
      this.runs.set(key, { summary: s, setup: this.meta.setup, setupKey: this.meta.setup_key,
        allocator: this.meta.grids[0].allocator });
    }
    if (this.onRunsChanged) this.onRunsChanged();
  }

  // The finish table: this run and the runs before it on the same settings (never a run on other settings).
  finishRows(finish) {
    if (this.kind !== "grid") return finish.summaries;
    return Array.from(this.runs.values()).filter(r => r.setupKey === this.meta.setup_key).map(r => r.summary);
  }

  verdictText(finish) {
    if (this.kind !== "grid") return finish.verdict;
    const same = this.finishRows(finish);
    if (same.length < 2) return finish.verdict;
    return finish.verdict + " Your runs on these settings, time-averaged: " +
      same.map(s => `${s.name} ${pct(s.memory_shares.token)} of memory holding tokens, all served in ` +
        `${nf0.format(s.makespan_s)} s`).join("; ") + ".";
  }
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

  // The recorded frames up to t simulated seconds, applied in order.
  seek(t) {
    this.pause();
    while (this.index < this.log.frames.length && this.log.frames[this.index].t <= t) this.applyNext();
  }

  reset() {
    this.pause();
    this.index = 0;
    this.done = false;
    this.build(this.log.meta);
    this.applyNext();
  }
}

// ---------------------------------------------------------------- the first figure: two caches, one clock
const HERO_HOLD = 60; // simulated seconds: where the first figure stops, and the headline it stops on

function setupHero(hero) {
  const headline = document.getElementById("hero-headline");
  const onward = hero.transport.querySelector('[data-act="onward"]');
  onward.addEventListener("click", () => { activePlayer = hero; hero.play(); });
  // Play stops at the headline's moment the first time; from there, it plays on to the end.
  hero.toggle = () => { if (hero.playing) hero.pause(); else hero.play(hero.t < HERO_HOLD ? HERO_HOLD : undefined); };
  hero.onNewRun = () => { if (hero.autoplay) { hero.autoplay = false; hero.play(HERO_HOLD); } };
  hero.transport.querySelector('[data-act="again"]').addEventListener("click", () => {
    activePlayer = hero; hero.autoplay = true; hero.reset();
  });
  hero.onRender = frame => {
    if (hero.panels.length !== 2 || !hero.panels[0].last) return;
    const [a, b] = hero.panels.map(p => p.last.counters);
    const reached = frame.t >= HERO_HOLD - 1e-9;
    const at = reached ? `${nf0.format(frame.t)} s in` : `${nf1.format(frame.t)} s in`;
    let big, rest;
    if (a.num_running === b.num_running) {
      big = `Both run ${plural(a.num_running, "conversation")} at once: a tie so far.`;
      rest = ` Same GPU, same requests, ${at}.`;
    } else {
      big = `${plural(a.num_running, "conversation")} at once against ${nf0.format(b.num_running)}.`;
      rest = ` Same GPU, same requests, ${at}: reserving the max leaves ${nf0.format(a.num_waiting)} waiting, ` +
        `pages ${nf0.format(b.num_waiting)}.`;
    }
    headline.innerHTML = "";
    headline.append(el("b", { text: big }), document.createTextNode(rest));
    if (reached) headline.append(document.createTextNode(" Why? One conversation up close, below."));
    headline.classList.toggle("reached", reached);
    setData(headline, "final", reached ? "1" : "");
    setData(headline, "t", frame.t);
    setData(headline, "seq", frame.seq);
    setData(headline, "speed", hero.speed);
    onward.hidden = !(reached && !frame.done && !hero.playing);
  };
}

// Where the first figure's rate stands against its two caches' breaking points (section 7's, the engine's): said
// plainly, with the rate at which pages keep up and reserving the max does not, one press away.
function heroRateNote(hero, rates) {
  const note = document.getElementById("hero-rate"), f = rates.found;
  if (!f || !hero.meta) return;
  const rate = hero.fixed.rate;
  const line = info => f.systems.find(x => x.batching === info.batching && x.allocator === info.allocator);
  const [max, paged] = hero.meta.grids.map(line);
  if (!max || !paged) { note.hidden = true; return; }
  const holds = x => rate <= x.capacity_rps;
  const both = `pages keep up to ${paged.capacity_text} req/s, reserving the max to ${max.capacity_text}`;
  let text;
  if (!holds(max) && !holds(paged)) {
    text = `At ${rate} req/s conversations arrive faster than either cache serves them, so both queues grow ` +
      `without end: ${both} (section 7).`;
  } else if (holds(paged) && !holds(max)) {
    text = `At ${rate} req/s pages keep up and reserving the max does not: ${both} (section 7).`;
  } else text = `At ${rate} req/s ${holds(max) ? "both keep up" : "pages do not keep up"}: ${both} (section 7).`;
  const said = note.querySelector('[data-field="hero-rate-text"]');
  if (said.dataset.text !== text) {
    said.dataset.text = text;
    said.textContent = "";
    const [head, tail] = text.split("section 7");
    said.append(head, el("a", { href: "#rates", text: "section 7" }), tail);
  }
  const button = note.querySelector('[data-act="lesson-rate"]');
  const lesson = f.lesson_rate;
  button.hidden = lesson === null || lesson === rate;
  if (lesson !== null) setText(button, `watch at ${lesson} req/s, where pages keep up and reserving the max does not`);
  setData(note, "rate", rate);
  note.hidden = false;
}

// ---------------------------------------------------------------- 1. one conversation
const ONE_SEED = 3; // the workload's conversation drawn first: a 129-token prompt and a 681-token answer

function setupOne(one) {
  one.transport.querySelector('[data-act="another"]').addEventListener("click", async () => {
    one.fixed.seed = (one.fixed.seed + 1) % 1000;
    activePlayer = one;
    await one.reset();
    one.play();
  });
  const caption = document.getElementById("one-caption");
  one.onRender = frame => {
    if (one.panels.length !== 2 || !one.panels[0].last || !one.meta.requests.length) return;
    const [id, , prompt, answer] = one.meta.requests[0];
    const [slab, pages] = one.panels.map(p => p.last);
    const held = (g, info) => BIG.held_slots.of(g, info);
    const ms = held(slab, one.panels[0].info), ps = held(pages, one.panels[1].info);
    const tok = pages.usage.token;
    let text = `Conversation ${id}: a ${nf0.format(prompt)}-token prompt, then ${plural(answer, "token")} of answer. `;
    if (!ms && !tok && !frame.done) text += "Press play: it arrives, and both caches make room for it.";
    else if (frame.done) {
      text += "It has finished, and both caches are empty again: its slab goes back whole, its pages one by one. " +
        "A hole the slab's size can only be reused by another conversation whose slab fits in it.";
    } else {
      text += `Now ${plural(tok, "token")}. Reserve the max set aside ${nf0.format(ms)} slots the moment it started ` +
        `and fills ${pct(100 * tok / ms)} of them; pages hold it in ${nf0.format(ps)} slots ` +
        `(${blocks(ps / one.meta.kv_block_size)}), ${pct(100 * tok / Math.max(1, ps))} full: only the last page ` +
        "is partly empty.";
    }
    setText(caption, text);
  };
}

// A figure drawn from another's frames is redrawn only while it is on screen (and once when it comes into view):
// the first screen's frame rate is not spent on figures below it.
function whenVisible(node, onShow) {
  const state = { visible: false };
  new IntersectionObserver(entries => {
    const was = state.visible;
    state.visible = entries.some(e => e.isIntersecting);
    if (state.visible && !was) onShow();
  }).observe(node);
  return state;
}

// ---------------------------------------------------------------- 3. the block table
class TableFigure {
  constructor(host, hero) {
    this.host = host;
    this.hero = hero;
    this.gridHost = host.querySelector(".tablefig-grid");
    this.who = host.querySelector('[data-field="table-who"]');
    this.map = host.querySelector('[data-field="table-map"]');
    this.slab = host.querySelector('[data-field="table-slab"]');
    this.logical = host.querySelector("canvas.logical");
    this.view = null;
    this.runId = null;
    this.id = -1;
    this.tables = null;
    this.seen = whenVisible(host, () => { if (hero.lastFrame) this.update(hero.lastFrame); });
    hero.listeners.push((player, frame) => { if (this.seen.visible) this.update(frame); });
  }

  build() {
    const m = this.hero.meta;
    this.gridHost.innerHTML = "";
    const wrap = el("div", { class: "gridwrap" });
    this.gridHost.append(wrap);
    this.view = new GridView(wrap, m.num_blocks, m.block_size, Math.max(160, Math.min(380, window.innerHeight * 0.45)), true);
    this.view.canvas.setAttribute("aria-label", "the pages cache of the first figure; click a square to pick its conversation");
    this.view.canvas.addEventListener("click", e => {
      const c = this.view.cellAt(e);
      if (c >= 0) { const owner = this.view.cellState(c).owner; if (owner >= 0) this.pick(owner); }
    });
    new ResizeObserver(() => { if (this.view && this.view.relayout(wrap.clientWidth)) { this.view.copyFrom(this.source()); this.draw(); } })
      .observe(wrap);
    this.runId = m.runId;
    this.id = -1;
  }

  source() { return this.hero.views[1]; } // the pages grid (the race is reserve-the-max, then pages)

  update(frame) {
    if (!this.hero.meta || this.hero.views.length < 2) return;
    if (this.runId !== this.hero.meta.runId) this.build();
    this.view.copyFrom(this.source());
    const g = frame.grids;
    if (g[1] && g[1].table && g[1].table.id === this.id) this.tables = g.map(x => x.table);
    if (this.id < 0 || (this.tables && !this.tables[1].blocks.length && frame.grids[1].counters.num_running)) {
      const biggest = this.biggest();
      if (biggest >= 0 && biggest !== this.id) { this.pick(biggest); return; }
    }
    this.draw();
  }

  // The conversation holding the most pages now: its table shows the scatter best.
  biggest() {
    const counts = new Map(), owner = this.source().owner;
    for (let b = 0; b < owner.length; b++) if (owner[b] >= 0) counts.set(owner[b], (counts.get(owner[b]) || 0) + 1);
    let best = -1, n = 0;
    for (const [id, c] of counts) if (c > n) { best = id; n = c; }
    return best;
  }

  async pick(id) {
    this.id = id;
    setData(this.host, "id", id);
    try {
      const tables = await this.hero.follow(id);
      if (tables && this.id === id) this.tables = tables;
    } catch (err) { /* the hero's run was replaced: the next frame picks again */ }
    this.draw();
  }

  draw() {
    if (!this.view) return;
    const t = this.tables && this.tables[1] && this.tables[1].id === this.id ? this.tables : null;
    const v = this.view;
    v.highlight = this.id;
    v.labels = new Map();
    const pages = t ? t[1] : null, slab = t ? t[0] : null;
    const bs = this.hero.meta.kv_block_size || 16, k = this.hero.meta.display_scale || 1;
    if (pages && pages.blocks.length) pages.blocks.forEach((b, j) => v.labels.set(Math.floor(b / k), String(j)));
    v.overlayDirty = true;
    v.draw();
    v.drawOverlay(performance.now());
    if (!pages) { setText(this.who, "Waiting for the figure at the top to run…"); return; }
    const req = this.hero.requests.get(this.id);
    const n = pages.blocks.length;
    if (!n) {
      setText(this.who, `Conversation ${this.id} holds no pages now (${pages.status}). Click a coloured square.`);
    } else {
      setText(this.who, `Conversation ${this.id}` + (req ? ` (a ${nf0.format(req[2])}-token prompt)` : "") +
        `: ${plural(pages.num_tokens, "token")} in ${plural(n, "page")}. Its logical blocks, in token order, and the ` +
        "physical block each one is" + (v.labelsDrawn === v.labels.size ? " (the numbers on the grid):"
          : v.labelsDrawn ? " (numbered on the grid where a number fits):" : " (its squares are outlined on the grid):"));
    }
    this.drawLogical(pages, bs);
    this.map.innerHTML = "";
    const shown = pages.blocks.slice(0, 24);
    shown.forEach((b, j) => this.map.append(el("li", { text: `${j} → ${b}` })));
    if (n > shown.length) this.map.append(el("li", { text: `… ${n - shown.length} more` }));
    setData(this.map, "blocks", pages.blocks.join(","));
    if (slab && slab.blocks.length) {
      const a = slab.blocks[0], z = slab.blocks[slab.blocks.length - 1];
      setText(this.slab, `Under reserve the max the same conversation holds blocks ${a}–${z}: one piece of ` +
        `${nf0.format(slab.slab_slots)} slots, logical block j at block ${a} + j. No table is needed, and no other ` +
        "piece would do.");
    } else if (slab) {
      setText(this.slab, `Under reserve the max the same conversation holds no slab now: ` + ({
        waiting: "it is still waiting in the queue for a free piece long enough.",
        preempted: "it was evicted and waits to come back.",
        finished: "it has already finished.",
      }[slab.status] || `(${slab.status}).`));
    }
  }

  // The logical blocks as a strip: each filled as far as it holds tokens, numbered with its physical block.
  drawLogical(pages, bs) {
    const c = this.logical, n = pages ? pages.blocks.length : 0;
    const w = Math.max(100, c.clientWidth || 300), per = Math.max(8, Math.min(34, Math.floor(w / Math.max(1, n))));
    const rows = Math.max(1, Math.ceil(n * per / w)), h = rows * (per + 14);
    c.width = w; c.height = h;
    const ctx = c.getContext("2d");
    ctx.clearRect(0, 0, w, h);
    if (!n) return;
    const colour = PALETTE_HEX[colourOf(this.id)], cols = Math.max(1, Math.floor(w / per));
    ctx.font = "10px system-ui, sans-serif"; ctx.textAlign = "center";
    for (let j = 0; j < n; j++) {
      const x = (j % cols) * per, y = Math.floor(j / cols) * (per + 14);
      const filled = Math.max(0, Math.min(bs, pages.num_computed_tokens - j * bs)) / bs;
      ctx.fillStyle = "#e4e4e4"; ctx.fillRect(x, y, per - 2, per - 2);
      ctx.fillStyle = colour; ctx.fillRect(x, y, (per - 2) * filled, per - 2);
      ctx.fillStyle = "#1d1d1f";
      if (per >= 16) ctx.fillText(String(j), x + per / 2 - 1, y + per / 2 + 3);
      if (per >= 22) ctx.fillText(String(pages.blocks[j]), x + per / 2 - 1, y + per + 9);
    }
  }
}

// ---------------------------------------------------------------- 4. why batching more is faster
class BatchChart {
  constructor(figure, hero) {
    this.figure = figure;
    this.canvas = figure.querySelector("canvas");
    this.caption = figure.querySelector('[data-field="batching-caption"]');
    this.hero = hero;
    this.key = "";
    this.seen = whenVisible(figure, () => this.draw());
    hero.listeners.push(() => { if (this.seen.visible) this.draw(); });
    new ResizeObserver(() => { this.key = ""; this.draw(); }).observe(this.canvas);
  }

  draw() {
    const m = this.hero.meta;
    if (!m || !m.cost_curve || this.hero.panels.length !== 2 || !this.hero.panels[0].last) return;
    const runs = this.hero.panels.map(p => p.last.counters.num_running);
    const w = Math.max(240, Math.floor(this.canvas.clientWidth || 600)), h = 240;
    const key = `${m.runId} ${runs.join(",")} ${w}`;
    if (key === this.key) return;
    this.key = key;
    const rows = m.cost_curve.seconds.map((seconds, j) => ({ batch: j + 1, seconds })), B = rows.length;
    const ms = r => 1000 * r.seconds, tps = r => r.batch / r.seconds;
    const nice = v => { const e = 10 ** Math.floor(Math.log10(v)), f = v / e; return (f <= 2 ? 2 : f <= 5 ? 5 : 10) * e; };
    const msTop = nice(Math.max(...rows.map(ms))), tpsTop = nice(Math.max(...rows.map(tps)));
    this.canvas.width = w; this.canvas.height = h;
    const ctx = this.canvas.getContext("2d");
    ctx.clearRect(0, 0, w, h);
    const left = 52, right = w - 64, top = 14, bottom = h - 36;
    // The batch on a log scale: 1, 2, 4, ... are evenly spaced, so the small batches are not crowded together.
    const X = b => left + (right - left) * Math.log2(b) / Math.max(1, Math.log2(B));
    const Y1 = v => bottom - (bottom - top) * v / msTop, Y2 = v => bottom - (bottom - top) * v / tpsTop;
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#e6e6e6"; ctx.lineWidth = 1; ctx.fillStyle = "#5f6368";
    for (let j = 0; j <= 4; j++) {
      const y = bottom - (bottom - top) * j / 4;
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(right, y); ctx.stroke();
      ctx.textAlign = "right"; ctx.fillText(`${nf0.format(msTop * j / 4)} ms`, left - 4, y + 4);
      ctx.textAlign = "left"; ctx.fillText(nf0.format(tpsTop * j / 4), right + 4, y + 4);
    }
    ctx.textAlign = "center";
    for (let b = 1; b <= B; b *= 2) ctx.fillText(nf0.format(b), X(b), bottom + 13);
    ctx.fillText("conversations in one iteration (the batch; a log scale)", (left + right) / 2, h - 6);
    const line = (Y, f, style, dash) => {
      ctx.strokeStyle = style; ctx.lineWidth = 2.5; ctx.setLineDash(dash); ctx.beginPath();
      rows.forEach((r, j) => { if (j === 0) ctx.moveTo(X(r.batch), Y(f(r))); else ctx.lineTo(X(r.batch), Y(f(r))); });
      ctx.stroke(); ctx.setLineDash([]);
    };
    line(Y1, ms, "#1d1d1f", []);
    line(Y2, tps, "#0072b2", [6, 4]);
    const at = b => rows[Math.max(1, Math.min(B, b)) - 1];
    const names = ["reserve the max", "pages"];
    runs.forEach((b, i) => {
      const r = at(b), colour = PALETTE_HEX[i === 0 ? 0 : 3], x = X(r.batch);
      ctx.strokeStyle = colour; ctx.lineWidth = 1; ctx.setLineDash([2, 2]);
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke(); ctx.setLineDash([]);
      for (const [Y, f] of [[Y1, ms], [Y2, tps]]) {
        ctx.fillStyle = colour; ctx.strokeStyle = "#1d1d1f"; ctx.lineWidth = 1.5;
        ctx.beginPath(); ctx.arc(x, Y(f(r)), 5, 0, 7); ctx.fill(); ctx.stroke();
      }
      const label = `${names[i]}: ${nf0.format(b)}`, tw = ctx.measureText(label).width;
      const lx = Math.min(right - tw - 2, Math.max(left + 2, x - tw / 2)), ly = top + 2 + 14 * i;
      ctx.fillStyle = "rgba(255,255,255,0.9)"; ctx.fillRect(lx - 2, ly - 1, tw + 4, 13);
      ctx.fillStyle = "#1d1d1f"; ctx.textAlign = "left"; ctx.fillText(label, lx, ly + 9);
    });
    setData(this.figure, "batches", runs.join(","));
    const [ra, rb] = runs.map(at), w0 = m.cost_curve.weights_s * 1000;
    const c = m.cost_curve;
    let text = `One iteration of ${m.model} on ${m.gpu} (kvlab's cost model, profile ${c.profile}), each ` +
      `conversation reading ${plural(c.context_len, "token")} of keys and values (the workload's mean over a ` +
      `conversation's life). Reading the weights alone takes ${nf1.format(w0)} ms, whatever the batch. `;
    if (runs[0] !== runs[1]) {
      text += `The figure at the top, now: reserve the max runs ${nf0.format(runs[0])} at once, ` +
        `${nf1.format(ms(ra))} ms a step, ${nf0.format(tps(ra))} tokens/s; pages run ${nf0.format(runs[1])}, ` +
        `${nf1.format(ms(rb))} ms a step, ${nf0.format(tps(rb))} tokens/s: ${nf1.format(tps(rb) / tps(ra))}× the ` +
        `tokens for ${nf2.format(ms(rb) / ms(ra))}× the time per step.`;
    } else {
      text += `The figure at the top, now: both run ${nf0.format(runs[0])} at once, ${nf1.format(ms(ra))} ms a step.`;
    }
    const bend = m.cost_curve.compute_from;
    if (bend) text += ` From ${nf0.format(bend)} conversations on, arithmetic outweighs reading memory and the time line steepens.`;
    setText(this.caption, text);
  }
}

// ---------------------------------------------------------------- 5. evictions
function setupEvictions(ev) {
  const caption = document.getElementById("evictions-caption");
  ev.onRender = frame => {
    const g = ev.panels[0] && ev.panels[0].last;
    if (!g) return;
    const c = g.counters, n = g.note || {};
    let text;
    if (!c.num_preemptions) text = "No eviction yet: press play.";
    else {
      text = `So far ${plural(c.num_preemptions, "eviction")}. The engine has computed ` +
        `${plural(c.num_recomputed_tokens, "token")} a second time for conversations that came back` +
        (n.tokens_to_recompute ? `, and ${nf0.format(n.tokens_to_recompute)} more wait in the queue` : "") +
        `; meanwhile it generated ${plural(c.num_output_tokens, "answer token")}. That work is what an eviction ` +
        `costs: time. Nothing is lost: ${nf0.format(c.num_finished)} served so far, none failed.`;
    }
    setText(caption, text);
  };
}

// ---------------------------------------------------------------- 2. the story on the grid
// The grid opens on reserve-the-max; once that has been watched, the page asks for pages. Two finished runs are
// compared only when their settings are the same.
function setupStory(grid) {
  const story = document.getElementById("story");
  const steps = { max: story.querySelector('[data-step="max"]'), paged: story.querySelector('[data-step="paged"]') };
  const watched = new Set();
  const mark = () => {
    const allocator = grid.form.elements.allocator.value;
    steps.max.classList.toggle("done", watched.has("max"));
    steps.paged.classList.toggle("done", watched.has("paged"));
    steps.max.classList.toggle("current", allocator === "max" && !watched.has("max"));
    steps.paged.classList.toggle("current", watched.has("max") || allocator === "paged");
    const runs = Array.from(grid.runs.values());
    const max = runs.filter(r => r.allocator === "max").pop(), paged = runs.filter(r => r.allocator === "paged").pop();
    let out = story.querySelector(".compare");
    if (max && paged) {
      if (!out) { out = el("li", { class: "compare current", role: "status" }); story.append(out); }
      const a = max.summary, b = paged.summary;
      if (max.setupKey !== paged.setupKey) {
        out.dataset.compared = "";
        out.textContent = `Not compared: your reserve-the-max run (${a.name}) and your pages run (${b.name}) had ` +
          `different settings (${setupDifference(max.setup, paged.setup)}). Run both on the same settings to ` +
          "compare them.";
      } else {
        out.dataset.compared = "1";
        const time = a.makespan_s === b.makespan_s ? `both served everyone in ${nf0.format(a.makespan_s)} s (a tie)`
          : `everyone was served in ${nf0.format(a.makespan_s)} s against ${nf0.format(b.makespan_s)} s`;
        out.textContent = `On the same settings (${describeSetup(max.setup)}), time-averaged, ` +
          `${pct(a.memory_shares.token)} of the memory held tokens under reserve-the-max (${a.name}) against ` +
          `${pct(b.memory_shares.token)} with pages (${b.name}); ${time}.`;
      }
    }
  };
  grid.onPlay = () => { watched.add(grid.form.elements.allocator.value); mark(); };
  grid.onRunsChanged = mark;
  grid.onNewRun = mark;
  story.querySelector('[data-act="story-next"]').addEventListener("click", async () => {
    grid.form.elements.allocator.value = "paged";
    activePlayer = grid;
    await grid.reset();
    grid.play();
  });
  mark();
}

function setupShowMe(grid) {
  const form = grid.form;
  const d = catalog.defaults;
  const set = values => {
    for (const [k, v] of Object.entries(values)) form.elements[k].value = String(v);
    checkForm(form);
  };
  const presets = {
    q1: { allocator: "max", batching: "continuous", block_size: d.block_size, num_blocks: "auto", rate: d.rate },
    q2: { allocator: "paged", batching: "continuous", block_size: d.block_size, num_blocks: "auto", rate: d.rate },
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

// ---------------------------------------------------------------- the calculator and the bridge to vLLM
async function setupCalculator(grid) {
  const form = document.getElementById("calc-form");
  const modelSel = document.getElementById("calc-model"), gpuSel = document.getElementById("calc-gpu");
  for (const m of catalog.models) modelSel.append(el("option", { value: m.name, text: m.name }));
  for (const g of catalog.gpus) gpuSel.append(el("option", { value: g.name, text: g.name }));
  modelSel.value = catalog.defaults.model;
  gpuSel.value = catalog.defaults.gpu;
  const errorNode = document.getElementById("calc-error");
  const out = document.getElementById("calc-out");
  const section = document.getElementById("calculator");
  let serial = 0;
  // Three states: an answer (shown); a value typed out of range (refused here, nothing sent: the last answer
  // dimmed, data-state "stale"); a model, GPU or context the engine refuses (the last answer, another model's,
  // hidden: data-state "refused").
  const state = (name, err) => {
    showError(errorNode, err);
    section.classList.toggle("stale", name !== "ok");
    section.classList.toggle("refused", name === "refused");
    section.dataset.state = name;
  };
  const update = async () => {
    const mine = ++serial;
    const [values, msg] = checkForm(form);
    if (msg) { state("stale", new Error(msg)); return; }
    const q = new URLSearchParams(new FormData(form));
    try {
      const r = await api("api/size?" + q.toString());
      if (mine !== serial) return;
      state("ok", null);
      renderCalc(r, values.gpu_memory_utilization);
      out.hidden = false;
      fitMembarLabels();
    } catch (err) {
      if (mine !== serial) return;
      state(err instanceof Refusal ? "refused" : "stale", err);
    }
  };
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  const bridge = () => updateBridge(modelSel.value, gpuSel.value);
  modelSel.addEventListener("change", bridge);
  gpuSel.addEventListener("change", bridge);
  setupBridge(grid, modelSel, gpuSel);
  await Promise.all([update(), bridge()]);
}

function renderCalc(r, utilization) {
  const bar = document.getElementById("calc-bar");
  bar.innerHTML = "";
  // The paper's Figure 1: the GPU's memory by use, as `kvlab size` splits it.
  const split = r.memory_split;
  const total = split.gpu_memory_bytes;
  const parts = [["weights", split.weights_bytes, "weights"], ["kv", split.kv_cache_bytes, "KV cache"],
    ["other", split.other_bytes, "other"]];
  const said = [];
  for (const [cls, v, label] of parts) {
    if (v <= 0) continue;
    const share = 100 * v / total;
    said.push(`${label} ${nf0.format(share)}%`);
    bar.append(el("span", { class: cls, style: `width:${share}%`, title: `${label}: ${gib(v)} (${nf1.format(share)}%)`,
      "data-part": cls, "data-value": String(v), text: share >= 8 ? `${label} ${nf0.format(share)}%` : "" }));
  }
  bar.setAttribute("aria-label", "GPU memory: " + said.join(", "));
  fitMembarLabels();
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
  setText(document.getElementById("calc-paper"), paperSplitNote(r, utilization));
}

// Why the bar's shares are not the paper's Figure 1 (kvlab.paper.FIG1_PAPER): the paper divides by the GB on the
// label and leaves nothing unused; the bar divides by the GiB CUDA reports, with 1 - utilization left unused.
function paperSplitNote(r, utilization) {
  const f1 = catalog.paper.figure1, split = r.memory_split;
  const same = r.model === f1.model && r.gpu.toLowerCase() === f1.gpu;
  const label = nf0.format(f1.label_bytes / 1e9);
  let text = `Why not the vLLM paper's ${nf0.format(100 * f1.weights_share)}% weights and ` +
    `${nf0.format(100 * f1.kv_cache_share)}% KV cache (its Figure 1, ${f1.model} on ${f1.gpu})? The paper divides ` +
    `by the ${label} GB on the GPU's label (1 GB = 10⁹ bytes) and counts nothing as left unused. This bar divides ` +
    `by the ${gib(split.gpu_memory_bytes)} the GPU reports to CUDA (1 GiB = 2³⁰ bytes), and "other" includes the ` +
    `${nf0.format(100 * (1 - utilization))}% vLLM leaves unused at GPU memory utilization ${utilization}.`;
  if (same) {
    text += ` Against the ${label} GB label these weights are ${nf0.format(100 * split.weights_bytes / f1.label_bytes)}%.`;
  }
  return text;
}

// A segment's label is written inside it only where it fits whole (the legend and the tooltip say it anyway).
function fitMembarLabels() {
  for (const span of document.querySelectorAll("#calc-bar span")) {
    if (!span.dataset.label) span.dataset.label = span.textContent;
    span.textContent = span.dataset.label;
    if (span.scrollWidth > span.clientWidth) span.textContent = "";
  }
}
window.addEventListener("resize", fitMembarLabels);

let bridgeSize = null, bridgeSerial = 0;

// The model and GPU picked in the calculator, by kvlab's own sizing: the command, the lines vLLM prints, how to
// read them, and what drawing that pool changes in section 2.
async function updateBridge(model, gpu) {
  const errorNode = document.getElementById("bridge-error"), now = document.getElementById("bridge-now");
  const draw = document.querySelector('[data-act="bridge-draw"]');
  const mine = ++bridgeSerial;
  let r;
  try {
    r = await api("api/size?" + new URLSearchParams({ model, gpu }).toString());
  } catch (err) {
    if (mine !== bridgeSerial) return;
    // This section's own slot; what it showed is another model's, so it is dimmed and cannot be drawn.
    showError(errorNode, err);
    now.classList.add("stale-part");
    now.dataset.stale = "1";
    draw.disabled = true;
    bridgeSize = null;
    return;
  }
  if (mine !== bridgeSerial) return;
  showError(errorNode, null);
  now.classList.remove("stale-part");
  now.dataset.stale = "";
  draw.disabled = false;
  bridgeSize = r;
  const entry = catalog.models.find(m => m.name === r.model);
  for (const n of document.querySelectorAll('[data-field="bridge-gpu"]')) n.textContent = r.gpu;
  for (const n of document.querySelectorAll('[data-field="bridge-model"]')) n.textContent = r.model;
  setText(document.querySelector('[data-field="bridge-cmd"]'), `vllm serve ${(entry && entry.hf_repo) || r.model}`);
  const log = document.getElementById("bridge-log");
  log.innerHTML = "";
  for (const line of r.log_lines) {
    const key = /KV cache size|Maximum concurrency/.test(line);
    log.append(key ? el("mark", { text: line }) : document.createTextNode(line), "\n");
  }
  const reading = document.getElementById("bridge-reading");
  reading.innerHTML = "";
  reading.append(
    el("li", { text: `"GPU KV cache size: ${nf0.format(r.num_tokens)} tokens" is the pool: every conversation's ` +
      "tokens together must fit in it." }),
    el("li", { "data-field": "bridge-blocks", "data-value": String(r.num_blocks),
      text: `blocks = tokens / ${r.block_size} = ${nf0.format(r.num_tokens)} / ${r.block_size} = ` +
        `${nf0.format(r.num_blocks)} blocks: the squares of the grid.` }),
    el("li", { text: `"Maximum concurrency for ${nf0.format(r.max_model_len)} tokens per request: ` +
      `${nf2.format(r.max_concurrency)}x" is how many conversations of the full context fit at once: ` +
      `${nf0.format(r.num_blocks)} blocks / ${nf0.format(r.max_model_len / r.block_size)} blocks each. With pages, ` +
      "shorter conversations fit many more." }),
  );
  setText(document.getElementById("bridge-scale"), `This sets section 2 to ${r.model} on ${r.gpu} with the whole KV ` +
    `cache vLLM would have there (${blocks(r.num_blocks)}), memory in pages; its requests and batching stay as they are.`);
}

function setupBridge(grid, modelSel, gpuSel) {
  document.querySelector('[data-act="bridge-draw"]').addEventListener("click", async () => {
    const form = grid.form;
    form.elements.model.value = modelSel.value;
    form.elements.gpu.value = gpuSel.value;
    form.elements.num_blocks.value = "auto";
    form.elements.allocator.value = "paged";
    activePlayer = grid;
    await grid.reset();
    const m = grid.meta, v = grid.views[0];
    if (m && v) {
      const k = v.layout.k * (m.display_scale || 1);
      setText(document.getElementById("bridge-scale"), `Section 2 now draws ${m.model} on ${m.gpu}: ` +
        `${nf0.format(m.num_gpu_blocks)} blocks, one square = ${nf0.format(k)} blocks (the page picks the scale ` +
        "so the pool fits the screen).");
    }
    document.getElementById("grid").scrollIntoView({ behavior: "instant", block: "start" });
  });
  document.querySelector('[data-act="explain-log"]').addEventListener("click", explainLog);
}

async function explainLog() {
  const input = document.getElementById("vllm-log-input");
  const errorNode = document.getElementById("vllm-log-error"), out = document.getElementById("vllm-log-out");
  const text = input.value;
  const max = catalog.limits.max_log_chars;
  if (!text.trim()) { showError(errorNode, new Error("paste a vLLM startup log first (the lines vllm serve prints)")); return; }
  if (text.length > max) {
    showError(errorNode, new Error(`that is ${nf0.format(text.length)} characters; paste at most ${nf0.format(max)} (the startup part is enough)`));
    return;
  }
  const model = document.getElementById("vllm-log-model").value;
  out.classList.add("stale");
  try {
    const r = await api("api/vllm-log", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(model ? { text, model } : { text }) });
    showError(errorNode, null);
    renderExplained(out, r);
  } catch (err) {
    showError(errorNode, err);
    out.hidden = true;
  } finally {
    out.classList.remove("stale");
  }
}

function renderExplained(out, r) {
  const log = r.log, dl = el("dl", {});
  const add = (key, label, value) => {
    if (value === null || value === undefined) return;
    dl.append(el("dt", { text: label }), el("dd", { "data-key": key, "data-value": String(value),
      text: typeof value === "number" ? nf0.format(value) : String(value) }));
  };
  add("kv_cache_tokens", "KV cache size (tokens)", log.kv_cache_tokens);
  if (log.block_size) add("num_gpu_blocks", `blocks of ${log.block_size} tokens`, log.num_gpu_blocks);
  else add("num_gpu_blocks", "blocks (the log names no block size)", log.num_gpu_blocks);
  if (log.max_concurrency !== null && log.max_concurrency !== undefined) {
    dl.append(el("dt", { text: `maximum concurrency at ${nf0.format(log.max_concurrency_tokens_per_request || 0)} tokens` }),
      el("dd", { "data-key": "max_concurrency", "data-value": String(log.max_concurrency), text: nf2.format(log.max_concurrency) + "x" }));
  }
  out.innerHTML = "";
  out.append(dl, el("ul", {}, ...r.explain.lines.map(line => el("li", { text: line }))));
  if (r.explain.differences && r.explain.differences.length) {
    out.append(el("p", { text: "Where kvlab's calculation differs:" }),
      el("ul", {}, ...r.explain.differences.map(line => el("li", { text: line }))));
  }
  out.hidden = false;
}

// ---------------------------------------------------------------- 7. where each strategy breaks as the rate grows
// The vLLM paper's Figure 12 on the lab's setup. Every point drawn is a run of the engine (kvlab.web.rates): the
// breaking points are `kvlab capacity`'s search, its probes the curves' first points; a rate the reader picks is
// run for every system and joins the curves. Between computed points the curve is a straight line, and a readout
// read off it says so ("≈"); the table under the chart holds the engine's own numbers for the picked rate.
const SWEEP_MS = 6000; // one sweep of the rate across the chart
const CURVE_RATES = 8; // rates evenly over the chart, run for every system besides the searches' probes
const Y_OVER_SLO = 10; // the latency axis runs to ten times the target (the paper's axis: about 1 s per token)

class RateFigure {
  constructor(section, players) {
    this.section = section;
    this.players = players;
    this.canvas = section.querySelector("canvas");
    this.range = section.querySelector("#rate-range");
    this.input = section.querySelector("#rate-input");
    this.errorNode = section.querySelector("#rates-error");
    this.table = section.querySelector("#rates-at");
    this.verdictNode = section.querySelector("#rates-verdict");
    this.found = null; // the breaking points (GET api/rates)
    this.exact = new Map(); // rate -> the engine's numbers at that rate (GET api/rates/at)
    this.cursor = null; // the rate under the cursor (swept, dragged or picked)
    this.picked = null;
    this.sweeping = null;
    this.frames = 0; // frames drawn while sweeping (benchmarks/bench_web_fps.py)
    section.querySelector('[data-act="sweep"]').addEventListener("click", () => this.sweep());
    document.querySelector('#hero-rate [data-act="lesson-rate"]').addEventListener("click",
      () => this.pick(this.found.lesson_rate, "lesson"));
    this.range.addEventListener("input", () => { this.stopSweep(); this.cursor = Number(this.range.value); this.draw(); });
    this.range.addEventListener("change", () => this.pick(Number(this.range.value), "range"));
    this.input.addEventListener("change", () => this.typed());
    new ResizeObserver(() => this.draw()).observe(this.canvas);
  }

  setup() {
    const d = catalog.defaults;
    return { model: d.model, gpu: d.gpu, workload: d.workload, num_requests: d.num_requests, seed: d.seed,
      block_size: d.block_size };
  }

  async load() {
    this.section.classList.add("busy");
    this.section.dataset.busy = "1";
    try {
      this.found = await api("api/rates?" + new URLSearchParams(this.setup()).toString());
    } catch (err) {
      showError(this.errorNode, err);
      return;
    } finally {
      this.section.classList.remove("busy");
      this.section.dataset.busy = "";
    }
    const f = this.found, s = f.setup;
    this.range.max = String(f.axis_rps);
    this.range.step = String(f.axis_rps / 400);
    this.input.dataset.max = String(f.axis_rps);
    setText(this.section.querySelector('[data-field="slo"]'), `${nf2.format(f.slo_s)} s per token`);
    setText(this.section.querySelector('[data-field="rates-setup"]'), `${s.model} on ${s.gpu.toUpperCase()}, ` +
      `${nf0.format(s.num_requests)} requests of ${s.workload} arriving at random (Poisson) at each rate, ` +
      `cost profile ${s.cost}; the same as kvlab capacity --strategy ${f.systems.map(x => x.name).join(",")} ` +
      `--model ${s.model} --gpu ${s.gpu} --workload ${s.workload} -n ${s.num_requests} --seed ${s.seed} ` +
      `--block-size ${s.block_size} --cost ${s.cost}`);
    const legend = this.section.querySelector(".chart-legend");
    legend.innerHTML = "";
    f.systems.forEach((x, i) => legend.append(el("span", { "data-system": x.name },
      el("i", { style: `border-top-color:${LANE_COLOURS[i % 4]};border-top-style:${i % 4 ? "dashed" : "solid"}` }),
      `${x.paper_name} (${FRIENDLY[x.allocator]}): breaks at ${rateText(x)} req/s`)));
    const marks = this.section.querySelector("figcaption");
    setText(marks, "Each line is one system's normalized latency; the dot and the dashed line mark its breaking point, " +
      `the highest rate at which its run kept up and stayed under ${nf2.format(f.slo_s)} s per token. ` +
      `Above ${nf1.format(Y_OVER_SLO * f.slo_s)} s per token a line runs along the top.`);
    this.section.dataset.ready = "1";
    await this.pick(Number(this.players.hero.fixed.rate), "hero");
    await this.fillCurves();
  }

  // The searches' probes crowd around each breaking point; CURVE_RATES more rates, evenly over the chart (as the
  // paper's Figure 12 samples its axis), give each curve its whole course. One at a time, each drawn as it comes.
  async fillCurves() {
    const axis = this.found.axis_rps;
    for (let k = 1; k <= CURVE_RATES; k++) {
      const rate = Number((axis * k / CURVE_RATES).toPrecision(4));
      if (this.exact.has(rate)) continue;
      try {
        this.exact.set(rate, await api("api/rates/at?" + new URLSearchParams({ ...this.setup(), rate }).toString()));
      } catch (err) {
        showError(this.errorNode, err);
        return;
      }
      if (!this.sweeping) this.draw();
    }
    this.section.dataset.curves = "1";
  }

  // Each system's computed points: its search's probes and every rate picked since, in rate order.
  points(i) {
    const x = this.found.systems[i];
    const pts = x.points.map(p => [p.rate, p.value]);
    for (const [rate, at] of this.exact) pts.push([rate, at.systems[i].value]);
    return pts.sort((a, b) => a[0] - b[0]);
  }

  // The curve's value at ``rate``, on the straight line between the computed points either side (null outside).
  onCurve(i, rate) {
    const pts = this.points(i);
    for (let j = 1; j < pts.length; j++) {
      const [r0, v0] = pts[j - 1], [r1, v1] = pts[j];
      if (rate >= r0 && rate <= r1) return r1 === r0 ? v0 : v0 + (v1 - v0) * (rate - r0) / (r1 - r0);
    }
    return pts.length && rate === pts[0][0] ? pts[0][1] : null;
  }

  draw() {
    if (!this.found) return;
    const canvas = this.canvas, w = Math.max(200, Math.floor(canvas.clientWidth || 600)), h = 260;
    if (canvas.width !== w) canvas.width = w;
    if (canvas.height !== h) canvas.height = h;
    const ctx = canvas.getContext("2d"), f = this.found;
    const yMax = Y_OVER_SLO * f.slo_s, axis = f.axis_rps;
    const left = 46, right = w - 10, top = 10, bottom = h - 30;
    const X = r => left + (right - left) * r / axis, Y = v => bottom - (bottom - top) * Math.min(v, yMax) / yMax;
    const upTo = this.sweeping ? this.cursor : axis;
    ctx.clearRect(0, 0, w, h);
    ctx.strokeStyle = "#d0d0d0"; ctx.lineWidth = 1; ctx.fillStyle = "#5f6368"; ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(left, top); ctx.lineTo(left, bottom); ctx.lineTo(right, bottom); ctx.stroke();
    ctx.fillText(`${nf1.format(yMax)} s`, 4, top + 8); ctx.fillText("0", 34, bottom);
    ctx.fillText(`${nf2.format(yMax / 2)} s`, 4, Y(yMax / 2) + 4);
    ctx.fillText("s per token", 4, top + 22);
    for (let k = 1; k <= 4; k++) ctx.fillText(nf2.format(axis * k / 4), X(axis * k / 4) - 24, h - 16);
    ctx.fillText("requests per second", left + 4, h - 3);
    // The target, across the chart.
    ctx.strokeStyle = "#b00020"; ctx.setLineDash([2, 3]);
    ctx.beginPath(); ctx.moveTo(left, Y(f.slo_s)); ctx.lineTo(right, Y(f.slo_s)); ctx.stroke(); ctx.setLineDash([]);
    ctx.fillStyle = "#b00020"; ctx.fillText(`target ${nf2.format(f.slo_s)} s`, right - 86, Y(f.slo_s) - 4);
    ctx.save();
    ctx.beginPath(); ctx.rect(0, 0, X(upTo) + 1, h); ctx.clip();
    f.systems.forEach((x, i) => {
      const colour = LANE_COLOURS[i % 4];
      ctx.strokeStyle = colour; ctx.lineWidth = 2.5; ctx.setLineDash(LANE_DASHES[i % 4]);
      ctx.beginPath();
      this.points(i).forEach(([r, v], j) => { if (j === 0) ctx.moveTo(X(r), Y(v)); else ctx.lineTo(X(r), Y(v)); });
      ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = colour;
      for (const [r, v] of this.points(i)) { ctx.fillRect(X(r) - 1.5, Y(v) - 1.5, 3, 3); }
    });
    ctx.restore();
    // The breaking points, marked and named once the sweep has passed them.
    f.systems.forEach((x, i) => {
      if (x.capacity_rps > upTo) return;
      const colour = LANE_COLOURS[i % 4], cx = X(x.capacity_rps), cy = Y(this.onCurve(i, x.capacity_rps) || 0);
      ctx.strokeStyle = colour; ctx.lineWidth = 1; ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(cx, cy); ctx.lineTo(cx, bottom); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = colour; ctx.beginPath(); ctx.arc(cx, cy, 5, 0, 7); ctx.fill();
      ctx.font = "bold 11px system-ui, sans-serif";
      ctx.fillText(`${x.paper_name} ${rateText(x)}`, Math.min(cx + 6, right - 110), top + 12 + 13 * i);
      ctx.font = "11px system-ui, sans-serif";
    });
    if (this.cursor !== null) {
      ctx.strokeStyle = "#1d1d1f"; ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.moveTo(X(this.cursor), top); ctx.lineTo(X(this.cursor), bottom); ctx.stroke();
    }
    if (this.sweeping) this.frames++;
  }

  // The rate sweeps across the chart on its own; the curves are drawn up to it, each breaking point named as it
  // is passed. It ends on the rate picked before.
  sweep() {
    if (!this.found) return;
    if (this.sweeping) { this.stopSweep(); return; }
    const start = performance.now();
    this.sweeping = { start };
    this.section.dataset.sweeping = "1";
    setText(this.section.querySelector('[data-act="sweep"]'), "❚❚ stop");
    const tick = now => {
      if (!this.sweeping || this.sweeping.start !== start) return;
      const u = Math.min(1, (now - start) / SWEEP_MS);
      this.cursor = u * this.found.axis_rps;
      this.range.value = String(this.cursor);
      this.draw();
      this.readout(this.cursor, null);
      if (u < 1) requestAnimationFrame(tick);
      else this.stopSweep();
    };
    requestAnimationFrame(tick);
  }

  stopSweep() {
    if (!this.sweeping) return;
    this.sweeping = null;
    this.section.dataset.sweeping = "";
    setText(this.section.querySelector('[data-act="sweep"]'), "▶ sweep the rate");
    this.cursor = this.picked;
    if (this.picked !== null) this.range.value = String(this.picked);
    this.draw();
    if (this.picked !== null) this.readout(this.picked, this.exact.get(this.picked));
  }

  typed() {
    const [v, msg] = checkField(this.input);
    this.input.classList.toggle("invalid", !!msg);
    this.input.setAttribute("aria-invalid", msg ? "true" : "false");
    if (msg) {
      const past = v === null && Number(this.input.value) > this.found.axis_rps && Number(this.input.value) <= 100;
      showError(this.errorNode, new Error(past ? msg + ` (the chart: past ${nf2.format(this.found.axis_rps)} ` +
        "req/s every system is overloaded, and the page keeps its runs within the chart)" : msg));
      this.section.dataset.state = "refused";
      return;
    }
    this.pick(v, "input");
  }

  // Run every system at ``rate`` (the engine, once per rate), show its numbers, and have the figures above follow.
  async pick(rate, from) {
    this.stopSweep();
    this.picked = rate;
    this.cursor = rate;
    this.range.value = String(rate);
    if (from !== "input") this.input.value = String(rate);
    showError(this.errorNode, null);
    this.section.dataset.state = "busy";
    try {
      if (!this.exact.has(rate)) {
        const at = await api("api/rates/at?" + new URLSearchParams({ ...this.setup(), rate }).toString());
        this.exact.set(rate, at);
      }
    } catch (err) {
      showError(this.errorNode, err);
      this.section.dataset.state = "refused";
      return;
    }
    if (this.picked !== rate) return;
    this.section.dataset.state = "ok";
    setData(this.section, "rate", rate);
    this.draw();
    if (from !== "hero") this.follow(rate, from);
    this.readout(rate, this.exact.get(rate));
    if (this.onPicked) this.onPicked(rate);
  }

  // The figures above run at the picked rate: the first figure again (to its headline's moment), and the grid's
  // and the race's settings (their next run).
  follow(rate, from) {
    const { hero, grid, race } = this.players;
    this.followed = rate;
    hero.fixed.rate = rate;
    activePlayer = hero;
    // Asked from the first screen, the figure plays again to its headline; from here below, it goes straight there.
    if (from === "lesson") { hero.autoplay = true; hero.reset(); } else hero.reset().then(() => hero.seek(HERO_HOLD));
    for (const p of [grid, race]) {
      p.form.elements.rate.value = String(rate);
      p.controlsChanged();
    }
  }

  // The table under the chart: the engine's numbers at the picked rate; while sweeping or dragging, the curve's.
  readout(rate, at) {
    const f = this.found;
    this.table.innerHTML = "";
    this.table.append(el("tr", { class: "head" }, el("th", { text: "system" }), el("th", { text: "memory" }),
      el("th", { text: `normalized latency at ${nf2.format(rate)} req/s` }), el("th", { text: "breaks at" }),
      el("th", { text: "at this rate" })));
    const broken = [], holding = [];
    f.systems.forEach((x, i) => {
      const exact = at && at.systems[i];
      const v = exact ? exact.value : this.onCurve(i, rate);
      const holds = exact ? exact.held : rate <= x.capacity_rps;
      (holds ? holding : broken).push(x);
      this.table.append(el("tr", { "data-system": x.name },
        el("td", { text: x.paper_name, "data-label": "system" }),
        el("td", { text: FRIENDLY[x.allocator], "data-label": "memory" }),
        el("td", { "data-label": "normalized latency", "data-key": "value", "data-value": exact ? String(v) : "",
          text: v === null ? "–" : `${exact ? "" : "≈ "}${nf2.format(v)} s per token` }),
        el("td", { "data-label": "breaks at", "data-key": "capacity", "data-value": String(x.capacity_rps),
          text: `${rateText(x)} req/s` }),
        el("td", { "data-label": "at this rate", "data-key": "held", "data-value": holds ? "1" : "",
          text: holds ? "keeps up" : (exact && exact.reason ? `broken: ${exact.reason}` : "broken") })));
    });
    const names = xs => xs.map(x => x.paper_name).join(", ");
    let text;
    if (!broken.length) text = `At ${nf2.format(rate)} req/s every system keeps up.`;
    else if (!holding.length) {
      text = `At ${nf2.format(rate)} req/s requests arrive faster than any of them serves them: past every ` +
        `breaking point (${f.systems.map(x => `${x.paper_name} sustains ${rateText(x)}`).join(", ")}).`;
    } else {
      text = `At ${nf2.format(rate)} req/s ${names(holding)} ${holding.length > 1 ? "keep" : "keeps"} up; ` +
        `${names(broken)} ${broken.length > 1 ? "are" : "is"} past ${broken.length > 1 ? "their" : "its"} breaking ` +
        "point.";
    }
    if (at && this.followed === rate) text += " The first figure above now runs at this rate.";
    setText(this.verdictNode, text);
  }
}

// A breaking point as `kvlab capacity` prints it (kvlab.sweep.capacity.rate_text: rounded down; ≥ a lower bound).
function rateText(x) { return x.capacity_text; }

// ---------------------------------------------------------------- boot
const tooltip = document.getElementById("tooltip");
const announce = document.getElementById("announce") || el("div");
let activePlayer = null;
let catalog = null;

document.addEventListener("keydown", e => {
  if (!activePlayer || e.altKey || e.ctrlKey || e.metaKey || e.defaultPrevented) return;
  if (e.target.closest && e.target.closest("input, select, textarea, button, summary")) return;
  if (e.key === " ") { e.preventDefault(); activePlayer.toggle(); }
  else if (e.key === "ArrowRight" && !(e.target.matches && e.target.matches("canvas"))) { e.preventDefault(); activePlayer.step(); }
});

async function readLog(node) {
  // The export embeds the frame log gzip-compressed and base64-encoded; the browser's own DecompressionStream
  // unpacks it, so the page needs nothing from the network.
  const bytes = base64Bytes(node.textContent.trim());
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

function fillForms() {
  const d = catalog.defaults;
  const fill = (sel, items, value, title) => {
    for (const node of document.querySelectorAll(sel)) {
      for (const it of items) node.append(el("option", { value: it.name, text: it.name, title: title ? title(it) : "" }));
      node.value = value;
    }
  };
  fill(".model-select", catalog.models, d.model);
  fill(".gpu-select", catalog.gpus, d.gpu);
  fill(".workload-select", catalog.workloads, d.workload, w => w.description || "");
  fill("#vllm-log-model", catalog.models, "");
  for (const form of document.querySelectorAll("#grid-form, #race-form")) {
    form.elements.rate.value = String(d.rate);
    form.elements.num_requests.value = String(d.num_requests);
    form.elements.seed.value = String(d.seed);
    form.elements.block_size.value = String(d.block_size);
  }
  const [batching, allocator] = d.story[0].split("+");
  document.querySelector(`#grid-form [name="allocator"][value="${allocator}"]`).checked = true;
  document.querySelector(`#grid-form [name="batching"][value="${batching}"]`).checked = true;
  // The race: the lesson's four strategies in view, the others under "more".
  const box = document.getElementById("race-strategies");
  const more = el("details", { class: "more inline" }, el("summary", { text: "more strategies" }));
  for (const s of catalog.strategies) {
    const input = el("input", { type: "checkbox", name: "strategy", value: s.name });
    input.checked = d.race.includes(s.name);
    (d.race.includes(s.name) ? box : more).append(el("label", { title: s.description }, input, el("span", { text: s.name })));
  }
  box.append(more);
}

async function boot() {
  window.kvlab = { stats, facts, palette: PALETTE.map(hex), paletteRgb: PALETTE, pale: PALE, ink: INK,
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
  buildLegend(document.getElementById("hero-legend"), true);
  buildLegend(document.getElementById("grid-legend"));
  catalog = await api("api/catalog");
  window.kvlab.catalog = catalog;
  fillForms();
  const d = catalog.defaults;
  const story = { kind: "race", strategies: d.story, model: d.model, gpu: d.gpu, workload: d.workload, rate: d.rate,
    num_requests: d.num_requests, seed: d.seed, block_size: d.block_size };
  const hero = new LivePlayer(document.getElementById("hero"), "hero", null, story);
  const one = new LivePlayer(document.getElementById("one"), "one", null,
    { ...story, num_requests: 1, num_blocks: 144, seed: ONE_SEED });
  const grid = new LivePlayer(document.getElementById("grid"), "grid", document.getElementById("grid-form"));
  const evictions = new LivePlayer(document.getElementById("evictions"), "evictions", null,
    { kind: "grid", strategies: [d.story[1]], model: d.model, gpu: d.gpu, workload: d.workload, rate: 10,
      num_requests: 200, seed: d.seed, block_size: d.block_size, num_blocks: 256 });
  const race = new LivePlayer(document.getElementById("race"), "race", document.getElementById("race-form"));
  window.kvlab.players = { hero, one, grid, evictions, race };
  activePlayer = hero;
  setupHero(hero);
  // The figure leads: it plays on arrival (or, for a reader who asked for less motion, shows the moment it
  // would stop at).
  const still = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  hero.autoplay = !still;
  const heroReady = hero.reset().then(() => (still ? hero.seek(HERO_HOLD) : null));
  setupOne(one);
  window.kvlab.table = new TableFigure(document.getElementById("table-figure"), hero);
  window.kvlab.batching = new BatchChart(document.getElementById("batching-chart"), hero);
  setupEvictions(evictions);
  setupStory(grid);
  setupQuiz();
  setupShowMe(grid);
  race.onRender = () => setText(document.querySelector('[data-field="race-setup"]'),
    race.meta ? `Every lane: ${describeSetup(race.meta.setup)}.` : "");
  const rates = new RateFigure(document.getElementById("rates"), { hero, grid, race });
  window.kvlab.rates = rates;
  await heroReady;
  await Promise.all([setupCalculator(grid), one.reset(), grid.reset(), evictions.reset(), race.reset()]);
  document.body.dataset.ready = "1";
  // The breaking points take the engine a while (a capacity search per system): the page is ready before them.
  rates.onPicked = () => heroRateNote(hero, rates);
  rates.load();
}

boot().catch(err => {
  const node = document.querySelector(".error");
  showError(node, err);
  document.body.dataset.ready = "error";
});

})();
