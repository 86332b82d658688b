"""Ctrl-C (SIGINT) and SIGTERM in the kvlab command: a sweep's session notes them, and raises ``Stopped`` only
where stopping is safe; before a session, the command ends at once.

    signal ─▶ _handle: note it ─▶ raise Stopped as the next hold ends, in ordinary code
    held: every DuckDB call (a KeyboardInterrupt inside a query interrupts it: "Query interrupted", a transaction
          that "cannot rollback"), a session's start (ray.init, which crashes when interrupted), each wait for
          finished points (a tenth of a second at most), the end of a finished session (its plots: the command
          exits 128 + signum after them, see ``after_finish``)

An exception raised by a signal handler is raised wherever the main thread is: inside a lock's acquisition
(concurrent.futures.wait takes its futures' locks one by one: left taken, the pool's thread waits for them
forever), inside a callback that cannot raise (a weakref's, as every import's module lock has: "Exception ignored"),
or inside C code that drops it (compiling a module). So a session's handler raises nothing itself.

Stopped is raised once; a second Ctrl-C while the session cleans up is only noted. Signals are the process's, so
the state is too: one module-level ``_State``, installed and restored by the command that owns the session.

Before any session (kvlab importing, the options being checked: nothing is started or stored yet), the handler of
``exit_on_signals`` says one line and ends the process (exit 130, 143). Once something may need its exit handlers
(``unwind_on_exit``: a session has run, or a command that does not keep work has started), it raises SignalExit
instead, and raises it again if a callback lost it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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


class SignalExit(SystemExit):
    """The command ended by SIGINT or SIGTERM outside a session, once exit handlers may matter (``unwind_on_exit``):
    exit 128 + signum, as the default handling would, but said in one line, and with ``finally`` blocks and exit
    handlers run (Ray's shutdown)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@dataclass
class _State:
    installed: dict[int, Any] = field(default_factory=dict)  # signal -> the handler it had before
    received: int | None = None  # the first signal noted
    raised: bool = False
    holds: int = 0
    ignored: set[int] = field(default_factory=set)  # signals the parent had ignored: they stay so


_state = _State()


@dataclass
class _Exiting:
    signum: int | None = None  # the signal that ends the command
    unwind: bool = False  # end it by SignalExit (exit handlers run) rather than at once
    again: bool = False  # its SignalExit was lost: raise it once more
    interrupted: bool = False  # Ctrl-C raised KeyboardInterrupt (interrupt_on_ctrl_c)


_exiting = _Exiting()


def exit_on_signals() -> set[signal.Signals]:
    """SIGINT and SIGTERM end the command from now on (SignalExit), save those the parent had this process
    ignore (as a shell does SIGINT for a script's background jobs); the signals so handled."""
    handled = {signum for signum in SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN}
    for signum in handled:
        signal.signal(signum, _exit)
    return handled


def unwind_on_exit() -> None:
    """From now on a signal ends the command by SignalExit: its ``finally`` blocks and exit handlers run."""
    _exiting.unwind = True
    _watch_lost_exceptions()


def interrupt_on_ctrl_c() -> None:
    """From now on Ctrl-C raises KeyboardInterrupt, as Python's own handling does (a command may keep what it has:
    bench its finished requests), and is noted, so that the command's end can say so (``interrupted``)."""
    signal.signal(signal.SIGINT, _interrupt)


def _interrupt(signum: int, frame) -> None:
    _exiting.interrupted = True
    raise KeyboardInterrupt


def interrupted() -> bool:
    return _exiting.interrupted


def forget_interrupt_in_exec() -> None:
    """Ctrl-C's KeyboardInterrupt was handled: the command ends 130 and says so. But CPython notes one that leaves
    an ``exec`` of a string (the methods a dataclass generates, in an import the command makes as it runs) as
    unhandled, caught or not, and at exit ends the process by SIGINT instead (-2, not 130); each ``exec`` of a string
    clears that note as it starts, so an empty one forgets it."""
    exec("")  # noqa: S102  (no code: only its start, which clears the note)


def _exit(signum: int, frame) -> None:
    if _exiting.signum is None:
        _exiting.signum = signum
        print(f"stopped by {signal_name(signum)}", file=sys.stderr, flush=True)
    elif not _exiting.again:
        return  # (a second signal while the command exits is only ignored)
    if not _exiting.unwind:
        with suppress(OSError, ValueError):  # (what was printed is kept; a closed pipe is no reason for a traceback)
            sys.stdout.flush()
        os._exit(128 + signum)
    _exiting.again = False
    raise SignalExit(_exiting.signum)


_reported = [sys.unraisablehook]  # (how other lost exceptions are reported: as before)


def _watch_lost_exceptions() -> None:
    if sys.unraisablehook is not _unraisable:
        _reported[0] = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _unraisable(unraisable) -> None:
    """A SignalExit that a callback could not raise: raised again by the same handler, the signal sent once more."""
    exc = unraisable.exc_value
    if not isinstance(exc, SignalExit):
        _reported[0](unraisable)
        return
    _exiting.again = True
    threading.Thread(target=_signal_again, args=(exc.signum,), daemon=True).start()


def _signal_again(signum: int) -> None:
    # The main thread has long left the callback when the signal comes again (and were it in another one, the
    # exception would be raised once more from there).
    time.sleep(0.05)
    main = threading.main_thread().ident
    if main is not None:
        signal.pthread_kill(main, signum)


def install() -> None:
    """Note SIGINT and SIGTERM from now on (in the main thread; elsewhere Python allows no handler), save a signal
    the parent had this process ignore (a script's background job ignores SIGINT): that one stays ignored."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        return
    _state.received, _state.raised, _state.holds = None, False, 0
    for signum in SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            _state.ignored.add(signum)
        else:
            _state.installed[signum] = signal.signal(signum, _handle)
    unwind_on_exit()  # (after the session, what it started may need its exit handlers: Ray's shutdown)


def restore() -> None:
    for signum, previous in _state.installed.items():
        signal.signal(signum, previous)
    _state.installed.clear()
    _state.ignored.clear()
    _state.holds = 0


def received() -> int | None:
    return _state.received


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _handle(signum: int, frame) -> None:
    if _state.received is None:
        _state.received = signum


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
        reclaim()
        _raise()


def reclaim() -> None:
    """A library that took a signal inside a held call gives it back (ray.init sets SIGTERM to sys.exit): before
    the signals are unblocked, where one may be waiting (``blocked``), and as the outermost hold ends."""
    if not _state.installed:
        return
    for signum in SIGNALS:
        mine = signal.SIG_IGN if signum in _state.ignored else _handle
        if signal.getsignal(signum) is not mine:
            signal.signal(signum, mine)


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
