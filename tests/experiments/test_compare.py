import json

import pytest

from fastpipe.cli import main
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.experiments._compare import TOY_LADDER, compare, resolve_variants

M = "tests.fakes.compare"
DEVICE = "sim:40"


@pytest.mark.slow
def test_ladder_closes_the_gap_and_flags_a_rung_that_does_not() -> None:
    result = compare(
        [f"{M}:slow", f"{M}:faster", f"{M}:same_as_faster", f"{M}:fastest"],
        device=DEVICE,
        options=MeasureOptions(steps=6, warmup=2, budget=3),
        memory=False,
    )
    assert result.device_bound_steps_per_s == pytest.approx(25, rel=0.1)
    slow, faster, same, fastest = result.variants
    assert slow.fraction_of_bound < 0.45 and fastest.fraction_of_bound > 0.85
    assert faster.improved and fastest.improved and same.improved is False
    assert 0.3 < faster.gap_closed < 0.9 and fastest.gap_closed > 0.6
    verdicts = [f for f in result.flags if not f.startswith("other processes used")]  # the interference check may name any rung
    assert [f for f in verdicts if "same_as_faster" in f] and not [f for f in verdicts if "'faster'" in f or "fastest" in f]
    # time, not throughput differences: the saving is the step shortened, and the gain is what it buys
    assert faster.saved_ms == pytest.approx(slow.ms_per_step - faster.ms_per_step)
    assert faster.throughput_gain == pytest.approx(slow.ms_per_step / faster.ms_per_step - 1)
    assert faster.gap_closed == pytest.approx(faster.saved_ms / (slow.ms_per_step - 1000 / result.device_bound_steps_per_s))
    data = json.loads(result.to_json())
    assert data["device_bound_steps_per_s"] > 0
    assert {"name", "steps_per_s", "fraction_of_bound", "gap_closed", "ms_per_step", "saved_ms", "throughput_gain"} <= set(
        data["variants"][0]
    )


def test_toy_means_the_ladder() -> None:
    assert resolve_variants(["toy"]) == TOY_LADDER
    assert [spec for _, spec in TOY_LADDER] == [
        "toy:naive",
        "toy:fast-transforms",
        "toy:uint8-host",
        "toy:crop-first",
        "toy:optimized",
        "toy:recycled",
    ]
    from fastpipe.workloads.toy import VARIANTS

    assert all(spec.partition(":")[2] in VARIANTS for _, spec in TOY_LADDER)


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_cli_compare_pair_writes_outputs(tmp_path, capsys) -> None:
    argv = [
        "compare",
        f"{M}:slow",
        f"{M}:fastest",
        "--device",
        DEVICE,
        "--steps",
        "4",
        "--warmup",
        "1",
        "--budget",
        "2",
        "--json",
        str(tmp_path / "c.json"),
        "--markdown",
        str(tmp_path / "c.md"),
        "--plot",
        str(tmp_path / "c.png"),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "device bound" in out and "faster beyond noise" in out and "row above" in out
    assert json.loads((tmp_path / "c.json").read_text())["variants"][1]["improved"] is True
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert "| variant |" in (tmp_path / "c.md").read_text()


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["compare", f"{M}:slow"], "at least two SPECs"),
        (["compare", f"{M}:slow", f"{M}:raises"], "factory exploded"),
        (["compare", f"{M}:slow", f"{M}:fastest", "--num-workers", "2"], "only apply to the built-in toy"),
    ],
)
def test_cli_compare_bad_input(argv, fix, capsys) -> None:
    assert main([*argv, "--device", DEVICE, "--steps", "2", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert fix in err and "Traceback" not in err


@pytest.mark.slow
def test_the_order_of_the_variants_does_not_change_the_verdicts() -> None:
    """Interleaved rounds after a warm-up pass: a real saving is found in either order, an equal pair in neither."""
    quick = MeasureOptions(steps=4, warmup=1, budget=3)
    forward = compare([f"{M}:slow", f"{M}:fastest"], device=DEVICE, options=quick, memory=False)
    backward = compare([f"{M}:fastest", f"{M}:slow"], device=DEVICE, options=quick, memory=False)
    assert forward.variants[1].improved is True and backward.variants[1].improved is False
    for pair in ([f"{M}:faster", f"{M}:same_as_faster"], [f"{M}:same_as_faster", f"{M}:faster"]):
        result = compare(pair, device=DEVICE, options=quick, memory=False)
        assert result.variants[1].improved is False, result.to_table()
