"""What a model is and where it runs: the profile and platform of the recovery envelope's key.

Detection reads the wrapper types and the groups' backends; it decides nothing (an unknown
model is refused by name, so attach never guesses)."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..comm.backends import backends_of
from ..errors import ConfigError, UnsupportedModelError


def detect_profile(model: nn.Module) -> str:
    """fsdp1-hsdp, fsdp2-hsdp or ddp, from the wrappers inside `model`. A fully sharded FSDP1 or
    FSDP2 job gets its framework's HSDP profile: `accelpact qualify` probes HSDP only (README)."""
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
        "(FullyShardedDataParallel), FSDP2 (fully_shard) or DDP"
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


#: The platforms detection names (and envelopes are qualified on); anything else is a mix of backends.
KNOWN_PLATFORMS = ("cpu-gloo", "cuda-nccl")


def envelope_profile(model: nn.Module, override: str | None) -> str:
    """The profile of the envelope's key. An override (`Config.profile`, ACCELPACT_PROFILE) counts
    only where detection cannot tell (a wrapper it does not know): one that differs from what it
    found would have a recovery obey rows probed on another framework (DDP given FSDP2's Rewind)."""
    try:
        detected = detect_profile(model)
    except UnsupportedModelError:
        if override:
            return override
        raise
    if override and override != detected:
        raise ConfigError(f"Config.profile (ACCELPACT_PROFILE) is {override!r}, but the model is {detected!r}: the "
                          "envelope's rows of one framework do not qualify recoveries of another; unset it")
    return detected


def envelope_platform(groups: dict[str, dist.ProcessGroup], override: str | None) -> str:
    """The platform of the envelope's key. An override (`Config.platform`, ACCELPACT_PLATFORM)
    counts only where detection finds a mix of backends no envelope names: one that differs from a
    platform it found would have gloo's measured rows decide NCCL recoveries."""
    detected = detect_platform(groups)
    if override and override != detected and detected in KNOWN_PLATFORMS:
        raise ConfigError(f"Config.platform (ACCELPACT_PLATFORM) is {override!r}, but the data plane runs on "
                          f"{detected!r}: an envelope qualified on one platform does not qualify another; unset it")
    return override or detected
