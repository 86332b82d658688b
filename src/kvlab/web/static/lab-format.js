/* Numbers in words, the server's API and its refusals, checked input, setups compared. A part of lab.js:
 * kvlab.web.bundle joins the parts, in order, into one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- formatting and input
const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const nf1 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const nf2 = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
function gib(bytes) { return nf2.format(bytes / 2 ** 30) + " GiB"; }
function pct(v) { return nf1.format(v) + "%"; }
function plural(n, one, many) { return `${nf0.format(n)} ${n === 1 ? one : (many || one + "s")}`; }
function blocks(n) { return plural(n, "block"); }
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

// The server answers the page's refusals in the body (HTTP 200, {"error", "refused": true}): a refused value is a
// line beside its control, and the browser logs nothing (it logs every 4xx response as a failed resource).
const REFUSALS = { "X-Kvlab-Refusals": "in-body" };
class Refusal extends Error {
  constructor(body) { super(body.error); this.advice = body.advice || []; }
}
async function api(path, options = {}) {
  const resp = await fetch(path, { ...options, headers: { ...(options.headers || {}), ...REFUSALS } });
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (body && body.refused) throw new Refusal(body);
  if (!resp.ok) {
    const msg = body && body.error ? body.error : `the server answered ${resp.status}`;
    throw new Error(msg);
  }
  return body;
}

// Writing the same text or style again still costs the browser a layout: write only what changed.
function setText(node, text) { if (node && node.textContent !== text) node.textContent = text; }
function setData(node, key, value) { const v = String(value); if (node && node.dataset[key] !== v) node.dataset[key] = v; }

// One section's error slot: the message, and (for a refusal) what to change among the page's controls.
function showError(node, err) {
  // A mistake in the page's own script (not the server's answer, not a lost connection) is also logged, so that
  // the browser tests, which fail on any console error, see it rather than a line of text in a section.
  if (err && [TypeError, ReferenceError, RangeError, SyntaxError].some(k => err instanceof k) &&
      !/fetch|network/i.test(err.message || "")) console.error(err);
  if (!node) return;
  if (err) {
    node.textContent = err.message || String(err);
    if (err.advice && err.advice.length) node.append(el("span", { class: "advice", text: "Try: " + err.advice.join("; or ") + "." }));
    node.hidden = false;
  } else { node.textContent = ""; node.hidden = true; }
}

const NUMBER_RE = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

// One field's value, checked in the page against the same ranges the server enforces (params.LIMITS), so that
// nothing is sent that the server would refuse. Returns [value or null for "auto", message or null].
function checkField(input) {
  const kind = input.dataset.kind;
  if (!kind) return [input.value, null];
  const raw = input.value.trim(), label = input.dataset.label || input.name;
  const named = label === input.name ? label : `${label} (${input.name})`;  // the words beside it, and its name
  const lo = Number(input.dataset.min);
  const open = input.dataset.loOpen === "true";  // (lo itself refused: gpu_memory_utilization is above 0)
  const range = `${open ? "above " : ""}${nf0.format(lo) === String(lo) ? lo : input.dataset.min} to ${input.dataset.max}`;
  const hi = Number(input.dataset.max);
  if (kind === "blocks" && (raw === "" || raw.toLowerCase() === "auto")) return [null, null];
  const what = kind === "number" ? "a number" : "a whole number";
  const also = kind === "blocks" ? ", or auto" : "";
  if (raw === "") return [null, `${named} is empty: type ${what} from ${range}${also}`];
  if (!NUMBER_RE.test(raw) || !Number.isFinite(Number(raw))) {
    return [null, `${named} "${raw}" is not ${what}: type one from ${range}${also}`];
  }
  const v = Number(raw);
  if (kind !== "number" && !Number.isInteger(v)) return [null, `${named} ${raw} is not a whole number: type one from ${range}${also}`];
  if (v < lo || (open && v === lo) || v > hi) return [null, `${named} ${raw} is out of range: ${range}`];
  return [v, null];
}

// Every checked field of a form: the values, or the first message (and each bad field marked).
function checkForm(form) {
  let first = null;
  const values = {};
  for (const input of form.querySelectorAll("input[data-kind]")) {
    const [v, msg] = checkField(input);
    input.classList.toggle("invalid", !!msg);
    input.setAttribute("aria-invalid", msg ? "true" : "false");
    if (msg && !first) first = msg;
    values[input.name] = v;
  }
  return [values, first];
}

// What two setups differ in, in the page's words ("rate 4 against 20"); empty when they are the same.
const SETUP_WORDS = { model: "model", gpu: "GPU", workload: "workload", rate: "requests/s", num_requests: "requests",
  seed: "seed", block_size: "block size", num_gpu_blocks: "KV blocks", max_num_seqs: "seats (max_num_seqs)",
  max_model_len: "max_model_len", cost: "cost profile" };
function setupDifference(a, b) {
  return Object.keys(SETUP_WORDS).filter(k => a[k] !== b[k])
    .map(k => `${SETUP_WORDS[k]} ${typeof a[k] === "number" ? nf0.format(a[k]) : a[k]} against ` +
      `${typeof b[k] === "number" ? nf0.format(b[k]) : b[k]}`).join(", ");
}
function describeSetup(s) {
  if (!s || !s.model) return "";
  return `${s.model} on ${s.gpu} · ${nf0.format(s.num_gpu_blocks)} blocks of ${s.block_size} tokens · ` +
    `${nf0.format(s.num_requests)} requests at ${s.rate}/s (${s.workload}, seed ${s.seed}) · ` +
    `${nf0.format(s.max_num_seqs)} seats · cost profile ${s.cost}`;
}
