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
fail-stops soon after) and the client unusable: later calls block behind it and time out alike,
which is what a rank cut off from the store should see.
"""

from __future__ import annotations

import datetime
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
    timeout plus `WAIT_SLACK_S`)."""

    def __init__(self, store: Any, bound_s: float):
        if bound_s <= 0:
            raise ValueError(f"a store call's bound must be positive, got {bound_s}")
        self.store, self.bound_s = store, bound_s

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

    def _call(self, name: str, fn: Callable[[], T], bound_s: float | None = None) -> T:
        bound = self.bound_s if bound_s is None else bound_s
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread below, cause and all
                outcome["error"] = exc

        worker = threading.Thread(target=run, name=f"accelpact-store-{name}", daemon=True)
        worker.start()
        worker.join(bound)
        if worker.is_alive():
            raise StoreUnresponsive(f"the store did not answer {name} within {bound:.1f}s: its host is out of reach "
                                    "(a link cut without a reset blocks a store call far past the store's timeout)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
