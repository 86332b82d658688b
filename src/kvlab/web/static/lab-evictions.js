/* Section 5: when pages run out. A part of lab.js: kvlab.web.bundle joins the parts, in order, into one script, so
 * every name here is shared with the other parts. */

// ---------------------------------------------------------------- 5. evictions
function setupEvictions(ev) {
  const caption = document.getElementById("evictions-caption");
  ev.onRender = frame => {
    const g = ev.panels[0] && ev.panels[0].last;
    if (!g) return;
    const c = g.counters, n = g.note || {};
    let text;
    if (!c.num_preemptions) text = "No eviction yet: press play.";
    else {
      text = `So far ${plural(c.num_preemptions, "eviction")}. The engine has computed ` +
        `${plural(c.num_recomputed_tokens, "token")} a second time for conversations that came back` +
        (n.tokens_to_recompute ? `, and ${nf0.format(n.tokens_to_recompute)} more wait in the queue` : "") +
        `; meanwhile it generated ${plural(c.num_output_tokens, "answer token")}. That work is what an eviction ` +
        `costs: time. Nothing is lost: ${nf0.format(c.num_finished)} served so far, none failed.`;
    }
    setText(caption, text);
  };
}
