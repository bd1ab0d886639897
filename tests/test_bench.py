"""CPU smoke run of the benchmark harness: files written, numbers sane, wrong results flagged."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from tilegym import backend as registry
from tilegym import bench
from tilegym.ops import reference
from tilegym.testing import REL_L2_TOLERANCE

OP = bench.OP


def run_bench(out_dir: Path, *extra: str) -> tuple[int, dict]:
    rc = bench.main(["--suite", "tiny", "--dtype", "fp16", "--repeat", "2", "--out-dir", str(out_dir), *extra])
    reports = list(out_dir.glob("*.json"))
    assert len(reports) == 1, f"expected one JSON report, found {reports}"
    return rc, json.loads(reports[0].read_text())


def test_tiny_suite_writes_sane_results(tmp_path: Path) -> None:
    rc, report = run_bench(tmp_path)
    rows = report["rows"]
    assert rc == 0, rows
    assert {r["backend"] for r in rows} == set(bench.default_backends(torch.device("cpu")))
    assert report["ceilings"]["copy_gbps"] > 0 and report["ceilings"]["matmul_tflops"] > 0
    for r in rows:
        assert r["status"] == "ok", r
        assert 0 < r["rel_err"] <= REL_L2_TOLERANCE[torch.float16], r
        assert r["time_us"] > 0 and r["gbps"] > 0 and r["tflops"] > 0 and 0 < r["pct_roofline"], r
        assert r["mode"] == "wall-clock" and r["input_sets"] == 1, r
        assert 0 < r["x_vs_best"] <= 1 and r["x_vs_torch"] > 0, r
    assert max(r["x_vs_best"] for r in rows) == 1
    stem = tmp_path / f"{OP}_tiny_fp16"
    with stem.with_suffix(".csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    markdown = stem.with_suffix(".md").read_text()
    assert "ceilings measured in this run" in markdown and "| torch | 2 | 128 | 16 | ok |" in markdown
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib not installed: the PNG is skipped by design")
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def scaled_output(call):
    """A plausible bug: right shape, finite, 10% too large."""
    lse = reference.mla_decoding_split_kv(call)
    call.out.mul_(1.1)
    return lse


def half_written_output(call):
    """A plausible bug: only the first batch row written."""
    call.out[:1].normal_()
    return None


@pytest.mark.parametrize("wrong", [scaled_output, half_written_output], ids=["scaled", "half-written"])
def test_wrong_backend_result_is_flagged(tmp_path: Path, wrong) -> None:
    with registry.default_registry.override(OP, "torch", run=wrong):
        rc, report = run_bench(tmp_path, "--backends", "torch", "--no-plot")
    (row,) = report["rows"]
    assert rc == 1
    assert row["status"] == "FAILED" and row["note"], row
    assert row["time_us"] is None and row["gbps"] is None and row["x_vs_best"] is None
    assert "| torch | 2 | 128 | 16 | FAILED |" in (tmp_path / f"{OP}_tiny_fp16.md").read_text()
    assert not (tmp_path / f"{OP}_tiny_fp16.png").exists()


def test_unknown_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--suite", "tiny", "--backends", "torch,nope"]) == 2
    assert "unknown backend(s) nope" in capsys.readouterr().err


def test_formulas_follow_performance_doc() -> None:
    shape = bench.Shape(batch=64, seq_len=4096, heads=16)
    assert bench.flop_count(shape) == 2176 * 64 * 16 * 4096
    assert bench.traffic_bytes(shape, kv_elsize=2) == 64 * 4096 * 576 * 2 + 64 * 16 * 576 * 2 + 64 * 16 * 512 * 2
    assert bench.traffic_bytes(shape, kv_elsize=1) == bench.traffic_bytes(shape, kv_elsize=2) - 64 * 4096 * 576
    ceilings = bench.Ceilings(copy_gbps=4000.0, matmul_tflops=800.0, copy_bytes=1, matmul_n=1, matmul_dtype="bf16")
    memory_bound = bench.traffic_bytes(shape, 2) / 4000e3
    assert ceilings.floor_us(bench.traffic_bytes(shape, 2), bench.flop_count(shape)) == pytest.approx(memory_bound)
    big_h = bench.Shape(64, 4096, 128)
    assert ceilings.floor_us(bench.traffic_bytes(big_h, 2), bench.flop_count(big_h)) == pytest.approx(
        bench.flop_count(big_h) / 800e6
    )
