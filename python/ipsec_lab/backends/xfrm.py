"""The Linux kernel's IPsec (xfrm), when the kernel has it.

Detection adds one ESP state in a scratch namespace: a kernel without ESP answers
"Requested type not found" (as this project's development machines do).
"""

from __future__ import annotations

import platform
import secrets
import subprocess

from ipsec_lab.backends import Processless, Unsupported
from ipsec_lab.testbed.build import kill_namespace


def kernel_has_esp() -> tuple[bool, str]:
    ns = f"ipl-{secrets.token_hex(3)}-xfrmprobe"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        p = subprocess.run(
            ["ip", "netns", "exec", ns, "ip", "xfrm", "state", "add",
             "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "spi", "0x100",
             "mode", "tunnel", "aead", "rfc4106(gcm(aes))", "0x" + "11" * 20, "128"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return p.returncode == 0, p.stderr.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        return False, str(e)
    finally:
        kill_namespace(ns)


class Xfrm(Processless):
    name = "xfrm"
    _probe: tuple[bool, str] | None = None

    def check(self, configuration: str) -> None:
        if Xfrm._probe is None:
            Xfrm._probe = kernel_has_esp()
        ok, why = Xfrm._probe
        if not ok:
            raise Unsupported(f"this kernel ({platform.release()}) has no ESP in xfrm: {why}")
        raise Unsupported(
            "the kernel has ESP, but configuring xfrm states from the lab is not built yet"
        )

    def version(self) -> str:
        return f"Linux {platform.release()} xfrm"
