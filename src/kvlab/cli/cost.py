"""``kvlab cost``: the cost profiles and their sources; ``kvlab calibrate``: a profile fitted to a real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt
from kvlab.errors import KvlabError, require_scipy
from kvlab.report.text import constant_text, constants_table
from kvlab.validate import check_output_path


@app.command("cost")
def cost(
    name: Annotated[str | None, typer.Argument(help="One profile (a name or a .toml/.json file) "
                                                  "\\[default: every built-in one].", show_default=False)] = None,
    as_json: JsonOpt = False,
) -> None:
    """The cost profiles that set kvlab's clock (choose one with --cost): constants, sources and fits."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kvlab.cost.profiles import KINDS, builtin_file, builtin_profiles, get_profile

    profiles = [get_profile(name)] if name else list(builtin_profiles().values())
    if as_json:
        typer.echo(json.dumps({"profiles": [p.to_json() for p in profiles]}, indent=1, ensure_ascii=False))
        return
    console = Console(highlight=False)
    for kind, constants in KINDS.items():
        of_kind = [p for p in profiles if p.kind == kind]
        if not of_kind:
            continue
        # (80 columns: the constants' meanings go below the table, and the profiles are split into as many tables
        # as the console's width needs, so no value is cut short)
        for i, chunk in enumerate(_columns_that_fit(of_kind, constants, console.width)):
            title = f"Cost profiles: {kind} (kvlab run --cost NAME; docs/cost.md)" if i == 0 else None
            table = Table(title=title, title_justify="left",
                          header_style="bold underline", box=None, pad_edge=False)
            table.add_column("constant", no_wrap=True)
            for p in chunk:
                table.add_column(p.name, justify="right", no_wrap=True)
            for constant in constants:
                table.add_row(constant, *(constant_text(constant, p.constants[constant])
                                          if constant in p.constants else "-" for p in chunk))
            console.print(table)
        for constant, meaning in constants.items():
            console.print(f"  [bold]{constant}[/]: {meaning}")
        console.print()
    for p in profiles:
        fitted = f" (fitted for {', '.join(x for x in (p.model, p.gpu) if x)})" if p.model or p.gpu else ""
        console.print(f"[bold]{p.name}[/]{fitted}: {escape(p.source)}")  # a source may name [fit]
    if name and (file := builtin_file(profiles[0].name)) is not None and not profiles[0].path:
        console.print(f"A profile of your own: copy {file}, change its name and [constants], and give the copy "
                      "as --cost FILE (kvlab cost FILE shows it).", markup=False)


def _columns_that_fit(profiles, constants, width: int) -> list[list]:
    """The profiles in runs whose table (the constants' column, then one per profile) fits in `width` columns."""
    def needed(p) -> int:
        values = [constant_text(c, p.constants[c]) if c in p.constants else "-" for c in constants]
        return 2 + max(len(p.name), *(len(v) for v in values))

    used, chunks = max(len(c) for c in constants), [[]]
    left = used
    for p in profiles:
        if chunks[-1] and left + needed(p) > width:
            chunks.append([])
            left = used
        chunks[-1].append(p)
        left += needed(p)
    return chunks


@app.command()
def calibrate(
    ctx: typer.Context,
    directories: Annotated[list[Path] | None, typer.Argument(help="Folders written by kvlab bench --out DIR.",
                                                             show_default=False)] = None,
    runs: Annotated[Path | None, typer.Option("--runs", help="Measured runs as published (JSON in the "
                                              "calibration set's format, trainval.json: workload, engine settings, "
                                              "summary metrics): fit an efficiency profile across them, with "
                                              "leave-one-out errors.", show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile file to write (.toml or .json); give it to "
                                      "kvlab run --cost FILE.")] = Path("calibrated.toml"),
    name: Annotated[str | None, typer.Option("--name", help="The profile's name \\[default: the file's "
                                                "stem].")] = None,
    fit: Annotated[str | None, typer.Option("--fit", help="Constants to fit, comma-separated. Bench folders: "
                                            "weights_read_s, context_token_s, token_s, overhead_s, seq_overhead_s, "
                                            "prefill_token_overhead_s, request_latency_s (the rest 0; default all). "
                                            "--runs: efficiencies and seconds (kvlab.cost.fit.CONSTANTS; the rest at "
                                            "their start; default all but flops_efficiency and "
                                            "prefill_token_overhead_s), and on a grid admission_lag_iterations, "
                                            "lag_jitter_iterations, lag_step_probability.", show_default=False)] = None,
    server_log: Annotated[Path | None, typer.Option("--server-log", help="The vLLM server's log, started with "
                                                    "--enable-logging-iteration-details: time the iterations from "
                                                    "the server's own account of each step instead of the token "
                                                    "streams.")] = None,
    model: Annotated[str, typer.Option("--model", help="The model the server ran, as kvlab names it (a run of "
                                       "another model warns).")] = "",
    gpu: Annotated[str, typer.Option("--gpu", help="What the server ran on (e.g. cpu); a run on another "
                                     "warns.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit as JSON.")] = False,
    start: Annotated[str | None, typer.Option("--start", help="With --runs: start the fixed point from this "
                                              "profile's constants (a name or file) instead of the roofline's.",
                                              show_default=False)] = None,
    iterations: Annotated[int, typer.Option("--iterations", help="With --runs: most replay-and-fit rounds "
                                            "(1 to 20).")] = 4,
    client_defaults: Annotated[bool, typer.Option("--client-defaults", help="With --runs: replay the prompts an "
                                                  "inference-perf older than February 2026 sent in place of the "
                                                  "users the runs name (its defaults: 10 system prompts x 10 "
                                                  "questions, single turn), as the calibration set's client "
                                                  "did (docs/cost.md).")] = False,
    hold_unidentified: Annotated[bool, typer.Option("--hold-unidentified", help="With --runs: hold at its start "
                                                    "(and name) each constant whose standard error is not below its "
                                                    "value, and fit the rest again (by default every constant asked "
                                                    "for is fitted, with its σ).")] = False,
    arrivals: Annotated[str | None, typer.Option("--arrivals", help="With --runs: seeds of inference-perf's drawn "
                        "arrivals, a replay each, pooled (0,1 or 0-7) \\[default: 0-3]; 'even': evenly spaced.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="With --runs: replay in this many processes.")] = 1,
) -> None:
    """Fit a cost profile to a real server's iterations by least squares.

    From its token timings (kvlab bench --out DIR) or, with --server-log, from its own log of each step."""
    from kvlab.cost.calibrate import calibrate as run_calibration
    from kvlab.cost.calibrate import significance
    from kvlab.cost.profiles import write_profile

    if out.suffix.lower() not in (".toml", ".json"):
        raise KvlabError(f"--out {str(out)!r}: a profile file ends in .toml or .json")
    check_output_path(out, "--out", folder=False, own="profile")  # (before the minutes of work, not after)
    if runs is not None:
        _calibrate_runs(runs, out, name or out.stem, fit, as_json, start, iterations, bool(directories or server_log),
                        client_defaults, hold_unidentified, arrivals, workers)
        return
    _check_bench_fit_options(ctx, client_defaults, hold_unidentified, start, iterations, arrivals, workers)
    if not directories:
        raise KvlabError("kvlab calibrate needs bench folders (kvlab bench --out DIR) or --runs FILE (measured "
                         "runs as published)")
    names = _bench_fit_names(fit)
    fitted_for = _fitted_model(model)  # (before the fit's minutes)
    require_scipy("kvlab calibrate")  # (once the arguments are checked: trial 60, finding 9i)
    result = run_calibration(list(directories), names, server_log=server_log)
    document = result.profile(name or out.stem, model=fitted_for, gpu=gpu)
    write_profile(document, out)
    weak = significance(result)
    if as_json:
        from kvlab.cost.calibrate import fit_quality

        line, poor = fit_quality(result)
        typer.echo(json.dumps({"profile": document, "path": str(out), "weakly_determined": weak,
                               "fit_quality": {"summary": line, "poor": poor}}, indent=1, ensure_ascii=False))
        return
    _print_bench_fit(result, out, weak)


def _bench_fit_names(fit: str | None) -> tuple[str, ...] | None:
    """--fit's constants for a fit on bench folders (None: all); a list that names none is refused."""
    if fit is None:
        return None
    names = tuple(k.strip() for k in fit.split(",") if k.strip())
    if not names:
        from kvlab.cost.calibrate import FIT_HINTS

        raise KvlabError(f"--fit {fit!r} names no constant; valid: one or more of {', '.join(FIT_HINTS)}, "
                         "comma-separated (overhead_s among them), or no --fit for all")
    return names


def _check_bench_fit_options(ctx: typer.Context, client_defaults: bool, hold_unidentified: bool, start, iterations,
                             arrivals: str | None = None, workers: int = 1) -> None:
    """The options of a fit on measured runs (--runs), refused for a fit on bench folders, which has no rounds."""
    source = ctx.get_parameter_source("iterations")
    given_iterations = source is not None and source.name != "DEFAULT"  # (the name: typer's click may be its own)
    for flag, given in (("--client-defaults", client_defaults), ("--hold-unidentified", hold_unidentified),
                        (f"--start {start}", start is not None), (f"--iterations {iterations}", given_iterations),
                        (f"--arrivals {arrivals}", arrivals is not None), (f"--workers {workers}", workers != 1)):
        if given:
            raise KvlabError(f"{flag} is for a fit on measured runs: give it with --runs FILE (a fit on bench "
                             "folders is one least-squares solve)")


def _fitted_model(model: str) -> str:
    """--model as kvlab names it (a catalogue name, config.json or folder; a Hugging Face id as given), so that a
    profile is never written fitted for a model no run can be (a later run of any model would warn of it)."""
    from kvlab.catalog import config, get_model

    if not model or config.looks_like_hf_id(model):
        return model
    try:
        return get_model(model).id
    except KvlabError as exc:
        raise KvlabError(f"--model: {exc}") from None


def _print_bench_fit(result, out: Path, weak: list[str]) -> None:
    """The table ``kvlab calibrate DIR ...`` prints: each constant, its σ and meaning; the residuals; how well the
    fit explains the iterations, as a whole."""
    from rich.console import Console

    from kvlab.cost.calibrate import fit_quality
    from kvlab.cost.profiles import ABSOLUTE_CONSTANTS as MEANING

    console = Console(highlight=False)
    table = constants_table(f"Calibrated from {result.num_iterations} iterations timed from {result.observed_by}, "
                            f"{result.num_requests} requests")
    for k in result.fitted:
        table.add_row(k, constant_text(k, result.constants[k]), constant_text(k, result.sigma[k]), MEANING[k])
    console.print(table)
    median = result.median_abs_relative_residual
    console.print(f"Residuals: rms {result.rms_residual_s * 1e3:.3g} ms over iterations of "
                  f"{result.mean_duration_s * 1e3:.3g} ms on average (median {median:.1%}), R² {result.r2:.3f}.")
    not_fitted = [k for k in result.constants if k not in result.fitted]
    console.print(f"Not fitted (0 in the profile): {', '.join(not_fitted)}.")
    for sentence in weak:
        console.print(f"warning: {sentence}", style="yellow")
    line, poor = fit_quality(result)
    console.print(line)
    if poor:
        console.print(f"warning: {poor}", style="yellow")
    console.print(f"Wrote {out}: kvlab run --cost {out} ...")


class ReplayProgress:
    """After each of calibrate --runs' replays: a line "iteration 2: 5 of 13 runs replayed, 41 s ..." at most
    every EVERY_S seconds (an iteration's last is followed by its own line), so that minutes between rounds are not
    silent and a log does not get a line per replay."""

    EVERY_S = 10.0

    def __init__(self, console):
        import time

        self.console, self.started, self.last = console, time.monotonic(), time.monotonic()

    def __call__(self, what: str, done: int, total: int) -> None:
        import time

        now = time.monotonic()
        if done < total and now - self.last >= self.EVERY_S:
            self.console.print(f"{what}: {done} of {total} runs replayed, {now - self.started:.0f} s in all so far",
                               style="dim")
            self.last = now


def _seeds_and_workers(arrivals: str | None, workers: int):
    """--arrivals' seeds (None: evenly spaced; default fit.ARRIVAL_SEEDS), once --workers is checked."""
    from kvlab.cost.fit import ARRIVAL_SEEDS, parse_arrivals

    if not 1 <= workers <= 64:
        raise KvlabError(f"--workers {workers}: valid: 1 to 64 processes")
    return parse_arrivals(arrivals) if arrivals is not None else ARRIVAL_SEEDS


def _calibrate_runs(path: Path, out: Path, name: str, fit: str | None, as_json: bool, start: str | None,
                    iterations: int, other_sources: bool, client_defaults: bool = False,
                    hold_unidentified: bool = False, arrivals: str | None = None, workers: int = 1) -> None:
    """``kvlab calibrate --runs FILE``: an efficiency profile fitted across measured runs (kvlab/cost/fit.py)."""
    import sys

    from rich.console import Console

    from kvlab.cost.fit import CARRIED, CONSTANTS, DEFAULT_FIT, FIT_HINTS, IDENTIFIED, calibration_profile, unidentified
    from kvlab.cost.measured import read_runs
    from kvlab.cost.profiles import EFFICIENCY_CONSTANTS as MEANING
    from kvlab.cost.profiles import write_profile
    from kvlab.sweep.session import capped_workers

    if not 1 <= iterations <= 20:
        raise KvlabError(f"--iterations {iterations}: valid: 1 to 20 replay-and-fit rounds")
    seeds = _seeds_and_workers(arrivals, workers)
    if other_sources:
        raise KvlabError("--runs fits measured runs; bench folders and --server-log are another kind of "
                         "calibration: give one or the other")
    names = tuple(k.strip() for k in fit.split(",") if k.strip()) if fit is not None else DEFAULT_FIT
    if not names:
        raise KvlabError(f"--fit {fit!r} names no constant; valid: one or more of {', '.join(CONSTANTS)}, "
                         "comma-separated")
    start_constants = None
    if start is not None:
        from kvlab.cost.profiles import get_profile

        start_profile = get_profile(start)
        if start_profile.kind != "efficiency":
            raise KvlabError(f"--start {start!r} is an {start_profile.kind} profile; valid: an efficiency profile")
        # (the constants a fit carries as given, the admission lag among them, come with the fitted ones)
        start_constants = {k: v for k, v in start_profile.constants.items() if k in CONSTANTS or k in CARRIED}
    measured = read_runs(path)
    require_scipy("kvlab calibrate")  # (once the arguments and the runs are read: trial 60, finding 9i)
    workers = capped_workers(workers)  # (checked in range above; at most the cores, saying so)
    console = Console(highlight=False, stderr=True)
    document, report = calibration_profile(measured, names, name=name, source_path=path, start=start_constants,
                                           max_iterations=iterations, sent=client_defaults,
                                           identified=IDENTIFIED if hold_unidentified else None,
                                           arrival_seeds=seeds, workers=workers,
                                           progress=lambda line: console.print(line, style="dim"),
                                           replayed=ReplayProgress(console))
    write_profile(document, out)
    constants, sigma = document["constants"], document["fit"]["sigma"]
    loose = [] if hold_unidentified else unidentified(constants, sigma)
    if as_json:
        typer.echo(json.dumps({"profile": document, "path": str(out), "leave_one_out": report,
                               "not_identified": loose}, indent=1, ensure_ascii=False))
        return
    console = Console(highlight=False, file=sys.stdout)
    table = constants_table(f"Fitted on {len(measured)} measured runs ({path.name}), least squares across runs")
    for k in names:  # (a constant fitted on a grid has the grid's step where a standard error would be)
        spread = "held" if k not in sigma else (f"grid step {constant_text(k, sigma[k])}" if k in CARRIED
                                                 else constant_text(k, sigma[k]))
        table.add_row(k, constant_text(k, constants[k]), spread, MEANING[k])
    console.print(table)
    for k in document["fit"]["held"]:
        fitted_to = document["fit"].get("held_fitted", {}).get(k)
        console.print(f"not identified: {k}, held at its start {constant_text(k, constants[k])}: fitted with the "
                      f"others it came to {constant_text(k, fitted_to) if fitted_to is not None else '?'} with a "
                      f"standard error of {constant_text(k, document['fit']['held_sigma'][k])}, not below that value, "
                      f"so these runs do not separate it from them; more of what would fit it: {FIT_HINTS[k]}",
                      style="yellow")
    if loose:
        console.print(f"not identified, kept as fitted: {', '.join(loose)} (a standard error not below the value, or a "
                      "value at its bound): these runs do not separate them from the other constants, so their values "
                      "mean little on their own; the leave-one-out errors below judge the profile as a whole, and "
                      "--hold-unidentified holds such constants at their start instead", style="yellow")
    medians = document["fit"]["loo_median_abs_error"]
    console.print("Leave-one-out median |error| (each run predicted by a fit on the others): "
                  + ", ".join(f"{m} {v:.1%}" for m, v in medians.items()) + ".")
    console.print(f"Wrote {out}: kvlab run --cost {out} ...")
