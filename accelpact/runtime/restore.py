"""RestoreBoundary handler: on Rewind nothing of the interrupted update may survive."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..fsm.effects import RestoreBoundary, StepResult
from .discard import DiscardResult
from .rewind import RewindState

log = logging.getLogger("accelpact.runtime")


def restore_boundary(model: nn.Module, optimizer: torch.optim.Optimizer, data_state: Any, rewind: RewindState,
                     effect: RestoreBoundary) -> tuple[StepResult, DiscardResult | None]:
    """Discard the partial update again (the guard's discard ran before agreement), put back an
    applied step from the pre-step copy when the driver says so, restore the snapshot of F.
    Returns the result and what this discard found (None if it could not run)."""
    from .discard import discard_partial_update

    try:
        again = discard_partial_update(model, optimizer)
        if effect.undo_step:
            if not rewind.has_step_copy(effect.frontier):
                return StepResult(False, f"an applied step at F={effect.frontier} and no pre-step copy"), again
            assert rewind.step_copy is not None
            rewind.step_copy.restore(model, optimizer)
        if rewind.snapshot is None or rewind.snapshot.frontier != effect.frontier:
            return StepResult(False, f"no boundary snapshot of F={effect.frontier}"), again
        rewind.snapshot.restore(data_state)
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:  # the reason goes into the vote
        # and the traceback into the log: a user's `load_state_dict` that raises is a bug to find
        # (found by review: only its message reached the vote)
        log.error("restoring the boundary of F=%d failed", effect.frontier, exc_info=exc)
        return StepResult.failed(exc), None
    return StepResult(True), again
