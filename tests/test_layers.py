"""The package's layers, read from its imports (ast): no import circle, no upward import.

    cli                      the command line: may import anything below
    faces                    web, sweep, bench, paper, vllm, report: ask the service; never the command line
    service                  kvlab.service: the one way a face runs the engine
    core                     config, sizing, catalog, workload, memory, sched, cost, metrics, sim, fleet, ...:
                             imports no face, no web framework, no plotting library, nothing of the network

Every import counts, at the top of a module or inside a function (a lazy import is a dependency all the same).
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvlab

ROOT = Path(kvlab.__file__).parent
FACES = ("kvlab.web", "kvlab.sweep", "kvlab.bench", "kvlab.paper", "kvlab.vllm", "kvlab.report")
RANKS = {"core": 0, "service": 1, "face": 2, "cli": 3}
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
    if module == "kvlab.service":
        return "service"
    if any(module == face or module.startswith(face + ".") for face in FACES):
        return "face"
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
                found.add(base)
                # `from kvlab.sched import batching` imports the module kvlab.sched.batching
                found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
        graph[name] = {m for m in found if m != name}
    return graph


def kvlab_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    modules = set(graph)
    return {m: {d for d in deps if d in modules} for m, deps in graph.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} ({layer(module)}) imports {dep} ({layer(dep)})" for module, deps in graph.items()
                  for dep in deps if RANKS[layer(dep)] > RANKS[layer(module)])


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Each import circle found by a depth-first walk, as 'a -> b -> a'."""
    found: list[str] = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if dep.startswith(module + "."):
                continue  # a package's __init__ re-exporting its own submodules is no circle through them
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
    assert upward_imports(graph) == ["kvlab.sweep.point (face) imports kvlab.cli.sim (cli)"]
    assert circles(graph) == ["kvlab.catalog.config -> kvlab.catalog.models -> kvlab.catalog.config"]


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
    assert "kvlab.config" in graph["kvlab.service"] or "kvlab.config.resolve" in graph["kvlab.service"]
    assert layer("kvlab.web.server") == "face" and layer("kvlab.sched.scheduler") == "core"


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

    pattern = re.compile(r"request\.num_output_tokens\s*-\s*\w+\.num_output_tokens|num_output_tokens\s*>=\s*\w+\.request"
                         r"\.num_output_tokens")
    homes = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py") if pattern.search(path.read_text())]
    assert sorted(homes) == ["sched/runs.py", "sched/scheduler.py", "sched/seq.py"], homes
    for name in ("runs.py", "scheduler.py"):
        lines = (ROOT / "sched" / name).read_text().splitlines()
        copies = [i for i, line in enumerate(lines) if pattern.search(line)]
        assert len(copies) == 1, [lines[i] for i in copies]
        assert any("(num_tokens_to_finish, written out:" in lines[j] for j in range(max(0, copies[0] - 3), copies[0]))
