"""Timeouts measured at attach (`Config` "auto"): warm-up collectives on every data-plane group and
on the control plane, gathered from every rank, derived (`accelpact.timeouts`, pure) and applied.

Why warm-ups at attach rather than timing the first N real updates: the derived timeouts are in
force from the first collective of the first update; every rank agrees on them before training
starts (one gather, where a mid-run switch would need an agreement point of its own and leave the
first N updates under the hand-picked bound); and every group a recovery rebuilds gets the same
value. The warm-ups are sized like the largest collective an update moves (the rank's local
parameters, capped at DDP's 25 MiB bucket). What they cannot see, the skew between ranks inside
real updates, is what the policy's factor and floor cover; the straggler signal watches it after.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import zlib

import torch
import torch.distributed as dist
from torch import nn

from ..config import AUTO, Config
from ..control import ControlPlane
from ..errors import ConfigError
from ..timeouts import DerivedTimeouts, derive_timeouts
from .data_plane import DataPlane

log = logging.getLogger("accelpact.runtime")

#: Timed all-reduces per group (one more runs first, untimed: it pays one-time buffer set-up).
WARMUP_ROUNDS = 20
#: DDP's default bucket: no single collective of an update moves more than this.
BUCKET_CAP_BYTES = 25 * 1024 * 1024
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


def provisional(config: Config) -> tuple[float, float]:
    """(data, control) timeouts to set up with until the measurement: given ones, else defaults."""
    pick = {name: _DEFAULTS[name] if getattr(config, name) == AUTO else getattr(config, name)
            for name in ("data_timeout_s", "control_timeout_s")}
    return float(pick["data_timeout_s"]), float(pick["control_timeout_s"])


def collective_size(model: nn.Module) -> tuple[int, torch.device]:
    """(float32 elements, device) of a warm-up collective: the rank's local parameters, capped."""
    numel, device = 0, None
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 DTensor: this rank's shard
        numel += local.numel()
        device = device or local.device
    return max(1, min(numel, BUCKET_CAP_BYTES // 4)), device or torch.device("cpu")


def measure(plane: DataPlane, control: ControlPlane, model: nn.Module,
            rounds: int) -> tuple[dict[str, list[float]], list[float], int]:
    """Seconds of `rounds` all-reduces per data-plane group label and on the control plane (which
    goes first and lines the ranks up), and the bytes of one data-plane warm-up."""
    control_s = control.round_trips(rounds + 1)[1:]
    numel, device = collective_size(model)
    buf = torch.zeros(numel, dtype=torch.float32, device=device)
    data: dict[str, list[float]] = {}
    for label in sorted(plane.groups):  # the same order on every rank, as in training
        times = []
        try:
            for _ in range(rounds + 1):
                t = time.perf_counter()
                dist.all_reduce(buf, group=plane.groups[label])
                if buf.is_cuda:
                    torch.cuda.synchronize(buf.device)
                times.append(time.perf_counter() - t)
        except Exception as exc:  # gloo/NCCL raise many kinds; attach fails with the cause
            raise ConfigError(f"timeout {AUTO!r}: the warm-up all-reduce on data-plane group {label!r} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
        data[label] = times[1:]
    return data, control_s, numel * 4


def settle_timeouts(config: Config, plane: DataPlane, control: ControlPlane, model: nn.Module, *, rank: int,
                    qualified: DerivedTimeouts | None = None,
                    rounds: int | None = None) -> tuple[Config, DerivedTimeouts | None]:
    """Derive the "auto" timeouts from every rank's measurements and apply them to both planes.
    Every rank derives from the same gathered samples, so every rank gets the same values (and a
    contradiction raises ConfigError on every rank alike). A config without "auto" is unchanged."""
    if not config.calibrates:
        return config, None
    rounds = rounds or WARMUP_ROUNDS  # read now: `accelpact qualify` takes more rounds
    data, ctrl, nbytes = measure(plane, control, model, rounds)
    labels = sorted(data)
    tag = float(zlib.crc32("|".join(labels).encode()))  # which groups the samples are of: the same everywhere
    rows = control.gather_floats([tag, nbytes, *(s for label in labels for s in data[label]), *ctrl])
    if any(row[0] != tag for row in rows):  # every rank sees the same rows: all refuse together
        raise ConfigError(f"timeout {AUTO!r}: ranks measured different data-plane groups (this rank: {labels})")
    every = {label: [row[2 + i * rounds + k] for row in rows for k in range(rounds)] for i, label in enumerate(labels)}
    every_ctrl = [row[2 + len(labels) * rounds + k] for row in rows for k in range(rounds)]
    given = {name: None if getattr(config, name) == AUTO else float(getattr(config, name))
             for name in ("data_timeout_s", "control_timeout_s")}
    derived = derive_timeouts(
        every, every_ctrl, given_data=given["data_timeout_s"], given_control=given["control_timeout_s"],
        qualified=(qualified.data_timeout_s, qualified.control_timeout_s) if qualified else None,
        bytes_per_collective=int(max(row[1] for row in rows)))
    plane.timeout_s = derived.data_timeout_s
    plane.enforce_timeout()
    control.set_timeout(derived.control_timeout_s)
    if rank == 0:
        log.info("timeouts: %s", derived.describe())
        print(f"[accelpact] timeouts: {derived.describe()}", file=sys.stderr, flush=True)
    return dataclasses.replace(config, data_timeout_s=derived.data_timeout_s,
                               control_timeout_s=derived.control_timeout_s), derived
