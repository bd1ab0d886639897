"""``python -m tilegym <command> [options]``: dispatch to a command; ``--help`` lists them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

PROG = "python -m tilegym"


def _info(argv: list[str]) -> int:
    from tilegym.cli import info_main

    return info_main(argv)


def _demo(argv: list[str]) -> int:
    from tilegym.cli import demo_main

    return demo_main(argv)


def _precompile(argv: list[str]) -> int:
    from tilegym.ops.precompile import main as precompile_main

    return precompile_main(argv)


def _bench(argv: list[str]) -> int:
    from tilegym.bench import main as bench_main

    return bench_main(argv)


def _explain(argv: list[str]) -> int:
    from tilegym.selection import explain_main

    return explain_main(argv)


def _selection_table(argv: list[str]) -> int:
    from tilegym.selection import main as table_main

    return table_main(argv)


# Command -> (one-line summary, runner). Runners import lazily so `--help` stays instant.
COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "info": ("show the device, its vendor, and which backend can run each op here (and why not)", _info),
    "demo": ("run the MLA decode op on every available backend: error vs float64 and time per call", _demo),
    "precompile": ("build the Tile C++ / CUDA C++ cubins for a GPU arch ahead of time (nvcc, no GPU)", _precompile),
    "bench": ("benchmark the backends against this machine's measured copy and matmul ceilings", _bench),
    "explain": ("say which backend `auto` picks for a call shape, and the measured numbers behind it", _explain),
    "selection-table": ("regenerate the per-arch dispatch table from benchmark JSON reports", _selection_table),
}


def usage() -> str:
    """The top-level usage text: one line per command."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: {PROG} <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (summary, _) in COMMANDS.items()]
    lines += ["", f"'{PROG} <command> --help' shows a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; returns its exit code (0 for --help, 2 for a missing or unknown command)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    if command in ("-h", "--help"):
        print(usage())
        return 0
    if command not in COMMANDS:
        print(f"{PROG}: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[command][1](rest)
    except SystemExit as exc:  # argparse exits on --help and bad options: return its code instead
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
