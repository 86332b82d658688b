/* A run in words: the setup fields the prose names, the strategies' names and their lanes' colours. A part of lab.js: kvlab.web.bundle joins the parts, in order, into one script, so every name here is
 * shared with the other parts. */

// ---------------------------------------------------------------- a run in words
const SETUP_FIELDS = {
  model: m => m.model,
  gpu: m => m.gpu,
  "num-blocks": m => nf0.format(m.num_gpu_blocks),
  "block-size": m => nf0.format(m.kv_block_size),
  "display-scale": m => (m.display_scale > 1 ? `, drawn ${nf0.format(m.display_scale)} to a square` : ""),
  rate: m => String(m.setup.rate),
  "slab-blocks": m => nf0.format(Math.ceil(m.max_model_len / m.kv_block_size)),
  "max-model-len": m => nf0.format(m.max_model_len),
  "last-page-slots": m => nf0.format(m.kv_block_size - 1), // a page's slots but the one its token fills
  "first-page": m => `0–${m.kv_block_size - 1}`,
  "second-page": m => `${m.kv_block_size}–${2 * m.kv_block_size - 1}`,
  "kv-per-token": m => `${nf0.format(m.kv_bytes_per_token / 1024)} KiB (${nf0.format(m.kv_bytes_per_token)} bytes) ` +
    `per token for ${m.model}`,
};
// Each [data-field] of SETUP_FIELDS under ``root``, written from a run's meta.
function writeSetup(root, meta) {
  for (const node of root.querySelectorAll("[data-field]")) {
    const f = SETUP_FIELDS[node.dataset.field];
    if (f) { setText(node, f(meta)); setData(node, "value", node.textContent); }
  }
}
const FRIENDLY = { max: "reserve the max", paged: "pages (vLLM)", pow2: "power of two", oracle: "oracle" };

// A lane's subtitle: the lesson's four (named batching+memory) in the words section 2 defines beside its buttons
// (continuous or static batching, reserve the max or pages); the others (the paper's systems, under "more") in
// their own description.
function describe(info) {
  const memory = { max: "reserve the max", paged: "pages" }[info.allocator];
  if (!memory || info.name !== `${info.batching}+${info.allocator}`) return info.description || "";
  return `${info.batching} batching, ${memory}` + (info.name === "continuous+paged" ? " (= vLLM)" : "");
}
const LANE_COLOURS = [PALETTE[3], PALETTE[4], PALETTE[2], PALETTE[0]].map(hex);
const LANE_DASHES = [[], [7, 4], [2, 3], [10, 3, 2, 3]];
