"""Keep DDP's gradient buckets out of reach of a retired communicator's late all-reduces.

DDP's built-in communication all-reduces each gradient bucket *in place*, asynchronously. When a
backward is interrupted, the bucket all-reduces it already launched are still in flight on the
old communicator: gloo cannot cancel them (``abort``/``shutdown`` return at once and the work
still runs to completion or to its timeout, measured here with torch 2.13) and the reducer does
not expose their ``Work``. A Rewind re-runs the same update, whose backward copies fresh gradients
into the *same* bucket buffers; a stale all-reduce that completes then (a peer's data arriving
late) overwrites them, and the re-run silently diverges. CI caught exactly this once.

The cure is the one FSDP2 has by construction: never hand a communicator memory that outlives
the collective. ``isolate_buckets`` registers a communication hook that all-reduces a
pre-divided copy of the bucket, in a buffer no unfinished collective holds, and returns it as the
result; DDP copies that result into the gradients. A stale all-reduce then writes only into its
own orphaned buffer (kept alive by its ``Work``). The numerics are the built-in path's bit for
bit: the reducer's default pre-divides with ``mul`` by ``1 / world size`` as it copies gradients
in, and so does the hook, element by element, before the same all-reduce over the same layout.

DDP takes one communication hook per model; a model whose user registered one before attach
cannot be isolated, and such a rank does not offer Rewind after a backward failure.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import AccelPactError

__all__ = ["BucketIsolationError", "isolate_buckets", "is_isolated", "release_buckets"]

_MARK = "_accelpact_isolated_buckets"


class BucketIsolationError(AccelPactError, RuntimeError):
    """The DDP model already has a communication hook, so AccelPact cannot install its own."""


class _HookState:
    """The hook's state: the DDP module by weak reference, so its current group is always used
    (rebinding swaps ``process_group``) and the reducer does not keep its module alive; and, on
    CPU, one reusable output buffer per bucket.

    A fresh CPU allocation of a bucket's size costs page faults on every update (it made a DDP
    update at dim 128 11-13 % slower here, ``bench/ddp_buckets.py``), so a bucket's previous output is reused
    once the all-reduce that wrote it is *done*: a finished collective writes nothing more. An
    interrupted backward leaves its all-reduces unfinished, so their buffers are never reused and
    a re-run gets new ones. Device tensors are always fresh: the caching allocator makes that
    cheap, and a device future is marked done at enqueue, before its kernel has written.
    """

    def __init__(self, ddp: nn.Module):
        self._ddp = weakref.ref(ddp)
        self._outputs: dict[int, tuple[Any, Any]] = {}  # bucket index -> (buffer, its all-reduce's future)

    def group(self) -> dist.ProcessGroup:
        ddp = self._ddp()
        if ddp is None:  # pragma: no cover - the reducer dies with its module
            raise RuntimeError("the DDP module of this communication hook is gone")
        return ddp.process_group

    def output_for(self, index: int, source: Any) -> Any:
        """A buffer shaped like ``source`` that no collective can still write."""
        held = self._outputs.get(index)
        if held is not None and source.device.type == "cpu":
            buffer, writer = held
            if writer.done() and buffer.shape == source.shape and buffer.dtype == source.dtype \
                    and buffer.device == source.device:
                return buffer
        return source.new_empty(source.shape)

    def launched(self, index: int, buffer: Any, writer: Any) -> None:
        self._outputs[index] = (buffer, writer)


def _allreduce_fresh_copy(state, bucket):  # unannotated: DDP compares annotations as objects
    group = state.group()
    source = bucket.buffer()
    reduced = state.output_for(bucket.index(), source)
    # ``mul`` (not ``div``) by the same double scalar the reducer's default path multiplies by, into
    # a buffer no pending collective holds: the bucket buffer itself never reaches the communicator.
    torch.mul(source, 1.0 / group.size(), out=reduced)
    fut = dist.all_reduce(reduced, group=group, async_op=True).get_future()
    state.launched(bucket.index(), reduced, fut)
    return fut.then(lambda done: done.value()[0])


def is_isolated(ddp: nn.Module) -> bool:
    """Whether ``isolate_buckets`` installed its hook on this DDP module."""
    return bool(getattr(ddp, _MARK, False))


def release_buckets(ddp: Any) -> int:
    """At `rt.close()`: free the output buffers the hook keeps for reuse; returns how many.

    The hook itself stays: DDP offers no way to unregister a communication hook (torch 2.13's
    reducer accepts one hook, once, and has no reset), so this is as close as close can get. What
    stays computes bit for bit what the built-in path computes, holds its module only weakly,
    and a later attach reuses it."""
    freed = 0
    for hook, state in getattr(ddp, "_comm_hooks", ()):
        if hook is _allreduce_fresh_copy and isinstance(state, _HookState):
            freed += len(state._outputs)
            state._outputs.clear()
    return freed


def isolate_buckets(ddp: Any) -> None:
    """Make ``ddp``'s bucket all-reduces work on copies no pending collective holds (idempotent).

    Raises ``BucketIsolationError`` if another communication hook is registered already, and
    ``TypeError`` for anything that is not a ``DistributedDataParallel`` module.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp, DistributedDataParallel):
        raise TypeError(f"isolate_buckets needs a DistributedDataParallel module, got {type(ddp).__name__}")
    if is_isolated(ddp):
        return
    if getattr(ddp, "_comm_hooks", None):
        names = [getattr(hook, "__qualname__", repr(hook)) for hook, _ in ddp._comm_hooks]
        raise BucketIsolationError(
            f"DDP already has the communication hook {names}: AccelPact cannot isolate its gradient buckets, "
            "so a Rewind after a backward failure is not offered on this rank"
        )
    try:
        ddp.register_comm_hook(_HookState(ddp), _allreduce_fresh_copy)
    except RuntimeError as exc:  # a built-in (C++) hook registered with _register_builtin_comm_hook
        raise BucketIsolationError(
            f"DDP refused a communication hook ({str(exc).strip().splitlines()[0]}): AccelPact cannot isolate "
            "its gradient buckets, so a Rewind after a backward failure is not offered on this rank"
        ) from exc
    setattr(ddp, _MARK, True)
