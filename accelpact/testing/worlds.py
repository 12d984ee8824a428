"""The spawned worlds behind the multi-process tests, each run once per test session.

Starting 4 ranks costs far more than anything they check (torch import on a loaded 2-core
machine: 10–30 s), so the checks share two worlds: one for the communicator lifecycle and DDP
(light imports), one for FSDP1 and FSDP2. Each returns per-rank results that several test
modules read; ``functools.cache`` makes the second module reuse the first one's world.
Scenarios that break a world (the no-rebind negatives) run last, and the FSDP world replaces
every group after each of them so the next one starts clean.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import time
from typing import Any

import torch
import torch.distributed as dist

from accelpact.comm import (
    classify_failure,
    group_identity,
    make_group,
    parse_group_name,
    replace_group,
    retire_group,
    retired_group_names,
    validate_group,
)
from accelpact.comm.lifecycle import group_name
from accelpact.rebind import data_plane_groups, discover
from accelpact.testing.faults import skip_collective_fault
from accelpact.testing.scenarios import Scenario, build, recovery_scenario, stale_reference_scenario
from accelpact.testing.spawn import run_world
from accelpact.workloads import HSDPGroups, HSDPLayout, train_step

__all__ = ["comm_and_ddp_results", "comm_and_ddp_world", "fsdp_results", "fsdp_world"]

LAYOUT = HSDPLayout(nodes=2, local=2)
GROUP_TIMEOUT = datetime.timedelta(seconds=20)
WORLD_TIMEOUT_S = 300.0


def _error_chain(exc: BaseException) -> list[tuple[str, str]]:
    """The real exception chain as (type, text) pairs: exceptions lose their chain when pickled."""
    from accelpact.comm.classify import exception_chain

    return [(type(link).__name__, str(link)) for link in exception_chain(exc)]


def _capture(fn: Any, *, used: list[str] | None = None) -> dict[str, Any] | None:
    try:
        fn()
    except Exception as exc:  # the failure is the result
        classification = classify_failure(exc, retired_names=retired_group_names(), used_group_names=used or ())
        return {"type": type(exc).__name__, "cause": classification.cause.name, "chain": _error_chain(exc),
                "message": classification.message}
    return None


# -------------------------------------------------------------------------------------------- comm + DDP


def _comm_checks(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shard_ranks, replicate_ranks = LAYOUT.shard_ranks(rank), LAYOUT.replicate_ranks(rank)

    # members arrive at different times: rank 3 is 1 s late for its replicate group {1,3}
    if rank == 3:
        time.sleep(1.0)
    start = time.perf_counter()
    replicate = make_group(replicate_ranks, label="c-replicate", timeout=GROUP_TIMEOUT)
    out["make_ms"] = (time.perf_counter() - start) * 1e3
    shard = make_group(shard_ranks, label="c-shard", timeout=GROUP_TIMEOUT)
    from torch.distributed.distributed_c10d import _resolve_process_group

    out["registered"] = {
        "name": replicate.group_name,
        "resolves": _resolve_process_group(replicate.group_name) is replicate,
        "rank_in_group": dist.get_rank(replicate),
        "ranks": dist.get_process_group_ranks(replicate),
        "backend_timeout_s": replicate._get_backend(torch.device("cpu")).options._timeout.total_seconds(),
        "mesh_resolves": HSDPGroups(LAYOUT, shard, replicate).device_mesh().get_group("replicate") is replicate,
    }
    out["validate"] = dataclasses.asdict(validate_group(replicate, replicate_ranks))

    # errors that must leave everything untouched
    out["non_member"] = _capture(lambda: make_group([r for r in range(4) if r not in replicate_ranks][:2],
                                                    label="x", timeout=GROUP_TIMEOUT))
    out["wrong_membership"] = _capture(lambda: replace_group(shard, ranks=[0, 1, 2, 3], label="c-shard",
                                                             generation=1, timeout=GROUP_TIMEOUT))
    out["duplicate_name"] = _capture(lambda: make_group(shard_ranks, label="c-shard", timeout=GROUP_TIMEOUT))
    out["same_generation"] = _capture(lambda: replace_group(shard, ranks=shard_ranks, label="c-shard", generation=0,
                                                            timeout=GROUP_TIMEOUT))  # its own store prefix
    out["wrong_validation"] = _capture(lambda: validate_group(shard, [r + 1 for r in shard_ranks]))
    out["shard_still_works"] = validate_group(shard, shard_ranks).observed_sum == sum(shard_ranks)

    # a real fault on {0,2}: rank 2 skips, rank 0 times out; {1,3} is retired while healthy
    dist.barrier()
    fault = skip_collective_fault(replicate, waiter=0, skipper=2)
    out["fault"] = None if fault is None else {"cause": classify_failure(fault).cause.name,
                                               "chain": _error_chain(fault)}
    out["shard_after_fault"] = validate_group(shard, shard_ranks).observed_sum == sum(shard_ranks)
    dist.barrier()
    if rank == 2:
        time.sleep(0.5)  # a straggler in the replacement too
    start = time.perf_counter()
    new = replace_group(replicate, ranks=replicate_ranks, label="c-replicate", generation=1, timeout=GROUP_TIMEOUT)
    out["replace_ms"] = (time.perf_counter() - start) * 1e3
    out["replaced"] = {
        "name": new.group_name,
        "identity": group_identity(new),
        "old_name_resolves_to_new": _resolve_process_group_or_none(replicate.group_name) is new,
        "retired": group_name("c-replicate", 0) in retired_group_names(),
        "retire_again": retire_group(replicate),
        "validated": validate_group(new, replicate_ranks).observed_sum,
    }
    # using the retired group: through c10d (ValueError masking gloo) and raw (bare gloo error)
    out["stale_c10d"] = _capture(lambda: dist.all_reduce(torch.ones(1), group=replicate))
    out["stale_raw"] = _capture(lambda: replicate.allreduce([torch.ones(1)]).wait(), used=[group_identity(replicate)])
    out["stale_raw_traceback"] = _capture(lambda: replicate.allreduce([torch.ones(1)]).wait())
    dist.barrier()
    return out


def _resolve_process_group_or_none(name: str) -> Any:
    from accelpact.comm._c10d import resolve_name

    return resolve_name(name)


def _ddp_checks(rank: int) -> dict[str, Any]:
    scenario = Scenario("ddp", n_layers=4)
    groups = LAYOUT.build_groups(timeout=scenario.group_timeout, generation=0)
    out: dict[str, Any] = {"recovery": recovery_scenario(scenario, LAYOUT, groups)}
    model, optimizer, data = build(scenario, LAYOUT, groups)
    train_step(model, optimizer, data.next_batch())
    out["labels"] = sorted(data_plane_groups(model))
    # a reducer reachable outside the DistributedDataParallel that owns it: refused, not guessed
    out["orphan_reducer"] = _capture(
        lambda: discover(model.module, groups.replicate, extra={"cached_reducer": model.reducer}))
    dist.barrier()
    out["stale"] = stale_reference_scenario(scenario, LAYOUT, groups)
    return out


def comm_and_ddp_world(rank: int, world_size: int) -> dict[str, Any]:
    return {"comm": _comm_checks(rank), "ddp": _ddp_checks(rank)}


@functools.cache
def comm_and_ddp_results() -> list[dict[str, Any]]:
    return run_world(comm_and_ddp_world, LAYOUT.world_size, timeout_s=WORLD_TIMEOUT_S, pg_timeout_s=30,
                     local_world_size=LAYOUT.local)


# -------------------------------------------------------------------------------------------- FSDP


def _reference_counts(scenario: Scenario, groups: HSDPGroups) -> dict[str, dict[str, Any]]:
    model, optimizer, data = build(scenario, LAYOUT, groups)
    train_step(model, optimizer, data.next_batch())  # FSDP initialises lazily
    counts = {}
    for label, group in data_plane_groups(model).items():
        plan = discover(model, group, extra={"optimizer": optimizer})
        counts[label] = {"references": plan.references, "names": plan.names, "counts": dict(plan.counts),
                         "paths": list(plan.paths)}
    return counts


def _fresh_groups(groups: HSDPGroups) -> HSDPGroups:
    """After a negative scenario every group may be broken: replace them all (all ranks)."""
    rank = dist.get_rank()
    dist.barrier()
    for label, members in (("shard", LAYOUT.shard_ranks(rank)), ("replicate", LAYOUT.replicate_ranks(rank))):
        old = getattr(groups, label)
        generation = (parse_group_name(group_identity(old)) or (label, 0))[1] + 1
        setattr(groups, label, replace_group(old, ranks=members, label=label, generation=generation,
                                             timeout=GROUP_TIMEOUT))
    dist.barrier()
    return groups


def fsdp_world(rank: int, world_size: int) -> dict[str, Any]:
    fsdp1 = Scenario("fsdp1", n_layers=4)
    groups = LAYOUT.build_groups(timeout=fsdp1.group_timeout)
    out: dict[str, Any] = {"rank": rank, "timings": {}}

    def timed(key: str, fn: Any) -> None:
        start = time.perf_counter()
        out[key] = fn()
        out["timings"][key] = round(time.perf_counter() - start, 3)

    timed("fsdp1", lambda: recovery_scenario(fsdp1, LAYOUT, groups))
    timed("fsdp1-orig", lambda: recovery_scenario(dataclasses.replace(fsdp1, framework="fsdp1-orig"),
                                                  LAYOUT, groups))
    timed("fsdp2", lambda: recovery_scenario(dataclasses.replace(fsdp1, framework="fsdp2"), LAYOUT, groups))
    timed("counts-fsdp1-mesh", lambda: _reference_counts(dataclasses.replace(fsdp1, framework="fsdp1-mesh"),
                                                         groups))
    timed("counts-fsdp1-l8", lambda: _reference_counts(dataclasses.replace(fsdp1, n_layers=8), groups))
    timed("stale-fsdp1", lambda: stale_reference_scenario(fsdp1, LAYOUT, groups))
    _fresh_groups(groups)
    timed("stale-fsdp2", lambda: stale_reference_scenario(dataclasses.replace(fsdp1, framework="fsdp2"),
                                                          LAYOUT, groups))
    return out


@functools.cache
def fsdp_results() -> list[dict[str, Any]]:
    return run_world(fsdp_world, LAYOUT.world_size, timeout_s=WORLD_TIMEOUT_S, pg_timeout_s=30,
                     local_world_size=LAYOUT.local)


