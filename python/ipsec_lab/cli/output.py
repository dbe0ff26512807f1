"""How the commands print: help that fits the terminal, argument errors as one line,
JSON, tables and numbers, a lab run's progress and summary."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, NoReturn

from ipsec_lab import metrics

# Lines break between words only: never inside `strongswan-libipsec` or a long path.
WHOLE: dict[str, Any] = {"break_on_hyphens": False, "break_long_words": False}


class Formatter(argparse.HelpFormatter):
    """Help that fits the terminal: prose paragraphs filled to its width; an indented
    line that is a command (`  ipsec-lab ...`, continued with `\\`) kept as written, so
    an example is never broken mid-command; other indented lines (a list) filled with
    a hanging indent."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        import shutil

        width = min(shutil.get_terminal_size().columns, 100) - 2
        super().__init__(prog, width=max(width, 40), **kwargs)

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, **WHOLE)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        out: list[str] = []
        para: list[str] = []

        def flush() -> None:
            if para:
                out.append(textwrap.fill(" ".join(para), width, initial_indent=indent,
                                         subsequent_indent=indent, **WHOLE))  # fmt: skip
                para.clear()

        for line in text.splitlines():
            if not line.strip():
                flush()
                out.append("")
            elif line.startswith("  "):
                flush()
                body = line.lstrip()
                if body.startswith(("ipsec-lab ", "--", "sudo ")) or line.startswith("      "):
                    out.append(indent + line)  # a command (or its continuation): as written
                else:
                    lead = indent + line[: len(line) - len(body)]
                    out.append(textwrap.fill(body, width, initial_indent=lead,
                                             subsequent_indent=lead + "    ", **WHOLE))  # fmt: skip
            elif line.endswith(":") and len(line) < 40:  # a heading: "examples:"
                flush()
                out.append(indent + line)
            else:
                para.append(line.strip())
        flush()
        return "\n".join(out)


class Parser(argparse.ArgumentParser):
    """argparse, with an argument error as one line naming the option and the problem,
    then where help is (not the usage block first), and a value such as `-5MB` read as
    the option's (negative) value, so its own error can say "negative"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)
        # argparse reads only -5 and -.5 as values; -5MB, -1G, -2e3 are values too.
        self._negative_number_matcher = re.compile(r"^-\.?\d[\w./]*$")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\ntry '{self.prog} --help'\n")


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=1)
    print()


def console() -> Any:
    from ipsec_lab.tables import WholeConsole as Console

    return Console()


def make_table(
    title: str, cols: list[str], rows: list[list[str]], caption: str | None = None
) -> Any:
    from rich.table import Table

    t = Table(title=title, caption=caption)
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    return t


def fmt_mbps(v: float) -> str:
    """A rate for reading: 56,150 rather than 5.615e+04."""
    return f"{v:,.0f}" if v >= 1000 else f"{v:.4g}"


def fmt_num(v: float | None, fmt: str = ".4g") -> str:
    return "—" if v is None else format(v, fmt)


def human_bytes(n: float) -> str:
    """10 MB, 1 KB, 1.5 MB, 300 B (KB = 1024 B, as the lab's file sizes)."""
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def run_with_progress(campaign: Any, quiet: bool, title: str = "") -> None:
    """Run a campaign, with a live rich progress bar (count, ETA, current run) on stderr
    unless `quiet`, and a line on stderr for each run as it ends (done with its figures,
    failed or skipped with the reason's first line). `quiet` (a pipe, a log, `--json`):
    a failed run's whole reason follows its line, indented, so a log says why."""
    last = [""]
    if quiet:

        def plain(p: Any) -> None:
            if p.last and p.last != last[0]:
                last[0] = p.last
                print(f"{title}[{p.done}/{p.total}] {p.last}", file=sys.stderr, flush=True)
                if p.more:
                    import textwrap

                    print(textwrap.indent(p.more, "    "), file=sys.stderr, flush=True)

        campaign.on_progress = plain
        campaign.run()
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(title + "{task.completed}/{task.total}"),
        BarColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        transient=True,
        console=Console(stderr=True),
    ) as prog:
        task = prog.add_task("", total=campaign.progress.total)

        def show(p: Any) -> None:
            if p.last and p.last != last[0]:
                last[0] = p.last
                style = (
                    "red"
                    if p.last.startswith("failed")
                    else ("yellow" if p.last.startswith("skipped") else "")
                )
                line = escape(p.last)
                prog.console.print(f"[{style}]{line}[/{style}]" if style else line)
            prog.update(task, completed=p.done, description=escape(p.current))

        campaign.on_progress = show
        show(campaign.progress)
        campaign.run()


def counts_line(campaign: Any) -> str:
    """planned / done / failed / skipped, in words, for the end of a run."""
    p = campaign.progress
    ok = p.done - p.failed - p.skipped
    return f"{p.total} runs planned: {ok} done, {p.failed} failed, {p.skipped} skipped" + (
        f", {p.total - p.done} not run" if p.total > p.done else ""
    )


def print_summary(summary: list[dict[str, Any]], title: str) -> None:
    from ipsec_lab.tables import WholeConsole as Console

    Console().print(summary_table(summary, title))


def summary_table(summary: list[dict[str, Any]], title: str) -> Any:
    """The summary an engineer reads: rate (or, for HTTP/SMTP, transfer time) median and
    range, its CV over repetitions, ratios to no IPsec, CPU effort, wire bytes per
    payload byte, TCP retransmits, and why a cell is empty."""
    from rich.table import Table

    t = Table(title=title, caption=metrics.SUMMARY_CAPTION)
    for col in ("backend", "configuration", "link", "flow", "measurement"):
        t.add_column(col, no_wrap=True)
    t.add_column("n", justify="right")
    for c in metrics.COLUMNS:
        t.add_column(c.header, justify="right")
    t.add_column("note")
    for r in summary:
        head = (r.get("backend_label", r["backend"]), r["configuration"], r["link"], r["flow"],
                r["measurement"])  # fmt: skip
        if r.get("skipped") is not None or r.get("failed") is not None:
            why = (
                "skipped: " + r["skipped"]
                if r.get("skipped") is not None
                else ("FAILED: " + r["failed"])
            )
            t.add_row(*head, "0", *[""] * len(metrics.COLUMNS), why)
            continue
        t.add_row(*head, str(r["n"]), *metrics.cells(r), r.get("note", ""))
    return t


def print_failures(runs: list[dict[str, Any]]) -> None:
    """Each failed run with its whole reason (the programs' log tails included)."""
    for r in runs:
        if r["status"] == "failed":
            print(f"\nFAILED: {r['backend']} {r['configuration']} | {r['link']} | "
                  f"{r['workload']} {r['flow']} #{r['repetition']}\n{r['reason']}")  # fmt: skip
