"""Type stub for the Rust extension module ipsec_lab._native (crates/ipsec-py)."""

from collections.abc import Callable

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

def bench(
    suites: list[str] | None = None,
    sizes: list[int] | None = None,
    modes: list[str] | None = None,
    ops: list[str] | None = None,
    budget_ms: int = 100,
    trials: int = 5,
    progress: Callable[[int, int], object] | None = None,
) -> list[dict[str, object]]: ...
def default_suites() -> list[str]: ...
def algorithms() -> tuple[list[str], list[str]]: ...
def drop_reasons() -> list[str]: ...
