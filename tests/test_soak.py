"""No leak per recovery: a retired group is released once the rebind drops the framework's last
reference to it (on the reaper's thread, `comm.reaper`, which each sample waits for), so
descriptors, threads and process groups stay flat over many recoveries."""

from __future__ import annotations

import pytest

from accelpact.testing.spawn import run_world


def _resources() -> dict:
    import gc
    import os
    from pathlib import Path

    import torch.distributed as dist

    from accelpact.comm import reaper

    assert reaper.drain(10), "retired groups still waiting for the reaper"  # freed off the recovery's path
    gc.collect()
    status = Path("/proc/self/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": threads,
            "groups": len(dist.distributed_c10d._world.pg_map)}


def _replacements(rank: int, world_size: int, n: int) -> list[dict]:
    import datetime

    from accelpact.comm import make_group, replace_group, validate_group

    ranks = list(range(world_size))
    group = make_group(ranks, label="replicate", generation=0, timeout=datetime.timedelta(seconds=10))
    series = []
    for g in range(1, n + 1):
        group = replace_group(group, ranks=ranks, label="replicate", generation=g,
                              timeout=datetime.timedelta(seconds=10))
        validate_group(group, ranks)
        series.append(_resources())
    return series


def _recoveries(rank: int, world_size: int, n: int) -> list[dict]:
    """n committed-boundary recoveries of a protected DDP job, resources after each."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import accelpact

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 8), process_group=dist.new_group(list(range(world_size))))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plan = ",".join(f"skip@{u}:committed:1" for u in range(2, n + 2))
    rt = accelpact.attach(model, opt, config=accelpact.Config(data_timeout_s=0.5, control_timeout_s=5.0,
                                                             envelope="builtin", on_reject="raise"), faults=plan)
    series = []
    for _ in range(n + 1):
        with rt.update():
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        if rt.history:
            series.append(_resources())
    assert [r.action.value for r in rt.history] == ["preserve"] * n
    rt.close()
    return series


def _assert_flat(series: list[dict], slack: int = 2) -> None:
    first, last = series[0], series[-1]
    for key in ("fds", "threads", "groups"):
        assert last[key] - first[key] <= slack, f"{key} grew {first[key]} -> {last[key]} over {len(series)}: {series}"


@pytest.mark.timeout(120)
def test_fifty_group_replacements_leave_descriptors_threads_and_groups_flat():
    for series in run_world(_replacements, 2, 50, timeout_s=100):
        assert len(series) == 50
        _assert_flat(series)


@pytest.mark.timeout(180)
def test_thirty_recoveries_of_a_protected_job_leave_descriptors_threads_and_groups_flat():
    for series in run_world(_recoveries, 2, 30, timeout_s=160):
        assert len(series) == 30
        _assert_flat(series)


def _clean_updates(rank: int, world_size: int, n: int) -> dict[str, list[tuple[str, int, int]]]:
    """`n` clean updates under each boundary mode after a warm-up; the allocation sites whose
    live objects grew by ~one per update (file:line, objects, bytes)."""
    import gc
    import tracemalloc

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import accelpact
    from accelpact.fsm import machine

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 8), process_group=dist.new_group(list(range(world_size))))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    machine.EDGES_KEPT = 64  # the edge log's bound, reached within n updates
    rt = accelpact.attach(model, opt, config=accelpact.Config(data_timeout_s=5.0, control_timeout_s=20.0,
                                                             envelope="permissive", on_reject="raise"))

    def update():
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()

    grown = {}
    for mode in ("sync", "deferred"):
        rt.config.boundary = mode
        for _ in range(50):
            rt.step(update)
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        for _ in range(n):
            rt.step(update)
        rt.settle()
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown[mode] = [(str(s.traceback), s.count_diff, s.size_diff) for s in after.compare_to(before, "lineno")
                       if s.count_diff >= 0.9 * n]
    assert rt.frontier == 2 * (50 + n)
    rt.close()
    return grown


@pytest.mark.timeout(120)
def test_clean_updates_keep_nothing_per_update():
    """A million updates must not cost memory: no allocation site may keep ~one object per clean
    update (the protocol machine's edge log once did, 74 bytes an update)."""
    for grown in run_world(_clean_updates, 2, 800, timeout_s=100):
        assert grown == {"sync": [], "deferred": []}, grown
