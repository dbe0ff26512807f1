"""Errors and words as a person meets them: an argument error is one line naming the
option and the problem, then where help is; help fits 80 columns with every example
whole and runnable; a backend shows the variant it ran as."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from terminal import in_pipe

COMMANDS = [
    [], ["bench"], ["model"], ["model", "fit"], ["model", "predict"], ["plan"], ["advise"],
    ["advise", "ipcomp"], ["overhead"], ["run"], ["check"], ["scenarios"], ["results"],
    ["clean"], ["reproduce"], ["report"],
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["overhead", "--config", "aes128gcm16", "--transfer", "-5MB"],
         "argument --transfer: '-5MB' is negative"),
        (["overhead", "--config", "esp:aes-128-gcm"], "did you mean aes128gcm16?"),
        (["overhead", "--config", "chacha20-poly1305"], "did you mean chacha20poly1305?"),
        (["bench", "--suite", "ah:sha1"], "--config ah:sha1"),
        (["bench", "--suite", "aes-128-gcm"], "did you mean aes128gcm16?"),
        (["plan", "--cycles-per-byte", "10", "--max-load", "1.5"],
         "argument --max-load: 1.5: a share of one core, more than 0 and at most 1"),
        (["plan", "--cycles-per-byte", "10", "--target-mbps", "1GB"], "write 8G"),
        (["model", "predict", "--size", "10", "--t-fix-ms", "1", "--r-alg-mbps", "1"],
         "argument --size: 10: IP packet size must be 20 to 65535"),
        (["results", "one"], "argument campaign: invalid int value: 'one'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)  # fmt: skip
def test_an_argument_error_is_one_line_naming_the_option(args: list[str], words: str) -> None:
    rc, out = in_pipe(args)
    lines = out.splitlines()
    assert rc == 2 and len(lines) == 2, out
    assert words in lines[0], out
    assert lines[1].startswith("try 'ipsec-lab") and lines[1].endswith("--help'")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["model", "predict", "--t-fix-ms", "1", "--r-alg-mbps", "1", "--lalg", "esp:15",
          "--size", "64"], "multiple of 4 from 4 to 256"),
        (["model", "predict", "--t-fix-ms", "1", "--r-alg-mbps", "1", "--lalg", "ah:7",
          "--size", "64"], "RFC 4302"),
        (["advise", "ipcomp", "--data", "/tmp", "--link-mbps", "10"],
         "--data /tmp: is a directory"),
        (["advise", "ipcomp", "--data", "/dev/null", "--link-mbps", "10"],
         "--data /dev/null: empty"),
        (["advise", "ipcomp", "--pcap", "/tmp", "--link-mbps", "10"], "/tmp: is a directory"),
        (["check", "/tmp"], "/tmp: (file): is a directory"),
        (["check", "/nonexistent.toml"], "/nonexistent.toml: (file): No such file"),
    ],
)  # fmt: skip
def test_bad_input_found_later_is_one_line_too(args: list[str], words: str) -> None:
    rc, out = in_pipe(args)
    assert rc == 2 and len(out.splitlines()) == 1 and words in out, out


def _examples(help_text: str) -> list[str]:
    """The example commands in a help text, continuation lines (`\\`) joined."""
    out, cur = [], ""
    for line in help_text.splitlines():
        s = line.strip()
        if cur:
            cur += " " + s.rstrip("\\").strip()
            if not s.endswith("\\"):
                out.append(cur)
                cur = ""
        elif s.startswith("ipsec-lab ") and line.startswith("  "):
            if s.endswith("\\"):
                cur = s.rstrip("\\").strip()
            else:
                out.append(s)
    return out


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "ipsec-lab")
def test_help_fits_80_columns_and_its_examples_run(command: list[str]) -> None:
    from ipsec_lab import cli

    rc, out = in_pipe([*command, "--help"], env={"COLUMNS": "80"})
    assert rc == 0, out
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, wide
    assert "%%" not in out  # a description is not %-formatted: "%%" would print as such
    for ex in _examples(out):
        cli.build_parser().parse_args(shlex.split(ex)[1:])  # exits (fails) if it does not
    if command == ["run"]:
        assert "ipsec-lab scenarios" in out and "./lab" in out  # where to start, where it goes


def test_scenarios_lists_the_shipped_ones_by_a_path_that_works() -> None:
    import json

    rc, out = in_pipe(["scenarios", "--json"])
    assert rc == 0, out
    rows = json.loads(out)
    shipped = sorted(p.name for p in (Path(__file__).parents[1] / "scenarios").glob("*.toml"))
    assert sorted(Path(r["path"]).name for r in rows) == shipped
    assert all(Path(r["path"]).is_absolute() and Path(r["path"]).is_file() for r in rows)


def test_a_reader_gone_away_ends_quietly() -> None:
    """`ipsec-lab ... | head -1`: exit 0 and nothing on stderr (rich alone exits 1)."""
    import subprocess

    from terminal import CLI

    args = ["model", "predict", "--t-fix-ms", "0.4", "--r-alg-mbps", "20", "--range",
            "20:4000"]  # fmt: skip
    p = subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and err == b"", err


def test_a_backend_shows_the_variant_it_ran_as() -> None:
    from ipsec_lab import runner
    from ipsec_lab.cli.output import summary_table
    from ipsec_lab.tables import natural_width

    def run(backend: str, version: str) -> dict[str, object]:
        return {"backend": backend, "configuration": "esp:aes128gcm16", "link": "unshaped",
                "flow": "client-server", "workload": "tcp", "status": "done", "reason": None,
                "backend_version": version, "results": [{"label": "tcp", "mbps": 90.0,
                "seconds": 5.0, "payload_bytes": 5e7}]}  # fmt: skip

    runs = [run("strongswan", "strongSwan 5.9.8 (kernel-libipsec)"), run("none", "")]
    rows = {r["backend"]: r for r in runner.summarize(runs)}
    assert rows["strongswan"]["backend_label"] == "strongswan (libipsec)"
    assert rows["none"]["backend_label"] == "none"
    t = summary_table(list(rows.values()), "t")
    assert natural_width(t) > 0
    assert "strongswan (libipsec)" in list(t.columns[0].cells)
    kernel = runner.summarize([run("strongswan", "strongSwan 5.9.8 (kernel xfrm)")])
    assert kernel[0]["backend_label"] == "strongswan (kernel)"
    assert not re.search(r"\(", runner.summarize([run("ours", "ipsec-gw 0.1")])[0]["backend_label"])


@pytest.mark.parametrize("bug", [ValueError("a bug"), FileNotFoundError(2, "no such program")])
def test_a_bug_is_not_printed_as_bad_input(
    bug: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the lab's own input errors are one line and status 2: a bare ValueError (a
    bug) or a missing program propagates as what it is."""
    import argparse

    from ipsec_lab import cli
    from ipsec_lab.cli.args import UserError
    from ipsec_lab.model.throughput import FitError

    def boom(exc: Exception) -> object:
        def func(_args: argparse.Namespace) -> int:
            raise exc

        return func

    ns = argparse.Namespace(command="plan", user_errors=True, func=boom(bug))
    with pytest.raises(type(bug)):
        cli._call(ns)
    for said in (UserError("--campaign 9: no such campaign"), FitError("two points at least")):
        ns = argparse.Namespace(command="plan", user_errors=True, func=boom(said))
        assert cli._call(ns) == 2
        assert capsys.readouterr().err == f"ipsec-lab plan: {said}\n"
