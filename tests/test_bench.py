"""CPU smoke run of the benchmark harness: files written, numbers sane, wrong results flagged."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
import torch

from tilegym import backend as registry
from tilegym import bench
from tilegym.ops import mla_decoding, reference
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
    assert {r["q_len"] for r in rows} == {1, 2} and {r["lengths"] for r in rows} == {"full", "uniform"}
    assert report["ceilings"]["copy_gbps"] > 0 and report["ceilings"]["matmul_tflops"] > 0
    for r in rows:
        assert r["status"] == "ok", r
        assert 0 < r["rel_err"] <= REL_L2_TOLERANCE[torch.float16], r
        assert r["time_us"] > 0 and r["gbps"] > 0 and r["tflops"] > 0 and 0 < r["pct_roofline"], r
        assert r["mode"] == "wall-clock" and r["input_sets"] == 1, r
        assert 0 < r["x_vs_best"] <= 1 and r["x_vs_torch"] > 0, r
        assert r["host_us"] > 0 and r["host_unplanned_us"] > 0 and r["plan_us"] > 0, r
        assert r["auto_backend"] == "torch", r  # the CPU's vendor list
    assert max(r["x_vs_best"] for r in rows) == 1
    stem = tmp_path / f"{OP}_tiny_fp16"
    with stem.with_suffix(".csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    markdown = stem.with_suffix(".md").read_text()
    assert (
        "ceilings measured in this run" in markdown and "| torch | 2 | 128 | 16 | 1 | full | dense | ok |" in markdown
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib not installed: the PNG is skipped by design")
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class ScaledRunner(reference.TorchDecodeRunner):
    """A plausible bug: right shape, finite, 10% too large."""

    def run(self, q, qpe, kv, kpe, kv_scale, out, lse):
        super().run(q, qpe, kv, kpe, kv_scale, out, lse)
        out.mul_(1.1)


class HalfWrittenRunner(reference.TorchDecodeRunner):
    """A plausible bug: only the first batch row written."""

    def run(self, q, qpe, kv, kpe, kv_scale, out, lse):
        out[:1].normal_()


def scaled_output(call):
    return ScaledRunner(call)


def half_written_output(call):
    return HalfWrittenRunner(call)


@pytest.mark.parametrize("wrong", [scaled_output, half_written_output], ids=["scaled", "half-written"])
def test_wrong_backend_result_is_flagged(tmp_path: Path, wrong) -> None:
    with registry.default_registry.override(OP, "torch", run=wrong):
        rc, report = run_bench(tmp_path, "--backends", "torch", "--no-plot")
    assert rc == 1
    for row in report["rows"]:
        assert row["status"] == "FAILED" and row["note"], row
        assert row["time_us"] is None and row["gbps"] is None and row["x_vs_best"] is None
    assert "| torch | 2 | 128 | 16 | 1 | full | dense | FAILED |" in (tmp_path / f"{OP}_tiny_fp16.md").read_text()
    assert not (tmp_path / f"{OP}_tiny_fp16.png").exists()


def test_unknown_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--suite", "tiny", "--backends", "torch,nope"]) == 2
    assert "unknown backend(s) nope" in capsys.readouterr().err


def test_formulas_follow_performance_doc() -> None:
    shape = mla_decoding.Shape(batch=64, seq_len=4096, heads=16)
    tokens = 64 * 4096
    assert (
        mla_decoding.kv_bytes_per_token(torch.bfloat16) == 1152
        and mla_decoding.kv_bytes_per_token(torch.float8_e4m3fn) == 576
    )
    assert mla_decoding.flop_count(shape, tokens) == 2176 * 64 * 16 * 4096
    bf16 = mla_decoding.traffic_bytes(shape, tokens, 1152)
    assert bf16 == 64 * 4096 * 576 * 2 + 64 * 16 * 576 * 2 + 64 * 16 * 512 * 2
    assert mla_decoding.traffic_bytes(shape, tokens, 576) == bf16 - 64 * 4096 * 576
    ceilings = bench.Ceilings(copy_gbps=4000.0, matmul_tflops=800.0, copy_bytes=1, matmul_n=1, matmul_dtype="bf16")
    assert ceilings.floor_us(bf16, mla_decoding.flop_count(shape, tokens)) == pytest.approx(bf16 / 4000e3)
    big_h = mla_decoding.Shape(64, 4096, 128)
    flops = mla_decoding.flop_count(big_h, tokens)
    assert ceilings.floor_us(mla_decoding.traffic_bytes(big_h, tokens, 1152), flops) == pytest.approx(flops / 800e6)
    mtp = mla_decoding.Shape(64, 4096, 16, q_len=4)
    assert mla_decoding.flop_count(mtp, tokens) == 4 * mla_decoding.flop_count(shape, tokens)


def test_mixed_lengths_are_seeded_and_in_range() -> None:
    for kind in ("uniform", "long-tail"):
        shape = mla_decoding.Shape(64, 8192, 16, lengths=kind)
        lengths = mla_decoding.row_lengths(shape)
        assert lengths == mla_decoding.row_lengths(shape) and len(lengths) == 64
        assert 1 <= min(lengths) and max(lengths) <= 8192 and len(set(lengths)) > 8
    tail = mla_decoding.row_lengths(mla_decoding.Shape(64, 8192, 16, lengths="long-tail"))
    assert sum(n == 8192 for n in tail) == 8 and sorted(tail)[55] <= 8192 // 16


def test_default_out_dir_is_outside_the_source_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILEGYM_RESULTS_DIR", raising=False)
    assert bench.default_out_dir("deepseek") == Path("tilegym-results") / "deepseek"
    monkeypatch.setenv("TILEGYM_RESULTS_DIR", "/tmp/somewhere")
    assert bench.default_out_dir("mixed") == Path("/tmp/somewhere/mixed")


def test_bad_sweep_and_page_size_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--suite", "tiny", "--sweep", "block_n=3"]) == 2
    assert bench.main(["--suite", "tiny", "--layout", "paged", "--page-size", "48"]) == 2
    err = capsys.readouterr().err
    assert "--sweep: expected kv_len_per_split=N" in err and "--page-size must be a power of two" in err


def test_report_says_how_a_sample_was_timed(tmp_path: Path) -> None:
    """New rows record calls per sample; a report from before that column (rewritten from its
    JSON) says it timed one round of the input sets per replay instead of claiming the new method."""
    rc, report = run_bench(tmp_path)
    assert rc == 0 and all(r["calls_per_sample"] == 1 for r in report["rows"]), report["rows"]
    markdown = (tmp_path / f"{OP}_tiny_fp16.md").read_text()
    assert "a graph of `calls` calls" in markdown and "| sets | calls |" in markdown
    old = dict(report)
    old["rows"] = [
        {k: v for k, v in r.items() if k not in ("calls_per_sample", "power_capped_pct")} for r in report["rows"]
    ]
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    old_json = old_dir / f"{OP}_tiny_fp16.json"
    old_json.write_text(json.dumps(old))
    assert bench.main(["--from-json", str(old_json), "--no-plot"]) == 0
    rewritten = old_json.with_suffix(".md").read_text()
    assert "running each of the `sets` input sets once (calls not recorded)" in rewritten
    assert "a graph of `calls` calls" not in rewritten


def test_host_time_stops_at_its_budget_for_slow_calls() -> None:
    """Back-to-back host timing runs every asked call when calls are quick, and stops after its time
    budget when each takes a while (the torch reference over one-token pages took ~0.5 s a call)."""
    counted = []
    quick_us = bench.host_us_per_call(lambda: counted.append(1), torch.device("cpu"), calls=50, budget_s=10.0)
    assert len(counted) == 3 + 50 and quick_us < 1e5  # three warm-up calls, then all 50

    slow = []

    def sleepy() -> None:
        slow.append(1)
        time.sleep(0.02)

    start = time.perf_counter()
    slow_us = bench.host_us_per_call(sleepy, torch.device("cpu"), calls=1000, budget_s=0.1)
    assert time.perf_counter() - start < 2.0
    assert 3 + 1 <= len(slow) <= 3 + 10  # ~5 timed calls fill 0.1 s, far from 1000
    assert 0.02e6 <= slow_us < 0.1e6  # each call's own 20 ms, not the budget spread over 1000 calls
