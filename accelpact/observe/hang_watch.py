"""Stacks taken during a hang, not after it.

A timeout ends a hang: by the time the recovery writes its evidence, the thread that waited has
returned from the collective and its stack shows recovery code. So one daemon thread per runtime
(started at attach, stopped at close) watches the update in flight: the runtime arms it at every
phase the update enters (forward, backward, optimizer, the committed boundary's probes) by
writing one small record, no signal and no thread per update; once a phase has run for
`threshold_s` (a fraction of the data timeout), the thread takes the stacks of every thread,
once for that phase, into memory. A recovery freezes the watch as it begins (its own code is no
hang), its evidence carries what was taken (`take`), and a commit, recovery or reject disarms it.

Why per phase rather than per update: an update of a big model may compute longer than the data
timeout before the collective that hangs (the timeout bounds one collective, not an update), and
a snapshot taken during that computation would show no hang. Arming per phase bounds the cost
(at most one snapshot per phase, only in phases that run longer than the threshold) and catches
a hang that starts within `threshold_s` of its phase's start. What remains uncaught (a phase that
computes longer than the threshold, then hangs) still has the error's traceback and the
at-recovery stacks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .stacks import thread_stacks

if TYPE_CHECKING:
    from ..fsm.phases import FailurePhase
    from ..runtime.evidence import Evidence

__all__ = ["Armed", "HangStacks", "HangWatch", "next_look"]


@dataclass(frozen=True, slots=True)
class Armed:
    """The phase in flight: which update and phase, and since when (the watch's clock)."""

    update: int
    phase: str
    update_since: float
    phase_since: float


@dataclass(frozen=True)
class HangStacks:
    """Every thread's stack, taken while a phase had run past the threshold."""

    update: int
    phase: str
    wall_time: float  # time.time() when taken
    t: float  # time.monotonic() when taken, the traces' clock
    phase_ran_s: float  # how long the phase had run
    update_ran_s: float  # how long the update had run
    threshold_s: float
    stacks: dict[str, list[str]]

    def to_dict(self) -> dict[str, Any]:
        return {"update": self.update, "phase": self.phase, "wall_time": self.wall_time, "t": self.t,
                "phase_ran_s": round(self.phase_ran_s, 4), "update_ran_s": round(self.update_ran_s, 4),
                "threshold_s": self.threshold_s, "stacks": self.stacks}


def next_look(armed: Armed | None, taken_for: Armed | None, now: float, threshold_s: float) -> float | None:
    """Seconds until the watch should look again, or None: take the stacks now (pure).

    Idle, or this phase already taken: look again in one threshold (a phase armed meanwhile is
    then at most one threshold late, and its deadline is waited for exactly)."""
    if armed is None or armed is taken_for:
        return threshold_s
    remaining = armed.phase_since + threshold_s - now
    return None if remaining <= 0 else remaining


class HangWatch:
    """An `UpdateListener` (arms at every phase) and a `RecoveryObserver` (disarms at the end of
    the boundary); its daemon thread takes the stacks (see the module docstring)."""

    def __init__(self, threshold_s: float, *, clock: Callable[[], float] = time.monotonic,
                 stacks: Callable[[], dict[str, list[str]]] = thread_stacks):
        if not threshold_s > 0:
            raise ValueError(f"HangWatch threshold must be positive seconds, got {threshold_s!r}")
        self.threshold_s = threshold_s
        self._clock, self._stacks = clock, stacks
        self._armed: Armed | None = None  # written by the training thread only
        self._taken_for: Armed | None = None  # written by the watch thread only
        self._taken: HangStacks | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accelpact-hang-watch", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (idempotent); a runtime's close calls it through its observers."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # -- arming (the training thread) ---------------------------------------------------------------
    def arm(self, update: int, phase: str) -> None:
        """The update entered `phase`: one record written, nothing else."""
        now, armed = self._clock(), self._armed
        since = armed.update_since if armed is not None and armed.update == update else now
        self._armed = Armed(update, phase, since, now)

    def freeze(self) -> None:
        """A recovery begins: stacks taken from now on would show its code, not the hang; what
        was taken stays for the evidence."""
        self._armed = None

    def disarm(self) -> None:
        self._armed = None
        self._taken = None

    def take(self, update: int, *, also_next: bool = False) -> HangStacks | None:
        """The stacks taken during `update`, once (the evidence of its recovery or reject).
        `also_next`: or during update+1 (deferred boundaries: a joined recovery names the
        boundary's update while the hang was in the update after it, the one it throws away)."""
        self.freeze()
        taken, self._taken = self._taken, None
        wanted = (update, update + 1) if also_next else (update,)
        return taken if taken is not None and taken.update in wanted else None

    # -- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        wait = self.threshold_s
        while not self._stop.wait(wait):
            armed = self._armed
            wait = next_look(armed, self._taken_for, self._clock(), self.threshold_s)
            if wait is None:
                self._snapshot(armed)
                wait = self.threshold_s

    def _snapshot(self, armed: Armed) -> None:
        me = f"({threading.get_ident()})"
        stacks = {name: frames for name, frames in self._stacks().items() if not name.endswith(me)}  # not its own
        now = self._clock()
        if self._armed is not armed:  # the phase ended while the stacks were read: they show no hang
            return
        self._taken_for = armed
        self._taken = HangStacks(armed.update, armed.phase, time.time(), time.monotonic(), now - armed.phase_since,
                                 now - armed.update_since, self.threshold_s, stacks)

    # -- UpdateListener -----------------------------------------------------------------------------
    def on_phase(self, update: int, phase: FailurePhase) -> None:
        self.arm(update, str(phase))

    def probe_order(self, labels: list[str]) -> list[str]:
        return labels

    def before_probe(self, label: str) -> bool:
        return True

    # -- RecoveryObserver: the boundary ended -------------------------------------------------------
    def on_commit(self, frontier: int, generation: int) -> None:
        """A commit ends the hangs of the updates it covers, not of one past it: a deferred
        boundary commits `frontier` while update frontier+1 may have hung (its stacks are that
        update's evidence, found by review: the commit threw them away)."""
        self._armed = None
        if self._taken is not None and self._taken.update <= frontier:
            self._taken = None

    def on_recovery(self, evidence: Evidence) -> None:
        self.disarm()

    def on_reject(self, evidence: Evidence) -> None:
        self.disarm()
