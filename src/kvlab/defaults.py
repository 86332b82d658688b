"""The defaults the command line, the lab and the --html export share: one place, so they tell one story.

The workload is the vLLM paper's setup (OPT-13B on one A100-40GB, the ShareGPT stand-in with Poisson arrivals) at
a rate that keeps a queue waiting under "reserve the max": there, a cache that holds 15.7K tokens fits about seven
2,048-token reservations, so memory decides how many are served at once and the queue is real. With pages the
same cache holds several times as many conversations, which is the lesson.
"""

from __future__ import annotations

from kvlab.config.options import DEFAULT_NUM_REQUESTS, DEFAULT_RATE, OPTIONS
from kvlab.strategies import LESSON_RACE

# The options' own defaults (kvlab/config/options.py, where each is declared).
MODEL = OPTIONS["model"].default
GPU = OPTIONS["gpu"].default
WORKLOAD = OPTIONS["workload"].default
RATE = DEFAULT_RATE  # requests per second, for workloads without arrival times
NUM_REQUESTS = DEFAULT_NUM_REQUESTS
SEED = OPTIONS["seed"].default
BLOCK_SIZE = OPTIONS["block_size"].default

# `kvlab capacity`'s search: its first guess (--rate), its bisection's stop (--rtol) and where it stops doubling
# (--max-rate). The lab's rate section searches with the same, so that its breaking points are the command's.
CAPACITY_FIRST_RATE = 1.0  # req/s
CAPACITY_RTOL = 0.05
CAPACITY_MAX_RATE = 1000.0  # req/s

# The lesson's race: the 2x2 of batching x memory (named in kvlab.strategies, the one table of strategies).
RACE_STRATEGIES = LESSON_RACE
# The lab's grid tells the story in two runs: it opens on the first, then asks the reader to switch to the second.
# Only the memory strategy changes between them, so the difference on screen is the memory's.
STORY = ("continuous+max", "continuous+paged")
