"""Prove a (new) communicator works end to end before anyone trains on it.

Every member contributes its global rank to an int64 all-reduce: the sum is exact, cheap, and
wrong whenever a member is missing, duplicated or belongs to another group, so it checks the
wiring and the membership in one collective.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from ..errors import AccelPactError

__all__ = ["GroupValidationError", "ValidationResult", "validate_group"]


class GroupValidationError(AccelPactError, RuntimeError):
    """The validation all-reduce returned a sum that the expected members cannot produce."""


@dataclass(frozen=True)
class ValidationResult:
    group_name: str
    ranks: tuple[int, ...]
    expected_sum: int
    observed_sum: int
    elapsed_us: float


def _device_for(pg: ProcessGroup) -> torch.device:
    """NCCL groups reduce device tensors; every other backend here reduces CPU tensors."""
    if "nccl" in str(dist.get_backend(pg)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def validate_group(pg: ProcessGroup, ranks: Sequence[int]) -> ValidationResult:
    """All-reduce each member's global rank over ``pg``; raise unless the sum is ``sum(ranks)``.

    A collective: every member of ``pg`` must call it. Failures of the collective itself (timeout,
    closed connection) propagate unchanged, for ``classify_failure``.
    """
    members = tuple(int(r) for r in ranks)
    if pg.size() != len(members):
        raise GroupValidationError(f"group {pg.group_name!r} has {pg.size()} members, expected {list(members)}")
    contribution = torch.tensor([dist.get_rank()], dtype=torch.int64, device=_device_for(pg))
    start = time.perf_counter_ns()
    dist.all_reduce(contribution, group=pg)
    elapsed_us = (time.perf_counter_ns() - start) / 1e3
    result = ValidationResult(pg.group_name, members, sum(members), int(contribution.item()), elapsed_us)
    if result.observed_sum != result.expected_sum:
        raise GroupValidationError(
            f"group {pg.group_name!r}: rank sum {result.observed_sum} != {result.expected_sum} "
            f"expected from members {list(members)}"
        )
    return result
