"""inference-perf's ``shared_prefix`` workload with its staged constant-rate load, as kvlab requests.

inference-perf (github.com/kubernetes-sigs/inference-perf, inference_perf/datagen/shared_prefix_datagen.py) builds
``num_groups`` system prompts of ``system_prompt_len`` tokens, each shared by ``num_prompts_per_group`` users who
each have a question of ``question_len`` tokens; every request asks for exactly ``output_len`` tokens (ignore_eos).
Request i goes to user i mod (groups x users), so each user's prompt comes back every groups x users requests:

    user u = i mod N,  N = num_groups x num_prompts_per_group;   group g = u // num_prompts_per_group
    prompt  = [system prompt g: system_prompt_len] [question u: question_len + prompt_overhead_tokens]

The load (``load.type: constant``) runs its stages one after the other: stage k sends rate_k x duration_k requests,
starting where stage k - 1 ended. inference-perf does not space them evenly: its ConstantLoadTimer
(inference_perf/loadgen/load_timer.py, since August 2025) draws rate_k x duration_k gaps from an exponential of mean
1 / rate_k with an unseeded numpy generator and scales them to sum to duration_k, so its "constant" stage is Poisson
arrivals held to their count. kvlab replays that draw by default (``arrival_times(spec, seed=S)``, S = DEFAULT_SEED
unless given: the same S gives the same times; the real run's own draw is not known); ``seed=None`` spaces them evenly
at 1 / rate_k instead (kvlab's replay before 7 December, kept for comparison).

Content goes through kvlab's prefix hashes (``Request.prefix_hashes``, 16-token chunks as in
kvlab.workload.sessions): a chunk wholly inside a system prompt is named by its group, every other chunk by its
user, so users of a group share the system prompt's blocks and a user's later requests find its whole prompt
cached (but the last token, as vLLM never caches a whole prompt) where its earlier one left it.

Multi-turn (``enable_multi_turn_chat``): inference-perf serialises a user's rounds. A request's body is built under
its user session's lock (inference_perf/apis/user_session.py: ``get_context`` waits, FIFO, while the user's previous
round is in flight; ``update_context`` releases it when that answer is in), and the client's timer starts once the
body is built, so a round sent while the user's previous answer streams is held, unmeasured, until that answer is
in: request i is sent at max(its scheduled time, the client's end of request i - N) (``closed_loop_send_times``),
which caps the requests in flight at N users. The simulation cannot know an answer's end before it runs it, so a
replay finds these send times as a fixed point (kvlab/cost/fit.py). inference-perf's source also grows a session's
context round by round; the runs this module replays measured prompts 27-48 tokens longer than system + question
(the calibration set's README), not a growing context, so each round is the same prompt. ``prompt_overhead_tokens``
adds those tokens (tokenizer round trip, BOS) to each question. inference-perf's random assignment of system prompts to users is
replaced by the fixed one above (the same sharing: each group's prompt serves exactly its users).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload.table import LengthTable, sample_table

CHUNK_LEN = 16  # tokens per content id (as kvlab.workload.sessions: every block size kvlab takes is a multiple)
SUFFIXES = (".yaml", ".yml")
# inference-perf's own names and the calibration set's (trainval.json's ``workload``), for each field.
_ALIASES = {
    "num_groups": ("num_groups", "num_unique_system_prompts"),
    "num_prompts_per_group": ("num_prompts_per_group", "num_users_per_system_prompt"),
    "system_prompt_len": ("system_prompt_len",),
    "question_len": ("question_len",),
    "output_len": ("output_len",),
}
# The other keys inference-perf's config takes (inference_perf/config.py: SharedPrefix, LoadConfig): accepted, and
# ignored by kvlab (it replays fixed lengths, its own seed, and the load's times, not its client's machinery).
# The draw of inference-perf's constant timer a replay takes unless told (arrival_times; None: evenly spaced).
DEFAULT_SEED = 0
_SHARED_PREFIX_OTHER = ("enable_multi_turn_chat", "seed", "question_distribution", "output_distribution", "multimodal")
_LOAD_KEYS = ("type", "stages", "interval", "sweep", "num_workers", "worker_max_concurrency",
              "worker_max_tcp_connections", "trace", "circuit_breakers", "request_timeout", "lora_traffic_split",
              "base_seed")


@dataclass(frozen=True, slots=True)
class Stage:
    rate: float  # requests per second
    duration: float  # seconds

    @property
    def num_requests(self) -> int:
        return round(self.rate * self.duration)


@dataclass(frozen=True, slots=True)
class SharedPrefixSpec:
    """One inference-perf shared_prefix configuration with its load stages (module doc)."""

    num_groups: int
    num_prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int
    stages: tuple[Stage, ...]
    enable_multi_turn_chat: bool = False
    prompt_overhead_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("num_groups", "num_prompts_per_group", "question_len", "output_len"):
            value = getattr(self, name)
            if value < 1:
                raise KvlabError(f"shared_prefix: {name} = {value} must be a whole number >= 1")
        for name in ("system_prompt_len", "prompt_overhead_tokens"):
            if getattr(self, name) < 0:
                raise KvlabError(f"shared_prefix: {name} = {getattr(self, name)} must be >= 0")
        if not self.stages:
            raise KvlabError("load: no stages; valid: stages: [{rate: R, duration: S}, ...]")
        for k, stage in enumerate(self.stages):
            if not (math.isfinite(stage.rate) and stage.rate > 0 and math.isfinite(stage.duration)
                    and stage.duration > 0 and stage.num_requests >= 1):
                raise KvlabError(f"load: stage {k} (rate {stage.rate!r}, duration {stage.duration!r}) "
                                 "sends no request; valid: rate > 0 req/s and duration > 0 s with rate x duration >= 1")

    @property
    def num_users(self) -> int:
        return self.num_groups * self.num_prompts_per_group

    @property
    def prompt_len(self) -> int:
        return self.system_prompt_len + self.question_len + self.prompt_overhead_tokens

    @property
    def num_requests(self) -> int:
        return sum(stage.num_requests for stage in self.stages)

    @property
    def stage_starts(self) -> tuple[float, ...]:
        """Where each stage begins, in seconds from the first request."""
        starts, t = [], 0.0
        for stage in self.stages:
            starts.append(t)
            t += stage.duration
        return tuple(starts)


def arrival_times(spec: SharedPrefixSpec, limit: int | None = None, seed: int | None = DEFAULT_SEED) -> np.ndarray:
    """Stage k's rate_k x duration_k requests (constant load) as inference-perf's constant timer sends them (module
    doc): the gaps between them drawn from an exponential of mean 1 / rate_k (numpy's default_rng((seed, k))) and
    scaled to sum to duration_k, the stage's first request at its start; with ``limit`` the first ``limit`` of them
    only. ``seed=None``: evenly spaced instead, at start_k + j / rate_k."""
    parts, left = [], spec.num_requests if limit is None else max(0, int(limit))
    for k, (start, stage) in enumerate(zip(spec.stage_starts, spec.stages)):
        num = min(stage.num_requests, left)
        parts.append(start + (np.arange(num) / stage.rate if seed is None else _drawn_offsets(stage, k, int(seed), num)))
        left -= num
        if left <= 0:
            break
    return np.concatenate(parts)


BLOCK = 1 << 20  # (a drawn stage's gaps in blocks of this many: only the blocks a limit keeps are drawn)


def _drawn_offsets(stage: Stage, k: int, seed: int, num: int) -> np.ndarray:
    """The first ``num`` of stage k's drawn arrivals, from its start (arrival_times). rate x duration exponential gaps
    of mean 1 / rate, scaled to sum to the duration: drawn a block of BLOCK at a time, each block's sum first (a
    gamma: the sum of its exponentials) and its gaps as exponentials scaled to that sum (which, given their sum, is
    how independent exponentials are spread), so the total is known without drawing every gap, and the first
    requests are the same whether or not the rest are built."""
    n = stage.num_requests
    sizes = np.full(-(-n // BLOCK), BLOCK, dtype=np.int64)
    sizes[-1] = n - BLOCK * (len(sizes) - 1)
    sums = np.random.default_rng((seed, k)).gamma(sizes.astype(float), 1.0 / stage.rate)
    scale = stage.duration / sums.sum()
    gaps = [np.zeros(0)]
    for b in range(-(-num // BLOCK)):
        draw = np.random.default_rng((seed, k, b)).exponential(1.0, int(sizes[b]))
        gaps.append(draw * (sums[b] * scale / draw.sum()))
    gaps_all = np.concatenate(gaps)
    return np.concatenate(([0.0], np.cumsum(gaps_all[1:])))[:num]


def requests_before(spec: SharedPrefixSpec, until: float, seed: int | None = DEFAULT_SEED) -> int:
    """At least as many of the configuration's requests as arrive before ``until`` seconds (arrival_times, without
    building them; the caller cuts its arrivals at ``until`` itself): evenly spaced (``seed=None``), those before it
    and one more a stage where rounding could leave one out; drawn, every request of each stage that starts before it
    (a drawn stage's count by a time is not bounded by its rate)."""
    count = 0
    for start, stage in zip(spec.stage_starts, spec.stages):
        if until <= start:
            break
        ahead = stage.num_requests if seed is not None else math.ceil((until - start) * stage.rate) + 1
        count += min(stage.num_requests, ahead)
    return count


def closed_loop_send_times(spec: SharedPrefixSpec, scheduled: np.ndarray, client_end: np.ndarray) -> np.ndarray:
    """When each request is sent under multi-turn serialisation (module doc): request i (arrival order, user
    i mod N) at max(scheduled[i], client_end[i - N]), N the users; ``client_end``: when each request's answer was
    in at the client. Without multi-turn, the scheduled times."""
    scheduled = np.asarray(scheduled, dtype=float)
    if not spec.enable_multi_turn_chat:
        return scheduled
    n = spec.num_users
    send = scheduled.copy()
    send[n:] = np.maximum(scheduled[n:], np.asarray(client_end, dtype=float)[:-n])
    return send


def stage_of(spec: SharedPrefixSpec, times) -> np.ndarray:
    """The stage (from 0) each arrival time falls in."""
    return np.searchsorted(np.array(spec.stage_starts[1:]), np.asarray(times, dtype=float), side="right")


def user_prefix_ids(spec: SharedPrefixSpec, user: int) -> tuple[int, ...]:
    """The content ids of a user's prompt, one per CHUNK_LEN tokens: its group's system prompt (ids 0 .. groups - 1)
    where a chunk lies wholly inside it, the user's own id (groups + user) elsewhere."""
    group = user // spec.num_prompts_per_group
    num_chunks = -(-spec.prompt_len // CHUNK_LEN)
    num_system_chunks = spec.system_prompt_len // CHUNK_LEN
    return (group,) * num_system_chunks + (spec.num_groups + user,) * (num_chunks - num_system_chunks)


def shared_prefix_table(spec: SharedPrefixSpec, repeat_questions: bool = True, limit: int | None = None,
                        seed: int | None = DEFAULT_SEED) -> LengthTable:
    """Every request of the configuration (the first ``limit``), in arrival order, with its arrival time and content
    ids.

    ``repeat_questions=False``: each request's question is its own (only system prompts are shared). ``seed``:
    the draw of inference-perf's constant timer (arrival_times; None: evenly spaced)."""
    times = arrival_times(spec, limit, seed)
    num = len(times)
    if not repeat_questions:
        shared = spec.system_prompt_len // CHUNK_LEN
        own = -(-spec.prompt_len // CHUNK_LEN) - shared
        return LengthTable(
            prompt_len=np.full(num, spec.prompt_len, dtype=np.int64),
            output_len=np.full(num, spec.output_len, dtype=np.int64), arrival_time=times,
            prefix_hashes=tuple((i % spec.num_users // spec.num_prompts_per_group,) * shared
                                + (spec.num_groups + i,) * own for i in range(num)),
            prefix_chunk_len=CHUNK_LEN)
    ids = [user_prefix_ids(spec, u) for u in range(spec.num_users)]
    return LengthTable(
        prompt_len=np.full(num, spec.prompt_len, dtype=np.int64),
        output_len=np.full(num, spec.output_len, dtype=np.int64),
        arrival_time=times,
        prefix_hashes=tuple(ids[i % spec.num_users] for i in range(num)),
        prefix_chunk_len=CHUNK_LEN,
    )


class _Plain(str):
    """An unquoted scalar that kvlab's decimal YAML loader (kvlab.validate.decimal_yaml_loader) keeps as text where
    YAML 1.1 may read a number (010, 0x10, 1.5e+3, 1e3): read as inference-perf reads it (as_read), a quoted one as
    the text it is."""


def _loader():
    """kvlab's decimal YAML loader, telling an unquoted scalar (_Plain) from a quoted one: inference-perf reads the
    file with PyYAML's safe_load, where '010' is the text 010 and 010 is octal 8."""
    from kvlab.validate import decimal_yaml_loader

    class InferencePerfLoader(decimal_yaml_loader()):  # type: ignore[misc]
        pass

    def text(loader, node):
        value = loader.construct_scalar(node)
        return _Plain(value) if node.style is None and value[:1] in "+-.0123456789" else value

    InferencePerfLoader.add_constructor("tag:yaml.org,2002:str", text)
    return InferencePerfLoader


def as_read(value: Any) -> Any:
    """A number's value as inference-perf reads it (PyYAML's YAML 1.1, then pydantic's lax int or float), for
    kvlab.validate.inference_perf_number to judge (trial 54, finding 6):

        unquoted 1.5e+3  YAML 1.1's float 1500.0 (a count of 1,500, as pydantic takes a whole float)
        unquoted 1e3     text in YAML 1.1 too (its floats need a point and a signed exponent): judged as text
        unquoted 010     YAML 1.1's octal 8, kvlab's --config's 10: judged as text (refused as ambiguous)
        quoted '010'     text, which pydantic reads in decimal: 10 (its leading zeros dropped here)
    """
    import re

    if isinstance(value, _Plain):
        import yaml

        read = yaml.safe_load(str(value))
        return read if isinstance(read, float) else str(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?0+[0-9][0-9_]*\s*", value):
        text = value.strip()
        sign = "-" if text.startswith("-") else ""
        return sign + (text.lstrip("+-").lstrip("0") or "0")
    return value


def _field(section: dict, name: str, where: str) -> int:
    from kvlab.validate import inference_perf_number

    for key in _ALIASES[name]:
        if key in section:
            value = section[key]
            try:
                return int(inference_perf_number(as_read(value), whole=True))
            except (ValueError, OverflowError) as exc:
                valid = "" if "valid: " in str(exc) else "; valid: a whole number of tokens or users, such as 20"
                raise KvlabError(f"{where}: {key} = {value!r} {exc}{valid}") from None
    raise KvlabError(f"{where}: missing field {_ALIASES[name][0]!r} (inference-perf shared_prefix needs "
                     f"{', '.join(a[0] for a in _ALIASES.values())})")


def _stages(raw: Any, where: str) -> tuple[Stage, ...]:
    from kvlab.validate import inference_perf_number

    if not isinstance(raw, list) or not raw:
        raise KvlabError(f"{where}: 'stages' must be a list of {{rate, duration}}, got {raw!r}")
    stages = []
    for k, stage in enumerate(raw):
        if not isinstance(stage, dict) or "rate" not in stage or "duration" not in stage:
            raise KvlabError(f"{where}: stage {k} is {stage!r}; valid: {{rate: requests/s, duration: seconds}} "
                             "(kvlab replays constant-rate stages; concurrency stages are not supported)")
        numbers = []
        for name, unit in (("rate", "requests/s"), ("duration", "seconds")):
            try:
                numbers.append(float(inference_perf_number(as_read(stage[name]))))
            except (TypeError, ValueError, OverflowError) as exc:
                reason = str(exc) if "valid: " in str(exc) else f"{exc}; valid: a number of {unit} such as 2 or 0.5"
                raise KvlabError(f"{where}: stage {k}'s {name} {stage[name]!r} {reason}") from None
        stages.append(Stage(rate=numbers[0], duration=numbers[1]))
    return tuple(stages)


def _check_keys(section: dict, valid: tuple[str, ...], where: str) -> None:
    """Refuse a key inference-perf does not take (a typo would otherwise change the workload without a word)."""
    for key in section:
        if key not in valid:
            raise KvlabError(f"{where}: unknown key {key!r}; valid: {', '.join(valid)}")


def spec_from_dict(data: Any, where: str, prompt_overhead_tokens: int = 0) -> SharedPrefixSpec:
    """A spec from inference-perf's config (``data: {type: shared_prefix, shared_prefix: ...}``, ``load: {type:
    constant, stages: ...}``) or from a flat record of the same fields (the calibration set's ``workload``)."""
    if data is None:  # (what YAML reads from an empty file, or one of comments only)
        raise KvlabError(f"{where}: the file is empty; an inference-perf configuration is a mapping (data: "
                         "{type: shared_prefix, shared_prefix: ...}, load: {stages: ...})")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else "a single value"
        raise KvlabError(f"{where}: an inference-perf configuration is a mapping (data: ..., load: ...), not {kind}")
    if "data" in data or "load" in data:  # inference-perf's own layout
        section = data.get("data") or {}
        if section.get("type", "shared_prefix") != "shared_prefix":
            raise KvlabError(f"{where}: data.type {section.get('type')!r} is not supported; valid: shared_prefix")
        fields = section.get("shared_prefix")
        if not isinstance(fields, dict):
            raise KvlabError(f"{where}: missing field 'data.shared_prefix'")
        _check_keys(fields, tuple(k for keys in _ALIASES.values() for k in keys) + _SHARED_PREFIX_OTHER,
                    f"{where}: shared_prefix")
        load = data.get("load") or {}
        if not isinstance(load, dict):
            raise KvlabError(f"{where}: load must be a mapping (type: constant, stages: ...), not {load!r}")
        _check_keys(load, _LOAD_KEYS, f"{where}: load")
        load_type, raw_stages = load.get("type", "constant"), load.get("stages")
        stage_where = f"{where}: load"
    else:
        fields, load_type, raw_stages, stage_where = data, data.get("load_type", "constant"), data.get("stages"), where
    if load_type == "poisson":  # (inference-perf's poisson: exponential gaps at each stage's rate)
        raise KvlabError(f"{where}: load type 'poisson' is not supported: kvlab replays this file's stages as "
                         "constant ones (evenly spaced at 1 / rate); valid: type: constant, and for Poisson arrivals "
                         "at one rate add --arrival poisson --rate R, which redraws the file's arrival times")
    if load_type != "constant":
        raise KvlabError(f"{where}: load type {load_type!r} is not supported; valid: constant (evenly spaced at "
                         "1 / rate)")
    values = {name: _field(fields, name, f"{where}: shared_prefix") for name in _ALIASES}
    stages = _stages(raw_stages, stage_where)
    try:
        return SharedPrefixSpec(**values, stages=stages,
                                enable_multi_turn_chat=bool(fields.get("enable_multi_turn_chat", False)),
                                prompt_overhead_tokens=prompt_overhead_tokens)
    except KvlabError as exc:  # (the spec's own checks know no file: name it, as every other error here does)
        raise KvlabError(f"{where}: {exc}") from None


def read_config(path: str) -> SharedPrefixSpec:
    """An inference-perf YAML configuration file."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read it as UTF-8 text ({exc})") from None
    try:
        data = yaml.load(text, Loader=_loader())  # noqa: S506 (a SafeLoader, numbers decimal only: _loader)
    except yaml.YAMLError as exc:
        raise KvlabError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return spec_from_dict(data, path)


def inference_perf_source(path: str, num_requests: int | None = None, duration: float | None = None,
                          seed: int | None = DEFAULT_SEED):
    """An inference-perf configuration file as a workload source with its own arrival times (``--workload
    config.yaml``: kvlab.workload.load recognises the suffix), drawn as its constant timer draws them with ``seed``
    (arrival_times; None: evenly spaced). ``num_requests`` / ``duration``: only the first
    requests, or those arriving before that many seconds, are needed (its arrivals as they are): only they are
    built. What is to be built is weighed against the work limits first (kvlab.validate), so that a stage of
    10^12 requests is refused in a moment, not by running out of memory."""
    from kvlab.validate import check_simulation_work
    from kvlab.workload.bundled import BundledWorkload

    spec = read_config(path)
    num = spec.num_requests
    if duration is not None:  # (at least one: the caller names the first arrival when none comes before it)
        num = min(num, max(1, requests_before(spec, duration, seed)))
    if num_requests is not None:
        num = min(num, num_requests)
    built: list[LengthTable] = []

    def table() -> LengthTable:  # (built when first asked for: naming the source's kind needs none of it)
        if not built:
            check_simulation_work(num, spec.prompt_len + spec.output_len, 1, f"workload {Path(path).name}",
                                  memory_only=True)
            built.append(shared_prefix_table(spec, limit=num, seed=seed))
        return built[0]

    stages = ", ".join(f"{s.rate:g} req/s for {s.duration:g} s" for s in spec.stages)
    return BundledWorkload(
        name=Path(path).name,
        kind="trace",
        summary=(f"inference-perf shared_prefix: {spec.num_groups} system prompts of {spec.system_prompt_len} tokens "
                 f"x {spec.num_prompts_per_group} users, questions of {spec.question_len}, answers of "
                 f"{spec.output_len} tokens; constant load {stages}; "
                 + ("arrivals evenly spaced (--arrivals even)" if seed is None else
                    f"arrivals drawn as its timer draws them (--arrivals {seed})")),
        source=f"{path} (inference-perf configuration; github.com/kubernetes-sigs/inference-perf)",
        licence="",
        sample=lambda num, rng: sample_table(table(), num, rng),  # (--arrival poisson/burst: its rows redrawn)
        rows=table,
    )
