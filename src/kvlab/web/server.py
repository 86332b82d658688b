"""The lab's server: one page, its static files, the calculator, and runs of kvlab's simulator streamed as frames.

    GET    /                              the page (static/index.html)
    GET    /static/...                    lab.js, lab.css (packaged; nothing from the network)
    GET    /api/catalog                   models, GPUs, workloads, strategies, limits, defaults, section 7's systems
    GET    /api/size?model=&gpu=&...      the calculator: kvlab.sizing's numbers, plus the workload's fit
    POST   /api/sessions                  start a grid or a race (JSON RunSpec) -> meta and its first frame
    GET    /api/sessions/{id}/stream      frames as server-sent events, ~30 a second, until done or closed
                                          (?until=T: the last frame is the one at T simulated seconds)
    POST   /api/sessions/{id}/step        one engine iteration -> a frame
    POST   /api/sessions/{id}/finish      run to the end -> the last frame, with the finish line
    POST   /api/sessions/{id}/seek?t=     run on to t simulated seconds after the first arrival -> that frame (never back)
    POST   /api/sessions/{id}/follow?id=  every frame from now on carries conversation id's block table
                                          -> the tables as they stand
    GET    /api/rates?model=&gpu=&...     each system's breaking point as the rate grows (kvlab.web.rates);
                                          &systems=a,b: those systems' only (the first screen's two)
    GET    /api/rates/at?rate=&...        every system's normalized latency at one rate
    POST   /api/vllm-log                  {"text": a vLLM startup log, "model"?: catalogue name} -> what it says
    DELETE /api/sessions/{id}

A user's mistake (KvlabError) is HTTP 400 with ``{"error": message}`` (a run the server does not hold: 404); the
page shows the message. The page asks
for refusals in the body instead (header ``X-Kvlab-Refusals: in-body``: HTTP 200 with ``{"error": message,
"refused": true}``), so that a refused value is one line beside its control and nothing in the browser's console
(a 4xx response is logged there as "Failed to load resource" whatever the page does with it). The simulator
runs in a worker thread so the event loop keeps serving; a session's lock serializes its requests. Bounds
(params.LIMITS): requests per run, blocks per grid, sessions alive, compute seconds per run.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kvlab import defaults
from kvlab.errors import KvlabError
from kvlab.web.params import (
    LIMITS,
    RunSpec,
    integer,
    json_body,
    known_only,
    number,
    parse_rate_setup,
    parse_run_spec,
    parse_speed,
    ranged,
    ranges,
    single_values,
    text,
)
from kvlab.web.rates import AXIS_OVER_CAPACITY, RateLab
from kvlab.web.session import Race, Session, setup_of

# Frames a stream aims for: above the 30 a grid needs to look fluid, so that the page's rate is set by what the
# machine manages rather than by this cap; simulated time does not depend on it.
FRAMES_PER_SECOND = 45
MAX_FRAME_GAP = 0.25  # seconds of wall time one frame may stand for
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]
REFUSALS_HEADER = "X-Kvlab-Refusals"  # "in-body": a refusal is answered 200 {"error", "refused": true} (the page)
DEFAULTS = {"model": defaults.MODEL, "gpu": defaults.GPU, "workload": defaults.WORKLOAD}


def refusals_in_body(request: Request) -> bool | str:
    """Whether the request asks for refusals in the body (REFUSALS_HEADER: in-body, in any letters, as HTTP header
    values are commonly matched); False without the header; for any other value, the line that says it was not
    read and what is valid (trial 52: IN-BODY and body silently got the 400 form)."""
    value = request.headers.get(REFUSALS_HEADER)
    if value is None:
        return False
    if value.strip().lower() == "in-body":
        return True
    return f"header {REFUSALS_HEADER}: {value[:40]!r} is not read; valid: in-body, for a refusal answered 200 with " \
        '"refused": true'


def static_dir() -> Path:
    return Path(str(resources.files("kvlab.web") / "static"))


def build_race(spec: RunSpec, max_pool_blocks: int = LIMITS["max_pool_blocks"]) -> Race:
    """kvlab's simulator, configured from the page's parameters: one Simulation per strategy, one workload."""
    from kvlab import service
    from kvlab.config import resolve
    from kvlab.web.calculator import catalogue_model
    from kvlab.workload import WORKLOADS

    catalogue_model(spec.model)  # a catalogue name, never a path or a Hugging Face id from a web page
    if spec.workload not in WORKLOADS:
        raise KvlabError(f"unknown workload {spec.workload!r}: not a named workload ({', '.join(WORKLOADS)})")
    # The same resolution and run service as `kvlab race`, so that the page and the command line agree.
    config = resolve(spec.options())
    strategies = service.strategies(spec.strategies, config)
    num_blocks = config.cache.num_gpu_blocks
    if num_blocks > max_pool_blocks:
        raise KvlabError(
            f"{spec.model} on {spec.gpu} gives {num_blocks:,} blocks of {spec.block_size}; the lab simulates at "
            f"most {max_pool_blocks:,}: pick a larger block size or set KV blocks"
        )
    _, sims = service.start(config, strategies)
    return Race(sims, setup={**setup_of(spec, config), "key": config.key})


def run_refusal(error: KvlabError, spec: RunSpec) -> dict:
    """A run the engine refused (a model its GPU cannot hold), in the page's words: the reason without the command
    line's flags, and what to change among section 2's and the race's controls (model, GPU), which have no
    utilization or context of their own (kvlab.web.refusal)."""
    from kvlab.config.options import OPTIONS
    from kvlab.web.refusal import refused_answer

    utilization = OPTIONS["gpu_memory_utilization"].default
    return refused_answer(error, model=spec.model, gpu=spec.gpu, concurrency=1, context_len=1,
                          gpu_memory_utilization=utilization, max_utilization=utilization,
                          parameters=RunSpec.__dataclass_fields__, held_is_enough=True)


SIZE_PARAMETERS = ("model", "gpu", "concurrency", "context_len", "gpu_memory_utilization", "max_model_len",
                   "quantization", "vllm_version")  # what /api/size reads; anything else is refused


def size_answer(params: dict, *, page: bool = False) -> dict:
    """The calculator: kvlab.sizing's forward question, and whether N conversations of L tokens fit. For the page
    (``page``), a refusal of the model, GPU or context is an answer: the reason, and what to change among the page's
    controls (kvlab.web.refusal), never a command-line flag. Where the weights fit but vLLM would still refuse to
    start (one max_model_len request's cache does not fit, as `kvlab size` says), the answer says so ("vllm_starts":
    false, "refusal") and what to change ("advice")."""
    from kvlab.validate import vllm_int
    from kvlab.web.calculator import answer
    from kvlab.web.refusal import in_parameters, refused_answer

    known_only(params, SIZE_PARAMETERS, " (the other sizing options, block_size or kv_cache_dtype say, are kvlab size's)")
    context = params.get("context_len")
    if isinstance(context, str) and context.strip() and not context.strip().isdigit():  # 8k, 8K: as kvlab size reads it
        params = {**params, "context_len": str(vllm_int(context, "context_len"))}
    asked = {
        "model": text(params, "model", DEFAULTS["model"]),
        "gpu": text(params, "gpu", DEFAULTS["gpu"]),
        # (in `kvlab size`'s ranges: web.params.ranged)
        "concurrency": ranged(params, "concurrency", 16),
        "context_len": ranged(params, "context_len", 2048),
        "gpu_memory_utilization": ranged(params, "gpu_memory_utilization", 0.9),
    }
    given = text(params, "max_model_len", "")
    max_model_len = vllm_int(given, "max_model_len") if given else None  # (as `kvlab size --max-model-len` reads it)
    rules = {key: text(params, key, "") or None for key in ("quantization", "vllm_version")}  # kvlab size's flags
    parameters = [name for name in SIZE_PARAMETERS if not (page and name == "max_model_len")]  # (the page sets none)
    refused = {**asked, "max_utilization": 1.0, "parameters": parameters, "max_model_len": max_model_len, "page": page}
    try:
        result = answer(**asked, **rules, max_model_len=max_model_len)
    except KvlabError as exc:
        if not page:
            error = in_parameters(exc, SIZE_PARAMETERS)
            if "Would fit: " in str(exc) and "Would fit: " not in str(error):  # (each remedy a flag it does not take:
                # the page's advice instead; trial 51b: llama-3.1-405b on a B200 was refused with no remedy at all)
                advice = refused_answer(exc, **refused)["advice"]
                error = KvlabError(f"{error}. Try: {'; '.join(advice)}") if advice else error
            raise error from None
        return {"model": asked["model"], "gpu": asked["gpu"], **refused_answer(exc, **refused)}
    if result["refusal"]:  # (trial 52: an answer where vLLM would not start carried no word of it)
        said = refused_answer(result["refusal"], **refused)
        result.update(refusal=said["error"], advice=said["advice"])
    return result


def explain_log(data) -> dict:
    """The paste box: a vLLM startup log read by kvlab's parser (the one `kvlab vllm log` uses) and explained."""
    import dataclasses

    from kvlab.catalog.config import looks_like_path
    from kvlab.vllm.log import as_read, explain_vllm_log, parse_vllm_log
    from kvlab.web.calculator import catalogue_model

    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise KvlabError('the log must be sent as {"text": "..."}')
    known_only(data, ("model", "text"))
    text = data["text"]
    if len(text) > LIMITS["max_log_chars"]:
        raise KvlabError(f"the log is {len(text):,} characters; at most {LIMITS['max_log_chars']:,} are read "
                         "(the startup part is enough)")
    model = data.get("model") or None
    if model is not None:
        model = catalogue_model(model).id  # a catalogue name, never a path or a Hugging Face id from a web page
    log = parse_vllm_log(text)
    if model is None and log.model and looks_like_path(log.model):
        # The log names a local folder; a page must not make the server read it: go by the catalogue only.
        log = dataclasses.replace(log, model=log.model.rstrip("/").split("/")[-1])
    explanation = explain_vllm_log(log, model=model, audience="page")
    return {"log": as_read(log, explanation).to_json(), "explain": explanation}


# The explanation is written for the command line (`kvlab vllm log --model NAME`); on the page the model is picked
# in the menu beside the box.
class NoSuchRun(KvlabError):
    """A session id the server does not hold (never made, ended or expired): HTTP 404, not 400."""


class Sessions:
    """The runs alive, at most ``max_sessions``; the least recently used goes first, idle ones expire."""

    def __init__(self, max_sessions: int, idle_seconds: float, max_compute_seconds: float):
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self.max_compute_seconds = max_compute_seconds
        self.by_id: dict[str, Session] = {}

    def add(self, session: Session) -> str:
        now = time.monotonic()
        for sid, s in list(self.by_id.items()):
            if now - s.last_used > self.idle_seconds:
                del self.by_id[sid]
        while len(self.by_id) >= self.max_sessions:
            oldest = min(self.by_id, key=lambda sid: self.by_id[sid].last_used)
            del self.by_id[oldest]
        sid = secrets.token_hex(8)
        self.by_id[sid] = session
        return sid

    def get(self, sid: str) -> Session:
        session = self.by_id.get(sid)
        if session is None:
            raise NoSuchRun(f"no run {sid!r}: it ended or expired; press reset to start a new one")
        return session

    def remove(self, sid: str) -> None:
        self.by_id.pop(sid, None)


def make_stream(sessions: Sessions, have_of):
    """The stream route's handler: frames as server-sent events until the run is done or a newer stream of it
    takes over."""

    async def stream(request: Request) -> Response:
        session = sessions.get(request.path_params["sid"])
        params = single_values(request.query_params, RUN_PARAMETERS["stream"])
        speed = parse_speed(params.get("speed"))
        until = params.get("until")
        hold = None if until in (None, "") else number(params, "until", 0.0, LIMITS["max_seek_seconds"], 0.0)
        have = have_of(params)
        interval = 1.0 / FRAMES_PER_SECOND
        session.stream_id += 1
        me = session.stream_id

        async def events():
            nonlocal have
            next_tick = last = time.monotonic()
            while session.stream_id == me:  # a newer stream of this run takes over
                # Simulated time follows wall time (x speed), whatever the frame rate the machine manages;
                # a stall (a slow frame) is not made up for in one leap of more than MAX_FRAME_GAP.
                now = time.monotonic()
                dt = speed * min(max(now - last, interval), MAX_FRAME_GAP)
                last = now
                try:
                    frame = await run_in_threadpool(session.advance, dt, have, hold)
                except KvlabError as exc:
                    yield f"event: error\ndata: {json.dumps({'error': str(exc)})}\n\n"
                    return
                have = frame["seq"]
                yield f"event: frame\ndata: {json.dumps(frame, separators=(',', ':'))}\n\n"
                if frame["done"] or frame.get("held"):
                    return
                next_tick += interval
                delay = next_tick - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    next_tick = time.monotonic()  # running behind: do not try to catch up in a burst

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return stream


# What each route that moves a run reads from its query; anything else is refused (params.known_only).
RUN_PARAMETERS = {"stream": ("speed", "until", "have"), "step": ("have",), "finish": ("have",), "seek": ("t", "have"),
                  "follow": ("id",), "delete": ()}


def have_of(params: dict) -> int | None:
    """The frame the page last applied (``have``), or None: the next frame is then a key frame."""
    if params.get("have") in (None, "", "-1"):
        return None
    return integer(params, "have", 0, 2**62, None)


def run_routes(sessions: Sessions, max_seek_seconds: float) -> list[Route]:
    """What moves a run, besides its stream: one iteration, to the end, on to a time; the conversation whose block
    table frames carry; and the end of the run."""

    def asked(request: Request, route: str) -> tuple[Session, dict]:
        return sessions.get(request.path_params["sid"]), single_values(request.query_params, RUN_PARAMETERS[route])

    async def step(request: Request) -> Response:
        session, params = asked(request, "step")
        return JSONResponse(await run_in_threadpool(session.step, have_of(params)))

    async def finish(request: Request) -> Response:
        session, params = asked(request, "finish")
        return JSONResponse(await run_in_threadpool(session.finish, have_of(params)))

    async def seek(request: Request) -> Response:
        session, params = asked(request, "seek")
        t = number(params, "t", 0.0, max_seek_seconds, None, unit="seconds")
        return JSONResponse(await run_in_threadpool(session.seek, t, have_of(params)))

    async def follow(request: Request) -> Response:
        session, params = asked(request, "follow")
        request_id = None if params.get("id") in (None, "") else integer(params, "id", 0, 2**31 - 1, None)
        return JSONResponse(await run_in_threadpool(session.follow, request_id))

    async def delete(request: Request) -> Response:
        single_values(request.query_params, RUN_PARAMETERS["delete"])
        sessions.remove(request.path_params["sid"])
        return JSONResponse({"ok": True})

    return [
        Route("/api/sessions/{sid}/step", step, methods=["POST"]),
        Route("/api/sessions/{sid}/finish", finish, methods=["POST"]),
        Route("/api/sessions/{sid}/seek", seek, methods=["POST"]),
        Route("/api/sessions/{sid}/follow", follow, methods=["POST"]),
        Route("/api/sessions/{sid}", delete, methods=["DELETE"]),
    ]


async def vllm_log(request: Request) -> Response:
    try:
        data = json_body(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise KvlabError('the log must be sent as JSON: {"text": "..."}') from None
    return JSONResponse(await run_in_threadpool(explain_log, data))


def rate_routes(rates: RateLab) -> list[Route]:
    """Section 7: each system's breaking point, and every system at one rate (kvlab.web.rates)."""

    async def breaking_points(request: Request) -> Response:
        from kvlab.web.params import parse_rate_systems

        params = single_values(request.query_params)
        setup = parse_rate_setup(params, also=("systems",), note=" (a rate is GET /api/rates/at's)")
        systems = parse_rate_systems(params.get("systems"))
        return JSONResponse(await _in_parameters(rates.breaking_points, setup, systems))

    async def rate_point(request: Request) -> Response:
        params = single_values(request.query_params)
        setup = parse_rate_setup(params)
        # One range for the rate, stated the same way as the page's box and slider: the least rate a run takes to
        # the chart's end (the page keeps its simulations within the chart). A rate that no chart takes is refused
        # before the chart's end is searched for (a minute, the first time a setup is asked).
        lo = LIMITS["min_rate"]
        if rates.axis_rps(setup) is None:
            chart = "the chart's end (GET /api/rates finds it for this setup)"
            _rate(params, lo, math.inf, chart)
        found = await _in_parameters(rates.breaking_points, setup)
        hi = found["axis_rps"]
        try:
            rate = _rate(params, lo, hi)
        except KvlabError as exc:
            raise KvlabError(f"{exc} (past {hi:g} req/s, at least {AXIS_OVER_CAPACITY:g} times the highest breaking "
                             "point, every system is overloaded, and the page keeps its simulations within the "
                             "chart)") from None
        return JSONResponse(await _in_parameters(rates.at, setup, rate))

    return [Route("/api/rates", breaking_points), Route("/api/rates/at", rate_point)]


async def _in_parameters(work, *args):
    """``work(*args)`` in a thread; an engine's refusal (worded for the command line: "Would fit:
    --tensor-parallel-size 2") in the rate endpoints' words (kvlab.web.refusal.in_parameters)."""
    from kvlab.web.params import RATE_SETUP_KEYS
    from kvlab.web.refusal import in_parameters

    try:
        return _json_numbers(await run_in_threadpool(work, *args))
    except KvlabError as exc:
        raise in_parameters(exc, (*RATE_SETUP_KEYS, "rate", "systems")) from None


def _json_numbers(value):
    """``value`` with every infinite or NaN float as null, which JSON can carry (a latency is infinite where every
    request was refused: a trace's requests longer than the model's max_model_len; trial 53b, a 500 before)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_numbers(v) for v in value]
    return value


def _rate(params: dict, lo: float, hi: float, upper: str | None = None) -> float:
    """The rate asked for, in [lo, hi] (``upper`` names hi where it is not known yet)."""
    from kvlab.validate import bounded_number
    from kvlab.web.params import required

    if params.get("rate") in (None, ""):
        raise required("rate", f"requests per second, from {lo:g} to {upper or format(hi, 'g')}")
    return float(bounded_number(params["rate"], "rate", lo, hi, upper=upper))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (a method a route does not take, a path that is no route) as JSON ``{"error"}``,
    as every other refusal of the lab is, in a line that says what would do."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 405:
        allowed = sorted(m.strip() for m in (exc.headers or {}).get("Allow", "").split(","))  # (Starlette's: a set's order)
        message = f"{request.method} {path} is not allowed; valid: {', '.join(allowed)}"
    elif exc.status_code == 404:
        message = f"{path} is not a page or route of the lab (its routes: docs/lab.md)"
    else:
        message = str(exc.detail)
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


def create_app(*, allowed_hosts: list[str] | None = None, limits: dict | None = None) -> Starlette:
    """The lab's ASGI app. ``allowed_hosts`` guards against DNS rebinding (a web page elsewhere pointing a name
    at 127.0.0.1); by default only loopback names are served."""
    lim = {**LIMITS, **(limits or {})}
    sessions = Sessions(lim["max_sessions"], lim["session_idle_seconds"], lim["max_compute_seconds"])
    static = static_dir()

    async def script(request: Request) -> Response:
        from kvlab.web.bundle import lab_js

        return Response(lab_js(), media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    async def index(request: Request) -> Response:
        return FileResponse(static / "index.html", headers={"Cache-Control": "no-cache"})

    async def catalog(request: Request) -> Response:
        from kvlab.paper import FIG1_PAPER, FIG2_PAPER
        from kvlab.web.calculator import catalog_listing

        listing = await run_in_threadpool(catalog_listing, DEFAULTS)
        # The paper's figures the page sets its own numbers beside (kvlab.paper, their one home).
        # Section 7's systems, and the two the first screen waits for (it asks /api/rates for those first).
        systems = {"all": list(RateLab.systems()), "opening": list(RateLab.opening_systems())}
        return JSONResponse({**listing, "limits": lim, "ranges": ranges(),  # (the calculator's: web.params.ranges)
                             "paper": {"figure1": FIG1_PAPER, "figure2": FIG2_PAPER}, "rate_systems": systems})

    async def size(request: Request) -> Response:
        page = refusals_in_body(request) is True
        return JSONResponse(await run_in_threadpool(lambda: size_answer(single_values(request.query_params), page=page)))

    async def create_session(request: Request) -> Response:
        try:
            data = json_body(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise KvlabError("the run's parameters are not valid JSON; send a JSON object") from None
        spec = parse_run_spec(data)
        try:
            race = await run_in_threadpool(build_race, spec, lim["max_pool_blocks"])
        except KvlabError as exc:
            if refusals_in_body(request) is not True:
                from kvlab.web.refusal import in_parameters

                raise in_parameters(exc, RunSpec.__dataclass_fields__) from None
            return JSONResponse(await run_in_threadpool(run_refusal, exc, spec))
        session = Session(race, spec, lim["max_compute_seconds"])
        sid = sessions.add(session)
        frame = await run_in_threadpool(session.frame, None)
        return JSONResponse({"session_id": sid, **race.meta(), "frame": frame, "spec": spec.__dict__})

    stream = make_stream(sessions, have_of)
    rates = RateLab()

    async def user_error(request: Request, exc: KvlabError) -> Response:
        in_body = refusals_in_body(request)
        if in_body is True:
            return JSONResponse({"error": str(exc), "refused": True})
        said = str(exc) if in_body is False else f"{exc} ({in_body})"
        return JSONResponse({"error": said}, status_code=404 if isinstance(exc, NoSuchRun) else 400)

    routes = [
        Route("/", index),
        Route("/api/catalog", catalog),
        Route("/api/size", size),
        Route("/api/sessions", create_session, methods=["POST"]),
        *rate_routes(rates),
        Route("/api/sessions/{sid}/stream", stream),
        *run_routes(sessions, lim["max_seek_seconds"]),
        Route("/api/vllm-log", vllm_log, methods=["POST"]),
        Route("/static/lab.js", script),  # (its parts, static/lab-*.js, joined: kvlab.web.bundle)
        Mount("/static", app=StaticFiles(directory=static), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or LOOPBACK_HOSTS)]
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={KvlabError: user_error, HTTPException: http_error})
    app.state.sessions = sessions
    app.state.rates = rates
    return app
