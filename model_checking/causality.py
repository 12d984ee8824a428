"""Causal trace validation: what each record could have seen of the other ranks (issue #18).

Every record of a current trace carries `vc`, its rank's vector clock ticked for that record and
merged on every control-plane exchange (accelpact/control/clock.py). Record a of rank p happened
before record b exactly when b's clock has reached a's own tick: `b.vc[p] >= a.vc[p]`. Sequence
numbers and wall-clock times cannot say this: a release given the same seq as a peer's rebind, or
moved before a peer's report in time only, merged by (seq, stage) into an order the spec accepts.

This module is pure and knows nothing of TLC. It

1. checks the clocks themselves (`violations`): each rank's clock ticks once per record and never
   goes back, no record has seen a record its peer never wrote, no two records have seen each
   other, and on one host (one CLOCK_MONOTONIC) no record was written before a record it has seen;
2. checks the protocol's message pattern as causal facts: a decision (after the report gather)
   has seen every rank's `submit_report` of the same recovery, and a release (after the outcome
   register) has seen every rank's entry into Validate of that recovery (ValidatedBeforeRelease);
3. merges the ranks' records in an order that respects happens-before (`causal_merge`) for TLC;
4. says, for records in such an order, which records every order the clocks allow puts before
   each one (`causal_needs`), so that TLC can explore those orders rather than check one, and
   which records no explored order got past (`stuck`).

Ties: only records the clocks call concurrent are ordered by the caller's key (sequence number,
then protocol stage), which places an observer before the ranks that join because of it, as the
spec needs. That tie-break cannot hide an inversion: every ordering the protocol's safety depends
on (reports before decisions, validation before release) is checked in 2 as happens-before, so a
release merely *placed* after a peer's rebind is refused there, whatever the merge does. Nor can
it refuse a good run: the merge is only TLC's first try; when the spec refuses it, TLC explores
every interleaving of concurrent records (4) and the run passes if any of them is a behaviour.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: decisions taken on the gathered reports: each must have seen every rank's report
DECIDE = frozenset({"decide_preserve", "decide_rewind", "stand_by", "decide_reject"})
#: steps taken on the outcome register's "resume": each must have seen every rank validate
RELEASE = frozenset({"release", "rewind"})
#: the edges that start a rank's part in a recovery
START = frozenset({"observe_failure", "join_recovery"})

Item = tuple[Any, dict[str, Any]]  # (where: has .file and .line, record)


@dataclass(frozen=True)
class CausalViolation:
    """A record that is no possible event of a run of the protocol, and why."""

    rank: int
    where: str  # file:line
    what: str  # the record, in words
    why: str

    def describe(self) -> str:
        return f"rank {self.rank} {self.what} [{self.where}]: {self.why}"


def _where(item: Item) -> str:
    return f"{item[0].file}:{item[0].line}"


def _what(rec: dict[str, Any]) -> str:
    name = rec.get("action") or rec.get("kind", "record")
    return f"{name} (seq {rec.get('seq')}, vc {rec.get('vc')})"


def has_clocks(logs: Mapping[int, Sequence[Item]]) -> bool:
    """True when the attempt's records carry vector clocks (a trace from before them does not:
    it is validated the old way, merged by seq and stage)."""
    return any("vc" in rec for items in logs.values() for _, rec in items)


def _tick(rank: int, rec: dict[str, Any]) -> int:
    return int(rec["vc"][rank])


def seen(a_rank: int, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Record `a` of rank `a_rank` happened before (or is) record `b`."""
    return int(b["vc"][a_rank]) >= _tick(a_rank, a)


def _shape(logs: Mapping[int, Sequence[Item]], world: int) -> list[CausalViolation]:
    out = []
    for r, items in logs.items():
        for item in items:
            vc = item[1].get("vc")
            if not (isinstance(vc, list) and len(vc) == world and all(isinstance(x, int) and x >= 0 for x in vc)):
                out.append(CausalViolation(r, _where(item), _what(item[1]),
                                           f"no vector clock of {world} ranks (every record of a clocked trace has one)"))
    return out


def _per_rank(r: int, items: Sequence[Item]) -> list[CausalViolation]:
    """One tick per record, and nothing forgotten; CLOCK_MONOTONIC never goes back in a process."""
    out = []
    for prev, item in zip(items, items[1:]):
        a, b = prev[1], item[1]
        if _tick(r, b) != _tick(r, a) + 1:
            out.append(CausalViolation(r, _where(item), _what(b), f"rank {r}'s own clock goes from {_tick(r, a)} "
                                       f"to {_tick(r, b)} [{_where(prev)}]: a record is missing or reordered"))
        elif any(y < x for x, y in zip(a["vc"], b["vc"])):
            out.append(CausalViolation(r, _where(item), _what(b), f"forgets what rank {r} had seen at "
                                       f"{_where(prev)} (vc {a['vc']})"))
        elif isinstance(a.get("t"), (int, float)) and isinstance(b.get("t"), (int, float)) and b["t"] < a["t"]:
            out.append(CausalViolation(r, _where(item), _what(b), f"written at t={b['t']} before rank {r}'s "
                                       f"previous record at t={a['t']} [{_where(prev)}]"))
    return out


def _by_tick(logs: Mapping[int, Sequence[Item]]) -> dict[int, dict[int, Item]]:
    return {r: {_tick(r, it[1]): it for it in items} for r, items in logs.items()}


def _cross(logs: Mapping[int, Sequence[Item]], hosts: Mapping[int, str]) -> list[CausalViolation]:
    """Against the peers' records: only records that exist were seen, seeing is not mutual, and on
    one host a record is not written before one it has seen."""
    ticks = _by_tick(logs)
    out = []
    for q, items in logs.items():
        for item in items:
            b = item[1]
            for p in range(len(b["vc"])):  # every rank it names, a rank without a trace too (found by review)
                k = int(b["vc"][p])
                if p == q or k == 0:
                    continue
                if p not in logs:
                    out.append(CausalViolation(q, _where(item), _what(b), f"has seen rank {p}'s record #{k}, "
                                               f"but rank {p} left no trace"))
                    continue
                if k not in ticks[p]:
                    out.append(CausalViolation(q, _where(item), _what(b), f"has seen rank {p}'s record #{k}, "
                                               f"which rank {p} never wrote"))
                    continue
                a_item = ticks[p][k]
                a = a_item[1]
                if seen(q, b, a):
                    out.append(CausalViolation(q, _where(item), _what(b), f"and rank {p}'s {_what(a)} "
                                               f"[{_where(a_item)}] have each seen the other"))
                elif (hosts.get(p) and hosts.get(p) == hosts.get(q) and isinstance(a.get("t"), (int, float))
                      and isinstance(b.get("t"), (int, float)) and b["t"] < a["t"]):
                    out.append(CausalViolation(q, _where(item), _what(b), f"written at t={b['t']}, before rank {p}'s "
                                               f"{_what(a)} [{_where(a_item)}] at t={a['t']} that it has seen "
                                               f"(both on host {hosts[p]}, one monotonic clock)"))
    return out


def recoveries(items: Sequence[Item]) -> list[list[Item]]:
    """One rank's edge records cut into its recoveries (the k-th of every rank is the same one:
    every rank takes part in every recovery, from the same boundary check)."""
    out: list[list[Item]] = []
    for item in items:
        rec = item[1]
        if rec.get("kind") != "edge":
            continue
        if rec.get("action") in START:
            out.append([])
        if out:
            out[-1].append(item)
    return out


def _pattern(logs: Mapping[int, Sequence[Item]]) -> list[CausalViolation]:
    """Decisions after every report, releases after every validation: as happens-before."""
    by_rank = {r: recoveries(items) for r, items in logs.items()}
    out = []
    for q, recs in by_rank.items():
        for n, recovery in enumerate(recs):
            for item in recovery:
                action = item[1].get("action")
                if action in DECIDE:
                    need, verb = (lambda x: x.get("action") == "submit_report"), "decided before every rank reported"
                elif action in RELEASE:
                    need, verb = (lambda x: x.get("to") == "Validate"), "released before every rank validated"
                else:
                    continue
                for p, theirs in by_rank.items():
                    if p == q:
                        continue
                    mine = theirs[n] if n < len(theirs) else []
                    witness = next((it for it in reversed(mine) if need(it[1])), None)
                    if witness is None:
                        out.append(CausalViolation(q, _where(item), _what(item[1]), f"{verb}: rank {p} recorded no "
                                                   f"{'report' if action in DECIDE else 'entry into Validate'} "
                                                   f"in recovery {n + 1}"))
                    elif not seen(p, witness[1], item[1]):
                        out.append(CausalViolation(q, _where(item), _what(item[1]), f"{verb}: it has not seen rank "
                                                   f"{p}'s {_what(witness[1])} [{_where(witness)}]"))
    return out


def violations(logs: Mapping[int, Sequence[Item]], world: int, hosts: Mapping[int, str] | None = None
               ) -> list[CausalViolation]:
    """Every way one attempt's records (all kinds, each rank's in file order) break causality.
    Empty for a trace without clocks (nothing to check: it is validated the old way)."""
    if not has_clocks(logs):
        return []
    bad = _shape(logs, world)
    if bad:
        return bad
    out = [v for r, items in logs.items() for v in _per_rank(r, items)]
    out += _cross(logs, hosts or {})
    edges = {r: [it for it in items if it[1].get("kind") == "edge"] for r, items in logs.items()}
    return out + _pattern(edges)


def causal_merge(heads: Mapping[int, Sequence[Item]], key: Callable[[int, dict[str, Any]], Any]) -> list[Item]:
    """The ranks' records in one sequence that respects happens-before: a rank's next record is
    taken only when no other rank's pending record happened before it; among those, the smallest
    `key(rank, record)` (for records the clocks call concurrent). Each rank's order is kept. With
    a cycle (doctored clocks, reported by `violations`) the smallest key is taken."""
    pos = dict.fromkeys(heads, 0)
    out: list[Item] = []
    while True:
        pending = [r for r in heads if pos[r] < len(heads[r])]
        if not pending:
            return out
        ready = [r for r in pending
                 if not any(seen(q, heads[q][pos[q]][1], heads[r][pos[r]][1]) for q in pending if q != r)]
        best = min(ready or pending, key=lambda r: key(r, heads[r][pos[r]][1]))
        out.append(heads[best][pos[best]])
        pos[best] += 1


def causal_needs(ranks: Sequence[int], clocks: Sequence[Sequence[int] | None], world: int
                 ) -> list[tuple[int, ...]]:
    """For records listed in an order that respects happens-before (`causal_merge`'s), with each
    record's rank and vector clock: per record, how many records of each rank precede it in
    every order the clocks allow (its causal past, which is a prefix of every rank's records).

    This is what a trace spec needs to explore the allowed interleavings: a rank may take its next
    record once that many records of every rank are taken. A record without a clock (one the
    checker implied, e.g. a commit the spec needs before a fault) keeps its place: all records
    listed before it precede it, and it precedes all listed after it. Linear in the records (a
    rank's past is found by bisecting its ticks): a long run costs no more than its length."""
    count = [0] * world  # records of each rank listed so far
    floor = [0] * world  # the records every later one needs: up to the last record without a clock
    ticks: list[list[int]] = [[] for _ in range(world)]  # each rank's clocked records: own tick ...
    where: list[list[int]] = [[] for _ in range(world)]  # ... and position among its rank's records
    mine: list[list[tuple[int, ...]]] = [[] for _ in range(world)]  # each rank's records' needs
    out: list[tuple[int, ...]] = []
    for r, vc in zip(ranks, clocks):
        if vc is None:
            need = list(count)
            floor = list(count)
            floor[r] += 1
        else:
            last = [count[r] if q == r else floor[q] for q in range(world)]  # a prefix of each rank
            for q in range(world):
                k = bisect.bisect_right(ticks[q], int(vc[q])) if q != r else 0
                if k:
                    last[q] = max(last[q], where[q][k - 1] + 1)
            need = list(last)
            for q, m in enumerate(last):  # and what those records needed: the past is closed
                if m:
                    need = [max(x, y) for x, y in zip(need, mine[q][m - 1])]
            ticks[r].append(int(vc[r]))
            where[r].append(count[r])
        mine[r].append(tuple(need))
        count[r] += 1
        out.append(tuple(need))
    return out


def total_needs(ranks: Sequence[int], world: int) -> list[tuple[int, ...]]:
    """The same counts for the listed order alone (every record after all listed before it):
    what the trace spec takes for the canonical merge, its cheap first try."""
    return causal_needs(ranks, [None] * len(ranks), world)


def stuck(ranks: Sequence[int], needs: Sequence[Sequence[int]], taken: Mapping[int, int]) -> list[int]:
    """Where every explored order fails: the positions (in the listed order) of each rank's first
    record that no order took, among those whose causal past some order took. `taken[q]`: how
    many of rank q's records the furthest order took. A record whose past was never taken is
    not named: it is blocked by another rank's failure, not refused itself."""
    per_rank: dict[int, list[int]] = {}
    for j, r in enumerate(ranks):
        per_rank.setdefault(r, []).append(j)
    out = []
    for q, mine in per_rank.items():
        k = taken.get(q, 0)
        if k < len(mine) and all(n <= taken.get(p, 0) for p, n in enumerate(needs[mine[k]])):
            out.append(mine[k])
    return sorted(out)
