"""What the lab keeps on a host and reads back from it: each run's ledger (one JSON line a
step, `what` and the shell line that undoes it), the logs of the programs it ran there,
and `ipsec-lab clean --hosts`, which undoes the ledgers a killed run left.

Nothing a host says is taken as a path here or run unchecked: a log name it lists is
fetched only when it is a plain `*.log` name (LOG_NAME) that stays inside the local run
directory; a ledger is read from a host only after its work directory, the run's
directory and the ledger itself pass the check of `hosts.workdir` (in the same round
trip), and only the run directories of the host's own node (`<token>-<node>`) are
undone there, so nodes sharing a machine or a work directory each undo their own.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from ipsec_lab.hosts import Hosts
from ipsec_lab.hosts.ssh import Ssh, SshError
from ipsec_lab.hosts.workdir import LEDGER, RUN_NAME, UnsafeError, guard, refusals

# A log name a host may send back (`ls` of a run's directory): a plain file name, fetched
# into the run directory here; anything else is refused and noted in commands.log.
LOG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.log$")


def read_ledger(text: str) -> list[dict[str, str]]:
    """A ledger's entries (`what`, `undo`), oldest first; ValueError naming the line
    for one the lab does not write."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            e = None
        if not (isinstance(e, dict) and isinstance(e.get("what"), str)
                and isinstance(e.get("undo"), str)):  # fmt: skip
            raise ValueError(f"line {n} is not a ledger entry: {line[:80]!r}")
        out.append({"what": e["what"], "undo": e["undo"]})
    return out


def fetch_logs(h: Ssh, workdir: str, to: Path, note: Callable[[str], None] | None = None) -> None:
    """The programs' logs of a run, into the local run directory `to`: only names that
    are plain log names (LOG_NAME) and stay inside `to` — anything else the host lists
    (an absolute path, `..`, a subdirectory) is refused and passed to `note`."""
    names = h.run(f"cd {shlex.quote(workdir)} && ls -1 -- *.log 2>/dev/null", check=False).stdout
    base = to.resolve()
    for name in names.splitlines():
        dest = base / name
        inside = dest.parent == base and dest.resolve().is_relative_to(base)
        if not LOG_NAME.match(name) or not inside:
            if note is not None and name.strip():
                note(f"refused a log name the host listed: {name[:120]!r} (not a plain "
                     f"*.log name inside {to})")  # fmt: skip
            continue
        to.mkdir(parents=True, exist_ok=True)
        try:
            data = h.fetch(f"{workdir}/{name}")
        except SshError:
            continue
        dest.write_bytes(data)


def clean_hosts(hosts: Hosts) -> tuple[list[str], list[str]]:
    """`ipsec-lab clean --hosts`: undo every run's ledger left on every driven host;
    (what was undone, what was refused). Each host's work directory is checked up to `/`
    and each of its run directories and ledgers before a ledger is read (one round
    trip: `hosts.workdir`); one another user could have written is not read, not run
    and not removed: refused, naming it, its owner and mode, and the fix. Only the run
    directories of a host's own node are undone there (`<token>-<node>`), so hosts
    sharing a work directory each undo their own."""
    done: list[str] = []
    refused: list[str] = []
    for host in hosts.driven():
        assert host.ssh is not None
        h = Ssh(host.ssh, host.node, hosts.ssh_config)
        try:
            h.connect()
            g = guard(h.uid, host.workdir, "list", host.node)
            r = h.run(g.line, check=False, timeout=60)
            h.refused(r.returncode, r.stderr, g)  # the work directory itself
            if r.returncode != 0:
                raise SshError(f"{h.who}: cannot list {host.workdir}: {r.stderr.strip()[-300:]}")
            for u in refusals(r.stderr):  # a run directory or its ledger
                refused.append(f"{h.who}: {u.why()} (not read, run or removed)")
            for name, text in _runs(r.stdout).items():
                wd = f"{host.workdir}/{name}"
                try:
                    entries = read_ledger(text)
                except ValueError as e:
                    refused.append(f"{h.who}: {wd}/{LEDGER}: {e}: not run; look at it and "
                                   "remove the directory as root")  # fmt: skip
                    continue
                for entry in reversed(entries):
                    h.run(entry["undo"], check=False, timeout=30)
                    done.append(f"{host.node}: {entry['what']}")
                h.run(["rm", "-rf", "--", wd], timeout=30,
                      guard=guard(h.uid, host.workdir, "use", name))  # fmt: skip
                done.append(f"{host.node}: directory {wd}")
        except UnsafeError as e:
            refused.append(f"{e} (nothing there was read or run)")
        finally:
            h.close()
    return done, refused


def _runs(listing: str) -> dict[str, str]:
    """The run directories and their ledgers' text in a `list` check's output."""
    out: dict[str, str] = {}
    name = None
    for line in listing.splitlines():
        if line.startswith("run\t"):
            name = line.removeprefix("run\t")
            name = name if RUN_NAME.match(name) else None
            if name:
                out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out
