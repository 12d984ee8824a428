"""What the deferred boundary's check costs the training thread, with and without its thread.

`bench/guard.py` compares whole arms, and runs of the same tree a few minutes apart differed by
up to 150 µs of own CPU on this machine: too coarse for a change of that size. Here one world
runs deferred boundaries only, and the arms alternate in blocks inside it, so drift hits all
alike:

- thread: the runtime as shipped (the check posted, waited for and read on `check_thread`'s thread);
- inline: the same check run on the training thread (post at the boundary, wait and read at
  settle), as it was before the thread.

The figure is the training thread's CPU per update minus the update body's (the `own CPU` of
`bench/guard.py`), median per rank, with the load beside it.

    python bench/deferred_check.py [--updates 300] [--nproc 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import TimedUpdate, median, table, write_json

from accelpact.testing.spawn import run_world

ARMS = ("thread", "inline")


class InlineChecks:
    """The check on the training thread: the `CheckThread` interface, run where it is called."""

    def __init__(self, rt):
        self.rt, self.works, self.issued = rt, {}, 0

    def start(self, flag: int, arrived: float) -> int:
        self.issued += 1
        self.works[self.issued] = self.rt.stragglers.post(flag, arrived)
        return self.issued

    def result(self, ticket: int, control_timeout_s: float) -> int:
        return self.rt.stragglers.settle(self.works.pop(ticket))

    def close(self) -> None:
        pass


def worker(rank: int, world: int, updates: int, block: int) -> dict:
    import accelpact
    from accelpact.workloads import build_hsdp_job

    model, opt, data = build_hsdp_job("fsdp2", layers=4, dim=64, seed=1, seq_len=32, batch_size=8)
    rt = accelpact.attach(model, opt, data_state=data, config=accelpact.Config(
        data_timeout_s=10, control_timeout_s=60, envelope="permissive", boundary="deferred"))
    step = TimedUpdate(model, opt, data)  # its thread CPU is subtracted from the arm's

    rt.step(step)  # the first deferred boundary starts the check's thread
    threaded, inline = rt.deferral.checks, InlineChecks(rt)
    own: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for b in range(-(-updates // block) + len(ARMS)):  # the first round warms up
        arm = ARMS[b % len(ARMS)]
        rt.settle()  # the boundary in flight is settled by the arm that posted it
        rt.deferral.checks = inline if arm == "inline" else threaded
        for i in range(block):
            step.cpu_s, c0 = 0.0, time.thread_time()
            rt.step(step)
            if b >= len(ARMS) and i > 0:  # the block's first update settles the previous arm's boundary
                own[arm].append(time.thread_time() - c0 - step.cpu_s)
    rt.settle()
    rt.deferral.checks = threaded
    rt.close()
    return {arm: median(v) for arm, v in own.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=300, help="counted updates in all, over every arm")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--block", type=int, default=4, help="consecutive updates per arm")
    args = ap.parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = run_world(worker, args.nproc, args.updates, args.block, timeout_s=600, pg_timeout_s=60)
    load_after = [round(x, 2) for x in os.getloadavg()]
    print(f"deferred boundaries (fsdp2, dim 64, 4 layers, {args.nproc} ranks, {os.cpu_count()} cores), "
          f"load {load_before} -> {load_after}")
    print(table(["rank"] + [f"{arm} µs" for arm in ARMS],
                [[r] + [f"{got[arm] * 1e6:.0f}" for arm in ARMS] for r, got in enumerate(results)]))
    med = {arm: median([got[arm] for got in results]) for arm in ARMS}
    print(f"median over ranks: own CPU on the training thread {med['thread'] * 1e6:.0f} µs per update with the "
          f"check on its thread, {med['inline'] * 1e6:.0f} µs with it inline "
          f"({(med['inline'] - med['thread']) * 1e6:+.0f} µs off the training thread)")
    path = write_json(f"deferred-check-{args.nproc}r", {"args": vars(args), "load_before": load_before,
                                                         "load_after": load_after, "median_s": med,
                                                         "ranks": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
