"""What Rewind puts back before it re-runs an interrupted update: the boundary snapshot and the step copy.

A failure in forward or backward changes no parameter and no optimizer tensor, but it has drawn
from the RNG streams and advanced the data cursor; re-running the update bitwise needs exactly
those back. :class:`BoundarySnapshot` holds them, taken at every committed boundary, so it must
stay cheap (a few RNG states and a small dict, no model tensors).

A failure in or after ``optimizer.step()`` may leave some ranks with the step applied (tau = F+1)
and others without (tau = F). :class:`StepCopy` is the optional host copy that lets every rank be
put back to tau = F: parameters and optimizer state as they were right before the step, written
back *in place* so that every cached reference (FSDP's views into its flat storage, the
optimizer's ``param_groups`` and ``state``, rebind plans) stays valid.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.amp.grad_scaler import _refresh_per_optimizer_state

from accelpact.checkpoint.appstate import capture_rng_state_in_memory, restore_rng_state, rng_problem
from accelpact.runtime.module_buffers import buffer_slots

__all__ = ["BoundarySnapshot", "StepCopy"]


def _check_stateful(data_state: Any) -> None:
    missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(data_state, name, None))]
    if missing:
        kind = type(data_state)
        raise TypeError(
            f"data_state of type {kind.__module__}.{kind.__qualname__} cannot be snapshotted for Rewind: it "
            f"needs state_dict() and load_state_dict() to save and restore its cursor (missing: "
            f"{', '.join(missing)}); pass an object that has both, or data_state=None if the data stream "
            "does not depend on the update count"
        )


@dataclass(frozen=True)
class BoundarySnapshot:
    """RNG streams of every kind and the data cursor at committed frontier ``frontier``.

    ``cursor`` is a deep copy of ``data_state.state_dict()`` (None and ``has_cursor`` False when
    there was no data_state), so advancing the loader afterwards cannot reach into the snapshot,
    and :meth:`restore` hands the loader a fresh copy each time, so one snapshot serves several
    rewinds of the same update.
    """

    frontier: int
    rng: dict[str, Any] = field(repr=False)
    cursor: Any = None
    has_cursor: bool = False
    #: module buffers forward may change (BatchNorm running statistics, counters): (live, copy,
    #: the owner's `_buffers`, name), so that a buffer forward replaced is put back before the copy
    buffers: tuple[tuple[torch.Tensor, torch.Tensor, dict, str], ...] = field(default=(), repr=False)
    #: what else an update mutates (LR schedulers, grad scalers): (live object, its state_dict copy)
    stateful: tuple[tuple[Any, Any], ...] = field(default=(), repr=False)
    #: the optimizer's param-group hyperparameters (lr, momentum, ...; not the params): (live, copy)
    hyper: tuple[tuple[dict, dict], ...] = field(default=(), repr=False)
    #: a CUDA event recorded after the buffers' copies were issued (None: none on a GPU): another
    #: thread that reads the copies waits for it (`membership.small_state`)
    buffers_ready: Any = field(default=None, repr=False)

    @classmethod
    def capture(cls, data_state: Any, frontier: int, model: torch.nn.Module | None = None, *,
                optimizer: torch.optim.Optimizer | None = None, stateful: Sequence[Any] = (),
                model_buffers: Sequence[tuple[dict, str, torch.Tensor]] | None = None) -> BoundarySnapshot:
        """Snapshot the current process; ``data_state`` needs state_dict/load_state_dict, or is None.
        With ``model``, its floating and integer buffers are copied too: a forward that updates
        running statistics would otherwise count the interrupted update twice after a rewind.
        ``stateful`` (schedulers, scalers) and the ``optimizer``'s param-group hyperparameters are
        copied because an update steps them: a rank that finished its update before a peer failed
        would otherwise re-run it one scheduler step ahead. ``model_buffers``: the model's
        buffer slots (owner's `_buffers`, name, tensor) when the caller knows them already
        (`ModuleBuffers.slots`), instead of a walk of ``model``."""
        slots = model_buffers if model_buffers is not None else buffer_slots(model) if model is not None else ()
        buffers = ()
        ready = None
        if slots:
            with torch.no_grad():
                buffers = tuple((b, b.detach().clone(), where, name) for where, name, b in slots)
            device = next((b.device for _, b, _, _ in buffers if b.is_cuda), None)
            if device is not None:  # the copies were issued on that device's current stream
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(device))
        for obj in stateful:
            _check_stateful(obj)
        extra = {"stateful": tuple((obj, copy.deepcopy(obj.state_dict())) for obj in stateful),
                 "hyper": tuple((g, _hyper_copy(g)) for g in (optimizer.param_groups if optimizer is not None else ()))}
        if data_state is None:
            return cls(frontier=int(frontier), rng=capture_rng_state_in_memory(), buffers=buffers, buffers_ready=ready,
                       **extra)
        _check_stateful(data_state)
        cursor = _copied(data_state.state_dict())
        return cls(frontier=int(frontier), rng=capture_rng_state_in_memory(), cursor=cursor, has_cursor=True,
                   buffers=buffers, buffers_ready=ready, **extra)

    def restore(self, data_state: Any) -> None:
        """Put RNG streams and cursor back as captured; checks everything before changing anything."""
        why = rng_problem(self.rng)
        if why:
            raise RuntimeError(f"boundary snapshot of frontier {self.frontier} cannot be restored: {why}")
        if data_state is not None:
            _check_stateful(data_state)
            if not self.has_cursor:
                raise ValueError(f"boundary snapshot of frontier {self.frontier} was captured without a "
                                 "data_state, so it holds no cursor to restore into "
                                 f"{type(data_state).__qualname__}")
        elif self.has_cursor:
            raise ValueError(f"boundary snapshot of frontier {self.frontier} holds a data cursor but no "
                             "data_state was given to restore it into")
        for live, saved, _, _ in self.buffers:
            if live.shape != saved.shape:
                raise RuntimeError(f"boundary snapshot of frontier {self.frontier}: a module buffer changed shape "
                                   f"{tuple(saved.shape)} -> {tuple(live.shape)}; it cannot be restored in place")
        if data_state is not None:
            data_state.load_state_dict(copy.deepcopy(self.cursor))
        with torch.no_grad():
            for live, saved, where, name in self.buffers:
                if where.get(name) is not live:  # forward assigned a new tensor: the old one is the buffer again
                    where[name] = live
                live.copy_(saved)
        for obj, saved in self.stateful:
            obj.load_state_dict(copy.deepcopy(saved))
            _forget_this_steps_unscale(obj)
        for group, saved in self.hyper:
            group.update(copy.deepcopy(saved))
        restore_rng_state(self.rng)


def _forget_this_steps_unscale(obj: Any) -> None:
    """A GradScaler remembers, per optimizer, that it already unscaled this step's gradients and
    the inf check it found (`_per_optimizer_states`), until its `update()`; `load_state_dict` leaves
    that alone. An update abandoned after `scaler.step` or `scaler.unscale_` (a deferred boundary's
    flag, a Rewind in the optimizer phase) would leave it "unscaled", and the re-run would step
    with gradients still multiplied by the scale, or skip on the old inf check. Reset as `update()`
    resets it (pinned by tests/test_snapshot.py against the installed torch)."""
    if isinstance(obj, torch.amp.GradScaler):
        obj._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


_IMMUTABLE = (int, float, bool, str, bytes, type(None))


def _copied(state: Any) -> Any:
    """A copy of a data cursor that advancing the loader cannot reach into. The common cursor is a
    flat dict of numbers and strings: a shallow copy is then a full one, at ~1 µs where
    `copy.deepcopy` takes ~10 (every update's snapshot takes one); anything else is deep copied."""
    if type(state) is dict and all(isinstance(v, _IMMUTABLE) for v in state.values()):
        return dict(state)
    return copy.deepcopy(state)


def _hyper_copy(group: dict) -> dict:
    """A param group's hyperparameters (not its params), copied so that stepping the live group
    cannot change the copy: immutable values are shared, the rest (a tensor lr, a list) deep
    copied. Measured: 5 µs instead of 27 µs per Adam group for `copy.deepcopy` of the whole dict."""
    return {k: v if isinstance(v, _IMMUTABLE) or (isinstance(v, tuple) and all(isinstance(x, _IMMUTABLE) for x in v))
            else copy.deepcopy(v) for k, v in group.items() if k != "params"}


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's storage behind ``t``: a DTensor's local shard, else the tensor itself."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        return local
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        with torch.no_grad():
            return to_local()
    return t


def _copy_all(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy sources into destinations: one foreach call on CPU (about half the cost of a Python loop
    of copy_), per-tensor non-blocking copies (stream-ordered, pinned host side) across devices."""
    if not sources:
        return
    with torch.no_grad():
        if any(t.is_cuda for t in sources) or any(t.is_cuda for t in destinations):
            for destination, source in zip(destinations, sources):
                destination.copy_(source, non_blocking=True)
        else:
            torch._foreach_copy_(destinations, sources)


_IMMUTABLE = (int, float, bool, complex, str, bytes, type(None))


def _copy_value(value: Any) -> Any:
    """A copy the step cannot mutate: immutable values as they are (cheap), anything else deep-copied."""
    if isinstance(value, _IMMUTABLE) or (isinstance(value, tuple) and all(isinstance(v, _IMMUTABLE) for v in value)):
        return value
    return copy.deepcopy(value)


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


@dataclass
class _ParamState:
    """One parameter's optimizer state as it was at take time (objects, not copies)."""

    param: torch.Tensor
    state: dict[str, Any]
    order: tuple[str, ...]
    tensors: dict[str, torch.Tensor]  # key -> the original tensor object
    values: dict[str, Any]  # key -> copy of a non-tensor entry


class StepCopy:
    """Host copy of parameters and optimizer state taken right before ``optimizer.step()``.

    Buffers are allocated at the first :meth:`take` and reused by the next ones (re-allocated only
    where a shape or dtype changed), so a take costs one memcpy of the rank's local parameter and
    optimizer bytes. CUDA tensors are copied into pinned host buffers, ordered on the current
    stream. ``valid_for`` is the frontier the copy was taken at (None before any take or after
    :meth:`invalidate`); the caller compares it with its frontier before restoring.
    """

    def __init__(self) -> None:
        self.valid_for: int | None = None
        self._buffers: list[torch.Tensor] = []
        self._params: list[torch.Tensor] = []
        self._states: list[_ParamState] = []
        self._groups: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (group, non-params entries)
        self._n_params = 0
        self._taken = False
        self._signature: list[tuple[torch.Size, torch.dtype]] = []

    @property
    def nbytes(self) -> int:
        """Host bytes this copy holds (parameters, optimizer tensors, tensor hyper-parameters)."""
        return sum(b.nbytes for b in self._buffers)

    def take(self, model: nn.Module, optimizer: torch.optim.Optimizer, frontier: int | None = None) -> StepCopy:
        """Copy every local parameter shard and every optimizer state entry; returns self."""
        self._taken = False  # until the copy below has completed
        params = _unique([*model.parameters(), *(p for g in optimizer.param_groups for p in g["params"])])
        sources = [_local(p) for p in params]
        states: list[_ParamState] = []
        for param, per_param in optimizer.state.items():
            tensors: dict[str, torch.Tensor] = {}
            values: dict[str, Any] = {}
            for key, value in per_param.items():
                if isinstance(value, torch.Tensor):
                    tensors[key] = value
                    sources.append(_local(value))
                else:
                    values[key] = _copy_value(value)
            states.append(_ParamState(param, per_param, tuple(per_param), tensors, values))
        groups = []
        for group in optimizer.param_groups:
            entries: dict[str, Any] = {}
            for key, value in group.items():
                if key == "params":
                    continue
                if isinstance(value, torch.Tensor):  # e.g. a tensor lr: restored in place too
                    entries[key] = value
                    sources.append(_local(value))
                else:
                    entries[key] = _copy_value(value)
            groups.append((group, entries))
        self._fit_buffers(sources)
        _copy_all(self._buffers, sources)
        self._params, self._states, self._groups, self._n_params = params, states, groups, len(params)
        self.valid_for = None if frontier is None else int(frontier)
        self._taken = True
        return self

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Write the copy back in place and drop optimizer state the step added.

        Parameters and optimizer tensors keep their objects and storage (``data_ptr()`` unchanged);
        an optimizer state entry whose tensor the step replaced gets its original object back.
        Parameters must be in their idle (sharded) state: discard a partial update first.
        """
        if not self._taken:
            raise RuntimeError("StepCopy.restore without a valid copy: take() was never called or the copy "
                               "was invalidated when its update committed")
        targets = [_local(p) for p in self._params]
        for state in self._states:
            targets.extend(_local(t) for t in state.tensors.values())
        for _group, entries in self._groups:
            targets.extend(_local(v) for v in entries.values() if isinstance(v, torch.Tensor))
        self._check_targets(model, targets)
        _copy_all(targets, self._buffers)
        taken = {id(s.param) for s in self._states}
        for param in [p for p in optimizer.state if id(p) not in taken]:
            del optimizer.state[param]  # state created by the step (e.g. Adam's first step)
        for state in self._states:
            optimizer.state[state.param] = state.state
            state.state.clear()
            for key in state.order:
                state.state[key] = state.tensors[key] if key in state.tensors else _copy_value(state.values[key])
        for group, entries in self._groups:
            for key in [k for k in group if k != "params" and k not in entries]:
                del group[key]
            for key, value in entries.items():
                group[key] = value if isinstance(value, torch.Tensor) else _copy_value(value)

    def invalidate(self) -> None:
        """Mark the copy stale (its update committed); buffers are kept for the next take."""
        self.valid_for = None
        self._taken = False

    def _fit_buffers(self, sources: list[torch.Tensor]) -> None:
        """Keep the buffers whose shape and dtype still fit; allocate only the others."""
        signature = [(s.shape, s.dtype) for s in sources]
        if signature == self._signature:
            return
        buffers = self._buffers[: len(sources)]
        for index, source in enumerate(sources):
            if index < len(buffers) and (buffers[index].shape, buffers[index].dtype) == signature[index]:
                continue
            fresh = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=source.is_cuda)
            if index < len(buffers):
                buffers[index] = fresh
            else:
                buffers.append(fresh)
        self._buffers, self._signature = buffers, signature

    def _check_targets(self, model: nn.Module, targets: list[torch.Tensor]) -> None:
        if [(t.shape, t.dtype) for t in targets] == self._signature:
            return
        for index, (target, buffer) in enumerate(zip(targets, self._buffers)):
            if target.shape != buffer.shape or target.dtype != buffer.dtype:
                names = {id(p): name for name, p in model.named_parameters()}
                what = (f"parameter {names.get(id(self._params[index]), index)!r}" if index < self._n_params
                        else f"optimizer tensor #{index - self._n_params}")
                raise RuntimeError(
                    f"StepCopy cannot restore {what}: it is now {tuple(target.shape)} {target.dtype}, the copy "
                    f"is {tuple(buffer.shape)} {buffer.dtype}; put the model back in its idle (sharded) "
                    "state first (discard the partial update)"
                )
