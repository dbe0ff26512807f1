"""Every command that prints, as a person runs it: in a real terminal (a pty) 80, 120 and
200 columns wide, and in a pipe. Each must exit 0 with no traceback and every value of
its tables whole (each word of the piped table appears in the terminal's output; rich's
`…` never does), colour only on a terminal, and NO_COLOR honoured.

The class of bug this guards: an output path that behaves differently on a terminal
(tables.show once printed a fitting table back through WholeConsole.print, recursing
until RecursionError, in every table command at some width; no test printed to a pty)."""

from __future__ import annotations

from pathlib import Path

import pytest

from terminal import COLOUR, in_pipe, in_terminal, plain, values

WIDTHS = [80, 120, 200]

# Commands whose output is the same every time: the piped table's words must all appear
# in the terminal's output.
SAME_EVERY_TIME = {
    "overhead": ["overhead", "--config", "aes128gcm16", "--config", "ah:sha1+esp:aes128",
                 "--transfer", "10MB"],
    "model-fit": ["model", "fit", "--mode", "sync", "--lalg", "esp:16", "--point",
                  "128:2.204", "--point", "1280:11.382Mbps"],
    "model-predict": ["model", "predict", "--t-fix-ms", "0.41", "--r-alg-mbps", "21.2",
                      "--lalg", "esp:16", "--size", "64", "--size", "1420"],
    "advise-ipcomp": ["advise", "ipcomp", "--reduction-pct", "43", "--link-mbps", "10M",
                      "--costs", "ferrante2005-compressible"],
    "plan": ["plan", "--cycles-per-byte", "140", "--cpu-mhz", "450", "--target-mbps", "1G"],
    "results-list": ["results", "--lab", "{lab}"],
    "results-campaign": ["results", "1", "--lab", "{lab}"],
    "report": ["report", "1", "--lab", "{lab}", "--out", "{lab}/report"],
    "help": ["--help"],
    "run-help": ["run", "--help"],
    "reproduce-help": ["reproduce", "--help"],
}  # fmt: skip

# Commands that measure: their figures differ run to run, their words do not.
MEASURING = {
    "bench": (["bench", "--suite", "aes128gcm16", "--suite", "aes128-sha1", "--size", "64",
               "--size", "1420", "--budget-ms", "4", "--trials", "1"],
              ["aes128gcm16", "aes128-sha1", "tunnel", "seal", "open", "1420", "ns/pkt"]),
    "bench-stages": (["bench", "--stages", "--suite", "aes128gcm16", "--size", "1420",
                      "--op", "seal", "--budget-ms", "4", "--trials", "1"],
                     ["aes128gcm16", "cipher", "t_fix", "padding"]),
    "plan-bench": (["plan", "--bench", "aes128gcm16", "--target-mbps", "1G", "--budget-ms",
                    "4", "--trials", "1"], ["cores", "upper", "aes128gcm16"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab directory holding one campaign of `ipsec-lab run` (none and ours, two
    repetitions), written through the lab's own store."""
    from ipsec_lab.store import RunKey, Store

    lab = tmp_path_factory.mktemp("lab")
    store = Store(lab / "results.sqlite")
    text = (
        'name = "mine"\nbackends = ["none", "ours"]\nconfigurations = ["esp:aes128gcm16"]\n'
        'repetitions = 2\n[[workloads]]\nkind = "tcp"\nseconds = 5\n'
    )
    cid = store.new_campaign("mine", "mine.toml", text, {})
    for backend, conf, mbps, effort in (
        ("none", "none", 900.0, 5.0), ("ours", "esp:aes128gcm16", 400.0, 12.25)
    ):  # fmt: skip
        for rep in (1, 2):
            row = {"mbps": mbps + rep, "seconds": 5.0, "payload_bytes": mbps * 5e6 / 8,
                   "effort_us_per_kb": effort, "ipsec_effort_us_per_kb": effort / 2,
                   "cpu_load": 0.5}  # fmt: skip
            key = RunKey(backend, conf, "unshaped", "tcp", "client-server", rep)
            store.record(cid, key, "done", 0.0, results=[("tcp", row)])
    store.close()
    return lab


def _args(args: list[str], lab: Path) -> list[str]:
    return [a.replace("{lab}", str(lab)) for a in args]


def _header_words(table_text: str) -> set[str]:
    """The words of the header lines of a piped table (those just above a rule)."""
    lines = table_text.splitlines()
    return {
        w
        for i, line in enumerate(lines[1:], 1)
        if line.strip() and set(line.strip()) <= set("─ ")
        for w in lines[i - 1].split()
    }


def _sound(rc: int, out: str, what: str) -> None:
    assert rc == 0, f"{what}: exit {rc}\n{out[-4000:]}"
    assert "Traceback" not in out, f"{what}:\n{out[-4000:]}"
    assert "…" not in out, f"{what}: a value was cut:\n{out}"


@pytest.fixture(scope="module")
def piped(lab: Path) -> dict[str, str]:
    """Each deterministic command's output in a pipe, to compare the terminal's with."""
    got = {}
    for name, args in SAME_EVERY_TIME.items():
        rc, out = in_pipe(_args(args, lab))
        _sound(rc, out, f"{name} piped")
        assert "\x1b[" not in out, f"{name}: escape sequences in a pipe"
        got[name] = out
    return got


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("name", SAME_EVERY_TIME)
def test_every_command_in_a_terminal_prints_every_value_whole(
    name: str, columns: int, lab: Path, piped: dict[str, str]
) -> None:
    rc, out = in_terminal(_args(SAME_EVERY_TIME[name], lab), columns)
    _sound(rc, out, f"{name} at {columns} columns")
    text = plain(out)
    # One block a row (a table wider than the terminal) leaves out a row's empty cells,
    # and so the header of a column empty in every row: only such headers may be absent.
    blocks = "─" not in text and "━" not in text
    headers = _header_words(piped[name]) if blocks else set()
    missing = sorted(w for w in values(piped[name]) - headers if w not in text)
    assert not missing, f"{name} at {columns} columns lacks {missing[:20]}:\n{text}"
    if "--help" not in SAME_EVERY_TIME[name] and name != "report":
        assert "\x1b[" in out, f"{name}: no styling at all on a terminal"


# plan --bench fits a model to the engine's times: on a machine busy enough they cannot
# be fitted (plan says so, exit 2), so it runs where the machine is quiet
@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.quiet] if n == "plan-bench" else [])
             for n in MEASURING])  # fmt: skip
def test_measuring_commands_in_a_terminal(name: str, columns: int) -> None:
    args, words = MEASURING[name]
    rc, out = in_terminal(args, columns)
    _sound(rc, out, f"{name} at {columns} columns")
    text = plain(out)
    assert all(w in text for w in words), f"{name}: {[w for w in words if w not in text]}"
    rc, out = in_pipe(args)
    _sound(rc, out, f"{name} piped")
    assert "\x1b[" not in out
    assert all(w in out for w in words)


def test_no_color_is_honoured_on_a_terminal() -> None:
    args = SAME_EVERY_TIME["advise-ipcomp"]
    rc, out = in_terminal(args, 200)
    assert rc == 0 and COLOUR.search(out), "expected colour on a terminal"
    rc, out = in_terminal(args, 200, env={"NO_COLOR": "1"})
    assert rc == 0 and not COLOUR.search(out), f"colour despite NO_COLOR: {out!r}"


def test_a_pipe_honours_columns_when_set() -> None:
    args = ["model", "predict", "--t-fix-ms", "0.41", "--r-alg-mbps", "21.2", "--lalg",
            "esp:16", "--size", "64", "--size", "1420"]  # fmt: skip
    rc, full = in_pipe(args)
    assert rc == 0
    widest = max(len(line) for line in full.splitlines())
    rc, narrow = in_pipe(args, env={"COLUMNS": "40"})
    assert rc == 0 and max(len(line) for line in narrow.splitlines()) <= 40 < widest
    # the narrow layout keeps every value: one block a row, `column: value`
    numbers = {w for w in values(full) if any(c.isdigit() for c in w)}
    assert numbers and all(n in narrow for n in numbers), numbers - set(narrow.split())


def test_an_argument_error_is_one_line_then_help() -> None:
    rc, out = in_pipe(["overhead", "--config", "aes128gcm16", "--transfer", "-5MB"])
    lines = out.splitlines()
    assert rc == 2 and len(lines) == 2, out
    assert lines[0].startswith("ipsec-lab overhead: argument --transfer:")
    assert "negative" in lines[0]
    assert lines[1] == "try 'ipsec-lab overhead --help'"
