"""Repair time per protocol phase, 2 and 4 ranks, CPU/gloo.

Each world trains under AccelPact with N skip faults at committed boundaries. For every recovery
the slowest rank's time per phase is taken (the protocol releases all ranks together, so the
slowest rank is the repair time); medians over recoveries are printed. Detection (the data-plane
timeout the failure takes to surface, a setting) is reported separately from repair
(control-plane admission → release). Goal: repair ≤ 0.1 s at 4 ranks.

    python bench/repair.py [--faults 6] [--data-timeout 0.8] [--worlds 2,4,8]

Also the first update after each repair against the clean updates (the issue's ≤ 1.2 goal):
faults are spaced so that every repair is followed by a clean update.
"""

from __future__ import annotations

import argparse
import os
import sys

from _common import median, table, write_json

from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world

PHASES = ["guard", "agree", "replace", "rebind", "validate", "release"]


def measure(world: int, local: int, faults: int, data_timeout: float, framework: str) -> dict:
    ranks = list(range(world))
    faulted = [2 + 2 * i for i in range(faults)]  # a clean update between faults: the first one after repair
    plan = ",".join(f"skip@{u}:committed:{ranks[(u * 3) % world]}" for u in faulted)
    drill = Drill(framework=framework, updates=faulted[-1] + 3, faults=plan, local=local, layers=2,
                  data_timeout_s=data_timeout, control_timeout_s=data_timeout * 6 + 2, reference=False)
    results = run_world(run_drill, world, drill, timeout_s=60 + faults * 10, pg_timeout_s=30)
    recs = []
    for i in range(faults):
        per_rank = [r["history"][i] for r in results]
        assert all(h["action"] == "preserve" for h in per_rank), per_rank
        recs.append(
            {
                "repair_s": max(h["repair_s"] for h in per_rank),
                "detect_s": max(h["detect_s"] for h in per_rank),
                **{p: max(h["timings_s"].get(p, 0.0) for h in per_rank) for p in PHASES},
            }
        )
    # per update, the slowest rank (updates end together); the first update is warm-up
    slowest = [max(r["update_seconds"][i] for r in results) for i in range(len(results[0]["update_seconds"]))]
    after = [slowest[u] for u in faulted]  # index u is update u+1: the first one after update u's repair
    normal = [t for i, t in enumerate(slowest) if i > 0 and i + 1 not in faulted and i not in faulted]
    first_ratio = median(after) / median(normal)
    return {"world": world, "framework": framework, "faults": faults, "data_timeout_s": data_timeout,
            "median": {k: median([r[k] for r in recs]) for k in recs[0]}, "recoveries": recs,
            "first_update_after_s": after, "normal_update_s": normal, "first_update_ratio": first_ratio}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--faults", type=int, default=6)
    ap.add_argument("--data-timeout", type=float, default=0.8)
    ap.add_argument("--framework", default="fsdp2")
    ap.add_argument("--worlds", default="2,4", help="world sizes, comma-separated (even: 2 ranks per node)")
    args = ap.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = [measure(w, 1 if w == 2 else 2, args.faults, args.data_timeout, args.framework) for w in worlds]
    rows = []
    for run in runs:
        m = run["median"]
        rows.append([run["world"], run["framework"], f"{m['detect_s']:.3f}", f"{m['repair_s'] * 1e3:.1f}"]
                    + [f"{m[p] * 1e3:.2f}" for p in PHASES]
                    + [f"{median(run['first_update_after_s']) * 1e3:.0f}", f"{median(run['normal_update_s']) * 1e3:.0f}",
                       f"{run['first_update_ratio']:.2f}"])
    print(f"repair time, medians over {args.faults} recoveries (ms; detect in s = data timeout + wait); "
          f"load {load_before} -> {[round(x, 2) for x in os.getloadavg()]}")
    print(table(["ranks", "framework", "detect s", "repair ms"] + [f"{p} ms" for p in PHASES]
                + ["first after ms", "normal ms", "first/normal"], rows))
    print("first/normal: the update right after a repair against the clean ones (slowest rank); goal <= 1.2")
    r4 = next((run["median"]["repair_s"] for run in runs if run["world"] == 4), runs[-1]["median"]["repair_s"])
    print(f"\n4-rank repair {r4 * 1e3:.1f} ms vs goal 100 ms: {'MET' if r4 <= 0.1 else 'NOT MET'} "
          f"(paper 625-694 ms on NCCL; ratio to paper's 625 ms: {r4 / 0.625:.3f})")
    path = write_json("repair", {"runs": runs})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
