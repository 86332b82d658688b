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
  const evicted = document.querySelector("#hero-legend .legend-evicted");
  hero.onRender = frame => {
    if (hero.panels.length !== 2 || !hero.panels[0].last) return;
    const [a, b] = hero.panels.map(p => p.last.counters);
    // The legend names the eviction's flash once this run has evicted (at the lesson's rate, pages keep up and
    // none flashes): a legend item for what never appears is a question the figure cannot answer.
    evicted.hidden = !(a.num_preemptions || b.num_preemptions);
    const reached = frame.t >= HERO_HOLD - 1e-9;
    const at = reached ? `${nf0.format(frame.t)} s in` : `${nf1.format(frame.t)} s in`;
    // One shape from the first frame to the last (the closing clause is held, unseen, until the headline's
    // moment: lab.css), so that the page below does not move as the numbers change.
    const big = a.num_running === b.num_running
      ? `Both run ${plural(a.num_running, "conversation")} at once: a tie so far.`
      : `${plural(a.num_running, "conversation")} at once against ${nf0.format(b.num_running)}.`;
    const rest = ` Same GPU, same requests, ${at}: reserving the max leaves ${nf0.format(a.num_waiting)} waiting, ` +
      `pages ${nf0.format(b.num_waiting)}.`;
    headline.innerHTML = "";
    headline.append(el("b", { text: big }), document.createTextNode(rest),
      el("span", { class: "why", text: " Why? One conversation up close, below.", "aria-hidden": reached ? "false" : "true" }));
    headline.classList.toggle("reached", reached);
    setData(headline, "final", reached ? "1" : "");
    setData(headline, "t", frame.t);
    setData(headline, "seq", frame.seq);
    setData(headline, "speed", hero.speed);
    onward.hidden = !(reached && !frame.done && !hero.playing);
  };
}

// The rates the page opens at, from the engine's breaking points (section 7's searches, kvlab.web.rates): the first
// figure at the lesson's rate, halfway between where its two caches break, so that pages keep up and reserving
// the max does not; section 5 at pages' own breaking point, where they run out on purpose. Only those two caches'
// searches are waited for (RateFigure.opening: reserving the max and pages, not section 7's other two). Nothing
// plays until they are in; without them (section 7's slot says why) both run at the command line's rate, and say so.
async function openingRates(rates, hero, evictions) {
  const headline = document.getElementById("hero-headline");
  setText(headline, "Finding the rate to show: the engine is searching where each cache breaks (section 7)…");
  const buttons = Array.from(hero.transport.querySelectorAll("button"));
  for (const b of buttons) b.disabled = true;
  hero.setBusy(true);
  let f = null;
  try {
    f = await rates.opening();
  } catch (err) {
    f = null; // (section 7 shows the reason in its own slot)
  } finally {
    for (const b of buttons) b.disabled = false;
    hero.setBusy(false);
  }
  if (f && f.lesson_rate !== null) hero.fixed.rate = f.lesson_rate;
  if (f && f.evictions) evictions.fixed.rate = f.evictions.rate;
  hero.opening = { found: f, rate: hero.fixed.rate };
  evictionsWhy(f, evictions.fixed.rate);
  heroRateNote(hero, f);
  return f;
}

// Where the first figure's rate stands against its two caches' breaking points (section 7's, the engine's): said
// plainly, with the lesson's rate one press away when the figure runs at another.
function heroRateNote(hero, f) {
  const note = document.getElementById("hero-rate");
  const said = note.querySelector('[data-field="hero-rate-text"]');
  const button = note.querySelector('[data-act="lesson-rate"]');
  const rate = hero.fixed.rate;
  let text;
  const line = memory => f && f.systems.find(x => x.batching === "continuous" && x.allocator === memory);
  const max = line("max"), paged = line("paged");
  if (!max || !paged) {
    text = `The engine's breaking points are not in (section 7 says why), so this figure runs at ${rate} req/s, ` +
      "the command line's rate, without knowing where that stands against either cache.";
  } else {
    const holds = x => rate <= x.capacity_rps;
    const both = `pages keep up to ${paged.capacity_text} req/s, reserving the max to ${max.capacity_text}`;
    if (rate === f.lesson_rate) {
      text = `The figure runs at ${rate} req/s, halfway between where its two caches break (the engine's ` +
        `breaking points, section 7): ${both}. So the queue on the right stays short and the one on the left grows.`;
    } else if (!holds(max) && !holds(paged)) {
      text = `At ${rate} req/s conversations arrive faster than either cache serves them, so both queues grow ` +
        `without end: ${both} (section 7).`;
    } else if (holds(paged) && !holds(max)) {
      text = `At ${rate} req/s pages keep up and reserving the max does not: ${both} (section 7).`;
    } else text = `At ${rate} req/s ${holds(max) ? "both keep up" : "pages do not keep up"}: ${both} (section 7).`;
  }
  if (said.dataset.text !== text) {
    said.dataset.text = text;
    said.textContent = "";
    const [head, tail] = text.split("section 7");
    said.append(head, el("a", { href: "#rates", text: "section 7" }), tail);
  }
  const lesson = f ? f.lesson_rate : null;
  button.hidden = lesson === null || lesson === rate;
  if (lesson !== null) setText(button, `watch at ${lesson} req/s, where pages keep up and reserving the max does not`);
  setData(note, "rate", rate);
  note.hidden = false;
}

// Section 5's prose: why its rate (pages' breaking point, or the command line's rate when the engine's breaking
// points are not in).
function evictionsWhy(f, rate) {
  const node = document.querySelector('#evictions [data-field="evictions-why"]');
  if (f && f.evictions) {
    setText(node, `pages' breaking point (section 7): the highest rate at which they keep up, so their cache is ` +
      `full most of the time and an answer that grows finds no free page. Run to the end, the engine evicts ` +
      `conversations ${plural(f.evictions.num_preemptions, "time")} there.`);
  } else setText(node, `the command line's rate: the engine's breaking points are not in (section 7 says why), ` +
    "so whether pages run out here is not known ahead.");
}
