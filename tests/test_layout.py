"""The package's shape: layers import only downward, no cycles, no private names across modules
(imported or reached as ``module._name``), and every module and function stays small enough to
read. The benchmark scripts obey the same size and privacy rules; tests may touch privates."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attnscale"
# Lowest first: a module may import its own layer or any layer before it, never one after it.
LAYERS = ("util", "core", "measure", "integrations", "lab", "audit", "cli")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    """Index of the layer holding ``module``; None for the root package (the public facade)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
BENCHMARKS = {
    f"benchmarks.{p.stem}": p for p in sorted((SRC.parents[1] / "benchmarks").glob("*.py"))
}
CHECKED = {**MODULES, **BENCHMARKS}  # the files held to the size and privacy rules


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every attnscale import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("attnscale")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnscale"):
            names = [a.name for a in node.names]
            # "from attnscale.measure import native" imports a module, not a name
            subs = [n for n in names if f"{node.module}.{n}" in MODULES]
            out += [(f"{node.module}.{n}", [], node.lineno) for n in subs]
            rest = [n for n in names if n not in subs]
            if rest:
                out.append((node.module, rest, node.lineno))
    return out


GRAPH = {m: {t for t, _, _ in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}


def test_layers_import_only_downward():
    upward = []
    for module, path in MODULES.items():
        own = layer_of(module)
        for target, _, line in imports(path):
            theirs = layer_of(target)
            if own is not None and (theirs is None or theirs > own):
                upward.append(f"{module}:{line} imports {target}")
    assert not upward, upward


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> attnscale module it is bound to, for every import of a module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("attnscale"):
                    bound = a.asname or a.name.split(".")[0]
                    out[bound] = a.name if a.asname else bound
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnscale"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def private_attributes(path: Path) -> list[tuple[str, int]]:
    """(``module._name``, line) for every private attribute reached through an attnscale
    module (or a name inside one, as in ``module.Class._name``) in ``path``."""
    tree = ast.parse(path.read_text())
    aliases = module_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue  # dunders (__version__, __name__) are public
        base = dotted(node.value)
        head = None if base is None else base.split(".")[0]
        if head in aliases:
            found.append((aliases[head] + base[len(head):] + "." + node.attr, node.lineno))
    return found


def test_no_private_names_across_modules():
    private = [
        f"{module}:{line} takes {name} from {target}"
        for module, path in CHECKED.items()
        for target, names, line in imports(path)
        for name in names
        if name.startswith("_") and target != module
    ]
    private += [
        f"{module}:{line} uses {name}"
        for module, path in CHECKED.items()
        for name, line in private_attributes(path)
    ]
    assert not private, private


def test_private_attribute_checker_sees_module_private(tmp_path):
    """The attribute check is not vacuous: ``alias._name`` of an attnscale module is caught,
    a dunder and a private of a local object are not."""
    fake = tmp_path / "bench.py"
    fake.write_text(
        "import attnscale\n"
        "from attnscale.measure import inspection as I\n"
        "from attnscale.lab import store\n"
        "I._layers({}, {}, {})\n"
        "store.Store._check_ours\n"
        "attnscale.core._secret\n"
        "print(attnscale.__name__, I.load_model)\n"
        "class A:\n    _x = 1\n"
        "A()._x\n"
    )
    assert sorted(private_attributes(fake), key=lambda x: x[1]) == [
        ("attnscale.measure.inspection._layers", 4),
        ("attnscale.lab.store.Store._check_ours", 5),
        ("attnscale.core._secret", 6),
    ]


def test_modules_and_functions_are_small():
    big = []
    for module, path in CHECKED.items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{module}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    big.append(f"{module}.{node.name}: {length} lines")
    assert not big, big


def test_benchmarks_are_checked():
    assert "benchmarks.monitor_overhead" in CHECKED and len(BENCHMARKS) >= 5


def test_layering_checker_sees_an_upward_import(tmp_path):
    """The checks above are not vacuous: a core module importing audit is caught."""
    fake = tmp_path / "attnscale" / "core" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from attnscale.audit import report\n")
    found = imports(fake)
    assert found == [("attnscale.audit.report", [], 1)]
    assert layer_of("attnscale.audit.report") > layer_of("attnscale.core.bad")


def test_import_linter_layers_contract():
    """The same contract through import-linter (configured in pyproject.toml)."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed")
    out = subprocess.run([exe], capture_output=True, text=True, cwd=SRC.parents[1])
    assert out.returncode == 0, out.stdout + out.stderr


ROOT = SRC.parents[1]
OUTSIDE = ("../shared", "ANCHORS.md", "CLAIMS.md", "/work/")


def test_the_project_stands_alone():
    """No file points outside the repository or at the tracker: a clone has neither."""
    issue = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = []
    files = [*SRC.rglob("*.py"), *SRC.rglob("*.html"), *SRC.rglob("*.cpp"), *ROOT.glob("docs/*"),
             *ROOT.glob("configs/*"), *ROOT.glob("benchmarks/*.py"), ROOT / "README.md",
             ROOT / "Makefile", ROOT / "pyproject.toml"]
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(s in line for s in OUTSIDE) or issue.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not found, found


def test_the_command_line_starts_without_the_slow_imports():
    """``attnscale --help`` (and every command's argument check) imports neither scipy.stats
    (about 2 s) nor torch._dynamo (about 1 s): their users import them on first use."""
    code = ("import sys, attnscale.cli; print(sorted(m for m in ('scipy.stats', 'scipy.special', "
            "'torch._dynamo', 'transformers', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
