"""How long a user waits for kvlab's answers: the capacity search, the fewest replicas, the lab's first screen.

    python benchmarks/bench_answers.py                  # all three, each cold (a fresh store and cache)
    python benchmarks/bench_answers.py --only lab       # one of capacity, replicas, lab
    python benchmarks/bench_answers.py --json

Issue 34 asks for these to be measured where a user feels them. Each is run cold, as a first-time user meets it:
a fresh folder for the sweep store (``--out``) and a fresh ``KVLAB_CACHE_DIR``, so no simulation is reused.

  capacity   ``kvlab capacity --out DIR`` on the bundled defaults (OPT-13B on one A100-40GB, the ShareGPT stand-in,
             every built-in cost profile that applies, two samples each), as a subprocess: wall time and the CPU
             time of the command and its worker processes.
  replicas   ``kvlab capacity --replicas auto --rate 8 --strategy vllm --slo 'p99_ttft<2s' --out DIR``: docs/fleet.md's
             example (two routers, two profiles, two samples).
  lab        the lab's first screen: ``kvlab lab``'s app (in-process, Starlette's test client, no socket) asked for
             what the page asks for when it opens: the page, its script, the catalogue, then the breaking points
             of the two systems the first figure's opening rate is read from (``/api/rates`` with the catalogue's
             defaults and ``systems=`` the catalogue's ``rate_systems.opening``, as lab-rates.js's
             ``RateFigure.opening`` asks; section 7's other two are asked for later, once the figure has
             stopped). Until they are in, the first screen says it is finding the rate. Wall time of each, and
             the simulations the server ran.

Wall times drift with the machine's load (±20% here); the load average is printed beside them. ``--workers`` is
the commands' default (the number of cores) unless given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = {
    "capacity": ["capacity"],
    "replicas": ["capacity", "--replicas", "auto", "--rate", "8", "--strategy", "vllm", "--slo", "p99_ttft<2s"],
}


def kvlab_command() -> list[str]:
    """This checkout's kvlab, run by the interpreter running the benchmark."""
    return [sys.executable, "-c", "import sys; from kvlab.cli import main; sys.exit(main(sys.argv[1:]))"]


def environment(cache: str) -> dict[str, str]:
    env = {**os.environ, "KVLAB_CACHE_DIR": cache, "COLUMNS": "120"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    return env


def timed_command(name: str, workers: int | None) -> dict:
    """One cold run of a command: wall seconds, and CPU seconds of it and its children."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [*COMMANDS[name], "--out", str(Path(tmp) / "out")] + (["--workers", str(workers)] if workers else [])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(kvlab_command() + args, env=environment(str(Path(tmp) / "cache")),
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: kvlab {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    simulations = re.search(r"Computed\s+([\d,]+)\s+simulations", done.stdout)
    return {"case": name, "command": "kvlab " + " ".join(args[:-2] if not workers else args), "wall_s": wall,
            "cpu_s": cpu, "note": f"{simulations.group(1)} simulations" if simulations else ""}


def lab_first_screen() -> dict:
    """The page's first requests, in order, on a fresh app and cache: each one's wall seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KVLAB_CACHE_DIR"] = tmp
        sys.path.insert(0, str(REPO / "src"))
        start = time.perf_counter()
        from starlette.testclient import TestClient

        from kvlab.web.server import create_app

        steps = {}
        with TestClient(create_app(), base_url="http://127.0.0.1") as client:
            steps["app"] = time.perf_counter() - start
            for path in ("/", "/static/lab.js", "/api/catalog"):
                t = time.perf_counter()
                response = client.get(path)
                response.raise_for_status()
                steps[path] = time.perf_counter() - t
            catalog = response.json()
            d = catalog["defaults"]
            query = {k: d[k] for k in ("model", "gpu", "workload", "num_requests", "seed", "block_size")}
            query["systems"] = ",".join(catalog["rate_systems"]["opening"])  # (lab-rates.js: RateFigure.opening)
            t = time.perf_counter()
            response = client.get("/api/rates", params=query)
            response.raise_for_status()
            steps["/api/rates?systems=" + query["systems"]] = time.perf_counter() - t
            rate = response.json()["lesson_rate"]
            simulations = client.app.state.rates.runner.num_computed
        total = time.perf_counter() - start
    return {"case": "lab", "wall_s": total, "steps_s": steps,
            "note": f"opening rate {rate:g} req/s, {simulations} simulations", "cpu_s": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="capacity,replicas,lab", help="comma-separated: capacity, replicas, lab")
    parser.add_argument("--workers", type=int, default=None, help="worker processes for the two commands")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ("capacity", "replicas", "lab")]
    if unknown or not cases:
        parser.error(f"--only {args.only!r}: valid: capacity, replicas, lab (comma-separated)")
    rows = []
    for case in cases:
        row = lab_first_screen() if case == "lab" else timed_command(case, args.workers)
        row["load_average"] = os.getloadavg()[0]
        rows.append(row)
        if not args.json:
            cpu = f", CPU {row['cpu_s']:.1f} s" if row["cpu_s"] is not None else ""
            print(f"{case:<9} {row['wall_s']:7.1f} s wall{cpu} (load {row['load_average']:.1f}) {row['note']}")
            if case == "lab":
                print("          " + ", ".join(f"{k} {v:.2f} s" for k, v in row["steps_s"].items()))
            else:
                print(f"          {row['command']}")
    if args.json:
        print(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
