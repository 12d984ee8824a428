"""Restart-safe process-group initialisation under torchrun.

torchrun's agent hosts one TCP store for the whole job and restarted workers connect to the same
store with the same keys. A restarted gloo worker can then read a peer's address written by the
*previous* attempt before the peer overwrites it, and fail with "Gloo connectFullMesh failed ...
Connection refused" (seen here on the first restart of a 4-rank job). `init_process_group`
scopes every key of the new attempt under its own prefix, so no attempt can read another's.

The attempt number comes from the job's store, not from TORCHELASTIC_RESTART_COUNT: each node's
agent counts restarts on its own, and after a cut a node may restart its workers because another
node re-rendezvoused without counting it. Rank 0 numbers the attempts (a counter only it adds to)
and every other worker asks it (`agreed_attempt`). Not "every worker adds 1, attempt = (count - 1)
// world size" (found by review): a worker that died before it added (an import, the device's
initialisation) or a world that changed size put the count out of step for good, ranks then took
different attempts, and every later start hung on keys nobody else wrote.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import secrets
import time
from dataclasses import dataclass

import torch.distributed as dist

from .comm import connections
from .comm.backends import parse_backends, uses_nccl
from .comm.nccl_env import apply_required
from .control.auth import ENV_SECRET
from .errors import ConfigError, SpareReleased
from .launch_elastic import rendezvous_endpoint
from .membership.sealed import membership_store

log = logging.getLogger("accelpact.launch")

_attempt: int | None = None
_launch: str | None = None

#: ACCELPACT_SPARES=S: the launch's last S processes are hot spares (see `Membership`).
ENV_SPARES = "ACCELPACT_SPARES"
#: ACCELPACT_ON_LOSS=shrink: a lost rank no spare takes over may shrink the job (`Config.on_loss`);
#: the membership is watched from the start, as with spares.
ENV_ON_LOSS = "ACCELPACT_ON_LOSS"


@dataclass
class Membership:
    """This process's place in a job launched with spares (or allowed to shrink).

    The launch starts W + S processes (torchrun's WORLD_SIZE); the first W hold the positions
    (ranks) 0..W-1 of a training world of size W, the last S wait as spares. `world` counts the
    worlds built so far: a Replace builds the next one, on a fresh store prefix; so does a
    shrink, with a smaller `world_size` and this process renumbered (`position`)."""

    store: dist.Store  # the job's store, outliving every world (spares, presence, registers)
    spares: int
    world_size: int  # W: the training world
    launch_rank: int
    backend: str
    timeout: datetime.timedelta
    position: int = -1  # the rank held, -1 while a spare waits
    world: int = 0
    #: set on a spare by its activation: `attach` then joins the running job instead of starting
    activation: object | None = None
    finished: bool = False
    #: ACCELPACT_ON_LOSS: "shrink" lets the whole replica groups go on without a lost one
    on_loss: str = "reject"
    #: when each position's heartbeat last moved, as this process saw it while it watched for a
    #: lost member in the current world: the decision's wait starts from that evidence, not anew
    silence: dict | None = None
    #: why this process last failed to read whether a change is under way (logged once per cause)
    unread_change: str = ""

    @property
    def is_spare(self) -> bool:
        return self.launch_rank >= self.world_size


_membership: Membership | None = None


def membership() -> Membership | None:
    """The job's membership when it was launched with spares (`ACCELPACT_SPARES`), else None."""
    return _membership


def current_attempt() -> int:
    """This job attempt's number (0 first): from the store when `init_process_group` ran under
    torchrun, else torchrun's own restart count, else 0."""
    if _attempt is not None:
        return _attempt
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def current_launch() -> str | None:
    """This launch's identity (the same on every worker of every attempt of one torchrun launch,
    new at the next launch), when `init_process_group` ran under torchrun; else None. Attempts
    count from 0 again in every launch: the attempts log tells them apart by it."""
    return _launch


def init_process_group(backend: str = "gloo", *, timeout: datetime.timedelta | None = None, **kwargs) -> None:
    """Drop-in for `torch.distributed.init_process_group` that is safe across torchrun restarts.

    With an NCCL backend it first sets the NCCL environment a recovery needs
    (`comm.nccl_env.REQUIRED`: ProcessGroupNCCL reads it when communicators are created, so it
    must be in place before this call), logging every value it changes."""
    global _attempt, _launch
    env = os.environ
    # the environment is checked before anything changes: a refusal leaves the process as it was
    spares, on_loss = _spares(env), _on_loss(env)
    watched = spares or on_loss == "shrink"
    if watched and ("store" in kwargs or "init_method" in kwargs):
        raise ConfigError(f"{ENV_SPARES}={spares} / {ENV_ON_LOSS}={on_loss} need the launcher's environment "
                          "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE as torchrun sets them), not store= or "
                          "init_method=")
    if watched:  # used only at the job's end (`_position_done`): a bad value must stop the start
        rendezvous_endpoint(env)
    connections.track()  # a retired world's connections can then be closed (`comm.connections`)
    # also for a gloo default group on a CUDA host: its data plane may be `new_group(backend="nccl")`,
    # and ProcessGroupNCCL reads these as each communicator is built (found by review)
    if uses_nccl(parse_backends(backend)) or _cuda_available():
        for change in apply_required(env):
            log.warning("accelpact set %s", change)
    if not watched and ("TORCHELASTIC_RESTART_COUNT" not in env or "store" in kwargs or "init_method" in kwargs):
        dist.init_process_group(backend, timeout=timeout, **kwargs)
        return
    rank = int(env["RANK"])
    launched = int(env["WORLD_SIZE"])
    _take_launch_arguments(kwargs, rank=rank, world_size=launched, watched=watched)
    store_timeout = timeout or datetime.timedelta(minutes=5)
    # under torchrun the agent hosts the store (it outlives every worker); without the agent's
    # store, rank 0 hosts it, and rank 0 then cannot be lost. Decided as torch decides it
    # (found by review: keyed on TORCHELASTIC_RUN_ID, a torchrun job whose agent hosts no store,
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, had no store host at all and timed out every start)
    client = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), launched,
        is_master=env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0, timeout=store_timeout,
        use_libuv=True,
    )
    run = env.get("TORCHELASTIC_RUN_ID", "run")
    _attempt = agreed_attempt(client, f"accelpact/{run}/", rank, launched, store_timeout.total_seconds())
    _launch = launch_id(client, f"accelpact/{run}/", rank)
    store = dist.PrefixStore(f"accelpact/{run}/attempt{_attempt}/", client)
    if watched:
        sealed = membership_store(store, env, f"{run}/attempt{_attempt}")
        if sealed is store:
            log.warning("%s is not set: the membership change's values in the job store are not signed, so a "
                        "client that can write the store could forge a release or a spare's claim, or run code in "
                        "a spare through the small state it unpickles; give every process, spares included, the "
                        "same %s", ENV_SECRET, ENV_SECRET)
        _start_with_spares(backend, sealed, rank, launched, spares, timeout, on_loss)
        return
    dist.init_process_group(backend, store=store, rank=rank, world_size=launched, timeout=timeout, **kwargs)


#: How long a worker waits for rank 0's answer under a number it read before it reads the number
#: again: only a number left by a rank 0 that died during its handshake goes unanswered.
ASK_AGAIN_S = 2.0


def agreed_attempt(store: dist.Store, prefix: str, rank: int, world_size: int, timeout_s: float) -> int:
    """This start's attempt number, the same on every worker of it (collective over `world_size`
    workers on `store`, under `prefix`).

    Rank 0 counts its own starts (an attempt in which it never got here takes no number) and
    publishes the number; every other worker counts its own starts too, tells rank 0 under that
    number which start it is, and takes the number once rank 0 acknowledges that very start. Rank
    0 withdraws the number once every worker has it, so the next attempt's workers wait for the
    next one; a number left by a rank 0 that died during its handshake is never acknowledged for
    a new start, and the worker reads again. Raises ConfigError naming who did not arrive within
    `timeout_s`."""
    mine = store.add(f"{prefix}starts/{rank}", 1)  # this worker's n-th start: never seen before
    deadline = time.monotonic() + timeout_s
    current = f"{prefix}current-attempt"
    if rank == 0:
        attempt = store.add(f"{prefix}attempts", 1) - 1
        store.set(current, str(attempt))
        try:
            for peer in range(1, world_size):
                arrived = f"{prefix}attempt{attempt}/arrived/{peer}"
                try:
                    store.wait([arrived], datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.01)))
                except RuntimeError as exc:  # c10d's DistStoreError on a timeout
                    raise ConfigError(f"rank {peer} did not start attempt {attempt} within {timeout_s:.0f} s "
                                      f"({type(exc).__name__}: {exc})") from exc
                store.set(f"{prefix}attempt{attempt}/ack/{peer}/{int(store.get(arrived))}", "")
        finally:
            store.delete_key(current)
        return attempt
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait([current], datetime.timedelta(seconds=max(left, 0.01)))
            attempt = int(store.get(current))
            store.set(f"{prefix}attempt{attempt}/arrived/{rank}", str(mine))
            store.wait([f"{prefix}attempt{attempt}/ack/{rank}/{mine}"],
                       datetime.timedelta(seconds=max(min(ASK_AGAIN_S, left), 0.01)))
            return attempt
        except RuntimeError as exc:  # not acknowledged: a number left behind; read again, until the deadline
            if time.monotonic() >= deadline:
                raise ConfigError(f"rank {rank}: rank 0 did not acknowledge this start within {timeout_s:.0f} s "
                                  f"({type(exc).__name__}: {exc})") from exc


def launch_id(store: dist.Store, prefix: str, rank: int) -> str:
    """The launch's identity: drawn by rank 0 of its first attempt into the launcher's store (which
    lives as long as the launch), read by everyone after (a store's `get` waits for its key)."""
    if rank == 0:
        return store.compare_set(f"{prefix}launch", "", secrets.token_hex(8)).decode()
    return store.get(f"{prefix}launch").decode()


def _take_launch_arguments(kwargs: dict, *, rank: int, world_size: int, watched: bool) -> None:
    """`rank=` and `world_size=` as the launcher's environment gives them (taken out of `kwargs`);
    anything else is refused where it would not reach the group: the worlds a membership change
    builds take only backend, rank, size and timeout (found by review: `rank=` raised a bare
    TypeError, and `device_id=` under spares was dropped without a word)."""
    launcher = {"rank": rank, "world_size": world_size}
    for name, expected in launcher.items():
        if name in kwargs and kwargs.pop(name) != expected:
            raise ConfigError(f"init_process_group({name}=...) differs from the launcher's environment "
                              f"({'RANK' if name == 'rank' else 'WORLD_SIZE'}={expected}): leave it out under torchrun")
    if watched and kwargs:
        raise ConfigError(f"init_process_group({', '.join(sorted(kwargs))}=...): under {ENV_SPARES} or "
                          f"{ENV_ON_LOSS}=shrink the worlds a membership change builds take only the backend and "
                          "the timeout; leave the rest out")


def _spares(env) -> int:
    """ACCELPACT_SPARES as `Config.with_env` reads it (an empty value is refused, not 0): what
    this accepts, attach accepts, so no job starts its groups only to be refused there."""
    raw = env.get(ENV_SPARES)
    if raw is None:
        return 0
    try:
        spares = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV_SPARES}={raw!r} is not a whole number of spare processes") from None
    if spares < 0:
        raise ConfigError(f"{ENV_SPARES}={spares}: the number of spares cannot be negative")
    if spares and not all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        raise ConfigError(f"{ENV_SPARES}={spares} needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (torchrun sets "
                          "them)")
    if spares and spares >= int(env["WORLD_SIZE"]):
        raise ConfigError(f"{ENV_SPARES}={spares} leaves no active rank in a launch of WORLD_SIZE={env['WORLD_SIZE']}")
    return spares


def _on_loss(env) -> str:
    """ACCELPACT_ON_LOSS exactly as `Config.with_env` reads it (no case folding, no stripping, an
    empty value refused): ' Shrink ' started a watched job whose every attach then refused it."""
    from .config import ON_LOSS_MODES

    raw = env.get(ENV_ON_LOSS)
    if raw is None:
        return "reject"
    if raw not in ON_LOSS_MODES:
        raise ConfigError(f"{ENV_ON_LOSS}={raw!r}: expected exactly one of {', '.join(ON_LOSS_MODES)}")
    if raw == "shrink" and not all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        raise ConfigError(f"{ENV_ON_LOSS}=shrink needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (torchrun sets "
                          "them)")
    return raw


def _start_with_spares(backend, store, rank, launched, spares, timeout, on_loss="reject") -> None:
    """An active rank joins world 0 at once; a spare waits (heartbeating) until it is claimed
    for a lost position, then joins the world that replaces it, under that position's rank."""
    from .membership import keys, pool, warm, world

    global _membership
    m = Membership(store=store, spares=spares, world_size=launched - spares, launch_rank=rank, backend=backend,
                   timeout=timeout or datetime.timedelta(minutes=30), on_loss=on_loss)
    _membership = m
    # which torchrun agent started this process: the exit-barrier check-in counts lost agents
    store.set(keys.agent_of(rank), os.environ.get("GROUP_RANK", str(rank)))
    preload = warm.modules_to_preload(os.environ)  # checked on every process: a typo fails everywhere
    if m.is_spare:
        pool.register(store, rank)
        warm.warm_up_in_background(preload)  # imports the script would otherwise pay after the claim
        log.info("rank %d waits as a spare", rank)
        activation = pool.wait_for_claim(store, rank)  # SpareReleased when the job ends first
        m.position, m.world, m.activation = activation.position, activation.world, activation
        m.world_size = activation.world_size  # the world it joins (no spare is offered after a shrink)
        log.warning("spare %d takes over rank %d in world %d", rank, m.position, m.world)
        store.set(keys.holder(m.position), str(rank))  # who holds it now: a lost holder's agent is counted
        _join_as_spare(m, activation)
    else:
        m.position = rank
        store.set(keys.holder(m.position), str(rank))
        world.init_world(store, m.world, position=m.position, world_size=m.world_size, backend=backend,
                         timeout=m.timeout)
    atexit.register(_position_done)


def _join_as_spare(m: Membership, activation) -> None:
    """A claimed spare joins the survivors' new world within the survivors' own bound for it
    (`Activation.join_timeout_s`), not the job's 30 minutes: survivors that gave up on the change
    end the job, and the spare learns it before it connects or when its connect runs out
    (SpareReleased with the job's code, as if it had never been claimed)."""
    from .membership import pool, world

    ended = pool.job_ended(m.store)
    if ended is not None:
        raise SpareReleased(*ended)
    try:
        world.init_world(m.store, m.world, position=m.position, world_size=m.world_size, backend=m.backend,
                         timeout=m.timeout, connect_timeout=datetime.timedelta(seconds=activation.join_timeout_s))
    except RuntimeError as exc:  # DistStoreError / gloo's connect timeout
        # the spare's bound started when it saw its claim, the survivors' only after they restored:
        # a spare that ran out first waits for their verdict rather than exiting non-zero on its own
        # (its agent would restart its workers, the other spares with it)
        ended = _job_end_within(m.store, activation.join_timeout_s)
        if ended is None:
            exc.add_note(f"the job did not end within {activation.join_timeout_s:.0f}s after this spare's "
                         "connect to the new world ran out")
            raise
        code, why = ended
        raise SpareReleased(code, f"{why} (the job ended while this spare joined: {type(exc).__name__}: "
                                  f"{exc})") from exc


def _job_end_within(store, timeout_s: float, poll_s: float = 0.1) -> tuple[int, str] | None:
    """The job's end (code, why) if it is written within `timeout_s`, else None."""
    from .membership import pool

    deadline = time.monotonic() + timeout_s
    while (ended := pool.job_ended(store)) is None and time.monotonic() < deadline:
        time.sleep(poll_s)
    return ended


def _position_done() -> None:
    """At a normal exit of a position's holder: the last one releases the spares still waiting."""
    from .membership import pool

    m = _membership
    if m is None or m.finished or m.position < 0:
        return
    m.finished = True
    try:
        if pool.position_done(m.store, m.world_size):  # the last one: no agent waits for the lost
            from .launch_elastic import check_in_for_lost_agents

            # torchrun's exit barrier counts agents (GROUP_WORLD_SIZE), not ranks: one per node
            # under --nproc-per-node > 1. Counting either wrong ends the barrier early (the store's
            # host exits under a surviving agent) or never (it waits 300 s)
            agents = int(os.environ.get("GROUP_WORLD_SIZE") or (m.world_size + m.spares))
            check_in_for_lost_agents(pool.agents_lost(m.store), agents)
    except Exception as exc:  # the store may be gone at the very end of the job; say so
        log.warning("could not report this rank's end to the spares: %s: %s", type(exc).__name__, exc)
