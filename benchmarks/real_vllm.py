"""kvlab against real vLLM runs on real GPUs: every calibration run replayed with its own settings.

    python benchmarks/real_vllm.py [--runs PATH] [--profile NAME] [--baseline NAME ...] [--json] [--closed-loop]

For each run of the measured-runs file (default: the calibration set, ../shared/data/real-vllm/trainval.json
beside the repository; its README says what the runs are and where they come from) and each metric (E2E, TTFT:
mean, p90, p99; ITL mean), over all the run's requests: the measured value, kvlab's prediction under the fitted
profile with the run left out of the fit (leave-one-out: the profile's constants refitted on the other runs'
equations, kvlab/cost/fit.py) and under each baseline profile (default: roofline), and the errors; then the
median |error| per metric. The fitted profile's leave-one-out errors are what `kvlab cost` and every output quote.
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
    from kvlab.errors import KvlabError

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=None, help="measured-runs file (default: the calibration set)")
    parser.add_argument("--profile", default="vllm-h100", help="the fitted profile to check by leave-one-out")
    parser.add_argument("--baseline", action="append", default=None, help="baseline profile(s) (default roofline)")
    parser.add_argument("--json", action="store_true", help="print every row as JSON")
    parser.add_argument("--closed-loop", action="store_true", help="replay multi-turn users as inference-perf's "
                        "client serialises them (a round waits for the user's previous answer; docs/cost.md)")
    args = parser.parse_args(argv)
    path = args.runs or default_runs()
    started = time.time()
    try:
        runs = read_runs(path)
        profile = get_profile(args.profile)
        baselines = [get_profile(name) for name in (args.baseline or ["roofline"])]
        fitted = tuple(profile.fit.get("fitted", F.CONSTANTS))
        constants = {k: profile.constants.get(k, F.START[k]) for k in F.CONSTANTS}
        prepared = [F.prepare(run, args.closed_loop) for run in runs]
        print(f"{len(runs)} runs from {path}; fitted profile {profile.name!r} left out run by run; "
              f"baselines {', '.join(b.name for b in baselines)}", file=sys.stderr)
        calibration = F.Calibration(fit=F.Fit(constants, {}, fitted, 0, 0.0),
                                    replays=[F.replay(p, constants) for p in prepared], iterations=0)
        tables = {f"{profile.name} (LOO)": F.errors(F.leave_one_out(calibration))}
        for baseline in baselines:
            tables[baseline.name] = F.errors([F.replay(p, profile=baseline) for p in prepared])
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


if __name__ == "__main__":
    sys.exit(main())
