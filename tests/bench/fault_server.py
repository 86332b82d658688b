"""A small OpenAI-style completions server on 127.0.0.1 that misbehaves on demand, for the faults a real
server cannot be made to produce: what a request gets is chosen by its max_tokens (FAULTS), so a workload
file's output lengths script the faults.

It streams like an OpenAI server that is not vLLM: one token per chunk with text, a final usage chunk,
``data: [DONE]``. It records every request it received and how it ended (``received``, ``completed``) and
the largest number of requests it had open at once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

DROP, HTTP_500, STALL, HTTP_429, STREAM_ERROR, MALFORMED = 7, 5, 9, 4, 6, 8
FAULTS = {DROP: "drop the connection after 3 tokens", HTTP_500: "HTTP 500", STALL: "stall after 2 tokens",
          HTTP_429: "HTTP 429", STREAM_ERROR: "an error object in the stream after 1 token",
          MALFORMED: "a chunk whose choices are not a list"}

FOREIGN_METRICS = """# HELP http_requests_total Requests served.
# TYPE http_requests_total counter
http_requests_total{path="/v1/completions"} 3.0
"""


@dataclass
class FaultState:
    token_interval: float = 0.005  # s between streamed tokens
    metrics: str = "none"  # none (404) | foreign (Prometheus text, not vLLM's)
    metrics_delay: float = 0.0  # s each /metrics answer takes
    metrics_times: list[float] = field(default_factory=list)  # when each /metrics request came (monotonic)
    openai: bool = True  # False: /v1/models answers with an HTML page
    max_tokens_cap: int | None = None  # the server's own cap: longer answers stop there, finish_reason "length"
    tokens_per_chunk: int = 1  # tokens each text chunk carries (the client, counting chunks, sees fewer)
    eos_after: int | None = None  # longer answers stop there at an "end-of-sequence token", finish_reason "stop"
    max_model_len: int | None = None  # published in /v1/models, as vLLM does (None: not published)
    received: list[dict] = field(default_factory=list)  # request bodies, in arrival order
    headers: list[dict] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)  # max_tokens of the streams sent whole
    num_open: int = 0
    max_open: int = 0


def _chunk(text: str, finish_reason: str | None = None, usage: dict | None = None) -> str:
    body = {"id": "cmpl-fault", "object": "text_completion", "model": "fault-model",
            "choices": [{"index": 0, "text": text, "finish_reason": finish_reason}] if text or finish_reason else []}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


def make_app(state: FaultState) -> Starlette:
    async def models(request: Request) -> Response:
        if not state.openai:
            return HTMLResponse("<html><body>Welcome to nginx!</body></html>")
        entry = {"id": "fault-model", "object": "model"}
        if state.max_model_len is not None:
            entry["max_model_len"] = state.max_model_len
        return JSONResponse({"object": "list", "data": [entry]})

    async def metrics(request: Request) -> Response:
        state.metrics_times.append(time.monotonic())
        if state.metrics_delay:
            await asyncio.sleep(state.metrics_delay)
        if state.metrics == "foreign":
            return PlainTextResponse(FOREIGN_METRICS)
        return PlainTextResponse("not found", status_code=404)

    async def completions(request: Request) -> Response:
        body = await request.json()
        state.received.append(body)
        state.headers.append(dict(request.headers))
        max_tokens = body["max_tokens"]
        if max_tokens == HTTP_500:
            return JSONResponse({"error": {"message": "internal error (injected)"}}, status_code=500)
        if max_tokens == HTTP_429:
            return JSONResponse({"error": {"message": "rate limited (injected)"}}, status_code=429)
        return StreamingResponse(_stream(max_tokens), media_type="text/event-stream")

    async def _stream(max_tokens: int):
        state.num_open += 1
        state.max_open = max(state.max_open, state.num_open)
        try:
            num_tokens, reason = max_tokens, "length"
            if state.eos_after is not None and state.eos_after < num_tokens:
                num_tokens, reason = state.eos_after, "stop"
            if state.max_tokens_cap is not None and state.max_tokens_cap < num_tokens:
                num_tokens, reason = state.max_tokens_cap, "length"
            num_chunks = -(-num_tokens // state.tokens_per_chunk)
            for i in range(num_chunks):
                if max_tokens == DROP and i == 3:
                    raise ConnectionResetError("connection dropped (injected)")
                if max_tokens == STALL and i == 2:
                    await asyncio.sleep(3600)
                if max_tokens == MALFORMED:
                    yield f"data: {json.dumps({'choices': {'text': 'x'}})}\n\n"
                    return
                if max_tokens == STREAM_ERROR and i == 1:
                    yield f"data: {json.dumps({'error': {'message': 'engine died (injected)'}})}\n\n"
                    return
                await asyncio.sleep(state.token_interval)
                yield _chunk(" tok" * state.tokens_per_chunk, reason if i == num_chunks - 1 else None)
            yield _chunk("", usage={"prompt_tokens": 0, "completion_tokens": num_tokens})
            yield "data: [DONE]\n\n"
            state.completed.append(max_tokens)
        finally:
            state.num_open -= 1

    return Starlette(routes=[Route("/v1/models", models), Route("/metrics", metrics),
                             Route("/v1/completions", completions, methods=["POST"])])


class FaultServer:
    """The app under uvicorn in a thread, on 127.0.0.1 and a free port."""

    def __init__(self, state: FaultState | None = None):
        import uvicorn
        from vllm_server import free_port

        self.state = state or FaultState()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(make_app(self.state), host="127.0.0.1", port=self.port, log_level="critical",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fault server did not start within 10 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
