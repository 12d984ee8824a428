"""Real communication faults and bitwise state comparison, for multi-process recovery tests.

A fault here is never simulated: one member of a group skips a collective and the other waits
in it until the group's gloo timeout expires. Afterwards the group's connections are closed for
good, exactly as after a network fault, so only a replacement brings communication back.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["compare_snapshots", "skip_collective_fault", "state_snapshot"]


def skip_collective_fault(
    group: dist.ProcessGroup,
    *,
    waiter: int,
    skipper: int,
    timeout: datetime.timedelta = datetime.timedelta(seconds=1.5),
) -> BaseException | None:
    """Break ``group``: global rank ``skipper`` skips an all-reduce that ``waiter`` runs.

    Every member calls this; the waiter's group timeout is first shortened to ``timeout`` (the
    data-plane timeout that bounds detection), so it fails after about that long. Returns the
    exception the waiter caught (None on every other rank). Other members do nothing.
    """
    me = dist.get_rank()
    if me == waiter:
        group.set_timeout(timeout)
        try:
            dist.all_reduce(torch.zeros(1), group=group)
        except Exception as exc:  # the fault we came for
            return exc
        raise AssertionError(f"all-reduce on {group.group_name!r} succeeded although rank {skipper} skipped it")
    return None


def state_snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This rank's local parameters and optimizer state as plain tensors (DTensors → local shards)."""
    snapshot: dict[str, torch.Tensor] = {}
    names = {id(param): name for name, param in model.named_parameters()}
    for name, param in model.named_parameters():
        snapshot[f"param/{name}"] = _local(param).detach().clone()
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                snapshot[f"optim/{names.get(id(param), '?')}/{key}"] = _local(value).detach().clone()
    return snapshot


def compare_snapshots(expected: Mapping[str, torch.Tensor], actual: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of entries that differ (bitwise, ``torch.equal``), are missing or are extra."""
    problems = [f"missing {name}" for name in expected if name not in actual]
    problems += [f"extra {name}" for name in actual if name not in expected]
    problems += [f"differs {name}" for name in expected
                 if name in actual and not torch.equal(expected[name], actual[name])]
    return problems


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor
