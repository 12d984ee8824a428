"""What a rank keeps so that the update in flight can be run again: the boundary snapshot, the
optional pre-step copy, and the facts `decisions.may_rerun` judges."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..fsm.decisions import RerunFacts
from ..fsm.phases import FailurePhase
from .module_buffers import ModuleBuffers
from .snapshot import BoundarySnapshot, StepCopy

log = logging.getLogger("accelpact.runtime")


def schedulers_of(optimizer: torch.optim.Optimizer) -> list[Any]:
    """The LR schedulers that drive `optimizer` (an LRScheduler holds its optimizer; the
    optimizer does not know its schedulers, so they are found among live objects, once, at
    attach). A scheduler built after attach is not found: pass it to attach instead.

    Only the outermost: one inside a SequentialLR or ChainedScheduler is saved and restored by
    it. Ordered by type name, not by the heap's order (which a garbage collection between their
    creations changes): a checkpoint pairs saved states with these in order, in another process."""
    import gc

    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    kinds = (LRScheduler, ReduceLROnPlateau)
    # type(), not isinstance(): the latter reads __class__, which some lazy module objects warn on
    found = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds) and obj.optimizer is optimizer]
    inner = {id(child) for obj in found for child in getattr(obj, "_schedulers", ())}
    outer = sorted((obj for obj in found if id(obj) not in inner), key=lambda obj: type(obj).__qualname__)
    names = [type(obj).__qualname__ for obj in outer]
    if len(set(names)) < len(names):
        log.warning("attach found several LR schedulers of one type on the optimizer (%s): their order, which a "
                    "checkpoint restores them in, is not defined; pass schedulers= to attach", ", ".join(names))
    return outer


class RewindState:
    def __init__(self, *, step_copy: bool, max_rewinds: int, stateful: tuple[Any, ...] = ()):
        self.keep_step_copy = step_copy
        self.stateful = stateful  # LR schedulers and grad scalers the update steps
        self.max_rewinds = max_rewinds
        self.snapshot: BoundarySnapshot | None = None
        self.buffers: ModuleBuffers | None = None  # the model's buffers, kept between snapshots
        self.snapshot_problem = ""
        self.step_copy: StepCopy | None = None
        self.step_copy_for: int | None = None  # F the pre-step copy was taken at
        self.in_step = False  # the update in flight runs inside rt.step(fn)
        self.rewinds = 0  # rewinds of the update in flight
        #: why DDP's buckets could not be isolated from a late all-reduce ('' when they were)
        self.unisolated_ddp = ""

    def refused_always(self) -> str:
        """Why every Rewind is refused whatever fails ("" when one can be taken): what makes a
        deferred boundary unsound here (`fsm.deferral`)."""
        if self.unisolated_ddp:
            return f"DDP's gradient buckets are not isolated: {self.unisolated_ddp}"
        if self.max_rewinds == 0:
            return "max_rewinds_per_update is 0"
        return ""

    def buffer_slots(self, model: nn.Module) -> tuple[tuple[dict, str, torch.Tensor], ...]:
        """`model`'s buffer slots (`ModuleBuffers`, found once and kept): the boundary snapshot's,
        and the small state's a spare takes over (`membership.small_state`)."""
        if self.buffers is None or self.buffers.model is not model:
            self.buffers = ModuleBuffers(model)
        return self.buffers.slots()

    def begin_step(self, data_state: Any, frontier: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """rt.step(fn) starts update F+1: snapshot the boundary of F."""
        try:
            snap = BoundarySnapshot.capture(data_state, frontier, optimizer=optimizer, stateful=self.stateful,
                                            model_buffers=self.buffer_slots(model))
            self.snapshot, self.snapshot_problem = snap, ""
        except TypeError as exc:  # a data_state without state_dict: train on, but never rewind
            self.snapshot, self.snapshot_problem = None, str(exc)
        self.rewinds = 0

    def before_optimizer_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, frontier: int) -> None:
        if self.keep_step_copy and self.in_step:
            self.step_copy = self.step_copy or StepCopy()
            self.step_copy.take(model, optimizer)
            self.step_copy_for = frontier

    def has_step_copy(self, frontier: int) -> bool:
        return self.step_copy is not None and self.step_copy_for == frontier

    def facts(self, *, frontier: int, update: int, phase: FailurePhase, has_data_cursor: bool) -> RerunFacts:
        return RerunFacts(
            frontier=frontier, update=update, failure_phase=phase, in_step=self.in_step,
            snapshot_frontier=self.snapshot.frontier if self.snapshot is not None else None,
            snapshot_problem=self.snapshot_problem, has_data_cursor=has_data_cursor, rewinds=self.rewinds,
            max_rewinds=self.max_rewinds, unisolated_ddp=self.unisolated_ddp,
        )
