/* Section 7: where each strategy breaks as the rate grows (the paper's Figure 12). A part of lab.js:
 * kvlab.web.bundle joins the parts, in order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- 7. where each strategy breaks as the rate grows
// The vLLM paper's Figure 12 on the lab's setup. Every point drawn is a run of the engine (kvlab.web.rates): the
// breaking points are `kvlab capacity`'s search, its probes the curves' first points; a rate the reader picks is
// run for every system and joins the curves. Between computed points the curve is a straight line, and a readout
// read off it says so ("≈"); the table under the chart holds the engine's own numbers for the picked rate.
const SWEEP_MS = 6000; // one sweep of the rate across the chart
const CURVE_RATES = 8; // rates evenly over the chart, run for every system besides the searches' probes
const Y_OVER_SLO = 10;
// A system's memory in the legend, after its paper name ("Orca (Max), reserve the max"; "vLLM, pages"): the paper
// names carry their own brackets.
const MEMORY_WORDS = { max: "reserve the max", paged: "pages", pow2: "power of two", oracle: "oracle" }; // the latency axis runs to ten times the target (the paper's axis: about 1 s per token)

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
    this.frames = 0; // frames drawn while sweeping, and the time they took (benchmarks/bench_web_fps.py)
    this.drawMs = 0;
    section.querySelector('[data-act="sweep"]').addEventListener("click", () => this.sweep());
    document.querySelector('#hero-rate [data-act="lesson-rate"]').addEventListener("click",
      () => this.pick(this.found.lesson_rate, "lesson"));
    this.range.addEventListener("input", () => { this.stopSweep(); this.cursor = Number(this.range.value); this.draw(); });
    this.range.addEventListener("change", () => this.pick(Number(this.range.value), "range"));
    this.input.addEventListener("change", () => this.typed());
    // One range for the rate, the server's (params.LIMITS' least rate, the chart's end): the slider cannot go below
    // it, and the box states it as the server does.
    this.range.min = this.input.dataset.min = String(catalog.limits.min_rate);
    new ResizeObserver(() => this.draw()).observe(this.canvas);
  }

  setup() {
    const d = catalog.defaults;
    return { model: d.model, gpu: d.gpu, workload: d.workload, num_requests: d.num_requests, seed: d.seed,
      block_size: d.block_size };
  }

  // The breaking points of the two systems the first screen waits for (asked once, before section 7's): the
  // first figure's opening rate and section 5's are read from them. The server keeps each system's search, so
  // section 7's request (fetch) later searches only the other two, and finds these two's the same.
  opening() {
    if (!this.openingAsked) {
      const systems = catalog.rate_systems.opening.join(",");
      this.openingAsked = api("api/rates?" + new URLSearchParams({ ...this.setup(), systems }).toString());
    }
    return this.openingAsked;
  }

  // Every system's breaking points (asked once): section 7's chart.
  fetch() {
    if (!this.asked) {
      this.section.classList.add("busy");
      this.section.dataset.busy = "1";
      this.asked = api("api/rates?" + new URLSearchParams(this.setup()).toString()).finally(() => {
        this.section.classList.remove("busy");
        this.section.dataset.busy = "";
      });
    }
    return this.asked;
  }

  async load() {
    if (this.loaded) return;
    this.loaded = true;
    try {
      this.found = await this.fetch();
    } catch (err) {
      showError(this.errorNode, err);
      return;
    }
    const f = this.found, s = f.setup;
    this.range.max = String(f.axis_rps);
    this.range.step = String(f.axis_rps / 400);
    this.input.dataset.max = String(f.axis_rps);
    setText(this.section.querySelector('[data-field="slo"]'), `${nf2.format(f.slo_s)} s per token`);
    setText(this.section.querySelector('[data-field="rates-setup"]'), `Every run: ${s.model} on ${s.gpu.toUpperCase()}, ` +
      `${nf0.format(s.num_requests)} requests of ${s.workload} arriving at random (Poisson) at each rate, ` +
      `cost profile ${s.cost}. The breaking points are those of kvlab capacity --strategy ` +
      `${f.systems.map(x => x.name).join(",")} ` +
      `--model ${s.model} --gpu ${s.gpu} --workload ${s.workload} -n ${s.num_requests} --seed ${s.seed} ` +
      `--block-size ${s.block_size} --cost ${s.cost}: ${f.samples_note}.` +
      f.systems.filter(x => x.uncertified_reason).map(x => ` ${x.paper_name}: ${uncertainText(x)}.`).join(""));
    const legend = this.section.querySelector(".chart-legend");
    legend.innerHTML = "";
    f.systems.forEach((x, i) => legend.append(el("span", { "data-system": x.name },
      el("i", { style: `border-top-color:${LANE_COLOURS[i % 4]};border-top-style:${i % 4 ? "dashed" : "solid"}` }),
      `${x.paper_name}, ${MEMORY_WORDS[x.allocator]}: breaks at ${rateText(x)} req/s`)));
    const marks = this.section.querySelector("figcaption");
    setText(marks, "Each line is one system's normalized latency; the dot and the dashed line mark its breaking point, " +
      `the highest rate at which its run kept up and stayed under ${nf2.format(f.slo_s)} s per token. ` +
      `Above ${nf1.format(Y_OVER_SLO * f.slo_s)} s per token a line runs along the top.`);
    this.section.dataset.ready = "1";
    // A rate typed while the search ran (or before the page had set this section up) wins over the opening rate.
    if (this.typedEarly || this.input.value.trim() !== "") this.typed();
    else await this.pick(Number(this.players.hero.fixed.rate), "hero");
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
    const t0 = performance.now();
    const canvas = this.canvas, w = Math.max(200, Math.floor(canvas.clientWidth || 600)), h = 272;
    if (canvas.width !== w) canvas.width = w;
    if (canvas.height !== h) canvas.height = h;
    const ctx = canvas.getContext("2d"), f = this.found;
    const yMax = Y_OVER_SLO * f.slo_s, axis = f.axis_rps;
    const left = 46, right = w - 10, top = 10, bottom = h - 42;
    const X = r => left + (right - left) * r / axis, Y = v => bottom - (bottom - top) * Math.min(v, yMax) / yMax;
    const upTo = this.sweeping ? this.cursor : axis;
    ctx.clearRect(0, 0, w, h);
    ctx.strokeStyle = "#d0d0d0"; ctx.lineWidth = 1; ctx.fillStyle = "#5f6368"; ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(left, top); ctx.lineTo(left, bottom); ctx.lineTo(right, bottom); ctx.stroke();
    ctx.fillText(`${nf1.format(yMax)} s`, 4, top + 8); ctx.fillText("0", 34, bottom);
    ctx.fillText(`${nf2.format(yMax / 2)} s`, 4, Y(yMax / 2) + 4);
    ctx.fillText("s per token", 4, top + 22);
    // Each rate's label centred under its tick (the last one ends at the chart's edge), so that a dot is read
    // against the number it stands over: a label set beside its tick once read 0.1 req/s off on a phone.
    ctx.strokeStyle = "#5f6368";
    for (let k = 0; k <= 4; k++) {
      const r = axis * k / 4, x = X(r);
      ctx.beginPath(); ctx.moveTo(x, bottom); ctx.lineTo(x, bottom + 5); ctx.stroke();
      if (k === 0) continue;
      ctx.textAlign = k === 4 ? "right" : "center";
      ctx.fillText(nf2.format(r), k === 4 ? right : x, bottom + 17);
    }
    ctx.textAlign = "left";
    ctx.fillText("requests per second", left + 4, h - 3);
    this.layout = { left, right, top, bottom, axis, width: w };
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
      if (x.capacity_rps === null || x.capacity_rps > upTo) return;  // (null: no answer, a run too short)
      const colour = LANE_COLOURS[i % 4], cx = X(x.capacity_rps), cy = Y(this.onCurve(i, x.capacity_rps) || 0);
      ctx.strokeStyle = colour; ctx.lineWidth = 1; ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(cx, cy); ctx.lineTo(cx, bottom); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = colour; ctx.beginPath(); ctx.arc(cx, cy, 5, 0, 7); ctx.fill();
      ctx.font = "bold 11px system-ui, sans-serif";
      // On a white halo, so that a name over a curve stays legible (on a phone the curves run under them).
      const label = `${x.paper_name} ${rateText(x)}`, lx = Math.min(cx + 6, right - 110), ly = top + 12 + 13 * i;
      ctx.strokeStyle = "#fff"; ctx.lineWidth = 3; ctx.lineJoin = "round"; ctx.strokeText(label, lx, ly);
      ctx.fillText(label, lx, ly);
      ctx.font = "11px system-ui, sans-serif";
    });
    if (this.cursor !== null) {
      ctx.strokeStyle = "#1d1d1f"; ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.moveTo(X(this.cursor), top); ctx.lineTo(X(this.cursor), bottom); ctx.stroke();
    }
    if (this.sweeping) { this.frames++; this.drawMs += performance.now() - t0; }
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
      // The table is rewritten at most every SLOW_MS (a layout per frame would cost the chart its frame rate).
      if (!this.readAt || now - this.readAt > SLOW_MS) { this.readAt = now; this.readout(this.cursor, null); }
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
    if (!this.found) {
      // The chart's range is not known yet: the rate waits for the search (the busy line says it is running) and
      // is run when it ends, in place of the opening rate.
      this.typedEarly = true;
      this.section.dataset.state = "busy";
      return;
    }
    this.typedEarly = false;
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
    if (from === "range" && !(rate >= catalog.limits.min_rate)) rate = catalog.limits.min_rate;
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
      el("th", { text: `normalized latency (mean, the paper's measure) at ${nf2.format(rate)} req/s` }), el("th", { text: "breaks at" }),
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

// Why a breaking point is "none (3.25 ?)" or "≥ 2.5": kvlab capacity's reason, in its words (trial 53, finding 2).
function uncertainText(x) {
  return x.capacity_rps === null ? `no answer, ${x.uncertified_reason}: more requests (-n) would tell`
    : `at least ${x.capacity_text.replace(/^≥\s*/, "")} req/s, ${x.uncertified_reason}`;
}
