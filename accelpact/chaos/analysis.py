"""What each cut did, from the records a run leaves (pure, apart from `load_run`).

Inputs: the nemesis log (cut/restore times), the runtime's per-rank traces (recovery records,
commit edges, attach records per attempt), the workers' marks (health-check and boundary-check
times, placement), the checkpoint attempts log, the demo's result JSON and the agents' exit codes.
All times are CLOCK_MONOTONIC, shared by every process on the machine whatever its namespace.

A cut owns the window from its start to the next cut's start. Within it:

* outcome ``preserve``, ``rewind`` or ``replace`` (``rewind+preserve`` for a cut that needed
  both): recovery records with only in-memory actions, no restart — recovered in memory;
  ``restart``: a reject (a recovery record with another action, or a new attempt attached);
  ``absorbed``: no failure at all (the cut only stalled collectives); ``stopped``: the job ended
  without finishing (restart budget, rendezvous lost); ``skipped``: the anchor was never reached.
* detection: cut → the first rank whose update or health check saw the failure (its boundary
  check began with flag 1); for a failure inside an update that never reached its boundary (a
  Rewind), cut → the first rank admitted to the recovery;
* repair: Preserve — the protocol's repair time (slowest rank); restart — reject → first commit of
  the next attempt (restart, rendezvous, restore, replay of nothing yet);
* restore-to-progress: link restored → the first update committed after it on every rank (after the
  recovery, for an in-memory one): the availability gap the link's return leaves;
* bitwise: the run's verdict against its uninterrupted reference (final parameters, optimizer
  state, step, RNG, data cursor), given to every cut that reached training. It vouches for all of
  the run's cuts together: a recovery that went wrong would leave the end state different.

`in_memory_share` counts, of the cuts that caused a failure (not skipped, not absorbed), those
recovered in memory: the fraction `make chaos` prints.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["IN_MEMORY_ACTIONS", "CutResult", "InMemoryShare", "NodeLossResult", "RunRecords", "ScenarioResult",
           "analyse", "analyse_node_loss", "format_node_loss", "format_share", "format_table", "in_memory_outcome",
           "in_memory_share", "load_run", "recovered_in_memory"]

#: The recovery actions that keep the job's state in memory (no restart, no checkpoint reload).
IN_MEMORY_ACTIONS = ("preserve", "rewind", "replace", "shrink")


@dataclass
class RunRecords:
    nemesis: list[dict[str, Any]]
    traces: dict[int, list[dict[str, Any]]]
    marks: dict[int, list[dict[str, Any]]]
    attempts: list[dict[str, Any]]
    result: dict[str, Any] | None
    returncodes: list[int | None]
    stderr: str = ""
    local: int = 2
    trace_dir: str = ""
    checkpoint_steps: list[int] = field(default_factory=list)


@dataclass
class CutResult:
    index: int
    method: str
    length_s: float  # measured: cut in effect → restore done
    planned_s: float
    aligned: bool
    update: int
    outcome: str  # preserve | rewind | replace (or joined: rewind+preserve) | restart | stopped | absorbed | skipped
    landed: str  # where the cut first hit: boundary | forward | backward | optimizer | control | checkpoint | crash | none
    detect_s: float | None = None
    repair_s: float | None = None
    restore_to_progress_s: float | None = None
    resume_s: float | None = None  # restore → every rank released by the protocol (TCP backoff + repair)
    link_wait_s: float | None = None  # restore → the stalled control-plane check returned on every rank
    probe_s: float | None = None  # the longest wait for links before a check (`runtime.link_wait`), any rank
    failed_groups: list[str] = field(default_factory=list)
    #: a Preserve repaired a group whose ranks all sit on one node: a cut between nodes cannot
    #: break it, so the diagnosis was wrong (a Rewind rebuilds every group by design: not counted)
    same_node_replaced: bool = False
    replayed: int | None = None  # updates replayed after a restart (= lost since the checkpoint)
    lost: int | None = None  # updates since the last checkpoint when the job stopped for good
    bitwise: str = "-"  # the run's verdict vs its uninterrupted reference (see the module docstring)
    note: str = ""


@dataclass
class ScenarioResult:
    name: str
    cuts: list[CutResult]
    bitwise: str  # IDENTICAL | DIFFERENT (…) | n/a (why)
    completed: bool
    returncodes: list[int | None]
    placement: dict[int, str]
    restarts: int
    trace_dir: str
    message: str = ""
    fabric_error: str = ""  # the emulated fabric was not wholly torn down after the run (its result stands)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by SIGKILL
    return out


def load_run(root: str | Path, returncodes: Sequence[int | None], *, local: int = 2) -> RunRecords:
    """Read every record a run left under `root` (the layout of `job.JobPaths`)."""
    root = Path(root)
    traces = {int(p.stem.removeprefix("trace-rank")): _read_jsonl(p) for p in (root / "trace").glob("trace-rank*.jsonl")}
    marks = {int(p.stem.removeprefix("rank")): _read_jsonl(p) for p in (root / "marks").glob("rank*.jsonl")}
    result = None
    if (root / "result.json").exists():
        result = json.loads((root / "result.json").read_text())
    stderr = "\n".join((root / f"node{n}.err").read_text(errors="replace") for n in range(8)
                       if (root / f"node{n}.err").exists())
    steps = sorted(int(m.group(1)) for p in (root / "ckpt").glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name)))
    return RunRecords(nemesis=_read_jsonl(root / "trace" / "nemesis.jsonl"), traces=traces, marks=marks,
                      attempts=_read_jsonl(root / "ckpt" / "attempts.jsonl"), result=result,
                      returncodes=list(returncodes), stderr=stderr, local=local, trace_dir=str(root / "trace"),
                      checkpoint_steps=steps)


def _in(t: float | None, lo: float, hi: float) -> bool:
    return t is not None and lo <= t < hi


def _placement(marks: dict[int, list[dict[str, Any]]]) -> dict[int, str]:
    placement = {}
    for rank, recs in marks.items():
        starts = [r for r in recs if r.get("kind") == "start"]
        if starts:
            placement[rank] = str(starts[-1].get("node"))
    return dict(sorted(placement.items()))


def bitwise_verdict(result: dict[str, Any] | None) -> str | None:
    """IDENTICAL / DIFFERENT on ranks [...] from the workers' verdicts against their reference;
    None when the run reported none."""
    verdicts = (result or {}).get("verdicts", [])
    if not verdicts or "mismatches" not in verdicts[0]:
        return None
    bad = [v["rank"] for v in verdicts if v["mismatches"]]
    return "IDENTICAL" if not bad else f"DIFFERENT on ranks {bad}"


def _same_node(group_key: str, placement: dict[int, str]) -> bool:
    """A group key looks like "replicate[0,2]"; same-node if all its ranks sit on one node."""
    match = re.search(r"\[([\d,\s]*)\]", group_key)
    ranks = [int(x) for x in match.group(1).split(",") if x.strip()] if match else []
    nodes = {placement.get(r) for r in ranks}
    return len(nodes) == 1 and None not in nodes


def _commits_after(traces: dict[int, list[dict[str, Any]]], t: float) -> float | None:
    """Time by which every rank had committed an update after `t` (None if some rank never did)."""
    firsts = []
    for recs in traces.values():
        ts = [r["t"] for r in recs if r.get("kind") == "edge" and r.get("action") == "commit_update" and r["t"] > t]
        if not ts:
            return None
        firsts.append(min(ts))
    return max(firsts) if firsts else None


def _attempt_traces(traces: dict[int, list[dict[str, Any]]], attempt: int) -> dict[int, list[dict[str, Any]]]:
    """Each rank's records from its attach of `attempt` on (traces are appended across attempts)."""
    out = {}
    for rank, recs in traces.items():
        idx = next((i for i, r in enumerate(recs) if r.get("kind") == "attach" and r.get("attempt") == attempt), None)
        out[rank] = recs[idx:] if idx is not None else []
    return out


def _saving(traces: dict[int, list[dict[str, Any]]], cut: float, restore: float) -> bool:
    """A checkpoint save was running on some rank while the link was cut: its trace record is
    written when it ends (`t`) and says how long it took."""
    return any(r.get("kind") == "checkpoint" and r["t"] - r["seconds"] < restore and r["t"] > cut
               for recs in traces.values() for r in recs)


def _released(recovery: dict[str, Any]) -> float:
    """When the protocol released this rank: the record is written after the standbys were built
    again (`standby_s`), which is no part of detection or repair."""
    return recovery["t"] - recovery.get("standby_s", 0.0)


def _checkpoint_save_failed(attempts: Iterable[dict[str, Any]], first: int, before: float) -> bool:
    """A fail-stop because a checkpoint save failed at a frontier in [first, before): a cut
    anchored there met the save (its collectives run on the world group, outside the protocol)."""
    return any(a.get("event") == "fail_stop" and str(a.get("reason", "")).startswith("checkpoint save")
               and isinstance(a.get("frontier"), int) and first <= a["frontier"] < before for a in attempts)


def in_memory_outcome(actions: Sequence[str]) -> str | None:
    """The outcome of a cut whose recoveries took `actions` (in order), if every one of them kept
    the state in memory: the distinct actions joined ("rewind", "rewind+preserve"); else None."""
    distinct = list(dict.fromkeys(actions))
    if not distinct or any(a not in IN_MEMORY_ACTIONS for a in distinct):
        return None
    return "+".join(distinct)


def recovered_in_memory(outcome: str) -> bool:
    """Whether a cut's outcome ("rewind", "rewind+preserve", "restart", ...) kept the state in memory."""
    return in_memory_outcome(outcome.split("+")) is not None


@dataclass(frozen=True)
class InMemoryShare:
    """Of the cuts that caused a failure, how many were recovered in memory (`in_memory_share`)."""

    failed: int  # cuts that caused a failure: neither skipped nor absorbed
    in_memory: int
    bitwise_identical: int  # of the in-memory ones, in a run that ended bitwise IDENTICAL
    outcomes: dict[str, int]  # every outcome, skipped and absorbed included
    aligned: tuple[int, int]  # (in memory, failed) for cuts anchored in the committed window
    unaligned: tuple[int, int]

    @property
    def fraction(self) -> float | None:
        return self.in_memory / self.failed if self.failed else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fraction": self.fraction}


def in_memory_share(cuts: Iterable[CutResult]) -> InMemoryShare:
    """The share of failure-causing cuts recovered in memory (pure)."""
    cuts = list(cuts)
    outcomes: dict[str, int] = {}
    for c in cuts:
        outcomes[c.outcome] = outcomes.get(c.outcome, 0) + 1
    failed = [c for c in cuts if c.outcome not in ("skipped", "absorbed")]
    kept = [c for c in failed if recovered_in_memory(c.outcome)]

    def split(aligned: bool) -> tuple[int, int]:
        return (sum(1 for c in kept if c.aligned == aligned), sum(1 for c in failed if c.aligned == aligned))

    return InMemoryShare(failed=len(failed), in_memory=len(kept),
                         bitwise_identical=sum(1 for c in kept if c.bitwise == "IDENTICAL"),
                         outcomes=dict(sorted(outcomes.items())), aligned=split(True), unaligned=split(False))


def format_share(share: InMemoryShare) -> str:
    """One line: the fraction recovered in memory, by action, with the rest named."""
    if not share.failed:
        return "recovered in memory: no cut caused a failure (" + (
            ", ".join(f"{k} {v}" for k, v in share.outcomes.items()) or "no cuts") + ")"
    actions = ", ".join(f"{k} {v}" for k, v in share.outcomes.items() if recovered_in_memory(k))
    rest = ", ".join(f"{k} {v}" for k, v in share.outcomes.items() if not recovered_in_memory(k))
    parts = [f"recovered in memory: {share.in_memory}/{share.failed} cuts that caused a failure "
             f"({share.fraction:.0%}; {actions or 'none'}), {share.bitwise_identical} of them in runs bitwise IDENTICAL"]
    for label, (kept, failed) in (("aligned", share.aligned), ("unaligned", share.unaligned)):
        if failed:
            parts.append(f"{label} {kept}/{failed}")
    return "; ".join(parts) + (f"; otherwise: {rest}" if rest else "")


def analyse(rec: RunRecords, name: str = "run") -> ScenarioResult:
    cuts_log = {r["index"]: r for r in rec.nemesis if r.get("kind") == "cut"}
    restores = {r["index"]: r for r in rec.nemesis if r.get("kind") == "restore" and r.get("index", -1) >= 0}
    skipped = {r["index"]: r for r in rec.nemesis if r.get("kind") == "skipped"}
    schedule = next((r["cuts"] for r in rec.nemesis if r.get("kind") == "schedule"), [])
    placement = _placement(rec.marks)
    starts = sorted(c["t_start"] for c in cuts_log.values())
    all_recoveries = [r for recs in rec.traces.values() for r in recs if r.get("kind") == "recovery"]
    all_waits = [r for recs in rec.traces.values() for r in recs if r.get("kind") == "link_wait"]
    attaches = [r for recs in rec.traces.values() for r in recs if r.get("kind") == "attach"]
    boundaries = [r for recs in rec.marks.values() for r in recs if r.get("kind") == "boundary"]
    restored = [a for a in rec.attempts if a.get("event") == "restored"]

    reports = []
    for i, planned in enumerate(schedule):
        base = dict(index=i, method=planned["method"], planned_s=planned["length_s"], aligned=planned["aligned"],
                    update=planned["update"])
        if i not in cuts_log:
            why = skipped.get(i, {}).get("why", "not reached")
            reports.append(CutResult(**base, length_s=0.0, outcome="skipped", landed="-", note=why))
            continue
        cut = cuts_log[i]
        lo = cut["t_start"]
        next_update = schedule[i + 1]["update"] if i + 1 < len(schedule) else math.inf
        later = [s for s in starts if s > lo]
        hi = later[0] if later else math.inf
        restore = restores.get(i)
        t_restore = restore["t"] if restore else None
        length = (t_restore - cut["t"]) if t_restore else 0.0

        recs = [r for r in all_recoveries if _in(r["t"], lo, hi)]
        new_attempts = sorted({a["attempt"] for a in attaches if a.get("attempt", 0) > 0 and _in(a["t"], lo, hi)})
        flagged = [b for b in boundaries if b.get("flag") == 1 and _in(b["t_in"], lo, hi)]
        errored = [b for b in boundaries if "error" in b and _in(b["t_in"], lo, hi)]
        waits = [w for w in all_waits if _in(w["t"], lo, hi)]
        # a rank that waited for its links saw the failure when its wait began, before its check
        noticed = [w["t"] - w["waited_s"] for w in waits]

        actions = [r["action"] for r in sorted(recs, key=lambda r: r["t"])]
        in_memory = None if new_attempts else in_memory_outcome(actions)
        if in_memory is not None:
            outcome = in_memory
        elif recs or new_attempts or errored:
            # a restart counts only if the new attempt trained: one that attached and then hit the
            # restart budget (or never attached) means the job stopped here
            trained = bool(new_attempts) and _commits_after(_attempt_traces(rec.traces, new_attempts[0]), lo) is not None
            outcome = "restart" if trained else "stopped"
        elif t_restore is not None and _commits_after(rec.traces, t_restore) is None:
            outcome = "stopped"  # nothing committed after the link came back: the job died under this cut
        else:
            outcome = "absorbed"

        phases = sorted({r["failure_phase"] for r in recs})
        if flagged and any(b.get("failed") for b in flagged) and phases in ([], ["committed"]):
            landed = "boundary"
        elif phases:
            landed = "+".join(p for p in phases if p != "committed") or "boundary"
        elif _checkpoint_save_failed(rec.attempts, planned["update"], next_update):
            landed = "checkpoint"  # the verified checkpoint's save met the cut: fail-stop (the control
            # plane then fails on the ranks still waiting for the others: that is not where it landed)
        elif errored:
            landed = "control"
        elif new_attempts or outcome == "stopped":
            landed = "crash"  # workers died outside the protocol
        elif _saving(rec.traces, cut["t"], t_restore if t_restore is not None else hi):
            landed = "checkpoint"  # the save stalled across the cut and finished after it (absorbed)
        else:
            landed = "none"

        detect = None
        if flagged:
            detect = min([b["t_in"] for b in flagged] + noticed) - cut["t"]
        elif errored:
            detect = min([b["t_out"] for b in errored] + noticed) - cut["t"]
        elif recs:  # failed inside an update (a Rewind): the first rank admitted to the recovery
            detect = min([_released(r) - r.get("repair_s", 0.0) for r in recs] + noticed) - cut["t"]

        failed = sorted({g for r in recs for g in r.get("failed_groups", [])})
        report = CutResult(**base, length_s=round(length, 3), outcome=outcome, landed=landed,
                           detect_s=detect, probe_s=max((w["waited_s"] for w in waits), default=None),
                           failed_groups=failed,
                           same_node_replaced="preserve" in outcome and "rewind" not in outcome
                           and any(_same_node(g, placement) for g in failed))
        if in_memory is not None:
            report.repair_s = max(r["repair_s"] for r in recs)
            released = max(_released(r) for r in recs)
            progress = _commits_after(rec.traces, max(released, t_restore or 0.0))
            if t_restore is not None:
                report.resume_s = released - t_restore
                returned = [b["t_out"] for b in flagged if "t_out" in b]
                if returned:
                    report.link_wait_s = max(returned) - t_restore
                if progress is not None:
                    report.restore_to_progress_s = progress - t_restore
        elif outcome == "absorbed" and t_restore is not None:
            progress = _commits_after(rec.traces, t_restore)
            if progress is not None:
                report.restore_to_progress_s = progress - t_restore
        elif outcome == "restart":
            first_new = min(a["t"] for a in attaches if a.get("attempt") == new_attempts[0])
            reject_t = min([b["t_out"] for b in errored] + [r["t"] for r in recs] + [first_new])
            progress = _commits_after(_attempt_traces(rec.traces, new_attempts[0]), first_new)
            if progress is not None:
                report.repair_s = progress - reject_t
                if t_restore is not None:
                    report.restore_to_progress_s = progress - t_restore
            replays = [a.get("updates_replayed") for a in restored if a.get("attempt") in new_attempts]
            report.replayed = sum(x for x in replays if x is not None) if replays else None
            report.note = f"attempt {new_attempts[-1]}"
        if outcome == "stopped":
            fails = [a["frontier"] for a in rec.attempts if a.get("event") == "fail_stop" and a.get("frontier") is not None]
            if fails:
                kept = [s for s in rec.checkpoint_steps if s <= fails[-1]]
                report.lost = fails[-1] - (max(kept) if kept else 0)
                report.note = f"stopped at F={fails[-1]}, last checkpoint {max(kept) if kept else 'none'}"
        reports.append(report)

    mism = bitwise_verdict(rec.result)
    completed = rec.result is not None and all(rc == 0 for rc in rec.returncodes if rc is not None)
    message = ""
    if "restart budget exceeded" in rec.stderr:
        message = next((line.strip() for line in rec.stderr.splitlines() if "restart budget exceeded" in line), "")
    elif not completed:
        message = f"job did not finish (agent exit codes {rec.returncodes})"
    restarts = max([a.get("attempt", 0) for a in attaches] or [0])
    bitwise = mism or ("n/a (no result)" if rec.result is None else "n/a")
    for report in reports:
        if report.outcome != "skipped":
            report.bitwise = bitwise
    return ScenarioResult(name=name, cuts=reports, bitwise=bitwise,
                     completed=completed, returncodes=rec.returncodes, placement=placement, restarts=restarts,
                     trace_dir=rec.trace_dir, message=message)


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"


TABLE_HEADERS = ["run", "#", "method", "length", "anchor", "landed", "outcome", "detect", "probe", "repair",
                 "restore→progress", "replayed", "bitwise"]


def table_rows(reports: Iterable[ScenarioResult]) -> list[list[str]]:
    rows = []
    for run in reports:
        for c in run.cuts:
            anchor = f"{'@' if c.aligned else '~'}{c.update}"
            rows.append([run.name, str(c.index), c.method, f"{c.length_s:.2f}s" if c.length_s else f"({c.planned_s:g}s)",
                         anchor, c.landed, c.outcome, _fmt(c.detect_s), _fmt(c.probe_s), _fmt(c.repair_s),
                         _fmt(c.restore_to_progress_s),
                         str(c.replayed) if c.replayed is not None else (f"lost {c.lost}" if c.lost is not None else "-"),
                         c.bitwise.split(" ")[0]])
    return rows


def format_table(reports: Sequence[ScenarioResult]) -> str:
    rows = table_rows(reports)
    cells = [TABLE_HEADERS] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(TABLE_HEADERS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------------------ node loss


@dataclass
class NodeLossResult:
    """What the loss of a whole node did (`analyse_node_loss`)."""

    name: str
    spec: str  # the planned loss, e.g. node-kill:n1~6+0.05
    outcome: str  # replace | reject | stopped | skipped | refused | none
    node: int
    lost_ranks: list[int]
    bitwise: str  # IDENTICAL | DIFFERENT (…) | n/a (why)
    completed: bool  # every surviving agent exited 0 and the result was written
    returncodes: list[int | None]
    placement_before: dict[int, str]
    placement_after: dict[int, str]
    landed: str = "-"  # the phase(s) the survivors were in: forward | backward | optimizer | committed
    spares: dict[str, int] = field(default_factory=dict)  # lost rank -> launch rank of the spare
    sources: dict[str, int] = field(default_factory=dict)  # lost rank -> the replica peer that sent
    bytes_moved: int = 0
    frontier: int | None = None  # the committed frontier the new world resumed from (re-ran F+1)
    detect_s: float | None = None  # loss → the first survivor posts its presence
    agree_s: float | None = None  # loss → every survivor holds the membership decision
    spare_ready_s: float | None = None  # loss → the last spare attached (its script built the model)
    release_s: float | None = None  # loss → every position released into the new world
    fault_to_frontier_s: float | None = None  # loss → every position committed F+1 (the re-run update)
    barrier_waits_s: list[float] = field(default_factory=list)  # surviving agents at torchrun's exit barrier
    barrier_errors: int = 0
    message: str = ""
    fabric_error: str = ""  # the emulated fabric was not wholly torn down after the run (its result stands)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_WORKER_ERROR = re.compile(r"\[rank\d+\]: [\w.]*(?:Error|Exception)\b.*")
_BARRIER_DONE = re.compile(r"Done waiting for other agents\. Elapsed: ([0-9.]+) seconds")


def _after(recs: Iterable[dict[str, Any]], t: float, **match: Any) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("t", -math.inf) > t and all(r.get(k) == v for k, v in match.items())]


def analyse_node_loss(rec: RunRecords, name: str = "nodeloss", *, world_size: int = 4,
                      lost_node_rc_index: int | None = None) -> NodeLossResult:
    """One node loss, from the records the run left (pure). `lost_node_rc_index`: the lost
    node's place in `returncodes` (its agent is SIGKILLed: not counted against completion)."""
    schedule = next((r for r in rec.nemesis if r.get("kind") == "schedule"), {})
    planned = (schedule.get("losses") or [{}])[0]
    spec = str(planned.get("spec", "?"))
    node = int(planned.get("node", 1))
    loss = next((r for r in rec.nemesis if r.get("kind") == "loss"), None)
    others = [rc for i, rc in enumerate(rec.returncodes) if i != (node if lost_node_rc_index is None else lost_node_rc_index)]
    completed = rec.result is not None and all(rc == 0 for rc in others)
    mism = bitwise_verdict(rec.result)
    bitwise = mism or ("n/a (no result)" if rec.result is None else "n/a")
    waits = [float(x) for x in _BARRIER_DONE.findall(rec.stderr)]
    base = dict(name=name, spec=spec, node=node, bitwise=bitwise, completed=completed, returncodes=rec.returncodes,
                placement_after=_placement(rec.marks), barrier_waits_s=waits,
                barrier_errors=rec.stderr.count("Error waiting on exit barrier"))
    if loss is None:
        refused = next((r for r in rec.nemesis if r.get("kind") in ("loss-refused", "skipped")), {})
        outcome = "refused" if refused.get("kind") == "loss-refused" else "skipped"
        why = str(refused.get("why", "the loss never happened"))
        first_error = next((m.group(0) for m in _WORKER_ERROR.finditer(rec.stderr)), None)
        if outcome == "skipped" and first_error:  # the job died before the loss: say of what
            why += f"; the job failed before the loss: {first_error[:300]}"
        return NodeLossResult(**base, outcome=outcome, lost_ranks=[], placement_before=refused.get("placement", {}),
                              message=why)
    t0 = float(loss["t_fault"])
    lost = [int(r) for r in loss.get("ranks", [])]
    placement_before = {int(k): str(v) for k, v in loss.get("placement", {}).items()}
    every = [r for recs in rec.traces.values() for r in recs]
    recoveries = _after(every, t0, kind="recovery")
    actions = {r.get("action") for r in recoveries}
    if recoveries and actions == {"replace"}:
        outcome = "replace"
    elif recoveries:
        outcome = "reject"
    else:
        outcome = "stopped" if not completed else "none"
    result = NodeLossResult(**base, outcome=outcome, lost_ranks=lost, placement_before=placement_before)
    phases = sorted({str(r.get("failure_phase")) for r in recoveries})
    result.landed = "+".join(phases) if phases else "-"
    decided = _after(every, t0, kind="membership", event="decided")
    if decided:
        d = decided[0]
        result.spares = {str(k): int(v) for k, v in d.get("assign", {}).items()}
        result.sources = {str(k): int(v) for k, v in d.get("source", {}).items()}
        result.frontier = int(d.get("frontier", 0))
        result.agree_s = max(r["t"] for r in decided) - t0
    present = _after(every, t0, kind="membership", event="present")
    if present:
        result.detect_s = min(r["t"] for r in present) - t0
    sent = _after(every, t0, kind="membership", event="transfer_sent")
    result.bytes_moved = sum(int(r.get("bytes", 0)) for r in sent)
    # a spare appends to the lost rank's trace: its attach is the first attach record after the loss
    spare_attaches = [min(r["t"] for r in _after(rec.traces.get(p, []), t0, kind="attach") or [{"t": math.inf}])
                      for p in lost]
    if spare_attaches and all(t < math.inf for t in spare_attaches):
        result.spare_ready_s = max(spare_attaches) - t0
    if outcome == "replace" and result.frontier is not None:
        new_world = int(decided[0].get("world", 0)) + 1 if decided else None
        released = [min((r["t"] for r in _after(rec.traces.get(p, []), t0, kind="membership", event="release",
                                                world=new_world)), default=math.inf) for p in range(world_size)]
        if all(t < math.inf for t in released):
            result.release_s = max(released) - t0
        committed = [min((r["t"] for r in _after(rec.traces.get(p, []), t0, kind="edge", action="commit_update")
                          if r.get("F") == result.frontier + 1), default=math.inf) for p in range(world_size)]
        if all(t < math.inf for t in committed):
            result.fault_to_frontier_s = max(committed) - t0
    if not completed:
        result.message = f"job did not finish (agent exit codes {rec.returncodes})"
    elif outcome != "replace":
        reasons = sorted({x for r in recoveries for x in r.get("reasons", [])})
        result.message = "; ".join(reasons)[:300]
    return result


def format_node_loss(r: NodeLossResult) -> str:
    """A few lines for the printout."""
    lines = [f"{r.name}: {r.spec}  outcome {r.outcome}  landed {r.landed}  bitwise {r.bitwise}"]
    if r.lost_ranks:
        lines.append(f"  node {r.node} lost with ranks {r.lost_ranks} (placement before {r.placement_before}, "
                     f"after {r.placement_after})")
    if r.spares:
        lines.append(f"  spares {r.spares} took over, state from {r.sources} ({r.bytes_moved} B), new world re-ran "
                     f"update {None if r.frontier is None else r.frontier + 1}")
    lines.append(f"  detect {_fmt(r.detect_s)}  agreed {_fmt(r.agree_s)}  spares attached {_fmt(r.spare_ready_s)}  "
                 f"released {_fmt(r.release_s)}  fault→frontier {_fmt(r.fault_to_frontier_s)}  (from the loss)")
    waits = ", ".join(f"{w:.1f}s" for w in r.barrier_waits_s) or "-"
    lines.append(f"  agents exit {r.returncodes}; exit barrier waits {waits}"
                 + (f" ({r.barrier_errors} barrier error(s))" if r.barrier_errors else ""))
    if r.message:
        lines.append(f"  {r.message}")
    return "\n".join(lines)
