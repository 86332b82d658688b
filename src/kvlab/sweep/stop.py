"""Ctrl-C (SIGINT) and SIGTERM during a sweep: noted at once, raised as ``Stopped`` only where stopping is safe.

    signal ─▶ _handle: note it ─┬─ nothing held ─▶ raise Stopped here (waiting for points, between them)
                                └─ held ─────────▶ raise Stopped when the outermost hold ends
    held: every DuckDB call (a KeyboardInterrupt inside a query interrupts it: "Query interrupted", a transaction
          that "cannot rollback"), a session's start (ray.init, which crashes when interrupted), the end of a
          finished session (its plots: the command exits 128 + signum after them, see ``after_finish``)

Stopped is raised once; a second Ctrl-C while the session cleans up is only noted. Signals are the process's, so
the state is too: one module-level ``_State``, installed and restored by the command that owns the session.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """A sweep stopped by SIGINT or SIGTERM. A BaseException, as KeyboardInterrupt is: an ``except Exception``
    (a point's outcome, a library's retry) must not take it for an error."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process a signal ended: 130, 143


@dataclass
class _State:
    installed: dict[int, Any] = field(default_factory=dict)  # signal -> the handler it had before
    received: int | None = None  # the first signal noted
    raised: bool = False
    holds: int = 0


_state = _State()


def install() -> None:
    """Note SIGINT and SIGTERM from now on (in the main thread; elsewhere Python allows no handler)."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        return
    _state.received, _state.raised, _state.holds = None, False, 0
    for signum in SIGNALS:
        _state.installed[signum] = signal.signal(signum, _handle)


def restore() -> None:
    for signum, previous in _state.installed.items():
        signal.signal(signum, previous)
    _state.installed.clear()
    _state.holds = 0


def received() -> int | None:
    return _state.received


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _handle(signum: int, frame) -> None:
    if _state.received is None:
        _state.received = signum
    if _state.holds == 0:
        _raise()


def _raise() -> None:
    if _state.received is not None and not _state.raised and _state.installed:
        _state.raised = True
        raise Stopped(_state.received)


@contextmanager
def held() -> Iterator[None]:
    """No Stopped inside; one noted inside is raised as the outermost hold ends (unless the body raised)."""
    _state.holds += 1
    try:
        yield
    finally:
        _state.holds -= 1
    if _state.holds == 0 and _state.installed:
        _reclaim()
        _raise()


def _reclaim() -> None:
    # A library that took a signal inside a held call gets it back (ray.init sets SIGTERM to sys.exit).
    for signum in SIGNALS:
        if signal.getsignal(signum) is not _handle:
            signal.signal(signum, _handle)


def after_finish() -> None:
    """The session is over and its store closed: a signal from now on is noted and the command ends with it."""
    _state.holds += 1


@contextmanager
def blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread: a process started inside inherits the mask and never sees
    the terminal's Ctrl-C while its interpreter starts (multiprocessing's resource tracker is started so too).
    A signal that comes meanwhile waits and is delivered, and noted, at the end."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
