"""Prove a (new) communicator works end to end before anyone trains on it.

Every member contributes its global rank to an int64 all-reduce: the sum is exact, cheap, and
wrong whenever a member is missing, duplicated or belongs to another group, so it checks the
wiring and the membership in one collective.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from ..errors import AccelPactError
from .backends import backends_of, probe_device, wait_for

__all__ = ["GroupValidationError", "ValidationResult", "validate_group", "validate_groups"]


class GroupValidationError(AccelPactError, RuntimeError):
    """The validation all-reduce returned a sum that the expected members cannot produce."""


@dataclass(frozen=True)
class ValidationResult:
    group_name: str
    ranks: tuple[int, ...]
    expected_sum: int
    observed_sum: int
    elapsed_us: float


def _backends(pg: ProcessGroup) -> dict[str, str]:
    """`pg`'s device->backend map (a group c10d does not know is taken for gloo on the CPU)."""
    return backends_of(pg) or {"cpu": "gloo"}


def validate_group(pg: ProcessGroup, ranks: Sequence[int], *,
                   timeout: datetime.timedelta | None = None) -> ValidationResult:
    """All-reduce each member's global rank over ``pg``; raise unless the sum is ``sum(ranks)``.

    A collective: every member of ``pg`` must call it. Failures of the collective itself (timeout,
    closed connection) propagate unchanged, for ``classify_failure``. The reduction runs on the
    device the group's traffic uses; with ``timeout`` an NCCL group is waited for at most that
    long (`backends.wait_for`: a bare wait on NCCL only orders the stream and would never raise).
    """
    return validate_groups([(pg, ranks)], timeout=timeout)[0]


def validate_groups(groups: Sequence[tuple[ProcessGroup, Sequence[int]]], *,
                    timeout: datetime.timedelta | None = None) -> list[ValidationResult]:
    """`validate_group` for several groups at once: every all-reduce is posted before any is
    waited for, so a Rewind that rebuilt every group pays one round trip, not one per group (each
    group runs its own collective; no order between them can deadlock). Every one is waited for;
    the first failure is raised, after the others ended."""
    posted = []
    for pg, ranks in groups:
        members = tuple(int(r) for r in ranks)
        if pg.size() != len(members):
            raise GroupValidationError(f"group {pg.group_name!r} has {pg.size()} members, expected {list(members)}")
        backends = _backends(pg)
        contribution = torch.tensor([dist.get_rank()], dtype=torch.int64, device=probe_device(backends, pg))
        start = time.perf_counter_ns()
        posted.append((pg, members, backends, contribution, start,
                       dist.all_reduce(contribution, group=pg, async_op=True)))
    results: list[ValidationResult] = []
    first: BaseException | None = None
    for pg, members, backends, contribution, start, work in posted:
        try:
            if timeout is None:
                work.wait()
            else:
                wait_for(work, backends, timeout)
        except Exception as exc:  # whatever the backend raises, kept whole; the others still waited
            first = first or exc
            continue
        result = ValidationResult(pg.group_name, members, sum(members), int(contribution.item()),
                                  (time.perf_counter_ns() - start) / 1e3)
        if result.observed_sum != result.expected_sum and first is None:
            first = GroupValidationError(
                f"group {pg.group_name!r}: rank sum {result.observed_sum} != {result.expected_sum} "
                f"expected from members {list(members)}"
            )
        results.append(result)
    if first is not None:
        raise first
    return results
