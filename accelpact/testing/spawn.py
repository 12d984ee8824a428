"""Run a function on every rank of a small gloo world made of local processes.

Tests of recovery code need real processes (a gloo timeout is a property of sockets between
processes), and they must never leave stragglers behind: a rank stuck in a collective would
hold a port and a core long after its test failed. So the parent hosts the rendezvous store
itself (no port race between ranks), each child leads its own process group and watches its
parent, and the parent kills every child's process group on timeout, on failure and on exit.

Ranks start from a ``forkserver`` that has imported torch once (``preload``): on a loaded
2-core machine four fresh ``import torch`` cost 10–30 s per world, a fork costs milliseconds.
The runtime and the drills are preloaded too (0.3 s of CPU per rank otherwise, ~1 s per world),
and what every rank imports lazily anyway: ``torch._dynamo`` (DDP's and FSDP's constructors
reach for it; 0.5 s of CPU per rank, ~2 s per 4-rank world) and ``numpy.random``
(``workloads.seed_everything``).
``start_method="spawn"`` gives fully fresh interpreters instead (and applies ``env`` before
torch is imported).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import logging
import multiprocessing
import os
import pickle
import queue as queue_module
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AccelPactError

log = logging.getLogger("accelpact.testing")

__all__ = ["RankOutcome", "WorldError", "run_world"]

_LOCALHOST = "127.0.0.1"
#: The caller's `accelpact` package directory, which every rank must import too (`same_package`).
PACKAGE_ENV = "ACCELPACT_WORLD_PACKAGE"
_PACKAGE = str(Path(__file__).resolve().parent.parent)
_POLL_S = 0.05
_ENV_LOCK = threading.Lock()
#: How long a hung rank gets to write its threads' stacks (SIGUSR1, faulthandler) before the kill.
_STACKS_WAIT_S = 0.5
#: Native stacks of a hung rank (gdb): frames per thread, seconds for all ranks, characters kept per rank.
_NATIVE_FRAMES, _NATIVE_WAIT_S, _NATIVE_CHARS = 14, 30.0, 12000
_STACKS_FILE: Any = None  # a rank's open stacks file: faulthandler writes to its descriptor
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor",
                   "torch.nn.parallel", "torch._dynamo", "numpy.random", "accelpact.runtime", "accelpact.testing.drills")


@dataclass(frozen=True)
class RankOutcome:
    """What became of one rank: its result, or why there is none."""

    rank: int
    ok: bool
    result: Any = None
    detail: str = ""


class WorldError(AccelPactError, RuntimeError):
    """At least one rank failed, died or ran out of time; carries every rank's outcome."""

    def __init__(self, reason: str, outcomes: Mapping[int, RankOutcome], world_size: int) -> None:
        self.reason = reason
        self.outcomes = dict(outcomes)
        lines = [f"world of {world_size} ranks failed: {reason}"]
        for rank in range(world_size):
            outcome = self.outcomes.get(rank)
            if outcome is None:
                lines.append(f"--- rank {rank}: no result (killed)")
            elif outcome.ok:
                lines.append(f"--- rank {rank}: ok")
            else:
                lines.append(f"--- rank {rank}: {outcome.detail.rstrip()}")
        super().__init__("\n".join(lines))


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    pg_timeout_s: float = 20.0,
    local_world_size: int | None = None,
    threads_per_rank: int = 1,
    grace_s: float = 5.0,
    start_method: str = "forkserver",
    preload: Sequence[str] = DEFAULT_PRELOAD,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return results by rank.

    Each rank joins a gloo default group (timeout ``pg_timeout_s``) through a TCP store hosted by
    this process. ``env`` is set in each child's environment together with RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (with the forkserver: at child start,
    after the preloaded imports; with spawn: before anything is imported). ``fn``, ``args`` and
    results must be picklable; ``fn`` must be importable. ``preload`` (modules the forkserver
    imports) takes effect when this call is the one that starts the forkserver.

    Raises ``WorldError`` with every rank's traceback when a rank raises or dies, or when the
    whole world is not done within ``timeout_s``; once one rank failed, the others get
    ``grace_s`` to report before all are killed.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be positive, got {world_size}")
    import torch.distributed as dist  # imported late: a light import for callers that only plan

    store = dist.TCPStore(
        _LOCALHOST, 0, None, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(preload))
    results_queue = ctx.Queue()
    local = local_world_size or world_size
    processes: dict[int, multiprocessing.process.BaseProcess] = {}
    outcomes: dict[int, RankOutcome] = {}
    try:
        for rank in range(world_size):
            rank_env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank % local),
                "LOCAL_WORLD_SIZE": str(local),
                "MASTER_ADDR": _LOCALHOST,
                "MASTER_PORT": str(store.port),
                "OMP_NUM_THREADS": str(threads_per_rank),
                PACKAGE_ENV: _PACKAGE,
                **(env or {}),
            }
            process = ctx.Process(
                target=_child_main,
                args=(rank, world_size, store.port, pg_timeout_s, threads_per_rank, os.getpid(),
                      results_queue, rank_env, fn, args),
                name=f"accelpact-rank{rank}",
                daemon=True,
            )
            if start_method == "spawn":  # a fresh interpreter: the environment is all it inherits
                with _ENV_LOCK, _temporary_environ(rank_env):
                    process.start()
            else:
                process.start()
            processes[rank] = process
        reason = _collect(processes, results_queue, outcomes, time.monotonic() + timeout_s, timeout_s, grace_s)
        if reason is not None:  # native stacks only for a hang: where a rank raised, its traceback is the cause
            _take_stacks(processes, outcomes, os.getpid(), store.port, native=reason.startswith("timed out"))
    finally:
        _kill_all(processes)
        for rank in processes:
            with contextlib.suppress(OSError):
                _stacks_path(os.getpid(), store.port, rank).unlink()
        results_queue.close()
        results_queue.join_thread()
        del store
    if reason is not None:
        raise WorldError(reason, outcomes, world_size)
    return [outcomes[rank].result for rank in range(world_size)]


def _collect(
    processes: Mapping[int, multiprocessing.process.BaseProcess],
    results_queue: Any,
    outcomes: dict[int, RankOutcome],
    deadline: float,
    timeout_s: float,
    grace_s: float,
) -> str | None:
    """Gather one outcome per rank; return why the world failed, or None when all succeeded."""
    world_size = len(processes)
    first_failure: str | None = None
    while len(outcomes) < world_size:
        now = time.monotonic()
        if now >= deadline:
            return first_failure or f"timed out after {timeout_s:.1f} s"
        try:
            outcome = results_queue.get(timeout=min(_POLL_S, deadline - now))
        except queue_module.Empty:
            outcome = None
        if outcome is not None:
            outcomes[outcome.rank] = outcome
            if not outcome.ok and first_failure is None:
                first_failure = f"rank {outcome.rank} raised"
                deadline = min(deadline, time.monotonic() + grace_s)
            continue
        for rank, process in processes.items():
            if rank in outcomes or process.exitcode is None:
                continue
            late = _drain_one(results_queue)  # a result may still be in the pipe after exit
            if late is not None:
                outcomes[late.rank] = late
                break
            outcomes[rank] = RankOutcome(rank, False, detail=f"exited with code {process.exitcode} "
                                                            "without reporting a result")
            if first_failure is None:
                first_failure = f"rank {rank} died"
                deadline = min(deadline, time.monotonic() + grace_s)
    return first_failure


def _stacks_path(parent_pid: int, store_port: int, rank: int) -> Path:
    return Path(tempfile.gettempdir()) / f"accelpact-world-{parent_pid}-{store_port}-rank{rank}.stacks"


def _take_stacks(processes: Mapping[int, multiprocessing.process.BaseProcess], outcomes: dict[int, RankOutcome],
                 parent_pid: int, store_port: int, *, native: bool) -> None:
    """Before a failed world is killed: every rank still running without a result writes its
    threads' stacks (faulthandler, registered on SIGUSR1 at the rank's start), and they become its
    outcome, so that a hang names the call it hung in."""
    hung = {rank: p for rank, p in processes.items() if rank not in outcomes and p.pid is not None and p.is_alive()}
    for process in hung.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGUSR1)
    if hung:
        time.sleep(_STACKS_WAIT_S)
    native_by_rank = _native_stacks({rank: p.pid for rank, p in hung.items() if p.pid is not None}) if native else {}
    for rank in hung:
        try:
            stacks = _stacks_path(parent_pid, store_port, rank).read_text(errors="replace").strip()
        except OSError as exc:
            stacks = f"(none: {type(exc).__name__}: {exc})"
        outcomes[rank] = RankOutcome(rank, False, detail="no result (killed); its threads at the kill:\n"
                                                         + (stacks[-6000:] or "(none written)")
                                                         + (f"\n--- native stacks (gdb):\n{native_by_rank[rank]}" if rank in native_by_rank else ""))


def _native_stacks(pids: Mapping[int, int]) -> dict[int, str]:
    """Every hung rank's native threads (gdb, where installed), beside faulthandler's Python view.
    Why: a rank stuck in a destructor or waiting for the GIL shows only "<no Python frame>" or the
    line that dropped the object (seen in CI: a rank hung at a `return`); the C++ frames name
    the join or the lock. All ranks at once, bounded, best effort: the world has failed already
    (~3 s of CPU per rank, gdb loading torch's symbols)."""
    gdb = shutil.which("gdb")
    if gdb is None or not pids:
        return {}
    running = {rank: subprocess.Popen([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                                       "-ex", f"thread apply all bt {_NATIVE_FRAMES}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace")
               for rank, pid in pids.items()}
    out, deadline = {}, time.monotonic() + _NATIVE_WAIT_S  # one bound for all: they run side by side
    for rank, proc in running.items():
        try:
            text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            text = f"(gdb gave no answer within {_NATIVE_WAIT_S:.0f} s)\n{text}"
        frames = [line for line in text.splitlines() if line.startswith(("Thread ", "#", "(gdb"))]
        out[rank] = "\n".join(frames)[-_NATIVE_CHARS:] or "(gdb printed no frames: not permitted to attach?)"
    return out


def _drain_one(results_queue: Any) -> RankOutcome | None:
    try:
        return results_queue.get(timeout=0.2)
    except queue_module.Empty:
        return None


def _kill_all(processes: Mapping[int, multiprocessing.process.BaseProcess]) -> None:
    """Kill each child's whole process group, then the child itself, then reap it."""
    for process in processes.values():
        if process.pid is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.kill()
        except Exception as exc:  # best effort: killpg above already reached it, join reaps it below
            log.debug("killing rank process %s failed: %s: %s", process.pid, type(exc).__name__, exc)
    for process in processes.values():
        if process.pid is not None:
            process.join(timeout=5.0)


@contextlib.contextmanager
def _temporary_environ(values: Mapping[str, str]):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _watch_parent(parent_pid: int) -> None:
    """Exit at once if the parent dies, so that no rank outlives the test that started it.

    The parent is the caller of ``run_world``, not necessarily the OS parent (the forkserver).
    """
    while True:
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(3)
        except PermissionError:
            pass
        time.sleep(0.5)


class MixedTrees(AccelPactError, RuntimeError):
    """A rank runs another tree's accelpact than the process that started it."""


def same_package(callers: str | None, mine: str = _PACKAGE) -> None:
    """Refuse a rank that imported another `accelpact` than its caller. Why: the forkserver's
    `sys.path` starts with the working directory, so a bench started from a checkout, with another
    tree first on PYTHONPATH, runs the checkout's code in its ranks and the other in the caller:
    a before/after comparison then compares one tree with itself, silently."""
    if callers is not None and callers != mine:
        raise MixedTrees(f"this rank imported accelpact from {mine}, its caller from {callers}: the forkserver "
                         "puts the working directory first on sys.path; start the caller from a directory "
                         "without an accelpact/ package in it, or use start_method='spawn'")


#: Every rank adds 1 to the first key once its default group is connected; the last one sets the
#: second, which the others wait for (`wait_for_world`).
WORLD_FORMED_KEYS = ("accelpact-testing/connected", "accelpact-testing/world-formed")


def wait_for_world(store: Any, world_size: int, timeout_s: float) -> None:
    """Return once every rank's default group is connected. Why: gloo's full mesh can complete on
    one rank before its peers; a rank whose ``fn`` returns at once then destroys its group and
    exits, and a peer still finishing its own half of the connect fails with "Connection closed by
    peer" (CI met it: three ranks ok, rank 0 failed in ``init_process_group``)."""
    connected_key, formed_key = WORLD_FORMED_KEYS
    if store.add(connected_key, 1) >= world_size:
        store.set(formed_key, "1")
        return
    import torch.distributed as dist

    try:
        store.wait([formed_key], datetime.timedelta(seconds=timeout_s))
    except dist.DistStoreError as exc:
        connected = store.add(connected_key, 0)
        raise TimeoutError(f"only {connected} of {world_size} ranks connected their default group "
                           f"within {timeout_s:.1f} s") from exc


def _child_main(
    rank: int,
    world_size: int,
    store_port: int,
    pg_timeout_s: float,
    threads_per_rank: int,
    parent_pid: int,
    results_queue: Any,
    env: Mapping[str, str],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    global _STACKS_FILE
    os.environ.update(env)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    with contextlib.suppress(OSError):  # the parent asks for the stacks of a rank that hangs
        _STACKS_FILE = open(_stacks_path(parent_pid, store_port, rank), "w")  # noqa: SIM115 - kept for faulthandler
        faulthandler.register(signal.SIGUSR1, file=_STACKS_FILE, all_threads=True)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads_per_rank)
    timeout = datetime.timedelta(seconds=pg_timeout_s)
    try:
        same_package(env.get(PACKAGE_ENV))
        store = dist.TCPStore(_LOCALHOST, store_port, world_size, False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        wait_for_world(store, world_size, pg_timeout_s)
        outcome = RankOutcome(rank, True, result=fn(rank, world_size, *args))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent as text
        outcome = RankOutcome(rank, False, detail=traceback.format_exc())
    try:
        pickle.dumps(outcome)  # the queue pickles in a feeder thread, where errors would be lost
    except Exception:
        outcome = RankOutcome(rank, False, detail="result could not be pickled:\n" + traceback.format_exc())
    results_queue.put(outcome)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # best effort at exit: the outcome is already queued
        log.debug("rank %d: destroy_process_group failed: %s: %s", rank, type(exc).__name__, exc)
    results_queue.close()
    results_queue.join_thread()
