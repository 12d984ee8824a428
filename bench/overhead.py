"""Per-update cost of protection, as ratios to plain training on the same model.

One world of R data-parallel replicas (one rank each) holds one copy of the same decoder per arm
and runs the arms in rotating blocks of updates, so load drift on a shared machine hits every arm
alike:

- plain:     DDP, nothing else (the reference, ratio 1);
- accelpact: the same DDP model inside `with rt.update():` (boundary health check + control-plane
             check every update);
- plain-flat: backward + one flat gloo all-reduce of the gradients + step (torchft's own baseline);
- torchft:   the flat loop under `torchft.Manager` (start_quorum, manager.allreduce, should_commit);
- dcp-async: DDP + `torch.distributed.checkpoint.async_save` of model + optimizer after every
             update, at most one save in flight (the wait for the previous one is charged to the
             arm, and so is the final drain of each block).

A block's cost is its wall time over its updates; each arm's ratio is the median over rounds of
its block time over the plain block of the same round.

    python bench/overhead.py [--quick] [--rounds 12] [--block 10] [--dim 32] [--layers 2]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import table, write_json
from torchft_peer import build, flat_grads, plain_flat_step, unflatten_into_grads

from accelpact.testing.spawn import run_world

ARMS = ("plain", "accelpact", "plain-flat", "torchft", "dcp-async")


def worker(rank: int, world: int, cfg: dict) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import accelpact
    from accelpact.workloads import HSDPLayout, make_adam, next_token_loss, wrap_ddp

    layout = HSDPLayout(nodes=world, local=1)
    timeout = datetime.timedelta(seconds=30)

    def ddp_copy(generation: int):
        model, _, data = build(cfg, rank)
        ddp = wrap_ddp(model, layout, groups=layout.build_groups(timeout=timeout, generation=generation))
        return ddp, make_adam(ddp), data

    def ddp_step(model, optimizer, data) -> None:
        next_token_loss(model, data.next_batch()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    arms: dict = {}
    m, o, d = ddp_copy(0)
    arms["plain"] = lambda m=m, o=o, d=d: ddp_step(m, o, d)
    m, o, d = ddp_copy(1)
    rt = accelpact.attach(m, o, data_state=d, config=accelpact.Config(data_timeout_s=cfg["timeout"],
                                                                     control_timeout_s=cfg["timeout"] * 6 + 2))

    def guarded(m=m, o=o, d=d) -> None:
        with rt.update():
            ddp_step(m, o, d)

    arms["accelpact"] = guarded
    m, o, d = build(cfg, rank)
    arms["plain-flat"] = lambda m=m, o=o, d=d: plain_flat_step(m, o, d.next_batch(), world)

    manager = None
    if cfg["lighthouse"]:
        from torchft import Manager, ProcessGroupGloo

        m, o, d = build(cfg, rank)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ft_timeout = datetime.timedelta(seconds=cfg["timeout"])
        manager = Manager(
            pg=ProcessGroupGloo(timeout=ft_timeout), min_replica_size=world,
            load_state_dict=lambda sd, m=m, o=o: (m.load_state_dict(sd["model"]), o.load_state_dict(sd["optim"])),
            state_dict=lambda m=m, o=o: {"model": m.state_dict(), "optim": o.state_dict()},
            replica_id=f"replica_{rank}", rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
            lighthouse_addr=cfg["lighthouse"], timeout=ft_timeout, quorum_timeout=datetime.timedelta(seconds=30),
            connect_timeout=datetime.timedelta(seconds=10), use_async_quorum=False, init_sync=False,
        )

        def managed(m=m, o=o, d=d) -> None:
            manager.start_quorum()
            next_token_loss(m, d.next_batch()).backward()
            flat = flat_grads(m)
            manager.allreduce(flat).wait()
            if manager.should_commit():
                unflatten_into_grads(m, flat)
                o.step()
            o.zero_grad(set_to_none=True)

        arms["torchft"] = managed

    m, o, d = ddp_copy(2)
    ckpt_pg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    root = Path(cfg["dcp_dir"])
    pending: list = []
    saved = [0]

    def with_dcp(m=m, o=o, d=d) -> None:
        ddp_step(m, o, d)
        if pending:
            pending.pop().result()
            old = root / f"step-{saved[0] - 2:06d}"
            if rank == 0 and old.exists():
                shutil.rmtree(old, ignore_errors=True)
        saved[0] += 1
        msd, osd = get_state_dict(m, o)
        resp = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(root / f"step-{saved[0]:06d}"),
                              process_group=ckpt_pg)
        pending.append(getattr(resp, "upload_completion", resp))

    def drain() -> None:
        if pending:
            pending.pop().result()

    arms["dcp-async"] = with_dcp
    names = [a for a in ARMS if a in arms]
    for name in names:  # warm-up: first iterations pay lazy initialisation
        for _ in range(cfg["warmup"]):
            arms[name]()
        drain()
    dist.barrier()
    blocks: dict[str, list[float]] = {a: [] for a in names}
    for rnd in range(cfg["rounds"]):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            t0 = time.perf_counter()
            for _ in range(cfg["block"]):
                arms[name]()
            if name == "dcp-async":
                drain()
            blocks[name].append((time.perf_counter() - t0) / cfg["block"])
    rt.close()
    if manager is not None:
        manager.shutdown(wait=False)
    return {"rank": rank, "blocks": blocks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="5 rounds of 6-update blocks (under a minute)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--dim", type=int, default=32, help="decoder width (the demo's is 32)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=2.0, help="collective timeout of every protected arm")
    ap.add_argument("--no-torchft", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.block = 5, 6
    dcp_dir = tempfile.mkdtemp(prefix="accelpact-overhead-dcp-")
    cfg = {"seed": 7, "layers": args.layers, "dim": args.dim, "seq_len": 8, "batch": 2, "timeout": args.timeout,
           "rounds": args.rounds, "block": args.block, "warmup": 3, "dcp_dir": dcp_dir, "lighthouse": None}
    lighthouse, tft_note = None, "not measured (--no-torchft)"
    if not args.no_torchft:
        if importlib.util.find_spec("torchft") is None:
            tft_note = "not measured: torchft is not installed (pip install torchft==0.2.0 --no-deps ...)"
        else:
            os.environ.setdefault("RUST_LOG", "warn")
            from torchft._torchft import LighthouseServer

            lighthouse = LighthouseServer(bind="[::]:0", min_replicas=args.replicas)
            cfg["lighthouse"] = lighthouse.address()
            tft_note = "torchft 0.2.0, min_replica_size=replicas, synchronous quorum, lighthouse defaults"
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.time()
    try:
        res = run_world(worker, args.replicas, cfg, timeout_s=300 + 20 * args.rounds, pg_timeout_s=60,
                        env={"RUST_LOG": os.environ.get("RUST_LOG", "warn")})
    finally:
        if lighthouse is not None:
            lighthouse.shutdown()
        shutil.rmtree(dcp_dir, ignore_errors=True)
    load_after = [round(x, 2) for x in os.getloadavg()]
    names = [a for a in ARMS if a in res[0]["blocks"]]
    # per round, the slowest rank's block time (ranks run in lock step through the collectives)
    per_round = {a: [max(r["blocks"][a][i] for r in res) for i in range(args.rounds)] for a in names}
    rows, out = [], {}
    for a in names:
        ratios = [x / p for x, p in zip(per_round[a], per_round["plain"])]
        flat_ratios = [x / p for x, p in zip(per_round[a], per_round["plain-flat"])]
        med = statistics.median(per_round[a])
        out[a] = {"update_s": med, "ratio_to_plain": statistics.median(ratios),
                  "ratio_to_plain_flat": statistics.median(flat_ratios), "rounds_s": per_round[a]}
        rows.append([a, f"{med * 1e3:.2f}", f"{(med - statistics.median(per_round['plain'])) * 1e3:+.2f}",
                     f"{statistics.median(ratios):.3f}", f"{min(ratios):.3f}-{max(ratios):.3f}",
                     f"{statistics.median(flat_ratios):.3f}"])
    print(f"per-update cost of protection: {args.replicas} replicas, decoder dim {args.dim} x {args.layers} layers, "
          f"{args.rounds} rounds x {args.block}-update blocks, rotating order; load {load_before} -> {load_after}")
    print(table(["arm", "ms/update", "added ms", "x plain (DDP)", "range", "x plain-flat"], rows))
    print(f"torchft: {tft_note}; AccelPact/torchft collective timeout {args.timeout}s; "
          "dcp-async: model + Adam state every update to local disk, one save in flight")
    path = write_json("overhead", {"args": vars(args), "loadavg_before": load_before, "loadavg_after": load_after,
                                   "elapsed_s": time.time() - t0, "torchft": tft_note, "arms": out})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
