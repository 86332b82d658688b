"""kvlab's clock held against the real engine itself, in-process: time every engine step, fit a cost profile to
one workload's steps, replay other workloads in real time and put kvlab's predictions beside what the engine did.

    workload ──▶ build_timed_job ──▶ driver.py: vLLM's LLMEngine in one process pinned to one CPU (no API server,
                                     no HTTP client), requests added at their arrival times, every step timed
    calibration run's steps ──▶ step_iterations ──▶ cost/calibrate.py's fit ──▶ an absolute cost profile
    check workloads ──▶ the engine, twice each (its own run-to-run difference), between calibration runs
                   └──▶ kvlab's `vllm` strategy on the profile ──▶ throughput, TTFT p50, TPOT p50 beside them

Why in-process: on a 2-core machine a server's API process and a load generator share the model runner's
machine and slow it by a varying amount (docs/cost.md, "Validation against the real vLLM server"); here the only
other work on the engine's CPU is the machine's own. The steps kvlab's scheduler takes are the engine's (vllm
compare: 100% identical), so what the check measures is the clock alone.

Both sides define the figures alike: TTFT = first token − arrival, TPOT = (last token − first token) / (tokens − 1)
per request, throughput = finished requests / (last finish − first arrival); a token's time is the end of the step
that sampled it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from kvlab.cost.calibrate import ITERATION_CONSTANTS, Fit, Iterations, Unidentifiable, Wording
from kvlab.errors import KvlabError
from kvlab.vllm.job import EngineSettings
from kvlab.workload.request import Request

# The tiny Llama's steps are mostly Python (docs/cost.md): a wider dummy-weight Llama (13M parameters, 53 MB in
# float32) gives each step work that grows with what it holds, as on a GPU. The same model as tests/test_cost_vllm.py.
WIDE_MODEL = MappingProxyType({"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
                               "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64})
SETTINGS = EngineSettings(block_size=32, num_gpu_blocks_override=200, max_num_seqs=16, max_num_batched_tokens=512,
                          max_model_len=512)
# Served first in each engine, untimed: a fresh engine's first steps are slower (torch's first calls).
WARMUP = tuple(Request(i, 0.0, 32 + 48 * i, 24) for i in range(8))
FIGURES = ("throughput_rps", "ttft_p50", "tpot_p50")
# The engine's priority: on a shared machine other processes run on its CPU too (measured: 40% of a run's wall time
# off the CPU at nice 0 beside other test suites); at -20 they get about 1% of it (CFS weights 88,761 : 1,024).
NICE = -20
# The tolerances: throughput within 5%, TTFT and TPOT p50 within 20% (or the engine's own run-to-run
# difference where that is larger).
TOLERANCE = MappingProxyType({"throughput_rps": 0.05, "ttft_p50": 0.20, "tpot_p50": 0.20})

ENGINE_STEPS = Wording(
    data="the calibration run",
    hints=MappingProxyType({
        "weights_read_s": "a calibration workload with both small decode batches (quiet periods) and long prefills "
                          "(bursts of long prompts): --arrival gamma --cv 2 or more",
        "context_token_s": "requests of varied prompt and output lengths, so that steps of one batch size hold "
                           "different contexts",
        "token_s": "steps whose per-token work outweighs the fixed step: bursts of long prompts (a rate near or "
                   "above capacity)",
        "overhead_s": "any steps",
        "seq_overhead_s": "steps of many batch sizes: requests that come and go (Poisson or gamma arrivals at a rate "
                          "between idle and saturated)",
        "prefill_token_overhead_s": "requests that arrive while others decode, with prompts of varied length",
        "request_latency_s": "none: in-process there is no time outside the engine",
    }),
    more="calibrate on more requests (-n) or longer outputs",
)


@dataclass(frozen=True)
class TimedWorkload:
    """A workload designed for timing: ``num_requests`` with prompt and output lengths uniform in the given
    ranges (inclusive), arriving by ``arrival`` (poisson or gamma at ``rate`` with ``cv``, or burst: all at once)."""

    name: str
    num_requests: int
    rate: float
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    arrival: str = "poisson"
    cv: float = 1.0
    seed: int = 0

    def requests(self) -> list[Request]:
        import numpy as np

        from kvlab.workload.arrivals import generate_arrivals

        lengths_rng, arrivals_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(2))
        prompts = lengths_rng.integers(self.prompt_len[0], self.prompt_len[1] + 1, self.num_requests)
        outputs = lengths_rng.integers(self.output_len[0], self.output_len[1] + 1, self.num_requests)
        if self.arrival == "burst":
            times = np.zeros(self.num_requests)
        else:
            times = generate_arrivals(self.arrival, self.rate, arrivals_rng, num=self.num_requests, cv=self.cv)
        return [Request(i, float(times[i]), int(prompts[i]), int(outputs[i])) for i in range(self.num_requests)]

    def describe(self) -> str:
        arrivals = ("all at once" if self.arrival == "burst" else
                    f"{self.arrival} at {self.rate:g} req/s" + (f", cv {self.cv:g}" if self.arrival == "gamma" else ""))
        return (f"{self.name}: {self.num_requests} requests, prompts {self.prompt_len[0]}-{self.prompt_len[1]}, "
                f"outputs {self.output_len[0]}-{self.output_len[1]} tokens, {arrivals}")


# The design (capacity of this setup on the benchmark machine: ~5 req/s). The calibration's bursts fill the batch
# to max_num_seqs with prefill chunks up to the token budget, its lulls leave one or two requests decoding (batch
# sizes 1-16, contexts from a few tokens to thousands: every constant identifiable); the checks are other
# requests, one well below capacity and one above it. Each check is run twice and the calibration three times,
# interleaved (calibration, checks, calibration, checks, calibration): the machine drifts by 10-20% in a minute
# (docs/cost.md), and the fit pools the calibration runs so that it stands on the same stretch of time as the checks.
CALIBRATION = TimedWorkload("calibration", 80, 5.0, (16, 384), (4, 128), arrival="gamma", cv=2.0, seed=1)
CHECKS = (TimedWorkload("below capacity", 30, 1.5, (16, 256), (16, 160), seed=2),
          TimedWorkload("above capacity", 80, 12.0, (32, 384), (8, 96), seed=3))
REPEATS = 2


def design(calibration: TimedWorkload = CALIBRATION, checks: Sequence[TimedWorkload] = CHECKS,
           repeats: int = REPEATS) -> list[tuple[str, list[Request]]]:
    """The runs of a check, in order: the calibration and the checks, ``repeats`` times over, and the calibration
    once more: the calibration brackets the checks, so that a machine that speeds up or slows down over the
    minutes of the check moves the pooled calibration as it moves the checks' mean."""
    calibrate = (calibration.name, calibration.requests())
    return ([calibrate] + [(w.name, w.requests()) for w in checks]) * repeats + [calibrate]


@dataclass(frozen=True)
class TimedRun:
    """One real-time run of the engine (driver.py's result with "timing") and the requests it served."""

    workload: str
    requests: tuple[Request, ...]
    steps: list[dict]
    served: dict[str, dict]
    timing: dict = field(default_factory=dict)

    @property
    def probe_s(self) -> float | None:
        """The CPU seconds of the fixed probe served just before and just after the run (driver.py's
        "probe_cpu_s"), their mean: the machine's speed over the run, on the same steps every time."""
        probes = [p for p in self.timing.get("probe_cpu_s", ()) if p > 0]
        return sum(probes) / len(probes) if probes else None

    @property
    def off_cpu(self) -> float:
        """The share of its steps' wall time the engine's process spent off its CPU (others ran on it)."""
        wall = sum(s["wall_s"] for s in self.steps)
        return 1 - sum(min(s["cpu_s"], s["wall_s"]) for s in self.steps) / wall if wall else 0.0

    def figures(self) -> dict[str, float]:
        """Throughput, TTFT p50 and TPOT p50 as measured (the module's docstring)."""
        from kvlab.metrics import distribution

        done = [r for r in self.served.values() if r.get("finish_reason") is not None and r["token_s"]]
        if not done:
            raise KvlabError(f"the engine finished none of the {len(self.requests)} requests of {self.workload}")
        start = min(r["arrival_s"] for r in self.served.values())
        makespan = max(r["token_s"][-1] for r in done) - start
        ttft = [r["token_s"][0] - r["arrival_s"] for r in done]
        tpot = [(r["token_s"][-1] - r["token_s"][0]) / (len(r["token_s"]) - 1) for r in done if len(r["token_s"]) > 1]
        return {"throughput_rps": len(done) / makespan, "ttft_p50": distribution(ttft)["p50"],
                "tpot_p50": distribution(tpot)["p50"], "num_steps": len(self.steps)}


def run_timed(workloads: Sequence[tuple[str, Sequence[Request]]], settings: EngineSettings = SETTINGS, *,
              model: dict | None = None, cpu: int | None = None, nice: int | None = NICE, clock: str = "engine",
              timeout: float | None = 1800) -> list[TimedRun]:
    """Each workload through the real engine in real time, one engine after the other in ONE driver process
    (importing vLLM costs ~20 s), pinned to ``cpu`` at priority ``nice``, timed on ``clock`` (driver.py)."""
    from kvlab.vllm.compare import prepare
    from kvlab.vllm.job import build_timed_job
    from kvlab.vllm.run import run_jobs

    check_cpu(cpu)
    prepared = [(name, tuple(prepare(requests, settings))) for name, requests in workloads]
    model = dict(WIDE_MODEL if model is None else model)
    jobs = [build_timed_job(requests, settings, model=model, cpu=cpu, nice=nice, clock=clock,
                            warmup=prepare(WARMUP, settings))
            for _, requests in prepared]
    results = run_jobs(jobs, timeout=timeout)
    return [TimedRun(name, requests, result["steps"], result["requests"], result.get("timing", {}))
            for (name, requests), result in zip(prepared, results)]


def check_cpu(cpu: int | None) -> None:
    import os

    allowed = sorted(os.sched_getaffinity(0))
    if cpu is not None and cpu not in allowed:
        raise KvlabError(f"--cpu {cpu} is not a CPU this process may run on; valid: {', '.join(map(str, allowed))}")


def check_fit(names: Sequence[str]) -> None:
    """The constants an in-process fit can be asked for: the iteration's (nothing happens outside the engine)."""
    unknown = [k for k in names if k not in ITERATION_CONSTANTS]
    if unknown:
        raise KvlabError(f"--fit {unknown[0]!r} is not a constant vllm calibrate fits; valid: "
                         f"{', '.join(ITERATION_CONSTANTS)} (request_latency_s is not one: in-process no request "
                         "spends time outside the engine)")
    if "overhead_s" not in names:
        raise KvlabError("--fit must include overhead_s (every step has one)")


def step_iterations(runs: Sequence[TimedRun]) -> Iterations:
    """The timed steps of ``runs`` as calibration's observed iterations: what each step held, in kvlab's terms
    (sched/scheduler.py: a request decodes when it computes one token past its prompt; its context is its computed
    tokens plus the step's), and how long it took."""
    import numpy as np

    columns: dict[str, list[float]] = {k: [] for k in ("duration", "num_seqs", "num_prefill_tokens",
                                                       "num_decode_tokens", "num_context_tokens", "end", "bench")}
    for index, run in enumerate(runs):
        prompt_len = {str(r.request_id): r.prompt_len for r in run.requests}
        for step in run.steps:
            computed = {e["request_id"]: e["num_computed_tokens"] for e in (*step["new"], *step["cached"])}
            prefill = decode = context = 0
            for rid, num_new in step["num_scheduled_tokens"].items():
                before = computed[rid]
                if num_new == 1 and before >= prompt_len[rid]:
                    decode += 1
                else:
                    prefill += num_new
                context += before + num_new
            row = (step["end_s"] - step["start_s"], len(step["num_scheduled_tokens"]), prefill, decode, context,
                   step["end_s"], index)
            for key, value in zip(columns, row):
                columns[key].append(float(value))
    arrays = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    return Iterations(**arrays, weight=np.ones(len(arrays["duration"])), first_tokens=(),  # type: ignore[arg-type]
                      num_requests=sum(len(r.requests) for r in runs), sources=tuple(r.workload for r in runs),
                      observed_by="the real engine's own steps, timed in-process")


@dataclass(frozen=True)
class Calibration:
    fit: Fit
    not_identified: tuple[str, ...]  # one sentence per constant the data could not identify (left at 0)


def calibration_runs(runs: Sequence[TimedRun], calibration: str = CALIBRATION.name) -> list[TimedRun]:
    return [r for r in runs if r.workload == calibration]


def fit_steps(runs: Sequence[TimedRun], fit: tuple[str, ...] | None = None) -> Calibration:
    """calibrate.py's least squares over the runs' steps (pooled). ``fit`` None: every iteration constant the steps
    identify, each one they cannot left out with the reason and the workload that would; an explicit ``fit``
    is fitted as asked, or refused (Unidentifiable) with the same sentence."""
    from kvlab.cost.calibrate import fit_iterations

    its = step_iterations(runs)
    if fit is not None:
        check_fit(fit)
        return Calibration(fit_iterations(its, fit, ENGINE_STEPS), ())
    names = list(ITERATION_CONSTANTS)
    dropped: list[str] = []
    while True:
        try:
            return Calibration(fit_iterations(its, tuple(names), ENGINE_STEPS), tuple(dropped))
        except Unidentifiable as exc:
            if exc.constant == "overhead_s":
                raise
            names.remove(exc.constant)
            dropped.append(str(exc).split(". Or leave it out")[0])


def profile_document(calibration: Calibration, name: str, model: str = "", gpu: str = "cpu") -> dict:
    """The fit as an absolute profile (``kvlab run --cost FILE``); its source says it came from the engine's steps."""
    document = calibration.fit.profile(name, model=model, gpu=gpu)
    document["source"] = document["source"].replace("(kvlab bench --out)", "(kvlab vllm calibrate)")
    if calibration.not_identified:
        document["fit"]["not_identified"] = list(calibration.not_identified)
    return document


def predict(run: TimedRun, profile: dict, settings: EngineSettings = SETTINGS, model: dict | None = None) -> dict:
    """kvlab's `vllm` strategy on ``profile`` (a profile document) for the run's requests and arrivals, through
    the run service."""
    import tempfile
    import warnings

    from kvlab import service
    from kvlab.config import resolve
    from kvlab.cost.profiles import CostProfileWarning, write_profile
    from kvlab.vllm.compare import TINY_MODEL_CONFIG
    from kvlab.workload import Workload

    start = min(r.arrival_time for r in run.requests)
    requests = tuple(replace(r, arrival_time=r.arrival_time - start) for r in run.requests)
    with tempfile.TemporaryDirectory(prefix="kvlab-timing-") as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps({**json.loads(TINY_MODEL_CONFIG.read_text()),
                                           **(WIDE_MODEL if model is None else model)}))
        # An absolute profile is the machine's own seconds: no catalogue GPU enters the clock (the GPU sizes
        # nothing either: the pool is fixed).
        options = {**settings.options(str(config_path), "a100-40gb"),
                   "cost": str(write_profile(profile, Path(tmp) / "profile.json"))}
        with warnings.catch_warnings():  # (fitted on "cpu", no catalogue GPU: said in the profile, not per run)
            warnings.simplefilter("ignore", CostProfileWarning)
            config = resolve(options)
        strategy = "vllm" if settings.enable_prefix_caching else "vllm+noprefix"  # (as the timed engine ran)
        result = service.run(config, [strategy], workload=Workload(run.workload, requests, "", ""),
                             record_iterations=False)
    summary = result.summaries()[0]
    return {"throughput_rps": summary["throughput_rps"], "ttft_p50": summary["ttft_s"]["p50"],
            "tpot_p50": summary["tpot_s"]["p50"], "num_steps": summary["num_iterations"]}


@dataclass(frozen=True)
class CheckRow:
    """One figure of one check workload: the engine's two runs, their difference, kvlab's prediction."""

    workload: str
    figure: str
    measured: tuple[float, ...]
    kvlab: float
    speed_run_to_run: float = 0.0  # how far the engine's speed moved between runs of one workload (speed_changes)
    machine: tuple[float, ...] = ()  # each run's probe over the calibration runs' (machine_speeds)

    @property
    def mean(self) -> float:
        return sum(self.measured) / len(self.measured)

    @property
    def run_to_run(self) -> float:
        """The engine's own difference between its runs, relative to their mean."""
        return (max(self.measured) - min(self.measured)) / self.mean

    @property
    def error(self) -> float:
        return self.kvlab / self.mean - 1

    @property
    def tolerance(self) -> float:
        """The issue's tolerance, or the engine's own run-to-run difference where larger: in this figure, or in its
        speed between two runs of one workload (the calibration's included: the profile stands on those runs)."""
        return max(TOLERANCE[self.figure], self.run_to_run, self.speed_run_to_run)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.error) and abs(self.error) <= self.tolerance


def speed_changes(runs: Sequence[TimedRun], constants: dict) -> dict[str, float]:
    """How far the engine's speed moved between runs of the same workload: each run's measured step time over what
    ``constants`` give for the same steps (whose contents are exact), and for each workload the range of those
    ratios over their mean. The profile's shape errors are the same in runs of one workload and cancel; what is
    left is the machine (the other core's load on this one: docs/cost.md)."""
    from kvlab.cost.calibrate import predicted

    ratios: dict[str, list[float]] = {}
    for run in runs:
        its = step_iterations([run])
        model = predicted(constants, its.num_seqs, its.num_prefill_tokens, its.num_decode_tokens,
                          its.num_context_tokens)
        ratios.setdefault(run.workload, []).append(float(its.duration.sum()) / float(model.sum()))  # type: ignore[attr-defined]
    return {name: (max(r) - min(r)) / (sum(r) / len(r)) for name, r in ratios.items() if len(r) > 1}


def machine_speeds(runs: Sequence[TimedRun], calibration: str = CALIBRATION.name) -> list[float]:
    """Each run's probe time (TimedRun.probe_s) over the calibration runs' mean: 1.1 is a machine 10% slower
    during that run than while the profile's steps were timed (1.0 for runs without a probe)."""
    reference = [r.probe_s for r in runs if r.workload == calibration and r.probe_s]
    if not reference:
        return [1.0] * len(runs)
    mean = sum(reference) / len(reference)
    return [r.probe_s / mean if r.probe_s else 1.0 for r in runs]


def decode_step_ratio(runs: Sequence[TimedRun], profile: dict, workload: str,
                      calibration: str = CALIBRATION.name) -> float:
    """The engine's decode-only steps in ``workload``'s runs, measured over what the profile gives for them at
    each run's machine speed: the clock's own error on the steps a TPOT is made of (1.2: the engine 20% slower)."""
    import numpy as np

    from kvlab.cost.calibrate import predicted

    measured = modelled = 0.0
    for run, machine in zip(runs, machine_speeds(runs, calibration)):
        if run.workload != workload:
            continue
        its = step_iterations([run])
        decode = np.asarray(its.num_prefill_tokens) == 0
        model = np.asarray(predicted(at_speed(profile, machine)["constants"], its.num_seqs, its.num_prefill_tokens,
                                     its.num_decode_tokens, its.num_context_tokens))
        measured += float(np.asarray(its.duration)[decode].sum())
        modelled += float(model[decode].sum())
    return measured / modelled if modelled else math.nan


def at_speed(profile: dict, speed: float) -> dict:
    """The profile on a machine ``speed`` times slower: every time constant scaled."""
    return {**profile, "constants": {k: v * speed for k, v in profile["constants"].items()}}


def check_rows(runs: Sequence[TimedRun], profile: dict, settings: EngineSettings = SETTINGS,
               model: dict | None = None, calibration: str = CALIBRATION.name) -> list[CheckRow]:
    """Runs of the same workload (by name, in order; the calibration's left out) against kvlab's prediction for
    it, figure by figure; with the largest change in the engine's speed between runs of one workload. Each run
    is predicted at the machine's speed during it (machine_speeds: the profile's times scaled by the run's probe
    over the calibration runs'), and kvlab's figure is the mean of those predictions."""
    by_workload: dict[str, list[tuple[TimedRun, float]]] = {}
    for run, machine in zip(runs, machine_speeds(runs, calibration)):
        if run.workload != calibration:
            by_workload.setdefault(run.workload, []).append((run, machine))
    speed = max(speed_changes(runs, profile["constants"]).values(), default=0.0)
    rows = []
    for name, repeats in by_workload.items():
        predicted = [predict(run, at_speed(profile, machine), settings, model) for run, machine in repeats]
        measured = [run.figures() for run, _ in repeats]
        rows += [CheckRow(name, figure, tuple(m[figure] for m in measured),
                          sum(p[figure] for p in predicted) / len(predicted), speed,
                          tuple(machine for _, machine in repeats)) for figure in FIGURES]
    return rows


def format_rows(rows: Sequence[CheckRow]) -> list[str]:
    """The check as a table: each figure's runs, their difference, kvlab, its error and the tolerance held to."""
    speed = max((row.speed_run_to_run for row in rows), default=0.0)
    machine = {row.workload: row.machine for row in rows if row.machine}
    lines = [f"the engine's speed between two runs of one workload moved by up to {speed:.1%} (allowed where larger)",
             *([("the machine, by a fixed probe before and after each run, against the calibration runs: "
                 + "; ".join(f"{name} " + " / ".join(f"{m:.2f}x" for m in speeds) for name, speeds in machine.items())
                 + " (each run predicted at its own)")] if machine else []),
             f"{'workload':<16} {'figure':<14} {'engine runs':>21} {'run-to-run':>10} {'kvlab':>9} {'error':>7} "
             f"{'allowed':>7}"]
    for row in rows:
        runs = " / ".join(_fmt(row.figure, v) for v in row.measured)
        lines.append(f"{row.workload:<16} {row.figure:<14} {runs:>21} {row.run_to_run:>10.1%} "
                     f"{_fmt(row.figure, row.kvlab):>9} {row.error:>+7.1%} {row.tolerance:>7.0%}"
                     + ("" if row.ok else "  outside"))
    return lines


def _fmt(figure: str, value: float) -> str:
    return f"{value:.3f}" if figure == "throughput_rps" else f"{value * 1e3:.1f} ms"

