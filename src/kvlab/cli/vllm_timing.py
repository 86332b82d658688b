"""``kvlab vllm calibrate``: time the real engine's steps in-process, fit a profile, check it on other workloads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from kvlab.cli.app import vllm_app
from kvlab.cli.options import working
from kvlab.errors import KvlabError
from kvlab.report.text import constant_text
from kvlab.validate import check_options, check_output_path

ARRIVALS = ("poisson", "gamma", "burst")


@vllm_app.command("calibrate")
def calibrate(
    out: Path = typer.Option(Path("vllm-cpu.toml"), "--out", "-o", help="Profile file to write (.toml or .json); "
                             "give it to kvlab run --cost FILE."),
    name: str | None = typer.Option(None, "--name", help="The profile's name \\[default: the file's stem]."),
    num_requests: int | None = typer.Option(None, "--num-requests", "-n", help="Requests of the calibration "
                                            "workload \\[default: 80].", show_default=False),
    rate: float | None = typer.Option(None, "--rate", help="Their rate, req/s \\[default: 5].", show_default=False),
    arrival: str | None = typer.Option(None, "--arrival", help="poisson, gamma or burst (all at once) \\[default: "
                                       "gamma].", show_default=False),
    cv: float | None = typer.Option(None, "--cv", help="Coefficient of variation of gamma gaps \\[default: 2].",
                                    show_default=False),
    seed: int | None = typer.Option(None, "--seed", help="Random seed of the calibration workload \\[default: 1].",
                                    show_default=False),
    fit: str | None = typer.Option(None, "--fit", help="Constants to fit, comma-separated (the rest are 0) "
                                   "\\[default: every one the steps identify; each one they cannot is named].",
                                   show_default=False),
    check: bool = typer.Option(True, "--check/--no-check", help="Replay two other workloads in real time, each "
                               "twice (the calibration before, between and after them), and put kvlab's predictions on "
                               "the profile beside them."),
    cpu: int = typer.Option(0, "--cpu", help="The CPU the engine runs on, alone among kvlab's processes."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Time the real vLLM engine's steps in-process, fit a cost profile to them, and check it on other loads.

    The engine (vllm-cpu, a dummy-weight Llama) runs in one process pinned to --cpu, with no API server and no HTTP client: requests are added at their arrival times and every step is timed (docs/cost.md)."""  # noqa: E501

    from kvlab.cost.profiles import write_profile
    from kvlab.vllm import timing
    from kvlab.vllm.install import require_installed

    if out.suffix.lower() not in (".toml", ".json"):
        raise KvlabError(f"--out {str(out)!r}: a profile file ends in .toml or .json")
    check_output_path(out, "--out", folder=False, own="profile")  # (before the minutes of work, not after)
    if arrival is not None and arrival not in ARRIVALS:
        raise KvlabError(f"--arrival {arrival!r} is not one of: {', '.join(ARRIVALS)}")
    check_options({"num_requests": num_requests, "rate": rate, "cv": cv, "seed": seed})
    timing.check_cpu(cpu)
    names = tuple(k.strip() for k in fit.split(",") if k.strip()) if fit is not None else None
    if names is not None:
        timing.check_fit(names)
    given = {"num_requests": num_requests, "rate": rate, "arrival": arrival, "cv": cv, "seed": seed}
    calibration_workload = replace(timing.CALIBRATION, **{k: v for k, v in given.items() if v is not None})
    require_installed()
    workloads = timing.design(calibration_workload) if check else [
        (calibration_workload.name, calibration_workload.requests())]
    with working(f"Running {len(workloads)} workload{'s' * (len(workloads) != 1)} through the real engine in real "
                 f"time on CPU {cpu} (a few minutes: the engine's start and every request's real time)"):
        runs = timing.run_timed(workloads, cpu=cpu)
    calibration = timing.fit_steps(timing.calibration_runs(runs), names)
    document = timing.profile_document(calibration, name or out.stem, model="tiny_llama (wide: timing.WIDE_MODEL)")
    write_profile(document, out)
    rows = timing.check_rows(runs, document) if check else []
    if as_json:
        typer.echo(json.dumps({"profile": document, "path": str(out), "calibration_workload": calibration_workload.describe(),
                               "not_identified": list(calibration.not_identified),
                               "runs": [{"workload": r.workload, **r.figures(), "timing": r.timing} for r in runs],
                               "check": [{"workload": r.workload, "figure": r.figure, "measured": list(r.measured),
                                          "run_to_run": r.run_to_run, "kvlab": r.kvlab, "error": r.error,
                                          "tolerance": r.tolerance, "ok": r.ok} for r in rows]}, indent=1))
    else:
        _print(calibration, calibration_workload, rows, out, runs)
    if any(not row.ok for row in rows):
        raise typer.Exit(1)


def _print(calibration, design, rows, out: Path, runs) -> None:
    from rich.console import Console

    from kvlab.cost.calibrate import significance
    from kvlab.vllm import timing

    console = Console(highlight=False)
    fit = calibration.fit
    console.print(f"Calibrated on {design.describe()}: {fit.num_iterations} engine steps timed in-process, R² "
                  f"{fit.r2:.3f} (median residual {fit.median_abs_relative_residual:.1%} of a step).")
    for k in fit.fitted:
        console.print(f"  {k:<26} {constant_text(k, fit.constants[k]):>10} ± {constant_text(k, fit.sigma[k])}")
    for sentence in calibration.not_identified:
        console.print(f"  not fitted (0): {sentence}", style="yellow")
    for sentence in significance(fit, timing.ENGINE_STEPS):
        console.print(f"  warning: {sentence}", style="yellow")
    console.print(f"Wrote {out}: kvlab run --cost {out} ...")
    if rows:
        console.print(f"\nChecked on {'; '.join(w.describe() for w in timing.CHECKS)}; each run twice (engine "
                      "runs), kvlab for each at the machine's speed then (a fixed probe's), allowed: the issue's tolerance "
                      "or the engine's own run-to-run difference:")
        for line in timing.format_rows(rows):
            console.print(line)
        loads = ", ".join(f"{r.timing.get('load_average_start', [0])[0]:.1f}" for r in runs)
        console.print(f"Load average (1 min) at the start of each run: {loads}.")
