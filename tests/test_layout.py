"""The package's layers (ARCHITECTURE.md) and its public face, checked so they stay as designed.

Layering: every ``fastpipe`` import in every module (module level and inside functions alike, read with
``ast``, so nothing is executed) goes to a package of the importer's own layer or a lower one. The tests keep a
layout too: no file under ``tests/`` imports a test module; what several share is in ``tests/fakes/`` or a conftest.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import textwrap

import pytest

import fastpipe

ROOT = pathlib.Path(fastpipe.__file__).parent

#: Lowest first. A module may import from its own layer and the layers below, never from above.
LAYERS: list[tuple[str, ...]] = [
    (
        "fastpipe.errors",
        "fastpipe._system",
        "fastpipe._command",
        "fastpipe._tree",
        "fastpipe._render",
        "fastpipe._deprecated",
        "fastpipe.devices",
        "fastpipe.stages",
        "fastpipe._C",
        "fastpipe._jpeg",
    ),
    ("fastpipe.ops",),
    ("fastpipe.transforms",),
    ("fastpipe.datasets", "fastpipe.loading", "fastpipe.monitor", "fastpipe.distributed"),
    ("fastpipe.workloads",),
    ("fastpipe.diagnosis",),
    ("fastpipe.experiments", "fastpipe.integrations"),
    ("fastpipe.commands", "fastpipe.cli", "fastpipe.__main__", "fastpipe"),
]


def layer_of(module: str) -> int:
    """The layer of a dotted module name: the longest listed prefix decides (``fastpipe`` itself is the top)."""
    best, best_len = None, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = index, len(name)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layout.py and ARCHITECTURE.md")
    return best


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def fastpipe_imports(path: pathlib.Path, *, modules: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for each import of fastpipe in the file; ``from fastpipe import x`` counts as x.

    With ``modules``, ``from package import module`` names the module itself for every package (``from
    fastpipe.diagnosis.runtime import _ddp`` imports ``fastpipe.diagnosis.runtime._ddp``), as a circle needs.
    """
    found = []
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "fastpipe"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "fastpipe":
                continue
            if modules:
                found += [(node.lineno, f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base) for a in node.names]
            elif base == "fastpipe":  # from fastpipe import x: x is a submodule or a public name of the top package
                found += [(node.lineno, f"fastpipe.{a.name}" if _is_submodule(a.name) else "fastpipe") for a in node.names]
            else:
                found.append((node.lineno, base))
    return found


def _is_submodule(name: str) -> bool:
    """True when ``from fastpipe import name`` imports a module (a package, a .py file, a built extension)."""
    listed = any(f"fastpipe.{name}" == entry for names in LAYERS for entry in names)
    return listed or (ROOT / name).is_dir() or (ROOT / f"{name}.py").exists()


MODULES = sorted(ROOT.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in MODULES:
        layer_of(module_name(path))


def test_no_module_imports_from_a_layer_above_its_own():
    violations = []
    for path in MODULES:
        importer = module_name(path)
        for line, imported in fastpipe_imports(path):
            if layer_of(imported) > layer_of(importer):
                violations.append(
                    f"{path.relative_to(ROOT.parent)}:{line} ({importer}, layer {layer_of(importer)}) "
                    f"imports {imported} (layer {layer_of(imported)})"
                )
    assert not violations, "imports that climb a layer:\n" + "\n".join(violations)


def test_the_layer_check_sees_a_violation(tmp_path):
    """The check above can fail: a lower module importing the diagnosis is reported."""
    bad = ROOT / "ops" / "_layer_probe_tmp.py"
    bad.write_text("def f():\n    from fastpipe.diagnosis import diagnose\n")
    try:
        imports = fastpipe_imports(bad)
        assert imports == [(2, "fastpipe.diagnosis")]
        assert layer_of(imports[0][1]) > layer_of(module_name(bad))
    finally:
        bad.unlink()


#: The diagnosis's phases, lowest first (ARCHITECTURE.md): a module of a phase imports from its own phase and the
#: phases below it. The package's own top-level modules (``_diagnose``, ``_stepcheck``, ``_options``, ``__init__``) run
#: the phases and sit above them all.
DIAGNOSIS_PHASES: list[str] = [
    "fastpipe.diagnosis.runtime",
    "fastpipe.diagnosis.discovery",
    "fastpipe.diagnosis.memory",
    "fastpipe.diagnosis.ladder",
    "fastpipe.diagnosis.stagecost",
    "fastpipe.diagnosis.unseen",
    "fastpipe.diagnosis.verdict",
]


def phase_of(module: str) -> int | None:
    """The diagnosis phase of a module (its index in DIAGNOSIS_PHASES), the top for the package's own modules, None
    outside the diagnosis."""
    for index, phase in enumerate(DIAGNOSIS_PHASES):
        if module == phase or module.startswith(phase + "."):
            return index
    if module == "fastpipe.diagnosis" or module.startswith("fastpipe.diagnosis."):
        return len(DIAGNOSIS_PHASES)
    return None


def test_every_diagnosis_module_is_in_a_phase():
    """A new folder in the diagnosis must be placed among the phases, not land above them by default."""
    folders = sorted(p.name for p in (ROOT / "diagnosis").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert [f"fastpipe.diagnosis.{name}" for name in folders] == sorted(DIAGNOSIS_PHASES)


def test_no_diagnosis_module_imports_a_later_phase():
    violations = []
    for path in MODULES:
        importer = module_name(path)
        if phase_of(importer) is None:
            continue
        for line, imported in resolved_imports(path):
            target = phase_of(imported)
            if target is not None and target > phase_of(importer):
                violations.append(f"{path.relative_to(ROOT.parent)}:{line} ({importer}) imports {imported}, a later phase")
    assert not violations, "imports that climb a diagnosis phase:\n" + "\n".join(violations)


def resolved_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """Every fastpipe import of the file, ``from package import module`` naming the module (a circle's edges)."""
    return fastpipe_imports(path, modules=True)


def _is_module(dotted: str) -> bool:
    relative = pathlib.Path(*dotted.split(".")[1:])
    return (ROOT / relative).is_dir() or (ROOT / relative).with_suffix(".py").exists()


def import_circles(
    modules: dict[str, set[str]], facades: tuple[str, ...] = ("fastpipe.diagnosis", "fastpipe.diagnosis.stagecost")
) -> list[list[str]]:
    """Every strongly connected group of more than one module in the import graph (Tarjan), each as a sorted list:
    modules that import each other, directly or through others.

    A module imports its package too (Python runs a package's ``__init__`` before any module in it), so a sub-package
    ``__init__`` that imports a module which imports it back is a circle. The ``facades`` are left out of that: a
    package whose ``__init__`` only re-exports the public names is reached by every module below it, and the circle
    that makes is Python's import order, not the design. Their own imports, and imports of them, still count.
    """
    graph = {name: {target for target in edges if target not in facades} for name, edges in modules.items()}
    for name in list(graph):
        parent = name.rpartition(".")[0]
        if parent in graph and parent not in facades:
            graph[name].add(parent)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def diagnosis_graph() -> dict[str, set[str]]:
    """The diagnosis's import graph, read from the files as they are now (a planted file included)."""
    return {module_name(path): {imported for _, imported in resolved_imports(path)} for path in sorted((ROOT / "diagnosis").rglob("*.py"))}


def test_no_import_circle_in_the_diagnosis():
    """No module of the diagnosis imports itself back through others (module level or inside a function alike:
    a circle through a function-level import still means the two modules cannot be understood apart)."""
    circles = import_circles(diagnosis_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_sees_planted_circles():
    """The check above can fail: two modules importing each other are found, and so is a longer ring."""
    graph = diagnosis_graph()
    pair = {name: set(edges) for name, edges in graph.items()}
    pair["fastpipe.diagnosis.ladder._cache"].add("fastpipe.diagnosis.ladder._stream")
    assert any({"fastpipe.diagnosis.ladder._cache", "fastpipe.diagnosis.ladder._stream"} <= set(c) for c in import_circles(pair))
    ring = {name: set(edges) for name, edges in graph.items()}
    ring["fastpipe.diagnosis.runtime._timeout"].add("fastpipe.diagnosis.verdict._report")
    assert any({"fastpipe.diagnosis.runtime._timeout", "fastpipe.diagnosis.verdict._report"} <= set(c) for c in import_circles(ring))


def test_the_circle_check_reads_a_planted_pair_of_files():
    """End to end through the files: two planted modules, one importing the other inside a function, are a circle."""
    first = ROOT / "diagnosis" / "ladder" / "_circle_probe_a_tmp.py"
    second = ROOT / "diagnosis" / "ladder" / "_circle_probe_b_tmp.py"
    first.write_text("from fastpipe.diagnosis.ladder import _circle_probe_b_tmp\n")
    second.write_text("def f():\n    from fastpipe.diagnosis.ladder._circle_probe_a_tmp import g\n")
    try:
        circles = import_circles(diagnosis_graph())
        assert ["fastpipe.diagnosis.ladder._circle_probe_a_tmp", "fastpipe.diagnosis.ladder._circle_probe_b_tmp"] in circles
    finally:
        first.unlink()
        second.unlink()


@pytest.mark.parametrize(
    "package",
    ["fastpipe.diagnosis", "fastpipe.experiments", "fastpipe.loading", "fastpipe.monitor", "fastpipe.workloads"],
)
def test_subpackage_all_is_sorted_and_importable(package):
    module = importlib.import_module(package)
    assert module.__all__ == sorted(module.__all__, key=str), f"{package}.__all__ is not sorted"
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.{name}"


def test_reference_specs_still_load():
    for spec in ("toy:naive", "toy:optimized", "jpeg:naive"):
        family, _, variant = spec.partition(":")
        registry = importlib.import_module(f"fastpipe.workloads.{family}").VARIANTS
        assert variant in registry, spec


# ----- the tests themselves: no test module imports another ------------------------------------------------------------
TESTS = ROOT.parent / "tests"


def _names_a_test_module(module: str, level: int, names: list[str]) -> list[str]:
    """The test modules (``test_*``) an import names: in its module path, or as a module it takes from a package of
    the tests (``from tests.diagnosis import test_script``). Only the tests' own imports count (``tests.`` or relative)."""
    if not (level or module == "tests" or module.startswith("tests.")):
        return []
    dotted = "." * level + module
    if any(part.startswith("test_") for part in module.split(".")):
        return [dotted]
    return [f"{dotted}.{name}" if module else f"{dotted}{name}" for name in names if name.startswith("test_")]


def imports_of_test_modules(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, test module) for each import of a ``test_*`` module in the file: in its code (module level or inside a
    function) and in Python source it holds as a string (a factory module or a script that a test writes and runs)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    sources: list[tuple[int, ast.AST]] = [(0, tree)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                sources.append((node.lineno - 1, ast.parse(textwrap.dedent(node.value))))
            except (SyntaxError, ValueError):
                pass  # prose, not code
    found = []
    for offset, source in sources:
        for node in ast.walk(source):
            if isinstance(node, ast.Import):
                found += [(offset + node.lineno, name) for a in node.names for name in _names_a_test_module(a.name, 0, [])]
            elif isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
                found += [(offset + node.lineno, name) for name in _names_a_test_module(node.module or "", node.level, names)]
    return sorted(found)


def files_importing_test_modules(tests: pathlib.Path) -> list[str]:
    """``path:line imports module`` for every import of a test module by a file under ``tests``."""
    return [
        f"{path.relative_to(tests.parent)}:{line} imports {module}"
        for path in sorted(tests.rglob("*.py"))
        for line, module in imports_of_test_modules(path)
    ]


def test_no_test_module_imports_another():
    """Shared helpers live in ``tests/fakes/`` and shared fixtures in a ``conftest.py``: importing a test module runs
    its module-level set-up, registers its fixtures a second time and ties two test files together."""
    found = files_importing_test_modules(TESTS)
    assert not found, "imports of a test module (move what they use to tests/fakes/ or a conftest.py):\n" + "\n".join(found)


def test_the_test_import_check_sees_planted_imports(tmp_path):
    """The check above can fail: each way a test module can be imported is found, and imports of tests.fakes are not.
    (The planted names are split with ``test_`` so that this file's own strings do not read as such imports.)"""
    test_ = "test_"
    planted = tmp_path / "tests" / "diagnosis" / "test_planted.py"
    planted.parent.mkdir(parents=True)
    lines = [
        f"from tests.diagnosis.{test_}script import clean",
        "from tests.fakes.ladder import planted_report",
        "import tests.fakes",
        "def f():",
        f"    from .{test_}ddp import free_port",
        f"from tests.diagnosis import {test_}script, conftest",
        'FACTORY = """',
        f"from tests.{test_}rng_untouched import _workload",
        '"""',
    ]
    planted.write_text("\n".join(lines) + "\n")
    assert imports_of_test_modules(planted) == [
        (1, "tests.diagnosis.test_script"),
        (5, ".test_ddp"),
        (6, "tests.diagnosis.test_script"),
        (8, "tests.test_rng_untouched"),
    ]
    assert files_importing_test_modules(tmp_path / "tests") == [
        "tests/diagnosis/test_planted.py:1 imports tests.diagnosis.test_script",
        "tests/diagnosis/test_planted.py:5 imports .test_ddp",
        "tests/diagnosis/test_planted.py:6 imports tests.diagnosis.test_script",
        "tests/diagnosis/test_planted.py:8 imports tests.test_rng_untouched",
    ]
