/* A recorded run replayed on the page's own clock (the --html export). A part of lab.js: kvlab.web.bundle joins
 * the parts, in order, into one script, so every name here is shared with the other parts. */

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
