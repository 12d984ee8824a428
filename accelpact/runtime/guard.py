"""Guard phase: settle the device, then check every FSDP unit is idle.

A committed boundary is only safe to preserve if no collective is in flight and no gradient is
half-reduced: the weights and moments in memory must be exactly those after optimizer.step().
On a GPU the device is settled first, in the one safe order: the NCCL groups known broken are
aborted, *then* the device is synchronised, with a bound (`comm.device.settle_device`); the discard
of an interrupted update waits on CUDA events, so it comes after. This module reads framework
state and reports; it decides nothing (the verdict goes into the rank's report and frontier
agreement decides).
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm.device import settle_device
from ..comm.lifecycle import retire_groups
from ..fsm.effects import GuardVerdict, Quiesce
from .data_plane import DataPlane
from .device_fence import rank_device


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
        # every param group: the singular `_fsdp_param_group` asserts there is at most one
        for group in getattr(state, "_fsdp_param_groups", ()):
            if group._training_state != TrainingState.IDLE:
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


def settle(plane: DataPlane, effect: Quiesce, synchronize=None) -> GuardVerdict | None:
    """Abort before anything synchronises (module docstring). An interrupted update's groups are
    all aborted (a Rewind rebuilds every group; a fail-stop needs none); at a committed boundary
    only the failed ones, unless the device stays busy, in which case a group not known broken
    had to be aborted and the boundary cannot be preserved. None: settled, nothing to report."""
    nccl = plane.nccl_groups()
    cuda_live = torch.cuda.is_available() and torch.cuda.is_initialized()
    if not nccl and not cuda_live and synchronize is None:
        return None
    failed = {gid.label for gid in effect.failed}
    broken = dict(nccl) if effect.discard else {label: pg for label, pg in nccl.items() if label in failed}
    others = {label: pg for label, pg in nccl.items() if label not in broken}
    settled = settle_device(broken=broken, others=others, timeout_s=plane.timeout_s,
                            synchronize=synchronize or (this_device_sync(nccl) if cuda_live else _nothing),
                            abort=lambda groups: retire_groups(groups, abort=True))
    if not settled.drained:
        return GuardVerdict(False, settled.reason)
    if settled.escalated and not effect.discard:
        return GuardVerdict(False, f"device work stayed stuck until {list(settled.escalated)} were aborted: they are "
                                   "not among the failed groups, so this boundary cannot be preserved")
    return None


def _nothing() -> None:
    return None


def this_device_sync(groups=None):
    """`torch.cuda.synchronize` of this rank's device (the one its NCCL `groups` are bound to, else
    the calling thread's current one), for a helper thread to run (the bounded drain): a new
    thread's current device is 0, so a bare synchronize there waits on GPU 0, not on this rank's.
    Found by review: every rank with LOCAL_RANK != 0 drained "at once" while its own device was
    stuck, and the unbounded synchronize after it hung."""
    device = rank_device(groups or {})
    return lambda: torch.cuda.synchronize(device)


def guard(model: nn.Module, optimizer: torch.optim.Optimizer, effect: Quiesce,
          plane: DataPlane | None = None) -> tuple[GuardVerdict, dict]:
    """The Quiesce handler: settle the device (`settle`), then, with `effect.discard`, throw the
    interrupted update away (see `discard`); returns the verdict and what the discard found."""
    unsettled = settle(plane, effect) if plane is not None else None
    if unsettled is not None:
        return unsettled, {}
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
