"""Shrink: the effect layer of going on with fewer replicas (`Config.on_loss="shrink"`).

Who leaves and who stays as whom was decided by `membership.shrink` (pure, one register value).
Here each survivor carries it out: a rank of a broken replica group leaves cleanly; a rank that
stays restores its boundary snapshot of F (every update in flight is re-run, as in a Replace),
builds world + 1 with its new rank, rebuilds its groups under their old names with the members
that stay, points every cached reference at them (proved), shrinks the meshes in place
(`rebind.reshape`, proved), gives the data partition its new index and count, and then
validates, votes and follows the release like every membership change. The gradient average
follows the smaller world: FSDP2 divides by its groups' sizes at every reduction, FSDP1's fixed
factors are computed again by the reshape.

What changed in the experiment (replicas, world size, effective batch, the frontier) is written
into the trace, `rt.history` (`RecoveryRecord.replacement["shrink"]`), the next checkpoint's
metadata (`rt.shrinks`), and the log.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

from ..errors import RankLeft
from ..fsm.decisions import GroupId
from ..launch import Membership
from ..membership import keys, world
from ..rebind import reshape
from ..rebind.mesh import clear_dtensor_sharding_caches
from . import member_change as mc  # the steps every membership change shares (imported both ways)
from .stragglers import StragglerWatch

if TYPE_CHECKING:
    from .member_change import MemberChange, PhaseClock
    from .runtime import Runtime


def shrink_refusal(rt: Runtime) -> str:
    """Why this rank could not go on in a smaller world (empty if it can)."""
    if rt.config.on_loss != "shrink":
        return "Config.on_loss is not shrink"
    if "replicate" not in rt.data_plane.gids:
        return "its model keeps one copy of each shard (no replicate group): nothing whole would remain"
    if rt.profile not in ("fsdp2-hsdp", "fsdp1-hsdp"):
        return (f"a shrink covers FSDP2 HSDP and FSDP1 HYBRID_SHARD, this rank's profile is {rt.profile}: DDP's "
                "reducer keeps the world's size where neither a rebind nor a reshape reaches it")
    if not callable(getattr(rt.data_state, "reshard", None)):
        return "its data_state has no reshard(index, count): the data partition could not follow the smaller world"
    return reshape.unshrinkable([mesh for plan in rt.data_plane.plans.values() for mesh in plan.meshes])


def go_on_smaller(rt: Runtime, m: Membership, change: MemberChange, undo: bool, clock: PhaseClock) -> MemberChange:
    """Leave (RankLeft) or carry the shrink out on this rank; the outcome is the release value."""
    d = change.decision
    if d.leaves(rt.rank):
        mc.trace_event(rt, "left", world=change.world, position=rt.rank)
        m.finished = True  # holds no position at the end: the spares' and agents' count goes on without it
        raise RankLeft(f"rank {rt.rank}'s replica group lost rank(s) {list(d.lost)}; the job goes on with "
                       f"{d.replicas_after} of {d.replicas_before} replicas without it", rank=rt.rank, world=change.world)
    mc.restore_frontier(rt, change, undo, clock)
    old_rank, new_rank, new_size = rt.rank, d.renumber[rt.rank], len(d.renumber)
    old_groups, old_gids = dict(rt.data_plane.groups), dict(rt.data_plane.gids)
    # the new number before the new world: the heartbeat and a failed rebuild's vote then name this
    # rank's position in world+1, never its old one (another member's there: found by review)
    _renumber(rt, new_rank, new_size, d.frontier)
    m.world, m.world_size, m.position = change.world + 1, new_size, new_rank
    world.init_world(m.store, m.world, position=new_rank, world_size=new_size, backend=m.backend, timeout=m.timeout,
                     connect_timeout=datetime.timedelta(seconds=mc.join_timeout_s(rt)))
    m.store.set(keys.holder(new_rank), str(m.launch_rank))  # who holds the new position, for a later loss
    rt.recipe = world.translated(rt.recipe, d.renumber)
    built = world.replay(rt.recipe, build_timeout_s=rt.config.control_timeout_s)
    mc.trace_event(rt, "world_built", world=m.world, renumbered_from=old_rank)
    clock.lap("rebuild")
    control = mc.rebuild_control_plane(rt)
    rt.stragglers = StragglerWatch(control, rt.config, rank=new_rank, world_size=new_size)
    world.finish(rt.recipe)
    mc.rebuild_checkpointer(rt)
    clock.lap("control")
    _rebind_shrunk(rt, old_groups, old_gids, built, d.renumber, change)
    rt.data_state.reshard(new_rank, new_size)
    snapshot = rt.rewind.snapshot  # a Rewind before the next commit restores F into the new partition
    if snapshot is not None and snapshot.frontier == d.frontier:
        rt.rewind.snapshot = dataclasses.replace(snapshot, cursor=copy.deepcopy(rt.data_state.state_dict()))
    clock.lap("rebind")
    mc.validate_and_release(rt, m, control, change, clock)
    if change.outcome == "resume":
        rt.shrinks.append(describe_shrink(rt, change, old_rank))
    return change


def _renumber(rt: Runtime, new_rank: int, new_size: int, frontier: int) -> None:
    """Everything of this runtime that names its rank or the world's size."""
    rt.rank, rt.world_size = new_rank, new_size
    rt.machine.ctx.rank = new_rank
    for worker in (rt.heartbeat, rt.replicator):
        if worker is not None:
            worker.position = new_rank
    for listener in rt.listeners:  # a drill's injector: faults name the position they strike,
        if hasattr(listener, "rank") and hasattr(listener, "plan"):  # and the position's holder
            listener.rank = new_rank  # before the shrink fired those up to the re-run of F+1
            listener.fired_through = max(listener.fired_through, frontier + 1)


def _rebind_shrunk(rt: Runtime, old_groups: dict, old_gids: dict, built: dict, renumber: dict[int, int],
                   change: MemberChange) -> None:
    """Point every reference at the rebuilt groups (proved), then shrink the meshes (proved)."""
    meshes = []
    for label, old in old_groups.items():
        ranks = tuple(renumber[r] for r in old_gids[label].ranks if r in renumber)
        new = built[rt.origin_names[label]]
        plan = rt.data_plane.plans[label]
        plan.ranks = ranks  # the same group, renumbered: the membership check compares these
        report = plan.rebind(new)
        plan.prove(old)
        rt.data_plane.install(label, new, change.decision.generation, rebound=True)
        rt.data_plane.gids[label] = GroupId(label, ranks)
        meshes.extend(plan.meshes)
        for kind, n in report.counts.items():
            change.rebound[kind] = change.rebound.get(kind, 0) + n
    shaped = reshape.reshape(rt.model, meshes, renumber, rt.rank)
    reshape.proof(rt.model, meshes, rt.world_size, rt.rank)
    # the groups kept their names, so the rebinds kept DTensor's caches; but the meshes changed
    # shape in place, and a cached decision (keyed by specs hashed with the old shape) would not
    clear_dtensor_sharding_caches()
    change.rebound["mesh.reshaped"] = shaped.meshes
    change.rebound["fsdp2.mesh_info_resized"] = shaped.mesh_infos
    change.rebound["fsdp1.divide_factors"] = shaped.fsdp1_factors


def describe_shrink(rt: Runtime, change: MemberChange, old_rank: int) -> dict[str, Any]:
    """What changed in the experiment, for the trace, the history and the next checkpoint."""
    d = change.decision
    batch = getattr(rt.data_state, "batch_size", None)
    return {"frontier": d.frontier, "world": change.world + 1, "lost": list(d.lost), "left": list(d.leaving),
            "replicas_before": d.replicas_before, "replicas_after": d.replicas_after,
            "world_size_before": len(d.present) + len(d.lost), "world_size_after": len(d.renumber),
            "rank_before": old_rank, "rank_after": rt.rank,
            "effective_batch_before": None if batch is None else batch * (len(d.present) + len(d.lost)),
            "effective_batch_after": None if batch is None else batch * len(d.renumber)}
