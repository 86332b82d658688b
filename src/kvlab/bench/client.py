"""The load: a workload's requests sent to an OpenAI-compatible /v1/completions endpoint, every answer streamed.

Each request is sent at its arrival time (seconds after the bench started), or, with ``concurrency``, by N
clients in a closed loop (each sends the next request as soon as its previous one ended; arrival times are
then ignored). Every request ends in exactly one RequestResult:

    finished  the stream ended with [DONE] (or a finish_reason) and no error
    failed    an HTTP error status (429, 500, ...), an error in the stream, the connection dropped, or the run
              was interrupted (Ctrl-C) before it ended; ``error`` says which
    timeout   no complete answer within the request's timeout, or the run's time limit came first

What is sent (vLLM's extensions only to vLLM, which takes them):
    {"model", "prompt": token ids (or text of about prompt_len words), "max_tokens": the request's output
     length, "stream": true, "temperature": 0, "stream_options": {"include_usage": true},
     vLLM: "ignore_eos": true and "stream_options.continuous_usage_stats": true}

Tokens per chunk: vLLM's continuous usage stats give the running count of output tokens in every chunk;
otherwise a chunk's ``token_ids`` if it has them, otherwise one token per chunk with text (the usual
granularity of OpenAI-style streams, e.g. Ollama's). Where the final usage chunk's ``completion_tokens`` is larger
than that count, it wins: the tokens not seen are put in the last chunk that carried text.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvlab.bench.results import MetricSample, RequestResult
from kvlab.bench.server import hide_password
from kvlab.workload.request import Request

PROMPT_FORMATS = ("token-ids", "text")
# Short common English words, one token each with a leading space in the usual BPE vocabularies: a text
# prompt of n words is about n tokens.
_WORDS = ("the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "was", "with", "as", "at", "by", "be",
          "this", "from", "or", "not", "but", "are", "had", "his", "they", "you", "one", "all", "we", "can")


@dataclass(frozen=True)
class ClientConfig:
    url: str  # the server's base URL, without /v1
    model: str
    api_key: str | None = None
    prompt_format: str = "token-ids"
    ignore_eos: bool = True  # vLLM's: generate max_tokens whatever the model samples
    continuous_usage: bool = True  # vLLM's: the running token count in every chunk
    concurrency: int | None = None  # None: honour arrival times
    request_timeout: float = 120.0  # s from sending to the last token
    time_limit: float = 600.0  # s for the whole run
    scrape_interval: float | None = 0.5  # s between /metrics scrapes; None: no scraping


@dataclass(frozen=True)
class BenchRun:
    """What one run measured: a result per request (in request order), the scraped series, the server's counts."""

    results: list[RequestResult]
    samples: list[MetricSample]
    server_counters: dict | None
    makespan: float  # s from the first request's send to the last request's end (as kvlab run's, from the first arrival)
    stopped: str | None  # None, "interrupted" (Ctrl-C) or "time limit"
    num_scrape_errors: int = 0
    last_scrape_error: str = ""


def prompt_of(request: Request, prompt_format: str) -> list[int] | str:
    if prompt_format == "token-ids":
        from kvlab.vllm.job import prompt_token_ids

        return prompt_token_ids(request)
    offset = request.request_id * 7  # different requests start with different words: no shared prefix
    return " ".join(_WORDS[(offset + i) % len(_WORDS)] for i in range(request.prompt_len))


def request_body(request: Request, config: ClientConfig) -> dict:
    stream_options = {"include_usage": True}
    if config.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body = {
        "model": config.model,
        "prompt": prompt_of(request, config.prompt_format),
        "max_tokens": request.num_output_tokens,
        "stream": True,
        "temperature": 0.0,
        "stream_options": stream_options,
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


class StreamFailure(Exception):
    """The server answered, but not with a complete stream: the message is the reason, for the row."""


class _Stream:
    """One request in flight: what has been received so far."""

    def __init__(self, request: Request, send_time: float):
        self.request = request
        self.send_time = send_time
        self.times: list[float] = []
        self.counts: list[int] = []
        self.num_usage_tokens = 0  # the running count of continuous usage stats
        self.complete = False
        self.finish_reason: str | None = None  # the server's: "stop" (an end-of-sequence or stop string), "length"

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)

    def take(self, chunk: dict, now: float) -> None:
        """Count the tokens of one streamed chunk."""
        if not isinstance(chunk, dict):
            raise StreamFailure(self._malformed(f"a chunk that is a {type(chunk).__name__}, not a JSON object"))
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise StreamFailure(f"error in the stream after {self.num_tokens} tokens: {message}")
        choices = chunk.get("choices") or []
        usage = chunk.get("usage") or {}
        if not isinstance(choices, list):
            raise StreamFailure(self._malformed(f"'choices' is a {type(choices).__name__}, not a list"))
        if not isinstance(usage, dict):
            raise StreamFailure(self._malformed(f"'usage' is a {type(usage).__name__}, not an object"))
        if not choices:  # the final usage-only chunk: the server's count of the answer's tokens
            reported = usage.get("completion_tokens")
            if isinstance(reported, int) and self.counts and reported > self.num_tokens:
                # Chunks of text carried more than one token each (counted one a chunk): the server's count wins,
                # the tokens not seen put in the last chunk.
                self.counts[-1] += reported - self.num_tokens
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            raise StreamFailure(self._malformed(f"a choice that is a {type(choice).__name__}, not an object"))
        if isinstance(usage.get("completion_tokens"), int):
            num_new = usage["completion_tokens"] - self.num_usage_tokens
            self.num_usage_tokens = usage["completion_tokens"]
        elif isinstance(choice.get("token_ids"), list):
            num_new = len(choice["token_ids"])
        else:
            num_new = 1 if choice.get("text") else 0
        if num_new > 0:
            self.times.append(now)
            self.counts.append(num_new)
        if choice.get("finish_reason") is not None:
            self.complete = True
            self.finish_reason = str(choice["finish_reason"])

    def _malformed(self, what: str) -> str:
        return f"malformed stream after {self.num_tokens} tokens: {what} (not OpenAI's streaming format)"

    def result(self, status: str, error: str, end_time: float) -> RequestResult:
        r = self.request
        return RequestResult(
            request_id=r.request_id, arrival_time=r.arrival_time, prompt_len=r.prompt_len,
            requested_output_tokens=r.num_output_tokens, num_output_tokens=self.num_tokens, status=status,
            error=error, send_time=self.send_time, first_token_time=self.times[0] if self.times else None,
            finish_time=self.times[-1] if status == "finished" and self.times else end_time,
            token_times=tuple(self.times), token_counts=tuple(self.counts), finish_reason=self.finish_reason,
        )


def _http_error(response) -> str:
    text = response.text.strip()
    try:
        body = json.loads(text)
        error = body.get("error", body) if isinstance(body, dict) else body
        text = error.get("message", text) if isinstance(error, dict) else str(error)
    except ValueError:
        pass
    return f"HTTP {response.status_code} {response.reason_phrase}: {text[:200]}".rstrip(": ")


async def stream_one(client, request: Request, config: ClientConfig, state: _Stream, clock) -> None:
    """Send one request and read its stream into ``state``; raises on anything but a complete answer."""
    async with client.stream("POST", "/v1/completions", json=request_body(request, config)) as response:
        if response.status_code != 200:
            await response.aread()
            raise StreamFailure(_http_error(response))
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                state.complete = True
                return
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise StreamFailure(f"not JSON in the stream after {state.num_tokens} tokens: {data[:80]!r}") from exc
            state.take(chunk, clock())
    if not state.complete:
        raise StreamFailure(f"the stream ended without [DONE] after {state.num_tokens} of "
                            f"{request.num_output_tokens} tokens")


class _Load:
    """Sends the requests and keeps each one's result, exactly once."""

    def __init__(self, client, requests: Sequence[Request], config: ClientConfig, clock: Callable[[], float],
                 on_result: Callable[[RequestResult], None] | None):
        self.client = client
        self.requests = list(requests)
        self.config = config
        self.clock = clock
        self.on_result = on_result
        self.results: dict[int, RequestResult] = {}
        self.stopped: str | None = None

    def record(self, result: RequestResult) -> None:
        if result.request_id in self.results:
            raise RuntimeError(f"request {result.request_id} was accounted for twice")  # a bug in the client
        self.results[result.request_id] = result
        if self.on_result is not None:
            self.on_result(result)

    def _stop_reason(self, num_tokens: int) -> tuple[str, str]:
        if self.stopped == "time limit":
            return "timeout", (f"the run's time limit of {self.config.time_limit:g} s (--time-limit) came first, "
                               f"after {num_tokens} tokens")
        return "failed", f"interrupted (Ctrl-C) after {num_tokens} tokens"

    async def serve(self, request: Request) -> None:
        import httpx

        state = _Stream(request, self.clock())
        timeout = self.config.request_timeout
        try:
            async with asyncio.timeout(timeout):
                await stream_one(self.client, request, self.config, state, self.clock)
            status, error = "finished", ""
        except (TimeoutError, httpx.TimeoutException):
            status, error = "timeout", (f"no complete answer within {timeout:g} s (--timeout): {state.num_tokens} "
                                        f"of {request.num_output_tokens} tokens")
        except StreamFailure as exc:
            status, error = "failed", str(exc)
        except httpx.HTTPError as exc:
            status, error = "failed", (f"connection failed after {state.num_tokens} of {request.num_output_tokens} "
                                       f"tokens: {type(exc).__name__}: {exc}")
        except (TypeError, KeyError, AttributeError, ValueError) as exc:  # a chunk not shaped like OpenAI's
            status, error = "failed", (f"malformed stream after {state.num_tokens} tokens: a chunk not shaped like "
                                       f"OpenAI's ({type(exc).__name__} {exc})")
        except asyncio.CancelledError:
            status, error = self._stop_reason(state.num_tokens)
        self.record(state.result(status, hide_password(error, self.config.url), self.clock()))

    async def at_arrival(self, request: Request) -> None:
        delay = request.arrival_time - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        await self.serve(request)

    def tasks(self) -> list[asyncio.Task]:
        if self.config.concurrency is None:
            return [asyncio.create_task(self.at_arrival(r)) for r in self.requests]
        pending = iter(self.requests)

        async def one_client() -> None:
            for request in pending:  # one iterator shared by the clients: each request is taken once
                await self.serve(request)

        return [asyncio.create_task(one_client()) for _ in range(min(self.config.concurrency, len(self.requests)))]

    def unsent(self) -> None:
        """Results for the requests the run stopped before sending."""
        reason = (f"the run's time limit of {self.config.time_limit:g} s (--time-limit) came first"
                  if self.stopped == "time limit" else "interrupted (Ctrl-C)")
        status = "timeout" if self.stopped == "time limit" else "failed"
        for r in self.requests:
            if r.request_id not in self.results:
                self.record(RequestResult(r.request_id, r.arrival_time, r.prompt_len, r.num_output_tokens, 0,
                                          status, f"not sent: {reason}"))


async def run_load(requests: Sequence[Request], config: ClientConfig, *, stop: asyncio.Event | None = None,
                   on_result: Callable[[RequestResult], None] | None = None) -> BenchRun:
    """Send ``requests`` to the server, scraping /metrics meanwhile; returns when every request has ended,
    ``stop`` is set, or the time limit is reached (then the rest are cancelled and kept, marked)."""
    import httpx

    from kvlab.bench.scrape import MetricsScraper

    stop = stop if stop is not None else asyncio.Event()
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    # One bound for every wait of a request, connecting included: a busy server may take seconds to accept a
    # connection (the wait is part of what the bench measures, and an unreachable server was refused earlier).
    timeout = httpx.Timeout(config.request_timeout)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    async with httpx.AsyncClient(base_url=config.url, headers=headers, timeout=timeout, limits=limits) as client:
        scraper = None
        if config.scrape_interval is not None:
            scraper = MetricsScraper(client, config.scrape_interval, clock)
            await scraper.scrape(at=0.0)  # the counters before any load
        start = time.perf_counter()  # arrival times count from here
        load = _Load(client, requests, config, clock, on_result)
        tasks = load.tasks()
        scraping_done = asyncio.Event()
        scraping = asyncio.create_task(scraper.run(scraping_done)) if scraper is not None else None
        all_done = asyncio.create_task(asyncio.wait(tasks)) if tasks else None
        stopping = asyncio.create_task(stop.wait())
        waited = [t for t in (all_done, stopping) if t is not None]
        await asyncio.wait(waited, timeout=config.time_limit, return_when=asyncio.FIRST_COMPLETED)
        if all_done is not None and not all_done.done():
            load.stopped = "interrupted" if stop.is_set() else "time limit"
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            all_done.cancel()
        stopping.cancel()
        load.unsent()
        # From the first send, as kvlab run counts from the first arrival: the same throughput on both sides.
        first_send = min((r.send_time for r in load.results.values() if r.send_time is not None), default=0.0)
        makespan = max((r.finish_time - first_send for r in load.results.values() if r.finish_time is not None),
                       default=0.0)
        if scraper is not None and scraping is not None:
            scraping_done.set()
            await scraping
            await scraper.settle(sum(r.num_output_tokens for r in load.results.values()))
    return BenchRun(
        results=[load.results[r.request_id] for r in requests],
        samples=scraper.samples if scraper is not None else [],
        server_counters=scraper.counter_deltas() if scraper is not None else None,
        makespan=makespan,
        stopped=load.stopped,
        num_scrape_errors=scraper.num_errors if scraper is not None else 0,
        last_scrape_error=hide_password(scraper.last_error, config.url) if scraper is not None else "",
    )


def run_bench(requests: Sequence[Request], config: ClientConfig,
              on_result: Callable[[RequestResult], None] | None = None) -> BenchRun:
    """``run_load`` in its own event loop, Ctrl-C (SIGINT) turned into a clean stop that keeps every row."""

    async def main() -> BenchRun:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, stop.set)
            handled = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            handled = False
        try:
            return await run_load(requests, config, stop=stop, on_result=on_result)
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())
