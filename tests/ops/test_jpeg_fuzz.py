"""Damaged JPEGs never crash fastpipe: benchmarks/fuzz_jpeg.py's seeded mutations, run in a child process.

Each case is one call of ``jpeg_size``, ``decode_jpeg_crop``, the raw op, the entropy floor or
``ImageFolder`` (raise and pil) on a mutated real photo or a bad crop request; it must return a
correct-shaped result or raise CorruptImageError / ConfigError naming the file. A signal that
kills the child is a crash, counted against the case that caused it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fastpipe.ops.jpeg as jpeg
from tests.fakes.benchmark_scripts import load_benchmark

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
pytestmark = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 real photos of every flavour the corpus has (baseline, progressive, greyscale, CMYK, subsamplings)."""
    try:
        from fastpipe.workloads.photos import build_corpus
    except ImportError:  # before the modules moved into subpackages
        from fastpipe.photos import build_corpus  # type: ignore[no-redef]
    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=12, seed=0, classes=2)


def fuzz(corpus: Path, cases: int, seed: int) -> None:
    tally = load_benchmark("fuzz_jpeg").run(corpus, cases=cases, seed=seed)
    print(f"\nfuzz_jpeg (seed {seed}): {tally.line()}")
    for failure in tally.failures:
        print("FAIL", failure)
    assert tally.cases == cases
    assert (tally.crashes, tally.hangs, tally.other) == (0, 0, 0), "\n".join(tally.failures[:20])
    # Both outcomes occur, so neither path of the check is vacuous.
    assert tally.images > cases // 10 and tally.clear_errors > cases // 10, tally.line()


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_fuzz_500_cases(corpus: Path) -> None:
    fuzz(corpus, cases=500, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_5000_cases(corpus: Path, seed: int) -> None:
    fuzz(corpus, cases=5000, seed=seed)


@pytest.mark.parametrize("crash_at", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_the_fuzzer_sees_a_crash(corpus: Path, monkeypatch: pytest.MonkeyPatch, crash_at: int) -> None:
    """A case that kills its process is counted as a crash against that case, and the cases after it still run
    (in a new child: the slow variant, since each child pays torch's import)."""
    fuzz_jpeg = load_benchmark("fuzz_jpeg")
    real = fuzz_jpeg.make_cases

    def with_a_crash(corpus_dir: Path, workdir: Path, count: int, seed: int) -> list:
        cases = real(corpus_dir, workdir, count, seed)
        cases[crash_at].target = "crash"  # the child kills itself with SIGSEGV on this target
        return cases

    monkeypatch.setattr(fuzz_jpeg, "make_cases", with_a_crash)
    monkeypatch.setenv("FASTPIPE_FUZZ_SELFTEST", "1")  # lets the child honour the "crash" target
    count = crash_at + 1 if crash_at == 1 else 8
    tally = fuzz_jpeg.run(corpus, cases=count, seed=0)
    assert (tally.cases, tally.crashes, tally.other) == (count, 1, 0), tally.failures
    assert f"case {crash_at} " in tally.failures[0] and "signal 11" in tally.failures[0], tally.failures
