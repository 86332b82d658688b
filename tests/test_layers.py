"""The package's layers, read from its imports (ast): no import circle, no upward import.

    cli                      the command line: may import anything below
    faces                    web, bench, paper, vllm, report, and the sweep's plots and session: ask the service;
                             never the command line
    service                  kvlab.service's questions (size, capacity, fewest replicas, the bench workload, who won)
    sweep                    kvlab.sweep's points, store, runner and searches: every point through the run service
    run                      kvlab.service.engine (and the package, which re-exports it): the one way to run the
                             engine
    core                     config, sizing, catalog, workload, memory, sched, cost, metrics, sim, fleet, ...:
                             imports no face, no web framework, no plotting library, nothing of the network

Every import counts, at the top of a module or inside a function (a lazy import is a dependency all the same).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kvlab

ROOT = Path(kvlab.__file__).parent
FACES = ("kvlab.web", "kvlab.bench", "kvlab.paper", "kvlab.vllm", "kvlab.report", "kvlab.sweep.plots",
         "kvlab.sweep.html", "kvlab.sweep.session")
RANKS = {"core": 0, "run": 1, "sweep": 2, "service": 3, "face": 4, "cli": 5}
# Libraries that belong to the faces: the core draws nothing, serves nothing, stores nothing, talks to no one.
FACE_LIBRARIES = ("typer", "click", "rich", "starlette", "uvicorn", "matplotlib", "httpx", "duckdb", "ray",
                  "playwright", "prometheus_client", "huggingface_hub")
# The core modules that may reach the network, each on a user's request: a model's config.json from the Hugging Face
# Hub, and a published trace from its publisher (`kvlab workloads fetch`).
NETWORK_AT_THE_EDGE = {"kvlab.catalog.config": ("huggingface_hub",), "kvlab.workload.fetch": ("httpx",)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    if module == "kvlab.cli" or module.startswith("kvlab.cli.") or module == "kvlab.__main__":
        return "cli"
    if module in ("kvlab.service", "kvlab.service.engine"):
        return "run"
    if module.startswith("kvlab.service."):
        return "service"
    if any(module == face or module.startswith(face + ".") for face in FACES):
        return "face"
    if module == "kvlab.sweep" or module.startswith("kvlab.sweep."):
        return "sweep"
    return "core"


def imports() -> dict[str, set[str]]:
    """module -> the modules (kvlab's and others', top-level names) it imports, anywhere in its body."""
    graph: dict[str, set[str]] = {}
    modules = {module_name(p) for p in ROOT.rglob("*.py")}
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                # `from kvlab.sched import batching` imports the module kvlab.sched.batching (the package's __init__
                # only for a name that is no submodule of it)
                submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
                found.update(submodules)
                if len(submodules) < len(node.names):
                    found.add(base)
        graph[name] = {m for m in found if m != name}
    return graph


def kvlab_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    modules = set(graph)
    return {m: {d for d in deps if d in modules} for m, deps in graph.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} ({layer(module)}) imports {dep} ({layer(dep)})" for module, deps in graph.items()
                  for dep in deps if RANKS[layer(dep)] > RANKS[layer(module)])


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Each import circle found by a depth-first walk, as 'a -> b -> a'. A package's __init__ re-exporting its
    submodules counts as importing them: ``from kvlab.fleet import parse_router`` runs kvlab/fleet/__init__.py and
    everything it imports (the config <-> fleet circle hid behind such a re-export)."""
    found: list[str] = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                found.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = upward_imports(kvlab_edges(imports()))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_package_has_no_import_circle():
    found = circles(kvlab_edges(imports()))
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_checks_see_a_circle_and_an_upward_import():
    """On a made-up graph: the checks are not blind (the sweep once imported the command line, and the catalogue's
    config.json reader and its models imported each other)."""
    graph = {"kvlab.sweep.point": {"kvlab.cli.sim"}, "kvlab.cli.sim": set(),
             "kvlab.catalog.config": {"kvlab.catalog.models"}, "kvlab.catalog.models": {"kvlab.catalog.config"},
             "kvlab.catalog": {"kvlab.catalog.config"}}
    assert upward_imports(graph) == ["kvlab.sweep.point (sweep) imports kvlab.cli.sim (cli)"]
    assert circles(graph) == ["kvlab.catalog.config -> kvlab.catalog.models -> kvlab.catalog.config"]


def test_the_circle_check_sees_a_circle_through_a_package_re_export():
    """The config <-> fleet circle of issue 31, as it stood: resolve.py imported kvlab.fleet for parse_router, whose
    __init__ re-exports capacity.py, which imports kvlab.config, whose __init__ re-exports resolve.py."""
    graph = {"kvlab.config": {"kvlab.config.resolve"}, "kvlab.config.resolve": {"kvlab.fleet"},
             "kvlab.fleet": {"kvlab.fleet.capacity"}, "kvlab.fleet.capacity": {"kvlab.config"}}
    assert circles(graph) == ["kvlab.config -> kvlab.config.resolve -> kvlab.fleet -> kvlab.fleet.capacity -> "
                              "kvlab.config"]


def test_the_configuration_never_imports_the_fleet():
    found = sorted(f"{m} imports {d}" for m, deps in kvlab_edges(imports()).items() if m.startswith("kvlab.config")
                   for d in deps if d == "kvlab.fleet" or d.startswith("kvlab.fleet."))
    assert not found, "\n".join(found)


# The command modules may import the two modules every command shares: the Typer app they register on
# (kvlab.cli.app) and the flags built from kvlab.config.options (kvlab.cli.options). kvlab/cli/__init__.py imports
# each command module by name (importlib) to register it. Anything else one command needs of another belongs
# outside cli/ (the service, the sweep session, report/), so a face only parses, calls and prints.
CLI_SHARED = ("kvlab.cli.app", "kvlab.cli.options")


def cli_cross_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} imports {d}" for m, deps in graph.items() if m.startswith("kvlab.cli.")
                  for d in deps if (d == "kvlab.cli" or d.startswith("kvlab.cli.")) and d not in CLI_SHARED)


def test_no_command_module_imports_another():
    found = cli_cross_imports(kvlab_edges(imports()))
    assert not found, "a command module imports another (move what they share out of cli/):\n" + "\n".join(found)


def test_the_cross_import_check_is_not_blind():
    graph = {"kvlab.cli.capacity": {"kvlab.cli.sweep", "kvlab.cli.app", "kvlab.service"}, "kvlab.cli.sweep": set(),
             "kvlab.cli.app": set(), "kvlab.service": set()}
    assert cli_cross_imports(graph) == ["kvlab.cli.capacity imports kvlab.cli.sweep"]


# What only the service builds: a face that builds the engine, a fleet, a replica search, a capacity search or a
# sizing itself keeps a copy of a rule the service owns (the fewest-replicas search once skipped the fleet's work
# check this way; the lab's rate section once ran the capacity search beside `kvlab capacity`'s).
ENGINE_BUILDERS = re.compile(r"\b(Simulation|Fleet|fewest_replicas|search_capacities|SizingConfig)(\.\w+)?\(")


def engine_builders(texts: dict[str, str]) -> list[str]:
    return sorted(f"{name}:{i}: {line.strip()}" for name, text in texts.items()
                  for i, line in enumerate(text.splitlines(), 1) if ENGINE_BUILDERS.search(line))


def test_the_faces_build_no_engine_fleet_search_or_sizing():
    texts = {str(p.relative_to(ROOT)): p.read_text() for face in ("cli", "web") for p in (ROOT / face).rglob("*.py")}
    found = engine_builders(texts)
    assert not found, "a face builds what the service builds:\n" + "\n".join(found)
    assert engine_builders({"x.py": "s = Simulation(strategy, engine, wl)\nc = SizingConfig.for_gpu(gpu)\n"
                                    "r = run_fleet(a)\nf = fewest_replicas(s, c)\n"
                                    "found = search_capacities(configurations, runner, slo)"}) == [
        "x.py:1: s = Simulation(strategy, engine, wl)", "x.py:2: c = SizingConfig.for_gpu(gpu)",
        "x.py:4: f = fewest_replicas(s, c)", "x.py:5: found = search_capacities(configurations, runner, slo)"]


def test_the_core_imports_no_face_library():
    found = []
    for module, deps in imports().items():
        if layer(module) != "core":
            continue
        allowed = NETWORK_AT_THE_EDGE.get(module, ())
        for dep in deps:
            top = dep.split(".")[0]
            if top in FACE_LIBRARIES and top not in allowed:
                found.append(f"{module} imports {dep}")
    assert not found, "the core imports a face's library:\n" + "\n".join(sorted(found))


def test_the_layer_test_sees_an_upward_import():
    """The graph is read as it should be: the command line imports the service, the service the config."""
    graph = kvlab_edges(imports())
    assert "kvlab.service" in graph["kvlab.cli.sim"]
    assert "kvlab.config" in graph["kvlab.service.engine"] or "kvlab.config.resolve" in graph["kvlab.service.engine"]
    assert layer("kvlab.web.server") == "face" and layer("kvlab.sched.scheduler") == "core"
    assert layer("kvlab.service.replicas") == "service" and layer("kvlab.sweep.runner") == "sweep"
    assert layer("kvlab.sweep.session") == "face" and layer("kvlab.service") == "run"


def architecture_homes() -> list[tuple[str, str, str]]:
    """docs/architecture.md's table of rules: (rule, file, name) for each row."""
    import re

    text = (ROOT.parent.parent / "docs" / "architecture.md").read_text()
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = re.fullmatch(r"\| (.+?) \| `([\w/]+\.py)` `(\w+)` \|", line.strip())
        if match:
            rows.append(match.groups())
    return rows


def test_every_rule_in_the_architecture_table_has_its_home():
    """Each rule's home (a file and a name) exists: a newcomer finds it with grep."""
    import re

    rows = architecture_homes()
    assert len(rows) >= 20
    missing = []
    for rule, file, name in rows:
        source = (ROOT / file).read_text()
        if not re.search(rf"^\s*(def|class) {name}\b|^{name}(:.*)? =", source, flags=re.M):
            missing.append(f"{rule}: {file} has no {name}")
    assert not missing, "\n".join(missing)


def test_the_finish_rule_is_written_once():
    """When a request finishes is one function (sched/seq.py num_tokens_to_finish, vLLM's check_stop as a function
    of the iterations to come), called everywhere but in the two hottest places, where it is written out for speed,
    each under a comment that names it and its measured saving (benchmarks/count_instructions.py): the end of a
    single iteration (scheduler.py _advance_iteration) and the finish heap's rebuild (runs.py). Any other copy
    fails."""
    import re

    # (a Seq holds its request's num_output_tokens as final_output_tokens: either name)
    pattern = re.compile(r"(request\.num_output_tokens|final_output_tokens)\s*-\s*\w+\.num_output_tokens"
                         r"|num_output_tokens\s*>=\s*\w+\.(request\.num_output_tokens|final_output_tokens)")
    homes = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py") if pattern.search(path.read_text())]
    assert sorted(homes) == ["sched/runs.py", "sched/scheduler.py", "sched/seq.py"], homes
    for name in ("runs.py", "scheduler.py"):
        lines = (ROOT / "sched" / name).read_text().splitlines()
        copies = [i for i, line in enumerate(lines) if pattern.search(line)]
        assert len(copies) == 1, [lines[i] for i in copies]
        assert any("(num_tokens_to_finish, written out:" in lines[j] for j in range(max(0, copies[0] - 3), copies[0]))
