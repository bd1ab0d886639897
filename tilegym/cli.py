"""The ``info`` and ``demo`` commands of ``python -m tilegym``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch

from tilegym.backend import backend_names, backend_status, device_vendor, registered_ops
from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.mla_decoding import MLA_DECODING
from tilegym.testing import make_mla_inputs, relative_error
from tilegym.timing import time_call_us

# Representative DeepSeek-V3 decode step with tensor parallelism 8: 16 heads per GPU.
GPU_DEMO_SHAPE = MLA_DECODING.demo_shapes["cuda"]
CPU_DEMO_SHAPE = MLA_DECODING.demo_shapes["cpu"]


# What `info` says on a CPU when Triton's interpreter is off.
TRITON_INTERPRETER_NOTE = """\
note: on a CPU, the triton backend runs only under Triton's interpreter (TRITON_INTERPRET=1),
  which executes the kernels on CPU tensors. `make demo` and `python -m tilegym demo` set
  TRITON_INTERPRET=1 themselves. Anywhere else, set it in the environment before the first
  Triton import (e.g. `TRITON_INTERPRET=1 python -m tilegym info`); otherwise Triton reports
  "0 active drivers". Details: docs/triton_interpreter.md."""


def default_device() -> torch.device:
    """The first CUDA (or ROCm) GPU when torch sees one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def describe_device(device: torch.device) -> str:
    """A short human description: GPU name and SM/CU count, or "CPU"."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.multi_processor_count} SMs/CUs)"
    return "CPU"


def info() -> int:
    """Print vendor, device, and every op x backend with its availability."""
    device = default_device()
    vendor = device_vendor(device)
    print(f"torch {torch.__version__}; device {device}: {describe_device(device)}; vendor {vendor}")
    interpret = os.environ.get("TRITON_INTERPRET", "")
    print(f"TRITON_INTERPRET={interpret!r}")
    for op in registered_ops():
        print(f"\n{op}:")
        for backend, reasons in backend_status(op, vendor).items():
            print(f"  {backend:8s} {'available' if not reasons else 'unavailable: ' + '; '.join(reasons)}")
    if vendor == "cpu" and interpret != "1":
        print(f"\n{TRITON_INTERPRETER_NOTE}")
    return 0


def info_main(argv: Sequence[str] | None = None) -> int:
    """``python -m tilegym info``: parse the (no) options, then :func:`info`."""
    argparse.ArgumentParser(
        prog="python -m tilegym info",
        description="Show torch's device and vendor, and for every op and backend whether it can run "
        "here and, if not, why.",
    ).parse_args(argv)
    return info()


def demo_backends(vendor: str) -> list[str]:
    """Backends that can run mla_decoding_split_kv on this vendor's devices here."""
    status = backend_status(MLA_DECODING.name, vendor)
    return [b for b in backend_names() if not status[b]]


def demo(backends: Sequence[str] | None = None, device: torch.device | None = None) -> int:
    """Run mla_decoding_split_kv on ``backends`` (default: every available one) on ``device``.

    Prints the error against float64 and the time per call; returns 1 when any backend fails,
    mismatches, or was asked for and cannot run here.
    """
    device = default_device() if device is None else device
    vendor = device_vendor(device)
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ:
        # CPU tensors: run the Triton kernels in Triton's interpreter (read at their first use).
        os.environ["TRITON_INTERPRET"] = "1"
    available = demo_backends(vendor)
    chosen = available if backends is None else list(backends)
    shape = MLA_DECODING.demo_shapes[device.type]
    dtype = torch.bfloat16
    inputs = make_mla_inputs(**shape, device=device, dtype=dtype)
    expected, _ = MLA_DECODING.oracle(inputs.q, inputs.qpe, inputs.kv, inputs.kpe)
    print(f"mla_decoding_split_kv on {describe_device(device)}: {dtype}, D=512, P=64, {shape}")
    print(f"{'backend':10s} {'rel. L2 error':>14s} {'max abs error':>14s} {'us/call':>10s}  status")
    failures = 0
    status = backend_status(MLA_DECODING.name, vendor)
    for backend in chosen:
        if backend not in available:
            failures += 1
            print(f"{backend:10s} {'-':>14s} {'-':>14s} {'-':>10s}  UNAVAILABLE: {'; '.join(status[backend])}")
            continue
        try:
            out = mla_decoding_split_kv(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, backend=backend)
            err = relative_error(out, expected)
            max_abs = (out.double().cpu() - expected).abs().max().item()

            def run(backend: str = backend) -> object:
                return mla_decoding_split_kv(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, backend=backend)

            us = time_call_us(run, device, repeat=20 if device.type == "cuda" else 3)
        except Exception as exc:  # show every backend's outcome, keep going
            failures += 1
            print(f"{backend:10s} {'-':>14s} {'-':>14s} {'-':>10s}  FAILED: {type(exc).__name__}: {exc}")
            continue
        ok = err <= MLA_DECODING.tolerance(backend, dtype, dtype)
        failures += not ok
        print(f"{backend:10s} {err:14.2e} {max_abs:14.2e} {us:10.1f}  {'ok' if ok else 'MISMATCH'}")
    skipped = [b for b in backend_names() if b not in available and b not in chosen]
    if backends is None and skipped:
        print(f"not run here: {', '.join(skipped)} (see `python -m tilegym info`)")
    return 1 if failures else 0


def _backend_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    valid = backend_names()
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {', '.join(unknown) or repr(text)}; valid names are {', '.join(valid)}"
        )
    return names


def demo_main(argv: Sequence[str] | None = None) -> int:
    """``python -m tilegym demo [--backends LIST] [--device cpu|cuda]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tilegym demo",
        description="Run mla_decoding_split_kv once per backend on random inputs (GPU: bf16, "
        f"B/H/S = {GPU_DEMO_SHAPE['batch']}/{GPU_DEMO_SHAPE['heads']}/{GPU_DEMO_SHAPE['seq_len']}; "
        f"CPU: bf16, {CPU_DEMO_SHAPE['batch']}/{CPU_DEMO_SHAPE['heads']}/{CPU_DEMO_SHAPE['seq_len']}) "
        "and print each one's error against a float64 computation and its time per call. "
        "On a CPU it sets TRITON_INTERPRET=1 (unless already set) so the Triton kernels run in "
        "Triton's interpreter. Exit code 1 if any backend fails.",
    )
    parser.add_argument(
        "--backends",
        type=_backend_list,
        help=f"comma-separated backends to run, from {','.join(backend_names())} (default: every one available here)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where the inputs live (default: cuda when torch sees a GPU, else cpu)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA/ROCm GPU here")
    device = torch.device(args.device) if args.device else None
    return demo(args.backends, device)
