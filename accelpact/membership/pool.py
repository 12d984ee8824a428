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
from . import keys

log = logging.getLogger("accelpact.membership")

#: A spare whose heartbeat is older than this is not offered (its process is gone).
STALE_S = 5.0


@dataclass(frozen=True)
class Activation:
    """What a claimed spare learns: the world it joins and the position it takes over."""

    spare: int
    world: int
    position: int
    world_size: int

    def to_json(self) -> str:
        return json.dumps({"spare": self.spare, "world": self.world, "position": self.position,
                           "world_size": self.world_size})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Activation:
        d = json.loads(raw)
        return cls(int(d["spare"]), int(d["world"]), int(d["position"]), int(d["world_size"]))


def register(store: dist.Store, spare: int) -> None:
    store.set(keys.spare_alive(spare), repr(time.time()))
    store.append(keys.spares_registered(), f"{spare},")


def wait_for_claim(store: dist.Store, spare: int, *, heartbeat_s: float = 1.0, poll_s: float = 0.05) -> Activation:
    """Block (cheaply) until this spare is claimed; SpareReleased when the job ends first."""
    last_beat = 0.0
    while True:
        now = time.monotonic()
        if now - last_beat >= heartbeat_s:
            store.set(keys.spare_alive(spare), repr(time.time()))
            last_beat = now
        if store.check([keys.spare_claim(spare)]):
            raw = store.get(keys.spare_claim(spare))
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
    if not store.check([keys.spares_registered()]):
        return []
    raw = store.get(keys.spares_registered()).decode()
    return sorted({int(s) for s in raw.split(",") if s})


def free_spares(store: dist.Store, *, now: float | None = None) -> list[int]:
    """Spares registered, heartbeating and not claimed, in id order."""
    now = time.time() if now is None else now
    out = []
    for spare in registered(store):
        if store.check([keys.spare_claim(spare)]):
            continue
        try:
            beat = float(store.get(keys.spare_alive(spare)))
        except (RuntimeError, ValueError):
            continue
        if now - beat <= STALE_S:
            out.append(spare)
    return out


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


def _launch_ranks(store: dist.Store, key: str) -> set[int]:
    if not store.check([key]):
        return set()
    raw = store.get(key).decode()
    return {int(r) for r in raw.split(",") if r}


def agents_lost(store: dist.Store) -> int:
    """torchrun agents that will never reach the exit barrier: the agents of the processes
    declared lost that did not exit by themselves (dead, not fenced), each agent once — under
    one agent per node a lost node is one agent for all of its ranks. (A fenced process exits 0;
    its agent arrives unless another of its workers died, which then counts it here.)"""
    dead = _launch_ranks(store, keys.lost_holders()) - _launch_ranks(store, keys.fenced_holders())
    agents = set()
    for rank in dead:
        key = keys.agent_of(rank)
        agents.add(store.get(key).decode() if store.check([key]) else f"launch rank {rank}")
    return len(agents)
