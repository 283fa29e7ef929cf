"""The rooms of the code and the doors between them, read from the source itself (every import, function-level ones
included, relative ones resolved):

- layers, lowest first: the library (tr_core/*.py) < benchmarking (tr_core.bench) < the command line (tr_core.cli) <
  `python -m tr_core` (tr_core/__main__.py); the vLLM integration (tr_core.vllm) stands beside benchmarking, over the
  library, and only the command line may use it. The views (present/) read the library; the studio (studio/, app.py)
  may import anything. A module imports its own room or a lower one, and nothing in tr_core imports the views or the
  studio;
- no import cycle, between modules or between rooms;
- `import tr_core` loads nothing of the views, the benchmark, the command line, the studio, gradio or plotly;
- one module reads /proc/cpuinfo (tr_core/machine.py);
- no function over 50 lines in tr_core/, studio/ or app.py.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 50
# room -> the rooms its modules may import besides their own (the library is every tr_core module outside a room)
MAY_IMPORT = {
    "library": set(),
    "bench": {"library"},
    "vllm": {"library", "bench"},
    "cli": {"library", "bench", "vllm"},
    "main": {"library", "bench", "vllm", "cli"},
    "present": {"library"},
    "studio": {"library", "bench", "cli", "vllm", "present"},
}
LOADED_BY_NOTHING_AT_IMPORT = ("tr_core.bench", "tr_core.cli", "tr_core.vllm", "present", "studio", "gradio",
                               "plotly", "networkx")


def module_name(path: Path) -> str:
    """tr_core/trace.py -> tr_core.trace; a package's __init__.py -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files() -> list[Path]:
    """Every module of tr_core/, present/ and studio/, and app.py."""
    return sorted([*(ROOT / "tr_core").rglob("*.py"), *(ROOT / "present").rglob("*.py"), *(ROOT / "studio").rglob("*.py"),
                   ROOT / "app.py"])


MODULES = {module_name(path): path for path in python_files()}


def imported_names(path: Path) -> set[str]:
    """The dotted names `path` imports anywhere (function-level imports too), relative ones made absolute; for
    `from X import y`, X.y where that is a module of ours, else X."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source)
    return found


def our_module(name: str) -> str | None:
    """The module of ours that the imported name `name` is or lies in (tr_core.tree.build_tree -> tr_core.tree)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (itself left out)."""
    graph = {}
    for name, path in MODULES.items():
        graph[name] = {m for m in map(our_module, imported_names(path)) if m is not None and m != name}
    return graph


def room(module: str) -> str:
    """The room a module of ours belongs to."""
    parts = module.split(".")
    if parts[0] in ("studio", "app"):
        return "studio"
    if parts[0] == "present":
        return "present"
    if module == "tr_core.__main__":
        return "main"
    if len(parts) > 1 and parts[1] in MAY_IMPORT and (ROOT / "tr_core" / parts[1]).is_dir():
        return parts[1]
    return "library"


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as a path (first node repeated at the end), or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


GRAPH = import_graph()
ROOMS = sorted({room(m) for m in GRAPH})


def test_the_rules_read_the_code_they_are_about():
    """The rules below would pass on nothing: check they see the rooms, the imports and a known edge of each kind."""
    assert {"library", "bench", "cli", "main", "present", "studio"} <= set(ROOMS)
    assert room("tr_core.engine") == "library" and room("present.replay") == "present"
    assert room("tr_core.cli.options") == "cli" and room("tr_core.__main__") == "main" and room("app") == "studio"
    assert "present.tree" in GRAPH["present.replay"]  # a relative import within a room
    assert "tr_core.config" in GRAPH["tr_core.bench.bench"]  # a relative import one room down
    assert "tr_core.tuning" in GRAPH["tr_core.engine"] and "tr_core.cli" in GRAPH["tr_core.__main__"]
    assert "tr_core.cli.options" in GRAPH["app"]  # an absolute import
    assert "tr_core.trace" in GRAPH["tr_core.cli.generate"]  # a function-level import
    assert "tr_core.bench.bench" in GRAPH["tr_core.cli.bench"]  # `from ..bench import bench`: the module, not the room
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"] and not cycle_in({"a": {"b"}})


@pytest.mark.parametrize("here", ROOMS)
def test_each_room_imports_only_its_own_room_or_lower_ones(here):
    upward = sorted(f"{module} imports {other} ({room(other)})" for module, imports in GRAPH.items()
                    if room(module) == here for other in imports
                    if room(other) != here and room(other) not in MAY_IMPORT[here])
    assert not upward, f"the {here} room may import only {sorted(MAY_IMPORT[here]) or 'itself'}:\n" + "\n".join(upward)


def test_nothing_in_tr_core_imports_the_views_or_the_studio():
    found = sorted(f"{m} imports {n}" for m, path in MODULES.items() if m.startswith("tr_core")
                   for n in imported_names(path) if n.split(".")[0] in ("present", "studio", "app"))
    assert not found, "\n".join(found)


def test_every_package_of_tr_core_is_a_room():
    packages = sorted(p.parent.name for p in (ROOT / "tr_core").glob("*/__init__.py"))
    assert set(packages) <= set(MAY_IMPORT) - {"library", "main", "studio"}, packages


@pytest.mark.parametrize("here", ROOMS)
def test_no_import_cycle_between_the_modules_of_a_room(here):
    """With the next test: no cycle anywhere (a cycle through several rooms would be one between rooms)."""
    graph = {m: {o for o in imports if room(o) == here} for m, imports in GRAPH.items() if room(m) == here}
    assert not (cycle := cycle_in(graph)), " -> ".join(cycle)


def test_no_import_cycle_between_rooms():
    rooms: dict[str, set[str]] = {r: set() for r in ROOMS}
    for module, imports in GRAPH.items():
        rooms[room(module)] |= {room(o) for o in imports if room(o) != room(module)}
    assert not (cycle := cycle_in(rooms)), " -> ".join(cycle)


def test_import_tr_core_loads_only_the_library():
    code = ("import sys, tr_core\n"
            f"print(sorted(m for m in sys.modules if m.startswith({LOADED_BY_NOTHING_AT_IMPORT!r})))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"`import tr_core` loaded {out.stdout.strip()}"


def test_one_module_reads_proc_cpuinfo():
    readers = sorted(m for m, path in MODULES.items() if "/proc/cpuinfo" in path.read_text(encoding="utf-8"))
    assert readers == ["tr_core.machine"], readers


def test_no_function_is_over_50_lines():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)


# -- one owner of engine state ---------------------------------------------------------------------------------------
# The engine's own modules: the only ones that may read or write its learned state's parts or any drafter's insides
ENGINE_MODULES = ("tr_core/engine.py", "tr_core/engine_state.py")
ENGINE_STATE = {"adaptive", "hybrid", "clock", "answer_starts"}  # its drafters and clock: reached through its methods
OWN = ("self", "cls")  # an object's own attributes are its business


def scanned_files() -> list[Path]:
    """Every module of the library, the views, the studio, app.py and the scripts."""
    return sorted({*python_files(), *(ROOT / "scripts").glob("*.py")})


def private_names(paths: list[Path]) -> set[str]:
    """The `_private` names our code defines: functions, classes, module and class globals, `self._x` attributes
    (a third-party private such as a tensor's `_version` is not ours to guard)."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in OWN:
                names.add(node.attr)
    return {n for n in names if len(n) > 1 and n[0] == "_" and n[1] != "_"}


def reach_ins(source: str, private: set[str]) -> list[str]:
    """Where `source` reads or writes another object's engine-state part (`x.adaptive`, `x.clock`, ...) or one of our
    `_private` names (`x._refresh`), by attribute or by getattr/setattr/hasattr/delattr with a constant name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target = None
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id in OWN):
            target = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) and \
                not (isinstance(node.args[0], ast.Name) and node.args[0].id in OWN):
            target = node.args[1].value
        if target is not None and (target in ENGINE_STATE or target in private):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_reach_in_rule_catches_the_old_patterns_and_spares_own_attributes():
    """A rule that cannot fail is a defect: the patterns the engine's state API replaced are caught."""
    private = private_names(scanned_files())
    assert {"_refresh", "_static", "_learners"} <= private and "_version" not in private
    old = ("twin.adaptive = _fork_drafter(engine.adaptive)\n"  # the meter's old fork
           "parked.clock = engine.clock\n"  # transformers' parked engine
           "state = {'answer_starts': list(engine.answer_starts)}\n"  # ZeroGPU's old pack
           "new._refresh()\n"  # the warm start's old fresh session
           "getattr(engine, 'hybrid').library = None\n")
    assert sorted(hit.split(": ")[1] for hit in reach_ins(old, private)) == [
        "engine.adaptive", "engine.answer_starts", "engine.clock", "getattr(engine, 'hybrid')", "new._refresh",
        "parked.clock", "twin.adaptive"]
    fine = ("self.adaptive = 1\nself._refresh()\ncls._shapes = {}\nweight._version\nengine.matrix.clone()\n"
            "getattr(self, 'clock')\nengine.fork(sizes)\nengine.state_dict()\n")
    assert reach_ins(fine, private) == []


def test_nothing_outside_the_engine_reaches_into_its_state_or_anyones_private_fields():
    """The engine owns its state: the meter, the warm start, the benchmark, ZeroGPU, transformers' `generate` and
    the studio fork, snapshot, restore, pack and warm it through its methods (tr_core/engine_state.py)."""
    files = scanned_files()
    private = private_names(files)
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in files
             if str(path.relative_to(ROOT)) not in ENGINE_MODULES
             for hit in reach_ins(path.read_text(encoding="utf-8"), private)]
    assert not found, "\n".join(found)


MAX_FILE_LINES = {"tr_core": 400, "present": 500, "studio": 500}  # a file past these is a sign to split it by concept


def overlong_files(limits: dict[str, int], root: Path = ROOT) -> list[str]:
    """'path: N lines (limit L)' for every Python file under the limited folders that has more lines than allowed."""
    return sorted(f"{path.relative_to(root)}: {n} lines (limit {limit})" for folder, limit in limits.items()
                  for path in (root / folder).rglob("*.py")
                  if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit)


def test_files_are_sized_to_their_job(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 11)
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * 10)
    assert overlong_files({"pkg": 10}, tmp_path) == ["pkg/big.py: 11 lines (limit 10)"]  # the check sees a long file
    assert not (long := overlong_files(MAX_FILE_LINES)), "\n".join(long)
