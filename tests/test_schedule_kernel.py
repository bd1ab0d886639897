"""The one-launch schedule kernel gives exactly the torch ops' schedule (Triton's interpreter on CPU;
on the GPU when there is one, where ``SplitSchedule.refresh`` uses it)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.schedule import ScheduleShape, SplitSchedule, most_blocks
from tilegym.testing import make_mla_inputs, to_pages

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("lens", "cum_blocks", "piece_bounds", "piece_rows", "row_pieces")


def kernel_tensors(schedule: SplitSchedule) -> dict[str, torch.Tensor]:
    """The kernel's schedule, written into fresh tensors filled with -7 first."""
    out = {name: torch.full_like(getattr(schedule, name), -7) for name in NAMES}
    schedule.kernel_launch(**out)()
    return out


def assert_same(schedule: SplitSchedule, got: dict[str, torch.Tensor], context: object) -> None:
    schedule.refresh_by_ops()
    for name, tensor in got.items():
        want = getattr(schedule, name)
        assert torch.equal(tensor, want), (name, context, tensor.tolist(), want.tolist())


def random_schedule(seed: int) -> tuple[SplitSchedule, object]:
    rng = random.Random(seed)
    batch, seq_len = rng.randint(1, 70), rng.randint(1, 900)
    if rng.random() < 0.3:
        lens = [seq_len] * batch
    else:
        lens = [
            rng.choice([0, rng.randint(-5, seq_len + 50)]) if rng.random() < 0.2 else rng.randint(1, seq_len)
            for _ in range(batch)
        ]
    x = make_mla_inputs(batch, 2, seq_len, 8, 8, dtype=torch.float16, kv_lens=lens, device=DEVICE)
    split = rng.choice([None, None, None, rng.randint(1, 300)])
    kv, kpe, kwargs = x.kv, x.kpe, {"kv_lens": x.kv_lens}
    if rng.random() < 0.25:
        pages = to_pages(x, 16)
        kv, kpe, kwargs = pages.kv, pages.kpe, {**pages.layout_kwargs("ragged"), "kv_lens": x.kv_lens}
    call = validate_mla_decoding(x.q, x.qpe, kv, kpe, kv_len_per_split=split, **kwargs)
    block_n = rng.choice([16, 32, 64])
    if split:
        fixed = -(-split // block_n)
        shape = ScheduleShape(batch, block_n, max(1, -(-most_blocks(call, block_n) // fixed)), fixed, fixed)
    else:
        snap = rng.choice([0.0, 0.0, 1 / 32, 0.3])
        cost = rng.choice([0, 0, 1, 3, 6])
        shape = ScheduleShape(batch, block_n, rng.randint(1, 140), rng.choice([1, 1, 2, 5]), None, snap, cost)
    return SplitSchedule(call, shape), (shape, lens, call.layout)


@pytest.mark.parametrize("seed", range(40))
def test_kernel_matches_the_torch_schedule(seed: int) -> None:
    schedule, context = random_schedule(seed)
    assert_same(schedule, kernel_tensors(schedule), context)


def test_kernel_follows_lengths_changed_in_place() -> None:
    """A launch reads ``kv_lens`` when it runs (a plan refreshed after an in-place update)."""
    schedule, _ = random_schedule(7)
    lens = schedule._call.kv_lens
    out = {name: torch.full_like(getattr(schedule, name), -7) for name in NAMES}
    launch = schedule.kernel_launch(**out)
    for step in range(3):
        new = torch.randint(0, schedule._call.seq_len + 1, lens.shape, generator=torch.Generator().manual_seed(step))
        lens.copy_(new)
        launch()
        assert_same(schedule, out, step)


@pytest.mark.gpu
def test_refresh_on_the_gpu_is_the_kernel() -> None:
    """On a GPU the schedule is one launch, and ``refresh`` gives the torch ops' tensors."""
    schedule, context = random_schedule(3)
    assert schedule._launch is not None
    schedule._call.kv_lens.random_(0, schedule._call.seq_len + 1)
    schedule.refresh()
    got = {name: getattr(schedule, name).clone() for name in NAMES}
    assert_same(schedule, got, context)


COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from tilegym.ops.triton import schedule_kernel as module

kernel = module.schedule_kernel
for has_lens, ragged, snap in ((True, False, False), (True, True, True), (False, False, True)):
    constexprs = dict(HAS_LENS=has_lens, RAGGED=ragged, SNAP=snap, BLOCK_B=module.BLOCK_B, BLOCK_P=512)
    signature = {name: "*i32" for name in kernel.arg_names if name.endswith("_ptr")}
    signature.update({name: "i32" for name in module.SIZES})
    signature.update({name: "constexpr" for name in constexprs})
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert "schedule_kernel" in compiled.asm["ptx"]
print("compiled")
"""


def test_kernel_compiles_for_a_gpu() -> None:
    """Triton's GPU front end accepts the kernel, compiled for sm_90 without a GPU (the interpreter does
    not check what it rejects, such as a global that is not a constexpr). In a process of its own:
    under ``TRITON_INTERPRET=1`` Triton's own library functions are interpreter objects."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_a_capture_never_compiles_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """During CUDA-graph capture a variant that has not run in this process is not launched (its first
    launch would compile and load a module inside the capture): the schedule uses the torch ops. Once
    the variant has run, a capture launches it."""
    from tilegym.ops.triton import schedule_kernel as module

    monkeypatch.setattr(module, "_loaded", set())
    monkeypatch.setattr(module.utils, "capturing", lambda device: True)
    schedule, context = random_schedule(11)
    assert schedule.kernel_launch() is None  # what SplitSchedule does on a GPU during capture
    schedule.refresh()  # the torch ops (CPU here)
    monkeypatch.setattr(module.utils, "capturing", lambda device: False)
    kernel_tensors(schedule)  # the variant runs once outside a capture
    monkeypatch.setattr(module.utils, "capturing", lambda device: True)
    launch = schedule.kernel_launch(**{name: torch.full_like(getattr(schedule, name), -7) for name in NAMES})
    assert launch is not None
