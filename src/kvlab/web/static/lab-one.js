/* Section 1: one conversation, a slab or pages. A part of lab.js: kvlab.web.bundle joins the parts, in order, into
 * one script, so every name here is shared with the other parts. */

// ---------------------------------------------------------------- 1. one conversation
const ONE_SEED = 3; // the workload's conversation drawn first: a 129-token prompt and a 681-token answer

function setupOne(one) {
  one.transport.querySelector('[data-act="another"]').addEventListener("click", async () => {
    one.fixed.seed = (one.fixed.seed + 1) % 1000;
    activePlayer = one;
    await one.reset();
    one.play();
  });
  const caption = document.getElementById("one-caption");
  one.onRender = frame => {
    if (one.panels.length !== 2 || !one.panels[0].last || !one.meta.requests.length) return;
    const [id, , prompt, answer] = one.meta.requests[0];
    const [slab, pages] = one.panels.map(p => p.last);
    const held = (g, info) => BIG.held_slots.of(g, info);
    const ms = held(slab, one.panels[0].info), ps = held(pages, one.panels[1].info);
    const tok = pages.usage.token;
    let text = `Conversation ${id}: a ${nf0.format(prompt)}-token prompt, then ${plural(answer, "token")} of answer. `;
    if (!ms && !tok && !frame.done) text += "Press play: it arrives, and both caches make room for it.";
    else if (frame.done) {
      text += "It has finished, and both caches are empty again: its slab goes back whole, its pages one by one. " +
        "A hole the slab's size can only be reused by another conversation whose slab fits in it.";
    } else {
      text += `Now ${plural(tok, "token")}. Reserve the max set aside ${nf0.format(ms)} slots the moment it started ` +
        `and fills ${pct(100 * tok / ms)} of them; pages hold it in ${nf0.format(ps)} slots ` +
        `(${blocks(ps / one.meta.kv_block_size)}), ${pct(100 * tok / Math.max(1, ps))} full: only the last page ` +
        "is partly empty.";
    }
    setText(caption, text);
  };
}

// A figure drawn from another's frames is redrawn only while it is on screen (and once when it comes into view):
// the first screen's frame rate is not spent on figures below it.
function whenVisible(node, onShow) {
  const state = { visible: false };
  new IntersectionObserver(entries => {
    const was = state.visible;
    state.visible = entries.some(e => e.isIntersecting);
    if (state.visible && !was) onShow();
  }).observe(node);
  return state;
}
