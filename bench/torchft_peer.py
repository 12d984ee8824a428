"""Peer comparison: torchft 0.2.0 and AccelPact on the same tiny model and the same transient fault.

Both systems train the same decoder (2 layers, dim 32, Adam) as R pure data-parallel replicas of
one rank each, on the same data, with the same collective timeout T. The fault is the same too: one
replica stalls past the timeout (T + 0.5 s) and then returns, at update X.

- torchft (PyPI torchft==0.2.0, lighthouse and manager servers from its wheel): each replica is a
  replica group of one rank with its own store and a `torchft.Manager` over a reconfigurable
  `torchft.ProcessGroupGloo`; every update runs start_quorum → backward → one flat
  `manager.allreduce` of the gradients (its DDP wrapper crashes the survivor on 0.2.0) →
  should_commit → optimizer step. A failed commit discards the update, which is retried with the
  same batch. The stall happens before the allreduce of update X.
- AccelPact: DDP over the same replicas, `accelpact.attach`, fault `late@X:committed:r` (the rank
  arrives at the boundary's collective after the timeout): the group is repaired in memory. Its
  per-update cost is measured twice: the default synchronous boundary (`with rt.update()`), and
  the opt-in deferred one (`Config(boundary="deferred")`, `rt.step`), whose flag overlaps the
  next update.

Measured per system: per-update cost against plain gloo on the same model (torchft: flat
all-reduce on a plain gloo group, in paired, alternating updates; AccelPact: a DDP model of its own
that attach never saw, in alternating blocks, `accelpact_cost_worker`); time from the fault to the next committed update on every replica; updates
lost (discarded); final state (parameters and Adam state) bitwise against an uninterrupted run of
the same loop, and across replicas.

    python bench/torchft_peer.py [--quick] [--replicas 2] [--timeout 1.0]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import os
import sys
import tempfile
import time

from _common import median, table, write_json

from accelpact.testing.spawn import WorldError, run_world

LATE_MARGIN_S = 0.5  # as accelpact.faults.inject: how far past the timeout the stalled replica returns


# ------------------------------------------------------------------------------ shared ----------
def build(cfg: dict, rank: int):
    import random

    import numpy as np
    import torch

    from accelpact.workloads import SyntheticTokens, TinyDecoder, make_adam

    torch.manual_seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    random.seed(cfg["seed"])
    model = TinyDecoder(dim=cfg.get("dim", 32), n_layers=cfg["layers"], seed=cfg["seed"])
    data = SyntheticTokens(vocab=64, seq_len=cfg["seq_len"], batch_size=cfg["batch"], seed=cfg["seed"], shard=rank)
    return model, make_adam(model), data


def flat_grads(model):
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def unflatten_into_grads(model, flat) -> None:
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p))
        offset += n


def state_digest(model, optimizer) -> tuple[str, dict]:
    """A hash of parameters + optimizer state (for cross-replica equality) and the tensors."""
    import torch

    tensors = {f"param.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, st in enumerate(optimizer.state_dict()["state"].values()):
        for k, v in st.items():
            tensors[f"opt.{i}.{k}"] = v.detach().clone() if isinstance(v, torch.Tensor) else torch.tensor(v)
    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest(), tensors


def bitwise_equal(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def plain_flat_step(model, optimizer, tokens, world: int) -> None:
    import torch.distributed as dist

    from accelpact.workloads import next_token_loss

    next_token_loss(model, tokens).backward()
    flat = flat_grads(model)
    dist.all_reduce(flat)
    flat /= world
    unflatten_into_grads(model, flat)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------ torchft ---------
def torchft_worker(rank: int, world: int, cfg: dict) -> dict:
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    from accelpact.workloads import next_token_loss

    timeout = datetime.timedelta(seconds=cfg["timeout"])
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this replica group's
    holder: dict = {}

    def save_state() -> dict:
        return {"model": holder["model"].state_dict(), "optim": holder["optim"].state_dict()}

    def load_state(sd: dict) -> None:
        holder["model"].load_state_dict(sd["model"])
        holder["optim"].load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=cfg["min_replicas"], load_state_dict=load_state,
        state_dict=save_state, replica_id=f"replica_{rank}", rank=0, world_size=1, store_addr="127.0.0.1",
        store_port=store.port, lighthouse_addr=cfg["lighthouse"], timeout=timeout,
        quorum_timeout=datetime.timedelta(seconds=cfg["quorum_timeout"]),
        connect_timeout=datetime.timedelta(seconds=10), use_async_quorum=cfg["async_quorum"], init_sync=False,
    )

    def managed_step(model, optimizer, tokens, stall_s: float = 0.0, mark: list | None = None) -> bool:
        manager.start_quorum()
        next_token_loss(model, tokens).backward()
        flat = flat_grads(model)
        if stall_s:
            if mark is not None:
                mark.append(time.time())
            time.sleep(stall_s)  # the transient fault: stall past the collective timeout, then return
        manager.allreduce(flat).wait()
        ok = manager.should_commit()
        if ok:
            unflatten_into_grads(model, flat)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return ok

    # 1. per-update cost: alternate plain and managed updates on two copies of the model
    mp, op, dp = build(cfg, rank)
    mm, om, dm = build(cfg, rank)
    holder.update(model=mm, optim=om)
    plain, managed, managed_fail = [], [], 0
    for i in range(2 * (cfg["pairs"] + cfg["warmup"])):
        t0 = time.perf_counter()
        if i % 2:
            ok = managed_step(mm, om, dm.next_batch())
            managed_fail += not ok
            dt = time.perf_counter() - t0
            if i >= 2 * cfg["warmup"]:
                managed.append(dt)
        else:
            plain_flat_step(mp, op, dp.next_batch(), world)
            if i >= 2 * cfg["warmup"]:
                plain.append(time.perf_counter() - t0)
    dist.barrier()

    # 2. the fault: replica `fault_rank` stalls before the all-reduce of update X
    model, optimizer, data = build(cfg, rank)
    holder.update(model=model, optim=optimizer)
    committed, log, mark, fired = 0, [], [], False
    while committed < cfg["updates"] and len(log) < 3 * cfg["updates"]:
        stall = 0.0
        if rank == cfg["fault_rank"] and committed + 1 == cfg["fault_at"] and not fired:
            stall, fired = cfg["timeout"] + LATE_MARGIN_S, True
        t0 = time.time()
        ok = managed_step(model, optimizer, data.batch_at(committed), stall, mark)
        log.append({"update": committed + 1, "ok": ok, "t_start": t0, "t_end": time.time(), "stalled": bool(stall)})
        committed += ok
    digest, final = state_digest(model, optimizer)
    manager_step = manager.current_step()
    dist.barrier()

    # 3. the uninterrupted reference: the same loop on plain gloo
    model, optimizer, data = build(cfg, rank)
    for u in range(cfg["updates"]):
        plain_flat_step(model, optimizer, data.batch_at(u), world)
    ref_digest, ref = state_digest(model, optimizer)
    manager.shutdown(wait=False)
    return {"rank": rank, "plain_s": plain, "managed_s": managed, "managed_failed_commits": managed_fail,
            "log": log, "fault_t": mark[0] if mark else None, "digest": digest, "ref_digest": ref_digest,
            "equal_to_reference": bitwise_equal(final, ref), "committed": committed, "manager_step": manager_step}


# ------------------------------------------------------------------------------ AccelPact -------
def _accelpact_model(cfg: dict, rank: int, world: int, generation: int = 0):
    from accelpact.workloads import HSDPLayout, make_adam, wrap_ddp

    model, _, data = build(cfg, rank)
    layout = HSDPLayout(nodes=world, local=1)  # one rank per node: DDP over all replicas
    groups = layout.build_groups(timeout=datetime.timedelta(seconds=30), generation=generation)
    ddp = wrap_ddp(model, layout, groups=groups)
    return ddp, make_adam(ddp), data


def _ddp_step(model, optimizer, tokens) -> None:
    from accelpact.workloads import next_token_loss

    next_token_loss(model, tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def accelpact_cost_worker(rank: int, world: int, cfg: dict) -> dict:
    """Blocks of plain and of guarded updates (bench/guard.py's method). Plain runs on a model of
    its own that AccelPact never saw: attach installs DDP hooks a Rewind needs (their cost is
    AccelPact's, not the baseline's). The first update of every block is not counted, and a
    deferred block's last check is settled before the next block starts: no arm's update runs
    beside another arm's boundary (alternating single updates charged the deferred check's
    thread to the plain update after it)."""
    import accelpact

    model, optimizer, data = _accelpact_model(cfg, rank, world)
    deferred = cfg.get("boundary") == "deferred"  # rt.step under a Rewind envelope: the flag overlaps the next update
    rt = accelpact.attach(model, optimizer, data_state=data, config=accelpact.Config(
        data_timeout_s=cfg["timeout"], control_timeout_s=cfg["control_timeout"],
        **({"boundary": "deferred", "envelope": "permissive"} if deferred else {})))
    watched = sorted(rt.data_plane.groups)
    bare, bare_opt, bare_data = _accelpact_model(cfg, rank, world, generation=500)  # after attach: never seen by it
    assert sorted(rt.data_plane.groups) == watched, "the plain model's groups must not join the guarded boundary"
    block = cfg["block"]
    plain, guarded = [], []
    per_arm = -(-cfg["pairs"] // (block - 1))
    for b in range(2 * (per_arm + 1)):  # the first block of each arm warms up
        arm = "guarded" if b % 2 else "plain"
        for i in range(block):
            t0 = time.perf_counter()
            if arm == "plain":
                _ddp_step(bare, bare_opt, bare_data.next_batch())
            elif deferred:
                rt.step(lambda: _ddp_step(model, optimizer, data.next_batch()))
            else:
                with rt.update():
                    _ddp_step(model, optimizer, data.next_batch())
            if b >= 2 and i > 0:
                (plain if arm == "plain" else guarded).append(time.perf_counter() - t0)
        if arm == "guarded":
            rt.settle()  # the block's last deferred boundary, agreed before plain runs (not counted)
    rt.close()
    return {"rank": rank, "plain_s": plain, "guarded_s": guarded}


def accelpact_fault_worker(rank: int, world: int, cfg: dict) -> dict:
    import accelpact

    model, optimizer, data = _accelpact_model(cfg, rank, world)
    faults = f"late@{cfg['fault_at']}:committed:{cfg['fault_rank']}"
    rt = accelpact.attach(model, optimizer, data_state=data, config=accelpact.Config(
        data_timeout_s=cfg["timeout"], control_timeout_s=cfg["control_timeout"], trace_dir=cfg["trace_dir"],
        on_reject="raise"), faults=faults)
    for _ in range(cfg["updates"]):
        with rt.update():
            _ddp_step(model, optimizer, data.next_batch())
    digest, final = state_digest(model.module, optimizer)
    history = [r.to_dict() for r in rt.history]
    frontier = rt.frontier
    rt.close()
    model, optimizer, data = _accelpact_model(cfg, rank, world, generation=1000)
    for _ in range(cfg["updates"]):
        _ddp_step(model, optimizer, data.next_batch())
    ref_digest, ref = state_digest(model.module, optimizer)
    return {"rank": rank, "history": history, "frontier": frontier, "digest": digest, "ref_digest": ref_digest,
            "equal_to_reference": bitwise_equal(final, ref)}


# ------------------------------------------------------------------------------ driver ----------
def run_torchft(cfg: dict, world: int) -> dict:
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers log every quorum at INFO
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=cfg["min_replicas"],
                                  join_timeout_ms=cfg["join_timeout_ms"], quorum_tick_ms=cfg["quorum_tick_ms"],
                                  heartbeat_timeout_ms=cfg["heartbeat_timeout_ms"])
    try:
        res = run_world(torchft_worker, world, {**cfg, "lighthouse": lighthouse.address()},
                        timeout_s=cfg["world_timeout"], pg_timeout_s=60, env={"RUST_LOG": os.environ["RUST_LOG"]})
    finally:
        lighthouse.shutdown()
    fault_t = next(r["fault_t"] for r in res if r["fault_t"] is not None)
    firsts = []
    for r in res:
        after = [e for e in r["log"] if e["ok"] and e["t_end"] > fault_t]
        firsts.append(after[0]["t_end"] if after else float("nan"))
    lost = max(sum(not e["ok"] for e in r["log"]) for r in res)
    plain = median([x for r in res for x in r["plain_s"]])
    managed = median([x for r in res for x in r["managed_s"]])
    return {
        "plain_s": plain, "protected_s": managed, "ratio": managed / plain, "added_ms": (managed - plain) * 1e3,
        "fault_to_commit_s": max(firsts) - fault_t, "updates_lost": lost,
        "failed_commits_without_fault": sum(r["managed_failed_commits"] for r in res),
        "equal_to_reference": all(r["equal_to_reference"] for r in res),
        "replicas_equal": len({r["digest"] for r in res}) == 1,
        "committed": [r["committed"] for r in res], "logs": [r["log"] for r in res],
    }


def run_accelpact(cfg: dict, world: int) -> dict:
    from accelpact.run_report import load_traces, summarize

    cost = run_world(accelpact_cost_worker, world, cfg, timeout_s=cfg["world_timeout"], pg_timeout_s=60)
    trace_dir = tempfile.mkdtemp(prefix="accelpact-peer-")
    res = run_world(accelpact_fault_worker, world, {**cfg, "trace_dir": trace_dir},
                    timeout_s=cfg["world_timeout"], pg_timeout_s=60)
    summary = summarize(load_traces(trace_dir))
    rec = summary.recoveries[0]
    plain = median([x for r in cost for x in r["plain_s"]])
    guarded = median([x for r in cost for x in r["guarded_s"]])
    deferred = run_world(accelpact_cost_worker, world, {**cfg, "boundary": "deferred"}, timeout_s=cfg["world_timeout"],
                         pg_timeout_s=60)
    d_plain = median([x for r in deferred for x in r["plain_s"]])
    d_guarded = median([x for r in deferred for x in r["guarded_s"]])
    return {
        "deferred": {"plain_s": d_plain, "protected_s": d_guarded, "ratio": d_guarded / d_plain,
                     "added_ms": (d_guarded - d_plain) * 1e3},
        "plain_s": plain, "protected_s": guarded, "ratio": guarded / plain, "added_ms": (guarded - plain) * 1e3,
        "fault_to_commit_s": rec.fault_to_frontier_s, "updates_lost": rec.updates_lost, "action": rec.action,
        "detect_s": rec.detect_s, "repair_s": rec.repair_s,
        "equal_to_reference": all(r["equal_to_reference"] for r in res),
        "replicas_equal": len({r["digest"] for r in res}) == 1, "frontier": [r["frontier"] for r in res],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="10 pairs, 8 updates (about a minute)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1.0, help="collective timeout T, both systems")
    ap.add_argument("--pairs", type=int, default=40, help="counted updates per arm for the per-update cost")
    ap.add_argument("--block", type=int, default=4,
                    help="AccelPact's arms run in blocks of this many updates, the first of each not counted")
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--fault-at", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--async-quorum", action="store_true", help="torchft: overlap the quorum with forward")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.updates, args.fault_at = 10, 8, 4
    try:
        version = importlib.metadata.version("torchft")
        import torch
        import torchft  # noqa: F401
    except Exception as exc:  # pragma: no cover - reported, not hidden
        print(f"torchft is not usable here: {type(exc).__name__}: {exc}\n"
              "install it for this benchmark only (`make bench` does): pip install --no-deps torchft==0.2.0 "
              "&& pip install opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp-proto-http "
              "(torchft's own pins would replace torch; the exporter needs its dependencies)")
        return 2
    world = args.replicas
    cfg = {
        "seed": 7, "layers": args.layers, "seq_len": 8, "batch": 2, "timeout": args.timeout,
        "control_timeout": args.timeout * 6 + 2, "pairs": args.pairs, "block": args.block, "warmup": 3,
        "updates": args.updates,
        "fault_at": args.fault_at, "fault_rank": world - 1, "min_replicas": world,
        "quorum_timeout": 30.0, "async_quorum": args.async_quorum,
        # lighthouse: torchft_lighthouse's defaults except the join timeout, which only matters
        # when a replica is missing (ours return after a stall)
        "join_timeout_ms": 60000, "quorum_tick_ms": 100, "heartbeat_timeout_ms": 5000,
        "world_timeout": 300 + args.pairs,
    }
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.time()
    results = {}
    for name, fn in (("accelpact", run_accelpact), ("torchft", run_torchft)):
        try:
            results[name] = fn(cfg, world)
        except WorldError as exc:
            results[name] = {"error": str(exc)[-3000:]}
            print(f"{name}: the world failed:\n{str(exc)[-1500:]}")
    load_after = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name] + ["failed"] * 8)
            continue
        rows.append([name, f"{r['plain_s'] * 1e3:.2f}", f"{r['protected_s'] * 1e3:.2f}", f"{r['added_ms']:+.2f}",
                     f"{r['ratio']:.3f}", f"{r['fault_to_commit_s']:.3f}", r["updates_lost"],
                     "yes" if r["equal_to_reference"] else "NO", "yes" if r["replicas_equal"] else "NO"])
        if "deferred" in r:  # the opt-in deferred boundary (Config.boundary): its per-update cost only
            d = r["deferred"]
            rows.append([f"{name} (deferred)", f"{d['plain_s'] * 1e3:.2f}", f"{d['protected_s'] * 1e3:.2f}",
                         f"{d['added_ms']:+.2f}", f"{d['ratio']:.3f}", "-", "-", "-", "-"])
    print(f"peer comparison: {world} replicas x 1 rank, {args.layers}-layer decoder, collective timeout {args.timeout}s, "
          f"stall {args.timeout + LATE_MARGIN_S}s at update {args.fault_at}; torch {torch.__version__}, torchft {version}; "
          f"load {load_before} -> {load_after}")
    print(table(["system", "plain ms", "protected ms", "added ms", "ratio", "fault->commit s", "updates lost",
                 "bitwise = ref", "replicas equal"], rows))
    if "accelpact" in results and "error" not in results["accelpact"] and "torchft" in results \
            and "error" not in results["torchft"]:
        a, t = results["accelpact"], results["torchft"]
        print(f"\nfault -> next commit: torchft / AccelPact = {t['fault_to_commit_s'] / a['fault_to_commit_s']:.2f}; "
              f"added per update: torchft {t['added_ms']:.2f} ms vs AccelPact {a['added_ms']:.2f} ms "
              f"(deferred boundary {a['deferred']['added_ms']:.2f} ms)")
    print("settings: AccelPact data timeout = torchft Manager/ProcessGroupGloo timeout = T; torchft "
          f"min_replica_size={world}, use_async_quorum={args.async_quorum}, lighthouse quorum_tick "
          f"{cfg['quorum_tick_ms']} ms, heartbeat timeout {cfg['heartbeat_timeout_ms']} ms")
    path = write_json("torchft_peer", {"args": vars(args), "settings": cfg, "torch": torch.__version__,
                                       "torchft": version, "loadavg_before": load_before, "loadavg_after": load_after,
                                       "elapsed_s": time.time() - t0, "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
