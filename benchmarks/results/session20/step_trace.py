"""Session 20 (prepared, not run): a timeline of the wgmma kernel's bf16 step, both warpgroups.

    python benchmarks/results/session20/step_trace.py prepare   # CPU machine: .ab/trace and its cubin
    python benchmarks/results/session20/step_trace.py run       # GPU: carry [".cache/tilecpp", ".ab"]

`prepare` copies HEAD's tree to .ab/trace and edits its mla_decoding_split_kv.cuh: lane 0 of each
warpgroup's first warp (the one that issues the refills) writes clock64() at 13 points of every bf16
step into a __device__ array, for the first 24 steps of CTAs (0, 0) and (1, 0); then it builds the
bf16 cluster-pair kernel. `run` times nothing: it runs 64 x 4096 x 128 three times with that kernel,
reads the array back (cuModuleGetGlobal) and prints, per warpgroup, the median over steps 4-23 of
each point's cycles after the step's start (WG0's point 0), and the median step length. The clock
reads may move the schedule a little; the results are the diagnostic's, not the library's.
"""

# ruff: noqa: E501  (the C++ lines it edits are quoted whole)

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HDR = "tilegym/ops/cutlass/mla_decoding_split_kv.cuh"
TREE = Path(".ab/trace")
STEPS, EVENTS = 24, 13
EVENT_NAMES = {
    0: "step start",
    1: "WG1: scores barrier passed (WG0 issued S_A)",
    2: "all 9 score tiles issued",
    3: "scores waited (S done)",
    4: "WG0: P_A published (max A arrive)",
    5: "P V #1 issued (WG0: P_A V_A,L; WG1: P_A V_A,R)",
    6: "P V #1 done",
    7: "refill after P V #1 issued",
    8: "WG0: (m_B, P_B) received / WG1: P_B published",
    9: "P V #2 issued (WG0: P_B V_B,L; WG1: P_B V_B,R)",
    10: "P V #2 done",
    11: "refill after P V #2 issued",
    12: "WG0: P_A free passed / WG1: P_A free arrive",
}

TRACE_DEFS = """
#define TILEGYM_STEP_TRACE 1
__device__ unsigned long long tilegym_step_trace[2][2][24][13];  // [CTA x][warpgroup][step][point]
#define TRACE_EV(e)                                                                            \\
  do {                                                                                          \\
    if ((wt & 127) == 0 && blockIdx.x < 2 && blockIdx.y == 0 && trace_step < 24)                \\
      tilegym_step_trace[blockIdx.x][wg][trace_step][e] = clock64();                            \\
  } while (0)
"""

EDITS = [
    ("namespace tilegym_cute {\n", TRACE_DEFS + "namespace tilegym_cute {\n"),
    (
        "  int parity[2] = {0, 0};  // of each buffer's barriers\n",
        "  int parity[2] = {0, 0};  // of each buffer's barriers\n  int trace_step = 0;\n",
    ),
    (
        "        const int buf = wg;  // the buffer whose block this warpgroup scores\n",
        "        const int buf = wg;  // the buffer whose block this warpgroup scores\n        TRACE_EV(0);\n",
    ),
    (
        "          score_tile(_4{}), score_tile(_5{}), score_tile(_6{}), score_tile(_7{}), score_tile(_8{});\n"
        "          if (wg == 0) bar_arrive(kBarScoresA);\n          warpgroup_wait<0>();\n",
        "          score_tile(_4{}), score_tile(_5{}), score_tile(_6{}), score_tile(_7{}), score_tile(_8{});\n"
        "          TRACE_EV(2);\n          if (wg == 0) bar_arrive(kBarScoresA);\n          warpgroup_wait<0>();\n"
        "          TRACE_EV(3);\n",
    ),
    (
        "        if (wg == 1) bar_wait(kBarScoresA);\n",
        "        if (wg == 1) bar_wait(kBarScoresA);\n        TRACE_EV(1);\n",
    ),
    (
        "          softmax_to(0, m);\n          bar_arrive(kBarMaxA);\n",
        "          softmax_to(0, m);\n          bar_arrive(kBarMaxA);\n          TRACE_EV(4);\n",
    ),
    (
        "          pv_local(0);\n          warpgroup_wait<0>();\n          warpgroup_fence_operand(acc_o);\n"
        "          warpgroup_fence_operand(rP);\n"
        "          if (blk_a + 2 < end_blk) issue_block(blk_a + 2, 0);  // V_A,L and K_A are no longer read here\n"
        "          // m_B from WG1 (it arrives on every step; without a block B, m_B = m_A).\n"
        "          bar_wait(kBarMaxB);\n",
        "          pv_local(0);\n          TRACE_EV(5);\n          warpgroup_wait<0>();\n          TRACE_EV(6);\n"
        "          warpgroup_fence_operand(acc_o);\n          warpgroup_fence_operand(rP);\n"
        "          if (blk_a + 2 < end_blk) issue_block(blk_a + 2, 0);  // V_A,L and K_A are no longer read here\n"
        "          TRACE_EV(7);\n"
        "          // m_B from WG1 (it arrives on every step; without a block B, m_B = m_A).\n"
        "          bar_wait(kBarMaxB);\n          TRACE_EV(8);\n",
    ),
    (
        "            pv_remote(1);  // O_L += P_B V_B,L\n            warpgroup_wait<0>();\n"
        "            warpgroup_fence_operand(acc_o);\n"
        "            if (blk_b + 2 < end_blk) issue_block(blk_b + 2, 1);  // V_B,L is no longer read\n          }\n"
        "          bar_wait(kBarPAFree);",
        "            pv_remote(1);  // O_L += P_B V_B,L\n            TRACE_EV(9);\n            warpgroup_wait<0>();\n"
        "            TRACE_EV(10);\n            warpgroup_fence_operand(acc_o);\n"
        "            if (blk_b + 2 < end_blk) issue_block(blk_b + 2, 1);  // V_B,L is no longer read\n"
        "            TRACE_EV(11);\n          }\n"
        "          bar_wait(kBarPAFree);\n          TRACE_EV(12);",
    ),
    (
        "          clear_tail(blk_a, 0);\n          pv_remote(0);  // O_R += P_A V_A,R\n",
        "          clear_tail(blk_a, 0);\n          pv_remote(0);  // O_R += P_A V_A,R\n          TRACE_EV(5);\n",
    ),
    (
        "          bar_arrive(kBarMaxB);  // (m_B, P_B) -> WG0, whose P_B V_B,L need not wait for P_A V_A,R\n"
        "          warpgroup_wait<0>();\n          warpgroup_fence_operand(acc_o);\n"
        "          if (blk_a + 2 < end_blk) issue_block(blk_a + 2, 0);  // V_A,R and K_A's rope are no longer read\n"
        "          bar_arrive(kBarPAFree);\n",
        "          bar_arrive(kBarMaxB);  // (m_B, P_B) -> WG0, whose P_B V_B,L need not wait for P_A V_A,R\n"
        "          TRACE_EV(8);\n          warpgroup_wait<0>();\n          TRACE_EV(6);\n          warpgroup_fence_operand(acc_o);\n"
        "          if (blk_a + 2 < end_blk) issue_block(blk_a + 2, 0);  // V_A,R and K_A's rope are no longer read\n"
        "          TRACE_EV(7);\n          bar_arrive(kBarPAFree);\n          TRACE_EV(12);\n",
    ),
    (
        "            pv_local(1);  // O_R += P_B V_B,R\n            warpgroup_wait<0>();\n",
        "            pv_local(1);  // O_R += P_B V_B,R\n            TRACE_EV(9);\n            warpgroup_wait<0>();\n"
        "            TRACE_EV(10);\n",
    ),
    (
        "            if (blk_b + 2 < end_blk) issue_block(blk_b + 2, 1);  // V_B,R and K_B's rope are no longer read\n"
        "          }\n        }\n        parity[0] ^= 1;\n        if (has_b) parity[1] ^= 1;\n      }\n    }\n",
        "            if (blk_b + 2 < end_blk) issue_block(blk_b + 2, 1);  // V_B,R and K_B's rope are no longer read\n"
        "            TRACE_EV(11);\n          }\n        }\n        parity[0] ^= 1;\n        if (has_b) parity[1] ^= 1;\n"
        "        ++trace_step;\n      }\n    }\n",
    ),
]


def prepare() -> None:
    shutil.rmtree(TREE, ignore_errors=True)
    TREE.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD", "pyproject.toml", "tilegym"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive.stdout, check=True)
    path = TREE / HDR
    text = path.read_text()
    for old, new in EDITS:
        found = text.count(old)
        if found != 1:
            raise SystemExit(f"{path}: {old[:70]!r}... found {found} times, expected 1")
        text = text.replace(old, new)
    path.write_text(text)
    kernel = use_tree()
    print(kernel.compile("sm_90a"))


def use_tree():
    import torch

    from tilegym.ops.cutlass import mla_decoding_split_kv as m

    m.HEADER = str((TREE / HDR).resolve())
    m.split_kernel.cache_clear()
    return m.split_kernel(torch.bfloat16, True)


def run() -> None:
    import numpy as np
    import torch

    import tilegym
    from tilegym.ops.cubin_loader import _driver
    from tilegym.testing import make_mla_inputs

    kernel = use_tree()
    x = make_mla_inputs(64, 128, 4096, device="cuda")
    plan = tilegym.plan_mla_decoding(x.q, x.qpe, x.kv, x.kpe, backend="cutlass")
    for _ in range(3):
        tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, plan=plan)
    torch.cuda.synchronize()
    drv = _driver()
    err, ptr, size = drv.cuModuleGetGlobal(kernel._modules[-1], b"tilegym_step_trace")
    assert int(err) == 0, err
    trace = np.zeros((2, 2, STEPS, EVENTS), dtype=np.uint64)
    (err,) = drv.cuMemcpyDtoH(trace.ctypes.data, ptr, min(size, trace.nbytes))
    assert int(err) == 0, err
    t = trace.astype(np.int64)
    for cta in range(2):
        start = t[cta, 0, :, 0]
        lengths = np.diff(start[4:])
        print(f"\n## CTA ({cta}, 0): median step {np.median(lengths):.0f} cycles (steps 4-23: {lengths.tolist()})")
        print("| point | WG0 cycles after the step's start | WG1 |")
        print("|---|---|---|")
        for e in range(EVENTS):
            cells = []
            for wg in range(2):
                rel = t[cta, wg, 4:, e] - start[4:]
                ok = t[cta, wg, 4:, e] != 0
                cells.append(f"{np.median(rel[ok]):.0f}" if ok.any() else "-")
            print(f"| {e} {EVENT_NAMES[e]} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))
    {"prepare": prepare, "run": run}[sys.argv[1]]()
