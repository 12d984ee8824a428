"""The nemesis: cut node 1's link mid-training and restore it, by a named method, on a schedule.

Decide vs effect: a schedule is a list of `Cut`s, made by `parse_schedule` or `plan_random` (pure,
seeded: the same seed always gives the same campaign), and the `ip`/`bridge`/`nft` argv of each
method come from `cut_commands` (pure). `Nemesis` only waits for each cut's anchor, runs the argv,
and logs every cut and restore with monotonic timestamps (the clock of the runtime's traces) to
`nemesis.jsonl` beside them.

Anchors. A cut is anchored to the committed boundary of an update `k`:

* aligned (``@k``): the ranks dwell after their optimizer step at update `k` (see
  `accelpact.chaos.worker`), and the cut starts `offset` seconds into the dwell, so the first
  cross-node collective it meets is the boundary health check (the Preserve case);
* unaligned (``~k``): the cut starts `offset` seconds after update `k` committed, wherever training
  then is (mostly forward/backward: the realistic case, reported as measured).

Methods (all cut node `node`'s only link; nothing on the other node changes):

* ``bridge-drop``  nft drop rule on the bridge (needs nftables; nothing on the node changes);
* ``port-block``   the bridge port set to *disabled* (frames dropped at the switch, carrier up;
  iproute2 only — the stand-in for bridge-drop where nft is missing);
* ``switch-down``  the switch end of the node's veth set down ("cable pulled at the switch");
* ``node-down``    the node's own end set down (its routes vanish: new connections fail at once).
"""

from __future__ import annotations

import enum
import json
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .topology import TopologyError, TopologySpec, run_ip

__all__ = [
    "Cut",
    "CutMethod",
    "MarkWatcher",
    "Nemesis",
    "cut_commands",
    "format_schedule",
    "method_available",
    "parse_schedule",
    "plan_random",
]


class CutMethod(enum.StrEnum):
    BRIDGE_DROP = "bridge-drop"
    PORT_BLOCK = "port-block"
    SWITCH_DOWN = "switch-down"
    NODE_DOWN = "node-down"


@dataclass(frozen=True)
class Cut:
    """One planned cut: `method` for `length_s` seconds, anchored to update `update`'s boundary."""

    method: CutMethod
    length_s: float
    update: int
    aligned: bool = True
    offset_s: float = 0.05
    node: int = 1

    def __post_init__(self) -> None:
        if self.length_s <= 0:
            raise ValueError(f"cut length must be positive, got {self.length_s}")
        if self.update < 1:
            raise ValueError(f"anchor update must be >= 1, got {self.update}")
        if self.offset_s < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset_s}")

    def spec(self) -> str:
        anchor = "@" if self.aligned else "~"
        return f"{self.method}:{self.length_s:g}{anchor}{self.update}+{self.offset_s:g}"


def parse_schedule(text: str, *, node: int = 1) -> list[Cut]:
    """``"port-block:3@8,switch-down:0.4~12+0.02"`` → cuts. ``@k`` aligned, ``~k`` unaligned;
    ``+o`` the offset in seconds (default 0.05). Anchors must increase: cuts never overlap."""
    cuts = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            method, rest = item.split(":", 1)
            aligned = "@" in rest
            length, anchor = rest.split("@" if aligned else "~", 1)
            update, _, offset = anchor.partition("+")
            cuts.append(Cut(CutMethod(method), float(length), int(update), aligned,
                            float(offset) if offset else 0.05, node))
        except ValueError as exc:
            raise ValueError(f"bad cut {item!r} (want METHOD:SECONDS@UPDATE[+OFFSET], methods "
                             f"{', '.join(m.value for m in CutMethod)}): {exc}") from None
    _check_order(cuts)
    return cuts


def format_schedule(cuts: Sequence[Cut]) -> str:
    return ",".join(c.spec() for c in cuts)


def plan_random(
    seed: int,
    n: int,
    *,
    lengths: Sequence[float],
    methods: Sequence[CutMethod] = tuple(CutMethod),
    first_update: int = 4,
    gap: tuple[int, int] = (3, 6),
    aligned: float | bool = True,
    max_offset_s: float = 0.2,
    node: int = 1,
) -> list[Cut]:
    """`n` cuts drawn from `random.Random(seed)`: methods and lengths each cycle through a fresh
    shuffle of their list (so a short campaign still mixes them), anchors `gap` updates apart,
    aligned with probability `aligned` (or always/never for a bool), unaligned offsets uniform in
    [0, max_offset_s). Pure: the same arguments give the same schedule."""
    if n < 1 or not lengths or not methods:
        raise ValueError("plan_random needs n >= 1 and non-empty lengths and methods")
    rng = random.Random(seed)
    method_seq, length_seq = _shuffled_cycle(rng, methods, n), _shuffled_cycle(rng, lengths, n)
    cuts, update = [], first_update
    for i in range(n):
        is_aligned = aligned if isinstance(aligned, bool) else rng.random() < aligned
        offset = 0.05 if is_aligned else round(rng.uniform(0.0, max_offset_s), 3)
        cuts.append(Cut(method_seq[i], float(length_seq[i]), update, is_aligned, offset, node))
        update += rng.randint(*gap)
    return cuts


def _shuffled_cycle(rng: random.Random, items: Sequence[Any], n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        chunk = list(items)
        rng.shuffle(chunk)
        out += chunk
    return out[:n]


def _check_order(cuts: Sequence[Cut]) -> None:
    for a, b in zip(cuts, cuts[1:]):
        if b.update <= a.update:
            raise ValueError(f"cut anchors must increase: {a.spec()} then {b.spec()}")


def method_available(method: CutMethod) -> str | None:
    """None if `method` can run here, else why not (bridge-drop needs nft)."""
    if method is CutMethod.BRIDGE_DROP and shutil.which("nft") is None:
        return "bridge-drop needs nft (apt-get install nftables); port-block is the iproute2-only stand-in"
    return None


def cut_commands(spec: TopologySpec, method: CutMethod, node: int = 1) -> tuple[list[list[str]], list[list[str]]]:
    """(cut argv list, restore argv list) for `method` on `node`'s link. Pure."""
    sw, port = spec.switch_ns, spec.switch_if(node)
    if method is CutMethod.BRIDGE_DROP:
        table = f"apc{spec.tag}cut"
        return (
            [["ip", "netns", "exec", sw, "nft", _nft_rules(table, port)]],
            [["ip", "netns", "exec", sw, "nft", "delete", "table", "bridge", table]],
        )
    if method is CutMethod.PORT_BLOCK:
        return (
            [["ip", "netns", "exec", sw, "bridge", "link", "set", "dev", port, "state", "0"]],
            [["ip", "netns", "exec", sw, "bridge", "link", "set", "dev", port, "state", "3"]],
        )
    if method is CutMethod.SWITCH_DOWN:
        return ([["ip", "-n", sw, "link", "set", port, "down"]], [["ip", "-n", sw, "link", "set", port, "up"]])
    if method is CutMethod.NODE_DOWN:
        ns, nif = spec.node_ns(node), spec.node_if(node)
        return ([["ip", "-n", ns, "link", "set", nif, "down"]], [["ip", "-n", ns, "link", "set", nif, "up"]])
    raise ValueError(f"unknown cut method {method!r}")  # pragma: no cover


def _nft_rules(table: str, port: str) -> str:
    """One atomic ruleset: drop every frame forwarded from or to `port` (nft takes it as one argv)."""
    return (f"table bridge {table} {{ chain cut {{ type filter hook forward priority 0; policy accept; "
            f'iifname "{port}" drop; oifname "{port}" drop; }}; }}')


class MarkWatcher:
    """Incremental reader of the workers' marks (`rank<r>.jsonl`), for anchors."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._offsets: dict[Path, int] = {}
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        new = []
        for path in sorted(self.dir.glob("rank*.jsonl")):
            off = self._offsets.get(path, 0)
            with open(path, encoding="utf-8") as fh:
                fh.seek(off)
                chunk = fh.read()
            end = chunk.rfind("\n") + 1  # only whole lines; a partial one is read next time
            self._offsets[path] = off + end
            new += [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
        self.records += new
        return new


def anchor_time(cut: Cut, records: Sequence[dict[str, Any]], after: float) -> float | None:
    """When `cut` may start, given the marks so far (pure): the first dwell at its update (aligned)
    or the first commit of its update (unaligned) seen after `after`, plus the offset."""
    for r in records:
        if cut.aligned and r.get("kind") == "dwell" and r["update"] == cut.update and r["t"] > after:
            return r["t"] + cut.offset_s
        if (not cut.aligned and r.get("kind") == "boundary" and r["update"] == cut.update
                and r.get("result") == 0 and r["t_out"] > after):
            return r["t_out"] + cut.offset_s
    return None


class Nemesis:
    """Runs a schedule against a live topology in a background thread; `stop()` restores the
    link whatever state it is in. Every action goes to `log_path` as one JSON line."""

    def __init__(self, spec: TopologySpec, cuts: Sequence[Cut], *, marks_dir: str | Path, log_path: str | Path,
                 job_alive: Callable[[], bool] = lambda: True, poll_s: float = 0.003):
        for cut in cuts:
            why = method_available(cut.method)
            if why:
                raise TopologyError(why)
        _check_order(cuts)
        self.spec = spec
        self.cuts = list(cuts)
        self.watcher = MarkWatcher(marks_dir)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.job_alive = job_alive
        self.poll_s = poll_s
        self._stop = threading.Event()
        #: the cut in effect and its index: a restore on the way out is logged under that cut
        self._cut_active: tuple[int, Cut] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="nemesis", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Nemesis:
        self._log({"kind": "schedule", "cuts": [asdict(c) | {"spec": c.spec()} for c in self.cuts],
                   "topology": asdict(self.spec)})
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._restore_if_cut("stop")

    def _log(self, record: dict[str, Any]) -> None:
        record = {"t_wall": time.time(), **record}
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def _main(self) -> None:
        after = 0.0
        try:
            for i, cut in enumerate(self.cuts):
                start = self._wait_anchor(cut, after)
                if start is None:
                    self._log({"kind": "skipped", "index": i, "spec": cut.spec(),
                               "why": "stopped" if self._stop.is_set() else "job ended before the anchor"})
                    continue
                while (now := time.monotonic()) < start and not self._stop.is_set():
                    time.sleep(min(self.poll_s, start - now))
                after = self._one(i, cut)
        except BaseException as exc:  # the thread must never die with the link cut
            self.error = exc
            self._log({"kind": "error", "error": repr(exc)})
        finally:
            self._restore_if_cut("nemesis exit")

    def _wait_anchor(self, cut: Cut, after: float) -> float | None:
        while not self._stop.is_set():
            self.watcher.poll()
            t = anchor_time(cut, self.watcher.records, after)
            if t is not None:
                return t
            if not self.job_alive():
                return None
            time.sleep(self.poll_s)
        return None

    def _one(self, i: int, cut: Cut) -> float:
        cut_argv, restore_argv = cut_commands(self.spec, cut.method, cut.node)
        t0 = time.monotonic()
        with self._lock:
            for argv in cut_argv:
                run_ip(argv)
            self._cut_active = (i, cut)
        t1 = time.monotonic()
        self._log({"kind": "cut", "index": i, "spec": cut.spec(), "method": str(cut.method), "node": cut.node,
                   "length_s": cut.length_s, "update": cut.update, "aligned": cut.aligned,
                   "t_start": t0, "t": t1})
        # the length runs from the moment the cut is certainly in effect
        self._stop.wait(max(0.0, t1 + cut.length_s - time.monotonic()))
        t2 = time.monotonic()
        with self._lock:
            for argv in restore_argv:
                run_ip(argv)
            self._cut_active = None
        t3 = time.monotonic()
        self._log({"kind": "restore", "index": i, "spec": cut.spec(), "t_start": t2, "t": t3,
                   "length_s": t3 - t1, "early": self._stop.is_set()})
        return t3

    def _restore_if_cut(self, why: str) -> None:
        with self._lock:
            if self._cut_active is None:
                return
            index, cut = self._cut_active
            for argv in cut_commands(self.spec, cut.method, cut.node)[1]:
                try:
                    run_ip(argv)
                except Exception as exc:  # the topology may already be gone
                    self._log({"kind": "restore-failed", "why": why, "error": repr(exc)})
            self._cut_active = None
            # under the cut's index: analysis drops an unattributed restore, and a cut the job then
            # died under would count as absorbed
            self._log({"kind": "restore", "index": index, "why": why, "t": time.monotonic()})
