"""Trace validation: check with TLC that a recorded run is a behaviour of spec/AccelPact.tla.

Every rank writes one JSON-lines record per protocol edge (accelpact/trace.py). This module

1. reads a run directory, checks each attempt's vector clocks against happens-before and the
   protocol's message pattern (`causality.py`: a release that has not seen every peer validate is
   refused there, naming the record), and merges the ranks' edge records into one sequence that
   respects happens-before (pure);
2. maps each record onto the spec's vocabulary (pure, `abstract_attempt`), cutting the run into
   segments of one recovery each (each checked against an instance whose groups are the failed
   group R and the rest of the world, so that the fault's choice of group is the recorded one);
3. writes a TLA+ module holding the segments as a constant and a trace spec whose every step must
   be the spec's own action named by the record, with the recorded phase, F, g and reference
   generation (`render_module`), and runs TLC on many segments at once (`validate_segments`):
   first in the merge's order; a segment refused there whose clocks allow other orders is run
   again with the records per rank, any rank taking its next record once the records its clock
   has seen are taken, so TLC explores every interleaving the clocks allow (`causal_needs`);
   the segment passes if one of them is a behaviour of the spec;
4. for a segment that TLC cannot follow to its end, names the record every order fails at (the
   merge's order alone: its next record) and runs TLC once more to get a state just before it
   (`_diagnose`).

Between records the trace spec lets the environment steps of the spec happen unrecorded (the
decision and resume published by rank 0, control-plane timeouts, the fault, crashes of ranks that
record nothing more): the runtime writes no record for them.

The mapping from records to spec values is the only place where the runtime and the spec
differ in bookkeeping, so it is spelled out here:

- Merge order: a record comes after every record its vector clock has seen; records the clocks
  call concurrent are ordered by control-plane sequence number, then by protocol stage (the
  table's row order), then rank; every rank's own record order is kept. The clocks do not put an
  observer before the ranks that join because of it: both learn of the failure from the same
  boundary all-reduce, and the spec needs the observation first (`FlagRaised`). That tie-break
  is only TLC's first try: if the spec refuses it, every other order of concurrent records is
  explored. Segments are cut, and the records below implied, on the merge's order; an implied
  record keeps its place in every order explored (everything merged before it precedes it). A
  trace written before the clocks (no `vc`), or with clocks that break causality, is checked
  in its merge by sequence number, stage and rank alone: what one rank could have seen of
  another is not in it.
- A fault at a committed boundary strikes, in the spec, after every rank committed the update
  (`commit_update`, then `DataPlaneFailure`); the runtime learns of it at the boundary check that
  would have counted it, reports F+1, and counts it when the recovery returns. For such a recovery
  the implied `commit_update` of every rank is inserted and the recovery's recorded F is read +1.
- A deferred boundary (`Config.boundary = "deferred"`) commits when its flag is settled, during
  the next update. A rank that dies in between never writes that commit, yet it had posted a
  clean flag (a peer's commit of F proves the all-reduce returned 0, which needs every rank's
  flag). Its implied `commit_update` of F is inserted where the spec's rank order puts it.
- The runtime's g counts completed recoveries and moves to g+1 only when the protocol returns,
  while the spec moves a rank to g+1 when it builds the replacement (`replace_comm`) or releases.
  So a rank's g is read +1 from its `replace_comm` on, and on `release`/`resume_training` of a
  preserved recovery (F is already +1 there by the previous rule: Preserve needs a committed
  boundary).
- References: the spec's `refs[r][s]` (r in R) is read from the generation of every cached
  reference class of r's failed groups (all slots equal; the smallest if they differ).
  `replace_comm` is not checked: the spec folds the rebind walk into it, while the runtime
  records it before the walk (the `rebind_refs` record after it is checked).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .causality import CausalViolation, causal_merge, causal_needs, has_clocks, stuck, total_needs, violations
from .tlc import TlcResult, TraceState, run_tlc, run_tlc_many

TRACE_MODULE = "AccelPactTrace"
SLOTS = (1, 2)
#: Protocol stage of each trigger: the table's row order (merge tie-break within one sequence number).
_STAGE = {
    "commit_update": 0, "observe_failure": 1, "join_recovery": 2, "enter_guard": 3, "submit_report": 4,
    "decide_preserve": 5, "decide_rewind": 6, "stand_by": 7, "decide_reject": 8, "replace_comm": 9,
    "replace_failed": 10, "rebind_refs": 11, "rebind_failed": 12, "release": 13, "rewind": 14,
    "release_reject": 15, "abort": 16, "resume_training": 17,
}
_R_ONLY = {"observe_failure", "decide_preserve", "decide_rewind", "replace_comm", "replace_failed", "rebind_refs",
           "rebind_failed"}
_PROGRESS_RE = re.compile(r'<<"accelpact-progress", (\d+), (\d+), (\d+), (\d+)>>')
SPEC_VARIABLES = ("phase", "frontier", "gen", "refs", "validated", "obs", "reports", "decision", "outcome",
                  "retired", "crashed", "phi", "fr", "resumedAt", "tau", "copy", "cut", "cpDown", "edge")


class TraceFormatError(ValueError):
    """The run directory holds no usable trace (no files, unreadable lines, missing fields)."""


class TraceTimeout(RuntimeError):
    """TLC ran out of time on a trace module."""


# -- reading and merging (pure apart from reading files) --------------------------------------------
@dataclass(frozen=True)
class Source:
    """Where a record came from, for error messages."""

    file: str
    line: int


@dataclass
class RankLog:
    """One rank's records of one attach (attempt), in file order."""

    rank: int
    records: list[tuple[Source, dict[str, Any]]] = field(default_factory=list)

    @property
    def edges(self) -> list[tuple[Source, dict[str, Any]]]:
        return [(s, r) for s, r in self.records if r.get("kind") == "edge"]

    def config(self) -> dict[str, Any]:
        return next((r for _, r in self.records if r.get("kind") == "config"), {})

    def host(self) -> str:
        """The host named by the attach record ("" in a trace from before hosts were recorded)."""
        return next((str(r.get("host") or "") for _, r in self.records if r.get("kind") == "attach"), "")


def read_run(run_dir: str | Path) -> list[dict[int, RankLog]]:
    """The run's attempts: the k-th attach of every rank is attempt k. Raises TraceFormatError."""
    files = sorted(Path(run_dir).glob("trace-rank*.jsonl"))
    if not files:
        raise TraceFormatError(f"no trace-rank*.jsonl files in {run_dir}")
    attempts: list[dict[int, RankLog]] = []
    for path in files:
        rank = int(re.search(r"trace-rank(\d+)\.jsonl$", path.name).group(1))  # type: ignore[union-attr]
        k = -1
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if n == len(path.read_text(encoding="utf-8").splitlines()):
                    break  # a SIGKILLed rank may leave a torn last line
                raise TraceFormatError(f"{path.name}:{n}: not JSON: {line[:80]!r}") from None
            if rec.get("kind") == "attach" or k < 0:
                k += 1
                while len(attempts) <= k:
                    attempts.append({})
            attempts[k].setdefault(rank, RankLog(rank)).records.append((Source(path.name, n), rec))
    return attempts


def _canonical(rank: int, rec: dict[str, Any]) -> tuple[int, int, int]:
    return (int(rec["seq"]), _STAGE.get(rec["action"], 99), rank)


def world_of(logs: dict[int, RankLog]) -> int:
    return int(next((lg.config().get("world_size") for lg in logs.values() if lg.config()), 0) or max(logs) + 1)


def causal_violations(logs: dict[int, RankLog]) -> list[CausalViolation]:
    """One attempt's records against happens-before (empty for a trace without clocks)."""
    items = {r: lg.records for r, lg in logs.items()}
    return violations(items, world_of(logs), {r: lg.host() for r, lg in logs.items()})


def is_causal(logs: dict[int, RankLog]) -> bool:
    """The attempt's clocks define happens-before: it has them and they break nothing. Only then
    is the merge causal and may TLC explore other orders of the records they call concurrent."""
    return has_clocks({r: lg.records for r, lg in logs.items()}) and not causal_violations(logs)


def merge(logs: dict[int, RankLog]) -> list[tuple[Source, dict[str, Any]]]:
    """All ranks' edge records in one sequence. With vector clocks: every record after all it has
    seen, concurrent ones by sequence number, protocol stage, then rank (`causality.causal_merge`).
    Without (an old trace): by sequence number, protocol stage, then rank. Each rank's own order is
    kept. The sequence is TLC's first try; a causal one is also where `Segment.needs` is read."""
    if is_causal(logs):
        return causal_merge({r: lg.edges for r, lg in logs.items()}, _canonical)
    return _seq_merge(logs)


def _seq_merge(logs: dict[int, RankLog]) -> list[tuple[Source, dict[str, Any]]]:
    """By sequence number, protocol stage, then rank (a k-way merge on every rank's head)."""
    heads = {r: log.edges for r, log in logs.items()}
    pos = dict.fromkeys(heads, 0)
    out: list[tuple[Source, dict[str, Any]]] = []
    while True:
        ready = [r for r in heads if pos[r] < len(heads[r])]
        if not ready:
            return out

        best = min(ready, key=lambda r: _canonical(r, heads[r][pos[r]][1]))
        out.append(heads[best][pos[best]])
        pos[best] += 1


# -- abstraction onto the spec's variables (pure) --------------------------------------------------
@dataclass(frozen=True)
class SpecRecord:
    """One step the trace spec must take: the spec's action `action` of `rank`, ending with
    phase `dst`, frontier F, generation g and (ref >= 0) every reference slot naming `ref`."""

    action: str
    rank: int
    src: str
    dst: str
    F: int
    g: int
    ref: int
    source: Source | None  # None: implied (a commit at a failed boundary, or a deferred one a dead rank missed)
    raw: dict[str, Any] | None = None
    tau: int = -1  # optimizer steps applied (-1: not recorded, e.g. a trace from before Rewind)

    def describe(self) -> str:
        where = f"{self.source.file}:{self.source.line}" if self.source else "implied"
        seq = self.raw.get("seq") if self.raw else None
        ref = f", refs={self.raw.get('refs')}" if self.raw else ""
        tau = f", tau={self.tau}" if self.tau >= 0 else ""
        return (f"rank {self.rank} {self.action}: {self.src} -> {self.dst} (seq {seq}, F={self.F}, g={self.g}"
                f"{tau}{ref}) [{where}]")


@dataclass
class Segment:
    """A stretch of a run with at most one recovery: the unit TLC checks."""

    name: str
    world: int
    R: frozenset[int]
    frontier0: tuple[int, ...]
    gen0: tuple[int, ...]
    ref0: tuple[int, ...]
    records: list[SpecRecord]
    note: str = ""
    #: the spec's constants for this run: a Rewind was agreed (so it was qualified); the ranks
    #: kept pre-step copies (Config.step_copy)
    rewind: bool = False
    #: False: a rank rejected this recovery (decide_reject), for a reason the spec does not
    #: model at a committed boundary (a guard failed, Preserve not qualified, no failed group)
    preserve: bool = True
    step_copy: bool = False
    #: the records were merged by vector clocks that break nothing: their happens-before is
    #: known, and orders other than the listed one may be explored
    causal: bool = False

    def listed_needs(self) -> list[tuple[int, ...]]:
        """The listed (canonical) order alone, as needs: TLC's first try."""
        return total_needs([r.rank for r in self.records], self.world)

    def allowed_needs(self) -> list[tuple[int, ...]]:
        """Per record, how many records of each rank precede it in every order the clocks allow
        (`causality.causal_needs`; the listed order alone without usable clocks). Computed when
        asked: only a segment refused in the listed order needs it."""
        if not self.causal:
            return self.listed_needs()
        # A recorded record's values (abstract_attempt) depend on its rank's earlier records and its
        # recovery, not on where the merge put it among concurrent records, so they hold in
        # every order the clocks allow; an implied record (no clock) keeps its merged place.
        return causal_needs([r.rank for r in self.records],
                            [r.raw.get("vc") if r.raw and r.source else None for r in self.records], self.world)

    @property
    def explorable(self) -> bool:
        """The clocks allow an order other than the listed one."""
        return self.causal and self.allowed_needs() != self.listed_needs()


def _failed_keys(log: RankLog, first_line: int) -> set[str]:
    """Failed groups of the recovery starting at `first_line` of this rank's log: its `observe`
    record (written before the first edge fires, so found before `first_line`) and its closing
    `recovery` record. Read from the closing record alone, a Reject's or an abort's (which names
    none) made R the observers only, and its failed-group members that joined went unchecked."""
    start = first_line
    for src, rec in log.records:
        if src.line >= first_line:
            break
        if rec.get("kind") == "observe":
            start = src.line
        elif rec.get("kind") == "recovery":  # an earlier recovery's end: its observe is not this one's
            start = first_line
    keys: set[str] = set()
    for src, rec in log.records:
        if src.line >= start and rec.get("kind") in ("recovery", "observe"):
            keys |= set(rec.get("failed_groups") or ())
            if rec.get("kind") == "recovery":
                break
    return keys


def _ref_value(refs: dict[str, int], labels: set[str]) -> int:
    vals = [int(refs[lb]) for lb in labels if lb in refs]
    return min(vals) if vals else -1


def _observe_phase(log: RankLog, edge_src: Source) -> str | None:
    """phase_failed of the observe record just before this rank's first recovery edge."""
    found = None
    for src, rec in log.records:
        if src.line >= edge_src.line:
            break
        if rec.get("kind") == "observe":
            found = rec.get("phase_failed")
        elif rec.get("kind") == "edge" and rec.get("action") == "resume_training":
            found = None
    return found


def abstract_attempt(logs: dict[int, RankLog], name: str = "run") -> list[Segment]:
    """Cut one attempt's merged records into segments and map them onto spec values."""
    merged = merge(logs)
    if not merged:
        return []
    world = world_of(logs)
    causal = is_causal(logs)
    for _, rec in merged:
        for key in ("seq", "action", "from", "to", "F", "g", "rank"):
            if key not in rec:
                raise TraceFormatError(f"an edge record has no {key!r}: {rec}")
    # Frontier/generation each rank holds before its first record.
    frontier: dict[int, int] = {}
    gen: dict[int, int] = {}
    for _, rec in merged:
        r = int(rec["rank"])
        if r not in frontier:
            frontier[r] = int(rec["F"]) - (1 if rec["action"] == "commit_update" else 0)
            gen[r] = int(rec["g"])
    for r in range(world):
        frontier.setdefault(r, 0)
        gen.setdefault(r, 0)
    refs_now: dict[int, dict[str, int]] = {}
    commits = {r: {int(rec["F"]) for _, rec in merged if int(rec["rank"]) == r and rec["action"] == "commit_update"}
               for r in range(world)}

    written = set(logs)  # the ranks that left a trace of this attempt (a dead rank may have no edge in it)
    implied: set[int] = set()

    def implied_commits(ranks: Iterable[int], F: int) -> list[SpecRecord]:
        """The commits of F of ranks that never wrote one, as the spec's rank order needs them: a
        rank that died right after its check completed (or before settling a deferred boundary)
        committed F without a record. At most once per rank, and only for a rank that left a
        trace of this attempt (found by review: a rank without one had every later commit invented
        for it, and the run passed)."""
        out = []
        for q in ranks:
            if frontier[q] != F - 1 or F in commits[q] or q in implied or q not in written:
                break
            implied.add(q)
            frontier[q] = F
            out.append(SpecRecord("commit_update", q, "Train", "Train", F, gen[q], -1, None, tau=F))
        return out

    # Split the merged sequence into recoveries: a recovery runs from its first non-commit record
    # until every rank that took part is back in Train (or the records end).
    chunks: list[list[tuple[Source, dict[str, Any]]]] = []
    current: list[tuple[Source, dict[str, Any]]] = []
    active: dict[int, str] = {}
    for item in merged:
        rec = item[1]
        current.append(item)
        if rec["action"] != "commit_update":
            active[int(rec["rank"])] = rec["to"]
            if all(p == "Train" for p in active.values()):
                chunks.append(current)
                current, active = [], {}
    if current:
        chunks.append(current)

    segments: list[Segment] = []
    for n, chunk in enumerate(chunks, start=1):
        recovery = [(s, r) for s, r in chunk if r["action"] != "commit_update"]
        participants = sorted({int(r["rank"]) for _, r in recovery})
        first_of = {}
        for s, r in recovery:
            first_of.setdefault(int(r["rank"]), s)
        failed: set[str] = set()
        for rk, s in first_of.items():
            failed |= _failed_keys(logs[rk], s.line)
        labels = {rk: {lb for lb, key in logs[rk].config().get("groups", {}).items() if key in failed}
                  for rk in logs}
        members = {rk for rk, lbs in labels.items() if lbs}
        R = frozenset(members | {int(r["rank"]) for _, r in recovery if r["action"] in _R_ONLY})
        phases = {rk: _observe_phase(logs[rk], s) for rk, s in first_of.items()}
        committed = bool(recovery) and len(participants) == world and all(
            p == "committed" for p in phases.values())
        preserved = any(r["action"] == "release" for _, r in recovery)
        rewound = any(r["action"] in ("decide_rewind", "rewind") for _, r in recovery)
        rejected = any(r["action"] == "decide_reject" for _, r in recovery)
        if rewound:  # a Rewind rebuilds every group of every rank: all are "failed" here
            labels = {rk: set(logs[rk].config().get("groups", {})) for rk in logs}
        step_copy = any(bool(lg.config().get("step_copy")) for lg in logs.values())

        def ref_of(rank: int, refs: dict[str, int] | None, R: frozenset[int] = R,
                   labels: dict[int, set[str]] = labels) -> int:
            if rank not in R:
                return -1
            lbs = labels.get(rank) or set()
            if not lbs or refs is None:
                return -1
            return _ref_value(refs, lbs)

        start_frontier = tuple(frontier[r] for r in range(world))
        start_gen = tuple(gen[r] for r in range(world))
        ref0 = []
        for r in range(world):
            first = next((rec for _, rec in chunk if int(rec["rank"]) == r), None)
            refs = first.get("refs") if first else refs_now.get(r)
            ref0.append(max(ref_of(r, refs), 0) if r in R else -1)
        out: list[SpecRecord] = []
        inserted = False
        moved: set[int] = set()  # ranks that built the replacement: the spec moves them to g+1
        for s, rec in chunk:
            r, action = int(rec["rank"]), rec["action"]
            if action != "commit_update" and committed and not inserted:
                for q in range(world):
                    frontier[q] += 1
                    out.append(SpecRecord("commit_update", q, "Train", "Train", frontier[q], gen[q],
                                          -1, None, tau=frontier[q]))
                inserted = True
            in_recovery = action != "commit_update"
            if not in_recovery:  # a lower rank that died before settling a deferred boundary
                out.extend(implied_commits([q for q in range(r) if frontier[q] == int(rec["F"]) - 1], int(rec["F"])))
            F = int(rec["F"]) + (1 if in_recovery and committed else 0)
            if action == "replace_comm":
                moved.add(r)
            resumed = (preserved or rewound) and action in ("release", "rewind", "resume_training")
            g = int(rec["g"]) + (1 if r in moved or resumed else 0)
            refs = rec.get("refs")
            if isinstance(refs, dict):
                refs_now[r] = refs
            ref = -1 if action == "replace_comm" else ref_of(r, refs if isinstance(refs, dict) else None)
            tau = int(rec["tau"]) if isinstance(rec.get("tau"), int) else -1
            out.append(SpecRecord(action, r, rec["from"], rec["to"], F, g, ref, s, rec, tau=tau))
            frontier[r], gen[r] = F, g
            if not in_recovery:  # ... or a higher one
                out.extend(implied_commits(range(r + 1, world), F))
        note = (f"recovery R={sorted(R)}" + (" at a committed boundary" if committed else "")
                + (" rewound" if rewound else "")) if recovery else ""
        segments.append(Segment(f"{name}/segment{n}", world, R, start_frontier, start_gen, tuple(ref0), out, note,
                                rewind=rewound, step_copy=step_copy, causal=causal, preserve=not rejected))
    return segments


def segments_of_run(run_dir: str | Path) -> list[Segment]:
    """Every segment of every attempt of a run directory."""
    segs: list[Segment] = []
    for k, logs in enumerate(read_run(run_dir)):
        segs += abstract_attempt(logs, name=f"{Path(run_dir).name}/attempt{k}")
    return segs


# -- the TLA+ trace module (pure) ------------------------------------------------------------------
def _tla_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tla_set(xs: Iterable[int]) -> str:
    return "{" + ", ".join(str(x) for x in sorted(xs)) + "}"


def _tla_seq(xs: Iterable[str]) -> str:
    return "<<" + ", ".join(xs) + ">>"


def _record_tla(rec: SpecRecord, extra: str) -> str:
    return (f"[a |-> {_tla_str(rec.action)}, r |-> {rec.rank}, src |-> {_tla_str(rec.src)}, "
            f"dst |-> {_tla_str(rec.dst)}, F |-> {rec.F}, g |-> {rec.g}, ref |-> {rec.ref}, tau |-> {rec.tau}, "
            f"{extra}]")


def _listed_tla(seg: Segment) -> str:
    """The segment's records in its listed order, each with its place among its rank's (k)."""
    count = [0] * seg.world
    recs = []
    for rec in seg.records:
        count[rec.rank] += 1
        recs.append(_record_tla(rec, f"k |-> {count[rec.rank]}"))
    return "<<" + ",\n      ".join(recs) + ">>"


def _per_rank_tla(seg: Segment) -> str:
    """The segment's records as one sequence per rank (rank r at index r + 1), each record with
    the number of every rank's records that must be taken before it in any order the clocks allow."""
    mine: list[list[str]] = [[] for _ in range(seg.world)]
    for rec, need in zip(seg.records, seg.allowed_needs(), strict=True):
        mine[rec.rank].append(_record_tla(rec, f"need |-> {_tla_seq(map(str, need))}"))
    return "<<" + ",\n      ".join("<<" + ",\n       ".join(recs) + ">>" for recs in mine) + ">>"


def render_module(segments: Sequence[Segment], explore: bool = False, stop: tuple[int, int] | None = None) -> str:
    """The trace module: segments as a constant, one named instance of the spec per (N, R).

    The records are taken in each segment's listed (canonical) order, or with `explore` in any
    order its vector clocks allow: TLC then explores the interleavings (a dearer state space, so
    the listed order keeps its own, cheaper rendering: one index, no per-rank positions).
    `stop=(rank, k)` adds the invariant Stop, violated by a state where rank's k-th record
    (1-based) is next and every record it needs is taken: a diagnosis's way to get one."""
    if not segments:
        raise ValueError("no segments to check")
    def config_key(seg: Segment) -> tuple[int, frozenset[int], bool, bool, bool]:
        return (seg.world, seg.R or frozenset({0}), seg.rewind, seg.step_copy, seg.preserve)

    configs: dict[tuple[int, frozenset[int], bool, bool, bool], int] = {}
    for seg in segments:
        configs.setdefault(config_key(seg), len(configs) + 1)
    max_f = max([*(r.F for s in segments for r in s.records), *(f for s in segments for f in s.frontier0), 0]) + 1
    max_g = max([*(r.g for s in segments for r in s.records), *(g for s in segments for g in s.gen0), 0]) + 2
    actions = list(_STAGE)
    where = "pos" if explore else "i"  # records taken: per rank, or of the listed sequence
    lines = [
        f"---------------------------- MODULE {TRACE_MODULE} ----------------------------",
        "(* Generated by model_checking/trace_validation.py: recorded runs as behaviours of AccelPact. *)",
        "EXTENDS Integers, Sequences, TLC",
        "VARIABLES " + ", ".join(SPEC_VARIABLES) + f", t, {where}",
        "",
    ]
    for (world, R, rewind, step_copy, preserve), k in configs.items():
        # The failed group, and the rest of the world as one other group (under Rewind R is
        # every rank); the run's other groups are never repaired in this segment.
        rest = frozenset(range(world)) - R
        groups = "{" + ", ".join(_tla_set(g) for g in (R, rest) if g) + "}"
        lines.append(
            f"C{k} == INSTANCE AccelPact WITH N <- {world}, Groups <- {groups}, Slots <- {_tla_set(SLOTS)}, "
            f"MaxFrontier <- {max_f}, MaxGen <- {max_g}, MaxCrashes <- {world}, MaxCuts <- 0, "
            'ControlFaults <- TRUE, FaultPhases <- {"forward", "backward", "optimizer", "committed"}, '
            f"Spurious <- TRUE, RewindQualified <- {'TRUE' if rewind else 'FALSE'}, "
            f"PreserveQualified <- {'TRUE' if preserve else 'FALSE'}, "
            f"StepCopy <- {'TRUE' if step_copy else 'FALSE'}, Mutant <- \"none\"")
        body = "\n".join(f"    [] a = {_tla_str(a)} -> C{k}!{a}(r)" for a in actions)
        lines.append(f"Act{k}(a, r) == CASE\n{body[7:]}\n    [] OTHER -> FALSE")
        lines.append(f"Env{k}(crashable) == \\/ C{k}!PublishDecision \\/ C{k}!PublishResume "
                     f"\\/ C{k}!ControlPlaneTimeout \\/ C{k}!DataPlaneFailure \\/ C{k}!ControlGroupFailure "
                     f"\\/ \\E q \\in crashable : C{k}!Crash(q)")
        lines.append(f"GroupsOf{k}(r) == C{k}!GroupsOf(r)")
        lines.append("")
    segs = []
    for seg in segments:
        recs = _per_rank_tla(seg) if explore else _listed_tla(seg)
        segs.append(
            f"[cfg |-> {configs[config_key(seg)]}, n |-> {seg.world}, R |-> {_tla_set(seg.R)}, "
            f"f0 |-> {_tla_seq(map(str, seg.frontier0))}, g0 |-> {_tla_seq(map(str, seg.gen0))}, "
            f"ref0 |-> {_tla_seq(map(str, seg.ref0))},\n     recs |-> {recs}]")
    lines.append("Traces == <<\n  " + ",\n  ".join(segs) + ">>")
    k_cases = "\n".join(f"    [] k = {k} -> Act{k}(a, r)" for k in configs.values())
    e_cases = "\n".join(f"    [] k = {k} -> Env{k}(c)" for k in configs.values())
    g_cases = "\n".join(f"    [] k = {k} -> GroupsOf{k}(r)" for k in configs.values())
    lines += [
        "",
        f"Act(k, a, r) == CASE\n{k_cases[7:]}\n    [] OTHER -> FALSE",
        f"Env(k, c) == CASE\n{e_cases[7:]}\n    [] OTHER -> FALSE",
        f"GroupsOf(k, r) == CASE\n{g_cases[7:]}\n    [] OTHER -> {{}}",
        "Tr == Traces[t]",
        "Slot == " + _tla_set(SLOTS),
        *(_EXPLORED_HEAD if explore else _LISTED_HEAD),
        "",
        "TraceInit ==",
        "    \\E k \\in 1 .. Len(Traces) :",
        "        LET T == Traces[k]",
        "            Rk == 0 .. (T.n - 1)",
        "        IN /\\ t = k /\\ " + ("pos = [q \\in 1 .. T.n |-> 0]" if explore else "i = 0"),
        '           /\\ phase = [r \\in Rk |-> "Train"]',
        "           /\\ frontier = [r \\in Rk |-> T.f0[r + 1]]",
        "           /\\ gen = [r \\in Rk |-> T.g0[r + 1]]",
        "           /\\ refs = [r \\in Rk |-> [G \\in GroupsOf(T.cfg, r) |->",
        "                          [s \\in Slot |-> IF r \\in G /\\ G = T.R THEN T.ref0[r + 1] ELSE 0]]]",
        "           /\\ validated = [r \\in Rk |-> FALSE]",
        '           /\\ obs = [r \\in Rk |-> "none"]',
        '           /\\ reports = [r \\in Rk |-> [f |-> 0, g |-> 0, phi |-> "none", tau |-> 0, copy |-> FALSE]]',
        '           /\\ decision = [kind |-> "none", f |-> 0, g |-> 0]',
        '           /\\ outcome = "none"',
        "           /\\ retired = {}",
        "           /\\ crashed = {}",
        '           /\\ phi = "none"',
        "           /\\ fr = {}",
        "           /\\ cut = {}",
        "           /\\ cpDown = FALSE",
        '           /\\ resumedAt = [r \\in Rk |-> [f |-> -1, g |-> -1, kind |-> "none"]]',
        "           /\\ tau = [r \\in Rk |-> T.f0[r + 1]]",
        "           /\\ copy = [r \\in Rk |-> FALSE]",
        '           /\\ edge = <<"init", "", "">>',
        "",
        "(* The next record: the spec's action it names, ending where the record says. *)",
        "Take(rec) ==",
        "    /\\ phase[rec.r] = rec.src",
        "    /\\ Act(Tr.cfg, rec.a, rec.r)",
        "    /\\ phase'[rec.r] = rec.dst",
        "    /\\ frontier'[rec.r] = rec.F",
        "    /\\ gen'[rec.r] = rec.g",
        "    /\\ rec.ref >= 0 => \\A G \\in DOMAIN refs'[rec.r] : refs'[rec.r][G] = [s \\in Slot |-> rec.ref]",
        "    /\\ rec.tau >= 0 => tau'[rec.r] = rec.tau",
        "",
        *(_EXPLORED_NEXT if explore else _LISTED_NEXT),
        "    \\/ Env(Tr.cfg, Crashable) /\\ UNCHANGED <<t, " + where + ">>",
        "",
        "TraceSpec == TraceInit /\\ [][TraceNext]_<<" + ", ".join(SPEC_VARIABLES) + f", t, {where}>>",
    ]
    if stop is not None:
        lines += ["(* Violated by a state just before the record a diagnosis names. *)",
                  f"Stop == ~ReadyAt({stop[0]}, {stop[1]})"]
    lines.append("=============================================================================")
    return "\n".join(lines) + "\n"


# The two ways to take records. Each prints <<"accelpact-progress", segment, rank, k, taken>> when
# a rank's k-th record is taken with `taken` records taken in all (`progress`).
_LISTED_HEAD = (
    "(* i: how many records of the listed sequence are taken. *)",
    "ReadyAt(r, k) == i < Len(Tr.recs) /\\ Tr.recs[i + 1].r = r /\\ Tr.recs[i + 1].k = k",
    "(* Ranks that record nothing more: the only ones whose crash can explain the rest. *)",
    "Crashable == {q \\in 0 .. (Tr.n - 1) : \\A j \\in (i + 1) .. Len(Tr.recs) : Tr.recs[j].r # q}",
)
_LISTED_NEXT = (
    "(* The next record of the listed sequence. *)",
    "TraceNext ==",
    "    \\/ /\\ i < Len(Tr.recs)",
    "       /\\ Take(Tr.recs[i + 1])",
    "       /\\ i' = i + 1 /\\ t' = t",
    '       /\\ PrintT(<<"accelpact-progress", t, Tr.recs[i + 1].r, Tr.recs[i + 1].k, i + 1>>)',
)
_EXPLORED_HEAD = (
    "(* pos[r + 1]: how many of rank r's records are taken. *)",
    "Taken == LET S[m \\in 0 .. Tr.n] == IF m = 0 THEN 0 ELSE S[m - 1] + pos[m] IN S[Tr.n]",
    "(* Rank r's k-th record is next, and every record it needs before it is taken. *)",
    "ReadyAt(r, k) == /\\ pos[r + 1] = k - 1 /\\ k <= Len(Tr.recs[r + 1])",
    "                 /\\ \\A q \\in 1 .. Tr.n : pos[q] >= Tr.recs[r + 1][k].need[q]",
    "(* Ranks that record nothing more: the only ones whose crash can explain the rest. *)",
    "Crashable == {q \\in 0 .. (Tr.n - 1) : pos[q + 1] = Len(Tr.recs[q + 1])}",
)
_EXPLORED_NEXT = (
    "(* Any rank whose next record is ready: TLC explores every order the clocks allow. *)",
    "TraceNext ==",
    "    \\/ \\E r \\in 0 .. (Tr.n - 1) :",
    "       /\\ ReadyAt(r, pos[r + 1] + 1)",
    "       /\\ Take(Tr.recs[r + 1][pos[r + 1] + 1])",
    "       /\\ pos' = [pos EXCEPT ![r + 1] = @ + 1] /\\ t' = t",
    '       /\\ PrintT(<<"accelpact-progress", t, r, pos[r + 1] + 1, Taken + 1>>)',
)


def render_cfg(invariant: str | None = None) -> str:
    lines = ["\\* deadlock: ignore", "INIT TraceInit", "NEXT TraceNext"]
    if invariant:
        lines += ["INVARIANT", f"    {invariant}"]
    return "\n".join(lines) + "\n"


# -- verdicts from TLC's progress (pure) -----------------------------------------------------------
@dataclass
class Progress:
    """What TLC's prints say of one segment: how far the furthest order got, and how many of each
    rank's records some order took."""

    reached: int = 0
    taken: dict[int, int] = field(default_factory=dict)


def progress(output: str) -> dict[int, Progress]:
    """Per segment (1-based index in the TLC run), read from the trace spec's prints."""
    out: dict[int, Progress] = {}
    for m in _PROGRESS_RE.finditer(output):
        t, r, k, total = (int(x) for x in m.groups())
        p = out.setdefault(t, Progress())
        p.reached = max(p.reached, total)
        p.taken[r] = max(p.taken.get(r, 0), k)
    return out


@dataclass
class SegmentVerdict:
    segment: Segment
    ok: bool
    reached: int  # records explained (by the furthest order)
    first_bad: SpecRecord | None = None
    state_before: dict[str, str] = field(default_factory=dict)
    path: list[TraceState] = field(default_factory=list)
    #: the listed order was refused and TLC explored every order the vector clocks allow
    explored: bool = False
    #: the records no explored order got past, although some order took their causal past
    #: (first_bad is the first of them)
    stuck: list[SpecRecord] = field(default_factory=list)
    #: (rank, k): first_bad is rank's k-th record of the segment (1-based), for the diagnosis
    at: tuple[int, int] = (0, 0)
    #: why the other orders the clocks allow were not explored (the verdict is the merge's order's)
    unexplored: str = ""
    #: the order state_before was reached in, when exploring ("": the only order checked)
    shown_in: str = ""

    def describe(self) -> str:
        seg = self.segment
        if self.ok:
            how = ", in an order the vector clocks allow other than the merge's" if self.explored else ""
            return f"{seg.name}: ok, {len(seg.records)} records ({seg.note or 'training only'}){how}"
        assert self.first_bad is not None
        if self.explored:
            head = [f"{seg.name}: no order the vector clocks allow is a behaviour of spec/AccelPact.tla; the "
                    f"furthest explains {self.reached} of {len(seg.records)} records ({seg.note or 'training only'})"]
            head += [f"  every order fails at: {rec.describe()}" for rec in self.stuck]
        else:
            head = [f"{seg.name}: record {self.reached + 1} of {len(seg.records)} is explained by no action of "
                    f"spec/AccelPact.tla ({seg.note or 'training only'})",
                    f"  record: {self.first_bad.describe()}"]
            if self.unexplored:
                head.append(f"  (in the merge's order; {self.unexplored})")
        lines = head + [f"  expected by the spec: action {self.first_bad.action} of rank {self.first_bad.rank} "
                        f"ending in {self.first_bad.dst} with F={self.first_bad.F}, g={self.first_bad.g}"
                        + (f", every reference slot on g={self.first_bad.ref}" if self.first_bad.ref >= 0 else ""),
                        f"  state before it{f' (in {self.shown_in})' if self.shown_in else ''}:"]
        for k in SPEC_VARIABLES:
            if k in self.state_before:
                lines.append(f"    {k} = {self.state_before[k]}")
        return "\n".join(lines)


def judge(seg: Segment, prog: Progress | None, explored: bool) -> SegmentVerdict:
    """The verdict on a segment from TLC's progress: accepted when some order took every record;
    otherwise named at the records every order fails at (`causality.stuck`; in the listed order
    alone, simply the next record)."""
    prog = prog or Progress()
    n = len(seg.records)
    verdict = SegmentVerdict(seg, prog.reached >= n, prog.reached, explored=explored)
    if verdict.ok:
        return verdict
    ranks = [rec.rank for rec in seg.records]
    needs = seg.allowed_needs() if explored else seg.listed_needs()
    where = stuck(ranks, needs, prog.taken) or [prog.reached]  # [reached]: clocks TLC could not follow
    verdict.stuck = [seg.records[j] for j in where]
    verdict.first_bad = verdict.stuck[0]
    verdict.at = (ranks[where[0]], ranks[:where[0] + 1].count(ranks[where[0]]))
    return verdict


# -- running TLC (effects) -------------------------------------------------------------------------
@dataclass
class BatchResult:
    verdicts: list[SegmentVerdict]
    tlc_s: float
    runs: int

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def _spec_file(spec_dir: Path | None) -> Path:
    from .models import spec_path

    return spec_path(spec_dir)


def _call(stack: contextlib.ExitStack, segments: Sequence[Segment], *, explore: bool, stop: tuple[int, int] | None,
          workers: int, spec_dir: Path | None, timeout_s: float) -> Callable[..., TlcResult]:
    """A TLC run of a trace module, ready for `run_tlc_many` (its files live as long as `stack`)."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="accelpact-trace-")))
    module = tmp / f"{TRACE_MODULE}.tla"
    module.write_text(render_module(segments, explore=explore, stop=stop))
    return functools.partial(run_tlc, module, render_cfg("Stop" if stop else None), workers=workers,
                             check_deadlock=False, timeout_s=timeout_s, extra_modules=[_spec_file(spec_dir)])


def _many(calls: Sequence[Callable[..., TlcResult]], jobs: int) -> list[TlcResult]:
    """Every call's result, `jobs` runs side by side."""
    if not calls:
        return []
    results = run_tlc_many(calls, jobs=max(1, min(jobs, len(calls))))
    try:
        return list(results)
    finally:
        results.close()


def _checked(result: TlcResult) -> TlcResult:
    if result.errors and result.errors[0].startswith("TLC timed out"):
        raise TraceTimeout(result.errors[0])
    if result.errors:
        raise RuntimeError("TLC could not check the trace module: " + result.errors[0][:2000])
    return result


def _run(segments: Sequence[Segment], explore: bool, spec_dir: Path | None, timeout_s: float,
         workers: int) -> TlcResult:
    with contextlib.ExitStack() as stack:
        return _checked(_call(stack, segments, explore=explore, stop=None, workers=workers, spec_dir=spec_dir,
                              timeout_s=timeout_s)())


def _show(verdict: SegmentVerdict, result: TlcResult, where: str = "") -> None:
    """The diagnosis's state: the last of its counterexample (none if TLC found none in time)."""
    if result.trace:
        verdict.path = result.trace
        verdict.state_before = {k: v for k, v in result.trace[-1].values.items() if k not in ("t", "i", "pos")}
        verdict.shown_in = where


def validate_segments(segments: Sequence[Segment], *, spec_dir: Path | None = None, batch: int = 100,
                      timeout_s: float = 600.0, workers: int = 1, diagnose_failures: bool = True,
                      explore: bool = True, explore_timeout_s: float | None = None) -> BatchResult:
    """Check every segment with TLC, `batch` segments per TLC run; diagnose the ones that fail.

    First in the merge's order alone (one behaviour per segment to follow: cheap). A segment the
    spec refuses in that order whose clocks allow others is checked again with `explore`, in
    every order they allow, and passes if any is a behaviour: the merge's tie-break among
    concurrent records is a guess, not something the run recorded. Only refused segments pay
    for the exploration, bounded by `explore_timeout_s` (default `timeout_s`): past it, the
    merge's refusal stands, and says that the other orders were not all explored.

    A refused segment is diagnosed in the merge's order beside its exploration (a second JVM on
    the second core instead of one after the other): when every order fails at the record the
    merge's order failed at, which is the rule, that diagnosis is the one shown; otherwise the
    record is diagnosed again in the explored orders. The checks use `workers` TLC workers; the
    runs side by side, `workers` at a time, one worker each (breadth-first on one worker, the
    state a diagnosis shows is the same in every run)."""
    verdicts: list[SegmentVerdict] = []
    started, runs = time.monotonic(), 0
    for lo in range(0, len(segments), batch):
        chunk = list(segments[lo:lo + batch])
        reached = progress(_run(chunk, False, spec_dir, timeout_s, workers).output)
        runs += 1
        verdicts += [judge(seg, reached.get(k), explored=False) for k, seg in enumerate(chunk, start=1)]
    failed = [n for n, v in enumerate(verdicts) if not v.ok]
    again = [n for n in failed if explore and verdicts[n].segment.explorable]
    chunks = [again[lo:lo + batch] for lo in range(0, len(again), batch)]
    diagnosed = failed if diagnose_failures else []
    with contextlib.ExitStack() as stack:
        calls = [_call(stack, [verdicts[n].segment for n in chunk], explore=True, stop=None,
                       workers=1 if diagnosed else workers, spec_dir=spec_dir,
                       timeout_s=explore_timeout_s or timeout_s) for chunk in chunks]
        calls += [_call(stack, [verdicts[n].segment], explore=False, stop=verdicts[n].at, workers=1,
                        spec_dir=spec_dir, timeout_s=timeout_s) for n in diagnosed]
        results = _many(calls, jobs=workers)
    runs += len(calls)
    merge_states = dict(zip(diagnosed, results[len(chunks):]))
    for chunk, result in zip(chunks, results):
        try:
            reached = progress(_checked(result).output)
        except TraceTimeout as exc:
            for n in chunk:
                verdicts[n].unexplored = f"the other orders the clocks allow were not all explored: {exc}"
            continue
        for k, n in enumerate(chunk, start=1):
            verdict = judge(verdicts[n].segment, reached.get(k), explored=True)
            if verdict.ok or verdict.at != verdicts[n].at:
                merge_states.pop(n, None)  # passes, or fails elsewhere: the merge's state is not its
            verdicts[n] = verdict
    for n, result in merge_states.items():
        _show(verdicts[n], result, "the merge's order" if verdicts[n].explored else "")
    elsewhere = [n for n in diagnosed if not verdicts[n].ok and n not in merge_states]
    with contextlib.ExitStack() as stack:
        calls = [_call(stack, [verdicts[n].segment], explore=True, stop=verdicts[n].at, workers=1,
                       spec_dir=spec_dir, timeout_s=timeout_s) for n in elsewhere]
        for n, result in zip(elsewhere, _many(calls, jobs=workers)):
            _show(verdicts[n], result, "an order the clocks allow")
    runs += len(elsewhere)
    return BatchResult(verdicts, time.monotonic() - started, runs)


@dataclass
class RunCheckResult:
    run_dir: str
    result: BatchResult
    #: records no run could have written, by their vector clocks (refused before TLC's verdict)
    causal: list[CausalViolation] = field(default_factory=list)
    #: False: a trace without vector clocks, merged by seq and stage and not checked for causality
    clocked: bool = True

    @property
    def ok(self) -> bool:
        return self.result.ok and not self.causal

    @property
    def first_failure(self) -> SegmentVerdict | None:
        return next((v for v in self.result.verdicts if not v.ok), None)

    def describe(self) -> str:
        res = self.result
        records = sum(len(v.segment.records) for v in res.verdicts)
        head = (f"{self.run_dir}: {'PASS' if self.ok else 'FAIL'}: {len(res.verdicts)} segment(s), {records} records, "
                f"{res.runs} TLC run(s), {res.tlc_s:.1f} s"
                + ("" if self.clocked else " (no vector clocks: merged by seq and stage, causality unchecked)"))
        if not res.verdicts:
            head += " (no edge records: no rank committed an update or took a recovery step)"
        lines = [head] + [f"causality: {v.describe()}" for v in self.causal[:10]]
        lines += [v.describe() for v in res.verdicts if v.ok and v.explored]  # the merge's order was refused
        if len(self.causal) > 10:
            lines.append(f"causality: ... and {len(self.causal) - 10} more")
        bad = self.first_failure
        return "\n".join(lines + ([bad.describe()] if bad is not None else []))


def check_runs(run_dirs: Sequence[str | Path], **kw: Any) -> list[RunCheckResult]:
    """Validate several run directories in one batch of TLC runs."""
    segs: list[tuple[int, Segment]] = []
    causal: dict[int, list[CausalViolation]] = {}
    clocked: dict[int, bool] = {}
    for n, d in enumerate(run_dirs):
        attempts = read_run(d)
        causal[n] = [v for logs in attempts for v in causal_violations(logs)]
        clocked[n] = all(has_clocks({r: lg.records for r, lg in logs.items()}) for logs in attempts)
        segs += [(n, s) for s in segments_of_run(d)]
    # A run may end before any edge: a deferred first boundary whose all-reduce a rank's death left
    # unsettled rejects without a commit. Its traces exist (read_run refuses a run without any);
    # the spec has nothing to check there, and the report says so.
    res = validate_segments([s for _, s in segs], **kw) if segs else BatchResult([], 0.0, 0)
    reports = []
    for n, d in enumerate(run_dirs):
        mine = [v for (m, _), v in zip(segs, res.verdicts) if m == n]
        reports.append(RunCheckResult(str(d), BatchResult(mine, res.tlc_s, res.runs), causal[n], clocked[n]))
    return reports


def check_run(run_dir: str | Path, **kw: Any) -> RunCheckResult:
    """Validate one run directory (all its attempts)."""
    return check_runs([run_dir], **kw)[0]


def assert_valid_run(run_dir: str | Path, require_clocks: bool = True, **kw: Any) -> RunCheckResult:
    """For tests: the run passes trace validation, causality included (a run recorded now carries
    vector clocks; `require_clocks=False` for a trace recorded before them). TLC runs on two
    workers unless told otherwise: a test checks a run once its world is gone, so both cores are
    free (a long trace explores 100,000+ states)."""
    kw.setdefault("workers", 2)
    report = check_run(run_dir, **kw)
    if not report.ok:
        raise AssertionError("trace validation failed:\n" + report.describe())
    if require_clocks and not report.clocked:
        raise AssertionError(f"{run_dir}: records without vector clocks: causality was not checked")
    return report
