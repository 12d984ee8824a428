"""Fault drills run on every rank of a spawned world: train under AccelPact with a fault plan,
then train an uninterrupted reference in the same processes and compare bit for bit.

Shared by the runtime tests, the benches and the property-based campaigns, so that each of them
judges "state preserved" the same way.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .. import state as app_state
from ..config import Config
from ..errors import RecoveryRejected
from ..runtime.ddp_buckets import is_isolated
from ..workloads import add_running_stat, build_hsdp_job, seed_everything, stochastic_update
from .bitflip import BitFlip
from .compiled import CompiledProbe, fsdp2_mesh


@dataclass(frozen=True)
class Drill:
    framework: str = "fsdp2"  # fsdp2 | fsdp1 | fsdp1-orig | ddp | fsdp2-full
    updates: int = 6
    faults: str = ""
    layers: int = 2
    local: int = 2
    data_timeout_s: float = 1.0
    control_timeout_s: float = 6.0
    rebind: bool = True
    reference: bool = True
    seed: int = 7
    trace_dir: str | None = None
    #: test-only tampering: {rank: frontier offset} applied just before update `tamper_at`
    tamper_frontier: dict[int, int] = field(default_factory=dict)
    tamper_at: int = 0
    health_check: bool = True
    boundary: str = "sync"  # Config.boundary
    #: verified checkpoints every K updates into this directory (L2 fallback); with
    #: `restart_after_reject`, a rejected run is followed by a restart in the same processes:
    #: fresh groups, model and optimizer, restore of the newest verified checkpoint, replay.
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    restart_after_reject: bool = False
    #: run every update as `rt.step(fn)`, so an interrupted update can be rewound
    rewind: bool = False
    #: Config.envelope: None (default file or built-in), "builtin", "permissive" or a file path
    envelope: str | None = "builtin"
    step_copy: bool = False
    max_rewinds: int = 3
    #: DDP only: register a communication hook of the user's own before attach
    ddp_user_comm_hook: bool = False
    #: step a warm-up LR scheduler inside every update (attach finds it through the optimizer)
    scheduler: bool = False
    #: Config.digest_every; and test-only corruption: (update, rank) whose exp_avg gets one bit
    #: flipped at that update's committed boundary (`testing.bitflip`)
    digest_every: int = 0
    flip_bit: tuple[int, int] | None = None
    #: Config.replicate ("neighbour": copies of unreplicated shards in a ring neighbour's memory)
    replicate: str = "off"
    #: Config.standby_groups; and test-only: (update, rank, how) before whose start that rank's
    #: standbys are forgotten ("forget": its peers still hold theirs, connected) or their
    #: connections shut ("sever": held, but dead)
    standby_groups: str = "gloo"
    spoil_standby: tuple[int, int, str] | None = None
    #: test-only: (update, seconds) before whose start every rank's control plane is given one
    #: remote host to probe, a `MutedHost` that answers no fresh connection until `seconds` after
    #: the first probe (a link that returns then; the real links stay up)
    mute_links: tuple[int, float] | None = None
    #: FSDP2 only: after every update call a compiled region that all-reduces over the model's
    #: mesh (`testing.compiled`); results under "compiled"
    compiled_probe: bool = False
    #: FSDP2 only: a module buffer every forward changes in place, as BatchNorm's running
    #: statistics are (the captures compare buffers: an update a Rewind discards must not count twice)
    running_stat: bool = False


_seed = seed_everything


def _users_allreduce_hook(state, bucket):  # unannotated: DDP compares annotations as objects
    """A user's own DDP hook (in-place, like the built-in one) that looks its group up at every
    call, so that rebinding the DDP module reaches it."""
    group = state().process_group
    tensor = bucket.buffer().div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def build(drill: Drill, generation: int):
    model, optimizer, data = build_hsdp_job(drill.framework, layers=drill.layers, seed=drill.seed, local=drill.local,
                                            seq_len=8, batch_size=2, generation=generation)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup) if drill.scheduler else None
    if drill.running_stat:
        add_running_stat(model, drill.framework)
    return model, optimizer, data, sched


def _warmup(step: int) -> float:
    return min(1.0, (step + 1) / 4)


def _update(model, optimizer, data, sched) -> None:
    _one_update(model, optimizer, data)
    if sched is not None:
        sched.step()


def _capture(model, optimizer, data, sched, *, frontier: int, opt_step: int) -> dict[str, Any]:
    extra = {} if sched is None else {"scheduler": sched.state_dict(),
                                      "lr": [g["lr"] for g in optimizer.param_groups]}
    return app_state.capture(model, optimizer, data, frontier=frontier, opt_step=opt_step, **extra)


_one_update = stochastic_update


def _protected_run(drill: Drill, *, faults: str, generation: int):
    import accelpact

    _seed(drill.seed)
    model, optimizer, data, sched = build(drill, generation=generation)
    config = Config(
        data_timeout_s=drill.data_timeout_s,
        control_timeout_s=drill.control_timeout_s,
        trace_dir=drill.trace_dir,
        rebind=drill.rebind,
        on_reject="raise",
        health_check=drill.health_check,
        boundary=drill.boundary,
        checkpoint_dir=drill.checkpoint_dir,
        checkpoint_every=drill.checkpoint_every,
        run_id="drill",
        envelope=drill.envelope,
        step_copy=drill.step_copy,
        max_rewinds_per_update=drill.max_rewinds,
        digest_every=drill.digest_every,
        replicate=drill.replicate,
        standby_groups=drill.standby_groups,
    )
    if drill.ddp_user_comm_hook:
        model.register_comm_hook(weakref.ref(model), _users_allreduce_hook)
    rt = accelpact.attach(model, optimizer, data_state=data, config=config, faults=faults)
    if drill.flip_bit is not None and drill.flip_bit[1] == dist.get_rank() and generation == 0:  # first attempt
        rt.add_listener(BitFlip(optimizer, update=drill.flip_bit[0], rank=drill.flip_bit[1]))
    rejected = None
    restored_step = rt.checkpointer.restored.step if rt.checkpointer and rt.checkpointer.restored else None
    rt.update_seconds = []  # wall time of each call, recovery included (bench/repair.py)
    rt.update_ends = []  # time.time() at each call's end: a Rewind re-runs inside the call that failed
    rt.compiled_probe = CompiledProbe(fsdp2_mesh(model)) if drill.compiled_probe else None
    try:
        for i in range(rt.frontier, drill.updates):
            if drill.tamper_at and i + 1 == drill.tamper_at:
                rt.frontier += drill.tamper_frontier.get(dist.get_rank(), 0)
            if drill.spoil_standby and drill.spoil_standby[:2] == (i + 1, dist.get_rank()):
                _spoil_standby(rt, drill.spoil_standby[2])
            if drill.mute_links and drill.mute_links[0] == i + 1:
                _mute_links(rt, drill.mute_links[1])
            t0 = time.perf_counter()
            if drill.rewind:
                rt.step(lambda: _update(model, optimizer, data, sched))
            else:
                with rt.update():
                    _update(model, optimizer, data, sched)
            rt.update_seconds.append(time.perf_counter() - t0)
            rt.update_ends.append(time.time())
            if rt.compiled_probe is not None:
                rt.compiled_probe(dist.get_rank())
        rt.settle()  # a deferred last boundary is agreed before anyone reads F
    except RecoveryRejected as rej:
        rejected = rej
    return rt, (model, optimizer, data, sched), rejected, restored_step


#: standbys a drill made its rank forget, kept open until the process ends (`spoil_standby`)
FORGOTTEN: list = []


def _spoil_standby(rt, how: str) -> None:
    from ..comm import connections

    if how == "forget":  # as if its builds had failed: its peers' standbys stay connected
        pool = rt.data_plane.standby
        FORGOTTEN.extend(pool.take(label, token) for label, token in pool.tokens())
    elif how == "sever":
        connections.sever(rt.data_plane.standby.groups().values())
    else:
        raise ValueError(f"spoil_standby: unknown way {how!r} (forget | sever)")


#: stand-ins for hosts behind a cut link, kept until the process ends (`mute_links`)
MUTED: list = []


def _mute_links(rt, seconds: float) -> None:
    from ..control.reach import LinkTable
    from .muted_host import MutedHost

    host = MutedHost()
    MUTED.append(host)
    rt.control.links = LinkTable(rt.control.links.own, {"muted-host": host.address})
    probe = rt.control.probe_links

    def probe_muted(budget_s: float, interval_s: float):
        host.unmute_after(seconds)
        return probe(budget_s, interval_s)

    rt.control.probe_links = probe_muted


def run_drill(rank: int, world_size: int, drill: Drill) -> dict[str, Any]:
    """Protected run with faults, then (optionally) the reference; returns a picklable summary."""
    rt, job, rej, _ = _protected_run(drill, faults=drill.faults, generation=0)
    out: dict[str, Any] = {"rank": rank, "rejected": None, "ddp_isolated": is_isolated(job[0])}
    if rej is not None:
        out["rejected"] = list(rej.reasons)
        out["evidence"] = rej.evidence_path
    if rej is not None and drill.restart_after_reject:
        # What torchrun does after a Reject, in the same processes: everything rebuilt, newest
        # verified checkpoint restored, replay to the end; the fault plan does not fire again.
        out["first_attempt"] = {"frontier": rt.frontier, "history": [r.to_dict() for r in rt.history]}
        rt, job, rej, restored = _protected_run(drill, faults="", generation=500)
        out["restored_step"] = restored
        out["rejected_after_restart"] = list(rej.reasons) if rej is not None else None
        if rej is None:
            out["rejected"] = None
    out.update(
        frontier=rt.frontier,
        generation=rt.generation,
        opt_step=rt.opt_step,
        history=[r.to_dict() for r in rt.history],
        edges=list(rt.machine.taken),
        deferral={"deferred": rt.deferral.deferred, "joined": rt.deferral.joined,
                  "on_thread": rt.deferral.checks.ran if rt.deferral.checks is not None else 0},
        update_seconds=list(getattr(rt, "update_seconds", [])), update_ends=list(getattr(rt, "update_ends", [])),
        compiled=rt.compiled_probe.calls if getattr(rt, "compiled_probe", None) is not None else None,
        digests=[c.to_dict() for c in rt.digests.checks] if rt.digests is not None else [],
        references=rt.prepare() if out["rejected"] is None else {},
    )
    if out["rejected"] is not None:
        return out  # the process is about to be restarted by a supervisor; nothing to compare
    protected = _capture(*job, frontier=rt.frontier, opt_step=rt.opt_step)
    rt.close()
    if drill.reference:
        _seed(drill.seed)
        job = build(drill, generation=1000)
        for _ in range(drill.updates):
            _update(*job)
        reference = _capture(*job, frontier=drill.updates, opt_step=drill.updates)
        out["mismatches"] = app_state.diff(protected, reference)
        out["compared"] = len(protected)
        out["buffers"] = [key.split("/", 1)[1] for key in protected if key.startswith("buffer/")]
    return out
