"""Go on with fewer replicas (`Config.on_loss="shrink"`): which ranks continue, and as whom.

A pure function of the survivors' reports, like `decide.decide_membership` that calls it.

The unit a shrink keeps or lets go is a *replica group*: the ranks that together hold one whole
copy of the model (an HSDP shard group, FSDP1 HYBRID_SHARD's intra-node group, a single DDP rank).
A lost rank takes its whole replica group with it, because the shard it held has no other holder
inside that group. The groups that are still whole go on:
- every live rank of a broken replica group leaves (it is told so and exits cleanly);
- the ranks that stay are renumbered 0..W'-1 in their old order. That keeps each rank's index
  inside its replica group, and so the shard it holds; only the replica coordinate changes;
- refused when no replica group is whole. A shard with no live holder needs reconstruction,
  never a smaller average;
- refused unless every survivor can go on in a smaller world (`shrink_ok`): its wrappers, its
  data partition and its configuration.
What the smaller world changes (gradient average over fewer replicas, data partition, effective
batch) is done by the effect layer (`runtime/shrink.py`) and recorded there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class _Report(Protocol):  # what `decide.Presence` carries for a shrink
    position: int
    shard_group: tuple[int, ...]
    shrink_ok: bool
    shrink_reason: str


@dataclass(frozen=True)
class ShrinkPlan:
    """Who leaves, who stays as whom, or why a shrink cannot be done."""

    leaving: tuple[int, ...] = ()
    renumber: dict[int, int] = field(default_factory=dict)
    replicas_before: int = 0
    replicas_after: int = 0
    reasons: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons


def replica_group(report: _Report) -> tuple[int, ...]:
    """The ranks holding one whole model copy with `report`'s rank (itself alone if none)."""
    return tuple(sorted(report.shard_group)) or (report.position,)


def plan_shrink(*, world_size: int, lost: Sequence[int], reports: Sequence[_Report]) -> ShrinkPlan:
    """The smaller world after losing `lost`, from the survivors' `reports`."""
    reasons = [f"rank {r.position} cannot go on in a smaller world: {r.shrink_reason or 'unknown'}"
               for r in reports if not r.shrink_ok]
    groups = {r.position: replica_group(r) for r in reports}
    sizes = sorted({len(g) for g in groups.values()})
    if len(sizes) > 1:
        reasons.append(f"the replica groups differ in size {sizes}: the mesh is not uniform")
    lost_set = set(lost)
    leaving = tuple(sorted(p for p, g in groups.items() if lost_set & set(g)))
    let_go = set(leaving)
    staying = sorted(p for p in groups if p not in let_go)
    if not staying:
        reasons.append(f"no replica group is whole after losing rank(s) {sorted(lost_set)}: the shard of each lost "
                       "rank would have no live holder (a fully sharded job keeps one copy; it needs a spare and "
                       "neighbour copies)")
    if reasons:
        return ShrinkPlan(reasons=tuple(reasons))
    size = sizes[0]
    return ShrinkPlan(leaving=leaving, renumber={p: i for i, p in enumerate(staying)},
                      replicas_before=world_size // size, replicas_after=len(staying) // size)
