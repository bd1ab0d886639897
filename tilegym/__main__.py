"""``python -m tilegym info | demo | precompile | bench``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("info", "demo", "precompile", "bench")
    if not argv or argv[0] not in commands:
        print(f"usage: python -m tilegym {{{'|'.join(commands)}}} [options]", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "info":
        from tilegym.cli import info

        return info()
    if command == "demo":
        from tilegym.cli import demo

        return demo()
    if command == "precompile":
        from tilegym.ops.precompile import main as precompile_main

        return precompile_main(rest)
    from tilegym.bench import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
