"""Neighbour-memory replication, the rules: who holds whose copy, which copies may be used.

A fully sharded job (FSDP2 `fully_shard` over one mesh dimension, FSDP1 FULL_SHARD) keeps each
shard once: lose its rank and no replica peer can send it to a spare. So every rank sends its
shard state to a ring neighbour's host memory after each optimizer step (DEADPOOL, seed 002); a
spare taking over a lost rank receives it from there. This module is pure: the ring, and the
holdings a receiver keeps (double-buffered: a copy counts only once every byte has arrived, and
the newest complete copies are never overwritten by a partial one). The sockets and threads are
`replication.py`; the decision that uses a copy is `decide.py`.

Why two complete copies per source: a copy is labelled with the update whose optimizer step
produced it (F+1) before that update commits. If its boundary then rewinds, the agreed frontier
stays F, and the copy of F must still be there."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field

#: Complete copies kept per source rank (the newest, and the one before it).
KEEP = 2


def ring_stride(world_size: int, *, configured: int, local_world_size: int | None) -> int:
    """The ring's stride: `configured` if set, else one host's ranks when the world spans several
    hosts (a copy off its rank's node survives the node's loss), else 1."""
    if configured:
        stride = configured
    elif local_world_size and 0 < local_world_size < world_size:
        stride = local_world_size
    else:
        stride = 1
    if world_size > 1 and stride % world_size == 0:
        raise ValueError(f"replicate_stride {stride} maps every rank of a world of {world_size} onto itself")
    return stride


def holder_of(position: int, world_size: int, stride: int) -> int:
    """The rank whose host memory keeps `position`'s copy."""
    return (position + stride) % world_size


def source_of(holder: int, world_size: int, stride: int) -> int:
    """The rank whose copy `holder` keeps."""
    return (holder - stride) % world_size


@dataclass(frozen=True)
class NeighbourCopy:
    """One complete copy of `source`'s shard state after the optimizer step of update `frontier`."""

    source: int
    frontier: int
    digest: str  # SHA-256 the source computed over exactly these bytes
    layout: dict  # the source's `transfer.manifest`: what a spare materialises before receiving
    data: bytearray = field(repr=False)
    seq: int = 0  # the sender's number for the frame: of two copies of one label, the later one counts

    def verifies(self) -> bool:
        return hashlib.sha256(self.data).hexdigest() == self.digest


class HeldCopies:
    """The copies this rank keeps for its ring predecessor(s): only complete ones are visible."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[int, dict[int, NeighbourCopy]] = {}

    def begin(self, source: int, frontier: int) -> list[NeighbourCopy]:
        """A copy of `source` at `frontier` starts arriving: a held copy with the same or a later
        label came from an update that was undone since (a Rewind), and goes now, so that a
        re-sent copy that never completes leaves no copy of that label rather than the old one.
        Returns what went (its memory may be reused)."""
        with self._lock:
            held = self._copies.get(source, {})
            return [held.pop(label) for label in [f for f in held if f >= frontier]]

    def complete(self, copy: NeighbourCopy) -> list[NeighbourCopy]:
        """Every byte of `copy` arrived: it becomes visible; the oldest beyond `KEEP` goes (and is
        returned: its memory may be reused)."""
        with self._lock:
            held = self._copies.setdefault(copy.source, {})
            earlier = held.get(copy.frontier)
            if earlier is not None and earlier.seq > copy.seq:  # a later frame of this label finished first
                return [copy]
            held[copy.frontier] = copy
            return [held.pop(old) for old in sorted(held)[:-KEEP]]

    def drop_from(self, frontier: int) -> list[NeighbourCopy]:
        """Every copy labelled `frontier` or later, of every source: the updates that produced them
        were undone (a Rewind, or a membership change that re-runs them), and a copy of an undone
        update verifies against its own digest all the same. Returns what went."""
        with self._lock:
            return [held.pop(label) for held in self._copies.values() for label in [f for f in held if f >= frontier]]

    def get(self, source: int, frontier: int) -> NeighbourCopy | None:
        with self._lock:
            return self._copies.get(source, {}).get(frontier)

    def frontiers(self, source: int) -> list[int]:
        with self._lock:
            return sorted(self._copies.get(source, {}))

    def sources(self) -> list[int]:
        with self._lock:
            return sorted(self._copies)

    def audit(self) -> tuple[tuple[tuple[int, int], ...], tuple[str, ...]]:
        """(source, frontier) of every copy whose bytes still verify, and a reason per one that
        does not (host-memory corruption): a survivor reports these, the decision uses only the
        first."""
        with self._lock:
            held = [c for by_frontier in self._copies.values() for c in by_frontier.values()]
        good, bad = [], []
        for c in sorted(held, key=lambda c: (c.source, c.frontier)):
            if c.verifies():
                good.append((c.source, c.frontier))
            else:
                bad.append(f"the copy of rank {c.source} at F={c.frontier} no longer matches its digest "
                           f"{c.digest[:12]}")
        return tuple(good), tuple(bad)
