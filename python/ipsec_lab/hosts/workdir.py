"""The lab's work directory on a host, and why it can be trusted: the lab runs commands
as root there (the ledger's undo lines, the programs it pushes, files it writes), so it
uses only a directory that no one but root (or the user the lab logs in as) can write —
the directory itself and every one above it, up to `/`, and again along the path a
symbolic link on the way resolves to. A directory above that root owns with the sticky
bit (`/tmp`, `/var/tmp`) is allowed: others may add entries there but not rename or
remove one they do not own. The work directory, each run's directory in it and each
ledger must be root's (or the login user's) and not writable by group or others.

The check is one POSIX `sh` snippet with coreutils' `stat` and `readlink` (no Python
is assumed on a host), run as root in the same ssh round trip as what it guards:

- `make NAME` at the start of a run: the work directory checked (the part that does
  not exist yet made by root, 0700, then checked again), the run's directory `NAME`
  made 0700 (it must not exist) with an empty ledger;
- `use NAME` before each use (put in front of a command that names the run's directory:
  pushing a file, running a pushed program, appending to the ledger, fetching logs,
  teardown): nothing is printed when all is well, so the command's output is its own;
- `list NODE` for `clean --hosts`: every run directory of that node that holds a ledger,
  each checked (the directory and its ledger) before its ledger is printed;
- `check` for `hosts check`: read-only, nothing is made.

A refusal is a line on stderr (`MARK`, what is wrong, the path, its owner and mode) and
exit status GUARD_EXIT; `refusals` reads them back and `UnsafeError` words them with
the fix.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import NamedTuple

from ipsec_lab.testbed.build import LabError

DEFAULT_WORKDIR = "/var/lib/ipsec-lab"
LEDGER = "ledger"
GUARD_EXIT = 97
MARK = "ipsec-lab-unsafe"
# What a work directory may be spelled with (the hosts file is checked against it, and a
# symbolic link on the way must resolve to such a path).
WORKDIR_CHARS = re.compile(r"^/[A-Za-z0-9._+@/-]+$")
# A run's directory: the run's token (6 hex digits) and the node's name.
RUN_NAME = re.compile(r"^[0-9a-f]{6}-[A-Za-z0-9]+$")

SCRIPT = (
    r"""
set -f
u=$1 wd=$2 op=$3 arg=$4
nl='
'
ifs0=$IFS
no() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' MARK "$1" "$2" "$3" "$4" "$5" "$6" >&2; }
# look WANT PATH...: each path root's or the login user's, and not writable by group or
# others; every path but the last is a directory above (a symbolic link or a directory;
# a root-owned sticky one may be writable by others), the last is WANT: dir (the work
# directory: a directory, or a symbolic link whose target is looked at by its resolved
# path), run (a directory, never a link) or file (a regular file, never a link)
look() {
  want=$1; shift
  n=$#; i=0
  [ $n -gt 0 ] || return 0
  s=$(stat -c '%u|%U|%a|%F|%n' -- "$@") || { no unreadable "$1" - - - -; return 1; }
  while IFS='|' read -r uid user mode type name; do
    i=$((i + 1))
    role=anc
    [ $i -eq $n ] && role=$want
    if [ "$uid" != 0 ] && [ "$uid" != "$u" ]; then
      no owner "$name" "$user" "$uid" "$mode" "$type"; return 1
    fi
    case $type:$role in
      "symbolic link:anc"|"symbolic link:dir") linked=1; continue ;;
      directory:anc|directory:dir|directory:run) ;;
      "regular file:file"|"regular empty file:file") ;;
      *) no type "$name" "$user" "$uid" "$mode" "$type"; return 1 ;;
    esac
    if [ $((0$mode & 022)) -ne 0 ]; then
      if [ $role = anc ] && [ "$uid" = 0 ] && [ $((0$mode & 01000)) -ne 0 ]; then
        continue
      fi
      no mode "$name" "$user" "$uid" "$mode" "$type"; return 1
    fi
  done <<EOF
$s
EOF
}
# parts PATH: / and each existing prefix of PATH, top down, into $list; the first
# prefix that does not exist into $missing
parts() {
  list=/ missing= p= rest=${1#/}
  while [ -n "$rest" ]; do
    c=${rest%%/*}
    case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
    [ -n "$c" ] || continue
    p=$p/$c
    if [ -e "$p" ] || [ -h "$p" ]; then list=$list$nl$p; else missing=$p; return 0; fi
  done
}
# walk PATH [new]: PATH and every directory above it (with new: the part of it that
# does not exist yet is allowed, and whatever does is looked at)
walk() {
  parts "$1"
  if [ -n "$missing" ] && [ "$2" != new ]; then no missing "$missing" - - - -; return 1; fi
  w=dir
  [ -n "$missing" ] && w=anc
  IFS=$nl; set -- "$w" $list; IFS=$ifs0
  look "$@"
}
# chain [new]: the work directory walked, and again along the path it resolves to (no
# symbolic link on the way and no . or .. in it: it resolves to itself, no readlink)
chain() {
  linked=
  walk "$wd" "$1" || return 1
  m0=$missing
  if [ -z "$linked" ]; then
    case $wd in
      *//*|*/./*|*/../*|*/.|*/..|*/) ;;
      *) return 0 ;;
    esac
  fi
  r=$(readlink -m -- "$wd") || { no unreadable "$wd" - - - -; return 1; }
  [ "$r" = "$wd" ] && return 0
  case $r in
    /*[!A-Za-z0-9._+@/-]*|[!/]*) no odd "$r" - - - -; return 1 ;;
  esac
  walk "$r" "$1"
}
case $op in
  check)
    chain new || exit GUARD_EXIT
    if [ -n "$m0" ]; then
      printf 'missing\t%s\n' "$m0"; d=${m0%/*}
    else
      d=$wd
    fi
    [ -w "${d:-/}" ] || printf 'readonly\t%s\n' "${d:-/}" ;;
  make)
    chain new || exit GUARD_EXIT
    if [ -n "$m0" ]; then
      (umask 077 && mkdir -p -- "$wd") || exit 1
      chain || exit GUARD_EXIT
    fi
    (umask 077 && mkdir -- "$wd/$arg") || exit 1
    look run "$wd/$arg" || exit GUARD_EXIT
    (umask 077 && : >> "$wd/$arg/LEDGER") || exit 1 ;;
  use)
    chain || exit GUARD_EXIT
    look run "$wd/$arg" || exit GUARD_EXIT ;;
  list)
    chain new || exit GUARD_EXIT
    [ -n "$m0" ] && exit 0
    set +f
    for d in "$wd"/*-"$arg"; do
      rn=${d##*/}
      case $rn in
        [0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-"$arg") ;;
        *) continue ;;
      esac
      [ -e "$d/LEDGER" ] || [ -h "$d/LEDGER" ] || continue
      if look run "$d" && look file "$d/LEDGER"; then
        printf 'run\t%s\n' "$rn"; cat -- "$d/LEDGER"; printf '\n'
      fi
    done ;;
  *) exit 2 ;;
esac
exit 0
""".replace("MARK", MARK)
    .replace("GUARD_EXIT", str(GUARD_EXIT))
    .replace("LEDGER", LEDGER)
)


class Guard(NamedTuple):
    """A check to run on a host before a command: the shell line (for whatever shell
    the login has), the same check for a line that `sh` itself reads (a subshell: one
    program started fewer), and the work directory it checks (for the message)."""

    line: str
    workdir: str
    in_sh: str


def guard(uid: int, workdir: str, op: str, arg: str = "") -> Guard:
    """The check of `workdir` on a host (run as root there), for the login user `uid`:
    `op` is make, use, list or check, `arg` the run's directory name (make, use) or the
    node (list)."""
    args = [str(uid), workdir, op, arg]
    return Guard(shlex.join(["sh", "-c", SCRIPT, "sh", *args]), workdir,
                 f"(set -- {shlex.join(args)}\n{SCRIPT}\n)")  # fmt: skip


@dataclass(frozen=True)
class Unsafe:
    """One path the check refused, as the host's `stat` saw it."""

    kind: str  # owner | mode | type | missing | odd | unreadable
    path: str
    user: str = "-"
    uid: str = "-"
    mode: str = "-"
    type: str = "-"

    def why(self) -> str:
        """What is wrong with it, and what to do."""
        p = self.path
        who = f"{self.user} (uid {self.uid}), mode {self.mode}"
        away = (f"or set `workdir` in the hosts file to a directory only root can write "
                f"(the default {DEFAULT_WORKDIR})")  # fmt: skip
        if self.kind == "owner":
            return (f"{p} is owned by {who}, not by root or the login user: another user "
                    f"made it, and the lab runs commands as root from there. Look at what "
                    f"it holds and remove it as root, {away}")  # fmt: skip
        if self.kind == "mode":
            return (f"{p} is writable by group or others (owner {who}): whoever can write "
                    f"it can put their own files where the lab runs commands as root. "
                    f"`chmod go-w {shlex.quote(p)}`, {away}")  # fmt: skip
        if self.kind == "type":
            return (f"{p} is a {self.type} (owner {who}), not what the lab made there: "
                    f"look at it and remove it as root, {away}")  # fmt: skip
        if self.kind == "missing":
            return f"{p} does not exist (it did when the run started): the lab makes it only once"
        if self.kind == "odd":
            return f"a symbolic link on the way resolves to {p!r}, not a plain path: {away}"
        return f"{p} cannot be looked at (stat failed): {away}"


def refusals(stderr: str) -> list[Unsafe]:
    """The refusals a check printed (none: it passed)."""
    out = []
    for line in stderr.splitlines():
        f = line.split("\t")
        if len(f) == 7 and f[0] == MARK:
            out.append(Unsafe(*f[1:]))
    return out


class UnsafeError(LabError):
    """A work or run directory the lab will not use: `str()` names the host, the path,
    its owner and mode, and the fix."""

    def __init__(self, who: str, workdir: str, found: list[Unsafe]) -> None:
        why = found[0].why() if found else "the check failed without saying why"
        super().__init__(f"{who}: work directory {workdir}: {why}")
        self.who = who
        self.workdir = workdir
        self.found = found


def valid_workdir(path: str) -> str | None:
    """Why `path` cannot be a work directory (None: it can): absolute, spelled plainly,
    no `.` or `..`, and not `/` itself."""
    if not path.startswith("/"):
        return f"must be an absolute path, not {path!r}"
    if path.strip("/") == "":
        return "must be a directory under /, not / itself (each run's directory goes in it)"
    if not WORKDIR_CHARS.match(path):
        return f"{path!r}: only letters, digits and . _ + @ - / (a path the lab can check)"
    parts = path.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts):
        return f"{path!r}: no empty, `.` or `..` component, and no trailing /"
    return None
