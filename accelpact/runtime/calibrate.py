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
import json
import logging
import sys
import time
import zlib

import torch
import torch.distributed as dist
from torch import nn

from ..comm.backends import parse_backends, probe_device, wait_for
from ..config import AUTO, Config
from ..control import ControlPlane
from ..errors import ConfigError
from ..timeouts import DerivedTimeouts, announce, derive_timeouts
from .data_plane import DataPlane

log = logging.getLogger("accelpact.runtime")

#: Timed all-reduces per group and control-plane round trips (one more runs first, untimed: it
#: pays one-time buffer set-up). 8, not 20: the warm-up is part of every attach now that "auto"
#: is the default, and 4 ranks x 8 = 32 samples per group still put the p99 at the slowest
#: sample seen (nearest rank: any count under 100 does); measured in `bench/timeouts.py`.
WARMUP_ROUNDS = 8
#: A big model's warm-up takes fewer rounds: at most this many bytes per group (25 MiB
#: collectives: 2 rounds would do, MIN_ROUNDS run), so attach does not pay seconds to measure.
WARMUP_BYTES_PER_GROUP = 64 * 1024 * 1024
MIN_ROUNDS = 3
#: DDP's default bucket: no single collective of an update moves more than this.
BUCKET_CAP_BYTES = 25 * 1024 * 1024
#: The timeouts attach sets up with until the measurement has run (the warm-ups run under them).
PROVISIONAL_S = {"data_timeout_s": 10.0, "control_timeout_s": 30.0}
#: Where the survivors leave their settled timeouts for a spare that joins later (under spares).
TIMEOUTS_KEY = "membership/timeouts"


def provisional(config: Config) -> tuple[float, float]:
    """(data, control) timeouts to set up with until the measurement: given ones, else provisional."""
    pick = {name: PROVISIONAL_S[name] if getattr(config, name) == AUTO else getattr(config, name)
            for name in PROVISIONAL_S}
    return float(pick["data_timeout_s"]), float(pick["control_timeout_s"])


def warmup_rounds(nbytes: int, rounds: int) -> int:
    """Timed rounds for collectives of `nbytes`: `rounds`, fewer for big ones, never under MIN_ROUNDS."""
    return max(min(MIN_ROUNDS, rounds), min(rounds, WARMUP_BYTES_PER_GROUP // max(1, nbytes)))


def collective_size(model: nn.Module) -> int:
    """Float32 elements of a warm-up collective: the rank's local parameters, capped."""
    numel = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 DTensor: this rank's shard
        numel += local.numel()
    return max(1, min(numel, BUCKET_CAP_BYTES // 4))


def largest_collective_bytes(model: nn.Module) -> int:
    """The largest single collective one update makes, in bytes, as the wrappers say: an FSDP2
    unit's all-gather of its unsharded parameters (its own, not its nested units'), an FSDP1 flat
    parameter unsharded, a DDP bucket; else this rank's parameters. An estimate, for scaling the
    warm-up's latency (which moves at most a DDP bucket) to the update's largest collective."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    largest = 0
    for module in model.modules():
        if isinstance(module, FSDPModule):
            nested = {id(p) for sub in module.modules() if sub is not module and isinstance(sub, FSDPModule)
                      for p in sub.parameters()}
            own = sum(p.numel() * p.element_size() for p in module.parameters() if id(p) not in nested)
            largest = max(largest, own)  # a DTensor's numel is the unsharded one
        elif isinstance(module, FullyShardedDataParallel):
            flat = getattr(module, "_flat_param", None)
            size = getattr(flat, "_unpadded_unsharded_size", None)
            if flat is not None and size is not None:
                largest = max(largest, size.numel() * flat.element_size())
        elif isinstance(module, DistributedDataParallel):
            largest = max(largest, int(getattr(module, "bucket_bytes_cap", BUCKET_CAP_BYTES)))
    return largest or sum(p.numel() * p.element_size() for p in model.parameters())


def measure(plane: DataPlane, control: ControlPlane, model: nn.Module,
            rounds: int) -> tuple[dict[str, list[float]], list[float], int]:
    """Seconds of all-reduces per data-plane group label and on the control plane, and the bytes of
    one data-plane warm-up. The ranks first agree on its size (the largest local shard: FSDP's
    uneven shards differ, and an all-reduce needs the same size everywhere), which also lines
    them up; the size sets the rounds (`warmup_rounds`), so every rank runs as many."""
    local = collective_size(model)
    numel = int(max(row[0] for row in control.gather_floats([float(local)])))
    rounds = warmup_rounds(numel * 4, rounds)
    control_s = control.round_trips(rounds + 1)[1:]
    buffers: dict[torch.device, torch.Tensor] = {}
    data: dict[str, list[float]] = {}
    for label in sorted(plane.groups):  # the same order on every rank, as in training
        # on the device the group's probes use, not the parameters' (found by review: parameters
        # offloaded to the CPU put an NCCL group's warm-up there, which NCCL refuses), each round
        # waited for with the probes' bound: a bare NCCL wait never raises, a sync behind a peer
        # missing at attach would never return
        backends = parse_backends(plane.backend_specs[label])
        device = probe_device(backends, plane.groups[label])
        if device not in buffers:
            buffers[device] = torch.zeros(numel, dtype=torch.float32, device=device)
        times = []
        try:
            for _ in range(rounds + 1):
                t = time.perf_counter()
                work = dist.all_reduce(buffers[device], group=plane.groups[label], async_op=True)
                wait_for(work, backends, plane.probe_timeout())
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
    Every rank derives from the same gathered samples and the same lower bound (the largest of
    the ranks' envelope files: each host reads its own), so every rank gets the same values, and
    a contradiction raises ConfigError on every rank alike. A config without "auto" is unchanged.

    The envelope file's values are a floor, never a reason to skip the warm-up: `accelpact
    qualify` measured them on its own worlds (4 ranks, a small model's collectives), not this
    job's collective sizes or width, and a bound that was not measured for this job is how
    spurious recoveries start; the warm-up costs tens of milliseconds (see README)."""
    if not config.calibrates:
        return config, None
    data, ctrl, nbytes = measure(plane, control, model, rounds or WARMUP_ROUNDS)  # read now: qualify takes more
    n, labels = len(ctrl), sorted(data)
    if any(len(data[label]) != n for label in labels):
        raise ConfigError(f"timeout {AUTO!r}: the warm-up took {n} control samples but {[len(data[x]) for x in labels]} "
                          f"data samples")
    tag = float(zlib.crc32("|".join(labels).encode()))  # which groups the samples are of: the same everywhere
    floor = (qualified.data_timeout_s, qualified.control_timeout_s) if qualified else (0.0, 0.0)
    largest = float(largest_collective_bytes(model))
    rows = control.gather_floats([tag, nbytes, largest, *floor, *(s for label in labels for s in data[label]), *ctrl])
    if any(row[0] != tag for row in rows):  # every rank sees the same rows: all refuse together
        raise ConfigError(f"timeout {AUTO!r}: ranks measured different data-plane groups (this rank: {labels})")
    every = {label: [row[5 + i * n + k] for row in rows for k in range(n)] for i, label in enumerate(labels)}
    every_ctrl = [row[5 + len(labels) * n + k] for row in rows for k in range(n)]
    given = {name: None if getattr(config, name) == AUTO else float(getattr(config, name))
             for name in ("data_timeout_s", "control_timeout_s")}
    highest = (max(row[3] for row in rows), max(row[4] for row in rows))
    derived = derive_timeouts(
        every, every_ctrl, given_data=given["data_timeout_s"], given_control=given["control_timeout_s"],
        qualified=highest if highest[0] > 0 else None, bytes_per_collective=int(max(row[1] for row in rows)),
        largest_collective_bytes=int(max(row[2] for row in rows)))
    config = apply_timeouts(config, plane, control, derived.data_timeout_s, derived.control_timeout_s)
    if rank == 0:
        log.info("timeouts: %s", derived.describe())
        print(f"[accelpact] {announce(derived)}", file=sys.stderr, flush=True)
        if (short := derived.undersized()) is not None:
            log.warning(short)
    return config, derived


def apply_timeouts(config: Config, plane: DataPlane, control: ControlPlane, data_s: float,
                   control_s: float) -> Config:
    """Both planes use these timeouts from now on; the config says so."""
    plane.timeout_s = data_s
    plane.enforce_timeout()
    control.set_timeout(control_s)
    return dataclasses.replace(config, data_timeout_s=data_s, control_timeout_s=control_s)


def publish_timeouts(store, config: Config) -> None:
    """Under spares: leave the settled timeouts where a spare that joins later reads them."""
    store.set(TIMEOUTS_KEY, json.dumps([config.data_timeout_s, config.control_timeout_s]))


def adopt_timeouts(store, config: Config, plane: DataPlane, control: ControlPlane) -> Config:
    """A spare joining a running job takes the survivors' timeouts: a warm-up of its own would be a
    collective the survivors never run, and every rank must time out alike. An explicit value of
    its own that differs is refused (found by review: kept, a spare given 30 s waited in a
    collective its peers had left after 2 s, came to the boundary check past their control
    timeout, and the job rejected)."""
    data_s, control_s = (float(v) for v in json.loads(store.get(TIMEOUTS_KEY)))
    for name, theirs in (("data_timeout_s", data_s), ("control_timeout_s", control_s)):
        mine = getattr(config, name)
        if mine != AUTO and float(mine) != theirs:
            raise ConfigError(f"this spare was given {name}={mine}, the job it joins runs with {theirs}: give every "
                              f"process the same value, or {AUTO!r}")
    return apply_timeouts(config, plane, control, data_s, control_s)
