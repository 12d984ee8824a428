"""Retired groups are freed on a thread of their own, never on the recovery's path.

Why: freeing a process group stops its backend's threads. A gloo group joins its TCP event loop,
which leaves ``epoll_wait`` only every 10 ms, and its worker threads; ProcessGroupNCCL joins its
watchdog and heartbeat monitor. Measured here (CPU, gloo, 2 ranks): 15-20 ms per group freed on
the caller's thread. A rebind plan keeps the group it replaced (for the proof) and drops the one
before it, so every recovery after the first paid that inside its rebind phase: 3-7.5 ms of a
10-14 ms repair, while the peer waited in validate. torch releases the GIL while it destroys a
process group, so on this thread the trainer and the protocol go on: `bench/repair.py` prints
both side by side (19.5-19.9 ms dropped in place; 0.8-2.2 ms the longest pause of a thread
spinning beside the reaper while it freed one).

Handing a group over is not enough by itself: a reference the caller holds a moment longer (an
argument, a local) would then be the last one, and the group would be freed on the caller's
thread after all. So each group is kept `GRACE_S` before it is dropped: far longer than a
caller's last statements take, and short enough that a job's retired groups never pile up.

Nothing is closed early: a group still referenced elsewhere lives on, and is freed wherever its
last reference goes, as before.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

log = logging.getLogger("accelpact.comm")

__all__ = ["GRACE_S", "drain", "free_later", "pending"]

#: How long a handed-over group is kept before the reaper drops it (see the module docstring).
GRACE_S = 0.1

_lock = threading.Lock()
_idle = threading.Condition(_lock)
_queue: queue.SimpleQueue[tuple[float, object]] = queue.SimpleQueue()
_owner_pid: int | None = None  # the process whose reaper thread runs (a forked child has none)
_pending = 0
_inherited: list[object] = []  # what a forked child got from its parent's reaper: never freed


def _after_fork_in_child() -> None:
    """A forked child (a data-loader worker) has no reaper thread, and its lock may have been
    held by the parent's at the fork. It starts afresh. What the parent had handed over stays
    referenced for good: freeing a group's copy would join threads that do not exist here."""
    global _lock, _idle, _queue, _owner_pid, _pending
    _inherited.append(_queue)
    _lock = threading.Lock()
    _idle = threading.Condition(_lock)
    _queue = queue.SimpleQueue()
    _owner_pid, _pending = None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def free_later(obj: object) -> None:
    """Drop this reference to `obj` (a retired group) on the reaper thread, `GRACE_S` from now.
    The caller must not keep another reference to it."""
    global _owner_pid, _pending
    if obj is None:
        return
    with _lock:
        if _owner_pid != os.getpid():  # first use, or a fork's child: the thread did not come along
            _owner_pid = os.getpid()
            threading.Thread(target=_reap, name="accelpact-reaper", daemon=True).start()
        _pending += 1
        _queue.put((time.monotonic() + GRACE_S, obj))


def pending() -> int:
    """Groups handed over and not yet dropped."""
    with _lock:
        return _pending


def drain(timeout_s: float) -> bool:
    """Wait until every handed-over group has been dropped; False if some remain after
    `timeout_s` (their grace included)."""
    deadline = time.monotonic() + timeout_s
    with _idle:
        while _pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _idle.wait(left)
    return True


def _reap() -> None:
    global _pending
    while True:
        due, obj = _queue.get()
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        start = time.perf_counter()
        kind = type(obj).__name__
        del obj  # the last reference, normally: the group's destructor runs here, GIL released
        log.debug("freed a retired %s in %.1f ms", kind, (time.perf_counter() - start) * 1e3)
        with _idle:
            _pending -= 1
            if not _pending:
                _idle.notify_all()
