"""Whole-run goodput, three ways side by side (the paper's Tables III/IV, scaled down).

The demo workload (4 ranks under torchrun, FSDP2 HSDP 2x2) runs C + A + 1 + tail updates with one
fault right after update C + A has committed, for each checkpoint age A:

- AccelPact in memory: verified checkpoint every C updates; the fault strikes at the committed
  boundary of update C+A and is repaired in memory (Preserve), zero replay;
- cold restart: the same checkpoints; the fault strikes inside update C+A+1, every rank rejects
  (exit 75), torchrun restarts the job, attach reloads checkpoint C, and A updates are replayed;
- DCP every update: the same model trained by a worker in this file that saves model + optimizer
  with `torch.distributed.checkpoint.async_save` after every update (at most one save in flight;
  RNG and data cursor in a small per-rank file), the same fault and fail-stop, and a restart that
  loads the newest complete DCP checkpoint.

Whole-run time is first trace record → last commit (restarts included); fault-to-frontier as in
bench/restart.py. The speedups are cold / in-memory and DCP / in-memory.

    python bench/goodput.py [--quick] [--ages 3,6,12,18] [--checkpoint-at 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import table, write_json  # (also puts the repository on sys.path)

WORKER = str(Path(__file__).resolve())


# ------------------------------------------------------------------------------ DCP worker -------
def dcp_worker(argv: list[str]) -> int:
    """One rank of the DCP-every-update trainer (run by torchrun through this file)."""
    import datetime
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import accelpact
    from accelpact.checkpoint.appstate import capture_rng_state, restore_rng_state
    from accelpact.workloads import (
        HSDPLayout,
        SyntheticTokens,
        TinyDecoder,
        make_adam,
        stochastic_update,
        wrap_fsdp2,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("--dcp-worker", action="store_true")
    ap.add_argument("--updates", type=int, required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--faults", default="none")
    ap.add_argument("--data-timeout", type=float, default=2.0, help="detection bound, every mode")
    ap.add_argument("--control-timeout", type=float, default=6.0)
    ap.add_argument("--trace-dir", required=True)
    ap.add_argument("--dcp-dir", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args(argv)

    # torchrun keeps its store across restarts: a per-attempt prefix keeps stale peer addresses out
    accelpact.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.control_timeout * 2))
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    layout = HSDPLayout(nodes=dist.get_world_size() // 2, local=2)
    groups = layout.build_groups(timeout=datetime.timedelta(seconds=30))
    model = wrap_fsdp2(TinyDecoder(n_layers=args.layers, seed=args.seed), layout, groups=groups)
    optimizer = make_adam(model)
    data = SyntheticTokens(vocab=64, seq_len=16, batch_size=4, seed=args.seed, shard=rank)
    # DCP plans its writes with collectives from a background thread: a group of its own keeps
    # them apart from the training and control-plane collectives
    ckpt_pg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    faults = "" if args.faults == "none" else args.faults
    rt = accelpact.attach(model, optimizer, data_state=data, config=accelpact.Config(
        data_timeout_s=args.data_timeout, control_timeout_s=args.control_timeout, trace_dir=args.trace_dir),
        faults=faults)
    root = Path(args.dcp_dir)

    newest = [None]
    if rank == 0 and root.exists():
        done = sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / ".metadata").exists())
        newest = [done[-1] if done else None]
    dist.broadcast_object_list(newest, src=0, group=ckpt_pg)
    if newest[0] is not None:
        t = time.perf_counter()
        step_dir = root / f"step-{newest[0]:06d}"
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(step_dir), process_group=ckpt_pg)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        app = torch.load(step_dir / f"app-rank{rank}.pt", weights_only=True)
        data.load_state_dict(app["data"])
        restore_rng_state(app["rng"])
        rt.frontier = rt.opt_step = rt.update_index = newest[0]
        rt.trace.write({"kind": "dcp_restore", "step": newest[0], "seconds": time.perf_counter() - t})

    pending = None
    saves: list[float] = []
    for _ in range(rt.frontier, args.updates):
        with rt.update():
            stochastic_update(model, optimizer, data)  # the demo trainer's update, RNG draws included
        t = time.perf_counter()
        if pending is not None:
            pending.result()  # at most one save in flight, as DCP's async recipe does
        step_dir = root / f"step-{rt.frontier:06d}"
        step_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"data": data.state_dict(), "rng": capture_rng_state()}, step_dir / f"app-rank{rank}.pt")
        msd, osd = get_state_dict(model, optimizer)
        resp = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(step_dir), process_group=ckpt_pg)
        pending = getattr(resp, "upload_completion", resp)
        saves.append(time.perf_counter() - t)
    if pending is not None:
        pending.result()
    rt.trace.write({"kind": "dcp_saves", "median_blocking_s": statistics.median(saves) if saves else None,
                    "count": len(saves)})
    rt.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------ driver ----------
def run_mode(mode: str, base: Path, age: int, c: int, args, spurious: list[str]) -> dict:
    from restart import analyse_run, launch_demo, planned, with_retries

    fault_at = c + age + 1
    updates = fault_at + args.tail
    common = dict(updates=updates, data_timeout=args.data_timeout, control_timeout=args.control_timeout,
                  layers=args.layers, timeout_s=args.job_timeout)
    run_dir = base / f"{mode}-A{age}"

    def once() -> dict:
        if mode == "memory":
            run = launch_demo(run_dir, faults=f"skip@{c + age}:committed:{age % 4}", checkpoint_every=c,
                              max_restarts=0, **common)
        elif mode == "cold":
            run = launch_demo(run_dir, faults=f"skip@{fault_at}:backward:0", checkpoint_every=c,
                              max_restarts=1, **common)
        else:
            run = launch_demo(run_dir, faults=f"skip@{fault_at}:backward:0", checkpoint_every=0, max_restarts=1,
                              worker=[WORKER, "--dcp-worker"], extra=[f"--dcp-dir={run_dir / 'dcp'}"], **common)
        out = analyse_run(run)
        rec = planned(out, c + age, "preserve") if mode == "memory" else planned(out, fault_at, "restart")
        assert out["final_frontier"] == updates, out["final_frontier"]
        if mode == "cold":
            assert rec["restored"] == c and rec["updates_lost"] == age, rec
        out["planned"] = rec
        # failures the load caused on its own: repaired in memory, they add to the whole-run time
        out["spontaneous"] = len(out["recoveries"]) - 1
        return out

    return with_retries(f"{mode} A={age}", once, args.retries, spurious)


def main(argv=None) -> int:
    if argv is None and "--dcp-worker" in sys.argv:
        return dcp_worker(sys.argv[1:])
    from restart import loadavg

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="A = 6 only, checkpoint at 8 (three jobs)")
    ap.add_argument("--ages", default="3,6,12,18")
    ap.add_argument("--checkpoint-at", type=int, default=20, help="C (verified checkpoint every C updates)")
    ap.add_argument("--tail", type=int, default=4, help="updates after the one past the failure frontier")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--data-timeout", type=float, default=2.0, help="detection bound, every mode")
    ap.add_argument("--control-timeout", type=float, default=6.0)
    ap.add_argument("--job-timeout", type=float, default=400.0)
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.ages, args.checkpoint_at = "6", 8
    ages = sorted({int(a) for a in args.ages.split(",")})
    c = args.checkpoint_at
    if c <= max(ages) + 1:
        ap.error(f"C={c} must exceed max(A)+1 so that no second checkpoint lands before the fault")
    base = Path(tempfile.mkdtemp(prefix="accelpact-goodput-"))
    load_before, t0 = loadavg(), time.time()
    spurious: list[str] = []
    runs: dict[int, dict[str, dict]] = {}
    for a in ages:
        runs[a] = {m: run_mode(m, base, a, c, args, spurious) for m in ("memory", "cold", "dcp")}
    load_after = loadavg()

    rows, out = [], {}
    for a in ages:
        m, cold, dcp_ = (runs[a][k] for k in ("memory", "cold", "dcp"))
        f = {k: runs[a][k]["planned"]["f2f_s"] for k in ("memory", "cold", "dcp")}
        w = {k: runs[a][k]["train_span_s"] for k in ("memory", "cold", "dcp")}
        u = {k: runs[a][k]["update_s"] for k in ("memory", "cold", "dcp")}
        lost = {k: runs[a][k]["planned"]["updates_lost"] for k in ("memory", "cold", "dcp")}
        extra = {k: runs[a][k]["spontaneous"] for k in ("memory", "cold", "dcp")}
        rows.append([a, f"{w['memory']:.1f}", f"{w['cold']:.1f}", f"{w['dcp']:.1f}",
                     f"{w['cold'] / w['memory']:.2f}x", f"{w['dcp'] / w['memory']:.2f}x",
                     f"{f['memory']:.2f}", f"{f['cold']:.2f}", f"{f['dcp']:.2f}",
                     f"{f['cold'] / f['memory']:.1f}x", f"{f['dcp'] / f['memory']:.1f}x",
                     f"{lost['memory']}/{lost['cold']}/{lost['dcp']}",
                     f"{u['memory'] * 1e3:.0f}/{u['cold'] * 1e3:.0f}/{u['dcp'] * 1e3:.0f}",
                     f"{extra['memory']}/{extra['cold']}/{extra['dcp']}"])
        out[a] = {"whole_run_s": w, "spontaneous_recoveries": extra, "fault_to_frontier_s": f, "median_update_s": u, "updates_lost": lost,
                  "speedup_whole": {"cold": w["cold"] / w["memory"], "dcp": w["dcp"] / w["memory"]},
                  "speedup_f2f": {"cold": f["cold"] / f["memory"], "dcp": f["dcp"] / f["memory"]},
                  "runs": {"memory": m, "cold": cold, "dcp": dcp_}}
    print(f"whole-run goodput, C={c}, fault right after update C+A, {args.tail} more updates after the one past "
          f"the frontier; data timeout {args.data_timeout}s; 4 ranks FSDP2 HSDP 2x2; load {load_before} -> {load_after}")
    print(table(["A", "mem run s", "cold run s", "dcp run s", "cold/mem", "dcp/mem", "mem f2f", "cold f2f",
                 "dcp f2f", "cold/mem", "dcp/mem", "lost m/c/d", "update ms m/c/d", "extra m/c/d"], rows))
    print("whole run = first trace record -> last commit; f2f = fault -> every rank committed the update past "
          "the failure frontier; lost = committed updates redone; extra = spontaneous recoveries (load)")
    if spurious:
        print(f"{len(spurious)} job(s) re-run after an unplanned failure (loaded machine); see the JSON")
    path = write_json("goodput", {"args": vars(args), "ages": ages, "checkpoint_at": c, "loadavg_before": load_before,
                                  "loadavg_after": load_after, "elapsed_s": time.time() - t0, "results": out,
                                  "spurious": spurious})
    print(f"wrote {path}")
    if args.keep:
        print(f"runs kept in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
