"""lab.js: the page's script, kept as one file per figure or section (web/static/lab-*.js) and shipped as one.

The parts are plain script text that share one scope: ``lab_js()`` joins them, in PARTS' order, inside one
function, so the server's ``/static/lab.js`` and the ``--html`` export's inlined script are the same text, with
nothing to build and nothing fetched but the page's own origin. A part may use any name another part declares at
run time; at load time only what an earlier part declared (PARTS is in that order: colours before the grid that
paints with them, the shared player before the figures that extend it, boot last).
"""

from __future__ import annotations

from importlib import resources

PARTS = (
    "lab-colours.js",  # the memory states' pixels; frames on the wire
    "lab-grid.js",  # GridView, legends, the share bar
    "lab-format.js",  # numbers in words, the API and its refusals, checked input
    "lab-quiz.js",  # section 8's questions (facts noted by the grid's player)
    "lab-words.js",  # a run in words: the setup fields the prose names, the strategies' names and colours
    "lab-player.js",  # the shared player: frames applied, text written, transport
    "lab-panel.js",  # a player's panels: views, big numbers, bar, seats, note, counters (Player's methods)
    "lab-finish.js",  # a player's finish line: the chart and the table at the end (Player's methods)
    "lab-live.js",  # a run live from the server; the finish table
    "lab-replay.js",  # a recorded run (the --html export)
    "lab-hero.js",  # the first figure
    "lab-one.js",  # 1. one conversation
    "lab-table.js",  # 3. the block table
    "lab-batching.js",  # 4. why batching more is faster
    "lab-evictions.js",  # 5. evictions
    "lab-story.js",  # 2. the story on the grid
    "lab-calculator.js",  # 9. the calculator, 10. the bridge to vLLM
    "lab-rates.js",  # 7. where each strategy breaks as the rate grows
    "lab-boot.js",  # the catalogue, the players, ready
)

HEAD = """/* kvlab lab: draws the frames kvlab's simulator sends (live, from the server) or replays a recorded frame log
 * (the --html export). Nothing here simulates: every number on the page comes from a frame or from the server,
 * and every panel's text is written from one frame at a time. No dependencies, no network beyond the page's own
 * origin. Joined from web/static/lab-*.js by kvlab.web.bundle. */
"use strict";
(function () {
"""
TAIL = "\n})();\n"


def lab_js() -> str:
    """The page's script: every part, in order, in one scope."""
    static = resources.files("kvlab.web") / "static"
    return HEAD + "\n".join((static / name).read_text(encoding="utf-8") for name in PARTS) + TAIL
