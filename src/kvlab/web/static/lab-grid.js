/* A grid of KV blocks on a canvas (GridView), its legends and the share bar. A part of lab.js: kvlab.web.bundle
 * joins the parts, in order, into one script, so every name here is shared with the other parts. */

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
// reserve (Orca's three) against vLLM's (the one system that does not, whatever kvlab names it).
function paperShares(fig2) {
  const reserve = Object.keys(fig2).filter(k => k.startsWith("orca")).map(k => fig2[k].token);
  return `The vLLM paper, time-averaged: ${nf1.format(Math.min(...reserve))}–${pct(Math.max(...reserve))} for systems ` +
    `that reserve (Orca), ${pct(paperPages(fig2).token)} for vLLM's pages.`;
}

function paperPages(fig2) {
  return fig2[Object.keys(fig2).find(k => !k.startsWith("orca"))];
}
