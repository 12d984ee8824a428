"""Emulated nodes: one network namespace per node, joined by veths to a bridge in a namespace of
its own, on addresses this module assigns (10.231.0.0/24 by default, no default route, so no
packet can leave the emulated fabric).

Why namespaces and not loopback: a link cut must be a real fault of the kernel's network stack
(TCP retransmission backoff, closed gloo pairs), seen by real `torchrun` agents on distinct
addresses. The layout decision (`TopologySpec`, pure: names, addresses, `ip` argv lists) is kept
apart from its effect (`Topology.up`/`down`), and `emulated_nodes` always tears down, also after
an exception, Ctrl-C or SIGTERM. Each live topology leaves an owner record in `/run` so a later run
can reap what a SIGKILLed one left behind (`reap_stale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import AccelPactError

__all__ = [
    "ChaosUnavailable",
    "OWNER_DIR",
    "Topology",
    "TeardownIncomplete",
    "TopologyError",
    "TopologySpec",
    "emulated_nodes",
    "preflight",
    "reap_stale",
]

#: Owner records of live topologies (tag → owner pid), for reaping after a SIGKILL.
OWNER_DIR = Path("/run/accelpact-chaos")
#: Every name this module creates starts with this, so nothing else is ever touched.
PREFIX = "apc"


class ChaosUnavailable(AccelPactError, RuntimeError):
    """This machine cannot emulate nodes (not root, or iproute2 missing): skip, do not fail."""


class TopologyError(AccelPactError, RuntimeError):
    """An `ip` command that builds or changes the emulated fabric failed."""


class TeardownIncomplete(TopologyError):
    """The fabric was used and then not wholly removed (`reap_stale` takes what is left next time):
    what ran on it stands, so a campaign records it against the scenario instead of losing it."""


def preflight() -> None:
    """Refuse clearly when emulated nodes cannot work here, before anything is created."""
    if os.geteuid() != 0:
        raise ChaosUnavailable("emulated nodes need root (network namespaces, veths, a bridge); run as root")
    if shutil.which("ip") is None:
        raise ChaosUnavailable("the `ip` command (iproute2) is missing: apt-get install iproute2")


@dataclass(frozen=True)
class TopologySpec:
    """Names and addresses of one emulated fabric. Pure: building it changes nothing.

    Interface names are limited to 15 characters by the kernel, hence the short tag.
    """

    tag: str
    nodes: int = 2
    subnet: str = "10.231.0"  # a /24 that exists only inside the namespaces created here

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]{1,6}", self.tag):
            raise ValueError(f"tag must be 1-6 lower-case alphanumerics, got {self.tag!r}")
        if not 1 <= self.nodes <= 8:
            raise ValueError(f"nodes must be 1..8, got {self.nodes}")
        parts = self.subnet.split(".")
        if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise ValueError(f"subnet must be the first three octets of a /24, got {self.subnet!r}")

    @classmethod
    def fresh(cls, nodes: int = 2, subnet: str = "10.231.0") -> TopologySpec:
        return cls(tag=secrets.token_hex(3), nodes=nodes, subnet=subnet)

    # -- names ---------------------------------------------------------------------------------
    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}-{self.tag}-sw"

    def node_ns(self, node: int) -> str:
        return f"{PREFIX}-{self.tag}-n{self._node(node)}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"

    def node_if(self, node: int) -> str:
        """The node's end of its veth (what GLOO_SOCKET_IFNAME names)."""
        return f"{PREFIX}{self.tag}n{self._node(node)}"

    def switch_if(self, node: int) -> str:
        """The switch's end of the node's veth (a bridge port)."""
        return f"{PREFIX}{self.tag}s{self._node(node)}"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{self._node(node) + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns, *(self.node_ns(i) for i in range(self.nodes))]

    # -- commands (pure) -------------------------------------------------------------------------
    def up_commands(self) -> list[list[str]]:
        sw = self.switch_ns
        cmds = [["ip", "netns", "add", ns] for ns in self.namespaces]
        cmds += [
            ["ip", "-n", sw, "link", "set", "lo", "up"],
            ["ip", "-n", sw, "link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"],
            ["ip", "-n", sw, "link", "set", self.bridge, "up"],
        ]
        for i in range(self.nodes):
            ns, nif, sif = self.node_ns(i), self.node_if(i), self.switch_if(i)
            cmds += [
                # created inside the node namespace and moved, so no name ever lands in the root one
                ["ip", "-n", ns, "link", "add", nif, "type", "veth", "peer", "name", sif, "netns", sw],
                ["ip", "-n", sw, "link", "set", sif, "master", self.bridge],
                ["ip", "-n", sw, "link", "set", sif, "up"],
                ["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", nif],
                ["ip", "-n", ns, "link", "set", nif, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],  # same-node gloo pairs and the store
            ]
        return cmds

    def down_commands(self) -> list[list[str]]:
        """Deleting a namespace deletes its veth ends and the bridge with it."""
        return [["ip", "netns", "delete", ns] for ns in self.namespaces]

    def _node(self, node: int) -> int:
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} outside 0..{self.nodes - 1}")
        return node


def run_ip(argv: Sequence[str], *, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess:
    """One `ip`/`bridge`/`nft` command; a failure raises `TopologyError` with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise TopologyError(f"`{' '.join(argv)}` failed (rc {proc.returncode}): {proc.stderr.strip()}")
    return proc


class Topology:
    """The live fabric of a `TopologySpec`. Prefer `emulated_nodes()`, which always tears down."""

    def __init__(self, spec: TopologySpec):
        self.spec = spec
        self.live = False

    def up(self) -> Topology:
        preflight()
        OWNER_DIR.mkdir(parents=True, exist_ok=True)
        self._owner_path.write_text(json.dumps(
            {"pid": os.getpid(), "nodes": self.spec.nodes, "subnet": self.spec.subnet}))
        self.live = True  # from here on, down() has something to undo
        try:
            for argv in self.spec.up_commands():
                run_ip(argv)
            self._wait_carrier()
        except Exception:
            self.down()
            raise
        return self

    def down(self) -> list[str]:
        """Kill whatever still runs inside the namespaces (all started by this topology's user),
        then delete them. Idempotent; returns the problems it could not fix (empty when clean).

        A command that hangs past its timeout is one problem, not the end of the teardown: the
        other namespaces are still deleted and the owner record still removed."""
        problems: list[str] = []
        for ns in self.spec.namespaces:
            try:
                pids = namespace_pids(ns)
            except subprocess.TimeoutExpired as exc:
                problems.append(_timed_out(exc))
                continue
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for argv in self.spec.down_commands():
            try:
                proc = run_ip(argv, check=False)
            except subprocess.TimeoutExpired as exc:
                problems.append(_timed_out(exc))
                continue
            if proc.returncode != 0 and "No such file" not in proc.stderr:
                problems.append(proc.stderr.strip())
        with contextlib.suppress(FileNotFoundError):
            self._owner_path.unlink()
        self.live = False
        try:
            names = list_namespaces()
        except subprocess.TimeoutExpired as exc:
            problems.append(_timed_out(exc))
            return problems
        problems += [f"namespace {ns} still exists" for ns in self.spec.namespaces if ns in names]
        return problems

    def exists(self) -> bool:
        names = list_namespaces()
        return any(ns in names for ns in self.spec.namespaces)

    def exec_argv(self, node: int, argv: Sequence[str]) -> list[str]:
        """argv that runs `argv` inside node `node`'s namespace."""
        return ["ip", "netns", "exec", self.spec.node_ns(node), *argv]

    @property
    def _owner_path(self) -> Path:
        return OWNER_DIR / f"{self.spec.tag}.json"

    def _wait_carrier(self, timeout: float = 5.0) -> None:
        """The bridge forwards only once every port is up (forward_delay 0 makes that immediate)."""
        deadline = time.monotonic() + timeout
        while True:
            out = run_ip(["ip", "-n", self.spec.switch_ns, "-br", "link", "show", "master", self.spec.bridge]).stdout
            states = [line.split()[1] for line in out.splitlines() if line.strip()]
            if len(states) == self.spec.nodes and all(s == "UP" for s in states):
                return
            if time.monotonic() > deadline:
                raise TopologyError(f"bridge ports not up after {timeout}s: {out.strip()}")
            time.sleep(0.05)


def _timed_out(exc: subprocess.TimeoutExpired) -> str:
    cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
    return f"`{cmd}` timed out after {exc.timeout:g}s"


def list_namespaces() -> list[str]:
    proc = run_ip(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def namespace_pids(ns: str) -> list[int]:
    proc = run_ip(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in proc.stdout.split() if x.isdigit()]


def reap_stale() -> list[str]:
    """Tear down topologies whose owner process is gone (a SIGKILLed run); returns their tags."""
    reaped: list[str] = []
    if not OWNER_DIR.is_dir():
        return reaped
    for record in OWNER_DIR.glob("*.json"):
        try:
            doc = json.loads(record.read_text())
            spec = TopologySpec(tag=record.stem, nodes=int(doc["nodes"]), subnet=doc["subnet"])
        except (ValueError, KeyError, TypeError, OSError):
            continue  # not a record this module wrote
        try:
            os.kill(int(doc["pid"]), 0)
            continue  # owner alive: not ours to touch
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        Topology(spec).down()
        reaped.append(spec.tag)
    return reaped


@contextlib.contextmanager
def emulated_nodes(spec: TopologySpec | None = None, *, nodes: int = 2) -> Iterator[Topology]:
    """Build the fabric, yield it, and always tear it down: on return, exception, Ctrl-C, and
    SIGTERM/SIGHUP (turned into SystemExit while inside, so `finally` runs)."""
    preflight()
    reap_stale()
    topo = Topology(spec or TopologySpec.fresh(nodes=nodes))
    restore = _exit_on_signals()
    try:
        yield topo.up()
    finally:
        try:
            problems = topo.down()
            if problems:
                raise TeardownIncomplete("teardown incomplete: " + "; ".join(problems))
        finally:
            restore()


def _exit_on_signals():
    """SIGTERM/SIGHUP → SystemExit in the main thread; returns a function restoring the old handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {}

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, handler)

    def restore():
        for sig, h in old.items():
            signal.signal(sig, h)

    return restore
