/* Sections 9 and 10: the calculator and the bridge to vLLM. A part of lab.js: kvlab.web.bundle joins the parts, in
 * order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- the calculator and the bridge to vLLM
// ``contextLen``: the question it opens on, conversations as long as the first figure's max_model_len.
async function setupCalculator(grid, contextLen) {
  const form = document.getElementById("calc-form");
  const modelSel = document.getElementById("calc-model"), gpuSel = document.getElementById("calc-gpu");
  for (const m of catalog.models) modelSel.append(el("option", { value: m.name, text: m.name }));
  for (const g of catalog.gpus) gpuSel.append(el("option", { value: g.name, text: g.name }));
  modelSel.value = catalog.defaults.model;
  // Each number's range, the one `kvlab size` takes (catalog.ranges: kvlab.validate.option_range), checked here as
  // the server checks it.
  for (const input of form.querySelectorAll("input[data-kind]")) {
    const range = catalog.ranges[input.name];
    if (!range) continue;
    input.dataset.min = String(range.lo);
    input.dataset.max = String(range.hi);
    if (range.lo_open) input.dataset.loOpen = "true"; else delete input.dataset.loOpen;
  }
  document.getElementById("calc-context").value = String(contextLen);
  gpuSel.value = catalog.defaults.gpu;
  const errorNode = document.getElementById("calc-error");
  const out = document.getElementById("calc-out");
  const section = document.getElementById("calculator");
  let serial = 0;
  // Four states: an answer (shown); a question out (the last answer dimmed and "sizing…" beside the controls, from
  // the moment an input changes until the answer, data-state "pending"); a value typed out of range (refused here,
  // nothing sent: the last answer dimmed, data-state "stale"); a model, GPU or context the engine refuses (the last
  // answer, another model's, hidden: data-state "refused").
  const state = (name, err) => {
    showError(errorNode, err);
    section.classList.toggle("stale", name !== "ok");
    section.classList.toggle("refused", name === "refused");
    section.classList.toggle("busy", name === "pending");
    section.dataset.state = name;
  };
  const update = async () => {
    const mine = ++serial;
    const [values, msg] = checkForm(form);
    if (msg) { state("stale", new Error(msg)); return; }
    const q = new URLSearchParams(new FormData(form));
    state("pending", null);
    try {
      const r = await api("api/size?" + q.toString());
      if (mine !== serial) return;
      state("ok", null);
      // (the weights fit but vLLM would refuse to start: the numbers stay, with why and what to change)
      if (r.refusal) showError(errorNode, new Refusal({ error: r.refusal, advice: r.advice }));
      renderCalc(r, values.gpu_memory_utilization);
      out.hidden = false;
      fitMembarLabels();
    } catch (err) {
      if (mine !== serial) return;
      state(err instanceof Refusal ? "refused" : "stale", err);
    }
  };
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  const utilInput = document.getElementById("calc-util");
  const bridge = () => updateBridge(modelSel.value, gpuSel.value, utilInput);
  modelSel.addEventListener("change", bridge);
  gpuSel.addEventListener("change", bridge);
  utilInput.addEventListener("change", bridge); // section 10 follows the calculator's utilization too
  setupBridge(grid, modelSel, gpuSel);
  await Promise.all([update(), bridge()]);
}

function renderCalc(r, utilization) {
  const bar = document.getElementById("calc-bar");
  bar.innerHTML = "";
  // The paper's Figure 1: the GPU's memory by use, as `kvlab size` splits it.
  const split = r.memory_split;
  const total = split.gpu_memory_bytes;
  const parts = [["weights", split.weights_bytes, "weights"], ["kv", split.kv_cache_bytes, "KV cache"],
    ["other", split.other_bytes, "other"]];
  const said = [];
  const whole = wholeShares(parts.map(([, v]) => Math.max(0, v)), total);
  parts.forEach(([cls, v, label], k) => {
    if (v <= 0) return;
    const share = 100 * v / total;
    said.push(`${label} ${whole[k]}%`);
    bar.append(el("span", { class: cls, style: `width:${share}%`, title: `${label}: ${gib(v)} (${nf1.format(share)}%)`,
      "data-part": cls, "data-value": String(v), "data-share": String(whole[k]),
      text: share >= 8 ? `${label} ${whole[k]}%` : "" }));
  });
  bar.setAttribute("aria-label", "GPU memory: " + said.join(", "));
  fitMembarLabels();
  const set = (key, text, value) => {
    const dd = document.querySelector(`#calc-figures [data-key="${key}"]`);
    dd.textContent = text;
    dd.dataset.value = String(value);
    return dd;
  };
  set("kv_bytes_per_token", `${nf0.format(r.kv_bytes_per_token)} bytes (${nf0.format(r.kv_bytes_per_token / 1024)} KiB)`, r.kv_bytes_per_token);
  set("available_kv_bytes", gib(r.available_kv_bytes), r.available_kv_bytes);
  // vLLM's printed figure; where it is not the blocks times their tokens (a sliding window, several KV cache groups),
  // the row says how it is counted and names the token slots `kvlab run` counts (trial 58, finding 1).
  set("num_tokens", `${nf0.format(r.num_tokens)} tokens (` + (r.num_tokens === r.num_slots
    ? `${nf0.format(r.num_blocks)} blocks of ${r.block_size})` : `${r.num_tokens_text})`), r.num_tokens);
  set("weights_bytes", gib(r.weights_bytes), r.weights_bytes);
  set("max_concurrency", `${nf2.format(r.max_concurrency)}× for ${nf0.format(r.max_model_len)} tokens per request`, r.max_concurrency);
  set("needed", `${nf0.format(r.workload.num_tokens_needed)} tokens (${gib(r.workload.kv_bytes_needed)})`, r.workload.num_tokens_needed);
  const fit = set("num_fit", "", r.workload.num_fit);
  fit.innerHTML = "";
  const w = r.workload;
  fit.append(el("span", { class: w.fits ? "fits" : "nofit", text: fitText(w) }));
  document.getElementById("calc-log").textContent = r.log_lines.join("\n");
  setText(document.getElementById("calc-paper"), paperSplitNote(r, utilization));
}

// The workload against the cache and against max_num_seqs (vLLM runs at most that many at once, whatever the cache
// holds: trial 55), in `kvlab size`'s words.
function fitText(w) {
  const n = nf0.format(w.concurrency), held = nf0.format(w.num_fit), seqs = nf0.format(w.max_num_seqs);
  const capped = `vLLM runs at most ${seqs} at once (max_num_seqs: vLLM's default here)`;
  if (w.fits && w.concurrency <= w.max_num_seqs)
    return `all ${n} fit; the cache holds ${held} of that length` + (w.num_fit > w.max_num_seqs ? `, though ${capped}` : "");
  if (w.fits)
    return `all ${n} fit in the cache (it holds ${held} of that length), but ${capped}: the other ` +
      `${nf0.format(w.concurrency - w.max_num_seqs)} wait`;
  return `only ${nf0.format(w.num_at_once)} of ${n} run at once: the cache holds ${held} of that length` +
    (w.num_fit > w.max_num_seqs ? ` and ${capped}` : "") + "; the rest wait, or are evicted mid-answer";
}

// Whole percentages that add up to 100 (the largest remainders round up): 61 + 27 + 13 once read 101%.
function wholeShares(values, total) {
  const exact = values.map(v => 100 * v / total), out = exact.map(Math.floor);
  let left = 100 - out.reduce((a, b) => a + b, 0);
  const order = exact.map((x, k) => [x - out[k], k]).filter(([, k]) => values[k] > 0).sort((a, b) => b[0] - a[0]);
  for (const [, k] of order) { if (left <= 0) break; out[k]++; left--; }
  return out;
}

// Why the bar's shares are not the paper's Figure 1 (kvlab.paper.FIG1_PAPER): the paper divides by the GB on the
// label and leaves nothing unused; the bar divides by the GiB CUDA reports, with 1 - utilization left unused.
function paperSplitNote(r, utilization) {
  const f1 = catalog.paper.figure1, split = r.memory_split;
  const same = r.model === f1.model && r.gpu.toLowerCase() === f1.gpu;
  const label = nf0.format(f1.label_bytes / 1e9);
  let text = `Why not the vLLM paper's ${nf0.format(100 * f1.weights_share)}% weights and ` +
    `${nf0.format(100 * f1.kv_cache_share)}% KV cache (its Figure 1, ${f1.model} on ${f1.gpu})? The paper divides ` +
    `by the ${label} GB on the GPU's label (1 GB = 10⁹ bytes) and counts nothing as left unused. This bar divides ` +
    `by the ${gib(split.gpu_memory_bytes)} the GPU reports to CUDA (1 GiB = 2³⁰ bytes), and "other" includes the ` +
    `${nf0.format(100 * (1 - utilization))}% vLLM leaves unused at GPU memory utilization ${utilization}.`;
  if (same) {
    text += ` Against the ${label} GB label these weights are ${nf0.format(100 * split.weights_bytes / f1.label_bytes)}%.`;
  }
  return text;
}

// A segment's label is written inside it only where it fits whole (the legend and the tooltip say it anyway).
function fitMembarLabels() {
  for (const span of document.querySelectorAll("#calc-bar span")) {
    if (!span.dataset.label) span.dataset.label = span.textContent;
    span.textContent = span.dataset.label;
    if (span.scrollWidth > span.clientWidth) span.textContent = "";
  }
}
window.addEventListener("resize", fitMembarLabels);

let bridgeSize = null, bridgeSerial = 0;

// The model and GPU picked in the calculator, by kvlab's own sizing: the command, the lines vLLM prints, how to
// read them, and what drawing that pool changes in section 2.
// ``utilInput``: the calculator's GPU memory utilization, named in the command when it is not the one the page
// opens on (vLLM's default); a value the calculator refuses leaves this section dimmed (the calculator says why).
async function updateBridge(model, gpu, utilInput) {
  const errorNode = document.getElementById("bridge-error"), now = document.getElementById("bridge-now");
  const draw = document.querySelector('[data-act="bridge-draw"]');
  const mine = ++bridgeSerial;
  const [util, utilMsg] = checkField(utilInput);
  const dim = on => {
    now.classList.toggle("stale-part", on);
    now.dataset.stale = on ? "1" : "";
    draw.disabled = on;
  };
  if (utilMsg) { showError(errorNode, null); dim(true); bridgeSize = null; return; }
  const own = utilInput.value.trim() !== utilInput.defaultValue;
  const q = own ? { model, gpu, gpu_memory_utilization: String(util) } : { model, gpu };
  dim(true); // until the answer: what is shown is the last question's
  let r;
  try {
    r = await api("api/size?" + new URLSearchParams(q).toString());
  } catch (err) {
    if (mine !== bridgeSerial) return;
    // This section's own slot; what it showed is another model's, so it is dimmed and cannot be drawn.
    showError(errorNode, err);
    dim(true);
    bridgeSize = null;
    return;
  }
  if (mine !== bridgeSerial) return;
  showError(errorNode, null);
  dim(false);
  bridgeSize = { ...r, own_utilization: own };
  const entry = catalog.models.find(m => m.name === r.model);
  for (const n of document.querySelectorAll('[data-field="bridge-gpu"]')) n.textContent = r.gpu;
  for (const n of document.querySelectorAll('[data-field="bridge-model"]')) n.textContent = r.model;
  setText(document.querySelector('[data-field="bridge-cmd"]'), `vllm serve ${(entry && entry.hf_repo) || r.model}` +
    (own ? ` --gpu-memory-utilization ${util}` : ""));
  const log = document.getElementById("bridge-log");
  log.innerHTML = "";
  for (const line of r.log_lines) {
    const key = /KV cache size|Maximum concurrency/.test(line);
    log.append(key ? el("mark", { text: line }) : document.createTextNode(line), "\n");
  }
  const reading = document.getElementById("bridge-reading");
  reading.innerHTML = "";
  reading.append(
    el("li", { text: `"GPU KV cache size: ${nf0.format(r.num_tokens)} tokens" is the pool: every conversation's ` +
      "tokens together must fit in it." }),
    el("li", { "data-field": "bridge-blocks", "data-value": String(r.num_blocks),
      text: (r.num_tokens === r.num_slots ? `blocks = tokens / ${r.block_size} = ${nf0.format(r.num_tokens)} / ` +
        `${r.block_size} = ${nf0.format(r.num_blocks)} blocks` : `${nf0.format(r.num_blocks)} blocks (the tokens are ` +
        `${r.num_tokens_text})`) + ": the squares of the grid." }),
    el("li", { text: `"Maximum concurrency for ${nf0.format(r.max_model_len)} tokens per request: ` +
      `${nf2.format(r.max_concurrency)}x" is how many conversations of the full context fit at once: ` +
      `${nf0.format(r.num_blocks)} blocks / ${nf0.format(r.max_model_len / r.block_size)} blocks each. With pages, ` +
      "shorter conversations fit many more." }),
  );
  setText(document.getElementById("bridge-scale"), `This sets section 2 to ${r.model} on ${r.gpu} with the whole KV ` +
    `cache vLLM would have there (${blocks(r.num_blocks)}), memory in pages; its requests and batching stay as they are.`);
}

function setupBridge(grid, modelSel, gpuSel) {
  document.querySelector('[data-act="bridge-draw"]').addEventListener("click", async () => {
    const form = grid.form;
    form.elements.model.value = modelSel.value;
    form.elements.gpu.value = gpuSel.value;
    // At the calculator's own utilization, the pool it sized (auto is the page's opening utilization's).
    form.elements.num_blocks.value = bridgeSize && bridgeSize.own_utilization ? String(bridgeSize.num_blocks) : "auto";
    form.elements.allocator.value = "paged";
    activePlayer = grid;
    await grid.reset();
    const m = grid.meta, v = grid.views[0];
    if (m && v) {
      const k = v.layout.k * (m.display_scale || 1);
      setText(document.getElementById("bridge-scale"), `Section 2 now draws ${m.model} on ${m.gpu}: ` +
        `${nf0.format(m.num_gpu_blocks)} blocks, one square = ${nf0.format(k)} blocks (the page picks the scale ` +
        "so the pool fits the screen).");
    }
    document.getElementById("grid").scrollIntoView({ behavior: "instant", block: "start" });
  });
  document.querySelector('[data-act="explain-log"]').addEventListener("click", explainLog);
}

async function explainLog() {
  const input = document.getElementById("vllm-log-input");
  const errorNode = document.getElementById("vllm-log-error"), out = document.getElementById("vllm-log-out");
  const text = input.value;
  const max = catalog.limits.max_log_chars;
  if (!text.trim()) { showError(errorNode, new Error("paste a vLLM startup log first (the lines vllm serve prints)")); return; }
  if (text.length > max) {
    showError(errorNode, new Error(`that is ${nf0.format(text.length)} characters; paste at most ${nf0.format(max)} (the startup part is enough)`));
    return;
  }
  const model = document.getElementById("vllm-log-model").value;
  out.classList.add("stale");
  try {
    const r = await api("api/vllm-log", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(model ? { text, model } : { text }) });
    showError(errorNode, null);
    renderExplained(out, r);
  } catch (err) {
    showError(errorNode, err);
    out.hidden = true;
  } finally {
    out.classList.remove("stale");
  }
}

function renderExplained(out, r) {
  const log = r.log, dl = el("dl", {});
  const add = (key, label, value) => {
    if (value === null || value === undefined) return;
    dl.append(el("dt", { text: label }), el("dd", { "data-key": key, "data-value": String(value),
      text: typeof value === "number" ? nf0.format(value) : String(value) }));
  };
  add("kv_cache_tokens", "KV cache size (tokens)", log.kv_cache_tokens);
  if (log.block_size) add("num_gpu_blocks", `blocks of ${log.block_size} tokens`, log.num_gpu_blocks);
  else add("num_gpu_blocks", "blocks (the log names no block size)", log.num_gpu_blocks);
  if (log.max_concurrency !== null && log.max_concurrency !== undefined) {
    dl.append(el("dt", { text: `maximum concurrency at ${nf0.format(log.max_concurrency_tokens_per_request || 0)} tokens` }),
      el("dd", { "data-key": "max_concurrency", "data-value": String(log.max_concurrency), text: nf2.format(log.max_concurrency) + "x" }));
  }
  out.innerHTML = "";
  out.append(dl, el("ul", {}, ...r.explain.lines.map(line => el("li", { text: line }))));
  if (r.explain.differences && r.explain.differences.length) {
    out.append(el("p", { text: "Where kvlab's calculation differs:" }),
      el("ul", {}, ...r.explain.differences.map(line => el("li", { text: line }))));
  }
  out.hidden = false;
}
