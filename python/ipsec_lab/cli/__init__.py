"""The `ipsec-lab` command: one module per command (each with its `add_parser`), argument
types in `args`, how things print in `output`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ipsec_lab.cli import (
    advise,
    bench,
    clean,
    hosts,
    model,
    overhead,
    plan,
    report,
    reproduce,
    results,
    run,
)
from ipsec_lab.cli.args import CALL_ERRORS
from ipsec_lab.cli.output import Parser

# In the order `ipsec-lab --help` lists them.
COMMANDS = (bench, model, plan, advise, overhead, run, results, clean, reproduce, report, hosts)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="ipsec-lab",
        description="What does IPsec cost, here, and why? Measure, model and explain it.",
    )
    from ipsec_lab import __version__

    p.add_argument(
        "--version", action="version", version=f"ipsec-lab {__version__}",
        help="print the version and exit",
    )  # fmt: skip
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for c in COMMANDS:
        c.add_parser(sub)
    _add_wide(p)
    return p


def _add_wide(p: argparse.ArgumentParser) -> None:
    """`--wide` on every command that prints (the leaves of the command tree)."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        if p.prog != "ipsec-lab":
            p.add_argument(
                "--wide",
                action="store_true",
                help="print tables with all columns at full width even on a narrow terminal "
                "(default there: one block per row; in a pipe tables are always full width)",
            )
        return
    for a in subs:
        for child in a.choices.values():
            _add_wide(child)


def _call(args: argparse.Namespace) -> int:
    """Run the command. A calculation (model, plan, advise, overhead) given bad input it
    finds only after parsing says so in one line and exits 2."""
    if not getattr(args, "user_errors", False):
        rc: int = args.func(args)
        return rc
    sub = getattr(args, "model_command", None) or getattr(args, "advise_command", None)
    prog = " ".join(filter(None, ["ipsec-lab", args.command, sub]))
    try:
        rc = args.func(args)
    except BrokenPipeError:
        raise  # the reader went away (`| head`): main ends quietly, not a user error
    except CALL_ERRORS as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ipsec_lab import tables

    tables.WIDE = bool(getattr(args, "wide", False))
    if getattr(args, "budget_ms", 1) < 1 or getattr(args, "trials", 1) < 1:
        print(f"ipsec-lab {args.command}: --budget-ms and --trials must be at least 1",
              file=sys.stderr)  # fmt: skip
        return 2
    from ipsec_lab.signals import on_termination

    on_termination()  # SIGTERM and SIGHUP stop a lab run as Ctrl-C does
    try:
        return _call(args)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: not an error of ours. What is still
        # buffered, and the interpreter's last flush, go nowhere instead of failing.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
