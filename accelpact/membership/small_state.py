"""The state that lives only on one rank — RNG streams, data cursor, LR schedulers and grad
scalers, the optimizer's hyperparameters — replicated off it at every boundary, so that a spare
taking over a lost position continues the lost rank's exact stream.

When: at the clean boundary of update F+1, *before* the rank's contribution to the boundary
check leaves. Its state then is exactly the state of F+1 (the body ran, the step is applied), and
a peer can commit F+1 only once every rank's contribution reached it. So if any survivor
committed F+1, the state of F+1 of every rank — the one that died inside the check included —
is in the store, and the survivors that did not learn the check's outcome can roll forward to
F+1 with it (`decide`). The write runs on a background thread from the moment the boundary
starts (its health probes overlap it) and is joined right before the check (`before_check`):
what it costs the update is measured by `bench/rankloss.py`.

Where: two slots per position and world, by frontier parity (`keys.small_state`), each value
headed by its frontier. A rank writes F+1 before the check of F+1 while a Replace that nobody
committed F+1 in still needs F. A spare reads the slot of the agreed frontier in the world that
failed and refuses another frontier. Per world: a process declared lost may still be alive and
write; its writes land in the world it was fenced from, never in its successor's slots. A rank's
slots of the world it left are deleted with its first write in the next one (12 MB per change at
1,000 ranks would otherwise stay in the store).

A rank that starts an update without its state of F in the store under its current world and
position (its first update, after a Replace or a shrink) offers the step-entry snapshot, joined
before the update's first forward: no rank enters a collective of F+1, where a peer could see it
lost, before its state of F is in the store."""

from __future__ import annotations

import collections
import copy
import io
import logging
import pickle
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..checkpoint.appstate import restore_rng_state
from . import keys

log = logging.getLogger("accelpact.membership")

#: (world, position, frontier) of one value: the slot it is written to, and what it holds
Slot = tuple[int, int, int]

_HEADER = 8  # the frontier, little-endian, ahead of the payload: readable without unpickling


def _payload(snapshot: Any, frontier: int) -> dict[str, Any]:
    return {
        "frontier": int(frontier), "rng": snapshot.rng, "cursor": snapshot.cursor, "has_cursor": snapshot.has_cursor,
        "stateful": [state for _, state in snapshot.stateful], "hyper": [hyper for _, hyper in snapshot.hyper],
    }


def buffer_bytes(snapshot: Any) -> list[tuple[str, tuple[int, ...], bytes]]:
    """The snapshot's module buffers as (dtype, shape, bytes) on the host, in `buffer_slots`
    order (which the spare's model shares). Each rank's own: a replica peer's transfer carries the
    peer's (found by review: a spare took its peer's BatchNorm statistics). Plain bytes, not
    pickled tensors: a pickled tensor goes through torch.save each (5 ms for 159 BatchNorm
    buffers against 66 µs for the rest) and a CUDA one comes back on the lost rank's device.
    Read on the background thread, after the capture's event (a clone on the device may still run)."""
    if getattr(snapshot, "buffers_ready", None) is not None:
        snapshot.buffers_ready.synchronize()
    return [(str(saved.dtype).removeprefix("torch."), tuple(saved.shape),
             saved.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            for _, saved, _, _ in snapshot.buffers]


def encode(snapshot: Any, frontier: int) -> bytes:
    """One rank's small state at `frontier`, from its `BoundarySnapshot`."""
    # pickle, not torch.save: 88 µs instead of 372 µs per write (torch.save's zip container), on
    # a thread that shares the cores with training; the store is the job's own, and torch.load
    # of this payload unpickled it without weights_only anyway
    payload = {**_payload(snapshot, frontier), "buffers": buffer_bytes(snapshot)}
    return int(frontier).to_bytes(_HEADER, "little", signed=True) + pickle.dumps(payload, protocol=5)


class _ByValue(pickle.Pickler):
    """Pickles a tensor as its dtype, shape and bytes: a plain pickle of one names its storage by
    address, so two equal states never pickled alike."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            flat = obj.detach().cpu().contiguous().reshape(-1)
            return tuple, ((str(obj.dtype), tuple(obj.shape), flat.view(torch.uint8).numpy().tobytes()),)
        return NotImplemented


def fingerprint(snapshot: Any, frontier: int) -> bytes:
    """Equal for two captures of the same small state, and only for those (compared, never read).
    The module buffers are left out: nothing between a boundary and the next step entry runs
    forward, and reading them would copy each off the device on the training thread."""
    out = io.BytesIO()
    _ByValue(out, protocol=5).dump(_payload(snapshot, frontier))
    return out.getvalue()


def _fingerprint_or_none(snapshot: Any, frontier: int) -> bytes | None:
    """None where a state cannot be fingerprinted (a tensor kind without plain bytes): the step
    entry then writes its capture every time, as is always safe."""
    try:
        return fingerprint(snapshot, frontier)
    except (RuntimeError, TypeError, ValueError, pickle.PicklingError) as exc:
        log.debug("small state not fingerprinted (%s: %s): the step entry writes it", type(exc).__name__, exc)
        return None


def decode(raw: bytes) -> dict[str, Any]:
    return pickle.loads(raw[_HEADER:])


def frontier_of(raw: bytes) -> int:
    return int.from_bytes(raw[:_HEADER], "little", signed=True)


def frontiers_held(store: dist.Store, world: int, position: int) -> frozenset[int]:
    """The frontiers of `position`'s small state in `world` (its two slots; empty: none arrived)."""
    held = set()
    for slot in (0, 1):
        key = keys.small_state(world, position, slot)
        if store.check([key]):
            held.add(frontier_of(store.get(key)))
    return frozenset(held)


def read(store: dist.Store, world: int, position: int, frontier: int) -> dict[str, Any]:
    """`position`'s small state of `frontier` in `world` (a spare about to continue its stream);
    ValueError when the slot holds another frontier or nothing."""
    key = keys.small_state(world, position, frontier)
    if not store.check([key]):
        raise ValueError(f"no small state of rank {position} in the store")
    raw = store.get(key)
    if frontier_of(raw) != frontier:
        raise ValueError(f"the small state of rank {position} in the store is of F={frontier_of(raw)}, not "
                         f"F={frontier}")
    return decode(raw)


def apply(state: dict[str, Any], *, data_state: Any, stateful: tuple[Any, ...],
          optimizer: torch.optim.Optimizer, buffers: Sequence[tuple[dict, str, torch.Tensor]] = ()) -> None:
    """Make this process continue the stream `state` was taken from (a spare, after the transfer,
    whose buffers came from the source's own: `buffers`, this model's slots, take the lost rank's)."""
    saved_buffers = state.get("buffers", [])
    if len(saved_buffers) != len(buffers):
        raise ValueError(f"the lost rank replicated {len(saved_buffers)} module buffers, this rank's model has "
                         f"{len(buffers)}")
    for (_, name, live), (dtype, shape, _) in zip(buffers, saved_buffers):
        if tuple(live.shape) != tuple(shape) or str(live.dtype).removeprefix("torch.") != dtype:
            raise ValueError(f"module buffer {name!r}: the lost rank's is {dtype}{list(shape)}, this rank's "
                             f"{live.dtype}{list(live.shape)}")
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
    with torch.no_grad():
        for (_, _, live), (_, shape, raw) in zip(buffers, saved_buffers):
            host = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            live.copy_(host.view(live.dtype).reshape(shape))
    restore_rng_state(state["rng"])


class Replicator:
    """Writes this rank's small state to the store off the training thread. An update listener,
    ahead of every other: it captures the state of F+1 when the clean boundary of update F+1
    starts (`capture`), and the boundary joins the write right before its check (`before_check`)."""

    def __init__(self, store: dist.Store, position: int, capture: Callable[[], Any] | None = None,
                 world_of: Callable[[], int] = lambda: 0):
        self.store, self.position, self.world_of = store, position, world_of
        #: the state at the clean boundary, its `.frontier` the update that boundary commits
        self.capture = capture
        self._queue: queue.Queue[tuple[Slot, Any, int] | None] = queue.Queue(maxsize=1)
        self._done = threading.Condition()
        self.newest: Slot | None = None  # the newest value written
        self.offered: Slot | None = None  # the newest value offered
        self._offers = 0  # values offered so far; a slot can be offered twice (`offer_at_step_entry`)
        self._landed = 0  # the number of the offer newest written
        self._last: tuple[Slot, bytes | None] | None = None  # the newest value written, its `fingerprint`
        self._mine: collections.deque[Slot] = collections.deque(maxlen=4)  # offered, not failed
        self._wrote_in: tuple[int, int] | None = None  # (world, position) of the slots last written
        self.join_wait_s = 0.0  # time the training thread waited for a write (the critical-path cost)
        self.joins = 0
        self.capture_s = 0.0  # time the training thread spent capturing at boundaries
        self.captures = 0
        self.written = 0
        self.seconds = 0.0  # time spent serialising and writing (off the critical path)
        self.bytes = 0
        self.error = ""
        self.capture_problem = ""  # why the boundary's state could not be captured
        self._thread = threading.Thread(target=self._run, name="accelpact-small-state", daemon=True)
        self._thread.start()

    def offer(self, snapshot: Any, frontier: int) -> None:
        """Replicate `snapshot` (taken at `frontier`); never blocks. The snapshot's copies are its
        own (it is rebuilt at every boundary), so the thread may read them later."""
        self.offered = (self.world_of(), self.position, frontier)
        self._offers += 1
        item = (self.offered, snapshot, self._offers)
        self._mine.append(self.offered)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            try:
                self._queue.get_nowait()  # drop the older one: a join comes before every check
            except queue.Empty:
                pass
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                pass

    def offer_at_step_entry(self, snapshot: Any, frontier: int) -> None:
        """`rt.step`'s snapshot of F: the state a Rewind restores on the survivors, so the state a
        spare must start from. Written where this process has not written its state of F under
        its current world and position yet (its first update, a Replace, a shrink that renumbered
        it), and where it differs from the boundary's capture, byte for byte: the script ran
        something between two `rt.step` calls (a scheduler stepped after `rt.step`, random numbers
        drawn). Found by review: the boundary's capture stood, and a spare started one scheduler
        step behind its replica. Otherwise one write less per update (the comparison encodes the
        small state on this thread, tens of µs)."""
        slot = (self.world_of(), self.position, frontier)
        if slot in self._mine:
            with self._done:
                last = self._last
            if last is not None and last[0] == slot and last[1] is not None \
                    and last[1] == _fingerprint_or_none(snapshot, frontier):
                return
        self.offer(snapshot, frontier)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the newest offered value is in the store; False on timeout or error."""
        t = time.perf_counter()
        with self._done:
            ok = self._done.wait_for(lambda: self.offered is None or self._landed == self._offers or self.error,
                                     timeout=timeout_s)
        self.join_wait_s += time.perf_counter() - t
        self.joins += 1
        return bool(ok) and not self.error

    def pending(self) -> bool:
        return self.offered is not None and self._landed != self._offers

    # -- UpdateListener -------------------------------------------------------------------------
    def on_phase(self, update: int, phase: Any) -> None:
        """At the clean boundary: capture the state of the update it commits. Before the first
        forward: join a write offered at step entry."""
        if str(phase) == "committed" and self.capture is not None:
            t = time.perf_counter()
            try:
                snapshot = self.capture()
            except TypeError as exc:  # a data_state without state_dict: no Replace of this rank
                if not self.capture_problem:  # once: the decision's reject names the missing state
                    log.warning("small state not captured at the boundary: %s", exc,
                                extra={"position": self.position})
                self.capture_problem = str(exc)
                return
            self.capture_s += time.perf_counter() - t
            self.captures += 1
            self.offer(snapshot, snapshot.frontier)
        elif str(phase) == "forward" and self.pending():
            self._join("the forward")

    def before_check(self, update: int) -> None:
        """Right before this rank's contribution to the boundary check leaves: once a peer can
        commit update `update`, this rank's state of it is in the store."""
        if self.pending():
            self._join("the boundary check")

    def probe_order(self, labels: list[str]) -> list[str]:
        return labels

    def before_probe(self, label: str) -> bool:
        return True

    def stop(self) -> None:
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            pass

    def _join(self, before: str) -> None:
        if not self.flush():
            log.warning("small state of F=%s not replicated before %s: %s", self.offered[2] if self.offered else None,
                        before, self.error or "timed out", extra={"position": self.position})

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            slot, snapshot, number = item
            world, position, frontier = slot
            t = time.perf_counter()
            try:
                raw = encode(snapshot, frontier)
                self.store.set(keys.small_state(world, position, frontier), raw)
                self.store.check([keys.small_state(world, position, frontier)])  # a reply: the store has it
            except Exception as exc:  # the decision refuses a Replace without it; keep the cause
                with self._done:
                    self.error = f"{type(exc).__name__}: {exc}"
                    if slot in self._mine:
                        self._mine.remove(slot)
                    self._done.notify_all()
                log.warning("small-state replication failed: %s", self.error, extra={"position": position})
                continue
            self._forget_slots_left_behind(world, position)
            printed = _fingerprint_or_none(snapshot, frontier)
            self.written += 1
            self.bytes = len(raw)
            self.seconds += time.perf_counter() - t
            with self._done:
                self.newest, self._landed, self._last, self.error = slot, number, (slot, printed), ""
                self._done.notify_all()

    def _forget_slots_left_behind(self, world: int, position: int) -> None:
        """Delete this rank's slots of the world it left, once it wrote into the new one: only a
        spare taking over a *lost* position reads a world's slots after its change was decided,
        and a member that moved on was not lost (best effort: a failed delete leaves bytes behind)."""
        left, self._wrote_in = self._wrote_in, (world, position)
        if left is None or left == (world, position):
            return
        for parity in (0, 1):
            try:
                self.store.delete_key(keys.small_state(left[0], left[1], parity))
            except Exception as exc:  # noqa: BLE001 - what stays behind is only memory
                log.info("small state of world %d not deleted: %s: %s", left[0], type(exc).__name__, exc)
