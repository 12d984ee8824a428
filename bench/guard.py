"""Per-update cost of the committed boundary, measured in paired runs beside its floor.

One world trains the same model; updates rotate between four arms, so drift and noise hit every
arm alike:

- plain: the update alone;
- floor: the update plus one bare all-reduce of the boundary's tensor (1 + 2W int64) on a gloo
  group of its own: what any per-update agreement over a collective costs on this machine;
- update: `with rt.update():` (health probe of every data-plane group + the boundary check);
- step: `rt.step(fn)` (the same boundary, plus the Rewind snapshot of RNG and data cursor);
- deferred: `rt.step(fn)` with `Config.boundary = "deferred"`: the flag is posted without
  waiting and agreed before the next update's optimizer step, and the probes are left out.

Arms rotate in blocks of `--block` updates; the first update of every block is not counted (it
settles what the previous block left in flight).

The last column is AccelPact's own CPU on the training thread per update (thread CPU time of
the arm minus that of the update body): the part of the cost that does not depend on how the
machine schedules the ranks, and what remains on a node with a core to spare per rank, where the
collectives' own threads do not take the training thread's core.

Each cost is a difference of medians against plain, printed as a ratio and scaled to a 100 ms
update (the DESIGN goal: ≤ 0.5 %), with the load average beside it: on an oversubscribed machine
(more ranks than cores) every collective waits for descheduled peers, and the floor shows it.

    python bench/guard.py [--updates 200] [--nproc 4] [--dim 64] [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _common import TimedUpdate, median, table, write_json

from accelpact.testing.spawn import run_world

ARMS = ("plain", "floor", "update", "step", "deferred")


def worker(rank: int, world: int, updates: int, dim: int, layers: int, framework: str, block: int) -> dict:
    import torch
    import torch.distributed as dist

    import accelpact
    from accelpact.workloads import build_hsdp_job

    floor_group = dist.new_group(backend="gloo")  # before attach: the same creation order everywhere
    floor_flag = torch.zeros(1 + 2 * world, dtype=torch.int64)
    model, opt, data = build_hsdp_job(framework, layers=layers, dim=dim, seed=1, seq_len=32, batch_size=8)
    rt = accelpact.attach(model, opt, data_state=data,
                          config=accelpact.Config(data_timeout_s=10, control_timeout_s=60, envelope="permissive"))

    step = TimedUpdate(model, opt, data)  # its thread CPU is subtracted from the arm's

    def floor():
        step()
        dist.all_reduce(floor_flag, op=dist.ReduceOp.MAX, group=floor_group)

    def update():
        with rt.update():
            step()

    def deferred():
        rt.config.boundary = "deferred"
        rt.step(step)
        rt.config.boundary = "sync"

    run = {"plain": step, "floor": floor, "update": update, "step": lambda: rt.step(step), "deferred": deferred}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    own_cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    blocks = -(-updates // block) + len(ARMS)  # the first round warms up
    for b in range(blocks):
        arm = ARMS[b % len(ARMS)]
        for i in range(block):
            step.cpu_s = 0.0
            c0, t0 = time.thread_time(), time.perf_counter()
            run[arm]()
            if b >= len(ARMS) and i > 0:
                times[arm].append(time.perf_counter() - t0)
                own_cpu[arm].append(time.thread_time() - c0 - step.cpu_s)
    rt.close()
    return {"times": times, "own_cpu": own_cpu}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=200, help="counted updates in all, over every arm")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--framework", default="fsdp2")
    ap.add_argument("--block", type=int, default=4, help="consecutive updates per arm")
    args = ap.parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = run_world(worker, args.nproc, args.updates, args.dim, args.layers, args.framework, args.block,
                        timeout_s=600, pg_timeout_s=60)
    load_after = [round(x, 2) for x in os.getloadavg()]
    rows, out = [], []
    for r, got in enumerate(results):
        res, cpu = got["times"], got["own_cpu"]
        med = {arm: median(res[arm]) for arm in ARMS}
        p = med["plain"]
        row = [r, f"{p * 1e3:.2f}"]
        for arm in ARMS[1:]:
            row += [f"{(med[arm] - p) * 1e3:+.2f}", f"{med[arm] / p:.4f}"]
        rows.append(row)
        row.append(" / ".join(f"{median(cpu[arm]) * 1e6:.0f}" for arm in ("update", "step", "deferred")))
        out.append({"rank": r, **{f"{arm}_s": med[arm] for arm in ARMS},
                    **{f"{arm}_own_cpu_s": median(cpu[arm]) for arm in ARMS[2:]}})
    print(f"paired updates ({args.framework}, dim {args.dim}, {args.layers} layers, {args.nproc} ranks, "
          f"~{args.updates * (args.block - 1) // (args.block * len(ARMS))} per arm, {os.cpu_count()} cores), load {load_before} -> {load_after}")
    print(table(["rank", "plain ms"] + [h for arm in ARMS[1:] for h in (f"{arm} +ms", "ratio")]
                + ["own CPU µs update/step/deferred"], rows))
    floor = median([o["floor_s"] - o["plain_s"] for o in out])
    for arm in ("step", "deferred"):
        cost = median([o[f"{arm}_s"] - o["plain_s"] for o in out])
        ratio = median([o[f"{arm}_s"] / o["plain_s"] for o in out])
        print(f"median over ranks: {arm} costs {cost * 1e3:+.2f} ms per update (ratio {ratio:.4f}); one bare "
              f"collective {floor * 1e3:+.2f} ms (the floor)")
    plain = median([o["plain_s"] for o in out])
    for arm in ("step", "deferred"):
        own = median([o[f"{arm}_own_cpu_s"] for o in out])
        print(f"median over ranks: {arm}'s own CPU on the training thread {own * 1e6:.0f} µs per update "
              f"({own / plain * 100:.2f} % of this update; {own / 0.100 * 100:.2f} % of a 100 ms one)")
    path = write_json(f"guard-{args.nproc}r", {"args": vars(args), "load_before": load_before,
                                               "load_after": load_after, "ranks": out})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
