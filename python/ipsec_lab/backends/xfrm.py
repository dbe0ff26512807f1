"""The Linux kernel's IPsec (xfrm), when the kernel has it.

Detection adds one ESP state in a scratch namespace: a kernel without ESP answers
"Requested type not found" (as this project's development machines do).
"""

from __future__ import annotations

import functools
import platform

from ipsec_lab.backends import Processless, Unsupported
from ipsec_lab.testbed.build import probe


@functools.cache
def kernel_has_esp() -> tuple[bool, str]:
    """Probed once per process."""
    return probe(
        "xfrmprobe",
        [],
        ["ip", "xfrm", "state", "add", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp",
         "spi", "0x100", "mode", "tunnel", "aead", "rfc4106(gcm(aes))", "0x" + "11" * 20, "128"],
    )  # fmt: skip


class Xfrm(Processless):
    name = "xfrm"

    def check(self, configuration: str) -> None:
        ok, why = kernel_has_esp()
        if not ok:
            raise Unsupported(f"this kernel ({platform.release()}) has no ESP in xfrm: {why}")
        raise Unsupported(
            "the kernel has ESP, but configuring xfrm states from the lab is not built yet"
        )

    def version(self) -> str:
        return f"Linux {platform.release()} xfrm"
