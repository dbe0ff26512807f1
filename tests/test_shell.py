"""The kept shell a host's commands go through (hosts/shell.py), against a local `sh` in
place of ssh: the same bytes on its stdin and out of its stdout/stderr as over a
connection. The hosts tests (test_hosts_root.py, tests/vm/hosts.py) take it through a
real sshd."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path

import pytest

from ipsec_lab.hosts.shell import Shell, ShellEnded, ShellTimeout
from netutil import poll_until


@pytest.fixture
def shell() -> object:
    s = Shell(["sh"])
    with s.lock:
        yield s
        s.close()


def test_output_status_and_errors_come_back_to_the_byte(shell: Shell) -> None:
    assert shell.run("printf 'a\\nb'", None, 10) == (0, b"a\nb", b"")  # no newline at the end
    assert shell.run("printf 'a\\n\\n'", None, 10) == (0, b"a\n\n", b"")
    assert shell.run("true", None, 10) == (0, b"", b"")
    assert shell.run("echo out; echo err >&2; exit 7", None, 10) == (7, b"out\n", b"err\n")
    # every byte value, on both streams
    every = bytes(range(256))
    line = "printf '" + "".join(f"\\{b:03o}" for b in every) + "' | tee /dev/stderr"
    assert shell.run(line, None, 10) == (0, every, every)
    # output that looks like a marker is output
    assert shell.run("echo '\nabc 0'", None, 10) == (0, b"\nabc 0\n", b"")


def test_a_command_ends_only_its_own_shell(shell: Shell) -> None:
    """`exit`, `cd`, variables and a syntax error stay in the command's own `sh -c`."""
    assert shell.run("cd /; X=1; exit 3", None, 10)[0] == 3
    status, out, err = shell.run("if then", None, 10)
    assert status == 2 and out == b"" and b"yntax error" in err
    assert shell.run('echo "$PWD ${X:-unset}"', None, 10) == (
        0,
        f"{os.getcwd()} unset\n".encode(),
        b"",
    )


def test_a_line_of_words_runs_in_a_subshell_that_changes_nothing_after_it(shell: Shell) -> None:
    """A line of quoted words (`words=True`, no `sh -c`): a builtin's `exit`, `cd`,
    `umask`, `exec` or variable stays in its subshell, and the session goes on."""
    umask = shell.run("umask", None, 10)[1]
    shell.run("true", None, 10)
    p = shell._p
    assert shell.run(shlex.join(["exit", "3"]), None, 10, words=True)[0] == 3
    for argv in (["cd", "/"], ["umask", "077"], ["export", "X=1"], ["exec", "true"],
                 ["set", "-e"]):  # fmt: skip
        assert shell.run(shlex.join(argv), None, 10, words=True)[:2] == (0, b""), argv
    # a trap fires as its own subshell ends, never after a later command
    trap = shlex.join(["trap", "echo trapped", "EXIT"])
    assert shell.run(trap, None, 10, words=True) == (0, b"trapped\n", b"")
    assert shell._p is p  # the same session throughout
    assert shell.run('echo "$PWD ${X:-unset}"; umask', None, 10) == (
        0, f"{os.getcwd()} unset\n".encode() + umask, b"")  # fmt: skip
    # quoted words stay words: what would be syntax or an operator is an argument
    assert shell.run(shlex.join(["echo", "if", "then", ";", "|", "$(x)", "'"]), None, 10,
                     words=True) == (0, b"if then ; | $(x) '\n", b"")  # fmt: skip
    data = bytes(range(256))
    assert shell.run(shlex.join(["cat"]), data, 10, words=True) == (0, data, b"")
    assert shell.run(shlex.join(["cat"]), None, 10, words=True) == (0, b"", b"")


def test_input_goes_to_the_command_and_no_command_reads_the_next(shell: Shell) -> None:
    data = bytes(range(256)) * 40 + b"no newline"
    assert shell.run("cat", data, 10) == (0, data, b"")
    assert shell.run("cat", b"", 10) == (0, b"", b"")
    # without input a command reading stdin gets end-of-file, not the commands after it
    assert shell.run("cat; echo read-all", None, 10) == (0, b"read-all\n", b"")
    assert shell.run("echo next", None, 10) == (0, b"next\n", b"")


def test_a_command_past_its_timeout_ends_the_session_and_the_next_starts_one(
    shell: Shell,
) -> None:
    shell.run("true", None, 10)
    first = shell._p
    with pytest.raises(ShellTimeout):
        shell.run("sleep 30", None, 0.5)
    assert first is not None and first.poll() is not None  # the session is gone
    assert shell.run("echo again", None, 10) == (0, b"again\n", b"")
    assert shell._p is not first


def test_a_session_that_ends_before_the_marker_is_said_and_the_next_is_new(shell: Shell) -> None:
    shell.run("true", None, 10)
    with pytest.raises(ShellEnded) as e:
        shell.run("echo going >&2; kill -9 $PPID", None, 10)  # the kept sh itself
    assert e.value.status == -signal.SIGKILL and "going" in e.value.stderr
    assert shell.run("echo back", None, 10) == (0, b"back\n", b"")


def test_output_a_command_left_behind_is_never_taken_for_a_later_commands(
    shell: Shell, tmp_path: Path
) -> None:
    """A process an earlier command left running that writes after it ended: its bytes
    are found before the next command is sent (a new session is started), never
    returned as the next command's output."""
    written = tmp_path / "written"
    line = f"(sleep 0.3; echo late; : > {shlex.quote(str(written))}) & echo now"
    assert shell.run(line, None, 10) == (0, b"now\n", b"")
    poll_until("the left-behind process to write", written.exists)  # its bytes are out
    before = shell._p
    assert shell.run("printf file-bytes", None, 10) == (0, b"file-bytes", b"")
    assert shell._p is not before
    assert shell.run("echo fine", None, 10) == (0, b"fine\n", b"")


def test_input_that_cannot_be_decoded_fails_the_command_instead_of_emptying_it(
    tmp_path: Path,
) -> None:
    """Without `base64` on the host the command is not run on empty input: its status
    says the decode failed."""
    for tool in ("sh", "cat", "mktemp", "rm"):  # a host with these and no base64
        (tmp_path / tool).symlink_to(shutil.which(tool) or tool)
    s = Shell(["env", f"PATH={tmp_path}", "sh"])
    with s.lock:
        try:
            status, out, _ = s.run("/bin/cat > /dev/null; echo ran", b"important\n", 10)
        finally:
            s.close()
    assert status != 0 and out == b""
