"""The runtime shell: trainer hooks, the committed boundary, `rt.step` / `rt.update`, `close`.

It owns the rank's accounting (F, g, tau, the update in flight) and the order of things at a boundary;
the rest is handed to it by `attach`: data plane (groups, probes, rebind plans, standbys, device fence),
control plane, trace, envelope facts, rewind state, checkpointer, listeners. A recovery is the pure
driver stepped against a `RecoveryExecutor`; a Reject raises `RecoveryRejected` for `fail_stop`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from ..config import Config
from ..control import ControlPlane
from ..errors import ConfigError, ControlPlaneError, RankFenced, RecoveryRejected
from ..fsm.decisions import EnvelopeFacts
from ..fsm.machine import RecoveryContext, RecoveryMachine
from ..fsm.phases import FailurePhase, RecoveryAction
from ..rebind import NotReadyError
from ..trace import TraceWriter
from .after_commit import after_commit
from .data_plane import DataPlane
from .deferred import DeferralCounts, defer, settle_before_step
from .deferred import settle as settle_deferred
from .detach import detach
from .device_fence import fence_update
from .evidence import evidence_of, write_reject_evidence
from .executor import RecoveryExecutor
from .fail_stop import fail_stop
from .history import RecoveryRecord
from .hooks import PhaseTracker
from .late_discovery import discover_late
from .link_wait import checked_after_links
from .listeners import Observers, UpdateListener
from .member_change import member_lost, on_lost_member, record_train, release_spares
from .recovery import drive, observe
from .rewind import RewindState
from .stragglers import StragglerWatch

T = TypeVar("T")

log = logging.getLogger("accelpact.runtime")

#: Marks a model that has a runtime attached (one runtime per model: two would hook every
#: update twice and let F and tau drift apart).
ATTACHED = "_accelpact_attached"


class Runtime:
    """One rank's AccelPact runtime. Create with `accelpact.attach`."""

    def __init__(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, data_state: Any, config: Config,
                 rank: int, world_size: int, attempt: int, profile: str, platform: str, envelope: EnvelopeFacts,
                 envelope_source: str, data_plane: DataPlane, control: ControlPlane, trace: TraceWriter,
                 rewind: RewindState):
        self.model, self.optimizer, self.data_state, self.config = model, optimizer, data_state, config
        self.rank, self.world_size, self.attempt = rank, world_size, attempt
        self.profile, self.platform, self.envelope, self.envelope_source = profile, platform, envelope, envelope_source
        self.data_plane, self.control, self.trace, self.rewind = data_plane, control, trace, rewind
        self.machine = RecoveryMachine(RecoveryContext(rank), on_edge=self._on_edge if trace.enabled else None)
        self.frontier = self.opt_step = 0  # F: committed updates; tau: optimizer steps applied
        self.generation = 0  # g: communicator generation (equal on every rank)
        self.update_index = 0  # 1-based index of the update in progress (this process)
        self.checkpointer = self.digests = None  # set by attach: Config.checkpoint_dir, Config.digest_every
        self.history: list[RecoveryRecord] = []
        self.listeners: list[UpdateListener] = []
        self.observers = Observers()  # exporters of commits, recoveries, rejects (accelpact.observe)
        self.stragglers = StragglerWatch(control, config, rank=rank, world_size=world_size)  # .report(): p50/p90
        self.timeouts = self.hang_watch = self.link_wait = None  # attach: DerivedTimeouts, HangWatch; runtime.link_wait
        self._recoveries, self._rewound, self._plans_deferred, self._late = 0, False, False, {}
        self.deferral = DeferralCounts()  # a boundary agreed one step late (Config.boundary)
        self.membership = self.heartbeat = self.replicator = self.neighbours = None  # set by attach under ACCELPACT_SPARES
        self.recipe, self.origin_names = None, {}  # what a rebuilt world replays (membership.world)
        self.shrinks: list[dict[str, Any]] = []  # each change to fewer replicas (Config.on_loss="shrink")
        self._tracker = PhaseTracker(model, optimizer, on_phase=self._notify, before_step=self._before_step,
                                     after_step=self._after_step)
        setattr(model, ATTACHED, True)

    # ---------------------------------------------------------------- public API -----------
    def prepare(self) -> dict[str, int]:
        """Discover the rebind plans now (idempotent); returns references found per group label."""
        fresh, (counts, seconds) = not self.data_plane.plans, self.data_plane.prepare()
        if fresh:
            self.trace.write({"kind": "plans", "references": counts, "discover_ms": seconds * 1e3})
        return counts

    def line_up(self) -> None:
        """Discover the rebind plans where the wrappers allow it (FSDP1 only after its first forward),
        then line every rank up (discovery can take longer than the data-plane timeout, and a peer
        already inside the first forward would time out on us); then connect the groups' standbys."""
        try:
            self.prepare()
        except NotReadyError:
            self._plans_deferred = True
        self.control.boundary_check(0)
        self.data_plane.standby.fill(self.data_plane, self.data_plane.groups, token=self.generation)

    @property
    def groups(self) -> dict[str, dist.ProcessGroup]:  # by label, replacements included
        return dict(self.data_plane.groups)

    @property
    def replicas(self) -> int:
        """Whole model copies now: fewer after a shrink (a trainer may scale its learning rate)."""
        gid = self.data_plane.gids.get("replicate")
        return len(gid.ranks) if gid is not None else 1

    def add_listener(self, listener: UpdateListener) -> None:  # see listeners.UpdateListener
        self.listeners.append(listener)

    @contextlib.contextmanager
    def update(self) -> Iterator[Runtime]:
        """One optimizer update. Its exit is the committed boundary: health check, control-plane check,
        and recovery if any rank saw a failure. The body cannot be run again, so a failure inside it
        is preserved (at the boundary) or rejected, never rewound: see `step`."""
        if not self.rewind.in_step:  # a boundary left in flight is agreed before a body that cannot run again
            self.settle()
        self.update_index += 1
        self._tracker.begin()
        error: BaseException | None = None
        try:
            yield self
        except Exception as exc:  # every failure goes through the protocol, so no peer hangs
            error = exc
        finally:
            phase_at_error = self._tracker.leave()
        self._fail_stop_on_reject(self._boundary, error, phase_at_error)

    def _fail_stop_on_reject(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (RecoveryRejected, RankFenced) as rejected:
            fail_stop(rejected, on_reject=self.config.on_reject, rank=self.rank)

    def step(self, fn: Callable[[], T]) -> T:
        """Run `fn()` as one optimizer update (forward, backward, optimizer.step(), zero_grad). Unlike
        `with rt.update():` the body can run again: if the update is interrupted and every rank agrees to
        Rewind, the partial update is discarded, RNG and data cursor go back to this boundary's snapshot,
        every group is rebuilt, and `fn()` runs once more."""
        self.rewind.begin_step(self.data_state, self.frontier + (self.deferral.pending is not None), self.model,
                               self.optimizer)  # a boundary in flight is the one this snapshot is of
        if self.replicator is not None and self.rewind.snapshot is not None:  # off the critical path
            self.replicator.offer_at_step_entry(self.rewind.snapshot, self.frontier)
        while True:
            self._rewound = False
            self.rewind.in_step = True
            try:
                with self.update():
                    result = fn()
            finally:
                self.rewind.in_step = False
            if not self._rewound:
                return result

    def settle(self) -> None:
        """Agree now a deferred boundary still in flight (`Config.boundary`; `close` does too), between updates."""
        if self._tracker.phase is not None:  # a Reject raised here would be taken for the update's own error
            raise ConfigError("rt.settle() inside an update: call it between updates (rt.step settles for you)")
        self._fail_stop_on_reject(settle_deferred, self, rerun=False)

    def restore(self):
        """Restore the newest verified checkpoint now (attach does when configured). A deferred boundary is
        settled first: its check's collective and the restore's would meet in the control group in any order."""
        if self.checkpointer is None:
            raise ConfigError("restore() needs Config.checkpoint_dir")
        self.settle()
        return self.checkpointer.restore()

    def close(self) -> None:
        """Agree a deferred boundary; then, even if that failed, detach: hooks, trace, control plane."""
        try:
            self.settle()
        finally:
            detach(self, ATTACHED)

    def _notify(self, phase: FailurePhase) -> None:
        for listener in self.listeners:
            listener.on_phase(self.update_index, phase)

    def _before_step(self) -> None:
        settle_before_step(self)  # nothing of the next update is applied before its boundary is agreed
        self.rewind.before_optimizer_step(self.model, self.optimizer, self.frontier)

    def _after_step(self) -> None:
        self.opt_step += 1

    def _step_undone(self, frontier: int) -> None:  # a restored pre-step copy: tau is F again
        self.opt_step = frontier

    # ---------------------------------------------------------------- boundary ----------------
    def _boundary(self, error: BaseException | None, phase_at_error: FailurePhase | None) -> None:
        t_detect = time.perf_counter()
        if self.deferral.pending is not None and settle_deferred(self, error):
            return  # joined the recovery of the boundary this update went past; it runs again
        if self._plans_deferred:  # first boundary of a lazily initialised wrapper (FSDP1)
            alone, self._plans_deferred = self._plans_deferred == "alone", False  # "alone": a spare that joined
            error, phase_at_error = discover_late(self, error, phase_at_error, line_up=not alone)
        error, phase_at_error = fence_update(self, error, phase_at_error)  # NCCL: did its device work end?
        if error is None:  # tau counts a body run to its end, a step GradScaler skipped too (as the spec's records)
            phase, self.opt_step = FailurePhase.COMMITTED, max(self.opt_step, self.update_index)
            self._notify(phase)
            if defer(self, t_detect):
                return  # agreed one step late (fsm.deferral): no probe, no wait
            failed, causes = self.data_plane.health_check(self.listeners) if self.config.health_check else ([], [])
            saw, cause, fault = bool(failed), "; ".join(causes), True
        else:
            phase, failed, saw = phase_at_error or FailurePhase.FORWARD, [], True
            cause, fault = self.data_plane.diagnose(error)
        try:
            if self.membership is not None and saw and member_lost(self, cause):
                raise ControlPlaneError("a member is lost")  # its peers left, or will leave, the control plane
            flag = checked_after_links(self, saw, t_detect)  # after a failure: once the links answer
        except ControlPlaneError as exc:
            if self.membership is not None:  # a member may be lost: a spare can take its place
                return on_lost_member(self, error or exc, phase, time.perf_counter() - t_detect, at_check=not saw)
            self._reject_without_protocol(f"control plane failed at the boundary: {exc}", error or exc, phase)
        if flag == 0:
            self._commit()
            return
        bug = error if error is not None and not fault else None
        self._recover(error, phase, saw, failed, cause, time.perf_counter() - t_detect, bug)

    def _commit(self, late_s: float = 0.0) -> None:  # late_s: a deferred boundary, after the body ended
        record_train(self)  # under membership: update F+1 trained from F in this world
        self.frontier += 1
        self.opt_step = self.frontier  # tau counts updates: a step GradScaler skipped (inf grads) ended one too
        self._late = {"commit_update": late_s}  # on its edge: run_report times the update to its end
        self.machine.fire("commit_update")
        self.observers.commit(self.frontier, self.generation, late_s)
        after_commit(self)  # replica digests (every Config.digest_every), then the checkpoint: may reject

    # ---------------------------------------------------------------- recovery ----------------
    def _recover(self, error, phase, saw, failed, cause, detect_s, bug: BaseException | None) -> None:
        """`bug`: the update raised it and it is no communication failure (every rank rejects)."""
        self._recoveries += 1
        obs = observe(self, phase, saw, failed, cause, bug)
        self.trace.write({"kind": "observe", "seq": self.control.seq, "update": self.update_index,
                          "phase_failed": str(phase), "saw": saw, "cause": cause,
                          "failed_groups": [g.key for g in failed]})
        executor = RecoveryExecutor.for_runtime(self, f"r{self._recoveries}")
        outcome = (driven := drive(self.machine, obs, executor)).outcome
        record = RecoveryRecord.of(self._recoveries, self.update_index, obs, detect_s, driven, executor)
        record.standby_s = self.data_plane.standby.after_recovery(self.data_plane, self.rank, outcome)  # after release
        self.history.append(record)
        self.trace.write({"kind": "recovery", **record.to_dict()})
        if outcome.action is RecoveryAction.REJECT:
            record.reasons = list(outcome.reasons) + self.control.release_reasons(executor.epoch)
            self._reject(record.reasons, error, record, original=bug)
        if committed := outcome.frontier > self.frontier:  # a Preserve committed update F+1 at its boundary
            record_train(self)
        self.frontier, self.generation = outcome.frontier, outcome.generation
        self.opt_step = self.frontier if committed else self.opt_step  # as at a commit (`_commit`)
        if outcome.action is RecoveryAction.REWIND:
            self.update_index -= 1  # the same update runs again (faults already fired stay fired)
            self._rewound = True
            self.rewind.rewinds += 1
        log.info(record.summary())
        self.observers.recovered(evidence_of(self, record, error))
        if committed:  # what is due at the frontier it committed (a save, a digest check): every rank alike
            after_commit(self)

    def _reject_without_protocol(self, reason: str, error: BaseException, phase: FailurePhase | None = None) -> NoReturn:
        """The control plane itself failed: set the outcome register and reject (`phase`: where the update failed)."""
        self._recoveries += 1
        try:
            value = self.control.force_reject(f"r{self._recoveries}", reason)  # this recovery's register
        except ControlPlaneError as exc:
            value = f"unreachable ({exc})"
        record = RecoveryRecord.control_plane_reject(self._recoveries, self.update_index, phase or self._tracker.phase,
                                                     reason, self.frontier, self.generation, value)
        self.history.append(record)
        self._reject([reason], error, record)

    def _reject(self, reasons: list[str], error: BaseException | None, record: RecoveryRecord,
                original: BaseException | None = None) -> NoReturn:
        """Leave the evidence, record the fail-stop, raise (the edge decides about exiting)."""
        found = evidence_of(self, record, error)
        release_spares(self, reasons)
        evidence = write_reject_evidence(self.config.trace_dir, found)
        self.observers.rejected(found)
        if self.checkpointer is not None:
            self.checkpointer.record_fail_stop(self.frontier, reasons)
        log.error("recovery rejected on rank %d: %s", self.rank, "; ".join(reasons))
        rejected = RecoveryRejected(tuple(reasons), evidence, rank=self.rank, frontier=self.frontier)
        rejected.original = original  # the user's own exception reaches the user as it is
        raise rejected from error

    def _on_edge(self, trigger: str, src: str, dst: str) -> None:
        self.trace.edge(seq=self.control.seq, action=trigger, src=src, dst=dst, frontier=self.frontier,
                        generation=self.generation, refs=dict(self.data_plane.ref_generation),
                        update=self.update_index, tau=self.opt_step, late_s=self._late.get(trigger, 0.0))

