"""One grammar for rates and sizes: a table of spellings and what each means, and the
same answers through every CLI flag and scenario key that takes one."""

from __future__ import annotations

import pytest

from ipsec_lab import scenario, units
from terminal import in_pipe

RATES = [  # spelling, Mbit/s (a bare number is Mbit/s, as every rate flag and key names)
    ("100", 100.0), ("2.204", 2.204), ("100M", 100.0), ("100m", 100.0), ("1G", 1000.0),
    ("1g", 1000.0), ("1.5G", 1500.0), ("1.5Gbit/s", 1500.0), ("1.5 Gbit/s", 1500.0),
    ("500k", 0.5), ("500K", 0.5), ("500kbps", 0.5), ("10mbps", 10.0), ("2.2Mbps", 2.2),
    ("10Mbit", 10.0), ("10Mb", 10.0), ("10Mb/s", 10.0), ("1T", 1e6), ("64000bps", 0.064),
    ("1e3", 1000.0), ("1e3M", 1000.0), (".5G", 500.0),
]  # fmt: skip

BAD_RATES = [  # spelling, words the error must hold
    ("1GB", "write 8G"), ("10MB", "write 80M"), ("10MB/s", "write 80M"),
    ("1MBps", "write 8M"), ("5MiB/s", "write 41.943M"), ("1KB/s", "write 8k"),
    ("-1G", "negative"), ("-5", "negative"), ("0", "greater than 0"), ("fast", "not a rate"),
    ("1X", "not a rate"), ("1Gi", "SI prefixes"), ("", "not a rate"), ("inf", "not a rate"),
]  # fmt: skip

SIZES = [  # spelling, bytes (every prefix binary: KB = KiB = 1024 B, as kB in µs/kB)
    ("0", 0), ("1500", 1500), ("1500B", 1500), ("1500 bytes", 1500), ("1K", 1024),
    ("1k", 1024), ("1KB", 1024), ("1kB", 1024), ("1KiB", 1024), ("64K", 65536),
    ("1.5K", 1536), ("10MB", 10 << 20), ("10M", 10 << 20), ("10MiB", 10 << 20),
    ("1G", 1 << 30), ("1GB", 1 << 30), ("2GiB", 2 << 30), ("1e3", 1000),
]  # fmt: skip

BAD_SIZES = [
    ("-5MB", "negative"), ("-1", "negative"), ("10Mb", "bits"), ("10Mbit", "bits"),
    ("ten", "not a size"), ("5i", "after a prefix"), ("1X", "not a size"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "mbit"), RATES)
def test_rate_spellings(text: str, mbit: float) -> None:
    assert units.rate_mbit(text) == pytest.approx(mbit)


@pytest.mark.parametrize(("text", "words"), BAD_RATES)
def test_bad_rates_say_what_to_write(text: str, words: str) -> None:
    with pytest.raises(units.UnitError) as e:
        units.rate_mbit(text)
    assert words in str(e.value)


@pytest.mark.parametrize(("text", "n"), SIZES)
def test_size_spellings(text: str, n: int) -> None:
    assert units.size_bytes(text) == n


@pytest.mark.parametrize(("text", "words"), BAD_SIZES)
def test_bad_sizes_say_what_to_write(text: str, words: str) -> None:
    with pytest.raises(units.UnitError) as e:
        units.size_bytes(text)
    assert words in str(e.value)


def test_the_suggested_bit_spelling_reads_back_as_the_byte_rate() -> None:
    """`10MB/s` suggests `80M`; that spelling is 10 MB/s in bits."""
    for text, bytes_per_s in (("10MB/s", 10e6), ("5MiB/s", 5 * 2**20), ("1GB", 1e9)):
        with pytest.raises(units.UnitError) as e:
            units.rate_bps(text)
        suggested = str(e.value).split("write ")[1].split()[0]
        assert units.rate_bps(suggested) == pytest.approx(bytes_per_s * 8, rel=1e-5)


@pytest.mark.parametrize(("text", "mbit"), [("100M", 100.0), ("1.5G", 1500.0), ("500k", 0.5)])
def test_every_rate_flag_and_key_reads_the_same(text: str, mbit: float) -> None:
    """A scenario key, `model predict --r-alg-mbps`, `--point SIZE:RATE`, `plan
    --target-mbps` and `advise ipcomp --link-mbps` all read a spelling alike."""
    link = scenario.parse(f"[[links]]\nname = 'x'\nrate_mbit = '{text}'", "x.toml").links[0]
    assert link.rate_mbit == pytest.approx(mbit)
    udp = scenario.parse(f"[[workloads]]\nkind = 'udp'\nrate_mbit = '{text}'", "x.toml")
    assert udp.workloads[0].rate_mbit == pytest.approx(mbit)
    import json

    rc, out = in_pipe(["model", "predict", "--t-fix-ms", "0", "--r-alg-mbps", text, "--lalg",
                       "ip", "--size", "1000", "--json"])  # fmt: skip
    assert rc == 0 and json.loads(out)["model"]["r_alg_mbps"] == pytest.approx(mbit), out
    rc, out = in_pipe(["model", "fit", "--lalg", "ip", "--point", f"100:{text}", "--point",
                       f"1000:{text}", "--json"])  # fmt: skip
    assert rc == 0, out
    assert [p["mbps"] for p in json.loads(out)["points"]] == pytest.approx([mbit, mbit])
    rc, out = in_pipe(["plan", "--cycles-per-byte", "10", "--target-mbps", text, "--json"])
    assert rc == 0 and json.loads(out)["target_mbps"] == pytest.approx(mbit), out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["plan", "--cycles-per-byte", "10", "--target-mbps", "1GB"], "write 8G"),
        (["advise", "ipcomp", "--reduction-pct", "40", "--link-mbps", "10MB"], "write 80M"),
        (["model", "predict", "--t-fix-ms", "0.4", "--r-alg-mbps", "21.2MB", "--size", "64"],
         "write 169.6M"),
        (["model", "fit", "--point", "128:2.2MB", "--point", "1280:11"], "write 17.6M"),
        (["overhead", "--config", "aes128gcm16", "--transfer", "-5MB"], "negative"),
        (["overhead", "--config", "aes128gcm16", "--transfer", "10Mb"], "reads as bits"),
    ],
)  # fmt: skip
def test_cli_refuses_byte_rates_and_bad_sizes_in_one_line(args: list[str], words: str) -> None:
    rc, out = in_pipe(args)
    assert rc == 2 and words in out.splitlines()[0], out
    assert len(out.splitlines()) == 2


def test_transfer_takes_g_and_binary_prefixes() -> None:
    import json

    rc, out = in_pipe(["overhead", "--config", "aes128gcm16", "--transfer", "1G", "--json"])
    assert rc == 0, out
    doc = json.loads(out)
    assert doc["transfers"][0]["bytes"] == 1 << 30
