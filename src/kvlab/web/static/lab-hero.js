/* The first figure: two caches on one clock, and the headline it stops on. A part of lab.js: kvlab.web.bundle
 * joins the parts, in order, into one script, so every name here is shared with the other parts. */

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
