"""The control plane's store with every call bounded in time.

Why: the outcome register, the release votes and the link-probe addresses live in the job's
TCPStore, on one host. When the link to that host is cut without a reset (a black-holed route, a
switch down), a store call blocks on its socket: measured here behind a relay that stops
forwarding, `get` and `compare_set` were still blocked after 100 s although the store client's
own timeout was 8 s, and `wait(keys, 2 s)` logged its timeout and blocked on. The protocol counts
on every control-plane step ending within the control timeout (a rank that cannot reach the
register halts without claiming an outcome), so each call runs on a worker thread that the
caller waits for at most the bound: past it, `StoreUnresponsive`.

A call that timed out leaves its worker blocked in the store client (a daemon thread; the rank
fail-stops soon after) and the client unusable: later calls go to a new worker, block behind the
client's lock and time out alike, which is what a rank cut off from the store should see.
"""

from __future__ import annotations

import datetime
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import ControlPlaneError

T = TypeVar("T")

#: Added to a `wait`'s own timeout: the store answers a wait that timed out with an error, which
#: takes a round trip after the timeout itself.
WAIT_SLACK_S = 1.0


class StoreUnresponsive(ControlPlaneError):
    """A store call did not return within its bound: the store's host is out of reach."""


class BoundedStore:
    """`store`'s calls that the control plane makes, each bounded by `bound_s` (a `wait` by its own
    timeout plus `WAIT_SLACK_S`). The calls run on one long-lived worker thread: a thread started
    per call cost 0.1-0.3 ms each, about a millisecond of every repair's release."""

    def __init__(self, store: Any, bound_s: float):
        if bound_s <= 0:
            raise ValueError(f"a store call's bound must be positive, got {bound_s}")
        self.store, self.bound_s = store, bound_s
        self._worker: _Worker | None = None
        self._lock = threading.Lock()  # the worker is shared by every thread that calls

    def set(self, key: str, value: str | bytes) -> None:
        self._call("set", lambda: self.store.set(key, value))

    def get(self, key: str) -> bytes:
        return self._call("get", lambda: self.store.get(key))

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return self._call("compare_set", lambda: self.store.compare_set(key, expected, desired))

    def check(self, keys: Sequence[str]) -> bool:
        return self._call("check", lambda: self.store.check(list(keys)))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return self._call("multi_get", lambda: self.store.multi_get(list(keys)))

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta) -> None:
        bound = timeout.total_seconds() + WAIT_SLACK_S
        self._call("wait", lambda: self.store.wait(list(keys), timeout), bound_s=bound)

    def close(self) -> None:
        """Let the worker end (it is a daemon: a process that never closes loses nothing)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.jobs.put(None)

    def _call(self, name: str, fn: Callable[[], T], bound_s: float | None = None) -> T:
        bound = self.bound_s if bound_s is None else bound_s
        job = _Job(fn)
        with self._lock:
            if self._worker is None:
                self._worker = _Worker()
            worker = self._worker
        worker.jobs.put(job)
        if not job.done.wait(bound):
            with self._lock:  # the worker is stuck in the store client: later calls get a new one
                if self._worker is worker:
                    self._worker = None
            raise StoreUnresponsive(f"the store did not answer {name} within {bound:.1f}s: its host is out of reach "
                                    "(a link cut without a reset blocks a store call far past the store's timeout)")
        if job.error is not None:
            raise job.error
        return job.value


class _Job:
    def __init__(self, fn: Callable[[], Any]):
        self.fn, self.done = fn, threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed to the caller's thread, cause and traceback with it
            self.error = exc
        finally:
            self.done.set()


class _Worker(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="accelpact-store", daemon=True)
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job.run()
