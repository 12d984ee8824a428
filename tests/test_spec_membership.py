"""The membership change (rank replacement with hot spares, issue 15): spec/Membership.tla.

Its models live under spec/membership/ and name their module with a `\\* spec: Membership.tla`
header: MC3 (the default check and CI: `accelpact check --ranks 2 3` runs it) and MC4 (2x2 HSDP,
`make check`) must pass; each mutant in spec/membership/mutants/ must be caught by exactly the
property it names (the first violation TLC reports, the invariants ordered in the cfgs from the
release gate outwards); each witness in spec/membership/witnesses/ must be reached. The shrink
(Config.on_loss="shrink": go on with fewer replicas when no spare is free) is switched on by the
constant Shrink: MC4shrink (2x2 HSDP, no spare) runs here, MC4shrink_losses (a second loss) and
MC4shrink_spare (a replacement, then a shrink) with MC4 in `make check`. A loss inside an update's
boundary check (survivors one commit apart) rolls forward: SplitOnlyAtCheck is the lemma that
makes it sound, SpareContinuesLostStream what it must give a spare (the lost rank's small state of
the frontier it resumes at); the witness split_rolled_forward reaches it.

MC3 itself is not run here (the CI model check runs it; ~118,000 states): a reduced model of the
same protocol is, so that the suite still proves the pass path of the spec's own invariants.
"""

from __future__ import annotations

import argparse
import functools
import io

import pytest

from model_checking import check, models
from model_checking.tlc import ModelConfig, Status, render_cfg, run_tlc, run_tlc_many

SAFETY = ("TypeOK", "SpareValidatedBeforeRelease", "StateFromReplica", "FencedNeverTrains",
          "OnePositionOneProcess", "SpareClaimedOnce", "OutcomeAgreement", "SpareContinuesLostStream",
          "NoSplitFrontier", "SplitOnlyAtCheck", "NoTrainOnRetiredWorld", "ShrinkKeepsEveryShard",
          "ShrinkKeepsWholeGroups", "LeaverNeverTrains", "NoStaleAverage")

#: Each mutant and the one property it must be caught by (also in each cfg's `expect:` header).
MUTANTS = {
    "release_before_transfer_verified": "SpareValidatedBeforeRelease",
    "partition_not_fenced": "FencedNeverTrains",
    "two_claim_one_position": "OutcomeAgreement",
    "transfer_from_non_replica": "StateFromReplica",
    "frontier_split": "NoSplitFrontier",
    "blind_release": "OutcomeAgreement",
    "train_on_old_world": "NoTrainOnRetiredWorld",
    "late_present_joins": "OnePositionOneProcess",
    "stale_neighbour_copy": "SpareContinuesLostStream",
    "spare_claimed_twice": "SpareClaimedOnce",
    "shrink_without_holder": "ShrinkKeepsEveryShard",
    "shrink_keeps_broken_group": "ShrinkKeepsWholeGroups",
    "leaver_trains": "LeaverNeverTrains",
    "stale_average": "NoStaleAverage",
    "newest_small_state": "SpareContinuesLostStream",
    "commit_without_all": "SplitOnlyAtCheck",
}

#: Each witness and the interesting state it must reach (the invariant TLC must violate).
WITNESSES = {
    "replacement_resumes": "NoReplacementEver",
    "second_replacement": "NeverTwoReplacements",
    "fenced_exit": "NeverFencedExit",
    "loss_before_release_rejects": "NeverLossBeforeReleaseRejects",
    "fenced_member_resumes": "NeverFencedMemberResumes",
    "neighbour_copy_replacement": "NoNeighbourReplacement",
    "shrink_trains": "NeverShrinkTrains",
    "leaver_leaves": "NeverLeaverLeaves",
    "shrink_refused": "NeverShrinkRefused",
    "split_rolled_forward": "NeverSplitRolledForward",
}


def _explain(result) -> str:
    lines = [result.verdict(), *result.errors]
    for state in result.trace[-4:]:
        lines.append(f"{state.index}: {state.action} {state.values.get('phase')}")
    return "\n".join(lines)


# -- the shipped models ---------------------------------------------------------------------------
@pytest.mark.parametrize("positions", models.MEMBERSHIP_SIZES)
def test_membership_models_check_every_property_and_deadlock(positions):
    model = models.membership_model(positions)
    assert model.expect == "pass" and model.check_deadlock
    assert models.spec_module(model) == "Membership.tla"
    assert model.constants["W"] == str(positions) and model.constants["Mutant"] == '"none"'
    assert model.invariants == SAFETY
    assert model.constants["Shrink"] == "FALSE", "MC<W> models the replacement; the shrink has its own models"


def test_the_shrink_models_are_checked_with_make_check():
    """MC4shrink (pytest too), MC4shrink_losses and MC4shrink_spare: 2x2 HSDP with the shrink on, every property."""
    extra = models.membership_extra(4)
    assert [m.name for m in extra] == ["MC4shrink", "MC4shrink_losses", "MC4shrink_spare"]
    for model in extra:
        assert model.expect == "pass" and model.check_deadlock, model.name
        assert models.spec_module(model) == "Membership.tla"
        assert model.constants["Shrink"] == "TRUE" and model.constants["Mutant"] == '"none"'
        assert model.constants["Replicas"] == "{{0, 2}, {1, 3}}"
        assert model.invariants == SAFETY, model.name
    assert [m.constants["S"] for m in extra] == ["0", "0", "1"]
    assert [m.constants["MaxLosses"] for m in extra] == ["1", "2", "2"]
    assert models.membership_extra(3) == []


def test_the_default_model_has_two_spares_and_two_losses():
    """CI's model: a second loss after a replacement, or during one, and a second replacement."""
    c = models.membership_model(models.MEMBERSHIP_DEFAULT[0]).constants
    assert c["S"] == "2" and c["MaxLosses"] == "2"


def test_every_mutant_is_listed_and_names_its_property():
    found = {m.name: m for m in models.membership_mutants()}
    assert set(found) == set(MUTANTS), "a mutant cfg was added or removed: update MUTANTS"
    for name, model in found.items():
        assert model.expect == MUTANTS[name], name
        assert models.spec_module(model) == "Membership.tla", name
        assert model.constants["Mutant"] == f'"{name}"'
        assert model.invariants == SAFETY, name
    spec = (models.spec_dir() / "Membership.tla").read_text()
    for name in MUTANTS:
        assert f'"{name}"' in spec, f"the spec does not know the mutant {name}"


def test_every_witness_is_listed_and_checks_only_its_state():
    found = {m.name: m for m in models.membership_witnesses()}
    assert set(found) == set(WITNESSES), "a witness cfg was added or removed: update WITNESSES"
    for name, model in found.items():
        assert model.expect == WITNESSES[name] and model.invariants == ("TypeOK", WITNESSES[name]), name
        assert model.constants["Mutant"] == '"none"', "a witness is reached by the real protocol"
        assert models.spec_module(model) == "Membership.tla"
    assert found["second_replacement"].constants["S"] == "2"


def test_the_accelpact_models_still_check_accelpact():
    assert models.spec_module(models.rank_model(2)) == models.SPEC_FILE
    assert all(models.spec_module(m) == models.SPEC_FILE for m in models.mutant_models())


def test_check_runs_the_membership_model_with_the_default_check(monkeypatch):
    ran: list[tuple[str, int]] = []
    monkeypatch.setattr(check, "_check_protocols", lambda ns, *a: ran.extend(("ranks", n) for n in ns) or True)
    monkeypatch.setattr(check, "_check_membership", lambda w, *a: ran.append(("membership", w)) or True)
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert check.run(parser.parse_args(["--ranks", "2", "3", "--workers", "2"])) == 0
    assert ran == [("ranks", 2), ("ranks", 3), ("membership", 3)]
    ran.clear()
    assert check.run(parser.parse_args(["--ranks", "2", "--no-membership"])) == 0
    assert ran == [("ranks", 2)]
    ran.clear()
    assert check.run(parser.parse_args(["--membership", "3", "4"])) == 0
    assert ran == [("membership", 3), ("membership", 4)]
    with pytest.raises(SystemExit):
        parser.parse_args(["--membership", "5"])


# -- TLC runs -------------------------------------------------------------------------------------
def _reduced_cfg() -> str:
    """Two positions, one spare, one loss: replacement, fencing, a corrupted transfer, a loss inside
    an update's boundary check (members entering it one at a time: InFlight)."""
    return render_cfg({"W": 2, "S": 1, "Replicas": {frozenset({0, 1})}, "CopyStride": 0, "MaxLosses": 1,
                       "MaxFrontier": 1, "Corruption": True, "InFlight": True, "Spurious": True, "Shrink": False,
                       "Mutant": "none"},
                      invariants=SAFETY)


@pytest.fixture(scope="module")
def checked():
    """The reduced model, the neighbour-copy and shrink models, every mutant and every witness checked by TLC,
    two runs at a time (one worker each, as tests/test_spec.py's batch), once for the module:
    {name: (model, result)}. Each test below asserts on its own run. One after another they took
    a JVM start-up and an exploration each, end to end; side by side the batch takes about half
    (the runs are independent)."""
    copies = ModelConfig.load(models.membership_dir() / "MC3copies.cfg")
    shrink = ModelConfig.load(models.membership_dir() / "MC4shrink.cfg")
    found = [copies, shrink, *models.membership_mutants(), *models.membership_witnesses()]
    runs = [functools.partial(run_tlc, models.spec_dir() / "Membership.tla", _reduced_cfg(), workers=1,
                              timeout_s=100)]
    runs += [functools.partial(run_tlc, models.spec_dir() / models.spec_module(m), m.path, workers=1,
                               timeout_s=100, check_deadlock=m.check_deadlock) for m in found]
    reduced, *results = run_tlc_many(runs, jobs=2)
    checked = {f"{m.path.parent.name}/{m.name}": (m, r) for m, r in zip(found, results, strict=True)}
    checked["reduced"] = (None, reduced)
    return checked


# The first test to ask for `checked` waits for every run of the batch.
@pytest.mark.tlc
@pytest.mark.timeout(300)
def test_a_reduced_membership_model_passes(checked):
    """Two positions, one spare, one loss: replacement, fencing, a corrupted transfer."""
    _, result = checked["reduced"]
    assert result.status is Status.PASS, _explain(result)
    assert result.distinct_states and result.distinct_states > 100


@pytest.mark.tlc
@pytest.mark.timeout(300)
def test_the_neighbour_copy_model_passes(checked):
    """Position 2 alone holds its shard and copies it to position 0 asynchronously (issue 16):
    every property holds with a loss at any time, mid-update too, and corrupted transfers."""
    model, result = checked["membership/MC3copies"]
    assert model.path == models.membership_dir() / "MC3copies.cfg"
    assert model.expect == "pass" and model.constants["CopyStride"] == "1"
    assert models.spec_module(model) == "Membership.tla"
    assert result.status is Status.PASS, _explain(result)
    assert result.distinct_states and result.distinct_states > 10_000


@pytest.mark.tlc
@pytest.mark.timeout(300)
def test_the_shrink_model_passes(checked):
    """2x2 HSDP, no spare, the shrink on: a loss goes on with the whole replica group; every
    property holds (the shrink's and the replacement's), with a loss at any time and split
    frontiers."""
    model, result = checked["membership/MC4shrink"]
    assert model.expect == "pass" and model.constants["Shrink"] == "TRUE"
    assert result.status is Status.PASS, _explain(result)
    assert result.distinct_states and result.distinct_states > 5_000


@pytest.mark.tlc
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_violates_exactly_its_property(name, checked):
    model, result = checked[f"mutants/{name}"]
    assert model.path == models.membership_dir() / "mutants" / f"{name}.cfg"
    assert models.spec_module(model) == "Membership.tla"
    assert result.status is Status.INVARIANT and result.violated == MUTANTS[name], _explain(result)
    assert models.expectation_met(model, result)
    # the shortest counterexample: the initial state, a loss, a detection, the decision (a bad
    # register value: shrink_without_holder); commit_without_all needs no loss: the initial state,
    # position 2 enters the check of update 1, and commits it alone
    shortest = 3 if name == "commit_without_all" else 4
    assert len(result.trace) >= shortest, "a violation must come with its counterexample"


@pytest.mark.tlc
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_witness_is_reached(name, checked):
    model, result = checked[f"witnesses/{name}"]
    assert model.path == models.membership_dir() / "witnesses" / f"{name}.cfg"
    assert models.spec_module(model) == "Membership.tla"
    assert result.status is Status.INVARIANT and result.violated == WITNESSES[name], _explain(result)
    assert models.expectation_met(model, result)
