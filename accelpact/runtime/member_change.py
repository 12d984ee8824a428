"""Replace: the effect layer of a membership change (a lost rank's position taken by a spare).

`survive` runs on every rank that is still alive when a member is lost; `join` runs inside the
spare's `attach`. Both end in the same steps, in the same order, because each is a collective on
the new world: build the control plane, move the lost shards' state (digest-verified), probe every
data-plane group, vote, follow the one release value. What to do is decided elsewhere: who is
lost and who takes over by `membership.decide` (pure, read from the one register), resume or
reject by the release register. Nothing here chooses."""

from __future__ import annotations

import datetime
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..comm import _c10d, connections
from ..comm.device import settle_device
from ..comm.lifecycle import retire_groups
from ..comm.validate import validate_groups
from ..control import ControlPlane
from ..errors import EXIT_REJECTED, ControlPlaneError, DeviceWorkFailed, RankFenced
from ..fsm.decisions import applied_steps, may_rerun, must_undo_step
from ..fsm.effects import RestoreBoundary
from ..fsm.phases import FailurePhase, RecoveryAction
from ..launch import Membership
from ..membership import keys, mirror, pool, register, small_state, transfer, world
from ..membership.decide import MembershipDecision, Presence, failure_vote_at
from ..membership.pool import Activation
from ..membership.sealed import holds
from ..rebind.mesh import one_cache_decision
from . import neighbours, shrink
from .evidence import evidence_of
from .guard import this_device_sync
from .history import RecoveryRecord
from .restore import restore_boundary
from .stragglers import StragglerWatch

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("accelpact.runtime")

#: How long the survivors wait for a spare to reach each group its script makes (the spare runs
#: the user's script from its start: imports, model build, wrapping), at least.
JOIN_TIMEOUT_FLOOR_S = pool.JOIN_TIMEOUT_FLOOR_S


_seq = itertools.count(1)  # this process's membership records (model_checking/membership_trace.py)


def trace_event(rt: Runtime, event: str, **fields: Any) -> None:
    """One membership trace record, as `model_checking.membership_trace` checks them."""
    rt.trace.write({"kind": "membership", "event": event, "seq": next(_seq), "position": rt.rank,
                    "pid": os.getpid(), **fields})


def record_train(rt: Runtime) -> None:
    """Update F+1 trained from F and committing in this world (the checker's `train`, at F), when
    the membership is watched: by a commit, or by a Preserve that commits it at its boundary."""
    if rt.membership is not None:
        trace_event(rt, "train", world=rt.membership.world, frontier=rt.frontier, world_size=rt.world_size)


def join_timeout_s(rt: Runtime) -> float:
    return max(JOIN_TIMEOUT_FLOOR_S, 3 * float(rt.config.control_timeout_s))


@dataclass
class MemberChange:
    """What one membership change did on this rank (`rt.history` keeps it as a RecoveryRecord)."""

    world: int  # the world that failed
    decision: MembershipDecision
    outcome: str = "reject"  # resume | reject
    reasons: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    transfers: list[dict] = field(default_factory=list)
    rebound: dict[str, int] = field(default_factory=dict)


class PhaseClock:
    def __init__(self, into: dict[str, float]):
        self.into, self.t = into, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = self.into.get(name, 0.0) + now - self.t
        self.t = now


def presence_of(rt: Runtime, phase: FailurePhase, at_check: bool = False) -> tuple[Presence, bool]:
    """This survivor's report, and whether it holds an applied step it must put back.
    `at_check`: its update ended clean and its boundary check failed after its contribution left."""
    rt.opt_step = applied_steps(rt.opt_step, rt.frontier, phase)
    facts = rt.rewind.facts(frontier=rt.frontier, update=rt.update_index, phase=phase,
                            has_data_cursor=rt.data_state is not None)
    # nothing in flight (the work after a commit failed: `after_commit`): nothing to re-run
    ok, why = may_rerun(facts) if rt.update_index > rt.frontier else (True, "")
    undo = must_undo_step(rt.opt_step, rt.frontier)
    if ok and undo and not rt.rewind.has_step_copy(rt.frontier):
        ok, why = False, f"its step of update {rt.frontier + 1} is applied and there is no pre-step copy"
    gid = rt.data_plane.gids.get("replicate")
    replicas = gid.ranks if gid is not None else ()
    qualified = phase in rt.envelope.replace_phases
    unqualified = "" if qualified else (f"its envelope does not qualify Replace: not qualified for {rt.profile} on "
                                        f"{rt.platform} at {phase} (envelope {rt.envelope_source}; `accelpact qualify` "
                                        "probes it)")
    late = world.groups_made_after_attach(rt.recipe)
    unmirrored = mirror.unmirrorable(rt.model)
    qualified = qualified and not late and not unmirrored
    unqualified = "; ".join(x for x in (unqualified, late, unmirrored) if x)
    copies, copy_faults = neighbours.audit(rt)
    shard = rt.data_plane.gids.get("shard")
    no_shrink = shrink.shrink_refusal(rt)
    return Presence(position=rt.rank, frontier=rt.frontier, generation=rt.generation, rerun_ok=ok,
                    rerun_reason=why, replicas=tuple(replicas), replace_ok=qualified,
                    replace_reason=unqualified, recoveries=rt._recoveries, copies=copies,
                    copy_faults=copy_faults, shard_group=tuple(shard.ranks) if shard is not None else (),
                    on_loss=rt.config.on_loss, shrink_ok=not no_shrink, shrink_reason=no_shrink,
                    at_check=at_check and phase is FailurePhase.COMMITTED and rt.update_index == rt.frontier + 1,
                    save_interrupted=rt.checkpointer is not None and rt.checkpointer.interrupted_at == rt.frontier), undo


def presence_grace_s(control_timeout_s: float, data_timeout_s: float) -> float:
    """How long survivors wait for a position that still heartbeats but has not posted presence.

    A live peer may still be in its update (up to a data timeout behind, like a late rank), then
    in the boundary's health probes (a data timeout) and the control plane's boundary check (a
    control timeout) before it learns of the loss. Waiting less declares a live rank lost and
    fences it: found by the spares campaign, where a rank late at the boundary posted its presence
    7.06 s after the first survivor, 60 ms past the former grace (control timeout + 1 s), and the
    survivors rejected a loss a free spare could have taken over. A dead position's heartbeat stops,
    so this wait only ever lasts for ranks that are alive."""
    return control_timeout_s + 2 * data_timeout_s + 1.0


def survive(rt: Runtime, m: Membership, phase: FailurePhase, at_check: bool = False) -> MemberChange:
    """A member was lost (the control plane failed at the boundary): agree on who, and either
    rebuild the world around the spares or return the reject. RankFenced if this rank itself was
    declared lost (it was cut off, not dead). `at_check`: as `presence_of`."""
    timings: dict[str, float] = {}
    clock = PhaseClock(timings)
    failed_world = m.world
    neighbours.hold_still(rt)  # the restore below may write what the sender still reads
    presence, undo = presence_of(rt, phase, at_check)
    rt.trace.write({"kind": "observe", "seq": rt.control.seq, "update": rt.update_index, "phase_failed": str(phase),
                    "saw": True, "cause": "a member is missing", "failed_groups": []})
    trace_event(rt, "present", world=failed_world, position=rt.rank, frontier=rt.frontier, applied=undo,
                rerun_ok=presence.rerun_ok, copies=[list(c) for c in presence.copies], at_check=presence.at_check)
    register.post_presence(m.store, failed_world, presence)
    _leave_world(rt, failed_world)
    settle_retired_device(rt)
    decision = register.await_decision(
        m.store, failed_world, m.world_size, grace_s=presence_grace_s(rt.config.control_timeout_s,
                                                                      rt.data_plane.timeout_s),
        heartbeat_s=rt.heartbeat.interval_s,
        small_state_at=lambda p: small_state.frontiers_held(m.store, failed_world, p), seen=m.silence,
        join_timeout_s=join_timeout_s(rt))
    m.silence = None  # evidence of this world only
    clock.lap("agree")
    change = MemberChange(world=failed_world, decision=decision, timings_s=timings)
    trace_event(rt, "decided", **decision.to_json())
    if decision.fenced(rt.rank):
        raise fenced_out(rt, m, failed_world)
    if decision.shrink:
        return shrink.go_on_smaller(rt, m, change, undo, clock)
    if not decision.replace:
        change.reasons = list(decision.reasons)
        return change
    restore_frontier(rt, change, undo, clock)
    old_groups = dict(rt.data_plane.groups)
    m.world = failed_world + 1
    world.init_world(m.store, m.world, position=rt.rank, world_size=m.world_size, backend=m.backend,
                     timeout=m.timeout, connect_timeout=datetime.timedelta(seconds=join_timeout_s(rt)))
    built = world.replay(rt.recipe, build_timeout_s=join_timeout_s(rt))
    _mirror_constructors(rt, built)
    trace_event(rt, "world_built", world=m.world)
    clock.lap("rebuild")
    control = rebuild_control_plane(rt)
    world.finish(rt.recipe)
    rebuild_checkpointer(rt)
    clock.lap("control")
    _rebind_groups(rt, old_groups, built, change)
    _fresh_reducers(rt)
    clock.lap("rebind")
    _send_lost_shards(rt, m, control, change)
    await_spares(rt, m, change)
    clock.lap("transfer")
    validate_and_release(rt, m, control, change, clock)
    return change


def _leave_world(rt: Runtime, failed_world: int) -> None:
    """Close this rank's connections of the retired world, now that its presence is posted:
    every outcome (a new world, fewer replicas, fenced, reject) leaves these groups for good, and
    a peer still waiting on this rank inside the framework's collectives learns at once instead of
    at the data timeout, then finds the presence and comes to the same change.

    The control plane's group too: a boundary check this rank or a peer abandoned
    (`wait_unless`) stays queued on that group's gloo thread until the control timeout, and the
    group's destructor joins that thread. Found by the spares campaign: a survivor's first
    forward in the new world blocked 6.8 s where the old control group was freed, its peers timed
    out, and the replacement's re-run was rewound."""
    retired = [*rt.data_plane.groups.values(), rt.control.group]
    severed = connections.sever(retired)
    rt.data_plane.standby.clear()  # connected to the retired world's processes
    trace_event(rt, "left_world", world=failed_world, closed=severed.total, skipped=sorted(severed.skipped))


def settle_retired_device(rt: Runtime) -> None:
    """NCCL: abort every data-plane group of the retired world together, then drain this rank's
    device, each bounded (`comm.device`), before the restore writes device memory and before
    `world.init_world` destroys the world. Found by review: c10d's destroy shuts NCCL communicators
    down gracefully, which flushes their outstanding work, and that never returns behind a kernel
    stuck on the lost peer (an aborted group has left c10d's tables, so the destroy skips it).
    A device that does not settle is this rank's vote against the change (`on_lost_member`)."""
    nccl = rt.data_plane.nccl_groups()
    if not nccl:
        return
    settled = settle_device(broken=nccl, others={}, timeout_s=rt.data_plane.timeout_s, synchronize=this_device_sync(nccl),
                            abort=lambda groups: retire_groups(groups, abort=True))
    log.info("retired world's NCCL groups aborted: %s; device drained: %s", list(settled.aborted), settled.drained)
    if not settled.drained:
        raise DeviceWorkFailed(f"the retired world's device did not settle: {settled.reason}")


def restore_frontier(rt: Runtime, change: MemberChange, undo: bool, clock: PhaseClock) -> None:
    """Back to the agreed frontier F (the update in flight is re-run by the new world), or on to
    it (`roll_forward`); a failed restore is this rank's vote against."""
    if rt.rank in change.decision.rolled:
        roll_forward(rt, change)
        clock.lap("restore")
        return
    if rt.update_index == rt.frontier == change.decision.frontier:  # committed, nothing in flight (the work
        clock.lap("restore")  # after a commit failed): the live state is F's, there is nothing to put back
        return
    restored, _ = restore_boundary(rt.model, rt.optimizer, rt.data_state, rt.rewind,
                                   RestoreBoundary(frontier=change.decision.frontier, undo_step=undo))
    change.reasons += [] if restored.ok else [f"rank {rt.rank}: {restored.reason}"]
    rt.opt_step = change.decision.frontier
    clock.lap("restore")


def roll_forward(rt: Runtime, change: MemberChange) -> None:
    """Commit update F here: this rank finished it and contributed to its boundary check, a member
    was lost inside the check, and peers committed it (`decide.agreed_frontier`). Its state is
    F's (the body ran, the step is applied), so nothing is restored; what a commit runs after it
    (replica digests, a checkpoint) is not: both need the retired world, and they reject on the
    peers that ran them with the dead member."""
    d = change.decision
    if rt.frontier + 1 != d.frontier:  # the decision named this rank: it reported F-1 with at_check
        change.reasons.append(f"rank {rt.rank} was to roll forward to F={d.frontier} from F={rt.frontier}")
        return
    rt.frontier = rt.opt_step = d.frontier
    rt.machine.fire("commit_update")
    rt.observers.commit(rt.frontier, rt.generation)
    trace_event(rt, "rolled_forward", world=change.world, position=rt.rank, frontier=d.frontier)
    log.warning("rank %d commits update %d in the membership change: a member was lost inside its boundary check",
                rt.rank, d.frontier)


def _rebind_groups(rt: Runtime, old_groups: dict, built: dict, change: MemberChange) -> None:
    """Every cached reference to a group of the old world now names its rebuilt twin, proved;
    DTensor's caches are decided once, after the last group (`rebind.mesh.one_cache_decision`)."""
    with one_cache_decision():
        for label, old in old_groups.items():
            new = built[rt.origin_names[label]]
            report = rt.data_plane.plans[label].rebind(new)
            rt.data_plane.plans[label].prove(old)
            rt.data_plane.install(label, new, change.decision.generation, rebound=True)
            for kind, n in report.counts.items():
                change.rebound[kind] = change.rebound.get(kind, 0) + n


def _mirror_constructors(rt: Runtime, built: dict) -> None:
    """DDP's constructor runs collectives on its group, which the spare's runs now (`mirror`)."""
    for ddp in mirror.ddp_modules(rt.model):
        group = built[rt.origin_names["replicate"]]
        _c10d.set_group_timeout(group, datetime.timedelta(seconds=join_timeout_s(rt)))  # the spare may still build
        mirror.mirror_ddp_construction(ddp, group)
        _c10d.set_group_timeout(group, datetime.timedelta(seconds=rt.data_plane.timeout_s))


def _fresh_reducers(rt: Runtime) -> None:
    """The spare's DDP reducer is fresh: so is ours (same bucket layout); the plans recorded the
    old reducer, so they are discovered again."""
    ddps = mirror.ddp_modules(rt.model)
    for ddp in ddps:
        mirror.fresh_reducer(ddp)
    if ddps:
        rt.data_plane.plans = {}
        rt.prepare()


def _send_lost_shards(rt: Runtime, m: Membership, control: ControlPlane, change: MemberChange) -> None:
    """As a holder of a lost shard: post the digest of this copy; as its source: send it, within a
    bound its bytes set (`transfer.transfer_timeout_s`), not the control timeout. Every digest
    goes out before any send: a spare whose source sends another shard first knows how long to
    wait for its own."""
    decision = change.decision
    for lost, (buf, digest) in _post_held_shards(rt, m, decision).items():
        if decision.source[lost] != rt.rank:
            continue
        bound = transfer.transfer_timeout_s(int(buf.numel()), join_timeout_s(rt))
        seconds = transfer.send(buf, to=lost, group=control.group, timeout_s=bound)
        change.transfers.append({"lost": lost, "to_spare": decision.assign[lost], "bytes": int(buf.numel()),
                                 "digest": digest, "send_s": seconds, "via": decision.via.get(lost, "replica")})
        trace_event(rt, "transfer_sent", world=m.world, position=rt.rank, to=lost, bytes=int(buf.numel()),
                    digest=digest)


def _post_held_shards(rt: Runtime, m: Membership, decision: MembershipDecision) -> dict[int, tuple[torch.Tensor, str]]:
    """Post the digest of every lost shard this rank holds, in `decision.lost`'s order (the order
    it sends in); returns lost -> (bytes, digest). Its own state is packed and hashed once, for
    every lost replica of its shard. A neighbour copy goes out as it arrived, under the lost
    rank's own digest and layout."""
    held: dict[int, tuple[torch.Tensor, str]] = {}
    own: tuple[torch.Tensor, str, dict] | None = None
    for lost in decision.lost:
        if rt.rank not in decision.holders.get(lost, ()):
            continue
        if decision.via.get(lost) == "neighbour":
            buf, digest, layout = _neighbour_copy(rt, lost, decision.frontier)
        else:
            own = own or transfer.packed(rt.model, rt.optimizer)
            buf, digest, layout = own
        transfer.post_held_digest(m.store, m.world, lost, rt.rank, digest, buf, layout)
        held[lost] = (buf, digest)
    return held


def _neighbour_copy(rt: Runtime, lost: int, frontier: int) -> tuple[torch.Tensor, str, dict]:
    held = rt.neighbours.held.get(lost, frontier) if rt.neighbours is not None else None
    if held is None:  # audited at presence; a copy is never dropped once complete at F
        raise transfer.TransferError(f"rank {rt.rank} reported a neighbour copy of rank {lost} at "
                                     f"F={frontier} but holds none now")
    return torch.frombuffer(held.data, dtype=torch.uint8), held.digest, held.layout


def join(rt: Runtime, m: Membership, activation: Activation) -> MemberChange:
    """Inside a claimed spare's attach: receive the lost rank's state and small state, then the
    same validate/vote/release as the survivors. The world and the control plane are already
    built (init_process_group, the script's groups, attach's control plane)."""
    timings: dict[str, float] = {}
    clock = PhaseClock(timings)
    decision = register.read_decision(m.store, activation.world - 1)
    if decision is None or decision.assign.get(activation.position) != activation.spare:
        raise ControlPlaneError(f"spare {activation.spare} was claimed for rank {activation.position} but the "
                                f"membership register of world {activation.world - 1} does not say so")
    change = MemberChange(world=activation.world - 1, decision=decision, timings_s=timings)
    rt._recoveries = decision.recoveries  # the next recovery's epoch is the survivors' next one
    trace_event(rt, "world_built", world=activation.world)
    trace_event(rt, "activated", world=activation.world, position=activation.position, spare=activation.spare)
    try:
        _take_in_state(rt, m, activation, decision, change, clock)
    except Exception as exc:  # noqa: BLE001 - any cause (a store timeout, an unpickling error, a
        # state_dict that does not load) is this spare's vote against, kept whole: the survivors
        # learn it at the release, not by waiting out their join bound for a spare that left, and
        # every member rejects alike (exit 75)
        log.error("spare %d could not take over rank %d: %s: %s", activation.spare, activation.position,
                  type(exc).__name__, exc, exc_info=exc)
        change.reasons.append(f"spare {activation.spare} taking over rank {activation.position}: "
                              f"{type(exc).__name__}: {exc}")
    try:  # the survivors wait for this before they probe the new groups (`await_spares`)
        m.store.set(keys.taken_in(m.world, activation.position), "failed" if change.reasons else "ok")
    except RuntimeError as exc:  # the store is gone: the survivors' wait runs out, and they reject
        log.error("spare %d could not say it took in its state: %s", activation.spare, exc)
    validate_and_release(rt, m, rt.control, change, clock)
    return change


def reject_join(rt: Runtime, change: MemberChange) -> None:
    """The spare's side of a change that did not resume: the same record, evidence and fail-stop
    record as the survivors' (`on_lost_member`), then `RecoveryRejected` for the edge. Found by
    review: it exited through `fail_stop` with neither, and where it held rank 0's position the
    attempt log missed the fail-stop record its peers waited for (`Checkpointer.record_fail_stop`)."""
    d = change.decision
    # the job's frontier, which the fail-stop abandons: a spare whose transfer failed never reached it
    # (found by review: its record said F=0, and the restart then claimed nothing to replay)
    rt.frontier = rt.update_index = d.frontier
    record = RecoveryRecord(
        index=rt._recoveries, update=rt.update_index, action=RecoveryAction.REJECT,
        failure_phase=FailurePhase.COMMITTED, saw_failure=False,  # it joins at a boundary; the loss was its peers'
        cause=f"lost rank(s) {list(d.lost)}; this spare was taking over rank {rt.rank}",
        frontier=rt.frontier, generation=rt.generation, reasons=list(change.reasons),
        timings_s=dict(change.timings_s), repair_s=sum(change.timings_s.values()))
    record.replacement = describe(change, rt.rank)
    rt.history.append(record)
    rt.trace.write({"kind": "recovery", **record.to_dict()})
    rt._reject(record.reasons or ["the membership change was rejected"], None, record)


def _take_in_state(rt: Runtime, m: Membership, activation: Activation, decision: MembershipDecision,
                   change: MemberChange, clock: PhaseClock) -> None:
    """The spare: the lost rank's shard from its source (verified against every holder's digest),
    then its small state (RNG, data cursor) at F."""
    lost = activation.position
    got = transfer.receive(m.store, m.world, lost, decision.source[lost], decision.holders[lost], model=rt.model,
                           optimizer=rt.optimizer, group=rt.control.group, timeout_s=join_timeout_s(rt),
                           ahead=transfer.queued_before(decision.source, decision.lost, lost))
    change.transfers.append({"lost": lost, "from": decision.source[lost], "via": decision.via.get(lost, "replica"),
                             **got.to_dict()})
    trace_event(rt, "transfer_verified", world=m.world, position=lost, digest=got.digest, ok=True,
                bytes=got.nbytes, holders=got.holders_agreeing)
    clock.lap("transfer")
    try:
        state = small_state.read(m.store, decision.world, lost, decision.frontier)
    except ValueError as exc:  # the decision saw it in the store: only a later write can have replaced it
        raise ControlPlaneError(f"spare {activation.spare} cannot continue rank {lost}'s stream: {exc}") from exc
    small_state.apply(state, data_state=rt.data_state, stateful=rt.rewind.stateful, optimizer=rt.optimizer,
                      buffers=rt.rewind.buffer_slots(rt.model))
    rt.frontier = rt.opt_step = rt.update_index = decision.frontier
    clock.lap("small_state")


def rebuild_checkpointer(rt: Runtime) -> None:
    """The checkpointer saves over the control group: it gets the new one, by the same gather a
    spare's attach runs. What it counted is kept: its saves, the saves that failed and how many
    in a row (`checkpoint_failures_tolerated` bounds those across changes too), what it restored."""
    if rt.checkpointer is None:
        return
    from .checkpointing import Checkpointer

    old = rt.checkpointer
    rt.checkpointer = Checkpointer(rt)
    for kept in ("saves", "failed", "in_a_row", "restored"):
        setattr(rt.checkpointer, kept, getattr(old, kept))


def rebuild_control_plane(rt: Runtime) -> ControlPlane:
    """The same construction as attach's, so that the spare's attach meets it collective for
    collective."""
    rt.control.left_behind()
    control = ControlPlane(timeout_s=join_timeout_s(rt), attempt=rt.attempt,  # the spare may still build
                           silent_hosts=rt.control.links.silent)
    control.set_timeout(rt.config.control_timeout_s)
    control.cut_short = rt.data_plane.cut_short
    rt.data_plane.scope = control.namespace.rsplit("/", 1)[-1][:8]
    rt.control = control
    # a fresh window, as the spare's and a shrink's (found by review: survivors kept the lost rank's
    # samples at its position while the spare started empty, and their reports differed)
    rt.stragglers = StragglerWatch(control, rt.config, rank=rt.rank, world_size=rt.world_size)
    rt.trace.clock = control.clock
    return control


def await_spares(rt: Runtime, m: Membership, change: MemberChange) -> None:
    """(survivors of a Replace) Wait until every spare of this change holds its lost rank's state
    (`keys.taken_in`), for as long as a spare may take to join and its transfer to run (the bound
    it announced). Why before the probes: a survivor that sent no state would probe at once, while
    the spare still takes in its shard (its holders pack and hash it, the bytes travel, the spare
    hashes and unpacks them); one data timeout there rejected every Replace of a shard past a few
    hundred MB. Waiting here instead, the probes keep the data-plane bound, so a second failure
    inside the change is noticed as fast as before."""
    positions = sorted(change.decision.assign)
    try:
        transfer.await_taken_in(m.store, m.world, positions, join_timeout_s(rt))
    except transfer.TransferError as exc:
        change.reasons.append(f"rank {rt.rank}: the spares taking over {positions} did not take in their state "
                              f"{exc}")


def validate_and_release(rt: Runtime, m: Membership, control: ControlPlane, change: MemberChange,
                         clock: PhaseClock) -> None:
    """Probe every data-plane group, vote, follow the release register. A member that will vote
    against (its restore or its transfer failed) probes too: its peers' probes would otherwise
    wait for it until their timeout before they could vote."""
    ok, reasons = not change.reasons, list(change.reasons)
    try:
        validate_groups([(rt.data_plane.groups[label], rt.data_plane.gids[label].ranks)
                         for label in sorted(rt.data_plane.groups)], timeout=rt.data_plane.probe_timeout())
    except Exception as exc:  # a failed probe is the vote's reason, kept whole
        ok = False
        reasons.append(f"rank {rt.rank}: validating the rebuilt groups: {type(exc).__name__}: {exc}")
    clock.lap("validate")
    register.post_vote(m.store, m.world, rt.rank, ok, "; ".join(reasons))
    trace_event(rt, "vote", world=m.world, position=rt.rank, ok=ok)
    outcome, why = register.release(m.store, m.world, m.world_size, rt.config.control_timeout_s)
    clock.lap("release")
    change.outcome, change.reasons = outcome, why
    trace_event(rt, "release", world=m.world, outcome=outcome)
    rt.generation = change.decision.generation
    if outcome == "resume":  # every member of the new world here alike (survivors, a spare, a shrink)
        rt.data_plane.standby.fill(rt.data_plane, rt.data_plane.groups, token=rt.generation)
        clock.lap("standby")


def fenced_out(rt: Runtime, m: Membership, failed_world: int) -> RankFenced:
    """This process was declared lost and its position given away: record it, and never count it
    among the positions that finished (its successor will; counted twice, the job would end for
    the waiting spares one finisher early, also when `on_reject="raise"` lets it exit normally)."""
    trace_event(rt, "fenced", world=failed_world, position=rt.rank)
    m.store.add(keys.fenced_total(), 1)  # its agent will finish normally: no check-in for it
    m.store.append(keys.fenced_holders(), f"{m.launch_rank},")
    m.finished = True  # `launch._position_done` skips it at exit
    return RankFenced(f"rank {rt.rank} was declared lost in world {failed_world} and a spare took its place",
                      rank=rt.rank, world=failed_world)


def describe(change: MemberChange, rank: int) -> dict[str, Any]:
    """The trace/history fields that name who was lost, who took over, where the state came from."""
    d = change.decision
    return {"lost": list(d.lost), "spares": {str(k): v for k, v in d.assign.items()},
            "sources": {str(k): v for k, v in d.source.items()}, "via": {str(k): v for k, v in d.via.items()},
            "world": change.world + 1, "rolled": list(d.rolled),
            "transfers": change.transfers, "rank": rank}


def changing(rt: Runtime) -> bool:
    """A membership change of this world is under way (a peer posted its presence)."""
    m = rt.membership
    try:
        changed = holds(m.store, keys.changing(m.world))  # a forged flag is no change (`membership.sealed`)
        m.unread_change = ""  # answered: the same trouble later is logged again
        return changed
    except Exception as exc:  # an unreachable store: let the boundary check find out  # noqa: BLE001
        cause = f"{type(exc).__name__}: {exc}"
        if cause != m.unread_change:  # polled every few ms while a wait runs: once per cause
            m.unread_change = cause
            log.warning("could not read whether a membership change of world %d is under way (%s): waits are not "
                        "cut short by one until the store answers", m.world, cause)
        return False


def member_lost(rt: Runtime, cause: str) -> bool:
    """Before the boundary check of a rank whose update failed: is a member gone? Entering the
    check when peers have already left for a membership change would cost the control plane's
    whole timeout, so a peer's presence (`changing`) sends this rank there at once; and after a
    connection a peer closed (its process died, most likely) or a timeout (a peer that vanished,
    or one merely late), the peers' heartbeats are watched for up to 2.5 beats: one that stops is
    a lost member. Otherwise the boundary check goes on as before (a late peer is alive: its
    heartbeat moved), at the cost of those 2.5 beats for a recovery that needs no spare."""
    if changing(rt):
        return True
    if "connection_closed" not in cause and "timeout" not in cause:
        return False
    m = rt.membership
    m.silence = {}
    return register.a_member_went_silent(m.store, m.world, m.world_size, rt.heartbeat.interval_s,
                                         stop_early=lambda: changing(rt), seen=m.silence)


def on_lost_member(rt: Runtime, error: BaseException, phase: FailurePhase, detect_s: float, *,
                   at_check: bool = False) -> None:
    """The runtime's side of a membership change: run it, record it, and resume (re-running the
    update in flight, unless this rank committed it in the change) or reject with the agreed
    reasons. `at_check`: this rank's update was clean and its boundary check is what failed."""
    m = rt.membership
    rt._recoveries += 1
    t0 = time.perf_counter()
    failed_world = m.world
    try:
        change = survive(rt, m, phase, at_check)
    except RankFenced:  # RankLeft too: this rank's replica group left the job
        raise
    except Exception as exc:  # the cause is the reject's reason; peers reject on the release register
        try:
            _vote_against(rt, m, failed_world, f"rank {rt.rank}: {type(exc).__name__}: {exc}")
        except Exception as vote_error:  # noqa: BLE001 - the store itself failed: keep both causes
            exc.add_note(f"accelpact: posting the vote failed too: {vote_error!r}")
        record = RecoveryRecord.control_plane_reject(rt._recoveries, rt.update_index, phase,
                                                     f"membership change failed: {type(exc).__name__}: {exc}",
                                                     rt.frontier, rt.generation, "not reached")
        rt.history.append(record)
        rt._reject(record.reasons, exc, record)
    resumed = change.outcome == "resume"
    d = change.decision
    action = RecoveryAction.SHRINK if d.shrink else RecoveryAction.REPLACE
    record = RecoveryRecord(
        index=rt._recoveries, update=rt.update_index, action=action if resumed else RecoveryAction.REJECT,
        failure_phase=phase, saw_failure=True, cause=f"lost rank(s) {list(d.lost)}: {error}" if d.lost else str(error),
        frontier=d.frontier if resumed else rt.frontier, generation=rt.generation, reasons=list(change.reasons),
        detect_s=detect_s, timings_s=dict(change.timings_s), repair_s=time.perf_counter() - t0,
        rebound=dict(change.rebound))
    record.replacement = describe(change, rt.rank)
    if d.shrink and resumed:
        record.replacement["shrink"] = rt.shrinks[-1]
        log.warning("the job shrank at F=%d: %d -> %d replicas, %d -> %d ranks (this rank %d -> %d)", d.frontier,
                    d.replicas_before, d.replicas_after, rt.shrinks[-1]["world_size_before"], rt.world_size,
                    rt.shrinks[-1]["rank_before"], rt.rank)
    rt.history.append(record)
    rt.trace.write({"kind": "recovery", **record.to_dict()})
    if not resumed:
        rt._reject(record.reasons or ["the membership change was rejected"], error, record)
    rt.frontier = d.frontier
    neighbours.forget_undone(rt, d.frontier)
    rerun = rt.update_index > d.frontier  # every member re-runs update F+1, but one that committed it here
    rt.update_index, rt._rewound = d.frontier, rerun
    rt.rewind.rewinds += rerun
    log.warning(record.summary())
    # every exporter hears of it as of a Preserve or a Rewind (found by review: incident log, metrics,
    # spans and elastic events never saw a Replace or a shrink)
    rt.observers.recovered(evidence_of(rt, record, error))
    if d.save_owed:  # the new world's first collective, on every member alike (`_join` for the spare)
        from .after_commit import take_owed_save

        take_owed_save(rt)


def _vote_against(rt: Runtime, m: Membership, failed_world: int, reason: str) -> None:
    decision = _decision_within(m.store, failed_world, rt.config.control_timeout_s) if m.world == failed_world \
        else None
    at = failure_vote_at(failed_world, m.world, rt.rank, decision)
    if at is not None:
        register.post_vote(m.store, at[0], at[1], False, reason)


def _decision_within(store, failed_world: int, timeout_s: float) -> MembershipDecision | None:
    """The change's decision, waited for up to `timeout_s`: a rank that failed before its peers
    decided would vote at its old position, which a shrink gives to another member (whose own vote
    overwrites it, and the failing rank's new position never gets one: every member then waits out
    the control timeout, and the cause is lost)."""
    try:
        store.wait([keys.decision(failed_world)], datetime.timedelta(seconds=timeout_s))
    except RuntimeError:  # DistStoreError on timeout, or the store gone: vote where it can
        return None
    return register.read_decision(store, failed_world)


def release_spares(rt: Runtime, reasons: list[str]) -> None:
    """Before a reject: the spares still waiting end too (with the reject's code, so that the
    supervisor restarts the whole job)."""
    if rt.membership is None:
        return
    try:
        pool.end_job(rt.membership.store, EXIT_REJECTED, "; ".join(reasons)[:500])
    except ControlPlaneError as exc:
        log.error("%s", exc)


def stop_workers(rt: Runtime) -> None:
    """Every thread the runtime started: the membership's workers and the deferred check's."""
    rt.deferral.stop()
    for worker in (rt.heartbeat, rt.replicator):
        if worker is not None:
            worker.stop()
    neighbours.stop(rt)
