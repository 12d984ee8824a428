"""Discard a partly run update: put FSDP2, FSDP1 and DDP back to the idle state of a committed boundary.

Rewind re-runs an interrupted update from its start, and the re-run must be bitwise what the
update would have been without the interruption. An exception that escapes forward or backward
(a collective that timed out, a hook that raised) skips every "end of pass" step of the
wrappers: FSDP's post-backward final callback is dropped with the failed autograd graph, DDP's
reducer never finalizes. What is left behind would change the re-run or make it fail:

- gradients: reduced shards of the units whose backward finished (the re-run would *add* to them),
  unsharded gradients of units whose reduction had not started, FSDP's accumulation buffers;
- unsharded parameters: all-gathered storage still allocated is taken for "already unsharded" by
  the next pre-forward, which then skips the all-gather;
- bookkeeping: training states, "final callback queued" flags (the next backward would never
  queue its callback and never finalize), post-forward orders used for prefetching, pending
  all-gather / reduce-scatter / all-reduce results, DDP's ``require_finalize`` flag.

Everything here is local: no collective is issued and no pending collective is waited on
(groups may be broken while this runs; stream-order waits on device events are kept because
freeing memory that a kernel may still write is worse). A collective still pending may complete
after the discard; it must then write only memory the re-run does not use: FSDP2 allocates fresh
collective buffers per call, and DDP does once its buckets are isolated (``ddp_buckets``, which
the runtime installs where Rewind after backward is qualified). The attribute names are those of torch
2.13 (read from its source); attributes that other torch versions lack are tolerated and named
in the report's ``notes``, never skipped in silence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "FSDP1_RESET",
    "FSDP2_RESET",
    "DiscardResult",
    "discard_partial_update",
    "partial_state",
]

#: What this module resets that torch's own end-of-iteration / recovery code resets too; a test
#: pins these against the installed torch so that a new per-iteration attribute fails loudly.
FSDP2_RESET = frozenset({
    # FSDPState / FSDPStateContext / FSDPCommContext
    "_training_state", "_modules_to_run_forward", "iter_forward_root", "post_backward_final_callback_queued",
    "all_gather_state", "reduce_scatter_states", "_last_post_reduce_events", "post_forward_order",
    # FSDPParamGroup
    "_all_gather_result", "_post_reduce_event", "_all_reduce_state", "_reshard_after_forward_event",
    "_partial_reduce_output", "_post_forward_indices", "_sharded_state",
})
FSDP1_RESET = frozenset({
    # _FSDPState (root and every unit)
    "training_state", "_post_backward_callback_queued", "_unshard_event",
    # FlatParamHandle
    "_training_state", "_ran_pre_backward_hook", "_needs_pre_backward_unshard", "_needs_pre_forward_unshard",
    "_post_forward_index", "_prefetched",
    # FlatParameter
    "_saved_grad_shard", "_post_backward_called", "_post_backward_hook_state",
})

_PROFILES = {"fsdp2": "fsdp2-hsdp", "fsdp1": "fsdp1-hsdp", "ddp": "ddp"}  # as Runtime.profile names them


@dataclass
class DiscardResult:
    """What one discard reset. All counts zero: the wrappers were already idle (a no-op)."""

    profile: str
    units_reset: int = 0  # FSDP2 states, FSDP1 units or DDP reducers that were not idle
    grads_dropped: int = 0  # gradient tensors and gradient buffers set to None
    params_freed: int = 0  # FSDP2 parameters / FSDP1 flat parameters resharded (storage freed)
    pending_cleared: int = 0  # pending collective results and per-iteration bookkeeping entries
    notes: list[str] = field(default_factory=list)  # what could not be reset or verified

    @property
    def was_idle(self) -> bool:
        return not (self.units_reset or self.grads_dropped or self.params_freed or self.pending_cleared)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# shared helpers


def _note(report: DiscardResult | None, text: str) -> None:
    if report is not None and text not in report.notes:
        report.notes.append(text)


def _versioned(obj: Any, name: str, report: DiscardResult | None, default: Any = None) -> Any:
    """An attribute that some torch versions lack: tolerated, but named in the report."""
    if hasattr(obj, name):
        return getattr(obj, name)
    _note(report, f"{type(obj).__name__}.{name} does not exist in torch {torch.__version__}: not reset")
    return default


def _storage_bytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.untyped_storage().size()


def _drop_grad(tensor: torch.Tensor | None) -> int:
    if tensor is not None and tensor.grad is not None:
        tensor.grad = None
        return 1
    return 0


# --------------------------------------------------------------------------------------------
# discovery


def _fsdp2_states(model: nn.Module) -> list[tuple[str, Any]]:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    except ImportError:  # torch without FSDP2
        return []
    found: dict[int, tuple[str, Any]] = {}
    for name, module in model.named_modules():
        state = _get_module_fsdp_state(module)
        if state is not None:
            found.setdefault(id(state), (name or "<root>", state))
    return list(found.values())


def _fsdp1_units(model: nn.Module) -> list[tuple[str, Any]]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return [(name or "<root>", m) for name, m in model.named_modules() if isinstance(m, FullyShardedDataParallel)]


def _ddp_modules(model: nn.Module) -> list[tuple[str, Any]]:
    from torch.nn.parallel import DistributedDataParallel

    return [(name or "<root>", m) for name, m in model.named_modules() if isinstance(m, DistributedDataParallel)]


@dataclass
class _Found:
    fsdp2: list[tuple[str, Any]]
    fsdp1: list[tuple[str, Any]]
    ddp: list[tuple[str, Any]]

    @property
    def profile(self) -> str:
        kinds = [kind for kind in ("ddp", "fsdp1", "fsdp2") if getattr(self, kind)]
        return "+".join(_PROFILES[kind] for kind in kinds)


def _find(model: nn.Module, caller: str) -> _Found:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{caller}: expected an nn.Module, got {type(model).__module__}.{type(model).__qualname__}")
    found = _Found(_fsdp2_states(model), _fsdp1_units(model), _ddp_modules(model))
    if not (found.fsdp2 or found.fsdp1 or found.ddp):
        kind = type(model)
        raise TypeError(
            f"{caller}: unknown model type {kind.__module__}.{kind.__qualname__}: no FSDP2 (fully_shard), "
            "FSDP1 (FullyShardedDataParallel) or DDP (DistributedDataParallel) wrapper in it, so there is no "
            "wrapper state this function knows how to put back to a committed boundary"
        )
    return found


def _all_params(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Iterator[torch.Tensor]:
    """Every parameter of the model and the optimizer, once, but not FSDP1's flat parameters (their
    gradients are handled with their handles) and not the non-leaf views FSDP1 with
    ``use_orig_params`` registers during forward/backward (they hold no gradient)."""
    seen: set[int] = set()
    groups = optimizer.param_groups if optimizer is not None else []
    for param in itertools.chain(model.parameters(), *(group["params"] for group in groups)):
        if id(param) in seen or not param.is_leaf or getattr(param, "_is_flat_param", False):
            continue
        seen.add(id(param))
        yield param


# --------------------------------------------------------------------------------------------
# FSDP2 (fully_shard): FSDPState -> FSDPParamGroup -> FSDPParam, shared FSDPStateContext/FSDPCommContext


def _fsdp2_enums() -> tuple[Any, Any]:
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    return TrainingState, ShardedState


def _fsdp2_groups(state: Any, report: DiscardResult | None) -> list[Any]:
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = _versioned(state, "_fsdp_param_group", report)  # torch before per-parameter meshes: one group
    return [group] if group is not None else []


def _fsdp2_rs_states(ctx: Any, report: DiscardResult | None) -> list[Any]:
    if hasattr(ctx, "reduce_scatter_states"):
        return list(ctx.reduce_scatter_states)
    single = _versioned(ctx, "reduce_scatter_state", report)  # older torch: one retained state
    return [single] if single is not None else []


def _fsdp2_param_unsharded(fsdp_param: Any, sharded: Any) -> bool:
    tensors = itertools.chain(fsdp_param.all_gather_outputs, getattr(fsdp_param, "_unsharded_inner_tensors", ()))
    return fsdp_param.sharded_state != sharded or any(_storage_bytes(t) for t in tensors)


def _fsdp2_param_grads(fsdp_param: Any) -> list[str]:
    held = []
    if fsdp_param.sharded_param.grad is not None:
        held.append("sharded grad")
    unsharded = getattr(fsdp_param, "_unsharded_param", None)  # exists after the first all-gather
    if unsharded is not None and unsharded.grad is not None:
        held.append("unsharded grad")
    if fsdp_param.unsharded_accumulated_grad is not None:
        held.append("unsharded accumulated grad")
    return held


def _fsdp2_discard(found: list[tuple[str, Any]], report: DiscardResult) -> None:
    TrainingState, ShardedState = _fsdp2_enums()
    states = [state for _, state in found]
    # after lazy init every state shares its root's contexts; before it, each has its own
    state_ctxs = {id(s._state_ctx): s._state_ctx for s in states}.values()
    comm_ctxs = {id(s._comm_ctx): s._comm_ctx for s in states}.values()
    busy: set[int] = set()

    for ctx in comm_ctxs:
        if not hasattr(ctx, "all_gather_state"):  # FSDPCommContext.lazy_init never ran: nothing in flight
            continue
        current = ctx.device_handle.current_stream()
        if ctx.all_gather_state is not None:
            if ctx.all_gather_state.event is not None:
                current.wait_event(ctx.all_gather_state.event)
            ctx.all_gather_state = None
            report.pending_cleared += 1
        rs_states = _fsdp2_rs_states(ctx, report)
        for rs_state in rs_states:
            if rs_state.event is not None:
                current.wait_event(rs_state.event)
        if hasattr(ctx, "reduce_scatter_states"):
            ctx.reduce_scatter_states.clear()
        elif rs_states:
            ctx.reduce_scatter_state = None
        report.pending_cleared += len(rs_states)
        events = _versioned(ctx, "_last_post_reduce_events", report, {})
        for event in events.values():
            current.wait_event(event)
        report.pending_cleared += len(events)
        events.clear()
        report.pending_cleared += len(ctx.post_forward_order)
        ctx.post_forward_order.clear()

    for ctx in state_ctxs:
        if _versioned(ctx, "iter_forward_root", report) is not None:
            ctx.iter_forward_root = None
            report.pending_cleared += 1
        if ctx.post_backward_final_callback_queued:
            ctx.post_backward_final_callback_queued = False
            report.pending_cleared += 1

    for state in states:
        if state._training_state != TrainingState.IDLE:
            busy.add(id(state))
            state._training_state = TrainingState.IDLE
        to_run = _versioned(state, "_modules_to_run_forward", report, set())
        if to_run:
            busy.add(id(state))
            report.pending_cleared += len(to_run)
            to_run.clear()
        for group in _fsdp2_groups(state, report):
            if _fsdp2_discard_group(group, report, TrainingState, ShardedState):
                busy.add(id(state))
    report.units_reset += len(busy)


def _fsdp2_discard_group(group: Any, report: DiscardResult, TrainingState: Any, ShardedState: Any) -> bool:
    """Mirror of FSDPParamGroup._reset_iter_state without waiting on a pending Work, plus the grads."""
    busy = group._training_state != TrainingState.IDLE
    current = group.device_handle.current_stream()
    result = group._all_gather_result
    if result is not None:
        if result.all_gather_event is not None:
            current.wait_event(result.all_gather_event)
        work = result.all_gather_work
        if work is not None and not work.is_completed():
            # waiting could block for the group's timeout on a broken group; the Work keeps its own
            # buffers alive, so dropping our reference is safe
            _note(report, "FSDP2: abandoned an in-flight asynchronous all-gather without waiting on it")
        group._all_gather_result = None
        report.pending_cleared += 1
        busy = True
    if group._post_reduce_event is not None:
        current.wait_event(group._post_reduce_event)
        group._post_reduce_event = None
        report.pending_cleared += 1
        busy = True
    ar_state = _versioned(group, "_all_reduce_state", report)
    if ar_state is not None:
        if ar_state.event is not None:
            current.wait_event(ar_state.event)
        group._all_reduce_state = None
        report.pending_cleared += 1
        busy = True
    if group._reshard_after_forward_event is not None:
        group._wait_all_gather_streams_on_event(group._reshard_after_forward_event)
        group._reshard_after_forward_event = None
        report.pending_cleared += 1
        busy = True
    if group._partial_reduce_output is not None:  # HSDP reduce-scattered but not all-reduced grads
        group._partial_reduce_output = None
        report.grads_dropped += 1
        busy = True
    if group._post_forward_indices:
        report.pending_cleared += len(group._post_forward_indices)
        group._post_forward_indices.clear()
        busy = True
    group._training_state = TrainingState.IDLE
    busy = _fsdp2_discard_params(group, report, ShardedState) or busy
    if group._sharded_state != ShardedState.SHARDED:
        group._sharded_state = ShardedState.SHARDED
        busy = True
    return busy


def _fsdp2_discard_params(group: Any, report: DiscardResult, ShardedState: Any) -> bool:
    """Reshard every parameter of the group and drop its gradients; True if anything was left."""
    busy = False
    for fsdp_param in group.fsdp_params:
        if _fsdp2_param_unsharded(fsdp_param, ShardedState.SHARDED):
            post_forward = fsdp_param.sharded_state == ShardedState.SHARDED_POST_FORWARD
            fsdp_param.to_sharded()  # registers the sharded parameter, frees the all-gather outputs
            if post_forward:  # to_sharded keeps the smaller-mesh copy alive; the boundary has none
                fsdp_param._sharded_post_forward_param = None
                fsdp_param._sharded_post_forward_param_data = None
            report.params_freed += 1
            busy = True
        dropped = _drop_grad(fsdp_param.sharded_param) + _drop_grad(getattr(fsdp_param, "_unsharded_param", None))
        if fsdp_param.unsharded_accumulated_grad is not None:
            fsdp_param.unsharded_accumulated_grad = None
            dropped += 1
        if fsdp_param.grad_offload_event is not None:  # a device-to-host copy of a dropped grad
            fsdp_param.grad_offload_event.synchronize()
            fsdp_param.grad_offload_event = None
        report.grads_dropped += dropped
        busy = busy or dropped > 0
    return busy


def _fsdp2_partial(found: list[tuple[str, Any]]) -> list[str]:
    TrainingState, ShardedState = _fsdp2_enums()
    probe = DiscardResult(profile="")  # collects attributes this torch lacks: those cannot be checked
    out: list[str] = []
    states = [state for _, state in found]
    for ctx in {id(s._comm_ctx): s._comm_ctx for s in states}.values():
        if not hasattr(ctx, "all_gather_state"):
            continue
        if ctx.all_gather_state is not None:
            out.append("FSDP2 comm context holds an all-gather result")
        if _fsdp2_rs_states(ctx, probe):
            out.append("FSDP2 comm context holds reduce-scatter states")
        if _versioned(ctx, "_last_post_reduce_events", probe):
            out.append("FSDP2 comm context holds post-reduce events")
        if ctx.post_forward_order:
            out.append(f"FSDP2 post-forward order has {len(ctx.post_forward_order)} entries")
    for ctx in {id(s._state_ctx): s._state_ctx for s in states}.values():
        if _versioned(ctx, "iter_forward_root", probe) is not None:
            out.append("FSDP2 iteration forward root is set")
        if ctx.post_backward_final_callback_queued:
            out.append("FSDP2 post-backward final callback marked as queued")
    for name, state in found:
        if state._training_state != TrainingState.IDLE:
            out.append(f"FSDP2 unit {name} in {state._training_state.name}")
        if _versioned(state, "_modules_to_run_forward", probe):
            out.append(f"FSDP2 unit {name} has modules left to run forward")
        for group in _fsdp2_groups(state, probe):
            if group._training_state != TrainingState.IDLE:
                out.append(f"FSDP2 param group of {name} in {group._training_state.name}")
            if group._sharded_state != ShardedState.SHARDED:
                out.append(f"FSDP2 param group of {name} is {group._sharded_state.name}")
            pending = [attr for attr in ("_all_gather_result", "_post_reduce_event", "_reshard_after_forward_event",
                                         "_partial_reduce_output") if getattr(group, attr) is not None]
            if _versioned(group, "_all_reduce_state", probe) is not None:
                pending.append("_all_reduce_state")
            if group._post_forward_indices:
                pending.append("_post_forward_indices")
            if pending:
                out.append(f"FSDP2 param group of {name} holds {', '.join(pending)}")
            for fsdp_param in group.fsdp_params:
                label = fsdp_param._param_fqn or f"{name}:{fsdp_param._module_info.param_name}"
                if _fsdp2_param_unsharded(fsdp_param, ShardedState.SHARDED):
                    out.append(f"FSDP2 parameter {label} is unsharded ({fsdp_param.sharded_state.name})")
                out += [f"FSDP2 parameter {label} holds a {kind}" for kind in _fsdp2_param_grads(fsdp_param)]
    # an attribute torch lacks cannot be shown idle: say so rather than report a clean state
    return out + [f"cannot check: {note}" for note in probe.notes]


# --------------------------------------------------------------------------------------------
# FSDP1 (FullyShardedDataParallel): _FSDPState -> FlatParamHandle -> FlatParameter


def _fsdp1_padded(handle: Any) -> list[torch.Tensor]:
    flat_param = handle.flat_param
    names = ("_full_param_padded", "_full_prec_full_param_padded")  # set by lazy init (sharded strategies)
    return [t for t in (getattr(flat_param, name, None) for name in names) if t is not None]


def _fsdp1_unsharded(handle: Any) -> bool:
    flat_param = handle.flat_param
    local = getattr(flat_param, "_local_shard", None)
    if local is None:  # lazy init never ran: the flat parameter is its own shard
        return False
    if flat_param.data_ptr() != local.data_ptr() or handle._skipped_use_sharded_views:
        return True
    return handle.uses_sharded_strategy and any(_storage_bytes(t) for t in _fsdp1_padded(handle))


def _fsdp1_low_precision_shard_allocated(handle: Any) -> bool:
    return (handle.uses_sharded_strategy and handle._uses_param_mixed_precision
            and _storage_bytes(getattr(handle.flat_param, "_mp_shard", None)) > 0)


def _fsdp1_handle_flags(handle: Any, HandleTrainingState: Any) -> list[str]:
    flags = []
    if handle._training_state != HandleTrainingState.IDLE:
        flags.append(handle._training_state.name)
    flags += [name for name in ("_ran_pre_backward_hook", "_needs_pre_backward_unshard", "_needs_pre_forward_unshard",
                                "_prefetched") if getattr(handle, name, False)]
    if handle._post_forward_index is not None:
        flags.append("_post_forward_index")
    return flags


def _fsdp1_flat_grad_live(handle: Any) -> bool:
    """Whether the flat gradient is a gradient of this update.

    With ``use_orig_params`` the optimizer steps and zeroes the original parameters; the flat
    gradient they were views of stays set after ``zero_grad(set_to_none=True)`` and FSDP drops it
    at the next root pre-forward (``_reset_flat_param_grad_info_if_needed``) because every original
    gradient is None. Such a stale flat gradient is part of an idle boundary, not of an update.
    """
    flat_param = handle.flat_param
    if flat_param.grad is None:
        return False
    if not handle._use_orig_params:
        return True
    return any(p.grad is not None for p in _fsdp1_orig_params(handle) if p.is_leaf)


def _fsdp1_grads(handle: Any) -> list[str]:
    flat_param = handle.flat_param
    held = []
    if _fsdp1_flat_grad_live(handle):
        held.append("flat grad")
    if getattr(flat_param, "_saved_grad_shard", None) is not None:
        held.append("saved grad shard")
    if handle._use_orig_params:
        orig = sum(1 for p in _fsdp1_orig_params(handle) if p.is_leaf and p.grad is not None)
        if orig:
            held.append(f"grad on {orig} original parameter(s)")
    return held


def _fsdp1_orig_params(handle: Any) -> list[torch.Tensor]:
    flat_param = handle.flat_param
    return [*(getattr(flat_param, "_params", None) or ()), *(getattr(flat_param, "_shared_params", None) or ())]


def _fsdp1_discard(found: list[tuple[str, Any]], report: DiscardResult) -> None:
    from torch.distributed.fsdp._common_utils import (
        HandleTrainingState,
        TrainingState,
        _no_dispatch_record_stream,
    )
    from torch.distributed.utils import _free_storage

    units = [unit for _, unit in found]
    roots = [unit for unit in units if unit._is_root]
    for root in roots:
        # the catch-all of _post_backward_final_callback: compute waits for the FSDP streams before
        # any storage they may still write is freed (no-ops on CPU)
        current = root._device_handle.current_stream()
        for name in ("_unshard_stream", "_pre_unshard_stream", "_post_backward_stream", "_all_reduce_stream"):
            stream = getattr(root, name, None)  # created by lazy init
            if stream is not None and stream != current:
                current.wait_stream(stream)
        if getattr(root, "_post_backward_callback_queued", False):  # defined on the root after a forward
            root._post_backward_callback_queued = False
            report.pending_cleared += 1
        eod = root._exec_order_data
        if eod.handles_post_forward_order:
            report.pending_cleared += len(eod.handles_post_forward_order)
            eod.handles_post_forward_order.clear()
        if eod._checking_order:
            eod.current_order_index = 0
        # eod._iter and the pre-forward order stay: they are recorded once, in the first iteration,
        # and a re-run of that iteration completes them in the same order

    for unit in units:
        busy = unit.training_state != TrainingState.IDLE
        unit.training_state = TrainingState.IDLE
        if unit._unshard_event is not None:
            unit._device_handle.current_stream().wait_event(unit._unshard_event)
            unit._unshard_event = None
            report.pending_cleared += 1
            busy = True
        handle = unit._handle
        if handle is not None:
            busy = _fsdp1_discard_handle(unit, handle, report, HandleTrainingState, _no_dispatch_record_stream,
                                         _free_storage) or busy
        report.units_reset += int(busy)


def _fsdp1_discard_handle(unit: Any, handle: Any, report: DiscardResult, HandleTrainingState: Any,
                          record_stream: Any, free_storage: Any) -> bool:
    busy = bool(_fsdp1_handle_flags(handle, HandleTrainingState))
    handle._training_state = HandleTrainingState.IDLE  # so that reshard takes the non-forward path
    handle._ran_pre_backward_hook = False
    handle._needs_pre_backward_unshard = False
    handle._needs_pre_forward_unshard = False
    handle._post_forward_index = None
    handle._prefetched = False

    flat_param = handle.flat_param
    if handle._offload_params:
        _note(report, "FSDP1 CPU offload: the host gradient buffer _cpu_grad keeps the interrupted update's "
                      "values until the re-run's reduction overwrites them (not verified on this platform)")
    if _fsdp1_unsharded(handle) or _fsdp1_low_precision_shard_allocated(handle):
        current = unit._device_handle.current_stream()
        handle.reshard(free_unsharded_flat_param=False)  # point at the local shard (and sharded views)
        if handle.uses_sharded_strategy:
            # free both padded buffers: which one the last unshard used depended on its precision context
            for padded in _fsdp1_padded(handle):
                if _storage_bytes(padded):
                    record_stream(padded, current)
                    free_storage(padded)
        handle.post_reshard()  # NO_SHARD + mixed precision: frees the low-precision shard
        if _fsdp1_low_precision_shard_allocated(handle):  # an unshard that failed before post_unshard
            handle._free_low_precision_sharded_param()
        report.params_freed += 1
        busy = True

    live = _fsdp1_flat_grad_live(handle)
    flat_param.grad = None  # a stale one too: FSDP would drop it at the next root pre-forward anyway
    dropped = int(live)
    if hasattr(flat_param, "_saved_grad_shard"):  # its existence means "accumulate into me"
        dropped += int(flat_param._saved_grad_shard is not None)
        delattr(flat_param, "_saved_grad_shard")
    if handle._use_orig_params:
        # a leftover .grad on an original parameter would be written back into the flat grad
        dropped += sum(_drop_grad(p) for p in _fsdp1_orig_params(handle))
    report.grads_dropped += dropped
    if getattr(flat_param, "_post_backward_called", False):
        flat_param._post_backward_called = False
        busy = True
    hook_state = getattr(flat_param, "_post_backward_hook_state", None)
    if hook_state is not None:  # removed by _finalize_params at the end of every backward
        hook_state[-1].remove()
        delattr(flat_param, "_post_backward_hook_state")
        report.pending_cleared += 1
    hook_handle = getattr(flat_param, "_post_backward_hook_handle", None)  # the compiled-autograd variant
    if hook_handle is not None:
        hook_handle.remove()
        delattr(flat_param, "_post_backward_hook_handle")
        report.pending_cleared += 1
    return busy or dropped > 0


def _fsdp1_partial(found: list[tuple[str, Any]]) -> list[str]:
    from torch.distributed.fsdp._common_utils import HandleTrainingState, TrainingState

    out: list[str] = []
    for name, unit in found:
        if unit.training_state != TrainingState.IDLE:
            out.append(f"FSDP1 unit {name} in {unit.training_state.name}")
        if unit._is_root:
            if getattr(unit, "_post_backward_callback_queued", False):
                out.append(f"FSDP1 root {name}: post-backward callback marked as queued")
            if unit._exec_order_data.handles_post_forward_order:
                out.append(f"FSDP1 root {name}: post-forward order has entries")
        if unit._unshard_event is not None:
            out.append(f"FSDP1 unit {name} holds an unshard event")
        handle = unit._handle
        if handle is None:
            continue
        flags = _fsdp1_handle_flags(handle, HandleTrainingState)
        if flags:
            out.append(f"FSDP1 handle of {name}: {', '.join(flags)}")
        if _fsdp1_unsharded(handle) or _fsdp1_low_precision_shard_allocated(handle):
            out.append(f"FSDP1 handle of {name} is unsharded")
        out += [f"FSDP1 handle of {name} holds a {kind}" for kind in _fsdp1_grads(handle)]
        flat_param = handle.flat_param
        if getattr(flat_param, "_post_backward_called", False):
            out.append(f"FSDP1 handle of {name}: post-backward ran but was not finalized")
        if hasattr(flat_param, "_post_backward_hook_state") or hasattr(flat_param, "_post_backward_hook_handle"):
            out.append(f"FSDP1 handle of {name}: post-backward hook still registered")
    return out


# --------------------------------------------------------------------------------------------
# DDP: the C++ reducer


def _ddp_unfinished(ddp: Any) -> str | None:
    """Why the reducer is mid-backward (``require_finalize_`` set), or None.

    ``_check_reducer_finalized`` is the reducer's own probe (what the next forward's
    ``_rebuild_buckets`` would trip on); it only reads state, but when it fails it also records
    the error in the DDP logger's data.
    """
    try:
        ddp.reducer._check_reducer_finalized()
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def _ddp_discard(found: list[tuple[str, Any]], report: DiscardResult) -> None:
    from .ddp_buckets import is_isolated

    for _name, ddp in found:
        if ddp.static_graph:
            _note(report, "DDP static_graph=True: a backward interrupted in the first iteration is not covered "
                          "(the reducer's num_bwd_calls_ and DDP's _static_graph_delay_allreduce_enqueued stay set)")
        if _ddp_unfinished(ddp) is None:
            continue  # finalized (or interrupted before any gradient hook fired): nothing to reset
        # Reducer::reset_state: expect_autograd_hooks_, require_finalize_, first_autograd_hook_called_,
        # div_factor_, local_used_map_; it also clears has_rebuilt_bucket_, so the buckets are rebuilt
        # (same order, one broadcast) in the forward after the next backward, as after
        # DistributedDataParallel._update_process_group, whose flag we mirror.
        ddp.reducer._reset_state()
        ddp._has_rebuilt_buckets = False
        if not is_isolated(ddp):
            _note(report, "DDP: bucket all-reduces launched before the fault are not awaited (the reducer does not "
                          "expose their Work) and this model's buckets are not isolated (accelpact.runtime."
                          "ddp_buckets): one that completes late writes into the bucket a re-run is filling")
        report.units_reset += 1


def _ddp_partial(found: list[tuple[str, Any]]) -> list[str]:
    out = []
    for name, ddp in found:
        reason = _ddp_unfinished(ddp)
        if reason is not None:
            out.append(f"DDP {name}: reducer did not finalize the last backward ({reason[:120]})")
    return out


# --------------------------------------------------------------------------------------------
# public API


def discard_partial_update(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> DiscardResult:
    """Put every FSDP2 / FSDP1 / DDP wrapper in ``model`` back to the idle state of a committed boundary.

    Call it after an exception escaped forward or backward (or optimizer.step(): then it only drops
    the gradients), before re-running the update from its start. Drops every gradient of the model
    and of ``optimizer``'s parameters (sets them to None), frees unsharded parameters without any
    communication, clears pending collective results and per-iteration bookkeeping, and resets
    training states to IDLE. Idempotent; at a committed boundary it changes nothing.

    Raises TypeError if ``model`` holds none of those wrappers.
    """
    found = _find(model, "discard_partial_update")
    report = DiscardResult(profile=found.profile)
    with torch.no_grad():
        if found.fsdp2:
            _fsdp2_discard(found.fsdp2, report)
        if found.fsdp1:
            _fsdp1_discard(found.fsdp1, report)
        if found.ddp:
            _ddp_discard(found.ddp, report)
        report.grads_dropped += sum(_drop_grad(p) for p in _all_params(model, optimizer))
    return report


def partial_state(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> list[str]:
    """What in ``model`` is not at the idle state of a committed boundary; [] when all of it is.

    Names every FSDP unit / handle / parameter group not IDLE or still unsharded, every pending
    collective result or per-iteration bookkeeping entry, a DDP reducer that did not finalize, and
    every gradient still present. Raises TypeError for a model without a known wrapper.
    """
    found = _find(model, "partial_state")
    out: list[str] = []
    if found.fsdp2:
        out += _fsdp2_partial(found.fsdp2)
    if found.fsdp1:
        out += _fsdp1_partial(found.fsdp1)
    if found.ddp:
        out += _ddp_partial(found.ddp)
    names = {id(p): name for name, p in model.named_parameters()}
    out += [f"gradient on {names.get(id(p), 'an optimizer parameter')}" for p in _all_params(model, optimizer)
            if p.grad is not None]
    return out
