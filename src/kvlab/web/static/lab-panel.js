/* A player's panels: what each figure shows, a panel per strategy built and written from a frame (the big
 * numbers, the memory bar, the seats, the note, the counters), and its grid's pointer and keyboard, as methods
 * of Player (lab-player.js). A part of lab.js: kvlab.web.bundle joins the parts, in order, into one script, so every name here is
 * shared with the other parts. */

// ---------------------------------------------------------------- a player's panels
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

Object.assign(Player.prototype, {
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
  },

  caption(p) {
    const m = this.meta, L = p.view.layout, k = L.k * (m.display_scale || 1);
    p.scale.textContent = `${nf0.format(m.num_gpu_blocks || m.num_blocks)} blocks of ${m.kv_block_size || m.block_size} ` +
      `tokens (${nf0.format(m.num_slots)} token slots) · ` + (k > 1 ? `display scale: one square = ${nf0.format(k)} blocks`
      : "one square = one block");
    p.view.canvas.setAttribute("aria-label", `KV cache of ${p.info.name}: ${p.scale.textContent}. ` +
      "Arrow keys move between squares; each is described below the grid.");
  },

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
  },

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
  },

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
  },

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
  },

  placeGap(p, gap) {
    const view = p.view;
    if (String(gap) !== String(view.gap)) { view.gap = gap; view.overlayDirty = true; }
  },

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
    if (n.rejected) {  // (when the run is over too: it may have ended with every conversation turned away)
      text += ` ${plural(n.rejected.count, "conversation")} turned away on arrival, never to run: ` +
        `${n.rejected.reason} (${blocks(this.meta.num_gpu_blocks)} of ${plural(this.meta.kv_block_size, "slot")} in this cache).`;
    }
    if (evicted) {
      text += ` Evicted since the last frame: ${evicted.slice(0, 3).map(([id, t]) => `conversation ${id}` +
        (t ? ` (${plural(t, "token")} to compute again)` : "")).join(", ")}` +
        `${evicted.length > 3 ? ` and ${nf0.format(evicted.length - 3)} more` : ""}.`;
    }
    p.note.classList.toggle("waits", waits && h && h.waits === "memory");
    setText(p.note, text.trim());
    setData(p.panel, "note", text.trim());
  },

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
    setText(p.seatsLabel, (p.peak > 0 ? `seats: ${nf0.format(running)} running of ${nf0.format(p.peak)} (the most at ` +
      "once so far)" : "seats: none taken yet") + ` · queue: ${nf0.format(waiting)} waiting`);
    setData(p.seats, "running", running);
    setData(p.seats, "waiting", waiting);
  },

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
  },
});
