"""SIGTERM and SIGHUP stop a lab run as Ctrl-C does: the run in progress stops, the
testbed and gateways are torn down, every finished run is kept, the campaign is marked
interrupted, and the exit status says which signal (128 + its number)."""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled as Ctrl-C is (`on_termination`): the run in progress
    stops, the testbed and gateways are torn down, every finished run is kept, and the
    campaign is marked interrupted."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def on_termination() -> None:
    """Make SIGTERM and SIGHUP raise `Terminated` in the main thread; a second one while
    the first is being handled is ignored, so the clean-up runs to its end."""

    def handler(signum: int, frame: object) -> None:
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Terminated(signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def interrupted_status(e: KeyboardInterrupt) -> int:
    """The exit status of a run stopped by `e`: 128 + the signal (130 for Ctrl-C, 143 for
    SIGTERM, 129 for SIGHUP), as a shell reports it."""
    return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)
