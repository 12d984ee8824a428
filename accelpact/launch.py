"""Restart-safe process-group initialisation under torchrun.

torchrun's agent hosts one TCP store for the whole job and restarted workers connect to the same
store with the same keys. A restarted gloo worker can then read a peer's address written by the
*previous* attempt before the peer overwrites it, and fail with "Gloo connectFullMesh failed ...
Connection refused" (seen here on the first restart of a 4-rank job). `init_process_group`
scopes every key of the new attempt under its own prefix, so no attempt can read another's.

The attempt number comes from the job's store, not from TORCHELASTIC_RESTART_COUNT: each node's
agent counts restarts on its own, and after a cut a node may restart its workers because another
node re-rendezvoused without counting it. Every worker adds 1 to a counter at start; all workers
of one attempt start before any worker of the next, so attempt = (count - 1) // world size.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch.distributed as dist

from .comm.backends import parse_backends, uses_nccl
from .comm.nccl_env import apply_required

log = logging.getLogger("accelpact.launch")

_attempt: int | None = None


def current_attempt() -> int:
    """This job attempt's number (0 first): from the store when `init_process_group` ran under
    torchrun, else torchrun's own restart count, else 0."""
    if _attempt is not None:
        return _attempt
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def init_process_group(backend: str = "gloo", *, timeout: datetime.timedelta | None = None, **kwargs) -> None:
    """Drop-in for `torch.distributed.init_process_group` that is safe across torchrun restarts.

    With an NCCL backend it first sets the NCCL environment a recovery needs
    (`comm.nccl_env.REQUIRED`: ProcessGroupNCCL reads it when communicators are created, so it
    must be in place before this call), logging every value it changes."""
    global _attempt
    env = os.environ
    if uses_nccl(parse_backends(backend)):
        for change in apply_required(env):
            log.warning("accelpact set %s", change)
    if "TORCHELASTIC_RESTART_COUNT" not in env or "store" in kwargs or "init_method" in kwargs:
        dist.init_process_group(backend, timeout=timeout, **kwargs)
        return
    rank = int(env["RANK"])
    world_size = int(env["WORLD_SIZE"])
    store_timeout = timeout or datetime.timedelta(minutes=5)
    client = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, is_master=False, timeout=store_timeout,
        use_libuv=True,
    )
    run = env.get("TORCHELASTIC_RUN_ID", "run")
    starts = client.add(f"accelpact/{run}/worker-starts", 1)
    _attempt = (starts - 1) // world_size
    store = dist.PrefixStore(f"accelpact/{run}/attempt{_attempt}/", client)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
