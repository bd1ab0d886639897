"""Session 20: the SASS instructions that collect the most warp-state samples in an ncu source page.

    python benchmarks/results/session20/ncu_sass_top.py sass.csv [N]

Reads `ncu -i REPORT --page source --csv --print-source sass` output and prints the samples per
stall reason, then the N instructions with the most samples (all samples, then the not-issued ones;
offsets from the kernel's first instruction). A stall is charged to the instruction a warp waits to
issue: the one after a `BAR.SYNC`, the `WARPGROUP.DEPBAR` of a wgmma wait.
"""

import csv
import sys


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if any("Source" in c for c in r))
    head, body = rows[start], rows[start + 1 :]
    src = next(i for i, c in enumerate(head) if c.strip() == "Source")
    sampled = [i for i, c in enumerate(head) if "Sampling" in c]

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except (ValueError, IndexError):
            return 0.0

    print("columns:", [head[i] for i in sampled])
    total = sum(num(r, sampled[0]) for r in body) if sampled else 0
    print(f"instructions {len(body)}, samples {total:.0f}")
    if not sampled:
        return
    reasons = [i for i, c in enumerate(head) if c.startswith("stall_") and "Not Issued" not in c]
    for i in sorted(reasons, key=lambda i: -sum(num(r, i) for r in body)):
        part = sum(num(r, i) for r in body)
        if part:
            print(f"{head[i]:28s} {part:8.0f} {100 * part / max(total, 1):5.1f}%")
    key = sampled[0]
    for r in sorted(body, key=lambda r: -num(r, key))[:n]:
        cells = " ".join(f"{num(r, i):7.0f}" for i in sampled)
        offset = int(r[0], 16) - int(body[0][0], 16)
        print(f"{cells}  {100 * num(r, key) / max(total, 1):5.1f}%  {offset:06x}  {r[src].strip()[:90]}")


if __name__ == "__main__":
    main()
