"""kvlab against real vLLM runs on real GPUs: every calibration run replayed with its own settings.

    python benchmarks/real_vllm.py [--runs PATH] [--profile NAME] [--baseline NAME ...] [--json] [--closed-loop]
                                   [--sent] [--arrivals SEEDS|even]
                                   [--jitter | --step | --lag | --lag-step | --lag-per {prompt,size,both} [--lag-joint]]
    python benchmarks/real_vllm.py --reads [--runs PATH] [--profile NAME] [--sent] [--arrivals SEEDS|even]
    python benchmarks/real_vllm.py --screen [--runs PATH] [--profile NAME]
    python benchmarks/real_vllm.py --draws N [--runs PATH] [--profile NAME]

For each run of the measured-runs file (default: the calibration set, ../shared/data/real-vllm/trainval.json
beside the repository; its README says what the runs are and where they come from) and each metric (E2E, TTFT:
mean, p90, p99; ITL mean), over all the run's requests: the measured value, kvlab's prediction under the fitted
profile with the run left out of the fit (leave-one-out: the profile's constants refitted on the other runs'
equations, kvlab/cost/fit.py) and under each baseline profile (default: roofline), and the errors; then the
median |error| per metric. The fitted profile's leave-one-out errors are what `kvlab cost` and every output quote.
Each run is replayed with the users it names; ``--sent`` (or a profile fitted with ``kvlab calibrate --runs FILE
--client-defaults``), with the prompts its client sent in their place (kvlab.cost.measured.CLIENT_DEFAULTS: 100
prompts, single turn; docs/cost.md, "The workload the runs used"). Requests arrive as inference-perf's constant timer
draws them, exponential gaps scaled to the stage's duration (kvlab.workload.inference_perf.arrival_times): each run is
replayed once per seed and the replays' requests pooled (kvlab.cost.fit.ARRIVAL_SEEDS, or the seeds the profile's
``[fit]`` records; ``--arrivals 0,1`` other seeds; ``--arrivals even`` evenly spaced at each stage's rate, as a profile
fitted before 7 December records by recording none). Each fold
refits every constant the profile's ``[fit]`` fitted and held, without the identification rule: a constant a fold
held would keep the value fitted with the left-out run (kvlab.cost.fit.leave_one_out). ``--jitter``: each fold fits
the lag's spread as well
(``lag_jitter_iterations``, kvlab.cost.fit.fit_spread; an experiment, docs/cost.md "Terms tried and not kept");
``--step``: the lag's step instead (``lag_step_probability``: one more iteration for a request with probability q);
``--lag``: the admission lag itself instead (``admission_lag_iterations``, on kvlab.cost.fit.LAG_GRID: each fold's
lag fitted without its run); ``--lag-step``: the lag and the step jointly (on the product of their grids,
kvlab.cost.fit.JOINT: each fold's pair fitted without its run); ``--lag-per``: the time outside the engine core grows
with the prompt (a time per prompt token), the model (per GB of weights) or both: each fold fits the profile's
constants as without them, then, the engine's held, ``request_latency_s`` and those terms on the TTFT and E2E
equations (kvlab.cost.fit.LAG_TERMS, leave_one_out_terms; an experiment, docs/cost.md "Terms tried and not kept");
with ``--lag-joint``, every constant and the terms in one fit.

``--reads``: no leave-one-out; each run replayed once under the profile, and per run what its decoded tokens read
(the weights and the KV, in milliseconds per output token at 100% of the GPU's bandwidth), the ITL the run's own
E2E and TTFT imply ((E2E mean - TTFT mean) / (output - 1)), their ratio (the bandwidth efficiency that ITL implies
with nothing else in a step), and where kvlab's TTFT tail is: its p99 and the slowest TTFT of each prompt's first
request (a whole prompt to prefill) and of the later ones (cached prompts), with the most sequences an iteration
held and the preemptions (KV exhausted); then each load stage's p99 TTFT, kvlab's / the measured one (the first
stage holds the server's first seconds, a later one a server that is warm). docs/cost.md reads this table.

``--draws N``: how much one draw of the arrivals moves a replay, to choose how many to pool (kvlab.cost.fit.ARRIVAL_SEEDS;
docs/cost.md, "The arrivals the client drew"): each run replayed under the profile once per seed 0 .. N - 1; per
metric, the median |error| over the runs of each draw alone, and the rms over runs of how far a pool of K draws (every
K of the N) is from the pool of all N, for K = 1, 2, 4 (no leave-one-out: the profile's own constants).

``--screen``: terms for the decode step's attention (MHA against GQA, per query head, per kernel work item, per KV
block; ``_screened``), each a column beside the profile's fitted constants, judged as the issue 29 screens were: each run
replayed once under the profile, each fold solving its 12 runs' equations with the candidate, the run left out priced
by the fold's θ on its own per-request rows (its schedule as replayed, not replayed again: a screen, cheaper than the
leave-one-out above and close to it, docs/cost.md "Terms tried and not kept"). Nothing in a profile changes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELATIVE = Path("shared/data/real-vllm/trainval.json")


def default_runs() -> Path:
    """../shared/data/real-vllm/trainval.json beside the repository (a worktree's: beside its main checkout)."""
    candidates = [REPO.parent / RELATIVE]
    try:
        common = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                capture_output=True, text=True, check=True).stdout.strip()
        candidates.append(Path(common).parent.parent / RELATIVE)
    except (OSError, subprocess.CalledProcessError):
        pass
    return next((c for c in candidates if c.is_file()), candidates[0])


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO / "src"))
    from kvlab.cost import fit as F
    from kvlab.cost.measured import METRICS, read_runs
    from kvlab.cost.profiles import get_profile
    from kvlab.errors import KvlabError, require_scipy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=None, help="measured-runs file (default: the calibration set)")
    parser.add_argument("--profile", default="vllm-h100", help="the fitted profile to check by leave-one-out")
    parser.add_argument("--baseline", action="append", default=None, help="baseline profile(s) (default roofline)")
    parser.add_argument("--json", action="store_true", help="print every row as JSON")
    parser.add_argument("--reads", action="store_true", help="per run: the bytes a decoded token reads, the "
                        "efficiency the measured ITL implies, and kvlab's TTFT tail (no leave-one-out)")
    parser.add_argument("--screen", action="store_true", help="each run replayed once; terms for the decode step's "
                        "attention screened by leave-one-out on those replays' equations (no profile changes)")
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="replay the runs in N processes (the "
                        "same numbers; the leave-one-out of a grid or --lag-per stays in one)")
    parser.add_argument("--draws", type=int, default=None, metavar="N", help="each run replayed once per seed 0 .. "
                        "N - 1: how far one draw, or a pool of 2 or 4, is from the pool of all N (no leave-one-out)")
    parser.add_argument("--closed-loop", action="store_true", help="replay multi-turn users as inference-perf's "
                        "client serialises them (a round waits for the user's previous answer; docs/cost.md)")
    parser.add_argument("--arrivals", default=None, metavar="SEEDS|even", help="the seeds of inference-perf's drawn "
                        "arrivals (exponential gaps scaled to each stage's duration), one replay each, pooled: "
                        "comma-separated or a range (default: those the profile's [fit] records, else "
                        f"{','.join(map(str, F.ARRIVAL_SEEDS))}); 'even': evenly spaced at 1 / rate")
    parser.add_argument("--sent", action="store_true", help="replay the 100 single-turn prompts each run's client "
                        "sent, not the users the run names (kvlab.cost.measured.CLIENT_DEFAULTS)")
    grid = parser.add_mutually_exclusive_group()  # (fit_spread fits one grid value at a time)
    grid.add_argument("--jitter", action="store_true", help="each fold fits the lag's spread too (a seeded "
                        "exponential draw per request, kvlab/cost/latency.py; an experiment: docs/cost.md)")
    grid.add_argument("--step", action="store_true", help="each fold fits the lag's step too (one more iteration "
                        "with probability q, a seeded draw per request, kvlab/cost/latency.py; an experiment)")
    grid.add_argument("--lag", action="store_true", help="each fold fits the admission lag too (its iterations on "
                        "a grid, the linear constants refitted at each; an experiment: docs/cost.md)")
    grid.add_argument("--lag-step", action="store_true", help="each fold fits the admission lag and the lag's step "
                        "jointly (the product of their grids; an experiment: docs/cost.md)")
    grid.add_argument("--lag-per", choices=sorted(F.LAG_TERM_CHOICES), help="each fold fits a lag per prompt token, "
                      "per GB of weights or both, with the profile's constants (an experiment: docs/cost.md)")
    parser.add_argument("--lag-joint", action="store_true", help="with --lag-per: fit the terms with every constant in "
                        "one fit (default: the engine's constants first, then the lag on TTFT and E2E)")
    args = parser.parse_args(argv)
    try:
        require_scipy("python benchmarks/real_vllm.py (its leave-one-out refits the profile)")  # (trial 61, finding 5)
        seeds = F.parse_arrivals(args.arrivals) if args.arrivals is not None else None
    except KvlabError as exc:
        parser.exit(2, f"error: {exc}\n")
    if args.lag_joint and not args.lag_per:
        parser.error("--lag-joint applies to --lag-per's terms; valid: --lag-per {prompt,size,both} --lag-joint")
    path = args.runs or default_runs()
    if args.runs is None and not path.is_file():
        print(f"error: the measured runs are not in the repository; this benchmark reads them from {path} (the shared "
              "folder beside the checkout: inference-sim/sim-to-real-accuracy-validation's published runs, docs/cost.md "
              "\"Fitted on real runs\"); "
              "give their file with --runs FILE", file=sys.stderr)
        return 2
    started = time.time()
    if args.reads:
        return reads(path, args.profile, started, args.sent, args.arrivals is None, seeds)
    if args.screen:
        return screen(path, args.profile, started)
    if args.draws is not None:
        if not 2 <= args.draws <= 64:
            parser.error(f"--draws {args.draws}: valid: 2 to 64 seeds")
        return draws(path, args.profile, args.draws, started, max(1, args.workers))
    try:
        runs = read_runs(path)
        profile = get_profile(args.profile)
        baselines = [get_profile(name) for name in (args.baseline or ["roofline"])]
        fitted = tuple(profile.fit.get("fitted", F.CONSTANTS))
        fitted += (F.JITTER,) if args.jitter and F.JITTER not in fitted else ()
        fitted += (F.STEP,) if args.step and F.STEP not in fitted else ()
        fitted += (F.LAG,) if (args.lag or args.lag_step) and F.LAG not in fitted else ()
        fitted += (F.STEP,) if args.lag_step and F.STEP not in fitted else ()
        held = tuple(profile.fit.get("held", ()))  # (asked for, not identified: each fold fits them too)
        # (with the profile's admission lag and lag's spread, F.CARRIED: each fold replays with them, or fits the
        # spread where [fit] did)
        constants = {k: profile.constants.get(k, F.START[k]) for k in F.CONSTANTS} | F.carried(profile.constants)
        sent = args.sent or bool(profile.fit.get("client_defaults"))  # (a profile fitted so is judged so)
        seeds = seeds if args.arrivals is not None else F.arrivals_of(profile.fit)  # (a profile is judged as fitted)
        prepared = [F.prepare(run, args.closed_loop, sent, seeds) for run in runs]
        print(f"{len(runs)} runs from {path}; fitted profile {profile.name!r} left out run by run; "
              f"baselines {', '.join(b.name for b in baselines)}; arrivals {_arrivals(seeds)}", file=sys.stderr)
        workers = max(1, args.workers)
        calibration = F.Calibration(fit=F.Fit(constants, {}, fitted, 0, 0.0, held, profile.fit.get("hold_if_sigma_over_value")),
                                    replays=_replays([(p, constants, None) for p in prepared], workers), iterations=0)
        if args.lag_per:
            folds = F.leave_one_out_terms(calibration, F.LAG_TERM_CHOICES[args.lag_per],
                                          progress=lambda line: print(line, file=sys.stderr), joint=args.lag_joint)
        else:
            folds = F.leave_one_out(calibration, workers=workers)
        tables = {f"{profile.name} (LOO)": F.errors(folds)}
        for name in (k for k in F.SPREADS if k in fitted):  # (the value each fold fitted on its grid)
            print(f"{name} by fold (the run left out): " + ", ".join(
                f"{r.prepared.run.id} {r.constants.get(name, 0.0):g}" for r in folds), file=sys.stderr)
        for baseline in baselines:
            tables[baseline.name] = F.errors(_replays([(p, None, baseline) for p in prepared], workers))
    except KvlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({name: rows for name, rows in tables.items()}, indent=1))
        return 0
    names = list(tables)
    print(f"{'run':<44} {'metric':<9} {'measured':>9}" + "".join(f" {n[:22]:>22}" for n in names))
    first = tables[names[0]]
    for i, row in enumerate(first):
        cells = "".join(f" {tables[n][i]['predicted'] * 1e3:>12.1f} {tables[n][i]['error']:>+8.1%}" for n in names)
        print(f"{row['label'][:44]:<44} {row['metric']:<9} {row['measured'] * 1e3:>9.1f}{cells}")
    print(f"\nmedian |error| over {len(runs)} runs (ms values above; errors = predicted / measured - 1):")
    print(f"{'metric':<10}" + "".join(f" {n[:22]:>22}" for n in names))
    for metric in METRICS:
        print(f"{metric:<10}" + "".join(f" {F.median_abs_errors(tables[n])[metric]:>22.1%}" for n in names))
    print(f"({time.time() - started:.0f} s)", file=sys.stderr)
    return 0


def _replays(jobs: list, workers: int) -> list:
    from kvlab.cost import fit as F

    return F.replay_all(jobs, workers)


def _arrivals(seeds) -> str:
    return "evenly spaced" if seeds is None else f"drawn, seeds {','.join(map(str, seeds))}, pooled"


def reads(path: Path, profile_name: str, started: float, sent: bool = False, profiles_own: bool = True,
          seeds=None) -> int:
    """The ``--reads`` table (module doc); ``profiles_own``: the arrivals the profile's [fit] records, else ``seeds``."""
    from kvlab.cost import fit as F
    from kvlab.cost.measured import read_runs
    from kvlab.cost.profiles import get_profile
    from kvlab.errors import KvlabError

    try:
        runs = read_runs(path)
        profile = get_profile(profile_name)
        constants = {k: profile.constants.get(k, F.START[k]) for k in F.CONSTANTS} | F.carried(profile.constants)
        seeds = F.arrivals_of(profile.fit) if profiles_own else seeds
        print(f"{len(runs)} runs from {path}, replayed under {profile.name!r}; arrivals {_arrivals(seeds)}",
              file=sys.stderr)
        print(f"{'run':<16} {'model':<22} {'tp':>2} {'seqs':>5} {'max':>4} {'pre':>4} {'weights':>8} {'KV':>6} "
              f"{'ITL':>6} {'ratio':>6} {'kvlab ITL':>9} | {'TTFT p99':>8} {'1st round max':>13} {'later max':>9} "
              f"{'measured p99':>12} | p99 by stage, kvlab/measured")
        for run in runs:
            print(_reads_row(F.replay(F.prepare(run, sent=sent, arrival_seeds=seeds), constants)), flush=True)
    except KvlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("(ms; seqs: mean sequences per iteration a decoded token shares; max: the most in one iteration; pre: "
          "preemptions; weights, KV: what it reads per output token at 100% of peak bandwidth; ITL: (E2E mean - "
          "TTFT mean) / (output - 1), measured; ratio: (weights + KV) / ITL; 1st round: each prompt's first "
          f"request, a whole prompt to prefill; s0, s1: the load stages)\n({time.time() - started:.0f} s)",
          file=sys.stderr)
    return 0


def _reads_row(replay) -> str:
    import numpy as np

    run = replay.prepared.run
    per_token = replay.per_output_token()
    weights, kv, seqs = per_token[0], per_token[1], per_token[5]
    implied = ((run.measured("summary", "e2e_mean") - run.measured("summary", "ttft_mean"))
               / (run.workload.output_len - 1))
    ttft = replay.client_ttft()
    first = replay.within < replay.prepared.spec.num_users  # (each prompt's first request, in each draw)
    first_max = float(ttft[first].max())
    later_max = float(ttft[~first].max()) if (~first).any() else float("nan")
    predicted = replay.predicted()
    stages = " ".join(f"s{k} {predicted[f'stage{k}']['ttft_p99'] * 1e3:.1f}/{run.measured(group, 'ttft_p99') * 1e3:.1f}"
                      for k, group in enumerate(run.groups))  # (a one-stage run publishes its summary)
    return (f"{run.id[:16]:<16} {replay.prepared.model_spec.id[:22]:<22} {run.tensor_parallel_size:>2} "
            f"{seqs:>5.1f} {int(replay.phi[:, 5].max()):>4} {replay.num_preemptions:>4} {weights * 1e3:>8.2f} "
            f"{kv * 1e3:>6.2f} {implied * 1e3:>6.2f} {(weights + kv) / implied:>6.3f} "
            f"{predicted['summary']['itl_mean'] * 1e3:>9.2f} | {np.percentile(ttft, 99) * 1e3:>8.1f} "
            f"{first_max * 1e3:>13.1f} {later_max * 1e3:>9.1f} {run.measured('summary', 'ttft_p99') * 1e3:>12.1f} "
            f"| {stages}")


def draws(path: Path, profile_name: str, num: int, started: float, workers: int = 1) -> int:
    """The ``--draws`` table (module doc)."""
    import itertools

    import numpy as np

    from kvlab.cost import fit as F
    from kvlab.cost.measured import METRICS, read_runs
    from kvlab.cost.profiles import get_profile
    from kvlab.errors import KvlabError

    try:
        runs = read_runs(path)
        profile = get_profile(profile_name)
        constants = {k: profile.constants.get(k, F.START[k]) for k in F.CONSTANTS} | F.carried(profile.constants)
        print(f"{len(runs)} runs from {path}, replayed under {profile.name!r} once per seed 0 .. {num - 1}",
              file=sys.stderr)
        latencies = {}  # (run, seed): each request's E2E and TTFT
        replays = F.replay_all([(F.prepare(run, arrival_seeds=range(num)), constants, None) for run in runs], workers)
        for run, replay in zip(runs, replays):
            e2e = replay.finish + replay._lag(run.workload.output_len) - replay.arrival + replay.shift_s
            per = len(replay.arrival) // num
            for seed in range(num):
                chosen = slice(seed * per, (seed + 1) * per)
                latencies[run.id, seed] = (e2e[chosen], replay.client_ttft()[chosen])
    except KvlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    metrics = [m for m in METRICS if m != "itl_mean"] + ["itl_mean"]

    def errors_of(seeds) -> dict:
        out = {}
        for run in runs:
            e = np.concatenate([latencies[run.id, s][0] for s in seeds])
            t = np.concatenate([latencies[run.id, s][1] for s in seeds])
            got = {"e2e_mean": e.mean(), "e2e_p90": np.percentile(e, 90), "e2e_p99": np.percentile(e, 99),
                   "ttft_mean": t.mean(), "ttft_p90": np.percentile(t, 90), "ttft_p99": np.percentile(t, 99),
                   "itl_mean": (e.mean() - t.mean()) / (run.workload.output_len - 1)}
            out[run.id] = {m: got[m] / run.measured("summary", m) - 1.0 for m in metrics}
        return out

    alone = [errors_of([s]) for s in range(num)]
    print("median |error| over the runs, each draw alone (seed 0, 1, ...):")
    for m in metrics:
        values = [np.median([abs(e[r.id][m]) for r in runs]) for e in alone]
        print(f"  {m:<10} " + " ".join(f"{v:.1%}" for v in values) + f"   (spread {max(values) - min(values):.1%})")
    pooled = errors_of(range(num))
    print(f"rms over runs and pools of a pool of K draws' error less the pool of all {num} (points):")
    print(f"  {'K':<10} " + " ".join(f"{m:>9}" for m in metrics))
    for k in (1, 2, 4):
        if k >= num:
            break
        pools = [errors_of(c) for c in itertools.combinations(range(num), k)][:70]
        rms = [np.sqrt(np.mean([(p[r.id][m] - pooled[r.id][m]) ** 2 for p in pools for r in runs])) for m in metrics]
        print(f"  {k:<10} " + " ".join(f"{v * 100:>9.2f}" for v in rms))
    print(f"({time.time() - started:.0f} s)", file=sys.stderr)
    return 0


# Terms screened for the decode step's attention (``--screen``; docs/cost.md, "Terms tried and not kept"): each a column
# per iteration beside the profile's, from the replay's iteration fields (num_seqs, prefill, decode, context, pairs)
# and the run's model; a time per unit (seconds) or, for the reads, a multiple of their time at 100% of the bandwidth.
def _screened() -> dict:
    def mha(r) -> bool:
        m = r.prepared.model_spec
        return m.num_attention_heads == m.num_key_value_heads

    def heads(r, kind: str) -> float:
        m = r.prepared.model_spec
        count = m.num_attention_heads if kind == "query" else m.num_key_value_heads
        return m.num_hidden_layers * count / r.prepared.run.tensor_parallel_size

    def group(r) -> float:
        return r.prepared.model_spec.num_attention_heads / r.prepared.model_spec.num_key_value_heads

    return {
        "mha-kv": ("an MHA model's K/V read at an efficiency of its own (the KV column again, MHA runs only)",
                   lambda r, f: f[3] * r.prepared.kv_token_s * float(mha(r))),
        "kv-per-query-head": ("K/V read once per query head, not per KV head (GQA's sharing lost: KV x group size)",
                              lambda r, f: f[3] * r.prepared.kv_token_s * group(r)),
        "kv-head-items": ("a time per sequence, KV head and layer (the decode kernel's work items; MHA has 4-8x more)",
                          lambda r, f: f[0] * heads(r, "kv")),
        "query-head-items": ("a time per sequence, query head and layer", lambda r, f: f[0] * heads(r, "query")),
        "kv-blocks": ("a time per KV block (16 tokens) per layer read (the block table's indirection)",
                      lambda r, f: f[3] / 16 * r.prepared.model_spec.num_hidden_layers),
        "attention-by-context": ("the KV read x the mean context per sequence / 1,000 (clock54's, for comparison)",
                                 lambda r, f: f[3] * r.prepared.kv_token_s * f[3] / (1000 * f[0].clip(1))),
        "one-hbm-efficiency": ("the K/V read at the weights' efficiency (attention_bandwidth_efficiency not fitted)",
                               None),
    }


def _screen_rows(r, column):
    """The run's per-request E2E and TTFT rows over CONSTANTS' θ and, with a column, the term's coefficient last."""
    import dataclasses

    import numpy as np

    if column is None:
        return r.request_parts()[:2]
    parts = dataclasses.replace(r, phi=np.column_stack([r.phi, column]), _parts=None).request_parts()
    return tuple(np.column_stack([x[:, :9], x[:, 10:], x[:, 9:10]]) for x in parts[:2])


def _screen_equations(r, e2e, ttft) -> list:
    """(row, measured) for each fitted mean of each group, as Replay.equations builds them from these rows."""
    from kvlab.cost import fit as F

    out_len, rows = r.prepared.run.workload.output_len, []
    for group in r.prepared.run.groups:
        chosen = slice(None) if group == "summary" else r.stage == int(group[5:])
        a, b = e2e[chosen].mean(axis=0), ttft[chosen].mean(axis=0)
        for metric, vector in (("e2e_mean", a), ("ttft_mean", b), ("itl_mean", (a - b) / (out_len - 1))):
            if metric != "itl_mean" or F.itl_consistent(r.prepared.run, group):
                rows.append((vector, r.prepared.run.measured(group, metric)))
    return rows


def _screen_one(replays, fitted, constants, column_of) -> tuple[dict, list]:
    """Leave-one-out on the replays' equations with the candidate column (None: none): each run priced by its fold's
    θ on its own per-request rows; per run the metrics' errors, and the term's value in each fold."""
    import numpy as np

    from kvlab.cost import fit as F
    from kvlab.cost.measured import METRICS

    terms = () if column_of is None else ("screened",)
    rows = [_screen_rows(r, None if column_of is None else column_of(r, r.fields)) for r in replays]
    equations = [_screen_equations(r, *x) for r, x in zip(replays, rows)]
    errors, values = {}, []
    for i, r in enumerate(replays):
        fold = F._solve_once([q for j, eq in enumerate(equations) if j != i for q in eq], (*fitted, *terms), constants,
                             terms=terms)
        theta = np.concatenate([F.theta_of({**F.START, **fold.constants}), [fold.constants[k] for k in terms]])
        values += [fold.constants[k] for k in terms] or [fold.constants["attention_bandwidth_efficiency"]]
        e2e, ttft = rows[i][0] @ theta, rows[i][1] @ theta
        out_len = r.prepared.run.workload.output_len
        got = {"e2e_mean": e2e.mean(), "e2e_p90": np.percentile(e2e, 90), "e2e_p99": np.percentile(e2e, 99),
               "ttft_mean": ttft.mean(), "ttft_p90": np.percentile(ttft, 90), "ttft_p99": np.percentile(ttft, 99),
               "itl_mean": (e2e.mean() - ttft.mean()) / (out_len - 1)}
        errors[r.prepared.run.id] = {k: got[k] / r.prepared.run.measured("summary", k) - 1.0 for k in METRICS}
    return errors, values


def screen(path: Path, profile_name: str, started: float) -> int:
    """The ``--screen`` table (module doc)."""
    import numpy as np

    from kvlab.cost import fit as F
    from kvlab.cost.measured import METRICS, read_runs
    from kvlab.cost.profiles import get_profile
    from kvlab.errors import KvlabError

    try:
        runs = read_runs(path)
        profile = get_profile(profile_name)
        constants = {k: profile.constants.get(k, F.START[k]) for k in F.CONSTANTS} | F.carried(profile.constants)
        fitted = tuple(k for k in profile.fit.get("fitted", F.DEFAULT_FIT) if k in F.CONSTANTS)
        print(f"{len(runs)} runs from {path}, replayed once under {profile.name!r}; each candidate fitted with "
              f"{', '.join(fitted)} by leave-one-out on those replays' equations", file=sys.stderr)
        replays = [F.replay(F.prepare(run), constants) for run in runs]
        print(f"{'candidate':<22}" + "".join(f" {m:>9}" for m in METRICS) + "  term by fold", flush=True)
        for name, (_, column_of) in {"none": ("", None), **_screened()}.items():
            used, fit_list = replays, fitted
            if name == "one-hbm-efficiency":  # (the KV column moved into the weights')
                used = [_merged(r) for r in replays]
                fit_list = tuple(k for k in fitted if k != "attention_bandwidth_efficiency")
                column_of = None
            errors, values = _screen_one(used, fit_list, constants, column_of)
            medians = [np.median([abs(e[m]) for e in errors.values()]) for m in METRICS]
            span = f"  {min(values):.3g} to {max(values):.3g}" if column_of is not None else ""
            print(f"{name:<22}" + "".join(f" {v:>9.1%}" for v in medians) + span, flush=True)
            if name == "none":  # (what carries the K/V read: its share of the steps, the efficiency each fold fits)
                theta = F.theta_of(constants)
                print("  per run: the K/V read's and the compute-bound iterations' shares of its time, and "
                      "attention_bandwidth_efficiency fitted with the run left out: " + " ".join(
                          f"{r.prepared.run.id[:8]} {theta[1] * r.phi[:, 1].sum() / r.durations.sum():.0%} "
                          f"{theta[2] * r.phi[:, 2].sum() / r.durations.sum():.1%} {v:.3f}"
                          for r, v in zip(replays, values)))
            else:
                print("  " + " ".join(f"{k[:8]} {e['e2e_mean']:+.1%}/{e['itl_mean']:+.1%}" for k, e in errors.items()))
    except KvlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("(median |error| over the runs, each priced by a fit without it on the one replay's schedule; under each "
          "candidate, per run: E2E mean / ITL errors; the term's value in the 13 folds, seconds per unit or a multiple "
          f"of its read at 100% of the bandwidth)\n({time.time() - started:.0f} s)", file=sys.stderr)
    return 0


def _merged(r):
    import dataclasses

    phi = r.phi.copy()
    phi[:, 0] += phi[:, 1]
    phi[:, 1] = 0.0
    return dataclasses.replace(r, phi=phi, _parts=None)


if __name__ == "__main__":
    sys.exit(main())
