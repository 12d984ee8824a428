"""Resources per recovery: open descriptors, native threads, RSS and live process groups of
each rank over N group replacements in one process world (the retire/replace/validate a recovery
runs on every failed group). Flat means no leak.

    python bench/soak.py --recoveries 50 --world 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def resources() -> dict:
    import torch.distributed as dist

    status = Path("/proc/self/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": threads, "rss_mb": round(rss_kb / 1024, 1),
            "groups": len(dist.distributed_c10d._world.pg_map)}


def soak(rank: int, world_size: int, recoveries: int) -> list[dict]:
    import datetime

    from accelpact.comm import make_group, replace_group, validate_group

    ranks = list(range(world_size))
    timeout = datetime.timedelta(seconds=10)
    group = make_group(ranks, label="replicate", generation=0, timeout=timeout)
    validate_group(group, ranks)
    series = []
    for g in range(1, recoveries + 1):
        group = replace_group(group, ranks=ranks, label="replicate", generation=g, timeout=timeout)
        validate_group(group, ranks)
        gc.collect()
        series.append({"recovery": g, **resources()})
    return series


def main(argv: list[str] | None = None) -> int:
    from accelpact.testing.spawn import run_world

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recoveries", type=int, default=50)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the per-recovery series here")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    results = run_world(soak, args.world, args.recoveries, timeout_s=60 + 3 * args.recoveries)
    print(f"load average {load:.2f} on {os.cpu_count()} cores; world {args.world}; {args.recoveries} recoveries")
    print("rank  recovery   fds  threads  rss_mb  groups")
    for rank, series in enumerate(results):
        for row in (series[0], series[len(series) // 2], series[-1]):
            print(f"{rank:>4}  {row['recovery']:>8}  {row['fds']:>4}  {row['threads']:>7}  {row['rss_mb']:>6}  "
                  f"{row['groups']:>6}")
        first, last = series[0], series[-1]
        print(f"      growth after the first recovery: {last['fds'] - first['fds']:+d} fds, "
              f"{last['threads'] - first['threads']:+d} threads, {last['rss_mb'] - first['rss_mb']:+.1f} MB, "
              f"{last['groups'] - first['groups']:+d} groups")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "series": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
