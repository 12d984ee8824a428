"""The spares' side of the store: a spare registers, heartbeats, and waits until it is claimed
for a lost position (or the job ends); the deciding survivor claims spares by compare-and-set,
so no spare can be given two positions and no position two spares.

A spare costs one store write per heartbeat and nothing else: it holds no group, no model, no
memory on the device until it is claimed."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import torch.distributed as dist

from ..errors import ControlPlaneError, SpareReleased
from . import keys, liveness
from .sealed import holds, opened_or_none, unsealed

log = logging.getLogger("accelpact.membership")

#: How often a waiting spare beats.
SPARE_BEAT_S = 0.25
#: A spare whose beat the decider saw stand still this long is gone (8 beats: a spare's loop
#: may be slowed by the imports it warms up in the background).
SPARE_QUIET_S = 2.0
#: The world a waiting spare beats in (`liveness.beat_value`): none yet.
SPARE_WORLD = -1
#: How long the survivors wait for a spare to join (`runtime.member_change.join_timeout_s`) at
#: least; an activation carries the survivors' own bound.
JOIN_TIMEOUT_FLOOR_S = 60.0


@dataclass(frozen=True)
class Activation:
    """What a claimed spare learns: the world it joins and the position it takes over."""

    spare: int
    world: int
    position: int
    world_size: int
    #: how long the survivors wait for this spare to join: its own wait for them is no longer
    join_timeout_s: float = JOIN_TIMEOUT_FLOOR_S

    def to_json(self) -> str:
        return json.dumps({"spare": self.spare, "world": self.world, "position": self.position,
                           "world_size": self.world_size, "join_timeout_s": self.join_timeout_s})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Activation:
        d = json.loads(raw)
        return cls(int(d["spare"]), int(d["world"]), int(d["position"]), int(d["world_size"]),
                   float(d.get("join_timeout_s", JOIN_TIMEOUT_FLOOR_S)))


def register(store: dist.Store, spare: int) -> None:
    store.set(keys.spare_alive(spare), liveness.beat_value(0, SPARE_WORLD))
    store.append(keys.spares_registered(), f"{spare},")


def wait_for_claim(store: dist.Store, spare: int, *, heartbeat_s: float = SPARE_BEAT_S,
                   poll_s: float = 0.05) -> Activation:
    """Block (cheaply) until this spare is claimed; SpareReleased when the job ends first. Each
    beat is a new value, which the decider must see change (`SpareWatch`): no clock is compared
    across hosts."""
    last_beat, beat = 0.0, 0
    while True:
        now = time.monotonic()
        if now - last_beat >= heartbeat_s:
            beat += 1
            store.set(keys.spare_alive(spare), liveness.beat_value(beat, SPARE_WORLD))
            last_beat = now
        raw = opened_or_none(store, keys.spare_claim(spare))  # a forged claim: not claimed, keep waiting
        if raw:
            return Activation.from_json(raw)
        ended = job_ended(store)
        if ended is not None:
            raise SpareReleased(*ended)
        time.sleep(poll_s)


def job_ended(store: dist.Store) -> tuple[int, str] | None:
    """(code, why) once the job is over (`end_job`: 0 finished, 75 rejected); None while it runs."""
    if not store.check([keys.job_end()]):
        return None
    end = json.loads(store.get(keys.job_end()))
    return int(end.get("code", 0)), str(end.get("why", ""))


def registered(store: dist.Store) -> list[int]:
    return sorted(_listed(store, keys.spares_registered()))


def _listed(store: dist.Store, key: str) -> set[int]:
    """The ids appended "r," under `key`. Appended, so never sealed (`membership.sealed`): read
    from the store underneath. A forged entry names a spare that never beats (not offered) or
    miscounts the exit barrier."""
    raw_store = unsealed(store)
    if not raw_store.check([key]):
        return set()
    entries = raw_store.get(key).decode(errors="replace").split(",")
    return {int(entry) for entry in entries if entry.strip().isdigit()}


def spare_state(certified_dead: bool | None, first_seen: float, moved_at: float | None, now: float,
                quiet_s: float = SPARE_QUIET_S) -> str:
    """"alive", "gone" or "watching" (not known yet), judged on the decider's own monotonic clock:
    a death certificate from this host (`liveness.is_dead` True) decides "gone" at once; else a
    spare is alive once its beat moved while watched, within `quiet_s`, and gone once the beat
    stood still that long. A spare's wall clock is never compared with ours. "Running" on this
    host proves nothing more: a stopped (SIGSTOP), stuck or deadlocked spare runs too, and once
    claimed it would hold the survivors for their whole join bound."""
    if certified_dead:
        return "gone"
    last = first_seen if moved_at is None else moved_at
    if now - last >= quiet_s:
        return "gone"
    return "watching" if moved_at is None else "alive"


class SpareWatch:
    """The decider's look at the unclaimed spares' beats: spare -> (beat value, when first seen,
    when last seen to move), on this process's monotonic clock."""

    def __init__(self, *, quiet_s: float = SPARE_QUIET_S, every_s: float = 0.1):
        self.quiet_s, self.every_s = quiet_s, every_s
        self.seen: dict[int, tuple[bytes | None, float, float | None]] = {}
        self._looked = float("-inf")

    def look(self, store: dist.Store, *, force: bool = False) -> list[int]:
        """Read every unclaimed spare's beat (at most once per `every_s`, unless `force`);
        returns the spares read (none when it did not look)."""
        now = time.monotonic()
        if not force and now - self._looked < self.every_s:
            return []
        self._looked = now
        spares = unclaimed(store)
        for spare in spares:
            value = _beat(store, spare)
            before = self.seen.get(spare)
            if before is None:
                self.seen[spare] = (value, now, None)
            elif value != before[0]:
                self.seen[spare] = (value, before[1], now)
        return spares

    def states(self, spares: list[int]) -> dict[int, str]:
        """spare -> `spare_state`, for `spares` (each seen by `look`)."""
        now = time.monotonic()
        return {spare: spare_state(liveness.is_dead(self.seen[spare][0], SPARE_WORLD), *self.seen[spare][1:], now,
                                   self.quiet_s) for spare in spares}

    def settle(self, store: dist.Store, *, poll_s: float = 0.05) -> list[int]:
        """Watch until no spare is in doubt (at most `quiet_s` from when each was first seen):
        the live unclaimed ones, in id order."""
        while True:
            states = self.states(self.look(store, force=True))
            if "watching" not in states.values():
                return sorted(s for s, state in states.items() if state == "alive")
            time.sleep(poll_s)


def _beat(store: dist.Store, spare: int) -> bytes | None:
    """The spare's beat, or None: none yet, or one that fails authentication (`membership.sealed`:
    a spare without the job's secret, or a forgery). Such a spare is never seen to move, so it is
    not offered; the change goes on with the others."""
    key = keys.spare_alive(spare)
    return opened_or_none(store, key)


def unclaimed(store: dist.Store) -> list[int]:
    """Spares registered and not claimed, in id order (alive or not)."""
    return [spare for spare in registered(store) if not holds(store, keys.spare_claim(spare))]


def free_spares(store: dist.Store, watch: SpareWatch | None = None) -> list[int]:
    """Spares registered, alive and not claimed, in id order. `watch`: what the decider saw of
    their beats while it waited (a fresh watch otherwise: then a spare on another host costs up
    to `SPARE_QUIET_S` to judge)."""
    return (watch or SpareWatch()).settle(store)


def claim(store: dist.Store, activation: Activation) -> bool:
    """Give `activation.spare` its position; False when another decider claimed it first."""
    value = activation.to_json()
    got = store.compare_set(keys.spare_claim(activation.spare), "", value)
    return (got.decode() if isinstance(got, bytes) else got) == value


def end_job(store: dist.Store, code: int, why: str) -> None:
    """Release every spare still waiting: the job is over (code 0) or rejected (code 75)."""
    try:
        store.compare_set(keys.job_end(), "", json.dumps({"code": code, "why": why}))
    except Exception as exc:  # the store host may be gone at the very end; spares then time out
        raise ControlPlaneError(f"could not release the spares: {type(exc).__name__}: {exc}") from exc


def position_done(store: dist.Store, world_size: int) -> bool:
    """This position's holder has finished; the last one ends the job for the spares (True)."""
    if store.add(keys.positions_done(), 1) >= world_size:
        end_job(store, 0, "every position finished")
        return True
    return False


def agents_lost(store: dist.Store) -> int:
    """torchrun agents that will never reach the exit barrier: the agents of the processes
    declared lost that did not exit by themselves (dead, not fenced), each agent once — under
    one agent per node a lost node is one agent for all of its ranks. (A fenced process exits 0;
    its agent arrives unless another of its workers died, which then counts it here.)"""
    dead = _listed(store, keys.lost_holders()) - _listed(store, keys.fenced_holders())
    agents = set()
    for rank in dead:
        key = keys.agent_of(rank)
        agents.add(store.get(key).decode() if store.check([key]) else f"launch rank {rank}")
    return len(agents)
