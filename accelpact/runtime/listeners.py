"""The runtime's extension points: listeners see inside an update, observers see its outcome.

A listener learns which phase the update in flight is in and may order, or hold back, the
boundary's health probes. The drills' fault injector (`accelpact.faults.FaultInjector`) is one;
a tracer or a profiler could be another. The runtime calls listeners and never knows what they
do, so drill code stays out of the production path.

An observer learns what the boundary decided: a commit, a recovery that resumed, a reject, with
the evidence of each (`evidence.Evidence`). The exporters of `accelpact.observe` (Prometheus,
OpenTelemetry, torchelastic events, the incident log) are observers; `attach` installs them.
An observer that fails is logged with its traceback and training goes on: telemetry must not
turn a recovered failure into a lost job."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..fsm.phases import FailurePhase

if TYPE_CHECKING:
    from .evidence import Evidence

log = logging.getLogger("accelpact.runtime")


@runtime_checkable
class UpdateListener(Protocol):
    """Hears where an update stands. Optional, looked up by name: `on_recovery_step(update, step)`,
    called as a recovery enters each step (guard, agree, ...; `RecoveryExecutor.before_effect`);
    `before_check(update)` and `after_check(update, flag)`, called around the boundary's
    control-plane check (`checked`); `before_commit_work(update)`, called when update `update` is
    committed and work is due after it (a save, a digest check: `after_commit`), before it begins
    (a ControlPlaneError it raises is that work's failure)."""

    def on_phase(self, update: int, phase: FailurePhase) -> None:
        """Update `update` (1-based) entered `phase`; COMMITTED: its boundary check begins."""

    def probe_order(self, labels: list[str]) -> list[str]:
        """The order in which the boundary probes the data-plane groups (a permutation)."""

    def before_probe(self, label: str) -> bool:
        """Called right before probing group `label`; False holds the probe back."""


def checked(listeners: Sequence[object], update: int, check: Callable[[], int]) -> int:
    """The boundary's control-plane check, `check()`, with every listener told right before this
    rank's contribution leaves (the small-state replicator joins its write there: a peer may
    commit `update` as soon as every contribution reached it) and right after its flag is known,
    before anything is committed. A ControlPlaneError of either is the check's own failure."""
    tell_before_check(listeners, update)
    flag = check()
    for listener in listeners:
        hook = getattr(listener, "after_check", None)
        if hook is not None:
            hook(update, flag)
    return flag


def tell_before_check(listeners: Sequence[object], update: int) -> None:
    """`before_check` of every listener that has one (a deferred boundary posts its check after it)."""
    for listener in listeners:
        hook = getattr(listener, "before_check", None)
        if hook is not None:
            hook(update)


def tell_before_commit_work(listeners: Sequence[object], update: int) -> None:
    """`before_commit_work` of every listener that has one."""
    for listener in listeners:
        hook = getattr(listener, "before_commit_work", None)
        if hook is not None:
            hook(update)


@runtime_checkable
class RecoveryObserver(Protocol):
    def on_commit(self, frontier: int, generation: int) -> None:
        """Every rank committed update `frontier` (F is now `frontier`)."""

    def on_recovery(self, evidence: Evidence) -> None:
        """A recovery ended in Preserve or Rewind: training goes on."""

    def on_reject(self, evidence: Evidence) -> None:
        """A recovery (or the control plane) rejected; `RecoveryRejected` is raised next."""

    def close(self) -> None:
        """The runtime closes: flush what is buffered.

        Optional, looked up by name: `on_checkpoint(step, error)`, after every checkpoint save
        (`error` None: published; else why not, whether the job went on or fails stop);
        `on_late_commit(frontier, generation, late_s)`, instead of `on_commit` when a deferred
        boundary commits its update `late_s` seconds after the update's body ended."""


class Observers:
    """The installed observers, notified in order; one that raises is logged and skipped."""

    def __init__(self) -> None:
        self.items: list[RecoveryObserver] = []

    def add(self, observer: RecoveryObserver) -> None:
        if not isinstance(observer, RecoveryObserver):
            raise TypeError(f"{type(observer).__name__} is not a RecoveryObserver")
        self.items.append(observer)

    def commit(self, frontier: int, generation: int, late_s: float = 0.0) -> None:
        """`late_s` > 0: a deferred boundary agreed the update that long after its body ended (in
        the next update, or after the next update failed). An observer that times updates gets
        it through `on_late_commit` if it has one: without it, a hang in the next update would
        count as the committed update's time (productive) instead of as detection."""
        if late_s <= 0:
            self._each("on_commit", frontier, generation)
            return
        for observer in self.items:
            if hasattr(observer, "on_late_commit"):
                self._call(observer, "on_late_commit", frontier, generation, late_s)
            else:
                self._call(observer, "on_commit", frontier, generation)

    def recovered(self, evidence: Evidence) -> None:
        self._each("on_recovery", evidence)

    def rejected(self, evidence: Evidence) -> None:
        self._each("on_reject", evidence)

    def checkpoint(self, step: int, error: str | None) -> None:
        self._each("on_checkpoint", step, error, optional=True)

    def close(self) -> None:
        self._each("close")

    def _each(self, method: str, *args: object, optional: bool = False) -> None:
        for observer in self.items:
            if optional and not hasattr(observer, method):
                continue
            self._call(observer, method, *args)

    @staticmethod
    def _call(observer: RecoveryObserver, method: str, *args: object) -> None:
        try:
            getattr(observer, method)(*args)
        except Exception:  # telemetry never fails training; the traceback is kept in the log
            log.warning("observer %s.%s failed", type(observer).__name__, method, exc_info=True)
