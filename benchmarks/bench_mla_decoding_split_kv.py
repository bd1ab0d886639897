"""Benchmark every available backend of ``mla_decoding_split_kv``: a thin wrapper of ``tilegym.bench``.

Usage: ``PYTHONPATH=. python benchmarks/bench_mla_decoding_split_kv.py --suite deepseek``
(same options as ``python -m tilegym bench --help``).
"""

import sys
from pathlib import Path

try:
    from tilegym.bench import main
except ImportError:  # run from a checkout without PYTHONPATH: use the checkout's package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tilegym.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
