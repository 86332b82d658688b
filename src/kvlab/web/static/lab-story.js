/* Section 2: the story on the grid, and the quiz's "show me". A part of lab.js: kvlab.web.bundle joins the parts,
 * in order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- 2. the story on the grid
// The grid opens on reserve-the-max; once that has been watched, the page asks for pages. Two finished runs are
// compared only when their settings are the same.
function setupStory(grid) {
  const story = document.getElementById("story");
  const steps = { max: story.querySelector('[data-step="max"]'), paged: story.querySelector('[data-step="paged"]') };
  const watched = new Set();
  const mark = () => {
    const allocator = grid.form.elements.allocator.value;
    steps.max.classList.toggle("done", watched.has("max"));
    steps.paged.classList.toggle("done", watched.has("paged"));
    steps.max.classList.toggle("current", allocator === "max" && !watched.has("max"));
    steps.paged.classList.toggle("current", watched.has("max") || allocator === "paged");
    const runs = Array.from(grid.runs.values());
    const max = runs.filter(r => r.allocator === "max").pop(), paged = runs.filter(r => r.allocator === "paged").pop();
    let out = story.querySelector(".compare");
    if (max && paged) {
      if (!out) { out = el("li", { class: "compare current", role: "status" }); story.append(out); }
      const a = max.summary, b = paged.summary;
      if (max.setupKey !== paged.setupKey) {
        out.dataset.compared = "";
        out.textContent = `Not compared: your reserve-the-max run (${a.name}) and your pages run (${b.name}) had ` +
          `different settings (${setupDifference(max.setup, paged.setup)}). Run both on the same settings to ` +
          "compare them.";
      } else {
        out.dataset.compared = "1";
        const time = a.makespan_s === b.makespan_s ? `both served everyone in ${nf0.format(a.makespan_s)} s (a tie)`
          : `everyone was served in ${nf0.format(a.makespan_s)} s against ${nf0.format(b.makespan_s)} s`;
        out.textContent = `On the same settings (${describeSetup(max.setup)}), time-averaged, ` +
          `${pct(a.memory_shares.token)} of the memory held tokens under reserve-the-max (${a.name}) against ` +
          `${pct(b.memory_shares.token)} with pages (${b.name}); ${time}.`;
      }
    }
  };
  grid.onPlay = () => { watched.add(grid.form.elements.allocator.value); mark(); };
  grid.onRunsChanged = mark;
  grid.onNewRun = mark;
  story.querySelector('[data-act="story-next"]').addEventListener("click", async () => {
    grid.form.elements.allocator.value = "paged";
    activePlayer = grid;
    await grid.reset();
    grid.play();
  });
  mark();
}

function setupShowMe(grid) {
  const form = grid.form;
  const d = catalog.defaults;
  const set = values => {
    for (const [k, v] of Object.entries(values)) form.elements[k].value = String(v);
    checkForm(form);
  };
  const presets = {
    q1: { allocator: "max", batching: "continuous", block_size: d.block_size, num_blocks: "auto", rate: d.rate },
    q2: { allocator: "paged", batching: "continuous", block_size: d.block_size, num_blocks: "auto", rate: d.rate },
    // A cache of 64 blocks under 20 requests/s: pages run out mid-answer.
    q3: { allocator: "paged", batching: "continuous", block_size: d.block_size, num_blocks: 64, rate: 20 },
  };
  for (const button of document.querySelectorAll("[data-show]")) {
    button.addEventListener("click", async () => {
      button.blur(); // so that space then pauses the grid rather than pressing "show me" again
      set(presets[button.dataset.show]);
      activePlayer = grid;
      document.getElementById("grid").scrollIntoView({ behavior: "instant", block: "start" });
      await grid.reset();
      grid.play();
    });
  }
}
