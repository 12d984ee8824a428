"""Rebind and proof time versus model depth, per framework (single process, c10d fake backend).

Rebinding does no communication: it rewrites references and re-reads them. So the timing is taken
in one process on the fake backend (world 4, this process = rank 0), where FSDP1, FSDP2 and DDP
build real ProcessGroup objects and real caches of them. Each repeat rebinds the replicate-group
plan to the other of two spare groups of identical membership, then proves it; medians over
repeats. Goal: rebind + proof of 33 references (FSDP1 HYBRID_SHARD with a mesh, L = 15) ≤ 50 µs.
"(actions)" is the part of rebind spent dropping DTensor's sharding caches (mesh plans only); here
the caches stay nearly empty between repeats, after real FSDP2 steps dropping them costs ≈0.5 ms.

    .venv/bin/python bench/rebind.py [--layers 4 8 32 128] [--repeats 200] [--out bench/results/rebind.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from accelpact.rebind import discover
from accelpact.testing.scenarios import Scenario, build
from accelpact.workloads import HSDPGroups, HSDPLayout, train_step

LAYOUT = HSDPLayout(2, 2)
FRAMEWORKS = ("fsdp1", "fsdp1-mesh", "fsdp2", "ddp")
GOAL_US = 50.0
GOAL_LAYERS = 15  # FSDP1 + mesh: 2·(15+1) + 1 = 33 references


def _groups() -> HSDPGroups:
    shard = dist.new_group([0, 1])
    dist.new_group([2, 3])
    replicate = dist.new_group([0, 2])
    dist.new_group([1, 3])
    return HSDPGroups(LAYOUT, shard, replicate)


def measure(framework: str, n_layers: int, repeats: int) -> dict[str, Any]:
    groups = _groups()
    model, optimizer, data = build(Scenario(framework, n_layers=n_layers, dim=16, seq_len=4, batch_size=1),
                                   LAYOUT, groups)
    if framework != "ddp":  # the fake backend cannot run DDP's reducer hooks; DDP needs no lazy init
        train_step(model, optimizer, data.next_batch())
    plan = discover(model, groups.replicate, extra={"optimizer": optimizer})
    spares = (dist.new_group([0, 2]), dist.new_group([0, 2]))
    rebind_us, prove_us, actions_us = [], [], []
    gc.disable()
    try:
        for index in range(repeats):
            report = plan.rebind(spares[index % 2])
            proof = plan.prove()
            rebind_us.append(report.elapsed_us)
            actions_us.append(report.actions_us)
            prove_us.append(proof.elapsed_us)
    finally:
        gc.enable()
    start = time.perf_counter()
    deep = plan.verify_deep()
    deep_ms = (time.perf_counter() - start) * 1e3
    totals = [r + p for r, p in zip(rebind_us, prove_us)]
    return {
        "framework": framework,
        "layers": n_layers,
        "references": plan.references,
        "names": plan.names,
        "counts": dict(plan.counts),
        "rebind_us_median": statistics.median(rebind_us),
        "of_which_actions_us_median": statistics.median(actions_us),
        "prove_us_median": statistics.median(prove_us),
        "total_us_median": statistics.median(totals),
        "total_us_p90": statistics.quantiles(totals, n=10)[-1] if len(totals) >= 10 else max(totals),
        "discover_ms": plan.discover_us / 1e3,
        "verify_deep_ms": deep_ms,
        "deep_complete": deep.complete,
        "visited_objects": plan.visited,
        "repeats": repeats,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 32, 128])
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rebind.json")
    args = parser.parse_args(argv)

    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=LAYOUT.world_size)
    try:
        rows = [measure(framework, layers, args.repeats)
                for framework in args.frameworks for layers in args.layers]
        goal = measure("fsdp1-mesh", GOAL_LAYERS, args.repeats)
    finally:
        dist.destroy_process_group()
    load_after = [round(x, 2) for x in os.getloadavg()]
    print(f"single process, {args.repeats} repeats per row; load {load_before} -> {load_after}")

    header = f"{'framework':<11} {'L':>4} {'refs':>5} {'names':>5} {'rebind µs':>10} {'(actions)':>9} " \
             f"{'prove µs':>9} {'total µs':>9} {'p90 µs':>7} {'discover ms':>12} {'deep ms':>8}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['framework']:<11} {row['layers']:>4} {row['references']:>5} {row['names']:>5} "
              f"{row['rebind_us_median']:>10.1f} {row['of_which_actions_us_median']:>9.1f} "
              f"{row['prove_us_median']:>9.1f} {row['total_us_median']:>9.1f} "
              f"{row['total_us_p90']:>7.1f} {row['discover_ms']:>12.1f} {row['verify_deep_ms']:>8.1f}")
    verdict = "met" if goal["total_us_median"] <= GOAL_US else "MISSED"
    print(f"\ngoal: rebind + proof of {goal['references']} references (fsdp1-mesh, L={GOAL_LAYERS}) = "
          f"{goal['total_us_median']:.1f} µs median (rebind {goal['rebind_us_median']:.1f} + prove "
          f"{goal['prove_us_median']:.1f}); target ≤ {GOAL_US:.0f} µs: {verdict}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "rebind",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "backend": "fake (single process, world 4, rank 0)",
        "group": "replicate",
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "rows": rows,
        "goal": {**goal, "target_us": GOAL_US, "met": goal["total_us_median"] <= GOAL_US},
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
