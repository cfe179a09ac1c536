"""`gpud bench clients --repeat N` (benchmarks/clients.py): one device, then every device, N times in turn, and
the median speed-up of each client count. On the fake backend's two devices, a process per device."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support import benchmark

from gpud.service import cli


def test_speedups_are_each_counts_rate_on_every_device_over_one() -> None:
    one = [{"aggregate_dispatches_per_s": 100.0}, {"aggregate_dispatches_per_s": 200.0}]
    many = [{"aggregate_dispatches_per_s": 190.0}, {"aggregate_dispatches_per_s": 300.0}]
    assert benchmark("clients")._speedups(one, many) == [1.9, 1.5]
    assert [run["speedup_over_one_device"] for run in many] == [1.9, 1.5]


def test_repeated_runs_alternate_and_give_the_median(tmp_path: Path) -> None:
    out = tmp_path / "clients.json"
    args = argparse.Namespace(
        clients="1", quick=True, seconds=1.0, size=256, devices="all", backend="fake", process_per_device=True,
        repeat=3, json=out,
    )  # fmt: skip
    assert benchmark("clients").main(args) == 0
    results = json.loads(out.read_text())
    ratios = [results["runs_all_devices"][0]["speedup_over_one_device"]]
    ratios += [repeat["runs_all_devices"][0]["speedup_over_one_device"] for repeat in results["repeats"]]
    assert len(ratios) == 3 and results["median_speedup_over_one_device"] == {"1": sorted(ratios)[1]}


@pytest.mark.parametrize("text", ["0", "-2", "two"])
def test_repeat_must_be_a_whole_number_from_one(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "clients", "--repeat", text])
    assert f"--repeat: a whole number from 1, not '{text}'" in capsys.readouterr().err
