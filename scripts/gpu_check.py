"""AccelPact's device check: the NCCL path on real GPUs, in one run of at most 5 minutes.

    bash scripts/gpu_check.sh            # what the README calls "the device script"

Steps (each prints PASS, FAIL with the reason, or SKIP with why):

A  build an NCCL group through the project's lifecycle (`make_group(backend="nccl")`: non-blocking,
   eagerly connected) and validate it on the device with a bounded wait;
B  a stuck collective: one rank skips an all-reduce; the other's bounded wait raises instead of
   hanging, the group is aborted before anything synchronises, `torch.cuda.synchronize` returns,
   the replacement is NCCL again and validates (needs 2 GPUs: NCCL refuses two ranks of one
   communicator on one GPU);
C  a DDP job (and FSDP2 HSDP on a 2x2 mesh where 4 GPUs exist) under `accelpact.attach`, with a fault
   at a committed boundary (Preserve: its NCCL replacement built during the repair) and one in
   backward (Rewind, `standby_groups="all"`: every group's NCCL standby adopted), bitwise equal to
   an uninterrupted run, its data-plane groups still NCCL afterwards;
D  the recovered job is still alive and training 60 s after the fault (the heartbeat monitor, left
   on, would have killed it).

With one GPU only A runs (one-member groups) and the others say why they cannot.
Exit status: 0 when nothing failed, 1 otherwise, 2 when there is no GPU at all.

``--cpu-dry-run`` runs the same steps with gloo on the CPU (4 ranks, D shortened to 5 s): it proves
the script itself, not the GPU path (on gloo a bounded wait is the group's own timeout).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

UPDATES = 8
SURVIVE_S = 60.0
DEVICE, BACKEND, DEFAULT_BACKEND = "cuda", "nccl", "cpu:gloo,cuda:nccl"


def _dry_run() -> None:
    global DEVICE, BACKEND, DEFAULT_BACKEND, SURVIVE_S
    DEVICE, BACKEND, DEFAULT_BACKEND, SURVIVE_S = "cpu", "gloo", "gloo", 5.0


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()
DATA_TIMEOUT_S = 5.0
CONTROL_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ A and B: groups ---------
def step_a(rank: int, world: int) -> dict:
    from accelpact.comm import make_group, validate_group
    from accelpact.comm.backends import backend_spec

    members = list(range(world))
    t = time.perf_counter()
    group = make_group(members, label="gpu-a", timeout=DATA_TIMEOUT_S, backend=BACKEND)
    built_s = time.perf_counter() - t
    result = validate_group(group, members, timeout=datetime.timedelta(seconds=DATA_TIMEOUT_S))
    ok = result.observed_sum == sum(members) and backend_spec(group) == BACKEND
    return {"ok": ok, "detail": f"built in {built_s:.2f} s, backend {backend_spec(group)}, "
                                f"validated sum {result.observed_sum} in {result.elapsed_us / 1e3:.1f} ms"}


def step_b(rank: int, world: int) -> dict:
    """Rank 1 skips one all-reduce; rank 0 must not hang, abort, drain, rebuild as NCCL."""
    from accelpact.comm import make_group, replace_group, validate_group
    from accelpact.comm.backends import backend_spec, wait_for
    from accelpact.comm.device import settle_device
    from accelpact.comm.lifecycle import retire_groups

    members = [0, 1]
    if rank not in members:
        return {"ok": True, "detail": "not a member"}
    store = dist.distributed_c10d._get_default_store()
    bound = datetime.timedelta(seconds=DATA_TIMEOUT_S * 0.9)
    group = make_group(members, label="gpu-b", timeout=DATA_TIMEOUT_S, backend=BACKEND)
    validate_group(group, members, timeout=bound)
    raised = ""
    if rank == 0:
        work = dist.all_reduce(torch.ones(1, device=DEVICE), group=group, async_op=True)
        t = time.perf_counter()
        try:
            wait_for(work, {DEVICE: BACKEND}, bound)
        except Exception as exc:  # what we want: the bounded wait raised
            raised = f"{type(exc).__name__} after {time.perf_counter() - t:.1f} s"
        store.set("gpu-b/timed-out", "1")
    else:
        store.wait(["gpu-b/timed-out"], datetime.timedelta(seconds=60))
    settled = settle_device(broken={"gpu-b": group}, others={}, timeout_s=DATA_TIMEOUT_S,
                            synchronize=_sync,
                            abort=lambda groups: retire_groups(groups, abort=True))
    new = replace_group(group, ranks=members, label="gpu-b", generation=1, timeout=DATA_TIMEOUT_S, backend=BACKEND)
    validated = validate_group(new, members, timeout=bound).observed_sum
    ok = settled.drained and validated == 1 and backend_spec(new) == BACKEND and (rank != 0 or bool(raised))
    return {"ok": ok, "detail": f"rank {rank}: wait raised: {raised or 'n/a'}; drained={settled.drained} "
                                f"{settled.reason}; replacement {backend_spec(new)} validated {validated}"}


# ------------------------------------------------------------------ C and D: a job ----------
class Cursor:
    """The data cursor a Rewind puts back (batch = f(position, rank))."""

    def __init__(self):
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


def _batch(cursor: Cursor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * cursor.position + rank)
    cursor.position += 1
    return torch.randn(8, 16, generator=g).to(DEVICE), torch.randn(8, 4, generator=g).to(DEVICE)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(DEVICE)


def _wrap(kind: str, rank: int, world: int) -> torch.nn.Module:
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(_model(), device_ids=[rank] if DEVICE == "cuda" else None,
                   process_group=dist.new_group(list(range(world)), backend=BACKEND))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("replicate", "shard"))
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    parts = []
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        parts.append(local.detach().flatten().cpu())
    return torch.cat(parts)


def run_job(kind: str, rank: int, world: int, faults: str | None, survive_s: float = 0.0,
            standby: str = "gloo") -> dict:
    import accelpact
    from accelpact.comm.backends import backend_spec
    from accelpact.envelope import permissive_envelope
    from accelpact.runtime.detect import detect_profile

    model = _wrap(kind, rank, world)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    cursor = Cursor()
    config = accelpact.Config(data_timeout_s=DATA_TIMEOUT_S, control_timeout_s=CONTROL_TIMEOUT_S,
                              trace_dir=os.environ.get("GPU_CHECK_TRACE"), standby_groups=standby)
    platform = "cuda-nccl" if DEVICE == "cuda" else "cpu-gloo"
    envelope = permissive_envelope(platform, detect_profile(model))  # a qualification run
    rt = accelpact.attach(model, optimizer, data_state=cursor, config=config, envelope=envelope, faults=faults)

    def update():
        x, y = _batch(cursor, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(UPDATES):
        rt.step(update)
    params = _flat(model).tolist()  # compared with the reference: before D's extra updates
    started = time.monotonic()
    survived = 0
    while time.monotonic() - started < survive_s:  # D: keep training past the heartbeat window
        rt.step(update)
        survived += 1
        time.sleep(1.0)
    _sync()
    out = {"params": params, "actions": [r.action.value for r in rt.history],
           "adopted": [sorted(r.adopted) == sorted(r.failed_groups) for r in rt.history],
           "backends": sorted({backend_spec(pg) or "?" for pg in rt.groups.values()}),
           "survived_updates": survived}
    rt.close()
    return out


def step_c(rank: int, world: int, kind: str) -> dict:
    reference = run_job(kind, rank, world, faults=None)
    preserve = run_job(kind, rank, world, faults="skip@3:committed:1")
    rewind = run_job(kind, rank, world, faults="skip@5:backward:1", survive_s=SURVIVE_S if kind == "ddp" else 0.0,
                     standby="all")  # the Preserve builds its NCCL replacement, the Rewind adopts standbys
    checks = {
        "preserve bitwise": preserve["params"] == reference["params"],
        "preserve recovered": "preserve" in preserve["actions"],
        "rewind bitwise": rewind["params"] == reference["params"],
        "rewind recovered": "rewind" in rewind["actions"],
        "rewind adopted its standbys": bool(rewind["adopted"]) and all(rewind["adopted"]),
        "backend kept": all(b in (BACKEND, DEFAULT_BACKEND) for b in preserve["backends"] + rewind["backends"]),
    }
    if kind == "ddp":
        checks["alive 60 s after the fault (D)"] = rewind["survived_updates"] > 0
    failed = [name for name, ok in checks.items() if not ok]
    return {"ok": not failed, "detail": f"actions {preserve['actions']} / {rewind['actions']}, backends "
                                        f"{rewind['backends']}" + (f"; failed: {failed}" if failed else "")}


# ------------------------------------------------------------------ the world --------------
def rank_main(rank: int, world: int, port: int, out_dir: str, dry_run: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    if dry_run:
        _dry_run()
    else:
        torch.cuda.set_device(rank)
    import accelpact

    accelpact.init_process_group(DEFAULT_BACKEND, timeout=datetime.timedelta(seconds=60))
    results: dict[str, dict] = {}
    steps = [("A", lambda: step_a(rank, world))]
    if world >= 2:
        steps += [("B", lambda: step_b(rank, world)), ("C-ddp", lambda: step_c(rank, world, "ddp"))]
    if world >= 4:
        steps.append(("C-fsdp2-hsdp", lambda: step_c(rank, world, "fsdp2")))
    for name, fn in steps:
        try:
            results[name] = fn()
        except Exception as exc:  # reported per step; the other steps still run
            results[name] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    dry_run = "--cpu-dry-run" in argv
    if dry_run:
        world = 4
        print(f"gpu_check: CPU DRY RUN (gloo stands in for NCCL: this checks the script, not the GPU path); "
              f"torch {torch.__version__}, world of {world}")
    elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("gpu_check: no CUDA device visible; nothing checked")
        return 2
    else:
        gpus = torch.cuda.device_count()
        world = 4 if gpus >= 4 else min(gpus, 2)
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, {gpus} GPU(s) "
              f"({torch.cuda.get_device_name(0)}); world of {world}")
    with tempfile.TemporaryDirectory() as out_dir:
        os.environ.setdefault("GPU_CHECK_TRACE", out_dir)
        try:
            mp.spawn(rank_main, args=(world, _free_port(), out_dir, dry_run), nprocs=world, join=True)
        except Exception as exc:  # a rank died: report what the others wrote
            print(f"gpu_check: a rank failed: {type(exc).__name__}: {exc}")
        per_rank = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*.json"))]
    return report(per_rank, world)


def report(per_rank: list[dict], world: int) -> int:
    names = ["A", "B", "C-ddp", "C-fsdp2-hsdp"]
    why_skipped = {"B": "needs 2 GPUs", "C-ddp": "needs 2 GPUs", "C-fsdp2-hsdp": "needs 4 GPUs"}
    failed = False
    for name in names:
        got = [r.get(name) for r in per_rank]
        if all(g is None for g in got):
            status = "SKIP" if name in why_skipped and world < (4 if "fsdp2" in name else 2) else "FAIL"
            failed |= status == "FAIL"
            print(f"{name:14s} {status}  {why_skipped.get(name, 'no result')}")
            continue
        ok = all(g is not None and g["ok"] for g in got)
        failed |= not ok
        print(f"{name:14s} {'PASS' if ok else 'FAIL'}  " + " | ".join(g["detail"] if g else "no result" for g in got))
        for g in got:
            if g is not None and "traceback" in g:
                print(g["traceback"])
    print("D              " + ("see C-ddp (alive 60 s after the fault)" if world >= 2 else "SKIP  needs 2 GPUs"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
