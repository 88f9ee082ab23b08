"""The public face (issue 40, items 2 and 3): a curated top level, the moved names still working for one release with a
warning, nothing in our own code using them, and every field of the results a user gets back documented."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import types
import warnings

import pytest

import fastpipe

REPO = pathlib.Path(fastpipe.__file__).resolve().parents[1]

#: Every name ``fastpipe.__all__`` listed before the top level was curated (48): each stays importable.
BEFORE = [
    "Advice",
    "Comparison",
    "ConfigError",
    "ConvertColorScale",
    "CpuDevice",
    "CudaDevice",
    "Device",
    "DevicePrefetcher",
    "DeviceUnavailableError",
    "ExtensionUnavailableError",
    "FastpipeError",
    "FixReport",
    "Measurement",
    "Normalize",
    "OptionalDependencyError",
    "PipelineError",
    "RecycledLoader",
    "Report",
    "SimDevice",
    "StageCosts",
    "Stages",
    "StepCheck",
    "TransformFacts",
    "TuneResult",
    "Workload",
    "check_step",
    "check_stream",
    "compare",
    "default_device_for",
    "default_device_spec",
    "diagnose",
    "explain_saturation",
    "facts_for",
    "find_pipeline",
    "fix",
    "load_workload",
    "make_prefetcher",
    "measure_stage_costs",
    "measure_startup",
    "measure_workload",
    "parse_device",
    "recommend",
    "recycled",
    "release",
    "releasing",
    "tune",
    "unwrap_loader",
    "watch",
]

#: The names that moved, read from the package's own table (``fastpipe._MOVED``: name -> its new home).
MOVED = sorted(fastpipe._MOVED)

#: A few old names written out here rather than read from the table, so that an emptied or shortened table fails:
#: each must still warn and resolve to the object its sub-package exports.
SURE_MOVED = {
    "parse_device": "fastpipe.devices",
    "recycled": "fastpipe.loading",
    "Stages": "fastpipe.stages",
    "TuneResult": "fastpipe.experiments",
}


def documented_names(docstring: str) -> list[str]:
    """The names a docstring introduces with a Sphinx role (``:func:`diagnose```, ``:class:`Report```), sorted."""
    return sorted(set(re.findall(r":(?:func|class):`(\w+)`", docstring)))


def test_all_is_the_curated_list_sorted() -> None:
    """The top level is what the package docstring tells a user to type (each name there with its role), nothing more:
    the list is stated once, in ``__all__``, and the docstring is the independent account it must agree with."""
    assert fastpipe.__all__ == sorted(fastpipe.__all__)
    assert fastpipe.__all__ == documented_names(fastpipe.__doc__)
    assert len(BEFORE) == 48 and len(fastpipe.__all__) == 17


def test_every_curated_name_resolves_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in fastpipe.__all__:
            assert getattr(fastpipe, name) is not None, name
        namespace: dict = {}
        exec(f"from fastpipe import {', '.join(fastpipe.__all__)}", namespace)  # the import statement a user writes


def test_no_public_attribute_outside_all_but_submodules_and_version() -> None:
    extra = [
        name
        for name, value in vars(fastpipe).items()
        if not name.startswith("_")
        and name not in fastpipe.__all__
        and not (isinstance(value, types.ModuleType) and value.__name__ == f"fastpipe.{name}")
    ]
    assert not extra, f"public attributes of fastpipe outside __all__: {extra}"
    assert isinstance(fastpipe.__version__, str)


def test_the_moved_names_are_exactly_the_old_ones_not_kept() -> None:
    assert MOVED == sorted(set(BEFORE) - set(fastpipe.__all__))
    assert {name: fastpipe._MOVED.get(name) for name in SURE_MOVED} == SURE_MOVED


@pytest.mark.parametrize("name", sorted(SURE_MOVED))
def test_a_hand_named_old_name_still_warns_and_resolves(name: str) -> None:
    """Independent of the table: these old names, written out above, keep working with a warning for one release."""
    with pytest.warns(DeprecationWarning, match=rf"^fastpipe\.{name} moved: import it from {re.escape(SURE_MOVED[name])}$"):
        old = getattr(fastpipe, name)
    assert old is getattr(importlib.import_module(SURE_MOVED[name]), name)


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_warns_with_its_new_home_and_is_the_same_object(name: str) -> None:
    home = importlib.import_module(fastpipe._MOVED[name])
    with pytest.warns(DeprecationWarning, match=rf"^fastpipe\.{name} moved: import it from {re.escape(home.__name__)}$") as caught:
        old = getattr(fastpipe, name)
    assert old is getattr(home, name)
    assert caught[0].filename == __file__, "the warning points at the caller's line"
    listed = getattr(home, "__all__", None)
    assert listed is None or name in listed, f"{home.__name__}.__all__ does not export {name}"
    assert name not in vars(fastpipe), "a moved name is not cached at the top level (it would stop warning)"


def test_from_import_of_a_moved_name_warns() -> None:
    with pytest.warns(DeprecationWarning, match="fastpipe.parse_device moved: import it from fastpipe.devices"):
        namespace: dict = {}
        exec("from fastpipe import parse_device", namespace)
    assert namespace["parse_device"] is importlib.import_module("fastpipe.devices").parse_device


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        fastpipe.no_such_name  # noqa: B018


def _our_python_files() -> list[pathlib.Path]:
    skip = {REPO / "fastpipe" / "__init__.py", pathlib.Path(__file__).resolve()}
    files = [p for top in ("fastpipe", "tests", "benchmarks", "examples") for p in sorted((REPO / top).rglob("*.py"))]
    return [p for p in files if p.resolve() not in skip]


def test_our_own_code_never_uses_a_moved_name() -> None:
    """Nothing of ours warns: no ``fastpipe.X`` (code, or text a user is told to type) and no ``from fastpipe import X``
    for a moved X, in the package, the tests, the benchmarks and the examples."""
    spelled = re.compile(r"\bfastpipe\.(" + "|".join(MOVED) + r")\b")
    found = []
    for path in _our_python_files():
        text = path.read_text()
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in spelled.finditer(text)]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == "fastpipe" and not node.level:
                found += [f"{path.relative_to(REPO)}:{node.lineno}: from fastpipe import {a.name}" for a in node.names if a.name in MOVED]
    assert not found, "uses of a moved name (import it from its sub-package):\n" + "\n".join(found)


def test_the_planted_use_is_found(tmp_path: pathlib.Path) -> None:
    """The scan above can fail: the same pattern finds a planted use."""
    spelled = re.compile(r"\bfastpipe\.(" + "|".join(MOVED) + r")\b")
    planted = "import fastpipe\nloader = fastpipe.recycled(loader)\nstages = fastpipe.stages.Stages(transforms=[])\n"
    assert [m.group(0) for m in spelled.finditer(planted)] == ["fastpipe.recycled"]


# ----- documented results -----------------------------------------------------------------------------------------
#: The classes a user gets back, by the file that defines them.
RESULTS = {
    "fastpipe/diagnosis/verdict/_report.py": ("Report", "Bottleneck"),
    "fastpipe/diagnosis/ladder/_results.py": ("ExperimentResult", "Unavailable"),
    "fastpipe/experiments/_compare.py": ("Comparison", "VariantResult"),
    "fastpipe/experiments/_fix.py": ("FixReport", "FixResult"),
    "fastpipe/experiments/_tune_result.py": ("TuneResult", "Trial"),
}
RENDERINGS = ("to_dict", "to_json", "to_markdown", "to_table", "__str__")


def undocumented(source: str, names: tuple[str, ...]) -> list[str]:
    """The class docstrings, field docstrings (a string right after the field) and rendering docstrings missing."""
    missing = []
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    for name in names:
        cls = classes[name]
        if ast.get_docstring(cls) is None:
            missing.append(f"{name} (class)")
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and "ClassVar" not in ast.unparse(node.annotation):
                after = body[i + 1] if i + 1 < len(body) else None
                documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)
                if not documented:
                    missing.append(f"{name}.{node.target.id}")
            elif isinstance(node, ast.FunctionDef) and node.name in RENDERINGS and ast.get_docstring(node) is None:
                missing.append(f"{name}.{node.name}()")
    return missing


@pytest.mark.parametrize("path", sorted(RESULTS))
def test_every_field_of_the_results_is_documented(path: str) -> None:
    missing = undocumented((REPO / path).read_text(), RESULTS[path])
    assert not missing, f"{path}: undocumented: {', '.join(missing)}"


def test_an_undocumented_field_is_found() -> None:
    planted = 'class R:\n    """A result."""\n\n    ms: float\n    """Milliseconds."""\n    noise: float\n\n    def to_json(self):\n        return ""\n'
    assert undocumented(planted, ("R",)) == ["R.noise", "R.to_json()"]
