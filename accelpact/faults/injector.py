"""The drill's fault injector: installed on a runtime from outside, never part of it.

The runtime offers one extension point, `UpdateListener` (`accelpact.runtime.listeners`): it
says which phase an update is in and lets a listener order and hold back the boundary's health
probes. The injector is such a listener; `accelpact.attach` installs one when the job carries a
fault plan (`ACCELPACT_FAULTS`, or `faults=` given to attach), so that users drill unchanged
trainers while the production path holds no sleep and no self-kill.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from ..errors import ConfigError, ControlPlaneError
from ..fsm.phases import FailurePhase
from .inject import LATE_MARGIN_S, kill_self, perform
from .plan import Fault, FaultKind, FaultPlan

log = logging.getLogger("accelpact.faults")

ENV_FAULTS = "ACCELPACT_FAULTS"
ENV_EVERY_ATTEMPT = "ACCELPACT_FAULTS_EVERY_ATTEMPT"


#: The booleans `Config.with_env` accepts (case-insensitive, stripped); anything else is refused.
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _every_attempt(env: dict[str, str]) -> bool:
    """ACCELPACT_FAULTS_EVERY_ATTEMPT as Config reads a boolean: a typo ("ture", "2", empty) would
    otherwise silently mean "first attempt only", and the drill would test less than it says."""
    raw = env.get(ENV_EVERY_ATTEMPT)
    if raw is None:
        return False
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"{ENV_EVERY_ATTEMPT}={raw!r}: not a boolean; expected one of "
                      f"{', '.join(_TRUE)} or {', '.join(_FALSE)}")


class FaultInjector:
    """Fires each planned fault once, on its rank, at its (update, phase)."""

    def __init__(self, plan: FaultPlan | str, *, rank: int, data_timeout_s: float):
        self.plan = FaultPlan.parse(plan) if isinstance(plan, str) else plan
        self.rank = rank
        self.data_timeout_s = data_timeout_s
        self._fired: set[tuple[int, FailurePhase]] = set()
        self._boundary: Fault | None = None  # the committed-phase fault of the boundary at hand
        #: a spare that took over this rank: the faults of updates up to here already fired in
        #: the process it replaced (the re-run of the interrupted update included)
        self.fired_through = 0

    @classmethod
    def from_env(cls, *, rank: int, world_size: int, attempt: int, data_timeout_s: float,
                 env: dict[str, str] | None = None) -> FaultInjector | None:
        """The injector `ACCELPACT_FAULTS` asks for, or None. A drill's faults fire in the first
        attempt only (so the restarted job can finish) unless ACCELPACT_FAULTS_EVERY_ATTEMPT=1."""
        env = dict(os.environ if env is None else env)
        try:
            plan = FaultPlan.parse(env.get(ENV_FAULTS, ""))
        except ConfigError as exc:
            raise ConfigError(f"{ENV_FAULTS}: {exc}") from None
        every = _every_attempt(env)
        return cls.for_attempt(plan, rank=rank, world_size=world_size, attempt=attempt,
                               data_timeout_s=data_timeout_s, every_attempt=every)

    @classmethod
    def for_attempt(cls, plan: FaultPlan | str, *, rank: int, world_size: int, attempt: int,
                    data_timeout_s: float, every_attempt: bool = False) -> FaultInjector | None:
        plan = FaultPlan.parse(plan) if isinstance(plan, str) else plan
        plan.validate(world_size)
        if not plan or (attempt > 0 and not every_attempt):
            return None
        return cls(plan, rank=rank, data_timeout_s=data_timeout_s)

    def _take(self, update: int, phase: FailurePhase | str) -> Fault | None:
        if (update, phase) in self._fired or update <= self.fired_through:
            return None
        fault = self.plan.at(update, phase, self.rank)
        if fault is not None:
            self._fired.add((update, phase))
        return fault

    # -- UpdateListener ----------------------------------------------------------------------------
    def on_phase(self, update: int, phase: FailurePhase) -> None:
        """Inside an update: perform the fault planned here. At the boundary: a kill strikes
        before any probe; a skip or late is kept for the probes of its group. A boundary without
        probes (a deferred boundary) leaves it to the next update's forward, the next collective
        the rank skips or is late for."""
        unprobed, self._boundary = self._boundary, None
        if unprobed is not None and phase is FailurePhase.FORWARD:
            log.info("no probe met %s: it strikes in the next forward", unprobed)
            perform(unprobed, data_timeout_s=self.data_timeout_s)
        fault = self._take(update, phase)
        if phase is not FailurePhase.COMMITTED:
            if fault is not None:
                perform(fault, data_timeout_s=self.data_timeout_s)
            return
        self._boundary = fault if fault is not None and fault.kind in (FaultKind.SKIP, FaultKind.LATE) else None
        if fault is not None and fault.kind is FaultKind.KILL:
            log.info("injecting %s", fault, extra={"fault": str(fault)})
            kill_self()
        if fault is not None and fault.kind is FaultKind.STALL:
            perform(fault, data_timeout_s=self.data_timeout_s)

    def on_recovery_step(self, update: int, step: str) -> None:
        """The recovery that update `update`'s failure started enters `step` (guard, agree, ...):
        a kill or stall planned there strikes now, a rank lost in the middle of the protocol."""
        fault = self._take(update, step)
        if fault is not None:
            perform(fault, data_timeout_s=self.data_timeout_s)

    def after_check(self, update: int, flag: int) -> None:
        """The boundary check of `update` completed on this rank: a kill planned at `check` strikes
        before it commits; a miss makes the check fail here although it completed (its peers
        commit, this rank joins the recovery as one whose all-reduce broke mid-exchange)."""
        fault = self._take(update, "check")
        if fault is None:
            return
        log.info("injecting %s", fault, extra={"fault": str(fault)})
        if fault.kind is FaultKind.KILL:
            kill_self()
        raise ControlPlaneError(f"injected {fault}: the boundary check of update {update} failed on this rank after "
                                "its contribution left")

    def before_commit_work(self, update: int) -> None:
        """Update `update` is committed here and a save or digest check is due: a kill planned at
        `save` strikes before it, so the peers meet this rank's absence inside that work; a miss
        fails that work here as a control plane cut past its bound would, every process alive."""
        fault = self._take(update, "save")
        if fault is None:
            return
        log.info("injecting %s", fault, extra={"fault": str(fault)})
        if fault.kind is FaultKind.MISS:
            raise ControlPlaneError(f"injected {fault}: the control plane failed on this rank in the work after the "
                                    f"commit of update {update}")
        perform(fault, data_timeout_s=self.data_timeout_s)

    def probe_order(self, labels: list[str]) -> list[str]:
        """The group a boundary fault targets goes last, so a late rank does not stall the others.
        A rank without a group of that label (a fully sharded job has no "replicate" group) is
        skipped or late for its last probed group instead: the boundary's health check is the
        collective it misses either way."""
        if self._boundary is not None and labels and self._boundary.group not in labels:
            self._boundary = dataclasses.replace(self._boundary, group=sorted(labels)[-1])
        target = self._boundary.group if self._boundary is not None else None
        return sorted(labels, key=lambda label: (label == target, label))

    def before_probe(self, label: str) -> bool:
        """False: skip this group's probe (its peers time out). A late rank sleeps past the
        data timeout first, so its probe meets a closed connection."""
        fault = self._boundary
        if fault is None or label != fault.group:
            return True
        self._boundary = None  # met by its probe
        log.info("injecting %s", fault, extra={"fault": str(fault)})
        if fault.kind is FaultKind.SKIP:
            return False
        if fault.kind is FaultKind.LATE:
            time.sleep(self.data_timeout_s + LATE_MARGIN_S)
        return True
