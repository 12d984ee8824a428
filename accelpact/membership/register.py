"""Presence and the one membership decision of a world, in the job's store.

Every survivor posts its `Presence`, then waits until every position has posted or is gone (its
heartbeat stopped: a dead process, detected in about two heartbeats) or the grace period ends (a
process that still heartbeats but never posts is cut off from its peers), or a peer's reject
ends the job (its reject is then the decision: those who rejected were not lost). The first survivor
whose wait ends computes the decision (`decide.decide_membership`, pure) from the presences it
read and writes it by compare-and-set: every rank follows that one value, so no two survivors
can act on two different decisions, and a late rank learns from it that it was replaced."""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time

import torch.distributed as dist

from ..errors import ControlPlaneError
from . import keys, liveness, pool
from .decide import MembershipDecision, Presence, decide_membership
from .sealed import holds, opened_or_none

log = logging.getLogger("accelpact.membership")

#: Why no spare is offered once the job shrank: a spare joins with the launch-time world and its
#: script builds the launch-time groups, not the smaller world's renumbered ones (found by review:
#: such a Replace could only wait out its join and reject).
SPARES_AFTER_SHRINK = "the job shrank, and a spare would join the world it was launched for, not the smaller one"


class Heartbeat:
    """This position's pulse in the store, from a thread of its own and a store client of its own
    (`Store.clone`): a TCPStore client serves one call at a time, and a `wait` of the training
    thread (a vote, an outcome, a group's rendezvous) holds it for seconds, longer than a peer
    waits before it counts this position gone."""

    def __init__(self, store: dist.Store, position: int, interval_s: float, world_of=lambda: 0):
        self.store, self.position, self.interval_s, self.world_of = own_client(store), position, interval_s, world_of
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accelpact-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            world = self.world_of()
            try:
                # the process and its world ride on every beat: a peer on this host can certify
                # a silent position dead at once (`liveness`). A world's keys are never deleted:
                # a late reader's check-then-get would wait out the store's timeout on a key
                # deleted in between (about 100 bytes per position and change stay behind)
                self.store.set(keys.heartbeat(world, self.position), liveness.beat_value(beat, world))
            except Exception as exc:  # the store is briefly unreachable: peers may count us gone
                log.warning("heartbeat failed: %s: %s", type(exc).__name__, exc)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


def own_client(store: dist.Store) -> dist.Store:
    """A client of `store` no other thread uses; `store` itself where it cannot be cloned (logged)."""
    try:
        return store.clone()
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.warning("the heartbeat shares the store client (%s cannot be cloned: %s): a long store wait of "
                    "another thread delays its beats", type(store).__name__, exc)
        return store


def beat_of(store: dist.Store, world: int, position: int) -> bytes | None:
    """`position`'s beat in `world`; None when there is none, or one that fails authentication
    (`membership.sealed`: as if deleted; its death certificate is never believed)."""
    key = keys.heartbeat(world, position)
    return opened_or_none(store, key)


#: position -> (its heartbeat value, when this process last saw it change; time.monotonic())
BeatsSeen = dict[int, tuple[bytes | None, float]]


def a_member_went_silent(store: dist.Store, world: int, world_size: int, heartbeat_s: float, *, stop_early,
                         seen: BeatsSeen | None = None) -> bool:
    """Watch every position's heartbeat for 2.5 beats: True as soon as one has not moved for that
    long (its process is gone), or its holder is certified dead (`liveness`, from this host), or
    `stop_early()` says so; False when every one moved. What it saw is left in `seen`, so that
    `await_decision` can count a silence from when it began here."""
    start = time.monotonic()
    seen = {} if seen is None else seen
    seen.update({p: (beat_of(store, world, p), start) for p in range(world_size) if p not in seen})
    quiet = 2.5 * heartbeat_s
    while True:
        now = time.monotonic()
        if stop_early() or any(now - t >= quiet or liveness.is_dead(v, world) for v, t in seen.values()):
            return True
        if now - start >= quiet:
            return False
        time.sleep(min(0.05, heartbeat_s / 4))
        now = time.monotonic()
        for p in seen:
            value = beat_of(store, world, p)
            if value != seen[p][0]:
                seen[p] = (value, now)


def post_presence(store: dist.Store, world: int, presence: Presence) -> None:
    try:
        store.set(keys.changing(world), "1")
        store.set(keys.present(world, presence.position), json.dumps(presence.to_json()))
    except Exception as exc:
        raise ControlPlaneError(f"posting presence in world {world} failed: {type(exc).__name__}: {exc}") from exc


def read_decision(store: dist.Store, world: int) -> MembershipDecision | None:
    key = keys.decision(world)
    if not store.check([key]):
        return None
    return MembershipDecision.from_json(json.loads(store.get(key)))


def await_decision(store: dist.Store, world: int, world_size: int, *, grace_s: float, heartbeat_s: float,
                   small_state_at, seen: BeatsSeen | None = None,
                   join_timeout_s: float = pool.JOIN_TIMEOUT_FLOOR_S) -> MembershipDecision:
    """Wait for every position (present or gone) or the grace period, then decide — unless a
    peer decided first, whose value is then this rank's too, or a peer rejected the job (it
    ended: nobody else will come, and the decision is that reject, not a loss of the ranks that
    rejected). `small_state_at(position)` reads the frontiers of its small state in the store.
    `seen`: this process's earlier look at the heartbeats in this world (`a_member_went_silent`),
    so that a silence it already watched for 2.5 beats is not watched for 2.5 more (measured: the
    decision came 1.26 s after the last survivor's presence, as long as the watch itself). The
    spares' beats are watched meanwhile (`pool.SpareWatch`): only one seen alive is offered.
    `join_timeout_s`: the survivors' wait for a spare to join, which its activation carries."""
    deadline = time.monotonic() + grace_s
    dead_after = 2.5 * heartbeat_s
    last_beat: BeatsSeen = dict(seen or {})
    spares = pool.SpareWatch()
    while True:
        decided = read_decision(store, world)
        if decided is not None:
            return decided
        spares.look(store)
        present = [p for p in range(world_size) if store.check([keys.present(world, p)])]
        ended = pool.job_ended(store)
        if ended is not None and ended[0] != 0:  # a peer rejected: no one will come, nothing to wait for
            return _decide(store, world, world_size, present, small_state_at, peer_rejected=ended[1])
        now = time.monotonic()
        here = set(present)
        missing = [p for p in range(world_size) if p not in here]
        for p in missing:
            beat = beat_of(store, world, p)
            if p not in last_beat or last_beat[p][0] != beat:
                last_beat[p] = (beat, now)
        gone = [p for p in missing if now - last_beat[p][1] >= dead_after or liveness.is_dead(last_beat[p][0], world)]
        if len(present) + len(gone) == world_size or now >= deadline:
            return _decide(store, world, world_size, present, small_state_at, spares=spares,
                           join_timeout_s=join_timeout_s)
        time.sleep(0.02)


def _decide(store, world, world_size, present, small_state_at, peer_rejected: str = "",
            spares: pool.SpareWatch | None = None,
            join_timeout_s: float = pool.JOIN_TIMEOUT_FLOOR_S) -> MembershipDecision:
    reports = [Presence.from_json(json.loads(store.get(keys.present(world, p)))) for p in present]
    here = set(present)
    lost = [p for p in range(world_size) if p not in here]
    shrunk = holds(store, keys.shrunk())
    wanted = lost and not shrunk and not peer_rejected  # otherwise no spare is taken: none is judged
    decision = decide_membership(world=world, world_size=world_size, reports=reports,
                                 free_spares=pool.free_spares(store, spares) if wanted else [],
                                 small_state_at={p: small_state_at(p) for p in lost}, peer_rejected=peer_rejected,
                                 spares_withheld=SPARES_AFTER_SHRINK if shrunk else "")
    value = json.dumps(decision.to_json())
    got = store.compare_set(keys.decision(world), "", value)
    got = got.decode() if isinstance(got, bytes) else got
    if got != value:  # a peer decided first: its value is the decision
        return MembershipDecision.from_json(json.loads(got))
    if decision.shrink:
        store.set(keys.shrunk(), str(world + 1))
    if decision.replace or decision.shrink:
        store.add(keys.lost_total(), len(decision.lost))
        # who held each lost position (read before any spare is claimed and writes its own id):
        # the exit-barrier check-in counts their agents (`pool.agents_lost`)
        held = [store.get(keys.holder(p)).decode() if store.check([keys.holder(p)]) else str(p)
                for p in decision.lost]
        store.append(keys.lost_holders(), "".join(f"{h}," for h in held))
        for position, spare in decision.assign.items():
            activation = pool.Activation(spare=spare, world=world + 1, position=position, world_size=world_size,
                                         join_timeout_s=join_timeout_s)
            if not pool.claim(store, activation):  # only the register's winner claims: cannot happen
                raise ControlPlaneError(f"spare {spare} was claimed twice")
    log.warning("membership of world %d: %s", world, decision.outcome,
                extra={"lost": decision.lost, "assign": decision.assign, "reasons": decision.reasons})
    return decision


def post_vote(store: dist.Store, world: int, position: int, ok: bool, reason: str) -> None:
    store.set(keys.vote(world, position), json.dumps({"ok": ok, "reason": reason}))


def release(store: dist.Store, world: int, world_size: int, timeout_s: float) -> tuple[str, list[str]]:
    """Every member of the new world waits for every vote (or the timeout); the first to finish
    writes the one release value by compare-and-set; all follow it."""
    vote_keys = [keys.vote(world, p) for p in range(world_size)]
    reasons: list[str] = []
    try:
        store.wait(vote_keys, datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # a missing vote is a reason to reject, not an error here
        reasons.append(f"votes incomplete after {timeout_s:.1f}s: {type(exc).__name__}: {exc}")
    for p, key in enumerate(vote_keys):
        if not store.check([key]):
            reasons.append(f"rank {p} did not vote")
            continue
        vote = json.loads(store.get(key))
        if not vote["ok"]:
            reasons.append(f"rank {p}: {vote['reason']}")
    value = json.dumps({"outcome": "reject" if reasons else "resume", "reasons": reasons})
    got = store.compare_set(keys.release(world), "", value)
    decided = json.loads(got.decode() if isinstance(got, bytes) else got)
    return decided["outcome"], list(decided["reasons"])
