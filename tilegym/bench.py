"""``python -m tilegym bench``: every available backend of ``mla_decoding_split_kv``, side by side.

One run measures the machine's ceilings (device-to-device copy bandwidth, bf16 matmul
rate), then for each shape of a suite and each backend: checks the output against the
float64 oracle on fresh random inputs, times it (CUDA graph replay or CUDA events,
median; rotating input sets when a set would fit in L2), and reports microseconds, GB/s,
TFLOP/s, the share of each ceiling and of the roofline floor, and the speed ratios
between backends. Writes JSON, CSV, a markdown table and a PNG plot.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tilegym.backend import BACKENDS, device_vendor, implementations
from tilegym.cli import demo_backends, describe_device
from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.contract import validate_mla_decoding
from tilegym.testing import REL_L2_TOLERANCE, MLAInputs, make_mla_inputs, mla_decode_float64, relative_error
from tilegym.timing import time_calls
from tilegym.utils import DTYPE_SHORT_NAMES, FP8_DTYPES, cdiv

OP = "mla_decoding_split_kv"
HEAD_DIM, ROPE_DIM = 512, 64  # DeepSeek-V2/V3 latent and rope widths

# Backends whose fp8-KV path also quantises the query to fp8 (aiter's a8w8 kernels; see
# tilegym/ops/aiter): e4m3 rounding of q alone gives ~3e-2 (measured under the emulation).
FP8_QUERY_BACKENDS = ("aiter",)
FP8_QUERY_TOLERANCE = 5e-2

ROTATE_BYTES = 256 << 20  # rotate input sets until together they exceed this (H200 L2: 60 MB)
MAX_INPUT_SETS = 64
CHECK_ROWS = 4  # batch rows compared with the float64 oracle (rows are independent)


@dataclass(frozen=True)
class Shape:
    """One decode step: ``batch`` requests of ``seq_len`` cached tokens, ``heads`` query heads."""

    batch: int
    seq_len: int
    heads: int

    @property
    def label(self) -> str:
        return f"B{self.batch} S{self.seq_len} H{self.heads}"


def _shapes(*bsh: tuple[int, int, int]) -> tuple[Shape, ...]:
    return tuple(Shape(b, s, h) for b, s, h in bsh)


SUITES: dict[str, tuple[Shape, ...]] = {
    "deepseek": _shapes(
        (64, 4096, 16),
        (128, 8192, 16),
        (32, 8192, 16),
        (1, 32768, 16),
        (64, 4096, 128),
        (128, 8192, 128),
        (64, 4096, 64),
        (4, 1024, 16),
    ),
    "amd-mixed-mla": _shapes(*((b, s, 16) for b in (4, 32, 64, 256) for s in (1024, 8192))),
    "quick": _shapes((64, 4096, 16), (64, 4096, 128), (4, 1024, 16)),
    "tiny": _shapes((2, 128, 16)),  # CPU smoke run: Triton's interpreter included
}


# ---------------------------------------------------------------------------------------
# The formulas (docs/performance.md): the one place bytes, FLOPs and the floor are counted.


def traffic_bytes(shape: Shape, kv_elsize: int, q_elsize: int = 2) -> int:
    """Fewest bytes moved: KV cache read once, q/qpe read once, output written once."""
    b, s, h = shape.batch, shape.seq_len, shape.heads
    return b * s * (HEAD_DIM + ROPE_DIM) * kv_elsize + b * h * (HEAD_DIM + ROPE_DIM) * q_elsize + b * h * HEAD_DIM * 2


def flop_count(shape: Shape) -> int:
    """FLOPs by the FlashMLA convention: QK^T over D+P plus PV over D, softmax not counted."""
    return 2 * shape.batch * shape.heads * shape.seq_len * (HEAD_DIM + ROPE_DIM + HEAD_DIM)


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
    kv_dtype: torch.dtype
    warmup: int
    repeat: int
    ceilings: Ceilings


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
    rel_err: float | None = None
    tolerance: float | None = None
    mode: str | None = None
    input_sets: int | None = None
    time_us: float | None = None
    spread_us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_copy_bw: float | None = None
    pct_matmul: float | None = None
    floor_us: float | None = None
    pct_roofline: float | None = None
    x_vs_torch: float | None = None
    x_vs_best: float | None = None
    note: str = ""

    @property
    def shape(self) -> Shape:
        return Shape(self.batch, self.seq_len, self.heads)


@dataclass
class ShapeData:
    """Rotating input sets for one shape (set 0 is checked) and the oracle of its sampled rows."""

    sets: list[MLAInputs]
    outs: list[torch.Tensor]
    rows: torch.Tensor  # batch rows compared with the oracle
    expected: torch.Tensor  # float64 oracle output of those rows


def working_set_bytes(shape: Shape, cfg: BenchConfig) -> int:
    return traffic_bytes(shape, cfg.kv_dtype.itemsize, cfg.dtype.itemsize)


def input_set_count(shape: Shape, cfg: BenchConfig) -> int:
    """Enough input sets that cycling through them defeats the L2 cache (1 on a CPU)."""
    if cfg.device.type != "cuda":
        return 1
    return max(1, min(MAX_INPUT_SETS, cdiv(ROTATE_BYTES, working_set_bytes(shape, cfg))))


def checked_rows(batch: int) -> torch.Tensor:
    """First, last and evenly spread rows: catches per-row indexing bugs at any batch size."""
    picks = sorted({round(i * (batch - 1) / (CHECK_ROWS - 1)) for i in range(CHECK_ROWS)})
    return torch.tensor(picks, dtype=torch.long)


def make_shape_data(shape: Shape, cfg: BenchConfig) -> ShapeData:
    kv_dtype = None if cfg.kv_dtype == cfg.dtype else cfg.kv_dtype

    def one_set() -> MLAInputs:
        args = (shape.batch, shape.heads, shape.seq_len, HEAD_DIM, ROPE_DIM)
        return make_mla_inputs(*args, dtype=cfg.dtype, kv_dtype=kv_dtype, device=cfg.device)

    sets = [one_set() for _ in range(input_set_count(shape, cfg))]
    outs = [torch.empty(shape.batch, shape.heads, HEAD_DIM, dtype=cfg.dtype, device=cfg.device) for _ in sets]
    rows = checked_rows(shape.batch)
    first = sets[0]
    picked = [t.index_select(0, rows.to(cfg.device)) for t in (first.q, first.qpe, first.kv, first.kpe)]
    expected, _ = mla_decode_float64(*picked, kv_scale=first.kv_scale)
    return ShapeData(sets, outs, rows, expected)


def op_call(backend: str, inputs: MLAInputs, out: torch.Tensor) -> Callable[[], object]:
    def run() -> object:
        return mla_decoding_split_kv(
            inputs.q, inputs.qpe, inputs.kv, inputs.kpe, kv_scale=inputs.kv_scale, out=out, backend=backend
        )

    return run


def interpreter_limitations(backend: str, dtype: torch.dtype, device: torch.device) -> list[str]:
    """Known-wrong cases of Triton's CPU interpreter (docs: bf16 ``tl.dot`` multiplies raw bits)."""
    interpreted = backend == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    if interpreted and dtype == torch.bfloat16:
        return ["Triton's interpreter computes bf16 tl.dot wrongly (a known upstream limitation); use fp16 on a CPU"]
    return []


def unsupported_reasons(backend: str, inputs: MLAInputs) -> list[str]:
    """Why ``backend`` cannot run these inputs: the registry's reasons, then the interpreter's."""
    impl = implementations(OP).get(backend)
    if impl is None:
        return ["no implementation of this op"]
    call = validate_mla_decoding(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, kv_scale=inputs.kv_scale)
    return impl.reasons(call) or interpreter_limitations(backend, call.q.dtype, call.device)


def check_result(backend: str, data: ShapeData, tolerance: float) -> tuple[float, str]:
    """Run once on a NaN-poisoned output; return (rel. error of the sampled rows, problem or "")."""
    out = data.outs[0].fill_(float("nan"))
    op_call(backend, data.sets[0], out)()
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)
    err = relative_error(out.index_select(0, data.rows.to(out.device)), data.expected)
    if not bool(torch.isfinite(out).all()):
        return err, "output has NaN/Inf (unwritten or overflowed elements)"
    if not err <= tolerance:
        return err, f"rel. L2 error {err:.2e} > tolerance {tolerance:.0e}"
    return err, ""


def fill_metrics(row: Row, ceilings: Ceilings, kv_elsize: int, q_elsize: int) -> None:
    nbytes, flops = traffic_bytes(row.shape, kv_elsize, q_elsize), flop_count(row.shape)
    row.gbps = nbytes / (row.time_us * 1e3)
    row.tflops = flops / (row.time_us * 1e6)
    row.pct_copy_bw = 100 * row.gbps / ceilings.copy_gbps
    row.pct_matmul = 100 * row.tflops / ceilings.matmul_tflops
    row.floor_us = ceilings.floor_us(nbytes, flops)
    row.pct_roofline = 100 * row.floor_us / row.time_us


def error_tolerance(backend: str, dtype: torch.dtype, kv_dtype: torch.dtype) -> float:
    """The relative L2 error vs float64 a correct ``backend`` stays under for these dtypes."""
    if kv_dtype in FP8_DTYPES and backend in FP8_QUERY_BACKENDS:
        return FP8_QUERY_TOLERANCE
    return REL_L2_TOLERANCE[dtype]


def new_row(backend: str, shape: Shape, cfg: BenchConfig, status: str = "", note: str = "") -> Row:
    dtypes = DTYPE_SHORT_NAMES[cfg.dtype], DTYPE_SHORT_NAMES[cfg.kv_dtype]
    tolerance = error_tolerance(backend, cfg.dtype, cfg.kv_dtype)
    return Row(backend, *dataclasses.astuple(shape), *dtypes, status, tolerance=tolerance, note=note)


def error_row(backend: str, shape: Shape, cfg: BenchConfig, note: str) -> Row:
    return new_row(backend, shape, cfg, "error", note)


def bench_backend(backend: str, shape: Shape, data: ShapeData, cfg: BenchConfig) -> Row:
    """Check, then time, one backend on one shape; never raises."""
    row = new_row(backend, shape, cfg)
    try:
        reasons = unsupported_reasons(backend, data.sets[0])
        if reasons:
            row.status, row.note = "skipped", "; ".join(reasons)
            return row
        err, problem = check_result(backend, data, row.tolerance)
        row.rel_err = err if math.isfinite(err) else None  # JSON has no NaN; the note says why
        if problem:
            row.status, row.note = "FAILED", problem
            return row
        calls = [op_call(backend, s, o) for s, o in zip(data.sets, data.outs, strict=True)]
        # Graph replay at every size, as serving engines run decode: eager timing also counts the
        # Python dispatch before each sample's first launch (Triton 128x8192x16: 328 us eager vs
        # 289 us replayed, two runs on the H200).
        timing = time_calls(calls, cfg.device, warmup=cfg.warmup, repeat=cfg.repeat, use_graph=True)
    except Exception as exc:  # one backend's failure must not stop the others
        row.status, row.note = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return row
    row.status, row.mode, row.input_sets = "ok", timing.mode, len(calls)
    row.time_us, row.spread_us = timing.median_us, timing.spread_us
    fill_metrics(row, cfg.ceilings, cfg.kv_dtype.itemsize, cfg.dtype.itemsize)
    return row


def add_ratios(rows: Sequence[Row]) -> None:
    """Per shape: speed relative to the torch backend (x faster) and to the fastest backend."""
    for shape in {r.shape for r in rows}:
        timed = {r.backend: r.time_us for r in rows if r.shape == shape and r.status == "ok"}
        if not timed:
            continue
        best = min(timed.values())
        for r in rows:
            if r.shape == shape and r.status == "ok":
                r.x_vs_best = best / r.time_us
                r.x_vs_torch = timed["torch"] / r.time_us if "torch" in timed else None


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


def environment(device: torch.device) -> dict[str, str]:
    """Date, device, driver and library versions: the header of every result file."""
    on_gpu = device.type == "cuda"
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "device": describe_device(device),
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
    ("GB/s", "gbps", ".0f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("% copy BW", "pct_copy_bw", ".0f"),
    ("% matmul", "pct_matmul", ".0f"),
    ("floor us", "floor_us", ".1f"),
    ("% roofline", "pct_roofline", ".0f"),
    ("x vs torch", "x_vs_torch", ".2f"),
    ("x vs best", "x_vs_best", ".2f"),
)


def markdown_report(title: str, env: dict[str, str], ceilings: Ceilings, rows: Sequence[Row]) -> str:
    lines = [f"# {title}", ""]
    lines += [f"- {key}: {value}" for key, value in env.items()]
    lines.append(
        f"- ceilings measured in this run: copy {ceilings.copy_gbps:.4g} GB/s (read + write, "
        f"{ceilings.copy_bytes >> 20} MiB), {ceilings.matmul_dtype} matmul {ceilings.matmul_n}^3 "
        f"{ceilings.matmul_tflops:.4g} TFLOP/s"
    )
    lines += [
        "- us: median per call (mode column); ± us: p75 - p25 of the samples. "
        "% roofline = floor / time, floor = max(bytes / copy BW, FLOPs / matmul rate).",
        "",
        "| backend | B | S | H | status | mode | sets | " + " | ".join(h for h, _, _ in MARKDOWN_COLUMNS) + " |",
        "|" + "---|" * (7 + len(MARKDOWN_COLUMNS)),
    ]
    for r in rows:
        values = [_fmt(getattr(r, field), spec) for _, field, spec in MARKDOWN_COLUMNS]
        mode = (r.mode or "-").split(" (")[0]
        fixed = [r.backend, str(r.batch), str(r.seq_len), str(r.heads), r.status, mode, _fmt(r.input_sets, "d")]
        lines.append("| " + " | ".join(fixed + values) + " |")
    notes = [
        f"- {r.backend} {r.shape.label}: {r.status}: {r.note or r.mode}"
        for r in rows
        if r.note or "(" in (r.mode or "")
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
    backends = list(dict.fromkeys(r.backend for r in rows))
    width = 0.8 / max(len(backends), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(shapes) + 2), 4.5))
    for i, backend in enumerate(backends):
        by_shape = {r.shape: r for r in rows if r.backend == backend}
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
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(f"--backends: unknown backend(s) {', '.join(unknown)}; valid names are {', '.join(BACKENDS)}")
    return names


def fp8_dtype(device: torch.device) -> torch.dtype:
    """The vendor's fp8 KV format: e4m3fnuz on AMD, e4m3fn elsewhere."""
    wanted = "float8_e4m3fnuz" if device_vendor(device) == "amd" else "float8_e4m3fn"
    for dtype in FP8_DTYPES:
        if str(dtype).endswith(wanted):
            return dtype
    raise ValueError(f"this torch build has no {wanted}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tilegym bench", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="quick", help="named list of (B, S, H) shapes")
    parser.add_argument("--backends", help="comma-separated backends (default: every available one)")
    parser.add_argument(
        "--dtype", choices=("bf16", "fp16"), help="dtype of q and the output (default: bf16 on a GPU, fp16 on a CPU)"
    )
    parser.add_argument("--kv-dtype", choices=("fp8",), help="quantised KV cache (default: the --dtype)")
    parser.add_argument("--out-dir", type=Path, help="default: benchmarks/results/<suite>")
    parser.add_argument("--repeat", type=int, help="timed samples per row (default 50 on a GPU, 3 on a CPU)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    parser.add_argument(
        "--from-json", type=Path, help="measure nothing: rewrite CSV, markdown and PNG beside this earlier JSON report"
    )
    return parser


def run_suite(
    shapes: Sequence[Shape],
    backends: Sequence[str],
    cfg: BenchConfig,
    after_shape: Callable[[list[Row]], None] | None = None,
) -> list[Row]:
    """Every backend on every shape, same inputs per shape, with a progress bar.

    ``after_shape(rows so far)`` runs after each shape, so a run cut short keeps its results.
    """
    progress = ProgressBar(len(shapes) * len(backends))
    rows: list[Row] = []
    for shape in shapes:
        try:
            data, problem = make_shape_data(shape, cfg), ""
        except Exception as exc:  # e.g. out of memory: report it on every backend's row, go on
            data, problem = None, f"making inputs failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        for backend in backends:
            row = bench_backend(backend, shape, data, cfg) if data else error_row(backend, shape, cfg, problem)
            rows.append(row)
            timed = f"{row.time_us:.1f} us" if row.time_us is not None else row.note[:60]
            progress.step(f"{backend} {shape.label}: {row.status} {timed}")
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
    rows = [Row(**r) for r in report["rows"]]
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
        # No GPU: Triton runs in its interpreter (read at the kernels' first use), whose bf16
        # dots are wrong, hence fp16 by default there.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    try:
        backends = parse_backends(args.backends, device)
        kv_dtype = fp8_dtype(device) if args.kv_dtype == "fp8" else dtype
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    on_gpu = device.type == "cuda"
    repeat = args.repeat or (50 if on_gpu else 3)
    print(f"measuring ceilings on {describe_device(device)} ...", file=sys.stderr)
    ceilings = measure_ceilings(device)
    cfg = BenchConfig(device, dtype, kv_dtype, warmup=5 if on_gpu else 1, repeat=repeat, ceilings=ceilings)
    env = environment(device)
    kv_tag = "" if kv_dtype == dtype else f"-kv{DTYPE_SHORT_NAMES[kv_dtype]}"
    stem = f"{OP}_{args.suite}_{args.dtype}{kv_tag}"
    title = f"{OP}, suite {args.suite}, {args.dtype}{kv_tag}, {env['device']}"
    out_dir = args.out_dir or Path("benchmarks") / "results" / args.suite

    def save(rows: list[Row], plot: bool = False) -> list[str]:
        report = {
            "suite": args.suite,
            "title": title,
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
