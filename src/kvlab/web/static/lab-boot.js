/* Boot: the catalogue, the players, the page made ready. A part of lab.js: kvlab.web.bundle joins the parts, in
 * order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- boot
const tooltip = document.getElementById("tooltip");
const announce = document.getElementById("announce") || el("div");
let activePlayer = null;
let catalog = null;

document.addEventListener("keydown", e => {
  if (!activePlayer || e.altKey || e.ctrlKey || e.metaKey || e.defaultPrevented) return;
  if (e.target.closest && e.target.closest("input, select, textarea, button, summary")) return;
  if (e.key === " ") { e.preventDefault(); activePlayer.toggle(); }
  else if (e.key === "ArrowRight" && !(e.target.matches && e.target.matches("canvas"))) { e.preventDefault(); activePlayer.step(); }
});

async function readLog(node) {
  // The export embeds the frame log gzip-compressed and base64-encoded; the browser's own DecompressionStream
  // unpacks it, so the page needs nothing from the network.
  const bytes = base64Bytes(node.textContent.trim());
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

function fillForms() {
  const d = catalog.defaults;
  const fill = (sel, items, value, title) => {
    for (const node of document.querySelectorAll(sel)) {
      // A published trace that is not on this machine is marked in the menu (its title says how to get it).
      for (const it of items) node.append(el("option", { value: it.name, title: title ? title(it) : "",
        text: it.present === false ? `${it.name} (not on this machine)` : it.name }));
      node.value = value;
    }
  };
  fill(".model-select", catalog.models, d.model);
  fill(".gpu-select", catalog.gpus, d.gpu);
  fill(".workload-select", catalog.workloads, d.workload, w => w.description || "");
  fill("#vllm-log-model", catalog.models, "");
  for (const form of document.querySelectorAll("#grid-form, #race-form")) {
    form.elements.rate.value = String(d.rate);
    form.elements.num_requests.value = String(d.num_requests);
    form.elements.seed.value = String(d.seed);
    form.elements.block_size.value = String(d.block_size);
  }
  const [batching, allocator] = d.story[0].split("+");
  document.querySelector(`#grid-form [name="allocator"][value="${allocator}"]`).checked = true;
  document.querySelector(`#grid-form [name="batching"][value="${batching}"]`).checked = true;
  // The race: the lesson's four strategies in view, the others under "more".
  const box = document.getElementById("race-strategies");
  const more = el("details", { class: "more inline" }, el("summary", { text: "more strategies" }));
  for (const s of catalog.strategies) {
    const input = el("input", { type: "checkbox", name: "strategy", value: s.name });
    input.checked = d.race.includes(s.name);
    (d.race.includes(s.name) ? box : more).append(el("label", { title: s.description }, input, el("span", { text: s.name })));
  }
  box.append(more);
}

async function boot() {
  window.kvlab = { stats, facts, palette: PALETTE.map(hex), paletteRgb: PALETTE, pale: PALE, ink: INK,
    freeRgb: FREE_RGB, players: {} };
  const logNode = document.getElementById("kvlab-log");
  if (logNode) {
    const log = await readLog(logNode);
    const race = new LogPlayer(document.getElementById("race"), log);
    window.kvlab.players.race = race;
    activePlayer = race;
    buildLegend(document.getElementById("race-legend"));
    // The intro names the patterns in the legend's own words (one source: buildLegend).
    setText(document.querySelector('[data-field="pattern-words"]'), Array.from(document.querySelectorAll(
      "#race-legend .item:is(.legend-token, .legend-reserved, .legend-internal, .legend-free)"))
      .map(n => n.textContent).join("; "));
    document.body.dataset.ready = "1";
    return;
  }
  buildLegend(document.getElementById("hero-legend"), true);
  buildLegend(document.getElementById("grid-legend"));
  catalog = await api("api/catalog");
  window.kvlab.catalog = catalog;
  fillForms();
  const d = catalog.defaults;
  const story = { kind: "race", strategies: d.story, model: d.model, gpu: d.gpu, workload: d.workload, rate: d.rate,
    num_requests: d.num_requests, seed: d.seed, block_size: d.block_size };
  const hero = new LivePlayer(document.getElementById("hero"), "hero", null, story);
  const one = new LivePlayer(document.getElementById("one"), "one", null,
    { ...story, num_requests: 1, num_blocks: 144, seed: ONE_SEED });
  const grid = new LivePlayer(document.getElementById("grid"), "grid", document.getElementById("grid-form"));
  // Section 5: pages alone, on the first figure's cache, at a rate read from the engine's breaking points.
  const evictions = new LivePlayer(document.getElementById("evictions"), "evictions", null,
    { ...story, kind: "grid", strategies: [d.story[1]] });
  const race = new LivePlayer(document.getElementById("race"), "race", document.getElementById("race-form"));
  window.kvlab.players = { hero, one, grid, evictions, race };
  activePlayer = hero;
  setupHero(hero);
  const rates = new RateFigure(document.getElementById("rates"), { hero, grid, race });
  window.kvlab.rates = rates;
  // The figure leads: it plays on arrival (or, for a reader who asked for less motion, shows the moment it
  // would stop at), at the rate the engine's breaking points give it (openingRates: its two caches' searches only).
  const still = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  hero.autoplay = !still;
  const opening = openingRates(rates, hero, evictions);
  const heroReady = opening.then(() => hero.reset()).then(() => {
    // The block table's text and the questions' options name the first figure's setup (its pages' slots, its
    // max_model_len).
    if (hero.meta) for (const id of ["table", "questions"]) writeSetup(document.getElementById(id), hero.meta);
    return still ? hero.seek(HERO_HOLD) : null;
  });
  setupOne(one);
  window.kvlab.table = new TableFigure(document.getElementById("table-figure"), hero);
  window.kvlab.batching = new BatchChart(document.getElementById("batching-chart"), hero);
  setupEvictions(evictions);
  setupStory(grid);
  setupQuiz();
  setupShowMe(grid);
  race.onRender = () => setText(document.querySelector('[data-field="race-setup"]'),
    race.meta ? `Every lane: ${describeSetup(race.meta.setup)}.` : "");
  // Sections 1, 2 and the race need nothing from the breaking points: they start while the engine searches.
  const unhurried = [one.reset(), grid.reset(), race.reset()];
  await heroReady;
  await Promise.all([setupCalculator(grid, hero.meta.max_model_len), evictions.reset(), ...unhurried]);
  document.body.dataset.ready = "1";
  // Section 7 takes the engine a while (its other two systems' searches, then eight more rates per system): it is
  // asked for once the first figure has stopped at its headline (or section 7 comes near), so that the figure's
  // first seconds have the machine to themselves.
  rates.onPicked = () => heroRateNote(hero, rates.found);
  let asked = false;
  const ask = () => { if (!asked) { asked = true; rates.load(); } };
  hero.onHeld = ask;
  if (!hero.playing) ask();
  new IntersectionObserver(entries => { if (entries.some(e => e.isIntersecting)) ask(); },
    { rootMargin: "100% 0px" }).observe(document.getElementById("rates"));
}

boot().catch(err => {
  const node = document.querySelector(".error");
  showError(node, err);
  document.body.dataset.ready = "error";
});
