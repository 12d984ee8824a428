"""One real multi-node job on the emulated nodes: a `torchrun` agent per node namespace, c10d
rendezvous hosted on node 0, gloo over the veths, `nproc` ranks per node, HSDP with the
replication groups crossing the nodes.

Decide vs effect: `JobSpec` and `torchrun_argv` (pure) say exactly what runs; `Job` starts the
agents, waits with a deadline, and kills their process groups if they overrun. The flags are the
ones measured to work across namespaces (shared/NOTES-netns.md): ``--local-addr`` (else
MASTER_ADDR is localhost and node-0 ranks hang), ``is_host=1`` on node 0 (the hostname resolves to
127.0.0.1, so no agent would host the store), ``GLOO_SOCKET_IFNAME`` = the node's veth (else gloo
connects to 127.0.0.1), and a rendezvous ``read_timeout`` above the longest cut (else the cut
node's agent dies after the restore).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._env import ENV_DWELL, ENV_DWELL_PHASE, ENV_DWELL_S, ENV_MARKS, ENV_NODE
from .topology import Topology, TopologySpec

__all__ = ["Job", "JobPaths", "JobSpec", "rdzv_endpoint", "torchrun_argv", "worker_env"]


@dataclass(frozen=True)
class JobSpec:
    """What the demo trainer runs and how it is supervised."""

    updates: int = 30
    layers: int = 2
    framework: str = "fsdp2"
    nproc: int = 2  # ranks per node
    data_timeout_s: float = 2.0
    control_timeout_s: float = 5.0
    checkpoint_every: int = 4
    max_restarts: int = 3  # AccelPact's restart budget (enforced at attach)
    torchrun_max_restarts: int = 8  # torchrun's own limit stays above it: the budget decides
    dwell_updates: tuple[int, ...] = ()
    dwell_s: float = 0.4
    #: where the ranks dwell: "committed" (after the step: an aligned cut meets the boundary,
    #: Preserve) or "forward" (before the forward: it meets backward's all-reduce, Rewind)
    dwell_phase: str = "committed"
    seed: int = 1234
    rdzv_port: int = 29400
    read_timeout_s: int = 120
    run_id: str = "chaos"
    reference: bool = True
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: the recovery envelope the workers obey (`Config.envelope`: the file `accelpact qualify`
    #: wrote, "builtin" or "permissive"); None: the runtime's default (the default path if a file
    #: is there, else built-in: Preserve at committed boundaries only, so a cut inside an update restarts)
    envelope: str | None = None
    #: hot spares (ACCELPACT_SPARES): the launch's last `spares` ranks, i.e. whole spare nodes
    #: placed after the active ones (`spares` a multiple of `nproc`). With spares the recipe is
    #: torchrun's `--max-restarts=0` (a restarted agent would re-rendezvous and restart everyone)
    spares: int = 0

    def __post_init__(self) -> None:
        if self.control_timeout_s <= self.data_timeout_s:
            raise ValueError("control_timeout_s must exceed data_timeout_s (the runtime refuses otherwise)")
        if self.updates < 1 or self.nproc < 1:
            raise ValueError("updates and nproc must be >= 1")
        if self.dwell_phase not in ("committed", "forward"):
            raise ValueError(f"dwell_phase must be 'committed' or 'forward', got {self.dwell_phase!r}")
        if self.spares < 0 or self.spares % self.nproc:
            raise ValueError(f"spares must be whole spare nodes (a multiple of nproc={self.nproc}), got {self.spares}")

    @property
    def spare_nodes(self) -> int:
        return self.spares // self.nproc


@dataclass(frozen=True)
class JobPaths:
    root: Path

    @property
    def trace(self) -> Path:
        return self.root / "trace"

    @property
    def marks(self) -> Path:
        return self.root / "marks"

    @property
    def checkpoints(self) -> Path:
        return self.root / "ckpt"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def nemesis_log(self) -> Path:
        return self.trace / "nemesis.jsonl"

    def out(self, node: int) -> Path:
        return self.root / f"node{node}.out"

    def err(self, node: int) -> Path:
        return self.root / f"node{node}.err"


def worker_args(job: JobSpec, paths: JobPaths) -> list[str]:
    args = [f"--framework={job.framework}", f"--updates={job.updates}", f"--layers={job.layers}",
            f"--local={job.nproc}", "--faults=none", f"--data-timeout={job.data_timeout_s}",
            f"--control-timeout={job.control_timeout_s}", f"--trace-dir={paths.trace}",
            f"--seed={job.seed}", f"--result={paths.result}", f"--max-restarts={job.max_restarts}"]
    if job.checkpoint_every:
        args += [f"--checkpoint-dir={paths.checkpoints}", f"--checkpoint-every={job.checkpoint_every}"]
    if not job.reference:
        args.append("--no-reference")
    if job.envelope is not None:
        args.append(f"--envelope={job.envelope}")
    return args


def rdzv_endpoint(job: JobSpec, spec: TopologySpec) -> str:
    """The c10d rendezvous endpoint: node 0, which hosts it (``is_host=1``)."""
    return f"{spec.address(0)}:{job.rdzv_port}"


def torchrun_argv(job: JobSpec, spec: TopologySpec, node: int, paths: JobPaths,
                  python: str = sys.executable) -> list[str]:
    """The agent command for `node` (to run inside its namespace). Pure.

    Node order is rank order: c10d numbers the agents by their sorted node descriptors, whose
    first field is ``--local-addr`` (`TopologySpec.address`, increasing with the node for up to 8
    nodes), and torchrun gives agent g the ranks g*nproc .. g*nproc+nproc-1. So node 0, which hosts
    the rendezvous store, is also group rank 0, whose agent hosts the workers' store (MASTER_ADDR):
    the one node that cannot be lost. With spares the spare nodes are the last ones."""
    conf = f"read_timeout={job.read_timeout_s}" + (",is_host=1" if node == 0 else "")
    if spec.nodes <= job.spare_nodes:
        raise ValueError(f"{spec.nodes} node(s) leave no active node beside {job.spare_nodes} spare node(s)")
    restarts = 0 if job.spares else job.torchrun_max_restarts
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={spec.nodes}", f"--nproc-per-node={job.nproc}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint(job, spec)}",
        f"--rdzv-id={job.run_id}", f"--local-addr={spec.address(node)}", f"--rdzv-conf={conf}",
        f"--max-restarts={restarts}", "--monitor-interval=0.1",
        # "--": torchrun's parser would read a worker flag such as --local=2 as an abbreviation of its own
        "-m", "accelpact.chaos.worker", "--", *worker_args(job, paths),
    ]


def worker_env(job: JobSpec, spec: TopologySpec, node: int, paths: JobPaths,
               base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the agent (inherited by its workers). Pure."""
    env = dict(os.environ if base is None else base)
    for key in [k for k in env if k.startswith("ACCELPACT_")]:
        del env[key]  # a stray ACCELPACT_FAULTS would turn the drill into something else
    env.update({
        "GLOO_SOCKET_IFNAME": spec.node_if(node),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "LOGLEVEL": "INFO",  # the agents' rendezvous and restart events, with times, in node<i>.err
        ENV_MARKS: str(paths.marks),
        ENV_DWELL: ",".join(str(u) for u in job.dwell_updates),
        ENV_DWELL_S: str(job.dwell_s),
        ENV_DWELL_PHASE: job.dwell_phase,
        ENV_NODE: str(node),
        **dict(job.extra_env),
    })
    if job.spares:
        # the production recipe (accelpact demo --spares): the spares' count, and where the
        # rendezvous store is, for the exit-barrier check-in of lost agents (launch_elastic)
        env.update({"ACCELPACT_SPARES": str(job.spares), "ACCELPACT_RDZV_ENDPOINT": rdzv_endpoint(job, spec)})
    return env


class Job:
    """The running agents of one job. Use as a context manager: exit kills what is left."""

    def __init__(self, topo: Topology, job: JobSpec, root: str | Path):
        self.topo = topo
        self.spec = job
        self.paths = JobPaths(Path(root))
        self.procs: list[subprocess.Popen] = []
        self.returncodes: list[int | None] = []
        self.timed_out = False
        self.t_start = 0.0
        self.t_end = 0.0

    def start(self) -> Job:
        for d in (self.paths.trace, self.paths.marks):
            d.mkdir(parents=True, exist_ok=True)
        self.t_start = time.monotonic()
        for node in range(self.topo.spec.nodes):
            argv = self.topo.exec_argv(node, torchrun_argv(self.spec, self.topo.spec, node, self.paths))
            env = worker_env(self.spec, self.topo.spec, node, self.paths)
            with open(self.paths.out(node), "w") as out, open(self.paths.err(node), "w") as err:
                self.procs.append(subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True,
                                                   stdin=subprocess.DEVNULL))
        return self

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout_s: float) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive():
            self.timed_out = True
            self.kill()
        self.t_end = time.monotonic()
        self.returncodes = [p.poll() for p in self.procs]
        return self.returncodes

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM then SIGKILL to each agent's own process group (started here, in a new session)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, sig)
            deadline = time.monotonic() + grace_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=1)

    def __enter__(self) -> Job:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.alive():
            self.kill()

    def tail(self, node: int, stream: str = "err", n: int = 4000) -> str:
        path = self.paths.err(node) if stream == "err" else self.paths.out(node)
        try:
            return path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

