"""The ``info`` and ``demo`` commands of ``python -m tilegym``."""

from __future__ import annotations

import os

import torch

from tilegym.backend import BACKENDS, backend_status, device_vendor, registered_ops
from tilegym.ops import mla_decoding_split_kv
from tilegym.testing import REL_L2_TOLERANCE, make_mla_inputs, mla_decode_float64, relative_error
from tilegym.timing import time_call_us

# Representative DeepSeek-V3 decode step with tensor parallelism 8: 16 heads per GPU.
GPU_DEMO_SHAPE = {"batch": 32, "heads": 16, "seq_len": 4096}
CPU_DEMO_SHAPE = {"batch": 2, "heads": 16, "seq_len": 256}


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.multi_processor_count} SMs/CUs)"
    return "CPU"


def info() -> int:
    """Print vendor, device, and every op x backend with its availability."""
    device = default_device()
    vendor = device_vendor(device)
    print(f"torch {torch.__version__}; device {device}: {describe_device(device)}; vendor {vendor}")
    print(f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r}")
    for op in registered_ops():
        print(f"\n{op}:")
        for backend, reasons in backend_status(op, vendor).items():
            print(f"  {backend:8s} {'available' if not reasons else 'unavailable: ' + '; '.join(reasons)}")
    return 0


def demo_backends(vendor: str) -> list[str]:
    """Backends that can run mla_decoding_split_kv on this vendor's devices here."""
    status = backend_status("mla_decoding_split_kv", vendor)
    return [b for b in BACKENDS if not status[b]]


def demo() -> int:
    """Run mla_decoding_split_kv on every available backend; print error vs float64 and time."""
    device = default_device()
    vendor = device_vendor(device)
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ:
        # No GPU: run the Triton kernels in Triton's interpreter (read at their first use).
        os.environ["TRITON_INTERPRET"] = "1"
    shape = GPU_DEMO_SHAPE if device.type == "cuda" else CPU_DEMO_SHAPE
    # Triton's CPU interpreter computes bf16 dots wrongly (integer math on the bits): fp16 there.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    inputs = make_mla_inputs(**shape, device=device, dtype=dtype)
    expected, _ = mla_decode_float64(inputs.q, inputs.qpe, inputs.kv, inputs.kpe)
    print(f"mla_decoding_split_kv on {describe_device(device)}: {dtype}, D=512, P=64, {shape}")
    print(f"{'backend':10s} {'rel. L2 error':>14s} {'max abs error':>14s} {'us/call':>10s}  status")
    failures = 0
    for backend in demo_backends(vendor):
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
        ok = err < REL_L2_TOLERANCE[dtype]
        failures += not ok
        print(f"{backend:10s} {err:14.2e} {max_abs:14.2e} {us:10.1f}  {'ok' if ok else 'MISMATCH'}")
    skipped = [b for b in BACKENDS if b not in demo_backends(vendor)]
    if skipped:
        print(f"not run here: {', '.join(skipped)} (see `python -m tilegym info`)")
    return 1 if failures else 0
