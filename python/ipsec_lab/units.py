"""One grammar for rates and sizes, for every CLI flag and scenario key that takes one.

Rates are **bits per second** with SI prefixes, as iperf3's ``-b``: ``100M``, ``1G``,
``1.5Gbit/s``, ``500kbps``, ``2.2Mbps``. A bare number is in the unit the flag or key
names (``--target-mbps 100``, ``rate_mbit = 100``: Mbit/s). A byte rate (``10MB``,
``1MB/s``, ``5MiB/s``, ``8MBps``) is refused with the bit spelling suggested: it is never
read as bits.

Sizes are **bytes**; every prefix is binary, as iperf3's ``-n`` and the kB in the lab's
CPU effort (µs per kB): ``1K`` = ``1KB`` = ``1KiB`` = 1024 B, ``M``/``MB``/``MiB`` =
1024², ``G``/``GB``/``GiB`` = 1024³. A size in bits (``10Mb``, ``10Mbit``) is refused
with the byte spelling suggested.

Both name a negative value as negative and say what a value must be; the errors are
``UnitError`` (a ``ValueError``), which the CLI prints as the option's error and the
scenario reader as the key's.
"""

from __future__ import annotations

import math
import re

RATE_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
SIZE_PREFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

_NUM = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
# number, prefix (k M G T, either case; "Ki" "Mi"... in byte spellings), unit.
_RATE = re.compile(rf"({_NUM})\s*([kKmMgGtT]?)(i?)\s*(bit/s|bits/s|bps|bit|b/s|b|B/s|Bps|B|)")
_SIZE = re.compile(rf"({_NUM})\s*([kKmMgGtT]?)(i?)\s*(bytes|byte|B|bits|bit|b|)")


class UnitError(ValueError):
    """A rate or size that cannot be read; the message says what to write instead."""


RATE_SPELLING = "write bits per second with an SI prefix, e.g. 100M, 1G, 1.5Gbit/s, 500kbps"
SIZE_SPELLING = (
    "write bytes, or a number with K, M or G (KB = KiB = 1024 B), e.g. 1500, 64K, 10MB, 1G"
)


def _parts(pattern: re.Pattern[str], text: str, what: str, spelling: str) -> tuple[str, ...]:
    """(number, prefix, "i" or "", unit) of `text`, or the error saying how to write one."""
    m = pattern.fullmatch(text.strip())
    if not m:
        raise UnitError(f"{text!r} is not a {what}: {spelling}")
    if m.group(3) and not m.group(2):
        raise UnitError(f"{text!r} is not a {what}: 'i' goes after a prefix (Ki, Mi, Gi)")
    return m.groups()


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def si_rate(bps: float) -> str:
    """A rate in bit/s as the CLI reads it back: ``80M``, ``1.5G``, ``500k``."""
    for p, m in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(bps) >= m:
            return f"{_fmt(bps / m)}{p}"
    return f"{_fmt(bps)}bit/s"


def rate_bps(text: str | float | int, bare: float = 1e6, positive: bool = True) -> float:
    """A rate in bit/s. `bare`: what a number without prefix or unit is worth in bit/s
    (Mbit/s by default, as every rate flag and key is named). `positive`: refuse 0."""
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a rate")
    if isinstance(text, (int, float)):
        v = float(text) * bare
        s = _fmt(float(text))
    else:
        s = text.strip()
        num, prefix, binary, unit = _parts(_RATE, text, "rate", RATE_SPELLING)
        n = float(num)
        if unit in ("B/s", "Bps", "B"):
            scale = 1 << (10 * "_kmgt".index(prefix.lower())) if binary else 1
            bits = n * 8 * (scale if binary else RATE_PREFIX[prefix.lower()])
            raise UnitError(
                f"{text!r} is a rate in bytes per second; rates are bits per second: "
                f"write {si_rate(bits)} for {s}, or {num}{prefix.upper()} if you meant "
                f"{num} {prefix.upper()}bit/s"
            )
        if binary:
            raise UnitError(f"{text!r}: a rate takes SI prefixes (k, M, G), not {prefix}i")
        v = n * (RATE_PREFIX[prefix.lower()] if (prefix or unit) else bare)
    if not math.isfinite(v):
        raise UnitError(f"{s!r} is not a finite rate")
    if v < 0:
        raise UnitError(f"{s!r} is negative: a rate must be greater than 0")
    if positive and v == 0:
        raise UnitError(f"{s!r}: a rate must be greater than 0")
    return v


def rate_mbit(text: str | float | int, positive: bool = True) -> float:
    """A rate in Mbit/s, a bare number read as Mbit/s (see `rate_bps`)."""
    return rate_bps(text, 1e6, positive) / 1e6


def size_bytes(text: str | int | float, positive: bool = False) -> int:
    """A size in bytes (binary prefixes, see the module's doc). `positive`: refuse 0.
    A fraction of a byte is rounded down (``1.5K`` is 1536 B)."""
    if isinstance(text, bool):
        raise UnitError(f"{text!r} is not a size")
    if isinstance(text, float) and not text.is_integer():
        raise UnitError(f"{text!r} is not a whole number of bytes")
    if isinstance(text, (int, float)):
        v = float(text)
        s = str(text)
    else:
        s = text.strip()
        num, prefix, _, unit = _parts(_SIZE, text, "size", SIZE_SPELLING)
        if unit in ("b", "bit", "bits"):
            raise UnitError(
                f"{text!r} reads as bits; sizes are bytes: write {num}{prefix.upper()}B"
            )
        v = float(num) * SIZE_PREFIX[prefix.lower()]
    if not math.isfinite(v):
        raise UnitError(f"{s!r} is not a finite size")
    if v < 0:
        raise UnitError(f"{s!r} is negative: a size is a number of bytes, 0 or more")
    if positive and v < 1:
        raise UnitError(f"{s!r}: the size must be at least 1 byte")
    return int(v)


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 core`, `6 cores`: a count with its noun agreeing."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
