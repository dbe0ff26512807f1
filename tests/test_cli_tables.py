"""Tables never cut a value: at 80 columns on a terminal, in a pipe, and with --wide."""

from __future__ import annotations

import io
import re

from rich.console import Console

from conftest import cli
from ipsec_lab import runner, tables
from ipsec_lab.cli.output import summary_table


def _summary() -> list[dict[str, object]]:
    rows = []
    for rep, mbps in ((1, 941.27), (2, 938.5)):
        for b, cfg in (("none", "none"), ("ours", "ipcomp+esp:aes128-sha1")):
            rows.append({
                "status": "done", "backend": b, "configuration": cfg,
                "link": "ethernet-100-shaped", "flow": "client-server", "workload": "tcp",
                "repetition": rep, "reason": None,
                "results": [{"label": "tcp-1x-8s-text", "mbps": mbps / (2 if b == "ours" else 1),
                             "seconds": 8.0, "payload_bytes": 9.4e8,
                             "effort_us_per_kb": 12.345, "ipsec_effort_us_per_kb": 6.789,
                             "wire_up_bytes": 9.9e8, "wire_down_bytes": 1e7,
                             "retransmits": 17}],
            })  # fmt: skip
    rows.append({"status": "failed", "backend": "strongswan",
                 "configuration": "esp:aes256-sha256", "link": "ethernet-100-shaped",
                 "flow": "client-server", "workload": "tcp", "repetition": 1,
                 "reason": "charon did not come up in 10 s", "results": []})  # fmt: skip
    return runner.summarize(rows)


def _values(summary: list[dict[str, object]]) -> list[str]:
    t = summary_table(summary, "campaign 3: a long enough title")
    return [str(c) for col in t.columns for c in col.cells if str(c).strip()]


def test_summary_at_80_columns_on_a_terminal_shows_every_value_whole() -> None:
    summary = _summary()
    buf = io.StringIO()
    tables.show(summary_table(summary, "t"), console=Console(file=buf, width=80,
                                                               force_terminal=True))  # fmt: skip
    out = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())
    assert max(len(line) for line in out.splitlines()) <= 80, out
    for v in _values(summary):
        assert v in out, v
    assert "…" not in out
    assert "FAILED: charon did not come up in 10 s" in out


def test_summary_in_a_pipe_is_full_width_plain_text() -> None:
    summary = _summary()
    buf = io.StringIO()  # not a terminal
    tables.show(summary_table(summary, "t"), console=Console(file=buf, width=80))
    out = buf.getvalue()
    assert "\x1b[" not in out  # no colour codes in a pipe
    for v in _values(summary):
        assert v in out, v
    assert "…" not in out and "┃┃" not in out
    # one line per row: the table is as wide as it needs, not 80 columns
    assert any(len(line) > 80 for line in out.splitlines())


def test_wide_keeps_the_table_layout_on_a_narrow_terminal() -> None:
    summary = _summary()
    buf = io.StringIO()
    tables.show(summary_table(summary, "t"), wide=True,
                console=Console(file=buf, width=80, force_terminal=True))  # fmt: skip
    out = buf.getvalue()
    assert any(len(line) > 80 for line in out.splitlines())
    assert "…" not in out
    for v in _values(summary):
        assert v in out, v


def _cli(*args: str, columns: str = "80") -> str:
    return cli(*args, columns=int(columns), check=True).stdout


def test_bench_piped_prints_every_suite_name_whole() -> None:
    out = _cli("bench", "--suite", "aes128gcm16", "--suite", "aes128-sha1", "--size", "64",
               "--op", "seal", "--budget-ms", "2", "--trials", "1")  # fmt: skip
    assert "aes128gcm16" in out and "aes128-sha1" in out
    assert "…" not in out


def test_model_tables_piped_are_whole() -> None:
    out = _cli("overhead", "--config", "esp:aes128gcm16", "--size", "64", "--size", "1400")
    assert "…" not in out and "1400" in out
