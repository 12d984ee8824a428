"""`accelpact report RUN_DIR`: what happened in a run, read back from its traces.

The traces (`trace-rank<r>.jsonl`, one per rank, every attempt appended) already hold every
commit and every protocol edge with a timestamp; this module turns them into the numbers an
operator asks for after an incident — recoveries and their outcomes, mean time to detect,
repair time per phase, updates lost, recovery time (RTO) and fault-to-frontier time — and into a
per-rank timeline picture.

Pure parsing and arithmetic (`summarize`, `timeline`, `format_summary`) are kept apart from file
reading and plotting, so the benches reuse them and the tests check them on records alone.
matplotlib is imported only by `plot_timeline`.

Clock: trace times are `time.monotonic()`, which on Linux is CLOCK_MONOTONIC, one clock for every
process of a host; ranks of one host (and a restarted attempt) are therefore on one time axis.
Ranks on different hosts are not: their records are compared only within the rank. So every
duration is taken on one rank (its own fault time to its own observe, decision, commit) and only
durations are compared across ranks; a recovery's `t_*` times are on its lowest rank's clock.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .observe.incident import IncidentFacts, nobody_lost, sentence

log = logging.getLogger("accelpact.report")

#: Per-phase timings the runtime records (`timings_s` keys: the protocol's effects, then a membership
#: change's laps), in the order they run; a name not listed here is shown after these, as first seen.
TIMING_PHASES = ("guard", "agree", "restore", "replace", "rebuild", "control", "rebind", "transfer", "small_state",
                 "validate", "release", "standby", "reject")

#: Outcomes that resume inside the same processes (no restart): RTO ends at the decision.
IN_MEMORY = ("preserve", "replace", "rewind", "shrink")


@dataclass(frozen=True)
class Segment:
    """One bar of the timeline: rank `rank` spent [start, end) in `kind`."""

    rank: int
    attempt: int
    kind: str  # update | replay | detect | Observe ... Validate | Resume | Reject | restart | setup
    start: float
    end: float
    label: str = ""


@dataclass
class Recovery:
    """One recovery as every rank saw it (slowest rank where times differ)."""

    attempt: int
    index: int
    update: int
    action: str
    failure_phase: str
    failed_groups: list[str]
    frontier_before: int  # committed frontier when the failure struck (F_fail)
    frontier_after: int  # resume frontier (Preserve) or the abandoned frontier (Restart)
    detect_s: float  # fault → every rank has observed it (slowest rank)
    repair_s: float  # control-plane admission → release / reject (slowest rank)
    phases_s: dict[str, float]  # slowest rank per protocol phase
    ranks: list[int]
    t_fault: float
    t_decided: float
    t_resumed: float | None = None  # training back at F_fail (RTO end)
    t_next_commit: float | None = None  # first commit past F_fail (fault-to-frontier end)
    restored_step: int | None = None  # checkpoint the next attempt restored (Restart)
    updates_lost: int | None = None  # committed updates redone: 0 under Preserve, A = F - C otherwise
    observers: list[int] = field(default_factory=list)  # ranks that saw it themselves, first first
    cause: str = ""  # the first observer's classified cause
    reasons: list[str] = field(default_factory=list)
    evidence: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its incident record
    nobody_lost: bool = False  # a Replace that replaced nobody (the world rebuilt around its members)
    #: rank -> when the fault struck as that rank tells it, on its own clock (not in `to_dict`)
    fault_at: dict[int, float] = field(default_factory=dict, repr=False)

    @property
    def facts(self) -> IncidentFacts:
        return IncidentFacts(
            update=self.update, phase=self.failure_phase, action=self.action, observers=tuple(self.observers),
            failed_groups=tuple(self.failed_groups), cause=self.cause, detect_s=self.detect_s,
            repair_s=self.repair_s, reasons=tuple(self.reasons), back_s=self.fault_to_frontier_s,
            restored_step=self.restored_step, nobody_lost=self.nobody_lost)

    @property
    def sentence(self) -> str:
        """The incident in plain words (`accelpact.observe.incident.sentence`)."""
        return sentence(self.facts)

    @property
    def rto_s(self) -> float | None:
        return None if self.t_resumed is None else self.t_resumed - self.t_fault

    @property
    def fault_to_frontier_s(self) -> float | None:
        return None if self.t_next_commit is None else self.t_next_commit - self.t_fault

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["fault_at"]  # per-host clocks: meaningless side by side
        d.update(rto_s=self.rto_s, fault_to_frontier_s=self.fault_to_frontier_s, sentence=self.sentence)
        return d


@dataclass
class RunSummary:
    ranks: list[int]
    attempts: int
    final_frontier: int
    updates_run: int  # update bodies that committed, replays included
    recoveries: list[Recovery] = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0
    #: the L2 fallback's saves as the lowest rank traced them: attempt, step, seconds, error if any
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    #: the longest span one host traced (None: t_end - t_start); hosts' clocks do not compare
    span_s: float | None = None

    @property
    def outcomes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.recoveries:
            out[r.action] = out.get(r.action, 0) + 1
        return out

    @property
    def mttd_s(self) -> float | None:
        return _mean([r.detect_s for r in self.recoveries])

    @property
    def mean_repair_s(self) -> float | None:
        return _mean([r.repair_s for r in self.recoveries])

    @property
    def mean_phases_s(self) -> dict[str, float]:
        """Each phase's mean over the recoveries that ran it: a Preserve has no `transfer`, and
        counting it as 0 would halve a Replace's."""
        names = _phase_order(n for r in self.recoveries for n in r.phases_s)
        return {p: statistics.fmean(r.phases_s[p] for r in self.recoveries if p in r.phases_s) for p in names}

    @property
    def updates_lost(self) -> int:
        return sum(r.updates_lost or 0 for r in self.recoveries)

    @property
    def mean_rto_s(self) -> float | None:
        return _mean([r.rto_s for r in self.recoveries if r.rto_s is not None])

    @property
    def wall_s(self) -> float:
        return self.span_s if self.span_s is not None else self.t_end - self.t_start

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks, "attempts": self.attempts, "final_frontier": self.final_frontier,
            "updates_run": self.updates_run, "wall_s": self.wall_s, "outcomes": self.outcomes,
            "mttd_s": self.mttd_s, "mean_repair_s": self.mean_repair_s, "mean_phases_s": self.mean_phases_s,
            "updates_lost": self.updates_lost, "mean_rto_s": self.mean_rto_s,
            "recoveries": [r.to_dict() for r in self.recoveries], "checkpoints": self.checkpoints,
        }


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _phase_order(names: Iterable[str]) -> list[str]:
    """Distinct phase names: the known ones in protocol order, then any other as first seen (a phase
    the runtime records that this module does not list yet is still shown)."""
    seen = list(dict.fromkeys(names))
    return [p for p in TIMING_PHASES if p in seen] + [p for p in seen if p not in TIMING_PHASES]


# ------------------------------------------------------------------------------ reading --------
def load_traces(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's records, in file order (attempts appended one after another).

    FileNotFoundError naming `run_dir` when it is no directory or holds no trace (the CLI prints it)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: {'not a directory' if run_dir.exists() else 'no such directory'}")
    out = {rank: read_jsonl(path, numeric=("t",)) for rank, path in rank_files(run_dir, "trace-rank")}
    if not out:
        raise FileNotFoundError(f"no trace-rank*.jsonl in {run_dir}")
    return out


def rank_files(run_dir: Path, prefix: str) -> list[tuple[int, Path]]:
    """(rank, path) of each `<prefix><r>.jsonl` in `run_dir`. A name that only starts alike (a copy
    such as `trace-rank0.bak.jsonl`) is no rank's file: skipped with a warning, not read as rank 0."""
    name = re.compile(rf"{re.escape(prefix)}(\d+)")
    out = []
    for path in sorted(run_dir.glob(f"{prefix}*.jsonl")):
        if (m := name.fullmatch(path.stem)) is None:
            log.warning("%s: not named %s<rank>.jsonl, ignored", path, prefix)
            continue
        out.append((int(m.group(1)), path))
    return sorted(out)


def read_jsonl(path: Path, *, warn: bool = True, numeric: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The JSON objects of one file, one a line. A SIGKILLed writer may leave its last line torn:
    that is expected as the file's last line, or just before the next process's `attach` (a
    restart or a spare appends after it), and skipped quietly. Any other bad line means the file
    was damaged and the report may miss what it held: skipped with a warning naming file and line.
    So is a record without a number under each of `numeric` (a trace record's time: found by review,
    one without it ended the report in a KeyError traceback)."""
    parsed: list[tuple[int, dict[str, Any] | None]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            parsed.append((n, rec if isinstance(rec, dict) else None))
    out = []
    for i, (n, rec) in enumerate(parsed):
        if rec is not None and any(isinstance(rec.get(k), bool) or not isinstance(rec.get(k), int | float)
                                   for k in numeric):
            if warn:
                log.warning("%s line %d: no number under %s, skipped (the file is damaged)", path, n, list(numeric))
            continue
        if rec is not None:
            out.append(rec)
            continue
        nxt = parsed[i + 1][1] if i + 1 < len(parsed) else None
        torn = i + 1 == len(parsed) or (nxt is not None and nxt.get("kind") == "attach")
        if warn and not torn:
            log.warning("%s line %d: not a JSON record, skipped (the file is damaged)", path, n)
    return out


def split_attempts(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, list[dict[str, Any]]]]:
    """One rank's records cut at each `attach`: [(attempt, records), ...] in order.

    Attempts are numbered by position (0, 1, ...), not by the record's torchrun restart count,
    so that a restart inside the same processes (the drills' `restart_after_reject`), where that
    count stays 0, still opens a new attempt. A spare that takes over the rank's position appends
    its own `attach` to the lost process's trace inside the same attempt: it opens none."""
    records = list(records)
    out: list[tuple[int, list[dict[str, Any]]]] = []
    for i, rec in enumerate(records):
        if not out or (rec.get("kind") == "attach" and not _takes_over(records, i)):
            out.append((len(out), []))
        out[-1][1].append(dict(rec))
    return out


def split_processes(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, list[dict[str, Any]]]]:
    """One rank's records cut at every `attach`, a spare's too: one entry per process that wrote
    them (a killed process, then the spare that took its position), numbered by position."""
    out: list[tuple[int, list[dict[str, Any]]]] = []
    for rec in records:
        if rec.get("kind") == "attach" or not out:
            out.append((len(out), []))
        out[-1][1].append(dict(rec))
    return out


def _takes_over(records: Sequence[Mapping[str, Any]], i: int) -> bool:
    """Whether the `attach` at `i` is a spare's (`runtime.member_change.join`): before any work of
    its own it traces membership `activated` (even when the join then fails) and, joined, `joined`.
    A restarted process traces neither; its first commit, observe or attach ends the search."""
    for rec in records[i + 1:]:
        kind = rec.get("kind")
        if kind == "joined" or (kind == "membership" and rec.get("event") == "activated"):
            return True
        if kind in ("attach", "observe", "recovery") or (kind == "edge" and rec.get("action") == "commit_update"):
            return False
    return False


# ------------------------------------------------------------------------------ summary --------
def _commits(recs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in recs if r.get("kind") == "edge" and r.get("action") == "commit_update"]


def _frontier_moves(recs: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(F, t) each time this rank's frontier advanced: commits, and Preserve recoveries at a
    committed boundary (they commit the update whose boundary failed without a commit edge)."""
    out = []
    for r in recs:
        if r.get("kind") == "edge" and r.get("action") == "commit_update":
            out.append((int(r["F"]), float(r["t"])))
        elif r.get("kind") == "recovery" and r.get("action") == "preserve" and r.get("failure_phase") == "committed":
            out.append((int(r["frontier"]), float(r["t"])))
    return out


def _fault_time(recs: Sequence[Mapping[str, Any]], observe: Mapping[str, Any], rec: Mapping[str, Any]) -> float:
    """When the fault struck, as this rank can tell.

    At a committed boundary the rank's boundary check started `detect_s` before its observe
    record. Inside an update the exception surfaced only after the data-plane timeout and the
    precise instant is not recorded, so the start of that update (the previous commit) is used:
    an upper bound on detection, never an underestimate. A deferred boundary's commit is taken
    during the next update, `late_s` after the update it commits ended: that end is the start.
    """
    if rec.get("failure_phase") == "committed":
        return float(observe["t"]) - float(rec.get("detect_s", 0.0))
    before = [r for r in recs if r.get("kind") in ("edge", "plans", "config") and r["t"] <= observe["t"]
              and (r.get("kind") != "edge" or r.get("action") in ("commit_update", "resume_training"))]
    if not before:
        return float(observe["t"]) - float(rec.get("detect_s", 0.0))
    return float(before[-1]["t"]) - float(before[-1].get("late_s", 0.0))


def summarize(traces: Mapping[int, Sequence[Mapping[str, Any]]]) -> RunSummary:
    """Recoveries, outcomes and times of one run from its per-rank records (pure)."""
    per_rank = {rank: split_attempts(recs) for rank, recs in traces.items()}
    ranks = sorted(per_rank)
    # (attempt, index) -> rank -> (observe record, recovery record, records of that attempt, position of the recovery)
    found: dict[tuple[int, int], dict[int, tuple[Mapping, Mapping, list, int]]] = {}
    all_t: list[float] = []
    final_frontier = 0
    updates_run = 0
    for rank, attempts in per_rank.items():
        rank_commits = 0
        for attempt, recs in attempts:
            all_t += [float(r["t"]) for r in recs if "t" in r]
            commits = _commits(recs)
            rank_commits += _bodies_committed(recs)
            if commits:
                final_frontier = max(final_frontier, int(commits[-1]["F"]))
            observe = None
            for i, rec in enumerate(recs):
                if rec.get("kind") == "observe":
                    observe = rec
                elif rec.get("kind") == "attach":  # a spare: what the lost process observed, it never recovered
                    observe = None
                elif rec.get("kind") == "recovery" and observe is not None:
                    found.setdefault((attempt, int(rec["index"])), {})[rank] = (observe, rec, recs, i)
                    observe = None
        updates_run = max(updates_run, rank_commits)
    for attempts in per_rank.values():
        for _, recs in attempts:
            for rec in recs:
                if rec.get("kind") == "recovery" and rec.get("action") == "preserve":
                    final_frontier = max(final_frontier, int(rec["frontier"]))

    recoveries = []
    for (attempt, index), by_rank in sorted(found.items()):
        observes = {r: o for r, (o, _, _, _) in by_rank.items()}
        recs_of = {r: rec for r, (_, rec, _, _) in by_rank.items()}
        first = recs_of[min(recs_of)]
        action = str(first["action"])
        # each rank's times on its own clock; only the durations they give are compared across ranks
        fault = {r: _fault_time(recs, observes[r], recs_of[r]) for r, (_, _, recs, _) in by_rank.items()}
        t_fault = fault[min(by_rank)]
        slowest: dict[str, float] = {}
        for rec in recs_of.values():
            for name, secs in rec.get("timings_s", {}).items():
                slowest[name] = max(slowest.get(name, 0.0), float(secs))
        phases = {name: slowest[name] for name in _phase_order(slowest)}
        failed = sorted({g for rec in recs_of.values() for g in rec.get("failed_groups", [])})
        update = int(first["update"])
        # F when the failure struck. Recovered in memory, it is the frontier every rank agreed on
        # and went on from (the same record on every rank): found by review, it was read off the
        # lowest rank's phase, so a Rewind where that rank had reached its boundary counted an
        # update lost and measured progress to the commit after the re-run. A Restart records the
        # frontier it abandons, which is the one a checkpoint must reach.
        committed = all(rec.get("failure_phase") == "committed" for rec in recs_of.values())
        frontier_before = (int(first["frontier"]) if action in IN_MEMORY or action == "reject"
                           else (update if committed else update - 1))
        recovery = Recovery(
            attempt=attempt, index=index, update=update, action=action,
            failure_phase=str(first.get("failure_phase")), failed_groups=failed,
            frontier_before=frontier_before, frontier_after=int(first["frontier"]),
            detect_s=max(float(observes[r]["t"]) - fault[r] for r in by_rank),
            repair_s=max(float(r.get("repair_s", 0.0)) for r in recs_of.values()),
            phases_s=phases, ranks=sorted(by_rank), t_fault=t_fault, fault_at=fault,
            t_decided=t_fault + max(float(recs_of[r]["t"]) - fault[r] for r in by_rank),
            observers=[r for r, o in sorted(observes.items(), key=lambda kv: float(kv[1]["t"])) if o.get("saw")],
            reasons=[str(x) for x in first.get("reasons", [])], nobody_lost=nobody_lost(first.get("replacement")),
        )
        recovery.cause = str(observes[recovery.observers[0]].get("cause", "")) if recovery.observers else ""
        after = {r: recs[i + 1:] for r, (_, _, recs, i) in by_rank.items()}
        _resolve_outcome(recovery, per_rank, after)
        recoveries.append(recovery)
    return RunSummary(ranks=ranks, attempts=max(len(a) for a in per_rank.values()),
                      final_frontier=final_frontier, updates_run=updates_run, recoveries=recoveries,
                      t_start=min(all_t) if all_t else 0.0, t_end=max(all_t) if all_t else 0.0,
                      checkpoints=_checkpoints(per_rank[ranks[0]]) if ranks else [],
                      span_s=_longest_host_span(traces))


def _bodies_committed(recs: Iterable[Mapping[str, Any]]) -> int:
    """Update bodies these records committed: one per commit edge, and one per Preserve at a
    committed boundary that moved the frontier (it commits that update without a commit edge)."""
    n, last = 0, None
    for r in recs:
        if r.get("kind") == "edge" and r.get("action") == "commit_update":
            n, last = n + 1, int(r["F"])
        elif r.get("kind") == "recovery" and r.get("action") == "preserve" and r.get("failure_phase") == "committed":
            n += last is None or int(r["frontier"]) > last
            last = int(r["frontier"])
    return n


def _longest_host_span(traces: Mapping[int, Sequence[Mapping[str, Any]]]) -> float | None:
    """The longest first-to-last record span of one host (the `host` its process's `attach` names,
    one unnamed host for records without): a span across hosts would mix their clocks."""
    spans: dict[Any, tuple[float, float]] = {}
    for recs in traces.values():
        host = None
        for rec in recs:
            if rec.get("kind") == "attach":
                host = rec.get("host")
            if "t" in rec:
                t = float(rec["t"])
                lo, hi = spans.get(host, (t, t))
                spans[host] = (min(lo, t), max(hi, t))
    return max((hi - lo for lo, hi in spans.values()), default=None)


def _slowest(rec: Recovery, times: Mapping[int, float | None],
             faults: Mapping[int, float] | None = None) -> float | None:
    """`rec.t_fault` plus the longest any rank took from its own fault time (`faults`, by default
    `rec.fault_at`) to its own `times[r]`: a time on the lowest rank's clock built from per-rank
    durations only (None: no rank has both)."""
    faults = rec.fault_at if faults is None else faults
    spans = [t - faults[r] for r, t in times.items() if t is not None and r in faults]
    return rec.t_fault + max(spans) if spans else None


def _checkpoints(attempts: Sequence[tuple[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """One rank's save records (every rank saves every step, and agrees on a failure)."""
    return [{"attempt": attempt, "step": int(r["step"]), "seconds": float(r.get("seconds", 0.0)),
             **({"error": str(r["error"])} if r.get("error") else {})}
            for attempt, recs in attempts for r in recs if r.get("kind") == "checkpoint"]


def checkpoint_line(summary: RunSummary) -> str | None:
    """The L2 fallback in one line: what was published, what failed and why (None: no saves)."""
    if not summary.checkpoints:
        return None
    published = [str(c["step"]) for c in summary.checkpoints if "error" not in c]
    failed = [f"{c['step']} ({c['error'][:160]})" for c in summary.checkpoints if "error" in c]
    return (f"checkpoints: published {', '.join(published) or 'none'}"
            + (f"; failed {'; '.join(failed)}" if failed else ""))


def _resolve_outcome(rec: Recovery, per_rank: Mapping[int, list[tuple[int, list[dict[str, Any]]]]],
                     after: Mapping[int, Sequence[Mapping[str, Any]]]) -> None:
    """Fill when training was back at F_fail, the first commit past it, and the updates lost.

    `after`: each rank's records that follow its recovery record in this attempt. Every time is
    measured on the rank that took it, from that rank's own fault time (`_slowest`)."""
    f_fail = rec.frontier_before
    if rec.action in IN_MEMORY:  # in memory, in this attempt
        rec.t_resumed = rec.t_decided
        rec.updates_lost = max(0, f_fail - rec.frontier_after)
        # every rank commits the same update together: the frontier moves when the last one does
        rec.t_next_commit = _slowest(rec, {r: _first_move(recs, lambda f: f > f_fail) for r, recs in after.items()})
        return
    nxt = rec.attempt + 1
    next_of = {r: attempts[nxt][1] for r, attempts in per_rank.items() if len(attempts) > nxt}
    if not next_of:
        return  # the run ended in this rejection
    firsts = [int(commits[0]["F"]) for recs in next_of.values() if (commits := _commits(recs))]
    if firsts:
        rec.restored_step = min(firsts) - 1
        rec.updates_lost = max(0, f_fail - rec.restored_step)
    faults = _restart_faults(rec, per_rank, next_of)
    back = {r: _first_move(recs, lambda f: f == f_fail) for r, recs in next_of.items()}
    if all(t is None for t in back.values()):  # not back at F_fail yet: back when it attached
        back = {r: float(recs[0]["t"]) for r, recs in next_of.items()}
    rec.t_resumed = _slowest(rec, back, faults)
    rec.t_next_commit = _slowest(rec, {r: _first_move(recs, lambda f: f > f_fail) for r, recs in next_of.items()},
                                 faults)


def _restart_faults(rec: Recovery, per_rank: Mapping[int, list[tuple[int, list[dict[str, Any]]]]],
                    next_of: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, float]:
    """The fault time each restarted rank can be measured from, on its own clock: its predecessor's
    when both ran on one host (or a record names none), else the earliest of the failed attempt's
    ranks on its host; a rank restarted on a host none of them ran on has none."""
    host_at = {r: _host(per_rank[r][rec.attempt][1], last=True) for r in rec.fault_at}
    by_host: dict[str, float] = {}
    for r, t in rec.fault_at.items():
        if (h := host_at[r]) is not None:
            by_host[h] = min(by_host.get(h, t), t)
    out = {}
    for r, recs in next_of.items():
        h = _host(recs, last=False)
        if r in rec.fault_at and (h is None or host_at[r] is None or h == host_at[r]):
            out[r] = rec.fault_at[r]
        elif h in by_host:
            out[r] = by_host[h]
    return out


def _first_move(recs: Iterable[Mapping[str, Any]], which: Callable[[int], bool]) -> float | None:
    """When these records first moved the frontier to an F that `which` accepts."""
    return next((t for f, t in _frontier_moves(recs) if which(f)), None)


def _host(recs: Sequence[Mapping[str, Any]], *, last: bool) -> str | None:
    """The host an attempt's first (or, `last`, its last: a spare's) `attach` names; None if none does."""
    hosts = [r.get("host") for r in recs if r.get("kind") == "attach"]
    return (hosts[-1] if last else hosts[0]) if hosts else None


# ------------------------------------------------------------------------------ timeline -------
def timeline(traces: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[Segment]:
    """Bars for the timeline picture: updates, replays, detection, each protocol phase, restarts."""
    summary = summarize(traces)
    # updates a restarted attempt runs again (F <= the frontier its predecessor abandoned)
    replay_upto = {r.attempt + 1: r.frontier_before for r in summary.recoveries if r.action == "reject"}
    segs: list[Segment] = []
    for rank, recs_all in sorted(traces.items()):
        prev_end: float | None = None
        for attempt, recs in split_attempts(recs_all):
            attach_t = float(recs[0]["t"])
            if prev_end is not None:
                segs.append(Segment(rank, attempt, "restart", prev_end, attach_t, "process restart"))
            cursor = attach_t
            phase: tuple[str, float] | None = None  # protocol phase in progress and its start
            observe: Mapping[str, Any] | None = None
            for i, rec in enumerate(recs):
                kind, t = rec.get("kind"), float(rec.get("t", cursor))
                if kind == "attach" and i > 0:  # a spare took over this rank's position (`split_attempts`)
                    segs.append(Segment(rank, attempt, "restart", cursor, t, "spare takes over"))
                    cursor, phase, observe = t, None, None
                elif kind == "edge" and rec.get("action") == "commit_update":
                    f = int(rec["F"])
                    kind_u = "replay" if f <= replay_upto.get(attempt, -1) else "update"
                    segs.append(Segment(rank, attempt, kind_u, cursor, t, f"u{rec.get('update', f)}"))
                    cursor = t
                elif kind == "observe":
                    observe = rec
                elif kind == "edge" and rec.get("to") == "Observe" and observe is not None:
                    outcome = next((r for r in recs[i:] if r.get("kind") == "recovery"), {})
                    committed = outcome.get("failure_phase") == "committed"
                    fault = float(observe["t"]) - float(outcome.get("detect_s", 0.0)) if committed else cursor
                    if fault > cursor:
                        segs.append(Segment(rank, attempt, "update", cursor, fault, f"u{rec.get('update')}"))
                    segs.append(Segment(rank, attempt, "detect", min(fault, t), t, "detect"))
                    phase = ("Observe", t)
                elif kind == "edge" and phase is not None:
                    segs.append(Segment(rank, attempt, phase[0], phase[1], t, str(rec.get("action"))))
                    phase = None if rec.get("to") in ("Train", "Resume") else (str(rec.get("to")), t)
                    cursor = t
                elif kind == "recovery":
                    if phase is not None:
                        segs.append(Segment(rank, attempt, phase[0], phase[1], t, "outcome"))
                        phase = None
                    cursor = max(cursor, t)
                    observe = None
            prev_end = max(float(r.get("t", attach_t)) for r in recs)
    return segs


# ------------------------------------------------------------------------------ text -----------
def format_summary(summary: RunSummary) -> str:
    """Human-readable summary of a run: one sentence per incident first, then the numbers."""
    lines = incident_lines(summary)
    lines += [
        f"ranks {len(summary.ranks)}  attempts {summary.attempts}  final frontier F={summary.final_frontier}  "
        f"updates run {summary.updates_run}  traced span {summary.wall_s:.2f} s",
        f"recoveries: {len(summary.recoveries)}  outcomes: "
        + (", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())) or "none"),
    ]
    for r in summary.recoveries:
        phases = "  ".join(f"{k} {v * 1e3:.1f}ms" for k, v in r.phases_s.items())
        f2f = f"{r.fault_to_frontier_s:.3f}s" if r.fault_to_frontier_s is not None else "n/a"
        rto = f"{r.rto_s:.3f}s" if r.rto_s is not None else "n/a (run ended)"
        lost = "n/a" if r.updates_lost is None else str(r.updates_lost)
        restored = f" restored C={r.restored_step}" if r.restored_step is not None else ""
        lines.append(
            f"  #{r.index} attempt {r.attempt} update {r.update} ({r.failure_phase}): {r.action}  "
            f"F_fail={r.frontier_before}{restored}  groups {','.join(r.failed_groups) or '-'}  "
            f"detect {r.detect_s:.3f}s  repair {r.repair_s * 1e3:.1f}ms  updates lost {lost}  RTO {rto}  "
            f"fault-to-frontier {f2f}"
        )
        if phases:
            lines.append(f"      phases (slowest rank): {phases}")
    if summary.recoveries:
        mttd = summary.mttd_s
        rto = summary.mean_rto_s
        lines.append(
            f"MTTD {mttd:.3f}s  mean repair {summary.mean_repair_s * 1e3:.1f}ms  updates lost {summary.updates_lost}"
            f"  mean RTO {'n/a' if rto is None else f'{rto:.3f}s'}"
        )
        lines.append("mean per phase: " + "  ".join(f"{k} {v * 1e3:.1f}ms" for k, v in summary.mean_phases_s.items()))
    if (saved := checkpoint_line(summary)) is not None:
        lines.append(saved)
    return "\n".join(lines)


def incident_lines(summary: RunSummary) -> list[str]:
    """"incidents:" and one plain-language line per incident (with where its evidence is)."""
    if not summary.recoveries:
        return ["incidents: none"]
    lines = ["incidents:"]
    for r in summary.recoveries:
        attempt = f" (attempt {r.attempt})" if summary.attempts > 1 else ""
        lines.append(f"  #{r.index}{attempt} {r.sentence}")
        stacks = [f"rank {rank} ({len(ev.get('stacks') or {})} threads)" for rank, ev in sorted(r.evidence.items())
                  if ev.get("stacks")]
        errors = sorted({f"{ev['error']['type']}: {ev['error']['message'][:100]}" for ev in r.evidence.values()
                         if ev.get("error")})
        if stacks:
            lines.append(f"      stacks of every thread (suspected hang): {', '.join(stacks)} in incidents-rank<r>.jsonl")
        for rank, ev in sorted(r.evidence.items()):
            if ev.get("hang_stacks"):
                lines.append(f"      rank {rank} during the hang: {hang_line(ev['hang_stacks'])}")
        for err in errors:
            lines.append(f"      error: {err}")
    return lines


#: The deferred boundary's check thread (`runtime.check_thread.THREAD_NAME`; not imported: this
#: module reads reports and must not pull in torch).
CHECK_THREAD = "accelpact-boundary-check"


def hang_line(hang: dict[str, Any], frames: int = 2) -> str:
    """Where the training thread of a rank was while it hung: "0.50 s into forward of update 2 (update
    0.52 s): inject.py:49 in perform: time.sleep(...) <- injector.py:78 in on_phase: ..."."""
    stacks = hang.get("stacks") or {}
    main = next((v for k, v in stacks.items() if k.startswith("MainThread ")), None)
    where = " <- ".join(_short_frame(f) for f in reversed((main or [])[-frames:])) or "no main thread stack"
    if main and "check_thread.py" in main[-1]:  # it waits for the deferred check: where that waits says more
        check = next((v for k, v in stacks.items() if k.startswith(f"{CHECK_THREAD} ")), None)
        if check:
            where += f" (the check's thread: {_short_frame(check[-1])})"
    threads = f"{len(stacks)} thread{'' if len(stacks) == 1 else 's'}"
    return (f"{hang.get('phase_ran_s', 0.0):.2f} s into {hang.get('phase', '?')} of update {hang.get('update', '?')} "
            f"(update {hang.get('update_ran_s', 0.0):.2f} s; {threads} in incidents-rank<r>.jsonl): {where}")


def _short_frame(frame: str) -> str:
    """"/a/b/c/torch/distributed/x.py:12 in f: code" -> "distributed/x.py:12 in f: code"."""
    path, _, rest = frame.partition(":")
    return "/".join(Path(path).parts[-2:]) + ":" + rest


def attach_evidence(summary: RunSummary, run_dir: str | Path) -> None:
    """Attach each rank's incident record (`incidents-rank<r>.jsonl`) to its recovery: the record
    with the recovery's index that the rank wrote first after its own fault time."""
    for rank, path in rank_files(Path(run_dir), "incidents-rank"):
        docs = read_jsonl(path, warn=False)  # evidence only: a torn record costs one incident's detail
        for rec in summary.recoveries:
            if rank not in rec.ranks:
                continue
            since = rec.fault_at.get(rank, rec.t_fault)  # this rank's own clock: other hosts' do not compare
            after = [d for d in docs if d.get("index") == rec.index and float(d.get("t", 0.0)) >= since]
            if after:
                rec.evidence[rank] = min(after, key=lambda d: float(d["t"]))


# ------------------------------------------------------------------------------ picture --------
COLORS = {
    "setup": "#d9d9d9", "update": "#4c72b0", "replay": "#dd8452", "detect": "#c44e52", "restart": "#8c8c8c",
    "Observe": "#937860", "Guard": "#da8bc3", "Agree": "#8172b3", "Replace": "#ccb974", "Rebind": "#64b5cd",
    "Validate": "#55a868", "Reject": "#000000",
}


def plot_timeline(segments: Sequence[Segment], summary: RunSummary, path: str | Path, title: str = "") -> Path:
    """Per-rank timeline PNG: one lane per rank, updates and each recovery phase as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = summary.t_start
    ranks = summary.ranks
    fig, ax = plt.subplots(figsize=(13, 1.4 + 0.6 * len(ranks)))
    used: list[str] = []
    for seg in segments:
        width = max(seg.end - seg.start, 0.002)
        ax.barh(seg.rank, width, left=seg.start - t0, height=0.6, color=COLORS.get(seg.kind, "#cccccc"),
                edgecolor="white" if seg.kind in ("update", "replay") else None, linewidth=0.3)
        if seg.kind not in used:
            used.append(seg.kind)
    for r in summary.recoveries:
        ax.axvline(r.t_fault - t0, color="#c44e52", linestyle=":", linewidth=1)
        label = f"#{r.index} {r.action}"
        ax.text(r.t_fault - t0, len(ranks) - 0.4, label, fontsize=8, color="#c44e52")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first trace record")
    ax.set_title(title or "AccelPact run timeline")
    ax.legend(handles=[Patch(color=COLORS.get(k, "#cccccc"), label=k) for k in used], loc="center left",
              bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ CLI ------------
def _evidence_lines(run_dir: Path) -> list[str]:
    """One line per attempt that left fail-stop evidence (reject-rank<r>-attempt<a>.json)."""
    by_attempt: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(run_dir.glob("reject-rank*-attempt*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        by_attempt.setdefault(str(doc.get("attempt", "?")), []).append(doc)
    lines = []
    for attempt, docs in sorted(by_attempt.items()):
        reasons = docs[0].get("reasons") or ["(no reason recorded)"]
        lines.append(f"fail-stop evidence, attempt {attempt}: {len(docs)} rank(s) exited "
                     f"{docs[0].get('exit_code')} at F={docs[0].get('frontier')}: {str(reasons[0])[:200]}")
        for doc in sorted(docs, key=lambda d: d.get("rank", -1)):  # a reject the protocol never reached, too
            hang = (doc.get("incident") or {}).get("hang_stacks")
            if hang:
                lines.append(f"      rank {doc.get('rank')} during the hang: {hang_line(hang)}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="directory holding trace-rank<r>.jsonl (a demo's --trace-dir)")
    parser.add_argument("--png", default=None, help="timeline picture (default RUN_DIR/timeline.png)")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the summary as JSON here")
    parser.add_argument("--no-plot", action="store_true", help="text summary only")


def run(args: argparse.Namespace) -> int:
    traces = load_traces(args.run_dir)
    summary = summarize(traces)
    attach_evidence(summary, args.run_dir)
    print(format_summary(summary))
    for line in _evidence_lines(Path(args.run_dir)):
        print(line)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary.to_dict(), indent=2))
    if not args.no_plot:
        png = args.png or str(Path(args.run_dir) / "timeline.png")
        if Path(png).is_dir():  # found by review: matplotlib wrote "<dir>.png" beside it and we named the dir
            png = str(Path(png) / "timeline.png")
        try:
            plot_timeline(timeline(traces), summary, png, title=f"AccelPact run {args.run_dir}")
        except ImportError:
            print("matplotlib is not installed: no timeline picture (pip install matplotlib)")
            return 0
        print(f"timeline: {png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelpact report", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
