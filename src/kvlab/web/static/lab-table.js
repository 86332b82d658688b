/* Section 3: the block table of a picked conversation. A part of lab.js: kvlab.web.bundle joins the parts, in
 * order, into one script, so every name here is shared with the other parts. */

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
      const scattered = this.mostScattered();
      if (scattered >= 0 && scattered !== this.id) { this.pick(scattered); return; }
    }
    this.draw();
  }

  // The conversation whose pages lie in the most separate pieces of the pool now (the most pages on a tie): its
  // table shows the scatter best. (The largest conversation is often one that arrived into an empty pool, whose
  // pages happen to lie in a row, which is the one thing the section says pages need not do.)
  mostScattered() {
    const pieces = new Map(), pages = new Map(), owner = this.source().owner;
    for (let b = 0; b < owner.length; b++) {
      const id = owner[b];
      if (id < 0) continue;
      pages.set(id, (pages.get(id) || 0) + 1);
      if (b === 0 || owner[b - 1] !== id) pieces.set(id, (pieces.get(id) || 0) + 1);
    }
    let best = -1, key = [0, 0];
    for (const [id, n] of pieces) {
      const k = [n, pages.get(id)];
      if (k[0] > key[0] || (k[0] === key[0] && k[1] > key[1])) { best = id; key = k; }
    }
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
    const bs = this.hero.meta.kv_block_size, k = this.hero.meta.display_scale;
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
