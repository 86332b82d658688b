"""The lab server's parameters: parsed, range-checked, bounded.

Every value that arrives from the page goes through here; anything out of range raises KvlabError with a message
that names the value and the valid range (the server answers HTTP 400 with it, the page shows it). The limits
also bound the work one request can cause: requests per run, blocks per grid, runs alive, compute per run.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab import defaults
from kvlab.errors import KvlabError
from kvlab.validate import bounded_number, whole_number_text

LIMITS = {
    "max_num_requests": 2000,  # per run; the lesson's point shows with a hundred
    "min_rate": 0.01,  # requests per second
    "max_rate": 100.0,
    "block_sizes": (16, 32, 64, 128),  # --block-size values vLLM's CUDA attention backends take
    "min_num_blocks": 4,
    "max_num_blocks": 65536,  # the "KV blocks" a page may ask for
    "max_pool_blocks": 4_194_304,  # a GPU's own pool, drawn at a display scale past 65,536 (session.py)
    "max_num_seqs": 1024,
    "max_strategies": 4,
    "min_speed": 0.01,  # simulated seconds per wall second
    "max_speed": 1000.0,
    "max_seed": 2**31 - 1,
    "max_sessions": 8,  # runs alive at once; the oldest is dropped for a new one
    "session_idle_seconds": 600.0,
    "max_compute_seconds": 60.0,  # simulator time one run may spend, over its whole life
    "max_seek_seconds": 1e6,  # simulated seconds a seek may ask for (the compute budget bounds it anyway)
    "max_log_chars": 1_000_000,  # a pasted vLLM log
}



@dataclass(frozen=True)
class RunSpec:
    """One grid (one strategy) or one race (up to four strategies on the same workload and clock)."""

    kind: str  # "grid" | "race"
    strategies: tuple[str, ...]
    model: str = defaults.MODEL
    gpu: str = defaults.GPU
    workload: str = defaults.WORKLOAD
    rate: float = defaults.RATE
    num_requests: int = defaults.NUM_REQUESTS
    seed: int = defaults.SEED
    block_size: int = defaults.BLOCK_SIZE
    num_blocks: int | None = None  # KV cache size in blocks; None: what the GPU leaves (vLLM's sizing)
    max_num_seqs: int | None = None  # None: vLLM's default for the GPU, as `kvlab race` uses
    # A built-in cost profile (kvlab cost; files are for the command line only); not given: the one `kvlab race`
    # picks for the GPU (_cost_profile)
    cost: str = "roofline"

    def options(self) -> dict:
        """The run's options (kvlab.config.resolve's keywords): the engine is configured as `kvlab race` configures
        it, every option the page does not offer at its default."""
        return {"model": self.model, "gpu": self.gpu, "block_size": self.block_size, "max_num_seqs": self.max_num_seqs,
                "num_gpu_blocks": self.num_blocks,  # the lab's "KV blocks": a smaller cache, to watch memory run out
                "cost": self.cost, "workload": self.workload, "num_requests": self.num_requests, "rate": self.rate,
                "seed": self.seed}


class SentNumber(float):
    """A JSON number with the text it was sent as, which its repr gives back: a refusal echoes 1e400 as sent, not as
    the inf it reads as (trial 62, finding 9c), 1e5 not as 100000.0."""

    text: str

    def __new__(cls, text: str) -> SentNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __repr__(self) -> str:
        return self.text


def json_body(body: bytes):
    """A request's JSON body, each number with a fraction or an exponent, and NaN or Infinity, read as a SentNumber;
    raises json.JSONDecodeError or UnicodeDecodeError as Starlette's request.json() does."""
    import json

    return json.loads(body, parse_float=SentNumber, parse_constant=SentNumber)


def single_values(query, valid: tuple[str, ...] | None = None) -> dict[str, str]:
    """A request's query parameters (Starlette's QueryParams) as a dict, each given once: a repeat (rate=-1&rate=2)
    is refused, as the command line refuses an option given twice, where a plain dict would keep the last. With
    ``valid``, the route's parameters, any other is refused too (known_only)."""
    values: dict[str, str] = {}
    for key, value in query.multi_items():
        if key in values:
            given = query.getlist(key)
            raise KvlabError(f"query parameter {key} is given {len(given)} times "
                             f"({'&'.join(f'{key}={v}' for v in given)}); valid: once")
        values[key] = value
    if valid is not None:
        known_only(values, valid)
    return values


def known_only(data: dict, valid, note: str = "") -> None:
    """Refuse a parameter the endpoint does not read (``valid``, named in that order), the first by name: an
    ignored one would answer another question than the one asked. ``note`` follows the list (where the parameter
    is another endpoint's, say)."""
    unknown = sorted(set(data) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none (this route takes no parameters)"
        raise KvlabError(f"unknown parameter {unknown[0]!r}; valid: {listed}{note}")


def parse_run_spec(data: dict) -> RunSpec:
    if not isinstance(data, dict):
        raise KvlabError("the run's parameters must be a JSON object")
    known_only(data, sorted(RunSpec.__dataclass_fields__))
    kind = choice(data, "kind", ("grid", "race"), "grid")
    strategies = _strategies(data.get("strategies"), kind)
    block_size = integer(data, "block_size", 1, 1024, defaults.BLOCK_SIZE)
    if block_size not in LIMITS["block_sizes"]:
        sizes = ", ".join(map(str, LIMITS["block_sizes"]))
        raise KvlabError(f"block_size {block_size} is not one the lab offers (vLLM's CUDA block sizes): {sizes}")
    num_blocks = data.get("num_blocks")
    if num_blocks not in (None, "", "auto"):
        num_blocks = integer(data, "num_blocks", LIMITS["min_num_blocks"], LIMITS["max_num_blocks"], None)
    else:
        num_blocks = None
    gpu = text(data, "gpu", defaults.GPU)
    return RunSpec(
        kind=kind,
        strategies=strategies,
        model=text(data, "model", defaults.MODEL),
        gpu=gpu,
        workload=text(data, "workload", defaults.WORKLOAD),
        rate=number(data, "rate", LIMITS["min_rate"], LIMITS["max_rate"], defaults.RATE),
        num_requests=integer(data, "num_requests", 1, LIMITS["max_num_requests"], defaults.NUM_REQUESTS),
        seed=integer(data, "seed", 0, LIMITS["max_seed"], defaults.SEED),
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=None if data.get("max_num_seqs") in (None, "")
        else integer(data, "max_num_seqs", 1, LIMITS["max_num_seqs"], None),
        cost=_cost_profile(data.get("cost"), gpu),
    )


def _cost_profile(value, gpu: str) -> str:
    """The profile asked for, or, where none is, the one `kvlab race` runs this GPU under without --cost (the best
    evidence for it, kvlab.cost.profiles.default_profile_for: vllm-h100 on an H100-SXM; trial 62, finding 7)."""
    import difflib

    from kvlab.catalog import get_gpu
    from kvlab.cost import DEFAULT_PROFILE, builtin_profiles
    from kvlab.cost.profiles import default_profile_for

    if value in (None, ""):
        try:
            return default_profile_for(get_gpu(gpu).id)
        except KvlabError:  # (an unknown GPU: refused by its own name when the run is configured)
            return DEFAULT_PROFILE
    names = list(builtin_profiles())
    if not isinstance(value, str) or value not in names:  # never a path: the page reads no files
        hits = difflib.get_close_matches(str(value), names, n=1, cutoff=0.5)
        hint = f" (did you mean {hits[0]!r}?)" if hits else ""
        raise KvlabError(f"cost {str(value)[:40]!r} is not a built-in cost profile{hint}: {', '.join(names)}")
    return value


def parse_speed(value: str | None) -> float:
    return number({"speed": value}, "speed", LIMITS["min_speed"], LIMITS["max_speed"], 4.0)


def _strategies(value, kind: str) -> tuple[str, ...]:
    if value in (None, "", []):
        return defaults.RACE_STRATEGIES if kind == "race" else defaults.STORY[:1]
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise KvlabError(f"strategies must be a list of strategy names, got {value!r}")
    names = tuple(v.strip() for v in value)
    if kind == "grid" and len(names) != 1:
        raise KvlabError(f"a grid runs one strategy, got {len(names)}: {', '.join(names)}")
    if len(names) > LIMITS["max_strategies"]:
        raise KvlabError(f"a race holds at most {LIMITS['max_strategies']} strategies, got {len(names)}")
    from kvlab.strategies import check_distinct, parse_strategy

    check_distinct([parse_strategy(name) for name in names])  # (as `kvlab race`: each name once)
    return names


def required(key: str, valid: str) -> KvlabError:
    """The refusal of a parameter the request must give: what it is and its range."""
    return KvlabError(f"{key} is required: {valid}")


def integer(data: dict, key: str, lo: int, hi: int, default: int | None) -> int:
    value = data.get(key)
    valid = f"an integer from {lo} to {hi}"
    if value is None or value == "":
        if default is None:
            raise required(key, valid)
        return default
    if isinstance(value, float) or (isinstance(value, str) and not whole_number_text(value)):
        # (echoed as sent: 1e99 is never turned into its hundred digits)
        raise KvlabError(f"{key} {value!r} is not a whole number; valid: {valid}")
    return bounded_number(value, key, lo, hi, whole=True)


def number(data: dict, key: str, lo: float, hi: float, default: float | None, unit: str = "",
           lo_open: bool = False) -> float:
    """A number in [lo, hi] ((lo, hi] with ``lo_open``); ``default`` None: the request must give it (``unit`` says
    what it counts)."""
    value = data.get(key)
    if value is None or value == "":
        if default is None:
            raise required(key, f"{unit} from {lo:g} to {hi:g}".lstrip())
        return default
    return bounded_number(value, key, lo, hi, lo_open=lo_open)


# The calculator's numbers (/api/size), in the ranges `kvlab size` takes them (kvlab.validate.option_range, their one
# home); the page reads them from /api/catalog's "ranges" for its own check.
CALCULATOR_RANGES = ("concurrency", "context_len", "gpu_memory_utilization")


def ranges() -> dict[str, dict]:
    """CALCULATOR_RANGES' ranges, for the page: {name: {lo, hi, lo_open}}."""
    from kvlab.validate import option_range

    return {name: dict(zip(("lo", "hi", "lo_open"), option_range(name), strict=True)) for name in CALCULATOR_RANGES}


def ranged(data: dict, key: str, default: float) -> float:
    """One of the calculator's numbers (CALCULATOR_RANGES), checked in its option's range: an integer where the
    option counts, else a number."""
    from kvlab.validate import option_range

    lo, hi, lo_open = option_range(key)
    if isinstance(default, int):
        return integer(data, key, int(lo), int(hi), default)
    return number(data, key, lo, hi, default, lo_open=lo_open)


def choice(data: dict, key: str, options: tuple[str, ...], default: str) -> str:
    value = data.get(key)
    if value is None or value == "":
        return default
    if value not in options:
        raise KvlabError(f"{key} {value!r} is not one of: {', '.join(options)}")
    return value


def text(data: dict, key: str, default: str) -> str:
    value = data.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str) or len(value) > 200:
        raise KvlabError(f"{key} must be a name of at most 200 characters, got {str(value)[:40]!r}")
    return value


RATE_SETUP_KEYS = ("model", "gpu", "workload", "num_requests", "seed", "block_size", "cost")


def parse_rate_setup(data: dict, also: tuple[str, ...] = ("rate",), note: str = ""):
    """The rate section's setup (kvlab.web.rates.RateSetup): a run's options but its strategies and rate, checked
    as a run's are; catalogue names only. ``also``: the request's own parameters besides the setup's (read by the
    caller); ``note``: said after the valid ones when another is given (known_only)."""
    from kvlab.catalog import get_gpu
    from kvlab.web.calculator import catalogue_model
    from kvlab.web.rates import RateSetup
    from kvlab.workload import WORKLOADS

    known_only(data, RATE_SETUP_KEYS + also, note)
    spec = parse_run_spec({"kind": "race", **{k: data[k] for k in RATE_SETUP_KEYS if k in data}})
    if spec.workload not in WORKLOADS:
        raise KvlabError(f"unknown workload {spec.workload!r}: not a bundled workload ({', '.join(WORKLOADS)})")
    from kvlab.service.capacity import min_sample_requests

    if spec.num_requests < (least := min_sample_requests()):  # (what `kvlab capacity -n` refuses too)
        raise KvlabError(f"num_requests {spec.num_requests}: a breaking point's measured window would hold too few "
                         f"requests; valid: {least} to {LIMITS['max_num_requests']}")
    return RateSetup(model=catalogue_model(spec.model).id, gpu=get_gpu(spec.gpu).id.lower(), workload=spec.workload,
                     num_requests=spec.num_requests, seed=spec.seed, block_size=spec.block_size, cost=spec.cost)


def parse_rate_systems(value) -> tuple[str, ...] | None:
    """The systems whose breaking points a request asks for (``systems=orca-max,vllm-paper``): names of section 7's
    systems (kvlab.web.rates.RateLab.systems), comma-separated, answered in that order, each once; None (all of them)
    when not given."""
    import difflib

    from kvlab.web.rates import RateLab

    if value is None or value == "":
        return None
    valid = RateLab.systems()
    names = [v.strip() for v in str(value).split(",") if v.strip()]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # (as a race's strategy given twice: each name once)
        raise KvlabError(f"systems {twice[:40]!r} is given {names.count(twice)} times; valid: each name once, of "
                         f"{', '.join(valid)} (comma-separated)")
    for name in names:
        if name not in valid:
            hits = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            hint = f" (did you mean {hits[0]!r}?)" if hits else ""
            raise KvlabError(f"systems {name[:40]!r} is not one of section 7's systems{hint}: "
                             f"{', '.join(valid)} (comma-separated)")
    if not names:
        raise KvlabError(f"systems {str(value)[:40]!r} names no system; valid: {', '.join(valid)} (comma-separated)")
    return tuple(name for name in valid if name in names)
