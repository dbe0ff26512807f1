"""A micro-VM for kernels that lack IPsec: `--vm` runs a lab command inside a VM booted
with a distribution kernel that has ESP, AH, IPComp and netem.

virtme-ng (`vng`) boots an installed kernel in QEMU with the host's root filesystem
shared read-only (writable overlays, a fresh /tmp and /run), and runs one command; the
lab directory is shared writable (`--rwdir`), so its SQLite store is the host's and
`results`, `report` and `--resume` work as for any campaign. The command runs as root in
the VM, with the kernel's IPsec modules loaded first.

KVM is used only when it can work: /dev/kvm usable and the CPU exposing `vmx` or `svm`
(on a machine without nested virtualisation the guest hangs after decompression).
Otherwise QEMU emulates the CPU (TCG): correct, but several times slower — its figures
are for correctness and impairment, never comparable with the host's, and every run
records which (`IPSEC_LAB_VM` in the campaign's environment).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# What the lab's IPsec and links need from the kernel; loaded before the command runs.
MODULES = (
    "esp4", "esp6", "ah4", "ah6", "ipcomp", "ipcomp6", "xfrm_user", "xfrm4_tunnel",
    "xfrm6_tunnel", "tunnel4", "tunnel6", "sch_netem", "sch_tbf", "tun", "veth", "wireguard",
)  # fmt: skip
# A kernel is usable when its modules directory has these (compressed or not).
REQUIRED = ("kernel/net/ipv4/esp4.ko", "kernel/net/ipv4/ah4.ko", "kernel/net/sched/sch_netem.ko")
INSTALL_HINT = (
    "install Debian's kernel, QEMU and a static busybox (apt-get install linux-image-amd64 "
    "qemu-system-x86 busybox-static; `make deps` does) and virtme-ng (in the venv)"
)


class VmError(Exception):
    """The VM cannot be run here (the message says why and what to do)."""


def _version(kernel: Path) -> str:
    return kernel.name.removeprefix("vmlinuz-")


def _version_key(v: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\-+]", v)]


def kernel_ok(kernel: Path, modules_root: Path = Path("/lib/modules")) -> tuple[bool, str]:
    """Whether `kernel` can run the lab: its image is readable and its modules include
    ESP, AH and netem. (ok, why not)."""
    if not kernel.is_file():
        return False, f"{kernel}: no such kernel image"
    if not os.access(kernel, os.R_OK):
        return False, f"{kernel}: not readable (run as root)"
    mods = modules_root / _version(kernel)
    for rel in REQUIRED:
        if not any(mods.glob(rel + "*")):
            return False, f"{kernel}: no {Path(rel).stem} module in {mods}"
    return True, ""


def pick_kernel(
    explicit: str | None = None,
    boot: Path = Path("/boot"),
    modules_root: Path = Path("/lib/modules"),
) -> Path:
    """The kernel to boot: `explicit` (checked), else the newest /boot/vmlinuz-* that has
    the modules. Raises `VmError` naming what is missing."""
    if explicit:
        k = Path(explicit)
        ok, why = kernel_ok(k, modules_root)
        if not ok:
            raise VmError(f"--vm-kernel {explicit}: {why}")
        return k
    found = sorted(boot.glob("vmlinuz-*"), key=lambda p: _version_key(_version(p)), reverse=True)
    reasons = []
    for k in found:
        ok, why = kernel_ok(k, modules_root)
        if ok:
            return k
        reasons.append(why)
    detail = "; ".join(reasons) if reasons else f"no vmlinuz-* in {boot}"
    raise VmError(f"no kernel with ESP, AH and netem to boot ({detail}): {INSTALL_HINT}")


def kvm_usable(
    dev: Path = Path("/dev/kvm"), cpuinfo: Path = Path("/proc/cpuinfo")
) -> tuple[bool, str]:
    """Whether KVM can boot the guest here; (usable, why not)."""
    if not dev.exists():
        return False, "no /dev/kvm"
    if not os.access(dev, os.R_OK | os.W_OK):
        return False, "/dev/kvm is not usable by this user"
    try:
        flags = cpuinfo.read_text()
    except OSError as e:
        return False, f"cannot read {cpuinfo}: {e}"
    if not re.search(r"^flags\s*:.*\b(vmx|svm)\b", flags, re.M):
        return False, "the CPU exposes no vmx/svm flag (no nested virtualisation)"
    return True, ""


def vng_binary() -> str | None:
    """virtme-ng's `vng`: beside this Python (the venv's) or on PATH."""
    here = Path(sys.executable).parent / "vng"
    if here.exists():
        return str(here)
    return shutil.which("vng")


def inside(argv: Sequence[str], env: dict[str, str]) -> str:
    """The shell command the VM runs: load the modules (those the kernel builds in are
    skipped), raise the kernel's cap on socket buffers to what the UDP workloads ask for
    (a stock kernel's 212992 B makes `iperf3 -w` refuse; the cap is global, not a
    namespace's, and the VM is thrown away after), then `argv` with `env`, from the
    current directory."""
    from ipsec_lab.testbed.interface import UDP_SOCKET_BUFFER_BYTES as buf

    mods = " ".join(MODULES)
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (
        f"for m in {mods}; do modprobe -q $m 2>/dev/null; done; "
        f"sysctl -qw net.core.rmem_max={buf} net.core.wmem_max={buf}; "
        f"cd {shlex.quote(os.getcwd())} && exec env {envs} {shlex.join(argv)}"
    )


def vng_argv(
    kernel: Path,
    command: str,
    kvm: bool,
    rwdirs: Sequence[Path] = (),
    cpus: int = 2,
    memory: str = "2G",
    vng: str = "vng",
) -> list[str]:
    """The `vng` command line that boots `kernel` and runs `command` in it."""
    argv = [vng, "--run", str(kernel), "--cpus", str(cpus), "--memory", memory, "--force-9p"]
    if not kvm:
        argv.append("--disable-kvm")
    for d in rwdirs:
        argv += ["--rwdir", str(Path(d).resolve())]
    return [*argv, "--exec", command]


def run(
    argv: Sequence[str],
    rwdirs: Sequence[Path],
    kernel: str | None = None,
    timeout: float | None = None,
) -> int:
    """Run `argv` (a lab command) in the VM; its exit status. The VM's console goes to
    this process's output."""
    if os.geteuid() != 0:
        raise VmError("--vm needs root (the VM's lab runs as root, sharing this machine's files)")
    vng = vng_binary()
    if vng is None:
        raise VmError(f"virtme-ng (`vng`) is not installed: {INSTALL_HINT}")
    if shutil.which("qemu-system-x86_64") is None:
        raise VmError(f"QEMU is not installed: {INSTALL_HINT}")
    k = pick_kernel(kernel)
    kvm, why = kvm_usable()
    mode = "kvm" if kvm else "tcg"
    note = f"{mode}, kernel {_version(k)}" + ("" if kvm else f" (emulated: {why})")
    print(f"ipsec-lab: in a VM ({note}); figures from TCG are not comparable with the host's",
          file=sys.stderr)  # fmt: skip
    for d in rwdirs:
        Path(d).mkdir(parents=True, exist_ok=True)
    env = {
        "IPSEC_LAB_VM": note,
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        # the host's home is read-only in the VM; matplotlib (the report) caches in /tmp
        "MPLCONFIGDIR": "/tmp/ipsec-lab-matplotlib",
    }
    cmd = vng_argv(k, inside(argv, env), kvm, rwdirs, vng=vng)
    # vng runs virtme-ng's other programs (virtme-run) from its own directory
    host_env = dict(os.environ)
    host_env["PATH"] = f"{Path(vng).parent}:{host_env.get('PATH', '/usr/bin:/bin')}"
    try:
        return subprocess.run(cmd, check=False, timeout=timeout, env=host_env).returncode
    except subprocess.TimeoutExpired:
        print(f"ipsec-lab: the VM ran past {timeout:g} s and was stopped", file=sys.stderr)
        return 124


def strip_vm_args(argv: Sequence[str]) -> list[str]:
    """`argv` without `--vm` and `--vm-kernel PATH` (the command the VM runs)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--vm":
            continue
        if a == "--vm-kernel":
            skip = True
            continue
        if a.startswith("--vm-kernel="):
            continue
        out.append(a)
    return out
