"""The engine's algorithm table is the one source: the docs, the model and the backends
agree with it."""

from __future__ import annotations

import re
from pathlib import Path

from ipsec_lab import SecurityAssociation, _native
from ipsec_lab.algorithms import AH_INTEGRITY, CIPHERS, ESP_INTEGRITY, STAGES, markdown
from ipsec_lab.backends.sa_plan import Layers, fresh_keys, layers

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"


def _tables(text: str) -> str:
    parts = re.findall(r"<!-- table: \w+ -->\n(.*?)<!-- end -->", text, re.S)
    return "".join(p.strip("\n") + "\n" for p in parts)


def test_the_docs_algorithm_tables_are_the_engines() -> None:
    doc = _tables(DOC.read_text())
    assert doc.count("\n| `") == len(CIPHERS) + len(ESP_INTEGRITY) + len(
        set(AH_INTEGRITY) - set(ESP_INTEGRITY)
    ), doc
    want = markdown().replace("\n\n", "\n")
    assert doc == want, f"docs/algorithms.md is stale; `python -m ipsec_lab.algorithms`:\n{want}"


def test_every_row_builds_an_sa_with_keys_of_its_length() -> None:
    """The row's lengths are the engine's: an SA built with fresh_keys' keys (which read
    the row) is accepted for every ESP pairing and AH algorithm, and its sealed packet
    carries the row's IV."""
    for enc, c in CIPHERS.items():
        integ = "null" if c.aead or enc == "null" else "sha256"
        if enc == "null":
            integ = "sha1"
        ls = layers(f"esp:{enc}-{integ}" if integ != "null" else f"esp:{enc}", "test")
        (ek, ik) = fresh_keys(ls)[("esp", "lr")]
        sa = SecurityAssociation(
            0x1000,
            enc,
            integ,
            enc_key=ek or None,
            integ_key=ik or None,
            legacy=c.legacy,
            mode="transport",
        )
        inner = bytes.fromhex("4500007800000000401100000a0100020a020002") + bytes(100)
        sealed = sa.seal(inner)
        # transport mode: the IPv4 header (20), ESP's (8), IV, payload, padding, ICV
        assert len(sealed) >= 28 + c.iv + 100 + 2 + c.icv, enc
    for integ, i in AH_INTEGRITY.items():
        ls = layers(f"ah:{integ}", "test")
        (_, ik) = fresh_keys(ls)[("ah", "lr")]
        assert len(bytes.fromhex(ik)) == i.key_material
        SecurityAssociation(
            0x1000, "null", integ, integ_key=ik, protocol="ah", legacy=i.legacy, mode="transport"
        )


def test_stages_come_from_the_engine_in_order() -> None:
    assert STAGES == tuple(label for label, _ in _native.stages())
    assert STAGES[0] == "policy_lookup" and {"cipher", "mac"} <= set(STAGES)


def test_layers_name_the_backend_that_refuses() -> None:
    import pytest

    from ipsec_lab.backends import Unsupported

    with pytest.raises(Unsupported, match=r"^xfrm runs an IPsec configuration"):
        layers("none", "xfrm")
    assert isinstance(layers("ipcomp+esp:aes128-sha1", "ours"), Layers)
