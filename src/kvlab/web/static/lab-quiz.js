/* Section 8: three questions, answered with the reader's own runs. A part of lab.js: kvlab.web.bundle joins the
 * parts, in order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- what the questions point at
// Per memory strategy, the latest run the grid showed: its name, setup, counters, and (once it finished) the
// time-averaged summary the simulator computed over the whole run.
const facts = {};
let answersDue = false;

function noteFacts(info, grid, summary, meta) {
  if (!grid.counters.step) return; // nothing has run yet
  const f = facts[info.allocator] = facts[info.allocator] || {};
  if (f.name !== info.name || f.runId !== meta.runId) { delete f.summary; }
  f.name = info.name;
  f.runId = meta.runId;
  f.setup = meta.setup || {};
  f.setupKey = meta.setup_key;
  f.block_size = meta.kv_block_size || info.block_size;
  f.counters = grid.counters;
  f.note = grid.note || {};
  if (summary) f.summary = summary;
  answersDue = true;
}

// The verdicts; question 2's bound is the default block size's (catalogue), less the slot its token fills.
function quizWords(q) {
  const slots = catalog.defaults.block_size - 1;
  return {
    q1: { right: "Right: a fifth or less.", wrong: "Not quite: a fifth or less." },
    q2: { right: `Right: ${slots} slots, never more.`, wrong: `Not quite: ${slots} slots, the unfilled part of its last page.` },
    q3: { right: "Right: it evicts and recomputes.", wrong: "Not quite: vLLM evicts the newest conversation and recomputes it later." },
  }[q];
}

function explainQ1() {
  const fig2 = catalog.paper.figure2, f = facts.max;
  const paper = ` The vLLM paper measured ${pct(fig2["orca-max"].token)} for Orca (Max) and ${pct(paperPages(fig2).token)} for vLLM.`;
  if (!f) return "Press \"show me\": the grid runs reserve-the-max, and this answer fills in with its numbers." + paper;
  if (!f.summary) {
    return `Your ${f.name} run is not over yet; right now ${pct(f.counters.token_share)} of the cache holds ` +
      "tokens. Run it to the end (▸▸) for the time-averaged numbers." + paper;
  }
  const s = f.summary.memory_shares;
  return `Your ${f.name} run, time-averaged over its ${nf0.format(f.summary.makespan_s)} s: ${pct(s.token)} of ` +
    `the memory held tokens, ${pct(s.internal_fragmentation)} was reserved for answer tokens that never came ` +
    `(cross-hatched), ${pct(s.reserved)} waited for tokens still to come (striped), and ` +
    `${pct(s.external_fragmentation)} was free or between slabs too small for the next conversation.` + paper;
}

function explainQ2() {
  const f = facts.paged;
  if (!f) return "Press \"show me\": the grid runs pages, and this answer fills in with its numbers.";
  const bound = f.block_size - 1, c = f.counters;
  let text = `Pages are handed out as the answer grows, so only a conversation's last page can be partly empty: at ` +
    `most block_size − 1 = ${bound} slots. In your ${f.name} run the most any one conversation held without ` +
    `tokens, in the frames looked at, was ${nf0.format(c.max_unfilled_per_request)} slots.`;
  const m = facts.max;
  if (m && m.setupKey === f.setupKey) {
    text += ` Under reserve-the-max, on the same settings, it was ${nf0.format(m.counters.max_unfilled_per_request)}.`;
  } else if (m) {
    text += ` (Your reserve-the-max run had other settings (${setupDifference(m.setup, f.setup)}): not compared.)`;
  }
  if (f.summary) text += ` Time-averaged over the run, ${pct(f.summary.memory_shares.token)} of the memory held tokens.`;
  return text;
}

function explainQ3() {
  const f = facts.paged;
  const how = "The newest running conversation is evicted whole and goes back to the front of the queue; its " +
    "pages go to the others, and when it returns its tokens are computed again.";
  if (!f) return how + " Press \"show me\" to shrink the cache and watch it happen.";
  const s = f.summary, c = f.counters, n = f.note;
  const evictions = s ? s.preemptions : c.num_preemptions, redo = s ? s.recomputed_tokens : c.num_recomputed_tokens;
  if (!evictions) return how + ` In your ${f.name} run memory never ran out: 0 evictions. Press "show me".`;
  let text = how + ` In your ${f.name} run${s ? "" : " so far"}: ${plural(evictions, "eviction")}; the engine has ` +
    `computed ${nf0.format(redo)} tokens a second time${s ? "" : " so far"} (prompts and answers, counted when a ` +
    "conversation comes back)";
  if (!s && n.tokens_to_recompute) text += `, and ${nf0.format(n.tokens_to_recompute)} more wait in the queue`;
  text += ".";
  if (s) text += ` It still served everyone in ${nf0.format(s.makespan_s)} s.`;
  return text;
}

function renderAnswers() {
  const explain = { q1: explainQ1, q2: explainQ2, q3: explainQ3 };
  for (const [q, fn] of Object.entries(explain)) {
    const node = document.querySelector(`[data-answer="${q}"]`);
    if (node && !node.closest(".reveal").hidden) setText(node, fn());
  }
}

function setupQuiz() {
  for (const q of document.querySelectorAll(".question")) {
    const reveal = q.querySelector(".reveal");
    q.querySelector(".options").addEventListener("change", e => {
      const choice = e.target.value, correct = q.dataset.correct;
      for (const label of q.querySelectorAll(".options label")) {
        const v = label.querySelector("input").value;
        label.classList.toggle("right", v === correct);
        label.classList.toggle("wrong", v === choice && v !== correct);
      }
      const verdict = reveal.querySelector(".verdict");
      verdict.textContent = quizWords(q.id)[choice === correct ? "right" : "wrong"];
      verdict.className = "verdict " + (choice === correct ? "right" : "wrong");
      reveal.hidden = false;
      renderAnswers();
    });
  }
}
