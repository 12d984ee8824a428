"""Prove that the TLA+ spec and the Python transition table describe the same machine.

The table (accelpact/fsm/table.py) is the source of truth. Every rank step of the spec records
`edge = <<trigger, from, to>>`; TLC dumps every reachable state of a small model, and the set of
recorded edges must equal `table.edges()` exactly. An edge only in the spec is behaviour the
runtime does not have; an edge only in the table is behaviour the model never checked (or a
row the model cannot reach, which is just as much a finding).

Edges are half of it: the guards are the other half, and those the spec does not restate but
EXTENDS, generated from the same table (model_checking/guards.py, spec/AccelPactTable.tla).

The conformance model has two ranks and one group {0} (R = {0}): rank 0 plays the failed-group member, rank 1
the rank that joins and stands by (or, already past its step, rewinds from its pre-step copy),
so every row of the table is reachable; spurious control-plane
timeouts make `abort` reachable from Agree, its one source phase. It is small (about 2k states) because
it runs without the VIEW that hides `edge` from the property checks.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .tlc import TlcResult, parse_dump, render_cfg, run_tlc

Edge = tuple[str, str, str]

CONFORMANCE_CONSTANTS: dict[str, object] = {
    "N": 2,
    "Groups": {frozenset({0})},
    "Slots": {1, 2},
    "MaxFrontier": 1,
    "MaxGen": 1,
    "MaxCrashes": 1,
    "MaxCuts": 0,
    "ControlFaults": False,
    "FaultPhases": {"backward", "optimizer", "committed"},
    "Spurious": True,
    "RewindQualified": True,
    "PreserveQualified": True,
    "StepCopy": True,
    "Mutant": "none",
}

_STRING_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def conformance_cfg() -> str:
    # No invariants: a renamed or added trigger must show up as an edge difference, not as a
    # TypeOK failure (the MC models check the properties).
    return render_cfg(
        CONFORMANCE_CONSTANTS,
        comment="Conformance model: every reachable state is dumped and its `edge` read back.",
    )


def is_rank_edge(edge: Edge) -> bool:
    """Steps of the environment (`env:...`) and the initial state are not rank edges."""
    return edge[0] != "init" and not edge[0].startswith("env")


def parse_edge(value: str) -> Edge:
    parts = _STRING_RE.findall(value)
    if len(parts) != 3:
        raise ValueError(f"edge value is not a triple of strings: {value!r}")
    return (parts[0], parts[1], parts[2])


def edges_from_states(states: Iterable[dict[str, str]]) -> frozenset[Edge]:
    edges = set()
    for state in states:
        if "edge" not in state:
            raise ValueError("a dumped state has no `edge` variable")
        edge = parse_edge(state["edge"])
        if is_rank_edge(edge):
            edges.add(edge)
    return frozenset(edges)


@dataclass(frozen=True)
class SpecEdges:
    edges: frozenset[Edge]
    result: TlcResult


def spec_edges(spec: Path, *, workers: int = 1, timeout_s: float = 300.0) -> SpecEdges:
    """Every rank edge the spec can take, read from a TLC dump of the conformance model."""
    with tempfile.TemporaryDirectory(prefix="accelpact-conf-") as tmp:
        dump = Path(tmp) / "states.dump"
        result = run_tlc(spec, conformance_cfg(), workers=workers, dump=dump, timeout_s=timeout_s)
        if not result.passed:
            raise RuntimeError(f"conformance model did not check cleanly: {result.verdict()}")
        return SpecEdges(edges_from_states(parse_dump(dump.read_text())), result)


def table_edges() -> frozenset[Edge]:
    from accelpact.fsm.table import edges

    return frozenset(edges())


@dataclass(frozen=True)
class EdgeDiff:
    only_in_spec: frozenset[Edge]
    only_in_table: frozenset[Edge]

    @property
    def ok(self) -> bool:
        return not self.only_in_spec and not self.only_in_table

    def describe(self) -> str:
        if self.ok:
            return "spec edges == table edges"
        lines = []
        for e in sorted(self.only_in_spec):
            lines.append(f"only in spec:  {e[0]}: {e[1]} -> {e[2]}")
        for e in sorted(self.only_in_table):
            lines.append(f"only in table: {e[0]}: {e[1]} -> {e[2]}")
        return "\n".join(lines)


def compare_edges(spec: Iterable[Edge], table: Iterable[Edge]) -> EdgeDiff:
    spec_set, table_set = frozenset(spec), frozenset(table)
    return EdgeDiff(spec_set - table_set, table_set - spec_set)
