"""The spec and the Python transition table are the same machine: same (trigger, from, to) edges.

The table (accelpact/fsm/table.py) is the source of truth; the spec is what TLC checks. If the
two drift apart, the model checks prove properties of a protocol nobody runs. So the edges are
read back out of a TLC dump of every reachable state and compared with `table.edges()` exactly,
and the comparison is itself tested: a change to either side alone must be reported.
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
    """The spec's edges, from one TLC run shared by the tests of this module."""
    return spec_edges(models.spec_path(), workers=1)


def _variant(tmp_path, old: str, new: str):
    """A copy of the spec with one edit; the edit must apply exactly once."""
    text = models.spec_path().read_text()
    assert text.count(old) == 1, f"the spec no longer contains {old!r}: update this test"
    path = tmp_path / "AccelPact.tla"
    path.write_text(text.replace(old, new))
    return path


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
    path = _variant(tmp_path, 'AbortSources == {"Agree"}', 'AbortSources == {"Agree", "Replace"}')
    diff = compare_edges(spec_edges(path).edges, table_edges())
    assert diff.only_in_spec == {("abort", "Replace", "Reject")}
    assert not diff.only_in_table


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(60)
def test_spec_with_a_renamed_trigger_is_reported(tmp_path):
    path = _variant(tmp_path, 'Step(r, "release_reject", "Reject")', 'Step(r, "release_abort", "Reject")')
    diff = compare_edges(spec_edges(path).edges, table_edges())
    assert diff.only_in_spec == {("release_abort", "Validate", "Reject")}
    assert diff.only_in_table == {("release_reject", "Validate", "Reject")}


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
