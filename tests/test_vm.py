"""The micro-VM runner's host side: which kernel it boots, when it uses KVM and when it
falls back to emulation (and says so), the `vng` command line, and `--vm` on the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ipsec_lab import vm


def fake_kernel(boot: Path, mods: Path, version: str, with_esp: bool = True) -> Path:
    k = boot / f"vmlinuz-{version}"
    k.parent.mkdir(parents=True, exist_ok=True)
    k.write_bytes(b"kernel")
    for rel in vm.REQUIRED:
        if with_esp or "esp4" not in rel:
            f = mods / version / (rel + ".xz")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(b"")
    return k


def test_the_newest_kernel_with_the_modules_is_booted(tmp_path: Path) -> None:
    boot, mods = tmp_path / "boot", tmp_path / "modules"
    fake_kernel(boot, mods, "6.1.0-9-amd64")
    newest_ok = fake_kernel(boot, mods, "6.1.0-18-amd64")  # 18 > 9, not as text
    fake_kernel(boot, mods, "6.12.0-1-amd64", with_esp=False)  # newer, but no ESP
    assert vm.pick_kernel(None, boot, mods) == newest_ok
    with pytest.raises(vm.VmError, match="no esp4 module"):
        vm.pick_kernel(str(boot / "vmlinuz-6.12.0-1-amd64"), boot, mods)
    with pytest.raises(vm.VmError, match=r"no vmlinuz-\* in .*linux-image-amd64"):
        vm.pick_kernel(None, tmp_path / "empty", mods)


def test_kvm_only_where_the_cpu_can_nest(tmp_path: Path) -> None:
    dev = tmp_path / "kvm"
    cpu = tmp_path / "cpuinfo"
    assert vm.kvm_usable(dev, cpu) == (False, "no /dev/kvm")
    dev.write_bytes(b"")
    cpu.write_text("processor\t: 0\nflags\t\t: fpu sse2 aes avx2\n")
    ok, why = vm.kvm_usable(dev, cpu)
    assert not ok and "no vmx/svm" in why
    cpu.write_text("processor\t: 0\nflags\t\t: fpu sse2 vmx aes\n")
    assert vm.kvm_usable(dev, cpu) == (True, "")


def test_the_vng_command_line(tmp_path: Path) -> None:
    k = tmp_path / "vmlinuz-6.1.0-18-amd64"
    argv = vm.vng_argv(k, "echo hi", kvm=False, rwdirs=[tmp_path / "lab"], vng="/x/vng")
    assert argv[:4] == ["/x/vng", "--run", str(k), "--cpus"]
    assert "--disable-kvm" in argv and "--force-9p" in argv
    assert argv[argv.index("--rwdir") + 1] == str((tmp_path / "lab").resolve())
    assert argv[-2:] == ["--exec", "echo hi"]
    assert "--disable-kvm" not in vm.vng_argv(k, "true", kvm=True)
    inner = vm.inside(["/usr/bin/ipsec-lab", "run", "a b.toml"], {"IPSEC_LAB_VM": "tcg, x"})
    assert "modprobe -q $m" in inner and "esp4" in inner and "sch_netem" in inner
    assert "sysctl -qw net.core.rmem_max=4194304 net.core.wmem_max=4194304; " in inner
    assert inner.endswith("exec env IPSEC_LAB_VM='tcg, x' /usr/bin/ipsec-lab run 'a b.toml'")


def test_vm_arguments_are_taken_off_the_inner_command() -> None:
    argv = ["run", "s.toml", "--vm", "--vm-kernel", "/boot/k", "--lab", "L", "--vm-kernel=/x"]
    assert vm.strip_vm_args(argv) == ["run", "s.toml", "--lab", "L"]


def test_vm_on_the_cli_says_what_is_missing(tmp_path: Path) -> None:
    p = subprocess.run(
        [str(Path(sys.executable).parent / "ipsec-lab"), "run", "scenarios/ours.toml", "--vm",
         "--vm-kernel", str(tmp_path / "vmlinuz-none"), "--lab", str(tmp_path / "lab")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    # root: the kernel named is checked (and virtme-ng's absence, if so, is said first)
    assert "ipsec-lab run:" in p.stderr
    assert "vmlinuz-none: no such kernel image" in p.stderr or "virtme-ng" in p.stderr


def test_run_with_vm_hands_the_vm_the_same_command_with_the_lab_made_explicit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --vm` runs this very command in the VM (the VM itself is booted by
    tests/test_vm_root.py, which runs the campaign there): `--vm` and `--vm-kernel` off,
    a relative `--lab` made absolute, the lab (and `--out`) shared writable. Only the
    boot is replaced here, by a recorder."""
    from ipsec_lab import cli

    seen: list[tuple[list[str], list[Path], str | None]] = []

    def boot(argv: list[str], rw: list[Path], kernel: str | None = None) -> int:
        seen.append((argv, rw, kernel))
        return 0

    monkeypatch.setattr(vm, "run", boot)
    monkeypatch.chdir(tmp_path)
    argv = ["run", "s.toml", "--vm", "--vm-kernel", "/boot/k", "--lab", "lab", "--json"]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/ipsec-lab", *argv])
    assert cli.main(argv) == 0
    ((inner, rw, kernel),) = seen
    lab = str((tmp_path / "lab").resolve())
    assert inner == ["/usr/bin/ipsec-lab", "run", "s.toml", "--lab", lab, "--json"]
    assert rw == [Path(lab)] and kernel == "/boot/k"
    seen.clear()
    argv = ["reproduce", "freeswan", "--quick", "--vm", "--out", "rep"]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/ipsec-lab", *argv])
    monkeypatch.setenv("IPSEC_LAB_DIR", str(tmp_path / "store"))
    assert cli.main(argv) == 0
    ((inner, rw, kernel),) = seen
    store = str((tmp_path / "store").resolve())
    assert inner == ["/usr/bin/ipsec-lab", "reproduce", "freeswan", "--quick", "--out", "rep",
                     "--lab", store]  # fmt: skip
    assert rw == [Path(store), (tmp_path / "rep").resolve()] and kernel is None
