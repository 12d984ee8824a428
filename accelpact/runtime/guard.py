"""Guard phase: quiesce the device and check every FSDP unit is idle.

A committed boundary is only safe to preserve if no collective is in flight and no gradient is
half-reduced: the weights and moments in memory must be exactly those after optimizer.step().
This module reads framework state and reports; it decides nothing (the verdict goes into the
rank's report and frontier agreement decides).
"""

from __future__ import annotations

import torch
from torch import nn

from ..fsm.effects import GuardVerdict, Quiesce


def _fsdp1_busy(model: nn.Module) -> list[str]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import HandleTrainingState, TrainingState

    busy = []
    for name, mod in model.named_modules():
        if not isinstance(mod, FSDP):
            continue
        if mod.training_state != TrainingState.IDLE:
            busy.append(f"FSDP1 unit {name or '<root>'} in {mod.training_state.name}")
        handle = getattr(mod, "_handle", None)
        if handle is not None and handle._training_state != HandleTrainingState.IDLE:
            busy.append(f"FSDP1 handle of {name or '<root>'} in {handle._training_state.name}")
    return busy


def _fsdp2_busy(model: nn.Module) -> list[str]:
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    busy = []
    for name, mod in model.named_modules():
        state = _get_module_fsdp_state(mod)
        if state is None:
            continue
        if state._training_state != TrainingState.IDLE:
            busy.append(f"FSDP2 unit {name or '<root>'} in {state._training_state.name}")
        group = getattr(state, "_fsdp_param_group", None)
        if group is not None and group._training_state != TrainingState.IDLE:
            busy.append(f"FSDP2 param group of {name or '<root>'} in {group._training_state.name}")
    return busy


def quiesce(model: nn.Module) -> GuardVerdict:
    """Flush device work, then check every FSDP unit (FSDP1 and FSDP2) is idle."""
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except RuntimeError as exc:  # a device that cannot sync cannot be trusted to hold state
        return GuardVerdict(False, f"device synchronize failed: {type(exc).__name__}: {exc}")
    busy = _fsdp1_busy(model) + _fsdp2_busy(model)
    if busy:
        return GuardVerdict(False, "; ".join(busy[:4]) + (f" (+{len(busy) - 4} more)" if len(busy) > 4 else ""))
    return GuardVerdict(True)


def guard(model: nn.Module, optimizer: torch.optim.Optimizer, effect: Quiesce) -> tuple[GuardVerdict, dict]:
    """The Quiesce handler. With `effect.discard` the interrupted update is thrown away first
    (see `discard`); returns the verdict and what the discard found."""
    if not effect.discard:
        return quiesce(model), {}
    from .discard import discard_partial_update, partial_state

    try:
        discarded = discard_partial_update(model, optimizer).to_dict()
        left = partial_state(model, optimizer)
    except (RuntimeError, AttributeError, ValueError) as exc:  # framework state we cannot reset
        return GuardVerdict(False, f"discarding the interrupted update failed: {type(exc).__name__}: {exc}"), {}
    if left:
        return GuardVerdict(False, f"still not idle after discarding the update: {'; '.join(left[:4])}"), discarded
    return quiesce(model), discarded
