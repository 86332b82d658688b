/* The shared player: a run's frames applied and its text written from them, and its transport (play, pause,
 * step), for a run live from the server (lab-live.js) or replayed (lab-replay.js). Its panels are lab-panel.js,
 * its finish line lab-finish.js, the words about a run lab-words.js. A part of lab.js: kvlab.web.bundle joins the parts, in order, into one script, so every name here is
 * shared with the other parts. */

// ---------------------------------------------------------------- a player: frames, text, transport
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
