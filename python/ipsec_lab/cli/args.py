"""Argument types and argument groups the commands share: every value a user types is
read here, with an error that names what is wrong (argparse prints it with the option)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ipsec_lab import units
from ipsec_lab.model import pcap as cap
from ipsec_lab.model.ipcomp import AdviceError
from ipsec_lab.model.throughput import FitError, parse_mix
from ipsec_lab.model.transforms import (
    ConfigError,
    Layout,
    SecuredLength,
    parse_configuration,
    parse_lalg,
)

DEFAULT_SIZES = [64, 128, 256, 512, 1024, 1280, 1420]


class UserError(Exception):
    """Bad input found after argument parsing; printed as one line, exit 2."""


# The lab's own errors for bad input: a command prints one line and exits 2. A bare
# ValueError or OSError is not among them: that is a bug or a missing program, and shows
# as one (a traceback, status 1), not as the user's mistake.
USER_ERRORS: tuple[type[Exception], ...] = (
    FitError, ConfigError, cap.CaptureError, units.UnitError, AdviceError,
)  # fmt: skip
# What a value's parser may raise (argparse shows it as the option's error).
PARSE_ERRORS: tuple[type[Exception], ...] = (*USER_ERRORS, ValueError)
# What a command with `user_errors` prints as one line and status 2.
CALL_ERRORS: tuple[type[Exception], ...] = (UserError, *USER_ERRORS)


def arg_type(fn: Any) -> Any:
    """Wrap a parser so argparse prints its message as the error."""

    def wrapped(text: str) -> Any:
        try:
            return fn(text)
        except PARSE_ERRORS as e:  # a value that does not convert
            raise argparse.ArgumentTypeError(str(e)) from None

    wrapped.__name__ = getattr(fn, "__name__", "value")
    return wrapped


def positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be greater than 0")
    return v


# A rate in Mbit/s (100, 100M, 1G, 1.5Gbit/s, 500kbps: bits, SI prefixes; a byte rate is
# refused with the bit spelling suggested) and a size in bytes (1024, 1K, 10MB, 1GiB:
# binary prefixes): the grammar of `ipsec_lab.units`, its errors as argparse's.
rate_mbps = arg_type(units.rate_mbit)


size_bytes = arg_type(units.size_bytes)


def core_share(text: str) -> float:
    """A share of one core: more than 0 and at most 1 (0.8), or a percentage (80%)."""
    t = text.strip()
    pct = t.endswith("%")
    try:
        v = float(t.removesuffix("%")) / (100 if pct else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(
            f"{text}: a share of one core, more than 0 and at most 1 (0.8 or 80%)"
        )
    return v


def non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return v


def span(low: float, high: float | None) -> str:
    return f"at least {low}" if high is None else f"{low} to {high}"


def whole(low: int, high: int | None = None, what: str = "value") -> Any:
    """An argparse type: a whole number from ``low`` (to ``high``), errors naming ``what``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < 0 and low >= 0:
            raise argparse.ArgumentTypeError(f"{v} is negative: {what} must be {span(low, high)}")
        if v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{v}: {what} must be {span(low, high)}")
        return v

    parse.__name__ = what
    return parse


ip_size = whole(20, 65535, "IP packet size")


def size_range(text: str) -> list[int]:
    parts = text.split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"range {text!r}: write START:STOP[:STEP]") from None
    if len(nums) not in (2, 3) or (len(nums) == 3 and nums[2] < 1):
        raise argparse.ArgumentTypeError(f"range {text!r}: write START:STOP[:STEP], STEP >= 1")
    start, stop = nums[0], nums[1]
    step = nums[2] if len(nums) == 3 else 1
    if not 20 <= start <= stop <= 65535:
        raise argparse.ArgumentTypeError(f"range {text!r}: need 20 <= START <= STOP <= 65535")
    if (stop - start) // step > 100_000:
        raise argparse.ArgumentTypeError(f"range {text!r}: more than 100,000 sizes")
    return list(range(start, stop + 1, step))


def mix_arg(text: str) -> tuple[str, tuple[tuple[int, float], ...]]:
    return (text, parse_mix(text))


def add_layout(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("packet layout (for configuration names)")
    g.add_argument(
        "--ipsec-mode",
        choices=["tunnel", "transport"],
        default="tunnel",
        help="IPsec mode (default: tunnel, as a gateway)",
    )
    g.add_argument(
        "--outer", type=int, choices=[4, 6], default=4, help="outer IP version (default: 4)"
    )
    g.add_argument(
        "--inner", type=int, choices=[4, 6], default=4, help="inner IP version (default: 4)"
    )
    g.add_argument(
        "--udp-encap", action="store_true", help="ESP in UDP (RFC 3948, NAT traversal): +8 B"
    )


def layout_of(args: argparse.Namespace) -> Layout:
    return Layout(args.ipsec_mode, args.outer, args.inner, args.udp_encap)


def lalg_of(args: argparse.Namespace) -> SecuredLength:
    return parse_lalg(args.lalg, layout_of(args))


def engine_suite(config: str) -> str:
    cfg = parse_configuration(config)
    if cfg.esp is None or cfg.ipcomp or cfg.ah:
        raise UserError(
            f"{config!r}: the engine benchmark measures one ESP SA, e.g. esp:aes128gcm16"
        )
    enc, integ = cfg.esp
    suite = enc.name if integ.name == "null" else f"{enc.name}-{integ.name}"
    return suite


positive_size = whole(28, 9000, "IP packet size")


def suite_arg(s: str) -> str:
    """An ESP proposal, written as everywhere else: `aes128gcm16` or `esp:aes128gcm16`."""
    import difflib

    from ipsec_lab.algorithms import CIPHERS, ESP_INTEGRITY
    from ipsec_lab.model.transforms import suggest_suite

    enc, integ = list(CIPHERS), list(ESP_INTEGRITY)
    bare = s.strip().lower().removeprefix("esp:")
    if bare.split(":")[0] in ("ah", "ipcomp") or "+" in bare:
        raise argparse.ArgumentTypeError(
            f"{s!r}: --suite times one ESP proposal (aes128gcm16, aes128-sha1); time AH, "
            f"IPComp or a bundle as a whole configuration: --config {s}"
        )
    e, _, i = bare.partition("-")
    if e not in enc or (i and i not in integ):
        close = difflib.get_close_matches(e if e not in enc else i, enc if e not in enc else integ)
        hint = (suggest_suite(bare, enc, integ) if e not in enc else "") or (
            f" (did you mean {' or '.join(close[:2])}?)" if close else ""
        )
        raise argparse.ArgumentTypeError(
            f"{s!r} is not a proposal{hint}: encryption one of {', '.join(enc)}, "
            f"optionally '-' and integrity one of {', '.join(integ)}"
        )
    return bare


DEFAULT_LAB = "lab"


LAB_HELP = f"lab directory holding results.sqlite (default: $IPSEC_LAB_DIR or ./{DEFAULT_LAB})"


def lab_dir(args: argparse.Namespace) -> Path:
    """The lab directory, absolute: every path the lab hands to another program (nginx's
    `-c`/`-p`, charon's and ipsec-gw's configs, tcpdump's capture) derives from it, and a
    relative one means something else to each of them."""
    return Path(args.lab or os.environ.get("IPSEC_LAB_DIR") or DEFAULT_LAB).resolve()


def add_vm_arguments(p: Any) -> None:
    p.add_argument(
        "--vm",
        action="store_true",
        help="run inside a micro-VM (virtme-ng) booted with a kernel that has "
        "ESP, AH, IPComp and netem, for kernels that lack them; KVM where it "
        "works, else emulated (TCG: correct, not fast; figures not comparable)",
    )
    p.add_argument("--vm-kernel", metavar="PATH",
                   help="the kernel --vm boots (default: the newest /boot/vmlinuz-* with "
                   "those modules)")  # fmt: skip


def in_vm(args: argparse.Namespace, command: str) -> int:
    """Run this very command (`--vm` taken off, the lab directory made explicit) in a
    micro-VM whose kernel has IPsec and netem; the lab directory (and `--out`) are
    shared writable, so the results land in this machine's store."""
    from ipsec_lab import vm

    lab = lab_dir(args)
    rw = [lab] + ([Path(args.out).resolve()] if getattr(args, "out", None) else [])
    inner = vm.strip_vm_args(sys.argv[1:])
    if "--lab" in inner:
        i = inner.index("--lab")
        inner[i + 1 : i + 2] = [str(lab)]
    else:
        inner += ["--lab", str(lab)]
    exe = str(Path(sys.argv[0]).resolve())
    try:
        return vm.run([exe, *inner], rw, kernel=args.vm_kernel)
    except vm.VmError as e:
        print(f"ipsec-lab {command}: {e}", file=sys.stderr)
        return 2
