"""The AccelPact runtime: attach to a wrapped model, guard every update boundary, and run the
six-phase recovery when a data-plane collective fails.

This module is the effect layer. What to do next is decided by the pure driver
(`accelpact.fsm.driver.run_recovery`) and the transition table; this module performs the
effects it asks for: the guard, control-plane exchanges, group replacement, rebinding and
validation, and the fail-stop exit.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from ..comm import classify_failure, replace_group, retired_group_names, validate_group
from ..config import Config
from ..control import ControlPlane, ControlPlaneError
from ..errors import EXIT_REJECTED, ConfigError, RecoveryRejected
from ..faults import Fault, FaultKind, FaultPlan, InjectedFault
from ..faults import perform as perform_fault
from ..faults.inject import LATE_MARGIN_S, kill_self
from ..fsm.decisions import GroupId, RankReport
from ..fsm.driver import (
    ControlPlaneFailure,
    Effect,
    ForceReject,
    GatherReports,
    GuardVerdict,
    Observation,
    Quiesce,
    RebindReferences,
    RecoveryOutcome,
    ReplaceGroups,
    RestoreBoundary,
    StepResult,
    ValidateGroups,
    VoteRelease,
    run_recovery,
)
from ..fsm.envelope import Envelope, ObservationKey, UnknownObservationKey
from ..fsm.machine import RecoveryContext, RecoveryMachine
from ..fsm.phases import FailurePhase, RecoveryAction
from ..launch import current_attempt
from ..rebind import NotReadyError, data_plane_groups, discover
from ..trace import TraceWriter
from .envelope_choice import choose_envelope
from .guard import quiesce
from .report import RecoveryReport

T = TypeVar("T")

log = logging.getLogger("accelpact.runtime")

_EFFECT_PHASE = {
    Quiesce: "guard",
    GatherReports: "agree",
    RestoreBoundary: "restore",
    ReplaceGroups: "replace",
    RebindReferences: "rebind",
    ValidateGroups: "validate",
    VoteRelease: "release",
    ForceReject: "reject",
}


_ATTACH_COUNT = 0


class UnsupportedModelError(TypeError):
    """attach() was handed a model AccelPact does not know how to protect."""


def detect_profile(model: nn.Module) -> str:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(model, DDP):
        return "ddp"
    if any(isinstance(m, FSDP) for m in model.modules()):
        return "fsdp1-hsdp"
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    if any(_get_module_fsdp_state(m) is not None for m in model.modules()):
        return "fsdp2-hsdp"
    raise UnsupportedModelError(
        f"unknown model type {type(model).__name__}: AccelPact protects models wrapped with FSDP1 "
        "(FullyShardedDataParallel, HYBRID_SHARD), FSDP2 (fully_shard on a 2-D DeviceMesh) or DDP"
    )


def detect_platform(groups: dict[str, dist.ProcessGroup]) -> str:
    backends = {dist.get_backend(pg) for pg in groups.values()}
    if backends <= {"gloo"}:
        return "cpu-gloo"
    if backends <= {"nccl"}:
        return "cuda-nccl"
    return "+".join(sorted(backends))


class Runtime:
    """One rank's AccelPact runtime. Create with `accelpact.attach`."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_state: Any = None,
        config: Config | None = None,
        *,
        envelope: Envelope | None = None,
        meshes: tuple[Any, ...] = (),
    ):
        if not dist.is_initialized():
            raise RuntimeError("call torch.distributed.init_process_group before accelpact.attach")
        self.config = (config or Config()).with_env().validate()
        self.model = model
        self.optimizer = optimizer
        self.data_state = data_state
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.attempt = current_attempt()
        self.config.faults.validate(self.world_size)
        if self.attempt > 0 and not self.config.faults_every_attempt:
            self._faults = FaultPlan()  # a drill's faults fire in the first attempt only
        else:
            self._faults = self.config.faults

        self.profile = self.config.profile or detect_profile(model)
        self._groups: dict[str, dist.ProcessGroup] = dict(data_plane_groups(model))
        if not self._groups:
            raise UnsupportedModelError(f"found no data-plane process group in {type(model).__name__}")
        # Detection is bounded by the data-plane timeout (gloo cannot abort a collective), so
        # attach enforces it on every data-plane group: a 30-minute default would mean 30 minutes.
        data_timeout = datetime.timedelta(seconds=self.config.data_timeout_s)
        for pg in self._groups.values():
            dist.distributed_c10d._set_pg_timeout(data_timeout, pg)
        self.platform = self.config.platform or detect_platform(self._groups)
        if envelope is None:
            envelope, self.envelope_source = choose_envelope(self.config, self.platform, self.profile, rank=self.rank)
        else:
            self.envelope_source = "given to attach"
        self.envelope = envelope
        key = ObservationKey(self.platform, self.profile, FailurePhase.COMMITTED)
        self.envelope.lookup(key)  # unknown platform/profile: refuse at attach with a clear error
        self._gids = {
            label: GroupId(label, tuple(sorted(dist.get_process_group_ranks(pg))))
            for label, pg in self._groups.items()
        }
        self._extra = [optimizer, *meshes]
        # Rebind plans are discovered once. FSDP1 finishes wiring its groups in its first forward
        # (lazy init), so discovery runs at the first boundary, before any health check can retire
        # a group; `prepare()` does it earlier for wrappers that are already initialised.
        self._plans: dict = {}
        self._probes: dict[str, torch.Tensor] = {}  # one health-check tensor per group label
        self._ref_generation = {label: 0 for label in self._groups}

        # Keys of the outcome registers are scoped by restart attempt and by attach in this
        # process (every rank attaches in the same order), so no register is ever reused.
        global _ATTACH_COUNT
        _ATTACH_COUNT += 1
        self.control = ControlPlane(
            timeout_s=self.config.control_timeout_s, namespace=f"attempt{self.attempt}/attach{_ATTACH_COUNT}"
        )
        self.trace = TraceWriter(self.config.trace_dir, self.rank, self.attempt)
        self.machine = RecoveryMachine(RecoveryContext(self.rank), on_edge=self._on_edge)

        self.frontier = 0  # F: committed updates
        self.generation = 0  # g: communicator generation (equal on every rank)
        self.opt_step = 0  # tau: optimizer steps applied
        self.update_index = 0  # 1-based index of the update in progress (this process)
        self.history: list[RecoveryReport] = []
        self.checkpointer = None  # set by the checkpoint integration when configured
        self._phase: FailurePhase | None = None
        self._injected: set[tuple[int, FailurePhase]] = set()
        self._recoveries = 0
        # Rewind state: the boundary snapshot of F (taken as `step` starts an update), the
        # optional pre-step copy, whether the update in flight can be re-run, rewinds so far.
        self._snapshot = None
        self._snapshot_problem = ""
        self._step_copy = None
        self._step_copy_for: int | None = None
        self._rerunnable = False
        self._rewound = False
        self._rewinds = 0
        self._failure_phase: FailurePhase | None = None
        # A re-run after a backward failure needs DDP's bucket all-reduces isolated from the
        # interrupted backward's late ones (see ddp_buckets); '' when isolated or not DDP.
        self._unisolated_ddp = ""
        if FailurePhase.BACKWARD in self._rewind_phases():
            self._unisolated_ddp = self._isolate_ddp_buckets()
        self._hooks = [
            model.register_forward_pre_hook(self._on_forward_pre),
            model.register_forward_hook(self._on_forward),
            optimizer.register_step_pre_hook(self._on_step_pre),
            optimizer.register_step_post_hook(self._on_step_post),
        ]
        self.trace.write(
            {
                "kind": "config",
                "world_size": self.world_size,
                "profile": self.profile,
                "platform": self.platform,
                "groups": {label: gid.key for label, gid in self._gids.items()},
                "faults": str(self._faults),
                "envelope": self.envelope_source,
                "rewind_phases": [str(p) for p in self._rewind_phases()],
                "step_copy": self.config.step_copy,
                "ddp_buckets_not_isolated": self._unisolated_ddp,
            }
        )
        if self.config.checkpoint_dir is not None:
            from .checkpointing import Checkpointer

            self.checkpointer = Checkpointer(self)
            self.checkpointer.enforce_budget()
            if self.config.restore:
                self.checkpointer.restore()
        # Discover the rebind plans now where the wrappers allow it (FSDP1 only after its first
        # forward), then line every rank up: discovery can take longer than the data-plane
        # timeout, and a peer already inside the first forward would otherwise time out on us.
        self._plans_deferred = False
        try:
            self.prepare()
        except NotReadyError:
            self._plans_deferred = True
        self.control.boundary_check(0)
        log.info(
            "attached",
            extra={"rank": self.rank, "profile": self.profile, "groups": sorted(self._gids)},
        )

    # ---------------------------------------------------------------- public API -----------
    def prepare(self) -> dict[str, int]:
        """Discover the rebind plans now (idempotent); returns references found per group label."""
        if not self._plans:
            t = time.perf_counter()
            self._plans = {label: discover(self.model, pg, extra=self._extra) for label, pg in self._groups.items()}
            self.trace.write(
                {
                    "kind": "plans",
                    "references": {label: len(plan) for label, plan in self._plans.items()},
                    "discover_ms": (time.perf_counter() - t) * 1e3,
                }
            )
        return {label: len(plan) for label, plan in self._plans.items()}

    @property
    def groups(self) -> dict[str, dist.ProcessGroup]:
        """The current data-plane groups by label (replacements included)."""
        return dict(self._groups)

    @contextlib.contextmanager
    def update(self) -> Iterator[Runtime]:
        """One optimizer update. Its exit is the committed boundary: health check, control-plane
        check, and recovery if any rank saw a failure. The body cannot be run again, so a failure
        inside it is preserved (at the boundary) or restarted, never rewound: see `step`."""
        self.update_index += 1
        self._phase = FailurePhase.FORWARD
        error: BaseException | None = None
        try:
            yield self
        except Exception as exc:  # every failure goes through the protocol, so no peer hangs
            error = exc
        finally:
            phase_at_error = self._phase
            self._phase = None
        self._boundary(error, phase_at_error)

    def step(self, fn: Callable[[], T]) -> T:
        """Run `fn()` as one optimizer update (forward, backward, optimizer.step(), zero_grad).

        Unlike `with rt.update():`, the body can be run again: if the update is interrupted and
        every rank agrees to Rewind, the partial update is discarded, RNG and data cursor go back
        to this boundary's snapshot, every group is rebuilt, and `fn()` runs once more."""
        from .snapshot import BoundarySnapshot

        try:
            self._snapshot = BoundarySnapshot.capture(self.data_state, self.frontier, self.model)
            self._snapshot_problem = ""
        except TypeError as exc:  # a data_state without state_dict: train on, but never rewind
            self._snapshot, self._snapshot_problem = None, str(exc)
        self._rewinds = 0
        while True:
            self._rewound = False
            self._rerunnable = True
            try:
                with self.update():
                    result = fn()
            finally:
                self._rerunnable = False
            if not self._rewound:
                return result

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.trace.close()
        self.control.close()

    # ---------------------------------------------------------------- hooks -------------------
    def _fault(self, phase: FailurePhase) -> Fault | None:
        if (self.update_index, phase) in self._injected:
            return None
        fault = self._faults.at(self.update_index, phase, self.rank)
        if fault is not None:
            self._injected.add((self.update_index, phase))
        return fault

    def _on_forward_pre(self, module, args):
        if self._phase is None:
            return None
        self._phase = FailurePhase.FORWARD
        fault = self._fault(FailurePhase.FORWARD)
        if fault is not None:
            perform_fault(fault, data_timeout_s=self.config.data_timeout_s)
        return None

    def _on_forward(self, module, args, output):
        if self._phase is None:
            return None
        tensor = _first_grad_tensor(output)
        if tensor is not None:
            tensor.register_hook(self._on_backward_start)
        return None

    def _on_backward_start(self, grad):
        if self._phase is not None:
            self._phase = FailurePhase.BACKWARD
            fault = self._fault(FailurePhase.BACKWARD)
            if fault is not None:
                perform_fault(fault, data_timeout_s=self.config.data_timeout_s)
        return None

    def _on_step_pre(self, optimizer, args, kwargs):
        if self._phase is not None:
            self._phase = FailurePhase.OPTIMIZER
            if self.config.step_copy and self._rerunnable:
                from .snapshot import StepCopy

                self._step_copy = self._step_copy or StepCopy()
                self._step_copy.take(self.model, self.optimizer)
                self._step_copy_for = self.frontier
            fault = self._fault(FailurePhase.OPTIMIZER)
            if fault is not None:
                perform_fault(fault, data_timeout_s=self.config.data_timeout_s)
        return None

    def _on_step_post(self, optimizer, args, kwargs):
        self.opt_step += 1
        return None

    # ---------------------------------------------------------------- boundary ----------------
    def _health_check(self) -> tuple[list[GroupId], list[str]]:
        """A tiny all-reduce on every data-plane group, all in flight at once; the group a
        boundary fault targets goes last so a late rank does not stall the healthy groups."""
        fault = self._fault(FailurePhase.COMMITTED)
        if fault is not None and fault.kind is FaultKind.KILL:
            kill_self()
        labels = sorted(self._groups, key=lambda lb: (fault is not None and lb == fault.group, lb))
        works = []
        for label in labels:
            if fault is not None and label == fault.group:
                log.info("injecting %s", fault, extra={"fault": str(fault)})
                if fault.kind is FaultKind.SKIP:
                    continue
                if fault.kind is FaultKind.LATE:
                    time.sleep(self.config.data_timeout_s + LATE_MARGIN_S)
            probe = self._probes.setdefault(label, torch.ones(1, dtype=torch.int64)).fill_(1)
            try:
                works.append((label, dist.all_reduce(probe, group=self._groups[label], async_op=True)))
            except Exception as exc:
                works.append((label, exc))
        failed: list[GroupId] = []
        causes: list[str] = []
        for label, work in works:
            try:
                if isinstance(work, Exception):
                    raise work
                work.wait()
            except Exception as exc:
                cls = self._classify(exc)
                failed.append(self._gids[label])
                causes.append(f"{self._gids[label].key}: {cls.cause.name.lower()}: {cls.message}")
        return failed, causes

    def _classify(self, exc: BaseException):
        """Real cause of a failure. The framework may still hold a retired group (rebinding off,
        or a missed reference); naming the groups it uses lets a bare gloo error from DDP's C++
        reducer, which names no group, be recognised as the retired communicator it is."""
        try:
            used = [pg.group_name for pg in data_plane_groups(self.model).values()]
        except Exception:  # classification must never fail the recovery
            used = []
        return classify_failure(exc, retired_names=retired_group_names(), used_group_names=used)

    def _boundary(self, error: BaseException | None, phase_at_error: FailurePhase | None) -> None:
        t_detect = time.perf_counter()
        if self._plans_deferred:
            # First boundary of a lazily initialised wrapper: discover, then line the ranks up
            # again before the health check (every rank defers alike: same wrapper type).
            self._plans_deferred = False
            try:
                self.prepare()
            except Exception as exc:  # recovery will reject; the cause goes into the evidence
                log.error("rebind discovery failed: %s", exc)
                if error is None:
                    error = exc
                    phase_at_error = FailurePhase.COMMITTED
            try:
                self.control.boundary_check(0)
            except ControlPlaneError as exc:
                self._reject_without_protocol(f"control plane failed after discovery: {exc}", error)
                return
        if error is None:
            phase = FailurePhase.COMMITTED
            failed, causes = self._health_check() if self.config.health_check else ([], [])
            saw = bool(failed)
            cause = "; ".join(causes)
        else:
            phase = phase_at_error or FailurePhase.FORWARD
            failed = []
            saw = True
            if isinstance(error, InjectedFault):
                cause = f"injected {error.fault}"
            else:
                cls = self._classify(error)
                cause = f"{cls.cause.name.lower()}: {cls.message}"
        try:
            flag = self.control.boundary_check(1 if saw else 0)
        except ControlPlaneError as exc:
            self._reject_without_protocol(f"control plane failed at the boundary: {exc}", error)
            return
        if flag == 0:
            self.frontier += 1
            self.machine.fire("commit_update")
            if self.checkpointer is not None:
                try:
                    self.checkpointer.after_commit(self)
                except Exception as exc:  # every rank gets the same agreed save error: fail-stop
                    self._reject_without_protocol(f"checkpoint save at F={self.frontier} failed: {exc}", exc)
            return
        detect_s = time.perf_counter() - t_detect
        self._recover(error, phase, saw, failed, cause, detect_s)

    # ---------------------------------------------------------------- recovery ----------------
    def _recover(self, error, phase, saw, failed, cause, detect_s) -> None:
        self._recoveries += 1
        self._epoch = f"r{self._recoveries}"
        self._pending: dict[str, tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}
        self._rebound: dict[str, int] = {}
        self._discarded: dict = {}
        committed = phase is FailurePhase.COMMITTED
        self._failure_phase = phase
        if phase is FailurePhase.OPTIMIZER:
            # a failure inside optimizer.step() may leave the step half applied: count it as
            # applied, so agreement sees the rank as ahead (undo needs the pre-step copy)
            self.opt_step = max(self.opt_step, self.frontier + 1)
        rerun_ok, rerun_reason = self._can_rerun()
        obs = Observation(
            rank=self.rank,
            world_size=self.world_size,
            frontier=self.frontier + (1 if committed else 0),
            generation=self.generation,
            opt_step=self.opt_step,
            failure_phase=phase,
            saw_failure=saw,
            failed_groups=tuple(failed),
            cause=cause,
            base_frontier=self.frontier,
            rewind_phases=self._rewind_phases(),
            rerun_ok=rerun_ok,
            rerun_reason=rerun_reason,
            step_copy=self._step_copy is not None and self._step_copy_for == self.frontier,
            held_groups=tuple(sorted(self._gids.values())),
        )
        self.trace.write({"kind": "observe", "seq": self.control.seq, "update": self.update_index,
                          "phase_failed": str(phase), "saw": saw, "cause": cause,
                          "failed_groups": [g.key for g in failed]})
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        gen = run_recovery(self.machine, obs)
        result: object = None
        while True:
            try:
                effect = gen.send(result)
            except StopIteration as stop:
                outcome: RecoveryOutcome = stop.value
                break
            t = time.perf_counter()
            result = self._perform(effect)
            name = _EFFECT_PHASE[type(effect)]
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t
        repair_s = time.perf_counter() - t0
        report = RecoveryReport(
            index=self._recoveries,
            update=self.update_index,
            action=outcome.action,
            failure_phase=phase,
            saw_failure=saw,
            cause=cause,
            frontier=outcome.frontier,
            generation=outcome.generation,
            failed_groups=[g.key for g in (outcome.decision.failed_groups if outcome.decision else ())],
            reasons=list(outcome.reasons),
            detect_s=detect_s,
            timings_s=timings,
            repair_s=repair_s,
            rebound=dict(self._rebound),
            edges=list(outcome.edges),
            discarded=self._discarded,
        )
        self.history.append(report)
        self.trace.write({"kind": "recovery", **report.to_dict()})
        if outcome.action is RecoveryAction.PRESERVE:
            self.frontier = outcome.frontier
            self.generation = outcome.generation
            log.info(report.summary())
            return
        if outcome.action is RecoveryAction.REWIND:
            assert outcome.frontier == self.frontier, (outcome.frontier, self.frontier)
            self.generation = outcome.generation
            self.update_index -= 1  # the same update runs again (faults already fired stay fired)
            self._rewound = True
            self._rewinds += 1
            log.info(report.summary())
            return
        reasons = list(outcome.reasons) + self.control.release_reasons(self._epoch)
        report.reasons = reasons
        self._fail_stop(reasons, error, report)

    def _rewind_phases(self) -> tuple[FailurePhase, ...]:
        """Failure phases this rank's envelope qualifies Rewind for on its platform and profile."""
        out = []
        for phase in (FailurePhase.FORWARD, FailurePhase.BACKWARD, FailurePhase.OPTIMIZER):
            try:
                if self.envelope.permits(ObservationKey(self.platform, self.profile, phase), RecoveryAction.REWIND):
                    out.append(phase)
            except UnknownObservationKey:
                pass
        return tuple(out)

    def _isolate_ddp_buckets(self) -> str:
        """Isolate every DDP module's buckets; returns why one could not be ('' when all were)."""
        from torch.nn.parallel import DistributedDataParallel

        from .ddp_buckets import BucketIsolationError, isolate_buckets

        for name, module in self.model.named_modules():
            if isinstance(module, DistributedDataParallel):
                try:
                    isolate_buckets(module)
                except BucketIsolationError as exc:
                    reason = f"DDP {name or 'model'}: {exc}"
                    log.warning(reason, extra={"rank": self.rank})
                    return reason
        return ""

    def _can_rerun(self) -> tuple[bool, str]:
        """Whether this rank could re-run the update in flight from its boundary snapshot."""
        if self._failure_phase is FailurePhase.BACKWARD and self._unisolated_ddp:
            return False, self._unisolated_ddp
        if not self._rerunnable:
            return False, "the update ran in `with rt.update()`, whose body cannot be re-run (use rt.step(fn))"
        if self._snapshot is None or self._snapshot.frontier != self.frontier:
            return False, f"no boundary snapshot of F={self.frontier} {self._snapshot_problem}".strip()
        if self.data_state is None:
            return False, "no data cursor (pass data_state= to attach) so a re-run could read another batch"
        if self._rewinds >= self.config.max_rewinds_per_update:
            return False, f"update {self.update_index} was already rewound {self._rewinds} time(s) (max_rewinds_per_update)"
        return True, ""

    def _restore_boundary(self, effect: RestoreBoundary) -> StepResult:
        """Rewind on this rank: nothing of the interrupted update may survive."""
        from .discard import discard_partial_update

        try:
            again = discard_partial_update(self.model, self.optimizer)
            if not again.was_idle or not self._discarded:  # keep what the guard's discard found
                self._discarded = again.to_dict()
            stepped = self.opt_step != effect.frontier or self._failure_phase is FailurePhase.OPTIMIZER
            if stepped:
                if self._step_copy is None or self._step_copy_for != effect.frontier:
                    return StepResult(False, f"tau={self.opt_step} at F={effect.frontier} and no pre-step copy")
                self._step_copy.restore(self.model, self.optimizer)
                self.opt_step = effect.frontier
            if self._snapshot is None or self._snapshot.frontier != effect.frontier:
                return StepResult(False, f"no boundary snapshot of F={effect.frontier}")
            self._snapshot.restore(self.data_state)
        except Exception as exc:
            return StepResult(False, f"{type(exc).__name__}: {exc}")
        return StepResult(True)

    def _perform(self, effect: Effect) -> object:
        if isinstance(effect, Quiesce):
            if effect.discard:
                from .discard import discard_partial_update, partial_state

                try:
                    self._discarded = discard_partial_update(self.model, self.optimizer).to_dict()
                    left = partial_state(self.model, self.optimizer)
                except Exception as exc:
                    return GuardVerdict(False, f"discarding the interrupted update failed: {type(exc).__name__}: {exc}")
                if left:
                    return GuardVerdict(False, f"still not idle after discarding the update: {'; '.join(left[:4])}")
                return quiesce(self.model)
            verdict = quiesce(self.model)
            key = ObservationKey(self.platform, self.profile, FailurePhase.COMMITTED)
            if verdict.ok and not self.envelope.permits(key, RecoveryAction.PRESERVE):
                return GuardVerdict(False, f"envelope does not qualify preserve for K={key}")
            return verdict
        if isinstance(effect, RestoreBoundary):
            return self._restore_boundary(effect)
        if isinstance(effect, GatherReports):
            try:
                got = self.control.gather(effect.report.to_dict())
            except ControlPlaneError as exc:
                return ControlPlaneFailure(str(exc))
            return [RankReport.from_dict(d) if d is not None else None for d in got]
        if isinstance(effect, ReplaceGroups):
            return self._replace(effect)
        if isinstance(effect, RebindReferences):
            return self._rebind(effect)
        if isinstance(effect, ValidateGroups):
            try:
                for label, (_, new) in self._pending.items():
                    validate_group(new, self._gids[label].ranks)
            except Exception as exc:
                return StepResult(False, f"{type(exc).__name__}: {exc}")
            return StepResult(True)
        if isinstance(effect, VoteRelease):
            try:
                return self.control.vote(self._epoch, effect.ok, effect.reason)
            except ControlPlaneError as exc:
                return ControlPlaneFailure(str(exc))
        if isinstance(effect, ForceReject):
            return self.control.force_reject(self._epoch, effect.reason)
        raise TypeError(f"unknown effect {effect!r}")  # pragma: no cover

    def _replace(self, effect: ReplaceGroups) -> StepResult:
        timeout = datetime.timedelta(seconds=self.config.data_timeout_s)
        try:
            for gid in effect.groups:
                if self._gids.get(gid.label) != gid:
                    return StepResult(False, f"rank {self.rank} holds no group {gid.key}")
                old = self._groups[gid.label]
                new = replace_group(old, ranks=gid.ranks, label=gid.label, generation=effect.generation,
                                    timeout=timeout)
                self._pending[gid.label] = (old, new)
        except Exception as exc:
            return StepResult(False, f"{type(exc).__name__}: {exc}")
        return StepResult(True)

    def _rebind(self, effect: RebindReferences) -> StepResult:
        try:
            for label, (old, new) in self._pending.items():
                if self.config.rebind:
                    rep = self._plans[label].rebind(new)
                    self._plans[label].prove(old)
                    for kind, n in rep.counts.items():
                        self._rebound[kind] = self._rebound.get(kind, 0) + n
                    self._ref_generation[label] = effect.generation
                self._groups[label] = new
        except Exception as exc:
            return StepResult(False, f"{type(exc).__name__}: {exc}")
        return StepResult(True)

    # ---------------------------------------------------------------- trace & reject ----------
    def _on_edge(self, trigger: str, src: str, dst: str) -> None:
        self.trace.edge(
            seq=self.control.seq,
            action=trigger,
            src=src,
            dst=dst,
            frontier=self.frontier,
            generation=self.generation,
            refs=dict(self._ref_generation),
            update=self.update_index,
            tau=self.opt_step,
        )

    def _reject_without_protocol(self, reason: str, error: BaseException | None) -> None:
        """The control plane itself failed: set the outcome register and stop."""
        self._recoveries += 1
        self._epoch = f"r{self._recoveries}"
        value = self.control.force_reject(self._epoch, reason)
        report = RecoveryReport(
            index=self._recoveries, update=self.update_index, action=RecoveryAction.REJECT,
            failure_phase=self._phase or FailurePhase.COMMITTED, saw_failure=True, cause=reason,
            frontier=self.frontier, generation=self.generation, reasons=[reason, f"register={value}"],
        )
        self.history.append(report)
        self._fail_stop([reason], error, report)

    def restore(self):
        """Restore the newest verified checkpoint now (attach does this when configured)."""
        if self.checkpointer is None:
            raise ConfigError("restore() needs Config.checkpoint_dir")
        return self.checkpointer.restore()

    def _fail_stop(self, reasons: list[str], error: BaseException | None, report: RecoveryReport) -> None:
        evidence = self._write_evidence(reasons, error, report)
        if self.checkpointer is not None:
            self.checkpointer.record_fail_stop(self.frontier, reasons)
        log.error("recovery rejected on rank %d: %s", self.rank, "; ".join(reasons))
        if self.config.on_reject == "raise":
            raise RecoveryRejected(tuple(reasons), evidence) from error
        print(
            f"[accelpact] rank {self.rank}: recovery rejected (exit {EXIT_REJECTED}): {'; '.join(reasons)}",
            file=sys.stderr,
            flush=True,
        )
        self.trace.close()
        sys.stdout.flush()
        logging.shutdown()
        os._exit(EXIT_REJECTED)  # never run atexit handlers that could hang on a broken group

    def _write_evidence(self, reasons, error, report: RecoveryReport) -> str | None:
        if self.config.trace_dir is None:
            return None
        path = Path(self.config.trace_dir) / f"reject-rank{self.rank}-attempt{self.attempt}.json"
        record = {
            "rank": self.rank,
            "attempt": self.attempt,
            "exit_code": EXIT_REJECTED,
            "frontier": self.frontier,
            "generation": self.generation,
            "opt_step": self.opt_step,
            "update": self.update_index,
            "reasons": reasons,
            "error": repr(error) if error is not None else None,
            "traceback": "".join(traceback.format_exception(error)) if error is not None else None,
            "recovery": report.to_dict(),
        }
        path.write_text(json.dumps(record, indent=2, default=str))
        return str(path)


def _first_grad_tensor(output) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        for item in output:
            t = _first_grad_tensor(item)
            if t is not None:
                return t
    return None


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_state: Any = None,
    config: Config | None = None,
    **kwargs: Any,
) -> Runtime:
    """Protect `model`'s training: discover its data-plane groups, build the rebind plans once,
    open the control plane. Run each optimizer update as `rt.step(fn)` (it can be rewound) or
    inside `with rt.update():` (a failure inside it can only be preserved or restarted)."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"attach expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"attach expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return Runtime(model, optimizer, data_state, config, **kwargs)
