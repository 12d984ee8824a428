"""What a model is and where it runs: the profile and platform of the recovery envelope's key.

Detection reads the wrapper types and the groups' backends; it decides nothing (an unknown
model is refused by name, so attach never guesses)."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..comm.backends import backends_of
from ..errors import UnsupportedModelError


def detect_profile(model: nn.Module) -> str:
    """fsdp1-hsdp, fsdp2-hsdp or ddp, from the wrappers inside `model`."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    from torch.nn.parallel import DistributedDataParallel as DDP

    if isinstance(model, DDP):
        return "ddp"
    if any(isinstance(m, FSDP) for m in model.modules()):
        return "fsdp1-hsdp"
    if any(_get_module_fsdp_state(m) is not None for m in model.modules()):
        return "fsdp2-hsdp"
    raise UnsupportedModelError(
        f"unknown model type {type(model).__name__}: AccelPact protects models wrapped with FSDP1 "
        "(FullyShardedDataParallel, HYBRID_SHARD), FSDP2 (fully_shard on a 2-D DeviceMesh) or DDP"
    )


def detect_platform(groups: dict[str, dist.ProcessGroup]) -> str:
    """cpu-gloo when gloo serves every group everywhere; cuda-nccl when NCCL carries every group's
    GPU traffic (a "cpu:gloo,cuda:nccl" group, as a default group for DCP often is, counts: the
    model's collectives run on NCCL); else the backends joined by '+' (a key no envelope has)."""
    maps = {label: backends_of(pg) or {"?": str(dist.get_backend(pg))} for label, pg in groups.items()}
    if all(set(m.values()) == {"gloo"} for m in maps.values()):
        return "cpu-gloo"
    if all(m.get("cuda") == "nccl" for m in maps.values()):
        return "cuda-nccl"
    return "+".join(sorted({",".join(f"{d}:{b}" for d, b in m.items()) for m in maps.values()}))
