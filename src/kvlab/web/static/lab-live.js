/* A run live from the server (LivePlayer), and the finish table. A part of lab.js: kvlab.web.bundle joins the
 * parts, in order, into one script, so every name here is shared with the other parts. */

const SUMMARY_COLS = [
  ["num_finished", "finished", v => nf0.format(v)],
  ["finish_time", "all served at (s)", v => nf1.format(v)],
  ["throughput_rps", "requests/s", v => nf2.format(v)],
  ["throughput_tps", "tokens/s", v => nf1.format(v)],
  ["token_share", "memory holding tokens (time avg.)", v => pct(v)],
  ["mean_batch_size", "conversations at once (avg.)", v => nf1.format(v)],
  ["preemptions", "evictions", v => nf0.format(v)],
  ["recomputed_tokens", "tokens computed again", v => nf0.format(v)],
  ["normalized_latency_p50", "normalized latency, p50 (s/token)", v => nf2.format(v)],
];

function flatSummary(s) {
  const nl = s.normalized_latency_s_per_token || {};
  return {
    num_finished: s.num_finished, finish_time: s.makespan_s, throughput_rps: s.throughput_rps,
    throughput_tps: s.throughput_tps, token_share: s.memory_shares && s.memory_shares.token,
    mean_batch_size: s.mean_batch_size, preemptions: s.preemptions, recomputed_tokens: s.recomputed_tokens,
    normalized_latency_p50: nl.p50, // the median, as `kvlab race` prints it (kvlab.report.tables)
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
      // The old run's frame number goes with it: the new run's first frame writes its own once it is drawn, so
      // whoever waits for "seq 0 of the new session" waits for that drawing, not the old run's number.
      delete this.section.dataset.seq;
      delete this.section.dataset.shownSeq;
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
  writeSetup(meta) { writeSetup(this.section, meta); }

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
