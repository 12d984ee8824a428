"""Settling the device without hanging on it: abort first, then synchronize, each bounded.

On a GPU a collective that lost its peer never raises on the CPU: its kernel spins on the device,
and anything that synchronises behind it (``torch.cuda.synchronize``, an event wait in the
discard of an interrupted update) waits forever. The one thing that frees such a kernel is
``ncclCommAbort``. So a recovery aborts the communicators it knows to be broken *before* anything
synchronises, and waits for the device with a bound; a device still busy at the bound means a
kernel is stuck on a group not (yet) known to be broken, and that group is aborted too.

Both the abort and the synchronize run on a helper thread that the caller waits on with a bound:
``ncclCommAbort`` itself can hang (NCCL 2.25.1, pytorch#149153), and a recovery that hangs is
worse than one that fails stop. The callables are injected, so the order is tested on CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Bounded", "Settled", "run_bounded", "settle_device"]


class Bounded:
    """`fn` running on a daemon thread; `wait` gives up after a bound (the thread stays blocked,
    which is all one can do with a call that cannot be interrupted)."""

    def __init__(self, fn: Callable[[], object], name: str):
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller through `error`, never dropped
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """True when `fn` returned (or raised: see `error`) within `timeout_s`."""
        return self._done.wait(timeout_s)


def run_bounded(fn: Callable[[], object], name: str) -> Bounded:
    return Bounded(fn, name)


@dataclass(frozen=True)
class Settled:
    """`drained`: the device finished its work; `aborted`: labels aborted, in order;
    `escalated`: those aborted only because the device stayed busy (not known broken)."""

    drained: bool
    aborted: tuple[str, ...] = ()
    escalated: tuple[str, ...] = ()
    reason: str = ""


def _abort(labels: Sequence[str], groups: Mapping[str, object], abort: Callable[[list], object],
           timeout_s: float) -> str:
    """Abort `labels` together, bounded; returns why it failed ('' when it worked)."""
    call = run_bounded(lambda: abort([groups[label] for label in labels]), "accelpact-abort")
    if not call.wait(timeout_s):
        return (f"aborting {list(labels)} did not return within {timeout_s:g} s (ncclCommAbort hangs on "
                "NCCL 2.25.1; 2.26.2 fixed it)")
    if call.error is not None:
        return f"aborting {list(labels)} failed: {type(call.error).__name__}: {call.error}"
    return ""


def settle_device(*, broken: Mapping[str, object], others: Mapping[str, object], timeout_s: float,
                  synchronize: Callable[[], object], abort: Callable[[list], object]) -> Settled:
    """Abort the `broken` groups (together), then wait for the device for at most `timeout_s`.
    If it is still busy, a kernel is stuck on one of the `others`: abort them too and wait once
    more. Never synchronises before the known-broken groups are aborted."""
    aborted: list[str] = []
    if broken:
        failure = _abort(list(broken), broken, abort, timeout_s)
        if failure:
            return Settled(False, (), (), failure)
        aborted += list(broken)
    drain = run_bounded(synchronize, "accelpact-drain")
    if drain.wait(timeout_s):
        return _drained(drain, aborted, ())
    if not others:
        return Settled(False, tuple(aborted), (), f"device work still running after {timeout_s:g} s with every "
                                                   "NCCL group aborted")
    failure = _abort(list(others), others, abort, timeout_s)
    if failure:
        return Settled(False, tuple(aborted), (), failure)
    escalated = tuple(others)
    if not drain.wait(timeout_s):
        return Settled(False, (*aborted, *escalated), escalated,
                       f"device work still running {timeout_s:g} s after aborting every NCCL group")
    return _drained(drain, aborted, escalated)


def _drained(drain: Bounded, aborted: list[str], escalated: tuple[str, ...]) -> Settled:
    if drain.error is not None:
        return Settled(False, (*aborted, *escalated), escalated,
                       f"device synchronize failed: {type(drain.error).__name__}: {drain.error}")
    return Settled(True, (*aborted, *escalated), escalated)
