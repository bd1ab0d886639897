"""The Triton split kernel stages its KV tiles in shared memory (pipelined), checked without a GPU.

A tile the KV loop loads into registers synchronously costs a full memory latency every step:
the fp8 path did that until session 12 (25% of copy bandwidth at 16 heads; 37% after). An fp8 dot
operand read from shared memory byte by byte costs instructions and shared-memory reads: V was
read so until session 13 (47% after). These tests compile the kernel for sm_90a with the
installed Triton, exactly as a plan with NVIDIA's default config would launch it
(``benchmarks/inspect_triton_kernel.py``), and read the KV loop of the compiled TTGIR and the
PTX. CI's Triton is not the H200 machine's (3.6), but both pipeline the same way here (checked
with both for this test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia.compiler")

TOOL = Path(__file__).resolve().parents[1] / "benchmarks" / "inspect_triton_kernel.py"


def inspect(fmt: str, heads: int, layout: str) -> dict:
    """The tool's report for NVIDIA's default config at 64 x 4096, compiled in a fresh process
    (the test session runs Triton's interpreter, under which Triton compiles nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["--format", fmt, "--heads", str(heads), "--layout", layout, "--json"]
    done = subprocess.run([sys.executable, str(TOOL), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# (format, heads, layout): the tiles every KV step must copy to shared memory with cp.async.
CASES = {
    ("bf16", 16, "dense"): ["512 bf16", "64 bf16"],
    ("bf16", 16, "paged"): ["512 bf16", "64 bf16"],
    ("bf16", 64, "dense"): ["512 bf16", "64 bf16"],  # wgmma from here on
    ("bf16", 128, "dense"): ["512 bf16", "64 bf16"],
    ("fp8", 16, "dense"): ["256 i16", "64 f8E4M3FN"],  # the latent as byte pairs, once for K and V
    # four 128-column groups as byte pairs, the float32 scales (Triton stages each of the four twice), the rope
    ("fp8_ds_mla", 16, "dense"): ["64 i16"] * 4 + ["32 f32"] * 8 + ["64 bf16"],
}


@pytest.mark.parametrize(("fmt", "heads", "layout"), list(CASES), ids=lambda v: str(v))
def test_default_config_pipelines_every_kv_tile(fmt: str, heads: int, layout: str) -> None:
    report = inspect(fmt, heads, layout)
    assert report["waited"] == [], f"{report['config']}: the KV loop loads {report['waited']} synchronously"
    copied = sorted(tile.split("x")[-1] for tile in report["copied"])
    assert copied == sorted(CASES[fmt, heads, layout]), f"{report['config']}: cp.async tiles {report['copied']}"
    # No dot operand gathered from shared memory byte by byte (the fp8 paths until session 13: 128 per step).
    assert report["byte_loads"] == 0, f"{report['config']}: {report['byte_loads']} 8-bit shared loads"
