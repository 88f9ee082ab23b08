"""The package's layers (ARCHITECTURE.md) and its public face, checked so they stay as designed.

Layering: every ``fastpipe`` import in every module (module level and inside functions alike, read with
``ast``, so nothing is executed) goes to a package of the importer's own layer or a lower one.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import fastpipe

ROOT = pathlib.Path(fastpipe.__file__).parent

#: Lowest first. A module may import from its own layer and the layers below, never from above.
LAYERS: list[tuple[str, ...]] = [
    (
        "fastpipe.errors",
        "fastpipe._system",
        "fastpipe._tree",
        "fastpipe._render",
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


def fastpipe_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, imported module) for each import of fastpipe in the file; ``from fastpipe import x`` counts as x."""
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
            if base == "fastpipe":  # from fastpipe import x: x is a submodule or a public name of the top package
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


#: The public API as it stood before the layout moved (every name a user could import from ``fastpipe``).
PUBLIC_NAMES = [
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
    "TuneResult",
    "Workload",
    "check_step",
    "compare",
    "default_device_for",
    "default_device_spec",
    "diagnose",
    "explain_saturation",
    "find_pipeline",
    "load_workload",
    "make_prefetcher",
    "measure_stage_costs",
    "measure_workload",
    "parse_device",
    "recommend",
    "recycled",
    "release",
    "releasing",
    "tune",
    "watch",
]


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_name_imports(name):
    assert hasattr(fastpipe, name)
    assert name in fastpipe.__all__


def test_all_is_sorted_and_complete():
    assert fastpipe.__all__ == sorted(fastpipe.__all__)
    assert set(PUBLIC_NAMES) <= set(fastpipe.__all__)


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
