"""Launch the demo trainer (`run_spare_job`) or any worker command (`launch_with_spares`: the fault
campaign's spares profile runs `accelpact.testing.spare_drill`) with hot spares the way torchrun's
agents would host it: this process holds the job's store (as an agent does; it is the one thing
that cannot be lost), the W + S workers are plain processes with torchrun's environment and
ACCELPACT_SPARES=S.

A worker command `python -m <module> ...` starts by default from the forkserver of
`accelpact.testing.spawn` (torch, the runtime and the drills imported once): the module runs as
`__main__` in a process of its own with exactly the environment, argv, output file and exit code
(a signal's negative number) that a fresh interpreter would have, and the interpreter's exit
(non-daemon threads, atexit handlers, flushed streams) is done as Python does it. A fresh
`import torch` costs each of the W + S processes ~3 s of CPU (~10 s of a spares job's wall time
on 2 cores, more under load); `start="exec"` gives fresh interpreters (any other command always
gets one).

Tests only: a production launch is torchrun (see the README's recipe)."""

from __future__ import annotations

import atexit
import datetime
import io
import json
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import threading
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
                  envelope: str | None = None, replicate: str = "off", on_loss: str = "reject",
                  start: str = "forkserver", checkpoint_every: int = 0, running_stat: bool = False) -> SpareJob:
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
    if running_stat:
        cmd.append("--running-stat")
    if checkpoint_every:
        cmd += [f"--checkpoint-dir={Path(trace_dir) / 'ckpt'}", f"--checkpoint-every={checkpoint_every}"]
    codes, output, seconds = launch_with_spares(cmd, active=active, spares=spares, log_dir=Path(trace_dir),
                                                timeout_s=timeout_s, extra_env=extra_env, start=start)
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return SpareJob(codes, result, trace_dir, output, seconds)


def launch_with_spares(cmd: list[str], *, active: int, spares: int, log_dir: Path, timeout_s: float,
                       extra_env: dict[str, str] | None = None,
                       start: str = "exec") -> tuple[list[int | None], list[str], float]:
    """Start `cmd` as W + S processes with torchrun's environment and ACCELPACT_SPARES=S, this
    process hosting the store; wait for all (a process still running after `timeout_s` is
    killed: its code is None). Returns the exit codes and the outputs by launch rank, and the
    seconds it took. `start="forkserver"` starts a `python -m <module>` command from the
    preloaded forkserver (module docstring); "exec" (or any other command) starts it afresh."""
    if start not in ("exec", "forkserver"):
        raise ValueError(f"start must be 'exec' or 'forkserver', got {start!r}")
    forked = start == "forkserver" and len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m"
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    launched = active + spares
    procs = []
    t0 = time.monotonic()
    for rank in range(launched):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK="0",
                   WORLD_SIZE=str(launched), ACCELPACT_SPARES=str(spares), TORCHELASTIC_RUN_ID="spares-test",
                   TORCHELASTIC_USE_AGENT_STORE="True",  # this harness hosts the store, as the agent does
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
        env.pop("TORCHELASTIC_RESTART_COUNT", None)
        if forked:
            procs.append((_fork_worker(cmd[2], cmd[3:], env, log_dir / f"launch{rank}.log", rank), None))
            continue
        log = open(log_dir / f"launch{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    codes: list[int | None] = []
    for proc, log in procs:
        left = max(1.0, timeout_s - (time.monotonic() - t0))
        if log is None:  # a forked worker (multiprocessing.Process)
            proc.join(left)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
                codes.append(None)
            else:
                codes.append(proc.exitcode)
            continue
        try:
            codes.append(proc.wait(timeout=left))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(None)
        log.close()
    del store
    output = [(log_dir / f"launch{r}.log").read_text() for r in range(launched)]
    return codes, output, time.monotonic() - t0


# -- workers from the forkserver ------------------------------------------------------------------
def _fork_worker(module: str, argv: list[str], env: dict[str, str], log_path: Path,
                 rank: int) -> multiprocessing.process.BaseProcess:
    from .spawn import DEFAULT_PRELOAD

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(DEFAULT_PRELOAD))  # takes effect if this starts the forkserver
    proc = ctx.Process(target=_worker_main, args=(module, list(argv), dict(env), str(log_path)),
                       name=f"accelpact-launch{rank}")
    proc.start()
    return proc


def _exit_code(exc: SystemExit) -> int:
    """The status a Python interpreter exits with on `SystemExit(code)`."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _worker_main(module: str, argv: list[str], env: dict[str, str], log_path: str) -> None:
    """`python -m module *argv` with `env`, stdout and stderr to `log_path`, in this forked
    process: then the interpreter's exit, and this process's exit with the interpreter's code."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))

    def stream(fileno: int, line_buffering: bool, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fileno, "w", closefd=False)
        return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8", errors=errors,
                                line_buffering=line_buffering, write_through=unbuffered)

    sys.stdout = sys.__stdout__ = stream(1, False, "strict")
    sys.stderr = sys.__stderr__ = stream(2, True, "backslashreplace")
    sys.argv = [module, *argv]  # runpy puts the module's file in argv[0], as `python -m` does
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, exit status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    # what the interpreter does at exit: wait for non-daemon threads, run the atexit handlers,
    # flush the streams
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for out in (sys.stdout, sys.stderr):
        try:
            out.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
