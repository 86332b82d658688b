/* A player's finish line: requests finished over time, and the table at the end, as methods of Player
 * (lab-player.js). A part of lab.js: kvlab.web.bundle joins the parts, in order, into one script, so every name here is
 * shared with the other parts. */

// ---------------------------------------------------------------- the finish line
Object.assign(Player.prototype, {
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
  },

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
      "divided by its answer's tokens (the vLLM paper's measure); p50: the median over requests, as kvlab race " +
      "prints it." }));
    node.hidden = false;
    this.panels.forEach(p => p.panel.classList.toggle("winner", many && p.info.name === finish.winner));
  },
});
