"""Compile the Triton split kernel for sm_90a without a GPU; report what decides its speed (a development tool).

    python benchmarks/inspect_triton_kernel.py --format fp8 --configs default,n32w4s3,n64w8s2 \\
        [--heads 16] [--q-len 1] [--layout dense|paged|ragged] [--page-size 64] \\
        [--batch 64 --seq-len 4096] [--dump DIR]

Builds the plan a call of that kind gets (small CPU inputs: only dtypes, layout and options
matter; ``default`` is the config NVIDIA GPUs get at ``--batch`` x ``--seq-len``), compiles its
split kernel for ``cuda:90`` with the constexprs and argument types the plan launches it with,
and prints per config: registers and spill bytes (Triton's bundled ptxas), shared memory, and
what the KV loop does with each tensor load: staged in shared memory by ``cp.async``
(pipelined) or waited for in registers (synchronous). A KV tile loaded synchronously costs a
memory latency every step; that is how session 12 found the fp8 path at 25% of copy bandwidth.
It also counts the kernel's 8-bit shared-memory loads: an fp8 dot operand gathered byte by byte
(session 13 found 128 per thread per step for V, and removed them by reading byte pairs).
``--dump DIR`` writes each config's TTGIR and PTX.

The answer depends on the Triton version: the H200 machine runs Triton 3.6; run this under the
same version to predict it (a side virtual environment with ``triton==3.6.0`` and this repository
on ``PYTHONPATH`` will do).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.triton.mla_decoding_split_kv import (
    KernelConfig,
    TritonDecodePlan,
    _mla_split_kernel,
    default_config,
    fp8_pairs_mode,
)
from tilegym.testing import cache_kwargs, make_mla_inputs, pack_cache

TARGET = GPUTarget("cuda", 90, 32)
TRITON_TYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.float8_e4m3fn: "fp8e4nv",
}


def planned_call(fmt: str, heads: int, q_len: int, layout: str, page_size: int):
    """A validated call of this kind on small CPU tensors (its plan fixes what the kernel is compiled for)."""
    kv_dtype = torch.float8_e4m3fn if fmt == "fp8" else None
    x = make_mla_inputs(2, heads, 2 * page_size, q_len=q_len, kv_dtype=kv_dtype, kv_lens=[2 * page_size, 3])
    cache, _ = cache_kwargs(x, fmt, layout, page_size)
    return validate_mla_decoding(x.q, x.qpe, **cache)


def config_call(fmt: str, heads: int, q_len: int, batch: int, seq_len: int):
    """A dense call of ``batch`` rows of ``seq_len`` tokens whose cache is one row repeated (a
    stride-0 view, so no memory): what ``default_config`` reads to pick the tile sizes."""
    kv_dtype = torch.float8_e4m3fn if fmt == "fp8" else None
    x = make_mla_inputs(1, heads, seq_len, q_len=q_len, kv_dtype=kv_dtype)
    cache = {"kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale}
    if fmt in ("fp8_ds_mla", "mxfp4"):
        cache = pack_cache(x, fmt).op_kwargs()

    def rows(v: object) -> object:  # per-row tensors [1, ...] -> [batch, ...]; scalars and names stay
        return v.expand(batch, *v.shape[1:]) if isinstance(v, torch.Tensor) and v.dim() >= 2 else v

    return validate_mla_decoding(rows(x.q), rows(x.qpe), **{k: rows(v) for k, v in cache.items()})


def signature(plan: TritonDecodePlan, call) -> tuple[dict, dict, dict]:
    """(Triton signature, constexprs, specialisation attributes) of the plan's split launch."""
    launcher = plan.split_launcher
    lse = torch.empty(1, dtype=torch.float32)
    scale = call.kv_scale if call.kv_scale is not None else lse
    args = plan.split_arguments(call.q, call.qpe, call.kv, call.kpe, scale, call.out, lse)
    constexprs = {  # as on an NVIDIA GPU: never the interpreter's float32 dots or its portable fp8 widening
        **launcher.constexprs,
        "INTERPRETED": False,
        "FP8_PAIRS": fp8_pairs_mode(call, plan.config, call.kv.data_ptr(), vendor="nvidia"),
    }
    runtime = [n for n in _mla_split_kernel.arg_names if n not in constexprs]
    sig, attrs = {n: "constexpr" for n in constexprs}, {}
    for name, value in zip(runtime, args, strict=True):
        index = _mla_split_kernel.arg_names.index(name)
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + TRITON_TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]  # the plan's fast path requires 16-byte alignment
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def kv_loop(ttgir: str) -> str:
    """The body of the innermost loop that multiplies (the KV loop; wgmma or mma.sync)."""
    lines = ttgir.splitlines()
    best = ""
    for i, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        depth, body = 0, []
        for inner in lines[i:]:
            depth += inner.count("{") - inner.count("}")
            body.append(inner)
            if depth <= 0:
                break
        text = "\n".join(body)
        if ("tt.dot" in text or "warp_group_dot" in text) and (not best or len(text) < len(best)):
            best = text
    return best


def tensor_loads(loop: str) -> tuple[list[str], list[str]]:
    """(tiles copied to shared memory by cp.async, tensors loaded synchronously) in the loop."""
    tile = r"tensor<(\d+(?:x\d+)*)x!tt\.ptr<(\w+)>"  # 1-D loads (per-token scales) too
    copied = re.findall(r"async_copy_global_to_local .*?: " + tile, loop)
    waited = re.findall(r"= tt\.load .*?: " + tile, loop)
    return [f"{shape} {dtype}" for shape, dtype in copied], [f"{shape} {dtype}" for shape, dtype in waited]


@dataclass
class KernelReport:
    """What one compiled split kernel looks like on sm_90a."""

    config: KernelConfig
    registers: str  # as ptxas reports them ("?" when it does not say)
    spill_bytes: str
    shared_kb: int
    copied: list[str]  # KV-loop tiles staged in shared memory by cp.async (pipelined)
    waited: list[str]  # KV-loop tensors loaded synchronously
    byte_loads: int  # 8-bit shared-memory loads in the PTX (a byte-wise operand gather)
    ttgir: str
    ptx: str

    def json(self) -> str:
        fields = ("registers", "spill_bytes", "shared_kb", "copied", "waited", "byte_loads")
        return json.dumps({"config": self.config.name, **{k: getattr(self, k) for k in fields}})

    def row(self) -> str:
        return (
            f"| {self.config.name} | {self.registers} | {self.spill_bytes} | {self.shared_kb} KB | "
            f"{', '.join(self.copied) or '-'} | {', '.join(self.waited) or '-'} | {self.byte_loads} |"
        )


def byte_shared_loads(ptx: str) -> int:
    """How many 8-bit shared-memory loads the PTX has (``ld.shared.b8`` and its kin)."""
    return len(re.findall(r"\bld\.shared(?:\.v\d)?\.[bsu]8\b", ptx))


def ptxas_usage(ptx: str) -> tuple[str, str]:
    """(registers, spill-store bytes) that Triton's bundled ptxas reports for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        report = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(source), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return (registers.group(1) if registers else "?"), (spills.group(1) if spills else "?")


def compile_report(plan: TritonDecodePlan, call) -> KernelReport:
    """Compile ``plan``'s split kernel for sm_90a as the plan would launch it, and read the result."""
    sig, constexprs, attrs = signature(plan, call)
    launcher = plan.split_launcher
    compiled = triton.compile(
        ASTSource(_mla_split_kernel, sig, constexprs, attrs),
        target=TARGET,
        options={"num_warps": launcher.num_warps, "num_stages": launcher.num_stages},
    )
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    registers, spills = ptxas_usage(ptx)
    copied, waited = tensor_loads(kv_loop(ttgir))
    shared_kb = compiled.metadata.shared // 1024
    return KernelReport(plan.config, registers, spills, shared_kb, copied, waited, byte_shared_loads(ptx), ttgir, ptx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="fp8", choices=("bf16", "fp8", "fp8_ds_mla", "mxfp4"))
    parser.add_argument("--configs", default="default", help="default and/or names like n32w4s3f")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--q-len", type=int, default=1)
    parser.add_argument("--layout", default="dense", choices=("dense", "paged", "ragged"))
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="with --seq-len: the shape whose default config is used")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--dump", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object per config instead of the table")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: under the interpreter Triton compiles nothing")
    call = planned_call(args.format, args.heads, args.q_len, args.layout, args.page_size)
    shape = config_call(args.format, args.heads, args.q_len, args.batch, args.seq_len)
    gpu_default = default_config(shape, vendor="nvidia")
    if not args.json:
        print(
            f"Triton {triton.__version__}, sm_90a, {args.format}, H = {args.heads}, Q = {args.q_len}, {args.layout}; "
            f"default = NVIDIA's config for {args.batch} x {args.seq_len}: {gpu_default.name}"
        )
        print(
            "| config | registers | spill bytes | shared memory | KV loop: cp.async to shared | KV loop: synchronous "
            "| 8-bit shared loads |"
        )
        print("|---|---|---|---|---|---|---|")
    for name in args.configs.split(","):
        config = gpu_default if name == "default" else KernelConfig.parse(name, gpu_default.block_h)
        report = compile_report(TritonDecodePlan(call, config), call)
        print(report.json() if args.json else report.row(), flush=True)
        if args.dump is not None:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{config.name}.ttgir").write_text(report.ttgir)
            (args.dump / f"{config.name}.ptx").write_text(report.ptx)


if __name__ == "__main__":
    main()
