"""Neighbour-memory replication wired into a runtime (`Config.replicate="neighbour"`).

The rules are `membership.neighbour`, the sockets and threads `membership.replication`; this
module only connects them to the runtime: it starts the replicator under spares, offers the
shard state after every optimizer step (a post-hook on the optimizer), makes every restore wait
until the sender has read the tensors, and gives a survivor's presence its verified copies."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..membership import neighbour, transfer
from ..membership.replication import NeighbourReplicator

if TYPE_CHECKING:
    from ..config import Config
    from ..launch import Membership
    from .data_plane import DataPlane
    from .runtime import Runtime


def start(rt: Runtime, m: Membership, plane: DataPlane, config: Config) -> None:
    """Under spares with `replicate="neighbour"`: listen for the predecessor's copies, and send
    this rank's own after each step unless a replica peer holds its shard already."""
    if config.replicate != "neighbour":
        return
    local = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        stride = neighbour.ring_stride(m.world_size, configured=config.replicate_stride,
                                       local_world_size=int(local) if local else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    replicate = plane.gids.get("replicate")
    sends = replicate is None or len(replicate.ranks) <= 1
    rt.neighbours = NeighbourReplicator(
        store=m.store, position=rt.rank, world_size=m.world_size, stride=stride, sends=sends,
        sealer=lambda: rt.control.sealer, world=lambda: rt.membership.world,
        timeout_s=float(config.control_timeout_s), store_host=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        epoch=lambda: rt._recoveries)
    rt.listeners.insert(0, rt.neighbours)  # the optimizer-phase wait comes before any other listener
    rt.neighbours.hook = rt.optimizer.register_step_post_hook(lambda *_: offer(rt))


def offer(rt: Runtime) -> None:
    """After update F+1's optimizer step: its state goes to the neighbour, labelled F+1. Not after
    a step outside an update (found by review: a checkpoint save of a stateless optimizer steps it,
    DCP's `_init_optim_state`, and the re-offer of F evicted the complete copy of F on arrival)."""
    if not rt.neighbours.sends or rt._tracker.phase is None:
        return
    moved = transfer.entries(rt.model, rt.optimizer)  # here: a forward swaps FSDP2's module parameters
    # buffers are written by the next forward (BatchNorm's running stats), which the sender may
    # still be packing through: they go as copies, taken here (they are small). Parameters and
    # optimizer state change only at the next step, which waits for the pack (found by review:
    # a copy could carry buffers one forward ahead, half updated, and still verify)
    moved = [(name, t.clone() if name.startswith("buffer:") else t) for name, t in moved]
    rt.neighbours.offer(rt.update_index, moved, lambda: transfer.manifest(rt.model, rt.optimizer, moved))


def forget_undone(rt: Runtime, frontier: int) -> None:
    """A membership change resumed at `frontier`: copies labelled after it came from updates the
    new world re-runs."""
    if rt.neighbours is not None:
        rt.neighbours.forget_from(frontier + 1)


def hold_still(rt: Runtime) -> None:
    """Before a restore writes the tensors: wait until the sender has read what it was offered."""
    if rt.neighbours is not None:
        rt.neighbours.wait_packed(drop_untaken=True)  # a membership change: no wait for the network


def audit(rt: Runtime) -> tuple[tuple[tuple[int, int], ...], tuple[str, ...]]:
    """The neighbour copies this survivor holds that verify, and the ones that do not."""
    if rt.neighbours is None:
        return (), ()
    return rt.neighbours.held.audit()


def stop(rt: Runtime) -> None:
    if rt.neighbours is not None:
        rt.neighbours.hook.remove()
        rt.neighbours.stop()
