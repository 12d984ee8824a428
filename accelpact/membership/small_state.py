"""The state that lives only on one rank — RNG streams, data cursor, LR schedulers and grad
scalers, the optimizer's hyperparameters — replicated off it at every boundary, so that a spare
taking over a lost position continues the lost rank's exact stream.

Why at the boundary snapshot: `rt.step` captures exactly this at F before update F+1 starts, and
a Replace always re-runs F+1 from F. The write goes to the job store from a background thread
(latest value wins; a value still queued when the next one arrives is dropped), so training never
waits for it; `decide` refuses a Replace whose lost rank's state of F never arrived.

The write of F is started when update F+1 begins and joined when its forward begins (the
replicator is an update listener, ahead of every other): it overlaps the user's data loading,
and no rank enters a collective of F+1 — where a peer could see it lost — before its state of F
is in the store. A rank lost before its first forward hook (its data loader, say) leaves F-1
behind, and that loss is rejected with this reason."""

from __future__ import annotations

import copy
import logging
import pickle
import queue
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from ..checkpoint.appstate import restore_rng_state
from . import keys

log = logging.getLogger("accelpact.membership")

_HEADER = 8  # the frontier, little-endian, ahead of the payload: readable without unpickling


def encode(snapshot: Any, frontier: int) -> bytes:
    """One rank's small state at `frontier`, from its `BoundarySnapshot`."""
    payload = {
        "frontier": int(frontier), "rng": snapshot.rng, "cursor": snapshot.cursor, "has_cursor": snapshot.has_cursor,
        "stateful": [state for _, state in snapshot.stateful], "hyper": [hyper for _, hyper in snapshot.hyper],
    }
    # pickle, not torch.save: 88 µs instead of 372 µs per write (torch.save's zip container), on
    # a thread that shares the cores with training; the store is the job's own, and torch.load
    # of this payload unpickled it without weights_only anyway
    return int(frontier).to_bytes(_HEADER, "little", signed=True) + pickle.dumps(payload, protocol=5)


def decode(raw: bytes) -> dict[str, Any]:
    return pickle.loads(raw[_HEADER:])


def frontier_of(raw: bytes) -> int:
    return int.from_bytes(raw[:_HEADER], "little", signed=True)


def newest_frontier(store: dist.Store, position: int) -> int | None:
    """The frontier of `position`'s newest replicated small state, None if none arrived."""
    key = keys.small_state(position)
    if not store.check([key]):
        return None
    return frontier_of(store.get(key))


def apply(state: dict[str, Any], *, data_state: Any, stateful: tuple[Any, ...],
          optimizer: torch.optim.Optimizer) -> None:
    """Make this process continue the stream `state` was taken from (a spare, after the transfer)."""
    if data_state is not None:
        if not state["has_cursor"]:
            raise ValueError("the lost rank replicated no data cursor, but this rank has a data_state")
        data_state.load_state_dict(copy.deepcopy(state["cursor"]))
    if len(state["stateful"]) != len(stateful):
        raise ValueError(f"the lost rank stepped {len(state['stateful'])} schedulers/scalers, this rank "
                         f"{len(stateful)}")
    for obj, saved in zip(stateful, state["stateful"]):
        obj.load_state_dict(copy.deepcopy(saved))
    if len(state["hyper"]) != len(optimizer.param_groups):
        raise ValueError("the lost rank's optimizer had another number of param groups")
    for group, saved in zip(optimizer.param_groups, state["hyper"]):
        group.update(copy.deepcopy(saved))
    restore_rng_state(state["rng"])


class Replicator:
    """Writes this rank's small state to the store off the training thread."""

    def __init__(self, store: dist.Store, position: int):
        self.store, self.position = store, position
        self._queue: queue.Queue[tuple[int, Any] | None] = queue.Queue(maxsize=1)
        self._done = threading.Condition()
        self.newest = None  # frontier of the newest value in the store
        self.offered = None  # frontier of the newest value offered
        self.join_wait_s = 0.0  # time the training thread waited for a write (the critical-path cost)
        self.joins = 0
        self.written = 0
        self.seconds = 0.0  # time spent serialising and writing (off the critical path)
        self.bytes = 0
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="accelpact-small-state", daemon=True)
        self._thread.start()

    def offer(self, snapshot: Any, frontier: int) -> None:
        """Replicate `snapshot` (taken at `frontier`); never blocks. The snapshot's copies are its
        own (it is rebuilt at every boundary), so the thread may read them later."""
        item = (frontier, snapshot)
        self.offered = frontier
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            try:
                self._queue.get_nowait()  # drop the older one: only the newest matters
            except queue.Empty:
                pass
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                pass

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the newest offered value is in the store; False on timeout or error."""
        t = time.perf_counter()
        with self._done:
            ok = self._done.wait_for(lambda: self.offered is None or self.newest == self.offered or self.error,
                                     timeout=timeout_s)
        self.join_wait_s += time.perf_counter() - t
        self.joins += 1
        return bool(ok) and not self.error

    # -- UpdateListener: join the write before the update's first forward ----------------------
    def on_phase(self, update: int, phase: Any) -> None:
        if str(phase) == "forward" and self.offered is not None and self.newest != self.offered:
            if not self.flush():
                log.warning("small state of F=%s not replicated before the forward: %s", self.offered,
                            self.error or "timed out", extra={"position": self.position})

    def probe_order(self, labels: list[str]) -> list[str]:
        return labels

    def before_probe(self, label: str) -> bool:
        return True

    def stop(self) -> None:
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            pass

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            frontier, snapshot = item
            t = time.perf_counter()
            try:
                raw = encode(snapshot, frontier)
                self.store.set(keys.small_state(self.position), raw)
            except Exception as exc:  # the decision refuses a Replace without it; keep the cause
                with self._done:
                    self.error = f"{type(exc).__name__}: {exc}"
                    self._done.notify_all()
                log.warning("small-state replication failed: %s", self.error, extra={"position": self.position})
                continue
            self.written += 1
            self.bytes = len(raw)
            self.seconds += time.perf_counter() - t
            with self._done:
                self.newest, self.error = frontier, ""
                self._done.notify_all()
