"""The import structure of models/: its modules import each other one way only (no cycle, not even
through imports inside functions), checkpoint reading stays apart from device placement, and models/
never imports smcsd (the library sits on top of the models, not the other way round).

Static: every `import` statement of every models/**/*.py is parsed (ast, at any depth: module level,
functions, branches), nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "models"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every module `path` (module `name`) imports anywhere in its body, absolute names.
    `from pkg import x` counts as importing `pkg.x` when that is a module, else `pkg` itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                up = node.level - 1
                base = ".".join(parts[:len(parts) - up]) if up < len(parts) else "<above the top package>"
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    modules = set(files)
    return {name: _imported(path, name, modules) for name, path in files.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


@pytest.fixture(scope="module")
def graph():
    full = _graph()
    return {n: {m for m in deps if m == PACKAGE or m.startswith(PACKAGE + ".")} for n, deps in full.items()}


def test_find_cycle_finds_one():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_parser_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from . import b\n    from .b import g\n    import os\n")
    (pkg / "b.py").write_text("")
    modules = {"pkg", "pkg.a", "pkg.b"}
    assert _imported(pkg / "a.py", "pkg.a", modules) == {"pkg.b", "os"}
    assert _imported(pkg / "__init__.py", "pkg", modules) == {"pkg.a"}


def test_models_import_graph_is_acyclic(graph):
    assert f"{PACKAGE}.hf" in graph and f"{PACKAGE}.sharding" in graph, sorted(graph)
    assert f"{PACKAGE}.checkpoint" in graph[f"{PACKAGE}.hf"]  # the parser sees the imports at all
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle in models/: " + " -> ".join(cycle)


def test_models_never_imports_smcsd():
    bad = {n: sorted(m for m in deps if m == "smcsd" or m.startswith("smcsd."))
           for n, deps in _graph().items()}
    bad = {n: deps for n, deps in bad.items() if deps}
    assert not bad, f"models/ imports smcsd: {bad}"


def test_checkpoint_reading_is_apart_from_placement(graph):
    m = lambda *names: {f"{PACKAGE}.{n}" for n in names}  # noqa: E731
    # Reading a checkpoint builds no model and touches no device.
    assert not graph[f"{PACKAGE}.checkpoint"] & m("lm", "cache", "sharding", "sharded_load", "hf", "gguf",
                                                 "transformer"), graph[f"{PACKAGE}.checkpoint"]
    # Device layout knows nothing of models, caches or loaders (it duck-types what it places).
    assert graph[f"{PACKAGE}.sharding"] <= m("config"), graph[f"{PACKAGE}.sharding"]


def test_install_is_namespaced(tmp_path):
    """Installed (editable or not), models/ and resample/ are smcsd.models and smcsd.resample: outside the
    repository, a bare `import models` / `import resample` finds nothing of ours (a user's own top-level
    `models` package stays theirs), and the namespaced names import."""
    import subprocess
    import sys

    code = ("import importlib.util as u, smcsd.models as m, smcsd.resample as r, smcsd\n"
            "assert m.from_pretrained and r.systematic and smcsd.models is m\n"
            "print(u.find_spec('models') is None, u.find_spec('resample') is None)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"], out.stdout


def test_no_top_level_models_import_left():
    """Every import of the two folders names them as smcsd.models / smcsd.resample (inside them: relative)."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        if ".venv" in path.parts or ".git" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                    if n.split(".")[0] in ("models", "resample")]
    assert not bad, bad
