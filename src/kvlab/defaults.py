"""The defaults the command line, the lab and the --html export share: one place, so they tell one story.

The workload is the vLLM paper's setup (OPT-13B on one A100-40GB, the ShareGPT stand-in with Poisson arrivals) at
a rate that keeps a queue waiting under "reserve the max": there, a cache that holds 15.7K tokens fits about seven
2,048-token reservations, so memory decides how many are served at once and the queue is real. With pages the
same cache holds several times as many conversations, which is the lesson.
"""

from __future__ import annotations

from kvlab.strategies import LESSON_RACE

MODEL = "opt-13b"
GPU = "a100-40gb"
WORKLOAD = "paper-sharegpt"
RATE = 4.0  # requests per second, for workloads without arrival times
NUM_REQUESTS = 1000
SEED = 0
BLOCK_SIZE = 16

# The lesson's race: the 2x2 of batching x memory (named in kvlab.strategies, the one table of strategies).
RACE_STRATEGIES = LESSON_RACE
# The lab's grid tells the story in two runs: it opens on the first, then asks the reader to switch to the second.
# Only the memory strategy changes between them, so the difference on screen is the memory's.
STORY = ("continuous+max", "continuous+paged")
