"""Session 19: source trees for one device call's A/B (CPU machine; run from the repository root).

.ab/lazy: the bf16 step order keeps a row's max frame until a block's max exceeds it by more than
2^8 (probabilities up to 256), and skips rescaling O when no row of the thread changed frame.
.ab/noloads-*: the session-18 no-loads diagnostic with one more part of the step removed
(wrong results by construction): the O rescaling, the exponentials, the P V matmuls, the score matmuls.
The edits apply to the tree of commit 832623d (session 19's start; .ab/main and .ab/noloads from
session 18's next_call.sh prepare); main has since taken LAZY, so on a newer tree they stop with
the edit they no longer find.
"""

# ruff: noqa: E501  (the C++ lines it edits are quoted whole)

import shutil
from pathlib import Path

HDR = "tilegym/ops/cutlass/mla_decoding_split_kv.cuh"


def tree(name: str, base: str) -> Path:
    dst = Path(".ab") / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(Path(".ab") / base, dst)
    return dst


def edit(root: Path, pairs: list[tuple[str, str, int]]) -> None:
    path = root / HDR
    text = path.read_text()
    for old, new, count in pairs:
        found = text.count(old)
        if found != count:
            raise SystemExit(f"{root}: {old!r} found {found} times, expected {count}")
        text = text.replace(old, new)
    path.write_text(text)


LAZY = [
    (
        "inline constexpr float kLn2 = 0.6931471805599453f;\n",
        "inline constexpr float kLn2 = 0.6931471805599453f;\n"
        "// A row's frame (the max its probabilities are taken against) moves only when a block's max exceeds\n"
        "// it by more than this (log2 units): probabilities stay <= 2^8, and O is rescaled far less often.\n"
        "inline constexpr float kReframeLog2 = 8.f;\n"
        "__device__ __forceinline__ float next_frame(float frame, float block_max) {\n"
        "  return block_max > frame + kReframeLog2 ? block_max : frame;\n"
        "}\n"
        "__device__ __forceinline__ bool reframed(const float (&scale)[2]) { return scale[0] != 1.f || scale[1] != 1.f; }\n",
        1,
    ),
    ("            m_a[k] = fmaxf(m[k], row_max[k]);\n", "            m_a[k] = next_frame(m[k], row_max[k]);\n", 1),
    (
        "          scale_o(scale);  // O_L is this warpgroup's alone: after publishing P_A\n",
        "          if (reframed(scale)) scale_o(scale);  // O_L is this warpgroup's alone: after publishing P_A\n",
        1,
    ),
    (
        "          if (has_b) {\n            scale_o(scale);\n            clear_tail(blk_b, 1);\n            pv_remote(1);",
        "          if (has_b) {\n            if (reframed(scale)) scale_o(scale);\n            clear_tail(blk_b, 1);\n            pv_remote(1);",
        1,
    ),
    (
        "          scale_o(scale);\n          clear_tail(blk_a, 0);\n          pv_remote(0);  // O_R += P_A V_A,R\n          float safe_b[2];",
        "          if (reframed(scale)) scale_o(scale);\n          clear_tail(blk_a, 0);\n          pv_remote(0);  // O_R += P_A V_A,R\n          float safe_b[2];",
        1,
    ),
    (
        "            m[k] = has_b ? fmaxf(m_a[k], row_max[k]) : m_a[k];\n",
        "            m[k] = has_b ? next_frame(m_a[k], row_max[k]) : m_a[k];\n",
        1,
    ),
    (
        "          if (has_b) {\n            scale_o(scale);\n            clear_tail(blk_b, 1);\n            pv_local(1);",
        "          if (has_b) {\n            if (reframed(scale)) scale_o(scale);\n            clear_tail(blk_b, 1);\n            pv_local(1);",
        1,
    ),
]
NOSCALE = [("      for (int i = 0; i < 128; ++i) acc_o(i) *= scale[row_half(i)];\n", "", 1)]
NOEXP = [
    (
        "            p[i] = fast_exp2(p[i] - safe[k]);\n            p[i + 1] = fast_exp2(p[i + 1] - safe[k]);\n",
        "            p[i] = p[i] - safe[k];\n            p[i + 1] = p[i + 1] - safe[k];\n",
        1,
    ),
]
NOPV = [
    ("      for (int s = 0; s < 4; ++s) gemm(mma_local, rP(_, _, s), tOrV(_, _, s), acc_o);\n", "", 1),
    ("      for (int s = 0; s < 4; ++s) gemm(mma_remote, tOrP(_, _, s), tOrV(_, _, s), acc_o);\n", "", 1),
]
NOS = [
    (
        "            gemm_tile(tile);\n            warpgroup_commit_batch();\n",
        "            warpgroup_commit_batch();\n",
        1,
    ),
]


if __name__ == "__main__":
    edit(tree("lazy", "main"), LAZY)
    for name, pairs in (("noscale", NOSCALE), ("noexp", NOEXP), ("nopv", NOPV), ("nos", NOS)):
        edit(tree(f"noloads-{name}", "noloads"), pairs)
    print("trees ready")
