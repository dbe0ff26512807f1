"""The Python face of the engine: known answers through the bindings, errors that name
what is wrong, keys kept out of repr, named drops, stage timing, and a stub that matches."""

from __future__ import annotations

import pytest

from ipsec_lab import DropError, SecurityAssociation, _native

# RFC 3602 §4 case 7: AES-128-CBC tunnel-mode ESP (SPI 0x8765, seq 2).
RFC3602_7 = dict(
    key="0123456789abcdef0123456789abcdef",
    iv="f4e765244f6407adf13dc1380f673f37",
    payload="45000054090400004001f988c0a87b03c0a87bc808009f76a90a0100b49c083d02a204000809"
    "0a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637",
    esp="0000876500000002f4e765244f6407adf13dc1380f673f37773b5241a4c449225e4f3ce5ed611b0c"
    "237ca96cf74a93013c1b0ea1a0cf70f8e4ecaec78ac53aad7a0f022b859243c647752e94a859352b"
    "8a4d4d2decd136e5c177f132ad3fbfb2201ac9904c74ee0a109e0ca1e4dfe9d5a100b842f1c22f0d",
)


def test_rfc3602_case7_through_the_bindings() -> None:
    tx = SecurityAssociation(0x8765, "aes128", enc_key=RFC3602_7["key"], mode="transport")
    esp = tx.seal_esp(
        bytes.fromhex(RFC3602_7["payload"]), 4, iv=bytes.fromhex(RFC3602_7["iv"]), seq=2
    )
    assert esp.hex() == RFC3602_7["esp"]
    rx = SecurityAssociation(
        0x8765, "aes128", enc_key=bytes.fromhex(RFC3602_7["key"]), mode="transport"
    )
    assert rx.open_esp(esp) == (bytes.fromhex(RFC3602_7["payload"]), 4)


def test_bad_sa_arguments_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"encryption key for aes128 must be 16 bytes"):
        SecurityAssociation(
            0x1000, "aes128", "sha1", enc_key="00" * 15, integ_key="00" * 20, mode="transport"
        )
    with pytest.raises(ValueError, match=r"aes128gcm16 is a combined-mode"):
        SecurityAssociation(0x1000, "aes128gcm16", "sha256", enc_key="00" * 20, mode="transport")
    with pytest.raises(ValueError, match=r"null with integrity null"):
        SecurityAssociation(0x1000, "null", "null", mode="transport")
    with pytest.raises(ValueError, match=r"unknown encryption algorithm \"des5\""):
        SecurityAssociation(0x1000, "des5", enc_key="00", mode="transport")
    with pytest.raises(ValueError, match=r"tunnel mode needs outer endpoints"):
        SecurityAssociation(0x1000, "aes128gcm16", enc_key="00" * 20)
    with pytest.raises(ValueError, match=r"SPI 5 is reserved"):
        SecurityAssociation(5, "aes128gcm16", enc_key="00" * 20, mode="transport")
    with pytest.raises(ValueError, match=r"replay window 100"):
        SecurityAssociation(
            0x1000, "aes128gcm16", enc_key="00" * 20, mode="transport", replay_window=100
        )
    with pytest.raises(ValueError, match=r"enc_key: hex key has a non-hex character"):
        SecurityAssociation(0x1000, "aes128gcm16", enc_key="zz" * 20, mode="transport")


def test_keys_never_appear_in_repr() -> None:
    key = "a1b2c3d4" * 5
    sa = SecurityAssociation(0x1000, "aes128gcm16", enc_key=key, mode="transport")
    assert "a1b2" not in repr(sa) and "redacted" in repr(sa)


def test_malformed_packet_is_a_named_drop() -> None:
    sa = SecurityAssociation(0x1000, "aes128gcm16", enc_key="00" * 20, mode="transport")
    for junk, reason in [
        (b"", "truncated"),
        (b"\x45" + b"\0" * 10, "truncated"),
        (b"\x75" + b"\0" * 40, "malformed_ip"),
    ]:
        with pytest.raises(DropError) as e:
            sa.open(junk)
        assert e.value.args[0] == reason
    assert set(sa.counters()["drops"]) == {"truncated", "malformed_ip"}
    assert set(_native.drop_reasons()) >= {
        "icv_failure",
        "replay",
        "bad_padding",
        "no_sa",
        "sequence_exhausted",
        "unknown_spi",
        "policy_mismatch",
    }


def test_pyi_stub_matches_the_built_module() -> None:
    import ast
    from pathlib import Path

    import ipsec_lab

    stub = ast.parse((Path(ipsec_lab.__file__).parent / "_native.pyi").read_text())
    top = {
        n.name if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else n.target.id  # type: ignore[union-attr]
        for n in stub.body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    }
    public = {n for n in dir(_native) if not n.startswith("_")}
    assert top == public
    sa_stub = next(
        n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "SecurityAssociation"
    )
    methods = {
        n.name
        for n in sa_stub.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")
    }
    assert methods == {n for n in dir(SecurityAssociation) if not n.startswith("_")}


def test_stage_timing_through_the_bindings() -> None:
    key = "00" * 20
    tx = SecurityAssociation(0x1000, "aes128gcm16", enc_key=key, mode="transport")
    rx = SecurityAssociation(0x1000, "aes128gcm16", enc_key=key, mode="transport")
    pkt = bytes.fromhex("450000200001000040110000c0a80001c0a80002") + bytes(12)
    rx.open(tx.seal(pkt))
    assert tx.counters()["stages"] == {} and rx.counters()["stages"] == {}
    tx.set_stage_timing(True)
    rx.set_stage_timing(True)
    for _ in range(3):
        rx.open(tx.seal(pkt))
    seal, open_ = tx.counters()["stages"], rx.counters()["stages"]
    assert isinstance(seal, dict) and isinstance(open_, dict)
    assert {"header", "padding", "iv", "cipher"} <= set(seal)
    assert {"replay_check", "cipher", "replay_update", "padding"} <= set(open_)
    assert all(v["calls"] == 3 for v in open_.values())
    tx.set_stage_timing(False)
    rx.open(tx.seal(pkt))
    assert tx.counters()["stages"]["cipher"]["calls"] == 3  # kept, not counted further
