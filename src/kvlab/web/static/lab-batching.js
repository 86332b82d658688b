/* Section 4: iteration time and tokens per second against batch size. A part of lab.js: kvlab.web.bundle joins the
 * parts, in order, into one script, so every name here is shared with the other parts. */

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
