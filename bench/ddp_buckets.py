"""What isolating DDP's buckets costs: the built-in in-place all-reduce and AccelPact's fresh-copy
hook, side by side in one run.

One 2-rank gloo world trains two identically seeded DDP copies of the decoder, one with the
built-in communication and one with ``isolate_buckets``, alternating update by update so that both
see the same machine load. Each update (forward, backward with the bucket all-reduces, Adam step)
is timed; the ratio of medians is the hook's cost. The two copies must also end bitwise equal
(the isolation changes no bit of training), which the bench checks and prints.

    python bench/ddp_buckets.py [--sizes 32x4 128x4] [--bucket-mb 25 0.05] [--updates 40]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import model_size, table, write_json

from accelpact.testing.spawn import run_world

WORLD = 2


def worker(rank: int, world: int, sizes: list[tuple[int, int]], bucket_mbs: list[float], updates: int,
           warmup: int) -> list[dict[str, Any]]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from accelpact.runtime.ddp_buckets import isolate_buckets
    from accelpact.state import capture, diff
    from accelpact.workloads import SyntheticTokens, TinyDecoder, make_adam, next_token_loss

    rows = []
    for dim, layers in sizes:
        for bucket_mb in bucket_mbs:
            jobs = {}
            for kind in ("built-in", "isolated"):
                model = DistributedDataParallel(TinyDecoder(dim=dim, n_layers=layers, seed=3), bucket_cap_mb=bucket_mb)
                if kind == "isolated":
                    isolate_buckets(model)
                data = SyntheticTokens(model.module.vocab, 16, 4, seed=3, shard=rank)
                jobs[kind] = (model, make_adam(model), data, [])
            buckets = 0
            for index in range(warmup + updates):
                for kind in (("built-in", "isolated") if index % 2 == 0 else ("isolated", "built-in")):
                    model, optimizer, data, times = jobs[kind]
                    t0 = time.perf_counter()
                    next_token_loss(model, data.next_batch()).backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if index >= warmup:
                        times.append(time.perf_counter() - t0)
                    if kind == "built-in" and index == warmup:
                        buckets = len(model.reducer._get_zeros_like_grad_buckets())
            states = {kind: capture(job[0], job[1], job[2]) for kind, job in jobs.items()}
            base, isolated = (statistics.median(jobs[k][3]) for k in ("built-in", "isolated"))
            rows.append({"rank": rank, "dim": dim, "layers": layers, "bucket_mb": bucket_mb, "buckets": buckets,
                         "updates": updates, "builtin_ms_median": base * 1e3, "isolated_ms_median": isolated * 1e3,
                         "ratio": isolated / base,
                         "mismatches": len(diff(states["built-in"], states["isolated"])),
                         "compared": len(states["isolated"]), "threads": torch.get_num_threads()})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=model_size, nargs="+", default=[(32, 4), (128, 4)])
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[25.0, 0.05],
                        help="DDP bucket_cap_mb values (25 is DDP's default)")
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=4)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    results = run_world(worker, WORLD, args.sizes, args.bucket_mb, args.updates, args.warmup,
                        timeout_s=600, pg_timeout_s=60)
    rows = sorted((row for per_rank in results for row in per_rank),
                  key=lambda r: (r["dim"], r["layers"], -r["bucket_mb"], r["rank"]))
    setup = (f"DDP over {WORLD} ranks, gloo, CPU, 1 thread per rank; Adam (foreach=False); seq 16, batch 4; "
             f"{args.updates} timed updates after {args.warmup} warm-up, built-in and isolated alternating")
    print(setup)
    print(table(["dim", "L", "bucket MB", "buckets", "rank", "built-in ms", "isolated ms", "ratio", "bitwise"],
                [[r["dim"], r["layers"], r["bucket_mb"], r["buckets"], r["rank"], f"{r['builtin_ms_median']:.2f}",
                  f"{r['isolated_ms_median']:.2f}", f"{r['ratio']:.3f}",
                  "equal" if r["mismatches"] == 0 else f"{r['mismatches']} of {r['compared']} differ"]
                 for r in rows]))
    path = write_json("ddp_buckets", {"setup": setup, "rows": rows, "wall_s": time.perf_counter() - started})
    print(f"wrote {path}")
    return 0 if all(r["mismatches"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
