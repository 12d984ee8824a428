"""The spec and the Python transition table are the same machine: same guards, same edges.

The table (accelpact/fsm/table.py) is the source of truth; the spec is what TLC checks. If the
two drift apart, the model checks prove properties of a protocol nobody runs. Guards: the spec
does not restate them, it EXTENDS spec/AccelPactTable.tla, generated from the table, so a guard
removed from the table makes the shipped module stale (reported), and once regenerated TLC checks
the weakened protocol (and catches it). Edges: read back out of a TLC dump of every reachable
state and compared with `table.edges()` exactly. Each comparison is itself tested.
"""

from __future__ import annotations

import re

import pytest

from model_checking import models
from model_checking.conformance import (
    compare_edges,
    edges_from_states,
    is_rank_edge,
    parse_edge,
    spec_edges,
    table_edges,
)
from model_checking.tlc import parse_dump

# No skip without Java: `make install` provides it, and a missing runtime must fail loudly here
# (model_checking.tlc raises TlcError naming it) rather than hide the model checks.
needs_java = pytest.mark.tlc


@pytest.fixture(scope="module")
def found():
    """The spec's edges, from one TLC run shared by the tests of this module (two workers: the
    edges are read from every state, whichever worker found it)."""
    return spec_edges(models.spec_path(), workers=2)


def _variant(tmp_path, old: str, new: str, module: str = "AccelPact.tla"):
    """A copy of spec/ with one edit to `module`; the edit must apply exactly once."""
    for f in models.spec_dir().glob("*.tla"):
        (tmp_path / f.name).write_text(f.read_text())
    text = (models.spec_dir() / module).read_text()
    assert text.count(old) == 1, f"{module} no longer contains {old!r}: update this test"
    (tmp_path / module).write_text(text.replace(old, new))
    return tmp_path / "AccelPact.tla"


def _table_without(trigger: str, guard: str):
    """The table's rows with one condition (or unless entry) dropped from `trigger`'s row."""
    from dataclasses import replace

    from accelpact.fsm.table import TRANSITIONS

    rows = []
    for row in TRANSITIONS:
        if row.trigger == trigger:
            assert guard in row.conditions + row.unless, f"{trigger} has no guard {guard}"
            row = replace(row, conditions=tuple(c for c in row.conditions if c != guard),
                          unless=tuple(u for u in row.unless if u != guard))
        rows.append(row)
    return rows


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_spec_edges_equal_table_edges(found):
    diff = compare_edges(found.edges, table_edges())
    assert diff.ok, diff.describe()
    assert len(found.edges) == len(table_edges()) == 18


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_spec_names_every_trigger_of_the_table(found):
    from accelpact.fsm.table import triggers

    assert {e[0] for e in found.edges} == set(triggers())


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_table_with_an_extra_edge_is_reported(found):
    extra = ("abort", "Validate", "Reject")
    table = table_edges()
    assert extra not in table
    diff = compare_edges(found.edges, table | {extra})
    assert not diff.ok
    assert diff.only_in_table == {extra} and not diff.only_in_spec
    assert "only in table: abort: Validate -> Reject" in diff.describe()


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_table_with_a_missing_edge_is_reported(found):
    gone = ("stand_by", "Agree", "Validate")
    diff = compare_edges(found.edges, table_edges() - {gone})
    assert diff.only_in_spec == {gone} and not diff.only_in_table


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_spec_with_an_extra_edge_is_reported(tmp_path):
    # Let `abort` also leave Replace: a plausible edit the runtime does not have (a rank in
    # Replace never waits on the control plane; a failed rebuild goes through replace_failed).
    path = _variant(tmp_path, '[] t = "abort" -> {"Agree"}', '[] t = "abort" -> {"Agree", "Replace"}',
                    module="AccelPactTable.tla")
    diff = compare_edges(spec_edges(path, workers=2).edges, table_edges())
    assert diff.only_in_spec == {("abort", "Replace", "Reject")}
    assert not diff.only_in_table


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_spec_with_a_renamed_trigger_is_reported(tmp_path):
    path = _variant(tmp_path, "/\\ edge' = <<t, phase[r], Dest(t)>>",
                    """/\\ edge' = <<IF t = "release_reject" THEN "release_abort" ELSE t, phase[r], Dest(t)>>""")
    diff = compare_edges(spec_edges(path, workers=2).edges, table_edges())
    assert diff.only_in_spec == {("release_abort", "Validate", "Reject")}
    assert diff.only_in_table == {("release_reject", "Validate", "Reject")}


# -- guards ------------------------------------------------------------------------------------------
def test_shipped_guards_are_generated_from_the_table():
    from model_checking.guards import table_module_is_current

    ok, message = table_module_is_current(models.spec_dir())
    assert ok, message


@pytest.mark.parametrize(("trigger", "guard"), [("rebind_refs", "proof_passed"), ("decide_preserve", "in_failed_group"),
                                                 ("stand_by", "in_failed_group"), ("release", "outcome_is_resume")])
def test_a_guard_removed_from_the_table_is_reported(tmp_path, trigger, guard):
    from model_checking.guards import render_table_module, table_module_is_current

    (tmp_path / "AccelPactTable.tla").write_text(render_table_module(_table_without(trigger, guard)))
    ok, message = table_module_is_current(tmp_path)
    assert not ok and f'[] t = "{trigger}"' in message


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(120)
def test_a_regenerated_weaker_guard_is_caught_by_tlc(tmp_path):
    """Dropping proof_passed from rebind_refs and regenerating is exactly the skip_rebind bug."""
    from model_checking.guards import render_table_module
    from model_checking.tlc import ModelConfig, Status

    for f in models.spec_dir().glob("*.tla"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "AccelPactTable.tla").write_text(render_table_module(_table_without("rebind_refs", "proof_passed")))
    cfg = (models.spec_dir() / "mutants" / "skip_rebind.cfg").read_text().replace('"skip_rebind"', '"none"')
    (tmp_path / "weak.cfg").write_text(cfg)
    result = models.check_model(ModelConfig.load(tmp_path / "weak.cfg"), directory=tmp_path)
    assert result.status is Status.INVARIANT and result.violated == "NoStaleReference", result.verdict()


def test_every_table_predicate_is_read_by_the_spec():
    """Holds(r, c, res) interprets each predicate name; one it lacks is a TLC error, one extra is
    a guard the table no longer has (only a mutant may read it)."""
    from accelpact.fsm.table import predicates

    text = models.spec_path().read_text()
    body = text[text.index("Holds(r, c, res) =="):text.index("Conds(t) ==")]
    holds = set(re.findall(r'c = "(\w+)"', body))
    assert set(predicates()) <= holds
    assert holds - set(predicates()) == {"decision_resumes"}  # only the rewind_stand_by mutant's old guard


# -- the pieces, without TLC ----------------------------------------------------------------------
def _spec_string_set(name: str) -> set[str]:
    text = models.spec_path().read_text()
    m = re.search(rf"^{name} == \{{(.*?)\}}", text, re.MULTILINE | re.DOTALL)
    assert m, f"the spec defines no {name}"
    return set(re.findall(r'"([^"]*)"', m.group(1)))


def test_spec_vocabulary_is_the_python_vocabulary():
    """Phase and failure-phase names are shared strings: a typo would make an edge or a report
    silently different, so the spec's sets must equal the enums."""
    from accelpact.fsm.phases import FailurePhase, Phase
    from accelpact.fsm.table import triggers

    assert _spec_string_set("Phases") == {str(p) for p in Phase}
    assert _spec_string_set("FailurePhases") == {str(p) for p in FailurePhase}
    assert _spec_string_set("Triggers") == set(triggers())


def test_edges_from_a_dump_ignore_environment_steps():
    dump = (
        'State 1:\n/\\ edge = <<"init", "", "">>\n\n'
        'State 2:\n/\\ edge = <<"env:fault", "", "">>\n\n'
        'State 3:\n/\\ edge = <<"observe_failure", "Train", "Observe">>\n\n'
        'State 4:\n/\\ edge = <<"observe_failure", "Train", "Observe">>\n\n'
        'State 5:\n/\\ edge = <<"release", "Validate", "Resume">>\n\n'
    )
    assert edges_from_states(parse_dump(dump)) == {
        ("observe_failure", "Train", "Observe"),
        ("release", "Validate", "Resume"),
    }


def test_edge_parsing():
    assert parse_edge('<<"abort", "Rebind", "Reject">>') == ("abort", "Rebind", "Reject")
    assert not is_rank_edge(("env:crash", "", "")) and not is_rank_edge(("init", "", ""))
    assert is_rank_edge(("commit_update", "Train", "Train"))
    with pytest.raises(ValueError):
        parse_edge("<<1, 2>>")
    with pytest.raises(ValueError):
        edges_from_states([{"phase": "x"}])


def test_compare_edges_is_exact_both_ways():
    a = {("x", "A", "B"), ("y", "B", "C")}
    assert compare_edges(a, a).ok
    diff = compare_edges(a, {("x", "A", "B"), ("y", "B", "D")})
    assert diff.only_in_spec == {("y", "B", "C")} and diff.only_in_table == {("y", "B", "D")}
    assert "only in spec:  y: B -> C" in diff.describe()
