"""`accelpact.attach`: build a rank's runtime from its collaborators, in the order every rank
must follow (each step that talks to peers is a collective on every rank).

This is the entry point, so it is also where the drill's fault injector is installed (from
`faults=` or `ACCELPACT_FAULTS`) and where a spent restart budget meets the edge (`fail_stop`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..comm import _c10d
from ..comm.nccl_env import nccl_version, refuse_unfit
from ..config import Config
from ..control import ControlPlane
from ..envelope import DEFAULT_ENVELOPE, Envelope, choose_envelope, conditions_met
from ..errors import ConfigError, RestartBudgetExceeded, UnsupportedModelError
from ..faults import FaultInjector, FaultPlan
from ..fsm.decisions import EnvelopeFacts, envelope_facts, envelope_warning
from ..fsm.deferral import why_never_deferred
from ..fsm.phases import FailurePhase
from ..launch import current_attempt, membership
from ..observe import observers_for
from ..observe.hang_watch import HangWatch
from ..paths import usable_directory, usable_file
from ..rebind import NotReadyError
from ..timeouts import timeouts_too_close
from ..trace import TraceWriter
from .calibrate import adopt_timeouts, provisional, publish_timeouts, settle_timeouts
from .data_plane import DataPlane
from .detect import envelope_platform, envelope_profile
from .digests import ReplicaDigests
from .fail_stop import fail_stop
from .rewind import RewindState, schedulers_of
from .runtime import ATTACHED, Runtime
from .same_settings import check_same_settings, shared_settings
from .standby import StandbyPool

log = logging.getLogger("accelpact.runtime")


def attach(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_state: Any = None,
    config: Config | None = None,
    *,
    envelope: Envelope | None = None,
    meshes: tuple[Any, ...] = (),
    faults: FaultPlan | str | None = None,
    faults_every_attempt: bool = False,
    schedulers: tuple[Any, ...] | None = None,
    scalers: tuple[Any, ...] = (),
) -> Runtime:
    """Protect `model`'s training: discover its data-plane groups, build the rebind plans once,
    open the control plane. Run each optimizer update as `rt.step(fn)` (it can be rewound) or
    inside `with rt.update():` (a failure inside it can only be preserved or rejected).

    `schedulers` and `scalers` (LR schedulers, grad scalers) are what else an update steps: a
    Rewind puts them back with the boundary snapshot. None finds the optimizer's LR schedulers
    that exist at attach; a GradScaler is never found, pass it.

    `faults` (drills only): a fault plan to inject, e.g. "skip@5:committed:2"; None reads
    ACCELPACT_FAULTS. A drill's faults fire in the first restart attempt only unless
    `faults_every_attempt` (or ACCELPACT_FAULTS_EVERY_ATTEMPT=1)."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"attach expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"attach expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not dist.is_initialized():
        raise ConfigError("call torch.distributed.init_process_group (or accelpact.init_process_group) "
                          "before accelpact.attach")
    if getattr(model, ATTACHED, False):
        raise ConfigError("this model is already attached to an AccelPact runtime: a second attach would hook "
                          "every update twice; call rt.close() first")
    stateful = _stepped_with_the_update(optimizer, schedulers, scalers)
    config = _with_spares((config or Config()).with_env().validate(), model)
    _check_data_state(data_state, config)
    _check_paths(config, dist.get_rank())
    rank, world_size, attempt = dist.get_rank(), dist.get_world_size(), current_attempt()
    profile = envelope_profile(model, config.profile)
    plane = DataPlane(model, timeout_s=provisional(config)[0], extra=discovery_roots(optimizer, meshes, scalers))
    plane.refuse_default_group()
    _check_environment(plane, rank)
    rt: Runtime | None = None
    try:
        rt = _build(model, optimizer, data_state, config, envelope, profile, plane, rank, world_size, attempt,
                    stateful)
        injector = _injector(faults, faults_every_attempt, rank, world_size, rt.attempt, rt.config)  # rank 0's
        if injector is not None:
            rt.add_listener(injector)
        _checkpointing(rt, config, rank)
        _join(rt, injector) if rt.membership and rt.membership.activation else rt.line_up()  # a spare: receive
    except BaseException:
        # a failed attach leaves the user's objects as it found them: hooks, timeouts, the mark
        if rt is not None:
            rt.close()
        plane.restore_timeouts()
        raise
    log.info("attached", extra={"rank": rank, "profile": rt.profile, "groups": sorted(rt.data_plane.gids)})
    return rt


def _check_environment(plane: DataPlane, rank: int) -> None:
    """Refuse NCCL settings an in-memory recovery cannot live with; name a torch the internals were not
    verified on."""
    if plane.uses_nccl():
        refuse_unfit(os.environ, nccl_version())
    unverified = _c10d.unverified_torch()
    if unverified and rank == 0:
        log.warning(unverified)
        print(f"[accelpact] WARNING: {unverified}", file=sys.stderr, flush=True)


def _with_spares(config: Config, model: nn.Module) -> Config:
    """The launch says how many spares there are; a config that says otherwise is a mistake.
    Checked before any collective, so a refusal ends every rank at once."""
    from torch.nn.parallel import DistributedDataParallel

    m = membership()
    if config.on_loss == "shrink" and (m is None or m.on_loss != "shrink"):
        raise ConfigError("Config.on_loss='shrink' needs ACCELPACT_ON_LOSS=shrink in the environment of "
                          "accelpact.init_process_group: every rank watches its peers from the start")
    if config.on_loss == "shrink" and config.replicate != "off":
        raise ConfigError(f"Config.on_loss='shrink' with replicate={config.replicate!r} is not supported: a shrink "
                          "does not rebuild the neighbour ring")
    if (m is None or not m.spares) and config.replicate != "off":
        raise ConfigError(f"Config.replicate={config.replicate!r} keeps copies for a spare to take over from, but the "
                          "job was not launched with spares: set ACCELPACT_SPARES (and start the processes with "
                          "accelpact.init_process_group), or leave replicate off")
    if m is None:
        if config.spares:
            raise ConfigError(f"Config.spares={config.spares}, but the job was not launched with spares: set "
                              "ACCELPACT_SPARES and start the processes with accelpact.init_process_group")
        return config
    if config.spares not in (0, m.spares):
        raise ConfigError(f"Config.spares={config.spares}, but the launch has {m.spares} (ACCELPACT_SPARES)")
    if m.on_loss == "shrink":
        config = dataclasses.replace(config, on_loss="shrink")
    for module in model.modules():
        if isinstance(module, DistributedDataParallel) and module.mixed_precision is not None:
            raise ConfigError("spares (ACCELPACT_SPARES) cover DDP without mixed precision only: a survivor rebuilds "
                              "its reducer as a spare's constructor builds it (membership.mirror)")
    return dataclasses.replace(config, spares=m.spares, step_copy=True)


def _join(rt: Runtime, injector: FaultInjector | None) -> None:
    from .member_change import describe, join, reject_join

    m = rt.membership
    activation, m.activation = m.activation, None
    try:
        rt.prepare()
    except NotReadyError:  # FSDP1 before its first forward: discovered at the first boundary
        rt._plans_deferred = "alone"  # the survivors discovered theirs long ago: no line-up after it
    change = join(rt, m, activation)
    if change.outcome != "resume":
        rt._fail_stop_on_reject(reject_join, rt, change)  # exit 75, or raised under on_reject="raise"
    if injector is not None:
        injector.fired_through = rt.frontier + 1  # the lost process fired these
    rt.trace.write({"kind": "joined", **describe(change, rt.rank), "timings_s": change.timings_s})
    log.warning("spare %d took over rank %d at F=%d", activation.spare, rt.rank, rt.frontier)
    if change.decision.save_owed:  # the survivors take it right after the release too (on_lost_member)
        from .after_commit import take_owed_save

        # its Reject goes to the edge as the survivors' does (found by review: it left attach as a
        # bare exception, exit 1 where every peer exited 75)
        rt._fail_stop_on_reject(take_owed_save, rt)


def _membership_workers(rt: Runtime, plane: DataPlane, control: ControlPlane, config: Config) -> None:
    """Under spares: what a rebuilt world replays, the heartbeat, the small-state replicator."""

    from ..comm import _c10d
    from ..membership import world
    from ..membership.register import Heartbeat
    from ..membership.small_state import Replicator
    from . import neighbours
    from .member_change import changing
    from .snapshot import BoundarySnapshot

    m = membership()
    if m is None:
        return
    names = {label: pg.group_name for label, pg in plane.groups.items()}
    data = set(names.values())

    def timeout_of(name: str) -> float:
        if name in data:
            return float(config.data_timeout_s)
        found = _c10d.group_timeout(_c10d.resolve_name(name))
        return found.total_seconds() if found is not None else float(config.control_timeout_s)

    rt.membership, rt.origin_names = m, names
    plane.cut_short = control.cut_short = lambda: changing(rt)  # a peer left for a membership change
    rt.recipe = world.record(control.group, timeout_of)
    rt.heartbeat = Heartbeat(m.store, rt.rank, config.heartbeat_s, world_of=lambda: m.world)
    rt.replicator = Replicator(m.store, rt.rank, capture=lambda: BoundarySnapshot.capture(
        rt.data_state, rt.frontier + 1, optimizer=rt.optimizer, stateful=rt.rewind.stateful,
        model_buffers=rt.rewind.buffer_slots(rt.model)), world_of=lambda: m.world)
    rt.listeners.insert(0, rt.replicator)  # joins its write before any other listener sees the forward
    neighbours.start(rt, m, plane, config)


def _check_paths(config: Config, rank: int) -> None:
    """Every directory and file the config names is usable, before anything is built (the metrics
    textfile as this rank will write it: a directory, or a `{rank}` template, names one per rank)."""
    from ..observe.metrics import textfile_path

    for setting, directory in (("trace_dir", config.trace_dir), ("checkpoint_dir", config.checkpoint_dir)):
        if directory is not None:
            usable_directory(directory, setting)
    if config.metrics_textfile:
        usable_file(textfile_path(config.metrics_textfile, rank), "metrics_textfile")


def discovery_roots(optimizer, meshes, scalers) -> list[Any]:
    """What besides the model may cache a data-plane group, for rebind discovery: the optimizer,
    the meshes, and the scalers (found by review: `ShardedGradScaler(process_group=...)` all-reduces
    `found_inf` on its group, and a recovery left it on the retired one)."""
    return [optimizer, *meshes, *scalers]


def _stepped_with_the_update(optimizer, schedulers, scalers) -> tuple[Any, ...]:
    """The schedulers and scalers a Rewind must put back (see `attach`)."""
    stateful = (*(schedulers_of(optimizer) if schedulers is None else schedulers), *scalers)
    for obj in stateful:
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise ConfigError(f"{type(obj).__name__} given as a scheduler or scaler has no state_dict/load_state_dict")
    return stateful


def _check_data_state(data_state: Any, config: Config) -> None:
    if config.on_loss == "shrink" and not callable(getattr(data_state, "reshard", None)):
        raise ConfigError(f"Config.on_loss='shrink' needs a data_state with reshard(index, count): after a shrink "
                          f"the data partition follows the smaller world; {type(data_state).__name__} has none")
    if data_state is None:
        return
    missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(data_state, name, None))]
    if missing:
        raise ConfigError(f"data_state {type(data_state).__name__} has no {' or '.join(missing)}: pass the data "
                          "loader's cursor (an object with state_dict/load_state_dict) so that checkpoints and "
                          "a rewound update read the same batches, or None")


def _checkpointing(rt: Runtime, config: Config, rank: int) -> None:
    if config.checkpoint_dir is None:
        return
    from .checkpointing import Checkpointer

    rt.checkpointer = Checkpointer(rt)  # a collective: a spare meets the survivors' (member_change)
    if rt.membership is not None and rt.membership.activation is not None:
        return  # a spare taking over: no restart of its own to count, its state comes from a peer
    # how the previous attempt ended goes on record first: it may be the one that spent the budget
    # (found by review: it was never logged when the budget then stopped the job)
    rt.checkpointer.note_previous_attempt()
    try:
        rt.checkpointer.enforce_budget()
    except RestartBudgetExceeded as exc:
        fail_stop(exc, on_reject=config.on_reject, rank=rank)
    if config.restore:
        rt.checkpointer.restore()


def _injector(faults, every_attempt: bool, rank: int, world_size: int, attempt: int,
              config: Config) -> FaultInjector | None:
    if faults is None:
        injector = FaultInjector.from_env(rank=rank, world_size=world_size, attempt=attempt,
                                          data_timeout_s=config.data_timeout_s)
    else:
        injector = FaultInjector.for_attempt(faults, rank=rank, world_size=world_size, attempt=attempt,
                                             data_timeout_s=config.data_timeout_s, every_attempt=every_attempt)
    checks = [str(f) for f in injector.plan.faults if f.phase == "check"] if injector is not None else []
    if checks and config.boundary == "deferred":  # a deferred check has no after-check point to strike at
        raise ConfigError(f"fault(s) {', '.join(checks)} strike at a boundary check, which a deferred boundary "
                          "(Config.boundary='deferred') runs on its own thread: they would never fire")
    return injector


def _build(model, optimizer, data_state, config: Config, envelope: Envelope | None, profile: str,
           plane: DataPlane, rank: int, world_size: int, attempt: int, stateful: tuple[Any, ...]) -> Runtime:
    platform = envelope_platform(plane.groups, config.platform)
    refused = ""  # why this rank's envelope was refused: said on every rank together, below
    if envelope is None:
        try:
            envelope, source = choose_envelope(config, platform, profile, rank=rank)
        except ConfigError as exc:  # each host reads its own file: a stale or corrupt one may be one rank's
            refused, envelope, source = str(exc), DEFAULT_ENVELOPE, "refused"
    else:
        source = "given to attach"
    # an unknown platform/profile is refused by name; an action qualified under conditions this config lacks is not
    facts = envelope_facts(envelope, platform, profile, met=conditions_met(config))
    warning = envelope_warning(facts, profile, source) if not refused else ""
    if warning and rank == 0:
        log.warning(warning)
        print(f"[accelpact] WARNING: {warning}", file=sys.stderr, flush=True)
    if rank == 0:
        log.info("envelope %s allows for %s on %s: %s", source, profile, platform, facts.describe())
    plane.enforce_timeout()
    control = ControlPlane(timeout_s=provisional(config)[1], attempt=attempt)
    plane.scope = control.namespace.rsplit("/", 1)[-1][:8]  # this attach's replacement names
    plane.standby = StandbyPool(config.standby_groups)
    try:  # "auto": measured here, the same on every rank, applied to both planes (a spare: the survivors')
        _refuse_together(control, rank, refused)
        config, timeouts = _settle(config, plane, control, model, rank, envelope)
    except BaseException:
        control.close()
        raise
    try:
        trace = TraceWriter(config.trace_dir, rank, control.attempt, clock=control.clock)  # a directory it cannot make
    except BaseException:
        control.close()
        raise
    rewind = RewindState(step_copy=config.step_copy, max_rewinds=config.max_rewinds_per_update, stateful=stateful)
    if FailurePhase.BACKWARD in facts.rewind_phases:
        rewind.unisolated_ddp = _isolate_ddp_buckets(model, rank)
    rt = Runtime(model=model, optimizer=optimizer, data_state=data_state, config=config, rank=rank,
                 world_size=world_size, attempt=control.attempt, profile=profile, platform=platform, envelope=facts,
                 envelope_source=source, data_plane=plane, control=control, trace=trace, rewind=rewind)
    try:  # from here on a failure closes what was built: hooks, trace, control plane, threads
        _started(rt, facts, source, timeouts, stateful)
    except BaseException:
        # found by review: a refusal after the membership's threads started (a ring stride that
        # does not fit the world) left this rank beating as if alive, its control plane open
        rt.close()
        raise
    return rt


def _started(rt: Runtime, facts: EnvelopeFacts, source: str, timeouts: Any, stateful: tuple[Any, ...]) -> None:
    """What a runtime starts once it exists: the settings check, the membership's threads, the
    trace's first record, the observers, the hang watch."""
    config, plane, control, trace, rewind = rt.config, rt.data_plane, rt.control, rt.trace, rt.rewind
    profile, platform, world_size, has_data_cursor = rt.profile, rt.platform, rt.world_size, rt.data_state is not None
    rt.timeouts = timeouts
    joining = membership()
    if joining is None or joining.activation is None:  # a joining spare: the survivors compared theirs
        _same_settings_everywhere(rt, facts, profile, platform, has_data_cursor, rewind.refused_always())
    rt.digests = ReplicaDigests(config.digest_every) if config.digest_every else None
    _membership_workers(rt, plane, control, config)
    trace.write({
        "kind": "config", "world_size": world_size, "profile": profile, "platform": platform,
        "data_timeout_s": config.data_timeout_s, "control_timeout_s": config.control_timeout_s,
        "timeouts": timeouts.to_json() if timeouts else None,
        "groups": {label: gid.key for label, gid in plane.gids.items()}, "envelope": source,
        "rewind_phases": [str(p) for p in facts.rewind_phases], "preserve": facts.preserve,
        "step_copy": config.step_copy, "ddp_buckets_not_isolated": rewind.unisolated_ddp,
        "digest_every": config.digest_every,
        "rewind_restores": [type(obj).__name__ for obj in stateful],
    })
    for observer in observers_for(rt):  # incident log, torchelastic events; spans and metrics if asked
        rt.observers.add(observer)
    _watch_for_hangs(rt, config)


def _same_settings_everywhere(rt: Runtime, facts: EnvelopeFacts, profile: str, platform: str,
                              has_data_cursor: bool, rewind_refused: str) -> None:
    """Refuse settings that differ between ranks (`same_settings`); say once why a deferred
    boundary will never be deferred."""
    config = rt.config
    check_same_settings(rt.control.group, rt.rank, shared_settings(config, facts, profile=profile, platform=platform,
                                                                   has_data_cursor=has_data_cursor,
                                                                   rewind_refused=bool(rewind_refused)))
    never = why_never_deferred(facts.rewind_phases, step_copy=config.step_copy, has_cursor=has_data_cursor,
                               rewind_refused=rewind_refused)
    if config.boundary == "deferred" and never and rt.rank == 0:
        log.warning("Config.boundary is deferred, but every boundary will be agreed synchronously: %s", never)


def _refuse_together(control: ControlPlane, rank: int, refused: str) -> None:
    """An envelope one rank refused fails every rank's attach, at the first collective: found by
    review, that rank raised before the control plane was built, and its peers waited in its
    construction for a minute and failed with a store timeout that named nothing. A joining spare
    meets the survivors' rebuilt control plane, which makes no such check: its refusal is its own,
    and the survivors' bound for its join ends the change."""
    m = membership()
    if m is not None and m.activation is not None:
        if refused:
            raise ConfigError(refused)
        return
    check_same_settings(control.group, rank, {"envelope refused": refused[:500]})
    if refused:  # the same on every rank (else the check above raised on every rank)
        raise ConfigError(refused)


def _settle(config: Config, plane: DataPlane, control: ControlPlane, model: nn.Module, rank: int,
            envelope: Envelope) -> tuple[Config, Any]:
    """The timeouts of this attach: measured ("auto"), or under spares, the survivors' for a
    joining spare (published by rank 0 when the job first attached)."""
    m = membership()
    if m is not None and m.activation is not None:
        return adopt_timeouts(m.store, config, plane, control), None
    # whether a rank calibrates decides which collectives it posts next: compared first (found by
    # review: a host given explicit timeouts went on to the settings check while its peers
    # measured, and the two met as mismatched collectives instead of this ConfigError)
    check_same_settings(control.group, rank, {name: getattr(config, name)
                                              for name in ("data_timeout_s", "control_timeout_s")})
    config, timeouts = settle_timeouts(config, plane, control, model, rank=rank, qualified=envelope.timeouts)
    if rank == 0 and (close := timeouts_too_close(float(config.data_timeout_s), float(config.control_timeout_s))):
        log.warning(close)
        print(f"[accelpact] WARNING: {close}", file=sys.stderr, flush=True)
    if m is not None and rank == 0:
        publish_timeouts(m.store, config)
    return config, timeouts


def _watch_for_hangs(rt: Runtime, config: Config) -> None:
    """The hang watch's thread runs from here to `close` (an observer's close); it arms at every
    phase as the first listener, so it is armed before a drill's fault stalls the phase."""
    if not config.hang_watch_fraction:
        return
    watch = HangWatch(config.hang_watch_fraction * float(config.data_timeout_s))
    rt.hang_watch = watch
    rt.listeners.insert(0, watch)
    rt.observers.add(watch)
    watch.start()


def _isolate_ddp_buckets(model: nn.Module, rank: int) -> str:
    """Isolate every DDP module's buckets; returns why one could not be ('' when all were)."""
    from torch.nn.parallel import DistributedDataParallel

    from .ddp_buckets import BucketIsolationError, isolate_buckets

    for name, module in model.named_modules():
        if isinstance(module, DistributedDataParallel):
            try:
                isolate_buckets(module)
            except BucketIsolationError as exc:
                reason = f"DDP {name or 'model'}: {exc}"
                log.warning(reason, extra={"rank": rank})
                return reason
    return ""
