"""What Rewind's per-boundary state costs, next to the update it protects.

One 2-rank gloo world (FSDP2 ``fully_shard`` on a 1 × 2 mesh: both ranks shard, no replication)
trains the tiny decoder. In the same loop every update is timed in parts: BoundarySnapshot.capture
at the committed boundary, forward + backward, StepCopy.take right before optimizer.step(), then
step + zero_grad. The update time excludes both extras, so each ratio is extra / update measured
side by side. Restore costs (what a Rewind pays once) are timed after the loop. StepCopy.nbytes is
compared with this rank's local parameter + optimizer bytes. A larger size shows how take scales.

    python bench/rewind.py [--sizes 32x4 128x4] [--updates 40] [--warmup 4] [--budget-s 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from _common import model_size, table, write_json

from accelpact.testing.spawn import run_world

WORLD = 2
MIN_UPDATES = 10


def _local_bytes(tensors) -> int:
    return sum(getattr(t, "_local_tensor", t).nbytes for t in tensors)


def worker(rank: int, world: int, sizes: list[tuple[int, int]], updates: int, warmup: int,
           budget_s: float) -> list[dict]:
    import torch
    import torch.distributed as dist

    from accelpact.runtime.snapshot import BoundarySnapshot, StepCopy
    from accelpact.workloads import build_hsdp_job, next_token_loss, seed_everything

    rows = []
    for generation, (dim, layers) in enumerate(sizes):
        seed_everything(0)
        model, optimizer, data = build_hsdp_job("fsdp2", layers=layers, dim=dim, seq_len=16, batch_size=4,
                                                local=world, generation=generation)
        step_copy = StepCopy()
        update_s, capture_s, take_s, first_takes = [], [], [], []
        snapshot = None
        deadline = time.perf_counter() + budget_s
        for index in range(warmup + updates):
            t0 = time.perf_counter()
            snapshot = BoundarySnapshot.capture(data, index)
            t1 = time.perf_counter()
            torch.rand(1)  # the update draws randomness, as dropout would
            next_token_loss(model, data.next_batch()).backward()
            t2 = time.perf_counter()
            step_copy.take(model, optimizer, index)
            t3 = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            t4 = time.perf_counter()
            if index < 2:  # 0: no Adam state yet; 1: buffers for the new state are allocated
                first_takes.append(t3 - t2)
            if index >= warmup:
                capture_s.append(t1 - t0)
                update_s.append((t2 - t1) + (t4 - t3))
                take_s.append(t3 - t2)
            # a shared machine can be slow: stop at the time budget (all ranks alike, outside the timing)
            stop = torch.tensor([int(len(update_s) >= MIN_UPDATES and time.perf_counter() > deadline)])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
        restore_copy_s, restore_snapshot_s = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            step_copy.restore(model, optimizer)
            t1 = time.perf_counter()
            snapshot.restore(data)
            t2 = time.perf_counter()
            restore_copy_s.append(t1 - t0)
            restore_snapshot_s.append(t2 - t1)
        param_bytes = _local_bytes(model.parameters())
        optim_bytes = _local_bytes(t for s in optimizer.state.values() for t in s.values()
                                   if isinstance(t, torch.Tensor))
        rows.append({
            "rank": rank, "dim": dim, "layers": layers, "updates": len(update_s),
            "update_ms_mean": statistics.mean(update_s) * 1e3,
            "update_ms_median": statistics.median(update_s) * 1e3,
            "capture_us_mean": statistics.mean(capture_s) * 1e6,
            "capture_us_median": statistics.median(capture_s) * 1e6,
            "take_us_mean": statistics.mean(take_s) * 1e6,
            "take_us_median": statistics.median(take_s) * 1e6,
            "first_takes_us": [t * 1e6 for t in first_takes],
            "restore_copy_us_median": statistics.median(restore_copy_s) * 1e6,
            "restore_snapshot_us_median": statistics.median(restore_snapshot_s) * 1e6,
            "capture_over_update": statistics.mean(capture_s) / statistics.mean(update_s),
            "take_over_update": statistics.mean(take_s) / statistics.mean(update_s),
            "capture_over_update_median": statistics.median(capture_s) / statistics.median(update_s),
            "take_over_update_median": statistics.median(take_s) / statistics.median(update_s),
            "step_copy_nbytes": step_copy.nbytes,
            "param_bytes": param_bytes,
            "optim_bytes": optim_bytes,
            "nbytes_over_state": step_copy.nbytes / (param_bytes + optim_bytes),
            "step_copy_tensors": len(step_copy._buffers),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=model_size, nargs="+", default=[(32, 4), (128, 4)],
                        help="DIMxLAYERS of the decoder; the first is the tiny job of the tests")
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=8.0,
                        help="per size: stop timing after this long (at least 10 updates), on a busy machine")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    results = run_world(worker, WORLD, args.sizes, args.updates, args.warmup, args.budget_s, timeout_s=300, pg_timeout_s=60)
    rows: list[dict[str, Any]] = [row for per_rank in results for row in per_rank]
    rows.sort(key=lambda r: (r["dim"], r["layers"], r["rank"]))

    setup = (f"FSDP2 fully_shard, mesh 1 x {WORLD} (replicate x shard), {WORLD} ranks, gloo, CPU, "
             f"1 thread per rank; Adam (foreach=False); seq 16, batch 4; up to {args.updates} timed updates "
             f"after {args.warmup} warm-up, {args.budget_s:.0f} s budget per size")
    print(setup)
    print(table(
        ["dim", "L", "rank", "n", "update ms", "capture µs", "capture/upd", "take µs", "take/upd", "(medians)",
         "restore copy µs", "restore snap µs", "copy KiB", "param+opt KiB", "copy/state"],
        [[r["dim"], r["layers"], r["rank"], r["updates"], f"{r['update_ms_mean']:.2f}", f"{r['capture_us_mean']:.1f}",
          f"{r['capture_over_update']:.2%}", f"{r['take_us_mean']:.1f}", f"{r['take_over_update']:.2%}",
          f"{r['capture_over_update_median']:.2%} {r['take_over_update_median']:.2%}",
          f"{r['restore_copy_us_median']:.1f}", f"{r['restore_snapshot_us_median']:.1f}",
          f"{r['step_copy_nbytes'] / 1024:.1f}", f"{(r['param_bytes'] + r['optim_bytes']) / 1024:.1f}",
          f"{r['nbytes_over_state']:.4f}"] for r in rows],
    ))
    print("times are means over the timed updates; ratios are mean extra / mean update, '(medians)' the "
          "same two ratios of medians; update excludes capture and take; copy/state 1.0 = exactly the local "
          "shards")
    elapsed = time.perf_counter() - started
    path = write_json("rewind", {"benchmark": "rewind", "setup": setup, "args": {**vars(args)},
                                 "elapsed_s": elapsed, "rows": rows})
    print(f"wrote {path} ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
