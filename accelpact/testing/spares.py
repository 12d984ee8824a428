"""Launch the demo trainer (`run_spare_job`) or any worker command (`launch_with_spares`: the fault
campaign's spares profile runs `accelpact.testing.spare_drill`) with hot spares the way torchrun's
agents would host it: this process holds the job's store (as an agent does; it is the one thing
that cannot be lost), the W + S workers are plain processes with torchrun's environment and
ACCELPACT_SPARES=S.

Tests only: a production launch is torchrun (see the README's recipe)."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist


@dataclass
class SpareJob:
    codes: list[int | None]
    result: dict | None
    trace_dir: str
    output: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_spare_job(*, active: int = 4, spares: int = 1, faults: str = "none", framework: str = "fsdp2",
                  updates: int = 8, layers: int = 2, data_timeout: float = 2.0, control_timeout: float = 6.0,
                  timeout_s: float = 150.0, extra_env: dict[str, str] | None = None,
                  envelope: str | None = None, replicate: str = "off", on_loss: str = "reject") -> SpareJob:
    trace_dir = tempfile.mkdtemp(prefix="accelpact-spares-")
    result_path = Path(trace_dir) / "result.json"
    cmd = [sys.executable, "-m", "accelpact.demo_worker", f"--framework={framework}", f"--updates={updates}",
           f"--layers={layers}", f"--faults={faults}", f"--trace-dir={trace_dir}", f"--result={result_path}",
           f"--data-timeout={data_timeout}", f"--control-timeout={control_timeout}", f"--replicate={replicate}",
           f"--on-loss={on_loss}"]
    if on_loss != "reject":
        extra_env = {"ACCELPACT_ON_LOSS": on_loss, **(extra_env or {})}
    if envelope is not None:
        cmd.append(f"--envelope={envelope}")
    codes, output, seconds = launch_with_spares(cmd, active=active, spares=spares, log_dir=Path(trace_dir),
                                                timeout_s=timeout_s, extra_env=extra_env)
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return SpareJob(codes, result, trace_dir, output, seconds)


def launch_with_spares(cmd: list[str], *, active: int, spares: int, log_dir: Path, timeout_s: float,
                       extra_env: dict[str, str] | None = None) -> tuple[list[int | None], list[str], float]:
    """Start `cmd` as W + S processes with torchrun's environment and ACCELPACT_SPARES=S, this
    process hosting the store; wait for all (a process still running after `timeout_s` is
    killed: its code is None). Returns the exit codes and the outputs by launch rank, and the
    seconds it took."""
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    launched = active + spares
    procs = []
    t0 = time.monotonic()
    for rank in range(launched):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK="0",
                   WORLD_SIZE=str(launched), ACCELPACT_SPARES=str(spares), TORCHELASTIC_RUN_ID="spares-test",
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
        env.pop("TORCHELASTIC_RESTART_COUNT", None)
        log = open(log_dir / f"launch{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    codes: list[int | None] = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0))))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(None)
        log.close()
    del store
    output = [(log_dir / f"launch{r}.log").read_text() for r in range(launched)]
    return codes, output, time.monotonic() - t0
