"""Attach refuses to start when ranks were given different settings that every rank must share.

Why: each rank reads its Config from its own environment (`ACCELPACT_*`) and its envelope from
its own file system. Settings that decide which collectives a rank posts or which action the
protocol picks are evaluated on every rank alike, on the assumption that they are alike: a rank
with `boundary=sync` probes its data-plane groups while a `deferred` peer is already in its next
forward; a rank whose standby mode is `off` leaves its peers waiting for its standby connections;
a rank whose envelope file was stale rewinds where its peers reject. None of that fails at once:
it hangs for a timeout, or recovers wrongly, much later. So attach compares them once, over the
control plane, and every rank raises `ConfigError` naming what differs, before the first update.

`shared_settings` (what is compared) and `differences` (what differs, in words) are pure; only
`check_same_settings` touches the control plane (a broadcast of rank 0's settings and one MAX
all-reduce, so every rank learns that some rank differs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..config import Config
from ..errors import ConfigError, ControlPlaneError
from ..fsm.decisions import EnvelopeFacts

#: Room for rank 0's settings in the broadcast (they take ~600 bytes).
SETTINGS_BYTES = 4096
#: What rank 0 sends instead of settings that do not fit (every rank then refuses alike).
TOO_LARGE = "accelpact_settings_too_large"

#: Config fields every rank must share: each decides a collective a rank posts, a timeout its
#: peers' wait is matched to, or an input of a decision every rank takes alike.
SHARED_FIELDS = (
    "data_timeout_s", "control_timeout_s", "rebind", "health_check", "boundary", "checkpoint_every",
    "step_copy", "max_rewinds_per_update", "spares", "heartbeat_s", "straggler_factor", "straggler_window",
    "digest_every", "replicate", "replicate_stride", "on_loss", "standby_groups",
    # the checkpoint's collectives and verdicts (found by review: a rank that tolerated one failed
    # save fewer fail-stopped alone, which under spares reads as a lost member; a rank with a lower
    # restart budget exited 76 while rank 0, the only one that stops the agent, went on)
    "restore", "checkpoint_failures_tolerated", "max_restarts",
)


def shared_settings(config: Config, envelope: EnvelopeFacts, *, profile: str, platform: str,
                    has_data_cursor: bool, rewind_refused: bool = False) -> dict[str, Any]:
    """What this rank must share with every other: the settled Config's shared fields, what the
    envelope it attached under allows, whether it was given a data cursor, and whether it can
    rewind at all (a DDP comm hook of its own: every deferred boundary depends on it). JSON-ready."""
    out: dict[str, Any] = {name: getattr(config, name) for name in SHARED_FIELDS}
    out.update({"envelope": envelope.describe(), "envelope replace phases": [str(p) for p in envelope.replace_phases],
                "profile": profile, "platform": platform, "data_state given": has_data_cursor,
                "rewind refused": rewind_refused,
                # the directory's path may differ between hosts (its mount); whether there is one may not
                "checkpoint_dir given": config.checkpoint_dir is not None,
                "checkpoint_key": _fingerprint(config.checkpoint_key)})
    return json.loads(json.dumps(out, sort_keys=True, default=str))  # as the peers will read it back


def _fingerprint(secret: str | None) -> str | None:
    """A secret's fingerprint, never the secret: equal on ranks given the same one (a rank with
    another checkpoint key would refuse every peer's signed checkpoint, and they its)."""
    if secret is None:
        return None
    return hashlib.sha256(b"accelpact-checkpoint-key\0" + secret.encode()).hexdigest()[:16]


def differences(mine: Mapping[str, Any], rank0: Mapping[str, Any]) -> list[str]:
    """Each setting this rank holds differently from rank 0, as "name: <mine> here, <rank 0's> on
    rank 0" (a setting only one side has counts as different)."""
    missing = object()
    out = []
    for name in sorted(set(mine) | set(rank0)):
        here, there = mine.get(name, missing), rank0.get(name, missing)
        if here != there:
            out.append(f"{name}: {'(none)' if here is missing else repr(here)} here, "
                       f"{'(none)' if there is missing else repr(there)} on rank 0")
    return out


def check_same_settings(group: Any, rank: int, settings: Mapping[str, Any]) -> None:
    """Compare `settings` with rank 0's over the control-plane `group` (collective: every rank of
    it calls this at the same point). Raises ConfigError on every rank when any rank differs; on
    a differing rank it names each setting with both values."""
    encoded = json.dumps(settings, sort_keys=True).encode()
    if len(encoded) > SETTINGS_BYTES:  # never raise before the collective: every rank learns it from rank 0
        encoded = json.dumps({TOO_LARGE: len(encoded)}).encode()
    buf = torch.zeros(SETTINGS_BYTES, dtype=torch.uint8)
    if rank == 0:
        buf[: len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    try:
        dist.broadcast(buf, src=0, group=group)
        theirs = json.loads(bytes(buf.numpy()).rstrip(b"\0").decode())
    except (RuntimeError, ValueError) as exc:  # gloo's DistError kinds; rank 0's bytes unreadable
        raise ControlPlaneError(f"comparing settings across ranks at attach failed: {type(exc).__name__}: "
                                f"{exc}") from exc
    if TOO_LARGE in theirs:  # every rank alike, after the one collective: nobody waits
        raise ConfigError(f"rank 0's settings take {theirs[TOO_LARGE]} bytes, more than the {SETTINGS_BYTES} "
                          "attach compares")
    mine_differs = differences(settings, theirs)
    flag = torch.tensor([1 if mine_differs else 0], dtype=torch.int64)
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    except RuntimeError as exc:  # gloo's DistError kinds
        raise ControlPlaneError(f"comparing settings across ranks at attach failed: {type(exc).__name__}: "
                                f"{exc}") from exc
    if mine_differs:
        raise ConfigError(f"rank {rank} was given settings that differ from rank 0's, which every rank must "
                          f"share (check ACCELPACT_* in each rank's environment and the envelope file each "
                          f"reads): {'; '.join(mine_differs)}")
    if int(flag.item()):
        raise ConfigError("another rank was given settings that differ from rank 0's, which every rank must "
                          "share; that rank's error names them")
