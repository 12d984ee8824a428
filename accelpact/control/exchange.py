"""How every rank gets every rank's fixed-size control-plane message (the agreement's reports).

Why not c10d's all-gather: gloo gathers along a ring, n-1 rounds one after the other, and every
round waits until the next rank in the ring is scheduled. With the ranks of a recovery all waking
at once (4 ranks on 2 cores here; on a real job, ranks whose CPUs are busy with the data loader)
each round costs a wake-up: measured here (8 KiB slots, median of 40): 2 ranks 0.64 → 0.38 ms,
4 ranks 3.5 → 3.0 ms, 8 ranks 9.9 → 3.9 ms for the ring → one round of direct sends; inside real
repairs, 8 ranks 36.4 → 29.9 ms (`bench/repair.py --ablate-exchange` prints both side by side).
The agreement sits on every repair's path, and a repair should not grow with the world.

Direct sends post 2(n-1) point-to-point operations from Python (~10 µs each), and every rank
receives n-1 messages at once (an incast of (n-1) × 8 KiB). Both grow with n, so above
`DIRECT_MAX_WORLD` ranks the ring is used again: by then its rounds cost what the posts do, and
a switch's buffers need not absorb the incast.

Point-to-point waits must be given their timeout: gloo's own default is the timeout the group
was built with (measured: 30 s after `set_group_timeout` had set 1 s), not the group's current
one. Send/receive tags live apart from collectives' slots in gloo, so they never pair with one.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from ..errors import ControlPlaneError

#: Largest world whose messages are exchanged by direct sends (see the module docstring).
DIRECT_MAX_WORLD = 64
#: gloo takes a tag as an unsigned 32-bit slot; keep it positive for c10d's int argument.
_TAG_MASK = 0x7FFFFFFF


class ExchangeTimeout(ControlPlaneError):
    """A message did not arrive within the exchange's timeout."""


def exchange(group: dist.ProcessGroup, mine: torch.Tensor, *, rank: int, world_size: int, tag: int,
             timeout: datetime.timedelta) -> list[torch.Tensor]:
    """Every rank's `mine` (same shape and dtype on every rank), in rank order. Every rank of
    `group` must call it with the same `tag` (the control plane's sequence number). Raises what
    gloo raises when a peer fails, `ExchangeTimeout` when `timeout` passes."""
    if world_size > DIRECT_MAX_WORLD:
        return ring_exchange(group, mine, rank=rank, world_size=world_size, tag=tag, timeout=timeout)
    return direct_exchange(group, mine, rank=rank, world_size=world_size, tag=tag, timeout=timeout)


def direct_exchange(group: dist.ProcessGroup, mine: torch.Tensor, *, rank: int, world_size: int, tag: int,
                    timeout: datetime.timedelta) -> list[torch.Tensor]:
    """One round: every rank sends `mine` to every peer and receives theirs."""
    out = [mine if peer == rank else torch.empty_like(mine) for peer in range(world_size)]
    tag &= _TAG_MASK
    peers = [peer for peer in range(world_size) if peer != rank]
    # receives first, so that no peer's message waits for its buffer
    works = [(peer, group.recv([out[peer]], peer, tag)) for peer in peers]
    works += [(peer, group.send([mine], peer, tag)) for peer in peers]
    deadline = time.monotonic() + timeout.total_seconds()
    for peer, work in works:
        left = deadline - time.monotonic()
        if left <= 0 and not work.is_completed():
            raise ExchangeTimeout(f"no exchange with rank {peer} within {timeout.total_seconds():.1f}s (tag {tag})")
        work.wait(datetime.timedelta(seconds=max(left, 0.001)))
    return out


def ring_exchange(group: dist.ProcessGroup, mine: torch.Tensor, *, rank: int, world_size: int, tag: int,
                  timeout: datetime.timedelta) -> list[torch.Tensor]:
    """c10d's all-gather (gloo's ring); the group's own timeout bounds it. `rank`, `tag` and
    `timeout` are there for the same signature (the control plane sets the group's timeout)."""
    del rank, tag, timeout
    out = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(out, mine, group=group)
    return out
