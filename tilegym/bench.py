"""``python -m tilegym bench``: every available backend of ``mla_decoding_split_kv``, side by side.

One run measures the machine's ceilings (device-to-device copy bandwidth, bf16 matmul
rate), then for each shape of a suite and each backend: plans the call once (as a serving
engine does per decode step), checks the output against the float64 oracle on fresh
random inputs, times it (CUDA graph replay of planned calls, median; rotating input sets
when a set would fit in L2), measures the host time of eager planned and unplanned calls,
and reports microseconds, GB/s, TFLOP/s, the share of each ceiling and of the roofline
floor, and the speed ratios between backends. Writes JSON, CSV, a markdown table and a
PNG plot.

Shapes have a batch, a cache length S, heads, new tokens per row (Q) and a length
distribution: every row S long ("full"), lengths uniform in [1, S] ("uniform"), or most rows
short and a few S long ("long-tail"). Bytes and FLOPs count the tokens actually present.
``--layout paged|ragged --page-size N`` stores the cache in randomly ordered pages.

On a CPU the harness runs too (the ``tiny`` suite, fp16, Triton in its interpreter): the
numbers there only prove the harness works.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tilegym.backend import backend_names, device_vendor, implementations
from tilegym.cli import demo_backends, describe_device
from tilegym.ops import mla_decoding_split_kv, plan_mla_decoding
from tilegym.ops.accuracy import format_name
from tilegym.ops.contract import PACKED_KV_FORMATS
from tilegym.ops.mla_decoding import (
    HEAD_DIM,
    MLA_DECODING,
    ROPE_DIM,
    Shape,
    kv_bytes_per_token,
    row_lengths,
)
from tilegym.power import capped_percent, read_power
from tilegym.testing import (
    REL_L2_TOLERANCE,
    MLAInputs,
    cache_kwargs,
    make_mla_inputs,
    relative_error,
)
from tilegym.timing import time_calls
from tilegym.utils import DTYPE_SHORT_NAMES, FP8_DTYPES, cdiv

OP = MLA_DECODING.name
LAYOUTS = ("dense", "paged", "ragged")
SUITES = MLA_DECODING.suites

ROTATE_BYTES = 256 << 20  # rotate input sets until together they exceed this (H200 L2: 60 MB)
MAX_INPUT_SETS = 64
CHECK_ROWS = 4  # batch rows compared with the float64 oracle (rows are independent)
HOST_CALLS = 200  # back-to-back eager calls timed on the host
# ... or fewer, once they have taken this long: the torch reference over pages of one token, at 0.08-0.6 s
# per call on the H200 (session 32's logs), would otherwise spend about 20-140 s per shape here.
HOST_BUDGET_S = 0.5


@dataclass(frozen=True)
class Ceilings:
    """The machine's measured rates: copy bandwidth (read + write) and matmul throughput."""

    copy_gbps: float
    matmul_tflops: float
    copy_bytes: int
    matmul_n: int
    matmul_dtype: str

    def floor_us(self, nbytes: int, flops: int) -> float:
        """Roofline floor: the slower of moving the bytes and doing the FLOPs at the ceilings."""
        return max(nbytes / (self.copy_gbps * 1e3), flops / (self.matmul_tflops * 1e6))


# ---------------------------------------------------------------------------------------
# Ceilings, measured in the same run.


def measure_copy_gbps(device: torch.device, nbytes: int) -> float:
    """Device-to-device copy of ``nbytes``; counts bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, dtype=torch.float32, device=device)  # < 2^31 elements: 32-bit indexing
    dst = torch.empty_like(src)
    timing = time_calls([lambda: dst.copy_(src)], device, warmup=3, repeat=10, use_graph=False)
    return 2 * src.nbytes / (timing.median_us * 1e3)


def measure_matmul_tflops(device: torch.device, n: int, dtype: torch.dtype) -> float:
    """``n``^3 matmul on random data (zeros would run faster than real data)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    timing = time_calls([lambda: torch.matmul(a, b, out=c)], device, warmup=3, repeat=10, use_graph=False)
    return 2 * n**3 / (timing.median_us * 1e6)


def measure_ceilings(device: torch.device) -> Ceilings:
    """2 GiB copy and bf16 8192^3 matmul on a GPU; small sizes on a CPU (indicative only)."""
    on_gpu = device.type == "cuda"
    copy_bytes = (2 << 30) if on_gpu else (64 << 20)
    matmul_n = 8192 if on_gpu else 512
    dtype = torch.bfloat16
    ceilings = Ceilings(
        copy_gbps=measure_copy_gbps(device, copy_bytes),
        matmul_tflops=measure_matmul_tflops(device, matmul_n, dtype),
        copy_bytes=copy_bytes,
        matmul_n=matmul_n,
        matmul_dtype=DTYPE_SHORT_NAMES[dtype],
    )
    if on_gpu:
        torch.cuda.empty_cache()
    return ceilings


# ---------------------------------------------------------------------------------------
# One shape: inputs, the oracle, and one row per backend.


@dataclass
class BenchConfig:
    """What every row of one run shares."""

    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype  # the cache's element dtype (uint8 for the packed formats)
    warmup: int
    repeat: int
    ceilings: Ceilings
    layout: str = "dense"
    page_size: int = 64
    splits: tuple[int | None, ...] = (None,)  # kv_len_per_split values (None: the backend's choice)
    kv_cache_format: str | None = None  # a packed format ("fp8_ds_mla", "mxfp4"); None: kv_dtype's own

    @property
    def kv_format(self) -> str:
        """The cache format name: what tolerances, byte counts and tables key on."""
        return self.kv_cache_format or format_name(self.kv_dtype)


@dataclass
class Row:
    """One backend on one shape. Time fields are None unless ``status`` is "ok"."""

    backend: str
    batch: int
    seq_len: int
    heads: int
    dtype: str
    kv_dtype: str
    status: str  # ok | FAILED (wrong result) | error (raised) | skipped (cannot run these inputs)
    q_len: int = 1
    lengths: str = "full"
    layout: str = "dense"
    page_size: int | None = None
    split: int | None = None  # kv_len_per_split given to the op (None: the backend's choice)
    tokens: int | None = None
    rel_err: float | None = None
    tolerance: float | None = None
    mode: str | None = None
    input_sets: int | None = None
    calls_per_sample: int | None = None  # calls timed together (a graph's rounds of the input sets)
    time_us: float | None = None
    spread_us: float | None = None
    power_capped_pct: float | None = None  # share of the timing the GPU ran power-capped (NVML; None without it)
    host_us: float | None = None  # host time of one eager call with a plan
    host_unplanned_us: float | None = None  # host time of one eager call without a plan
    plan_us: float | None = None  # host time of plan_mla_decoding
    gbps: float | None = None
    tflops: float | None = None
    pct_copy_bw: float | None = None
    pct_matmul: float | None = None
    floor_us: float | None = None
    pct_roofline: float | None = None
    x_vs_torch: float | None = None
    x_vs_best: float | None = None
    auto_backend: str | None = None  # what ``auto`` picks for this shape (set per shape)
    auto_x_vs_best: float | None = None  # the fastest row's time over auto's pick's time (1.0: auto picked the best)
    note: str = ""

    @property
    def shape(self) -> Shape:
        return Shape(self.batch, self.seq_len, self.heads, self.q_len, self.lengths)

    @property
    def label(self) -> str:
        return self.backend + (f"@split{self.split}" if self.split else "")


@dataclass
class StepInputs:
    """One input set: the op's tensors for the configured layout (page tables shared by all sets)."""

    q: torch.Tensor
    qpe: torch.Tensor
    kv: torch.Tensor
    kpe: torch.Tensor | None  # None: the rope sits in kv's bytes (fp8_ds_mla)
    kv_scale: torch.Tensor | None


@dataclass
class ShapeData:
    """Rotating input sets for one shape (set 0 is checked), the shared index tensors, the oracle."""

    sets: list[StepInputs]
    outs: list[torch.Tensor]
    index: dict[str, torch.Tensor]  # kv_lens and the layout's page table, shared by every set
    tokens: int
    rows: torch.Tensor  # batch rows compared with the oracle
    expected: torch.Tensor  # float64 oracle output of those rows


def working_set_bytes(shape: Shape, cfg: BenchConfig) -> int:
    tokens = shape.batch * shape.seq_len
    return MLA_DECODING.traffic_bytes(shape, tokens, kv_bytes_per_token(cfg.kv_format), cfg.dtype.itemsize)


def input_set_count(shape: Shape, cfg: BenchConfig) -> int:
    """Enough input sets that cycling through them defeats the L2 cache (1 on a CPU)."""
    if cfg.device.type != "cuda":
        return 1
    return max(1, min(MAX_INPUT_SETS, cdiv(ROTATE_BYTES, working_set_bytes(shape, cfg))))


def checked_rows(batch: int) -> torch.Tensor:
    """First, last and evenly spread rows: catches per-row indexing bugs at any batch size."""
    picks = sorted({round(i * (batch - 1) / (CHECK_ROWS - 1)) for i in range(CHECK_ROWS)})
    return torch.tensor(picks, dtype=torch.long)


def _one_set(
    shape: Shape, cfg: BenchConfig, lengths: list[int] | None, index_seed: int
) -> tuple[MLAInputs, StepInputs, dict]:
    """One input set: (dense inputs whose cache the oracle reads, the op's tensors, index tensors).

    For a packed format the oracle's cache is the dequantised one (float32), so only a backend's
    own rounding counts against its declared tolerance.
    """
    packed = cfg.kv_cache_format is not None
    kv_dtype = None if packed or cfg.kv_dtype == cfg.dtype else cfg.kv_dtype
    args = (shape.batch, shape.heads, shape.seq_len, HEAD_DIM, ROPE_DIM)
    x = make_mla_inputs(
        *args, dtype=cfg.dtype, kv_dtype=kv_dtype, device=cfg.device, kv_lens=lengths, q_len=shape.q_len
    )
    generator = torch.Generator().manual_seed(index_seed)
    kwargs, cache = cache_kwargs(x, cfg.kv_cache_format, cfg.layout, cfg.page_size, generator=generator)
    oracle = MLAInputs(x.q, x.qpe, torch.cat((cache.latent, cache.rope), -1), x.kv_lens) if packed else x
    step = StepInputs(x.q, x.qpe, kwargs.pop("kv"), kwargs.pop("kpe"), kwargs.pop("kv_scale"))
    kwargs.pop("kv_cache_format", None)  # make_shape_data adds it to the index arguments
    return oracle, step, {k: v for k, v in kwargs.items() if v is not None}


def make_shape_data(shape: Shape, cfg: BenchConfig) -> ShapeData:
    """Input sets sharing one page table (same seed), like the layers of one decode step."""
    lengths = None if shape.lengths == "full" and cfg.layout == "dense" else row_lengths(shape)
    first, step, index = _one_set(shape, cfg, lengths, index_seed=1)
    if cfg.kv_cache_format is not None:
        index["kv_cache_format"] = cfg.kv_cache_format
    sets = [step]
    for _ in range(input_set_count(shape, cfg) - 1):
        sets.append(_one_set(shape, cfg, lengths, index_seed=1)[1])
    outs = [torch.empty(first.q.shape[:-1] + (HEAD_DIM,), dtype=cfg.dtype, device=cfg.device) for _ in sets]
    rows = checked_rows(shape.batch)
    picked = [t.index_select(0, rows.to(cfg.device)) for t in (first.q, first.qpe, first.kv, first.kpe)]
    lens = None if first.kv_lens is None else first.kv_lens.index_select(0, rows.to(cfg.device))
    expected, _ = MLA_DECODING.oracle(*picked, kv_lens=lens, kv_scale=first.kv_scale)
    tokens = sum(lengths) if lengths is not None else shape.batch * shape.seq_len
    del first
    return ShapeData(sets, outs, index, tokens, rows, expected)


def op_kwargs(data: ShapeData, step: StepInputs, split: int | None) -> dict:
    kwargs = dict(data.index)
    if step.kv_scale is not None:
        kwargs["kv_scale"] = step.kv_scale
    if split is not None:
        kwargs["kv_len_per_split"] = split
    return kwargs


def make_plan(backend: str, data: ShapeData, split: int | None) -> object:
    step = data.sets[0]
    return plan_mla_decoding(step.q, step.qpe, step.kv, step.kpe, **op_kwargs(data, step, split), backend=backend)


def planned_call(plan: object, data: ShapeData, i: int) -> Callable[[], object]:
    step, out = data.sets[i], data.outs[i]

    def run() -> object:
        return mla_decoding_split_kv(step.q, step.qpe, step.kv, step.kpe, kv_scale=step.kv_scale, out=out, plan=plan)

    return run


def unplanned_call(backend: str, data: ShapeData, split: int | None) -> Callable[[], object]:
    step, out = data.sets[0], data.outs[0]
    kwargs = op_kwargs(data, step, split)

    def run() -> object:
        return mla_decoding_split_kv(step.q, step.qpe, step.kv, step.kpe, **kwargs, out=out, backend=backend)

    return run


def unsupported_reasons(backend: str, data: ShapeData, split: int | None) -> list[str]:
    """Why ``backend`` cannot run these inputs: the registry's reasons."""
    impl = implementations(OP).get(backend)
    if impl is None:
        return ["no implementation of this op"]
    step = data.sets[0]
    call = MLA_DECODING.validate(step.q, step.qpe, step.kv, step.kpe, **op_kwargs(data, step, split))
    return impl.reasons(call)


def check_result(run: Callable[[], object], data: ShapeData, tolerance: float) -> tuple[float, str]:
    """Run once on a NaN-poisoned output; return (rel. error of the sampled rows, problem or "")."""
    out = data.outs[0].fill_(float("nan"))
    run()
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)
    err = relative_error(out.index_select(0, data.rows.to(out.device)), data.expected)
    if not bool(torch.isfinite(out).all()):
        return err, "output has NaN/Inf (unwritten or overflowed elements)"
    if not err <= tolerance:
        return err, f"rel. L2 error {err:.2e} > tolerance {tolerance:.0e}"
    return err, ""


def host_us_per_call(
    run: Callable[[], object], device: torch.device, calls: int, budget_s: float = HOST_BUDGET_S
) -> float:
    """Wall time per call of ``calls`` back-to-back eager calls, without waiting for the GPU in between;
    fewer (at least one) once they have taken ``budget_s``."""
    for _ in range(3):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    done, elapsed = 0, 0.0
    while done < calls and (done == 0 or elapsed < budget_s):
        run()
        done += 1
        elapsed = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return elapsed / done * 1e6


def plan_host_us(backend: str, data: ShapeData, split: int | None, device: torch.device) -> float:
    """Median host time of building a plan (its device work is launched, not awaited)."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        make_plan(backend, data, split)
        samples.append((time.perf_counter() - start) * 1e6)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return sorted(samples)[len(samples) // 2]


def fill_metrics(row: Row, ceilings: Ceilings, kv_token_bytes: int, q_elsize: int) -> None:
    nbytes = MLA_DECODING.traffic_bytes(row.shape, row.tokens, kv_token_bytes, q_elsize)
    flops = MLA_DECODING.flop_count(row.shape, row.tokens)
    row.gbps = nbytes / (row.time_us * 1e3)
    row.tflops = flops / (row.time_us * 1e6)
    row.pct_copy_bw = 100 * row.gbps / ceilings.copy_gbps
    row.pct_matmul = 100 * row.tflops / ceilings.matmul_tflops
    row.floor_us = ceilings.floor_us(nbytes, flops)
    row.pct_roofline = 100 * row.floor_us / row.time_us


def error_tolerance(backend: str, dtype: torch.dtype, kv_format: str) -> float:
    """The relative L2 error vs float64 a correct ``backend`` declares for this query dtype and cache format."""
    return MLA_DECODING.tolerance(backend, dtype, kv_format)


def new_row(backend: str, shape: Shape, cfg: BenchConfig, split: int | None, status: str = "", note: str = "") -> Row:
    return Row(
        backend,
        shape.batch,
        shape.seq_len,
        shape.heads,
        DTYPE_SHORT_NAMES[cfg.dtype],
        cfg.kv_format,
        status,
        q_len=shape.q_len,
        lengths=shape.lengths,
        layout=cfg.layout,
        page_size=cfg.page_size if cfg.layout != "dense" else None,
        split=split,
        tolerance=error_tolerance(backend, cfg.dtype, cfg.kv_format),
        note=note,
    )


def bench_backend(backend: str, shape: Shape, data: ShapeData, cfg: BenchConfig, split: int | None) -> Row:
    """Check, then time, one backend on one shape; never raises."""
    row = new_row(backend, shape, cfg, split)
    row.tokens = data.tokens
    try:
        reasons = unsupported_reasons(backend, data, split)
        if reasons:
            row.status, row.note = "skipped", "; ".join(reasons)
            return row
        plan = make_plan(backend, data, split)
        err, problem = check_result(planned_call(plan, data, 0), data, row.tolerance)
        row.rel_err = err if math.isfinite(err) else None  # JSON has no NaN; the note says why
        if problem:
            row.status, row.note = "FAILED", problem
            return row
        calls = [planned_call(plan, data, i) for i in range(len(data.sets))]
        # Graph replay of planned calls, as serving engines run decode (one plan per step).
        power_before = read_power(cfg.device)
        timing = time_calls(calls, cfg.device, warmup=cfg.warmup, repeat=cfg.repeat, use_graph=True)
        row.power_capped_pct = capped_percent(power_before, read_power(cfg.device))
        host_calls = HOST_CALLS if cfg.device.type == "cuda" else 2
        row.host_us = host_us_per_call(calls[0], cfg.device, host_calls)
        row.host_unplanned_us = host_us_per_call(
            unplanned_call(backend, data, split), cfg.device, max(1, host_calls // 4)
        )
        row.plan_us = plan_host_us(backend, data, split, cfg.device)
    except Exception as exc:  # one backend's failure must not stop the others
        row.status, row.note = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return row
    row.status, row.mode, row.input_sets, row.calls_per_sample = "ok", timing.mode, len(calls), timing.calls_per_sample
    row.time_us, row.spread_us = timing.median_us, timing.spread_us
    fill_metrics(row, cfg.ceilings, kv_bytes_per_token(cfg.kv_format), cfg.dtype.itemsize)
    return row


def add_ratios(rows: Sequence[Row]) -> None:
    """Per shape: speed relative to the torch backend (x faster) and to the fastest row."""
    for shape in {r.shape for r in rows}:
        timed = [r for r in rows if r.shape == shape and r.status == "ok"]
        if not timed:
            continue
        best = min(r.time_us for r in timed)
        torch_rows = [r.time_us for r in timed if r.backend == "torch" and r.split is None]
        auto_rows = [r.time_us for r in timed if r.backend == r.auto_backend and r.split is None]
        for r in timed:
            r.x_vs_best = best / r.time_us
            r.x_vs_torch = torch_rows[0] / r.time_us if torch_rows else None
            r.auto_x_vs_best = best / auto_rows[0] if auto_rows else None


# ---------------------------------------------------------------------------------------
# Environment, progress, outputs.


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def nvidia_driver_version() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return done.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def device_arch_name(device: torch.device) -> str:
    """'sm_90'-style arch of an NVIDIA GPU, the gfx name of an AMD one, 'cpu' otherwise."""
    if device.type != "cuda":
        return "cpu"
    if torch.version.hip:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def environment(device: torch.device) -> dict[str, str]:
    """Date, device, driver and library versions: the header of every result file."""
    on_gpu = device.type == "cuda"
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "device": describe_device(device),
        "arch": device_arch_name(device),
        "vendor": device_vendor(device),
        "driver": nvidia_driver_version() if on_gpu and not torch.version.hip else "n/a",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "n/a",
        "hip": torch.version.hip or "n/a",
        "triton": package_version("triton"),
        "python": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }


class ProgressBar:
    """A one-line progress bar on stderr (one line per step when stderr is not a terminal)."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width, self.done = total, width, 0
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        filled = self.width * self.done // max(self.total, 1)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}"
        end = "" if self.tty and self.done < self.total else "\n"
        sys.stderr.write(("\r\033[K" if self.tty else "") + line + end)
        sys.stderr.flush()


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


MARKDOWN_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, Row field, format)
    ("rel. err", "rel_err", ".1e"),
    ("us", "time_us", ".1f"),
    ("± us", "spread_us", ".1f"),
    ("% power-capped", "power_capped_pct", ".0f"),
    ("host us", "host_us", ".1f"),
    ("host us (no plan)", "host_unplanned_us", ".0f"),
    ("plan us", "plan_us", ".0f"),
    ("GB/s", "gbps", ".0f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("% copy BW", "pct_copy_bw", ".0f"),
    ("% matmul", "pct_matmul", ".0f"),
    ("floor us", "floor_us", ".1f"),
    ("% roofline", "pct_roofline", ".0f"),
    ("x vs torch", "x_vs_torch", ".2f"),
    ("x vs best", "x_vs_best", ".2f"),
    ("auto x vs best", "auto_x_vs_best", ".2f"),
)


def _sample_description(rows: Sequence[Row]) -> str:
    """What one timed sample was: reports written before the `calls` and power columns existed
    (rewritten with ``--from-json``) timed one round of the input sets per graph replay."""
    if any(r.calls_per_sample is not None for r in rows):
        return (
            "a sample is one replay of a graph of `calls` calls cycling through `sets` input sets; "
            "% power-capped: share of the timing during which the driver held the SM clock down for "
            "the power limit (NVML; - where not read)."
        )
    return "a sample is one replay of a graph running each of the `sets` input sets once (calls not recorded)."


def markdown_report(title: str, env: dict[str, str], ceilings: Ceilings, rows: Sequence[Row]) -> str:
    lines = [f"# {title}", ""]
    lines += [f"- {key}: {value}" for key, value in env.items()]
    lines.append(
        f"- ceilings measured in this run: copy {ceilings.copy_gbps:.4g} GB/s (read + write, "
        f"{ceilings.copy_bytes >> 20} MiB), {ceilings.matmul_dtype} matmul {ceilings.matmul_n}^3 "
        f"{ceilings.matmul_tflops:.4g} TFLOP/s"
    )
    lines += [
        "- us: median per call of CUDA-graph-replayed planned calls (mode column), combine included; "
        + _sample_description(rows)
        + " ± us: p75 - p25 of the samples. host us: wall time per call of back-to-back eager calls with "
        f"a plan ({HOST_CALLS} calls, or fewer once they take {HOST_BUDGET_S:g} s; no plan: the same "
        "without one); plan us: host time of plan_mla_decoding. Bytes and "
        "FLOPs count the tokens present. % roofline = floor / time, floor = max(bytes / copy BW, "
        "FLOPs / matmul rate). auto: the backend `auto` picks for the shape.",
        "",
        "| backend | B | S | H | Q | lengths | layout | status | mode | sets | calls | "
        + " | ".join(h for h, _, _ in MARKDOWN_COLUMNS)
        + " | auto |",
        "|" + "---|" * (12 + len(MARKDOWN_COLUMNS)),
    ]
    for r in rows:
        values = [_fmt(getattr(r, field), spec) for _, field, spec in MARKDOWN_COLUMNS]
        mode = (r.mode or "-").split(" (")[0]
        layout = r.layout + (f"/{r.page_size}" if r.page_size else "")
        fixed = [r.label, str(r.batch), str(r.seq_len), str(r.heads), str(r.q_len), r.lengths, layout, r.status]
        fixed += [mode, _fmt(r.input_sets, "d"), _fmt(r.calls_per_sample, "d")]
        lines.append("| " + " | ".join(fixed + values + [r.auto_backend or "-"]) + " |")
    notes = [
        f"- {r.label} {r.shape.label}: {r.status}: {r.note or r.mode}" for r in rows if r.note or "(" in (r.mode or "")
    ]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: Sequence[Row]) -> None:
    fields = [f.name for f in dataclasses.fields(Row)]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in rows)


def write_plot(path: Path, title: str, rows: Sequence[Row]) -> str:
    """Bar chart of % of roofline per shape, one bar per backend; returns what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    shapes = list(dict.fromkeys(r.shape for r in rows))
    backends = list(dict.fromkeys(r.label for r in rows))
    width = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(shapes) + 2), 4.5))
    for i, backend in enumerate(backends):
        by_shape = {r.shape: r for r in rows if r.label == backend}
        xs = [x + i * width for x in range(len(shapes))]
        heights = [(by_shape[s].pct_roofline or 0.0) if s in by_shape else 0.0 for s in shapes]
        ax.bar(xs, heights, width, label=backend)
        for x, s in zip(xs, shapes, strict=True):
            if s in by_shape and by_shape[s].status != "ok":  # no bar: say why at its foot
                ax.text(x, 0, by_shape[s].status, rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set_xticks([x + width * (len(backends) - 1) / 2 for x in range(len(shapes))])
    ax.set_xticklabels([s.label.replace(" ", "\n") for s in shapes], fontsize=8)
    ax.set_ylabel("% of roofline floor (higher is better)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def write_outputs(out_dir: Path, stem: str, report: dict, rows: Sequence[Row], title: str, plot: bool) -> list[str]:
    """JSON, CSV, markdown (and PNG); returns one message per file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("json", "csv", "md", "png")}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    write_csv(paths["csv"], rows)
    ceilings = Ceilings(**report["ceilings"])
    paths["md"].write_text(markdown_report(title, report["environment"], ceilings, rows))
    messages = [f"wrote {paths[ext]}" for ext in ("json", "csv", "md")]
    messages.append(write_plot(paths["png"], title, rows) if plot else "plot skipped (--no-plot)")
    return messages


# ---------------------------------------------------------------------------------------
# Command line.


def default_backends(device: torch.device) -> list[str]:
    """Every backend the registry says runs here (Triton on a CPU only under its interpreter)."""
    return demo_backends(device_vendor(device))


def parse_backends(text: str | None, device: torch.device) -> list[str]:
    if not text:
        return default_backends(device)
    names = [n.strip() for n in text.split(",") if n.strip()]
    valid = backend_names()
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"--backends: unknown backend(s) {', '.join(unknown)}; valid names are {', '.join(valid)}")
    return names


def parse_sweep(text: str | None) -> tuple[int | None, ...]:
    """``--sweep kv_len_per_split=64,128`` -> (None, 64, 128): the default plus each value."""
    if not text:
        return (None,)
    name, _, values = text.partition("=")
    if name != "kv_len_per_split" or not values:
        raise ValueError(f"--sweep: expected kv_len_per_split=N[,N...], got {text!r}")
    try:
        numbers = [int(v) for v in values.split(",") if v.strip()]
    except ValueError as exc:
        raise ValueError(f"--sweep: {exc}") from exc
    if not numbers or min(numbers) < 1:
        raise ValueError(f"--sweep: split lengths must be positive integers, got {values!r}")
    return (None, *numbers)


KV_DTYPE_CHOICES = ("fp8", *PACKED_KV_FORMATS)


def fp8_dtype(device: torch.device) -> torch.dtype:
    """The vendor's fp8 KV format: e4m3fnuz on AMD, e4m3fn elsewhere."""
    wanted = "float8_e4m3fnuz" if device_vendor(device) == "amd" else "float8_e4m3fn"
    for dtype in FP8_DTYPES:
        if str(dtype).endswith(wanted):
            return dtype
    raise ValueError(f"this torch build has no {wanted}")


def default_out_dir(suite: str) -> Path:
    """``$TILEGYM_RESULTS_DIR/<suite>``, else ``./tilegym-results/<suite>`` (never the package's source tree)."""
    root = os.environ.get("TILEGYM_RESULTS_DIR")
    return Path(root).expanduser() / suite if root else Path("tilegym-results") / suite


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tilegym bench", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="quick", help="named list of shapes")
    parser.add_argument("--backends", help="comma-separated backends (default: every available one)")
    parser.add_argument(
        "--dtype", choices=("bf16", "fp16"), help="dtype of q and the output (default: bf16 on a GPU, fp16 on a CPU)"
    )
    parser.add_argument(
        "--kv-dtype",
        choices=KV_DTYPE_CHOICES,
        help="quantised KV cache: fp8 per tensor, fp8_ds_mla (656-byte tokens), mxfp4 (e2m1 latent, bf16 rope); "
        "default: the --dtype",
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="dense", help="cache layout (default: dense rows)")
    parser.add_argument("--page-size", type=int, default=64, help="tokens per page with --layout paged/ragged")
    parser.add_argument("--sweep", help="extra rows per backend: kv_len_per_split=N[,N...]")
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="where results go (default: $TILEGYM_RESULTS_DIR/<suite> or ./tilegym-results/<suite>)",
    )
    parser.add_argument("--repeat", type=int, help="timed samples per row (default 50 on a GPU, 3 on a CPU)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    parser.add_argument(
        "--from-json", type=Path, help="measure nothing: rewrite CSV, markdown and PNG beside this earlier JSON report"
    )
    return parser


def auto_choice(shape_rows: list[Row], data: ShapeData) -> str | None:
    """The backend ``auto`` picks for this shape's inputs (None when nothing can run them)."""
    from tilegym.backend import select

    step = data.sets[0]
    try:
        call = MLA_DECODING.validate(step.q, step.qpe, step.kv, step.kpe, **op_kwargs(data, step, None))
        return select(OP, call, "auto").backend
    except Exception:  # noqa: BLE001 - the column says "-" when nothing can run
        return None


def run_suite(
    shapes: Sequence[Shape],
    backends: Sequence[str],
    cfg: BenchConfig,
    after_shape: Callable[[list[Row]], None] | None = None,
) -> list[Row]:
    """Every backend (and split) on every shape, same inputs per shape, with a progress bar.

    ``after_shape(rows so far)`` runs after each shape, so a run cut short keeps its results.
    """
    progress = ProgressBar(len(shapes) * len(backends) * len(cfg.splits))
    rows: list[Row] = []
    for shape in shapes:
        try:
            data, problem = make_shape_data(shape, cfg), ""
        except Exception as exc:  # e.g. out of memory: report it on every backend's row, go on
            data, problem = None, f"making inputs failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        shape_rows = []
        for backend in backends:
            for split in cfg.splits:
                if data is not None:
                    row = bench_backend(backend, shape, data, cfg, split)
                else:
                    row = new_row(backend, shape, cfg, split, "error", problem)
                shape_rows.append(row)
                timed = f"{row.time_us:.1f} us" if row.time_us is not None else row.note[:60]
                progress.step(f"{row.label} {shape.label}: {row.status} {timed}")
        choice = auto_choice(shape_rows, data) if data is not None else None
        for row in shape_rows:
            row.auto_backend = choice
        rows.extend(shape_rows)
        del data
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
        add_ratios(rows)
        if after_shape is not None:
            after_shape(rows)
    return rows


def rewrite_from_json(path: Path, plot: bool) -> int:
    """Regenerate a report's other files from its JSON (e.g. plot on a machine with matplotlib)."""
    report = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(Row)}
    rows = [Row(**{k: v for k, v in r.items() if k in fields}) for r in report["rows"]]
    title = report["title"]
    for message in write_outputs(path.parent, path.stem, report, rows, title, plot=plot):
        print(message, file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run a suite; exit code 1 when any backend gave a wrong result or raised, 2 on bad options."""
    args = build_parser().parse_args(argv)
    if args.from_json:
        return rewrite_from_json(args.from_json, plot=not args.no_plot)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cpu":
        # No GPU: Triton runs in its interpreter (read when its kernels are first defined).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    try:
        backends = parse_backends(args.backends, device)
        packed = args.kv_dtype if args.kv_dtype in PACKED_KV_FORMATS else None
        kv_dtype = fp8_dtype(device) if args.kv_dtype == "fp8" else torch.uint8 if packed else dtype
        if packed == "fp8_ds_mla" and dtype != torch.bfloat16:
            raise ValueError("--kv-dtype fp8_ds_mla stores its rope in bf16: use --dtype bf16")
        splits = parse_sweep(args.sweep)
        if args.page_size < 1 or args.page_size & (args.page_size - 1):
            raise ValueError(f"--page-size must be a power of two, got {args.page_size}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    on_gpu = device.type == "cuda"
    repeat = args.repeat or (50 if on_gpu else 3)
    out_dir = args.out_dir or default_out_dir(args.suite)
    print(f"results go to {out_dir.resolve()}", file=sys.stderr)
    print(f"measuring ceilings on {describe_device(device)} ...", file=sys.stderr)
    ceilings = measure_ceilings(device)
    cfg = BenchConfig(
        device,
        dtype,
        kv_dtype,
        warmup=5 if on_gpu else 1,
        repeat=repeat,
        ceilings=ceilings,
        layout=args.layout,
        page_size=args.page_size,
        splits=splits,
        kv_cache_format=packed,
    )
    env = environment(device)
    kv_tag = "" if kv_dtype == dtype else f"-kv{cfg.kv_format}"
    layout_tag = "" if args.layout == "dense" else f"-{args.layout}{args.page_size}"
    stem = f"{OP}_{args.suite}_{args.dtype}{kv_tag}{layout_tag}"
    title = f"{OP}, suite {args.suite}, {args.dtype}{kv_tag}{layout_tag}, {env['device']}"

    def save(rows: list[Row], plot: bool = False) -> list[str]:
        report = {
            "suite": args.suite,
            "title": title,
            "layout": args.layout,
            "page_size": args.page_size if args.layout != "dense" else None,
            "environment": env,
            "ceilings": dataclasses.asdict(ceilings),
            "tolerances": {DTYPE_SHORT_NAMES[d]: t for d, t in REL_L2_TOLERANCE.items()},
            "rows": [dataclasses.asdict(r) for r in rows],
        }
        return write_outputs(out_dir, stem, report, rows, title, plot=plot)

    rows = run_suite(SUITES[args.suite], backends, cfg, after_shape=save)
    for message in save(rows, plot=not args.no_plot):
        print(message, file=sys.stderr)
    print(markdown_report(title, env, ceilings, rows))
    bad = [r for r in rows if r.status in ("FAILED", "error")]
    return 1 if bad else 0
