"""The server's /metrics (Prometheus text), read at an interval while the load runs.

Parsed with prometheus-client's own parser. Each scrape becomes one sample per metric name, summed over its
label sets (vLLM labels by engine and model); histograms keep only their _sum and _count. The counters that
say what the server did over the run are differences between the scrape before the load and the one after:

    preemptions        vllm:num_preemptions_total
    prompt_tokens      vllm:prompt_tokens_total
    generation_tokens  vllm:generation_tokens_total
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kvlab.bench.results import MetricSample

VLLM_COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
VLLM_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# Measuring must not slow what it measures: vLLM's API server answers /metrics on the event loop that takes in
# requests and streams tokens, and on a busy machine one scrape can take seconds (seen: 0.1 s asked, answers
# 2.5-5 s apart, requests let in one at a time). After a scrape that took t, the next waits at least 4 t, so
# scraping keeps to a fifth of the server's time.
SCRAPE_BACKOFF = 4.0
# A histogram's buckets and every metric's creation time say nothing a comparison uses.
_SKIPPED_SUFFIXES = ("_bucket", "_gbucket", "_created")


def parse_metrics(text: str) -> dict[str, float]:
    """{sample name: value summed over label sets}; raises ValueError if ``text`` is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == CACHE_CONFIG_INFO:
            continue  # its value is always 1: the configuration is in the labels
        for sample in family.samples:
            if sample.name.endswith(_SKIPPED_SUFFIXES):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def _label_value(text: str):
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_cache_config(text: str) -> dict | None:
    """The labels of vllm:cache_config_info (block_size, num_gpu_blocks, ... as numbers), None if absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name == CACHE_CONFIG_INFO and family.samples:
            labels = family.samples[0].labels
            return {name: _label_value(value) for name, value in sorted(labels.items())}
    return None


def is_vllm_metrics(values: dict[str, float]) -> bool:
    return all(name in values for name in VLLM_GAUGES)


class MetricsScraper:
    """Scrapes ``/metrics`` with ``client`` (an httpx.AsyncClient on the server) every ``interval`` seconds.

    ``clock()`` gives seconds since the bench started. A failed scrape is counted and skipped: the load goes on.
    """

    def __init__(self, client, interval: float, clock: Callable[[], float], timeout: float = 5.0):
        self.client = client
        self.interval = interval
        self.clock = clock
        self.timeout = timeout
        self.samples: list[MetricSample] = []
        self.first: dict[str, float] | None = None
        self.last: dict[str, float] | None = None
        self.num_errors = 0
        self.last_error = ""

    async def scrape(self, at: float | None = None) -> dict[str, float] | None:
        """One scrape, its samples stamped with ``at`` (default: now)."""
        try:
            response = await self.client.get("/metrics", timeout=self.timeout)
            response.raise_for_status()
            values = parse_metrics(response.text)
        except Exception as exc:  # noqa: BLE001 — any failure of one scrape only loses that scrape
            self.num_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        now = self.clock() if at is None else at
        self.samples.extend(MetricSample(now, name, value) for name, value in values.items())
        if self.first is None:
            self.first = values
        self.last = values
        return values

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape until ``stop`` is set, every ``interval`` seconds or, when the server is slow to answer,
        ``SCRAPE_BACKOFF`` times as long as the last scrape took."""
        while not stop.is_set():
            started = time.monotonic()
            await self.scrape()
            pause = max(self.interval, SCRAPE_BACKOFF * (time.monotonic() - started))
            try:
                await asyncio.wait_for(stop.wait(), pause)
            except TimeoutError:
                pass

    async def settle(self, num_generation_tokens: int = 0, max_wait: float = 10.0, pause: float = 0.2) -> None:
        """Scrape until the counters stop moving and count at least the ``num_generation_tokens`` the client
        received (at most ``max_wait`` s): the server records a step's counts just after sending its tokens, so
        the scrape right after the load may be a step behind, more on a busy machine."""
        deadline = time.monotonic() + max_wait
        previous = await self.scrape()
        if self.first is None or not all(name in self.first for name in VLLM_COUNTERS.values()):
            return  # no counters to wait for: the last scrape is the final one
        while time.monotonic() < deadline:
            await asyncio.sleep(pause)
            current = await self.scrape()
            if current is None or previous is None or self.first is None:
                previous = current
                continue
            name = VLLM_COUNTERS["generation_tokens"]
            caught_up = current.get(name, 0.0) - self.first.get(name, 0.0) >= num_generation_tokens
            if caught_up and all(current.get(n) == previous.get(n) for n in VLLM_COUNTERS.values()):
                return
            previous = current

    def counter_deltas(self) -> dict[str, float] | None:
        """What the server counted over the run (last scrape minus first), None without vLLM's counters."""
        if self.first is None or self.last is None:
            return None
        if not all(name in self.first and name in self.last for name in VLLM_COUNTERS.values()):
            return None
        return {key: int(self.last[name] - self.first[name]) for key, name in VLLM_COUNTERS.items()}
