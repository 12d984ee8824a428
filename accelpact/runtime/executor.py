"""The real executor: the `Executor` protocol against process groups and the control plane.

One instance per recovery (it holds that recovery's scratch: the replacements built, the
references rebound, what the discard found). Each method is a one-line call into the module that
owns that handler; none of them decides anything."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..control import ControlPlane
from ..fsm.decisions import RankReport
from ..fsm.effects import (
    ControlPlaneFailure,
    Executor,
    ForceReject,
    GatherReports,
    GuardVerdict,
    OutcomeUnknown,
    Quiesce,
    RebindReferences,
    ReplaceGroups,
    RestoreBoundary,
    StepResult,
    ValidateGroups,
    VoteRelease,
)
from . import agree, guard, rebinding, release, replace, restore, validate
from .data_plane import DataPlane
from .rewind import RewindState


class RecoveryExecutor(Executor):
    def __init__(self, *, rank: int, epoch: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                 data_state: Any, plane: DataPlane, control: ControlPlane, rewind: RewindState, rebind: bool,
                 on_step_undone: Callable[[int], None]):
        self.rank, self.epoch = rank, epoch
        self.model, self.optimizer, self.data_state = model, optimizer, data_state
        self.plane, self.control, self.rewind, self.rebind = plane, control, rewind, rebind
        self.on_step_undone = on_step_undone  # tau is back at F: the runtime's accounting follows
        self.pending: replace.Pending = {}
        self.rebound: dict[str, int] = {}  # references rebound per site kind
        self.discarded: dict = {}  # what the discard of an interrupted update found
        self.reports: list[dict] = []  # what every rank reported to agreement (the evidence)
        self.update = 0  # the update whose failure started this recovery (listeners are told)
        self.listeners: Sequence[Any] = ()
        self.link_wait_s = 0.0  # this rank's wait for its links before the check that started it
        self.left_behind: tuple[str, ...] = ()  # what joining a deferred boundary's recovery left (`deferred`)

    @classmethod
    def for_runtime(cls, rt: Any, epoch: str) -> RecoveryExecutor:
        """The executor of one recovery of `rt` (a Runtime)."""
        executor = cls(rank=rt.rank, epoch=epoch, model=rt.model, optimizer=rt.optimizer, data_state=rt.data_state,
                       plane=rt.data_plane, control=rt.control, rewind=rt.rewind, rebind=rt.config.rebind,
                       on_step_undone=rt._step_undone)
        executor.update, executor.listeners = rt.update_index, tuple(rt.listeners)
        if rt.link_wait is not None:  # consumed: a later recovery without a wait must not show this one
            executor.link_wait_s, rt.link_wait = rt.link_wait.waited_s, None
        executor.left_behind, rt.deferral.left = rt.deferral.left, ()  # consumed alike
        return executor

    def before_effect(self, phase: str) -> None:
        """Every listener that wants to know (a fault drill) hears which step the recovery enters."""
        for listener in self.listeners:
            hook = getattr(listener, "on_recovery_step", None)
            if hook is not None:
                hook(self.update, phase)

    def quiesce(self, effect: Quiesce) -> GuardVerdict:
        verdict, self.discarded = guard.guard(self.model, self.optimizer, effect, self.plane)
        if verdict.ok and self.left_behind:  # a committed-boundary guard does not look at gradients
            return GuardVerdict(False, "the update after the deferred boundary could not be thrown away: "
                                + "; ".join(self.left_behind))
        return verdict

    def gather_reports(self, effect: GatherReports) -> list[RankReport | None] | ControlPlaneFailure:
        got = agree.gather_reports(self.control, effect)
        if isinstance(got, list):
            self.reports = [report.to_dict() for report in got if report is not None]
        return got

    def restore_boundary(self, effect: RestoreBoundary) -> StepResult:
        result, again = restore.restore_boundary(self.model, self.optimizer, self.data_state, self.rewind, effect)
        if again is not None and (not again.was_idle or not self.discarded):  # else keep the guard's
            self.discarded = again.to_dict()
        if result.ok:
            self.on_step_undone(effect.frontier)
        return result

    def replace_groups(self, effect: ReplaceGroups) -> StepResult:
        return replace.replace_groups(self.plane, self.rank, effect, self.pending)

    def rebind_references(self, effect: RebindReferences) -> StepResult:
        return rebinding.rebind_references(self.plane, effect, self.pending, rebind=self.rebind, counts=self.rebound)

    def validate_groups(self, effect: ValidateGroups) -> StepResult:
        return validate.validate_groups(self.plane, effect, self.pending)

    def vote_release(self, effect: VoteRelease) -> str | ControlPlaneFailure:
        return release.vote_release(self.control, self.epoch, effect)

    def force_reject(self, effect: ForceReject) -> str | OutcomeUnknown:
        return release.force_reject(self.control, self.epoch, effect)
