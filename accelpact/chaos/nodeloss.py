"""Lose a whole emulated node for good: its torchrun agent and every worker on it, at once.

Under one torchrun agent per node the unit of loss is the node: if one worker dies, its agent
stops the node's other workers (torchrun: "ANY have failed -> close") and, with
``--max-restarts=0``, exits. So this drill takes the node away entirely, as a power loss or a
kernel panic would, and the job must go on without it: the spare node's workers take over its
ranks with their state from the live replica peers (`accelpact.membership`).

Decide vs effect, as in `nemesis`: a `NodeLoss` is data (pure), `loss_commands` gives the `ip`
argv of its link part (pure), `victims` checks from the workers' own placement marks that the
node holds no store (pure); `Reaper` waits for the anchor, performs the loss and logs it, with
monotonic times, to ``nemesis.jsonl`` beside the traces.

Methods:

* ``node-kill``    SIGKILL every process in the node's namespace (agent and workers): their
  sockets are reset by the kernel, so the peers' collectives fail at once;
* ``node-vanish``  the switch end of the node's veth set down for good, *then* SIGKILL: no reset,
  no FIN ever leaves the node, the peers wait out their timeouts (a node that drops off the fabric).

The node that hosts the stores (node 0: the rendezvous store, ``is_host=1``, and the workers'
store, hosted by the agent of group rank 0) cannot be lost; `victims` refuses a node that holds
rank 0 whatever the placement turned out to be.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .nemesis import MarkWatcher, anchor_time
from .topology import TopologySpec, namespace_pids, run_ip

__all__ = ["LossMethod", "NodeLoss", "Reaper", "loss_commands", "parse_loss", "placement_of", "victims"]


class LossMethod(enum.StrEnum):
    KILL = "node-kill"
    VANISH = "node-vanish"


@dataclass(frozen=True)
class NodeLoss:
    """Node `node` lost by `method`, `offset_s` after update `update` committed (unaligned: the
    loss lands wherever the next update then is, mostly forward/backward), or `offset_s` into the
    dwell after update `update`'s optimizer step when `aligned` (the committed boundary)."""

    method: LossMethod
    update: int
    offset_s: float = 0.05
    node: int = 1
    aligned: bool = False

    def __post_init__(self) -> None:
        if self.update < 1:
            raise ValueError(f"anchor update must be >= 1, got {self.update}")
        if self.offset_s < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset_s}")
        if self.node < 1:
            raise ValueError("node 0 hosts the job's stores and cannot be lost")

    def spec(self) -> str:
        return f"{self.method}:n{self.node}{'@' if self.aligned else '~'}{self.update}+{self.offset_s:g}"


def parse_loss(text: str) -> NodeLoss:
    """``"node-kill:n1~6+0.05"`` (or ``@6`` for the committed boundary) → a `NodeLoss`."""
    try:
        method, rest = text.strip().split(":", 1)
        aligned = "@" in rest
        node, anchor = rest.split("@" if aligned else "~", 1)
        update, _, offset = anchor.partition("+")
        return NodeLoss(LossMethod(method), int(update), float(offset) if offset else 0.05,
                        int(node.removeprefix("n")), aligned)
    except ValueError as exc:
        raise ValueError(f"bad node loss {text!r} (want METHOD:nNODE~UPDATE[+OFFSET], methods "
                         f"{', '.join(m.value for m in LossMethod)}): {exc}") from None


def loss_commands(spec: TopologySpec, loss: NodeLoss) -> list[list[str]]:
    """The link part of a loss, run before the kill (empty for node-kill). Pure. Nothing restores it."""
    if loss.method is LossMethod.VANISH:
        return [["ip", "-n", spec.switch_ns, "link", "set", spec.switch_if(loss.node), "down"]]
    return []


def placement_of(records: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """rank -> node, from the workers' first "start" marks (who held each rank at the start). Pure."""
    out: dict[int, str] = {}
    for r in records:
        if r.get("kind") == "start" and r.get("rank") is not None and int(r["rank"]) not in out:
            out[int(r["rank"])] = str(r.get("node"))
    return dict(sorted(out.items()))


def victims(placement: Mapping[int, str], node: int, world_size: int) -> tuple[list[int], str]:
    """(ranks on `node`, why not) for a loss of `node` given the placement. Pure: refuses a node
    that holds rank 0 (its agent hosts the workers' store) and a placement not yet complete."""
    if len(placement) < world_size:
        return [], f"only ranks {sorted(placement)} of {world_size} have started"
    ranks = sorted(r for r, n in placement.items() if n == str(node))
    if 0 in ranks:
        return ranks, f"node {node} holds rank 0, whose agent hosts the job's store: it cannot be lost"
    if not ranks:
        return ranks, f"node {node} holds no active rank (placement {dict(placement)})"
    return ranks, ""


class Reaper:
    """Performs one `NodeLoss` against a live topology from a background thread, logging every
    step as a JSON line (`kind` "loss", "loss-refused" or "skipped") to `log_path`."""

    def __init__(self, spec: TopologySpec, loss: NodeLoss, *, marks_dir: str | Path, log_path: str | Path,
                 world_size: int, job_alive: Callable[[], bool] = lambda: True, poll_s: float = 0.003):
        self.spec, self.loss, self.world_size = spec, loss, world_size
        spec.node_ns(loss.node)  # a node outside the fabric fails here, before anything runs
        self.watcher = MarkWatcher(marks_dir)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.job_alive = job_alive
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="reaper", daemon=True)
        self.error: BaseException | None = None
        self.done = False

    def start(self) -> Reaper:
        self._log({"kind": "schedule", "losses": [asdict(self.loss) | {"spec": self.loss.spec()}],
                   "topology": asdict(self.spec)})
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"t_wall": time.time(), **record}, default=str) + "\n")

    def _main(self) -> None:
        try:
            start = None
            while not self._stop.is_set():
                self.watcher.poll()
                start = anchor_time(self.loss, self.watcher.records, 0.0)
                if start is not None or not self.job_alive():
                    break
                time.sleep(self.poll_s)
            if start is None:
                self._log({"kind": "skipped", "index": 0, "spec": self.loss.spec(),
                           "why": "stopped" if self._stop.is_set() else "job ended before the anchor"})
                return
            while (now := time.monotonic()) < start and not self._stop.is_set():
                time.sleep(min(self.poll_s, start - now))
            placement = placement_of(self.watcher.records)
            ranks, why = victims(placement, self.loss.node, self.world_size)
            if why:
                self._log({"kind": "loss-refused", "index": 0, "spec": self.loss.spec(), "why": why,
                           "placement": placement})
                return
            self._lose(ranks, placement)
        except BaseException as exc:  # noqa: BLE001 - reported by the scenario, never silent
            self.error = exc
            self._log({"kind": "error", "error": repr(exc)})

    def _lose(self, ranks: list[int], placement: dict[int, str]) -> None:
        ns = self.spec.node_ns(self.loss.node)
        t0 = time.monotonic()
        for argv in loss_commands(self.spec, self.loss):
            run_ip(argv)
        t_link = time.monotonic()
        killed: list[int] = []
        t_kill = None
        # the agent spawns no one after its workers, but a worker may be mid-exec: sweep until empty
        for _ in range(50):
            pids = [p for p in namespace_pids(ns) if p != os.getpid()]
            if not pids:
                break
            t_kill = t_kill or time.monotonic()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.01)
        t1 = time.monotonic()
        self.done = True
        self._log({"kind": "loss", "index": 0, "spec": self.loss.spec(), "method": str(self.loss.method),
                   "node": self.loss.node, "update": self.loss.update, "aligned": self.loss.aligned,
                   "ranks": ranks, "placement": placement, "pids": sorted(set(killed)),
                   "t_start": t0, "t_link": t_link, "t_kill": t_kill, "t": t1,
                   # the fault: the node off the fabric (vanish) or its first process killed (kill)
                   "t_fault": t_link if self.loss.method is LossMethod.VANISH else (t_kill or t_link)})
