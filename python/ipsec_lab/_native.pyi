"""Type stub for the Rust extension module ipsec_lab._native (crates/ipsec-py)."""

from collections.abc import Callable
from typing import Any

DEFAULT_SIZES: list[int]

class DropError(Exception):
    """A packet was refused; ``args[0]`` is the drop reason label."""

class SecurityAssociation:
    def __init__(
        self,
        spi: int,
        encryption: str,
        integrity: str = "null",
        *,
        enc_key: bytes | str | None = None,
        integ_key: bytes | str | None = None,
        mode: str = "tunnel",
        tunnel_src: str | None = None,
        tunnel_dst: str | None = None,
        esn: bool = False,
        replay_window: int | None = 1024,
        legacy: bool = False,
        protocol: str = "esp",
    ) -> None: ...
    def seal(self, packet: bytes, *, iv: bytes | None = None, seq: int | None = None) -> bytes: ...
    def open(self, packet: bytes) -> bytes: ...
    def seal_esp(
        self, payload: bytes, next_header: int, *, iv: bytes | None = None, seq: int | None = None
    ) -> bytes: ...
    def open_esp(self, esp: bytes) -> tuple[bytes, int]: ...
    def set_replay_top(self, top: int) -> None: ...
    def set_stage_timing(self, on: bool) -> None: ...
    def counters(self) -> dict[str, object]: ...
    @property
    def spi(self) -> int: ...
    @property
    def suite(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def protocol(self) -> str: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def esn(self) -> bool: ...

class IpcompAssociation:
    def __init__(
        self, cpi: int, *, min_size: int = 90, window_bits: int = 11, level: int = 6
    ) -> None: ...
    def compress(self, payload: bytes, next_header: int) -> bytes | None: ...
    def decompress(self, data: bytes) -> tuple[bytes, int]: ...
    def seal(self, packet: bytes) -> bytes: ...
    def open(self, packet: bytes) -> bytes: ...
    def counters(self) -> dict[str, object]: ...
    def set_stage_timing(self, on: bool) -> None: ...
    @property
    def cpi(self) -> int: ...

class SecurityBundle:
    def __init__(
        self,
        esp: SecurityAssociation,
        *,
        ah: SecurityAssociation | None = None,
        ipcomp: IpcompAssociation | None = None,
    ) -> None: ...
    def seal(self, packet: bytes, *, iv: bytes | None = None, seq: int | None = None) -> bytes: ...
    def open(self, packet: bytes) -> bytes: ...

def bench(
    suites: list[str] | None = None,
    sizes: list[int] | None = None,
    modes: list[str] | None = None,
    ops: list[str] | None = None,
    budget_ms: int = 100,
    trials: int = 5,
    progress: Callable[[int, int], object] | None = None,
    stages: bool = False,
) -> list[dict[str, object]]: ...
def bench_configs(
    configs: list[str],
    sizes: list[int],
    ops: list[str],
    payloads: list[str],
    budget_ms: int = 100,
    trials: int = 5,
    stages: bool = False,
    progress: Callable[[int, int], object] | None = None,
) -> list[dict[str, object]]: ...
def default_suites() -> list[str]: ...
def stage_off_cost_ns(trials: int = 5) -> float: ...
def algorithms() -> dict[str, list[dict[str, Any]]]:
    """The engine's algorithm table: {"encryption": [row, ...], "integrity": [row, ...]}."""

def stages() -> list[tuple[str, bool]]:
    """The engine's stages in order: (label, per_byte)."""

def drop_reasons() -> list[str]: ...
