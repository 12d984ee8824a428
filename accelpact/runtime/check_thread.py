"""The deferred boundary's check, run on a thread of its own.

Why: a deferred boundary waits for nothing, yet starting its all-reduce and reading its result
still cost the training thread 145-187 µs of every update here (`bench/deferred_check.py`, the
two interleaved in one world), with caches cold after the step: c10d's enqueue alone takes
90-110 µs there (30 warm), then come the slot writes and the clock, the wait, the update times,
the clock merge and the straggler window. That was a quarter of what protection cost that
thread. On a node with a core to spare per rank this work overlaps the next update, and the
all-reduce itself runs on gloo's thread either way. So the training thread hands the check over
(a queue put) and collects the agreed flag when it settles the boundary, normally long after the
thread has finished.

Order on the control plane is kept. Only one check is in flight, and every later use of the
control plane (a synchronous check, a recovery, close) comes after `result`, which waits until
the check has ended: the settle of the boundary (`runtime.deferred`) always comes first. The
check's own wait is bounded as before: by the control timeout, or cut short by a membership
change (`ControlPlane.boundary_result`). A check that failed is collected as its
ControlPlaneError.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from ..errors import ControlPlaneError

#: The thread's name, as the hang watch's stacks show it (`run_report.hang_line` looks for it).
THREAD_NAME = "accelpact-boundary-check"
#: Seconds `result` waits beyond the control timeout, which bounds the check's own wait.
MARGIN_S = 30.0
#: Seconds `close` waits for the thread to end.
JOIN_S = 5.0


class CheckThread:
    """`start(flag, arrived)` hands the check to the thread, and `result(ticket)` returns its
    agreed flag or raises its ControlPlaneError. `check_fn` runs on the thread: the post and the
    settle of `StragglerWatch`."""

    def __init__(self, check_fn: Callable[[int, float], int], *, name: str = THREAD_NAME):
        self._check_fn, self._name = check_fn, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # C-implemented, no Python lock around it
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._issued = 0  # tickets handed out (the training thread's count)
        self.ran = 0  # checks that ended on the thread (its count)
        self.stuck = False  # close() left the thread behind, still inside its check

    def start(self, flag: int, arrived: float) -> int:
        """Start the check on the thread; the ticket to collect it with."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._issued += 1
        self._jobs.put((self._issued, flag, arrived))
        return self._issued

    def result(self, ticket: int, control_timeout_s: float) -> int:
        """The agreed flag of `ticket`, once its check ended (the control timeout bounds the
        check's own wait; a little more than that is waited here). A result of an earlier ticket
        that nobody collected (a boundary rejected before it was settled) is dropped."""
        bound_s = control_timeout_s + MARGIN_S
        while True:
            try:
                got, flag, failure = self._done.get(timeout=bound_s)
            except queue.Empty:
                raise ControlPlaneError(f"the boundary check #{ticket} did not end within {bound_s:.0f} s, "
                                        "longer than the control timeout bounds it (its thread is stuck)") from None
            if got == ticket:
                if failure is not None:
                    raise failure
                return flag

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread (idempotent); a check still queued runs first. A thread still inside
        its check after the join's bound is left behind and marked `stuck`: it still waits in the
        control plane's group, which must then not be closed under it (`detach`)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=JOIN_S)
            self.stuck = thread.is_alive()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            ticket, flag, arrived = job
            self.ran += 1
            try:
                self._done.put((ticket, self._check_fn(flag, arrived), None))
            except ControlPlaneError as exc:
                self._done.put((ticket, None, exc))
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread with its cause
                failure = ControlPlaneError(f"the boundary check failed: {type(exc).__name__}: {exc}")
                failure.__cause__ = exc
                self._done.put((ticket, None, failure))
