"""model_checking/membership_trace.py: a replacement run checked against spec/Membership.tla's rules.

A synthetic 2x2 HSDP run (replica sets {0, 2} and {1, 3}): position 1 is partitioned during
update 6, the survivors post PRESENT at F=5, the register replaces position 1 by spare 4 with
position 3 as the source, the partitioned rank later reads its fence, the spare verifies the
state, everyone votes, the world is released and trains at F=5. It keeps every rule; each doctored
copy breaks one and is refused with a message naming it.
"""

from __future__ import annotations

import copy
import json

import pytest

from model_checking.membership_trace import check_membership_traces, load_membership_traces

REPLICAS = [[0, 2], [1, 3]]


def _decided(**over):
    rec = {"event": "decided", "world": 0, "outcome": "replace", "present": [0, 2, 3], "lost": [1],
           "assign": {"1": 4}, "source": {"1": 3}, "frontier": 5, "replicas": REPLICAS}
    rec.update(over)
    return rec


def _survivor(pos: int) -> list[dict]:
    recs = [
        {"event": "train", "world": 0, "position": pos, "frontier": 0},
        {"event": "present", "world": 0, "position": pos, "frontier": 5, "applied": pos == 0},
        {"event": "left_world", "world": 0, "position": pos, "closed": 2},
        _decided(),
        {"event": "world_built", "world": 1, "position": pos},
    ]
    if pos == 3:
        recs.append({"event": "transfer_sent", "world": 1, "position": 3, "to": 1, "bytes": 4096,
                     "digest": "sha256:aa"})
    recs += [
        {"event": "vote", "world": 1, "position": pos, "ok": True},
        {"event": "release", "world": 1, "outcome": "resume"},
        {"event": "train", "world": 1, "position": pos, "frontier": 5},
    ]
    return recs


def _run() -> dict[str, list[dict]]:
    run = {
        "rank0.jsonl": _survivor(0),
        "rank2.jsonl": _survivor(2),
        "rank3.jsonl": _survivor(3),
        "rank1.jsonl": [  # partitioned; reaches the store after the decision, reads its fence
            {"event": "train", "world": 0, "position": 1, "frontier": 0},
            _decided(),
            {"event": "fenced", "world": 0, "position": 1},
        ],
        "spare4.jsonl": [
            _decided(),
            {"event": "activated", "world": 1, "position": 1, "spare": 4},
            {"event": "world_built", "world": 1, "position": 1},
            {"event": "transfer_verified", "world": 1, "position": 1, "digest": "sha256:aa", "ok": True},
            {"event": "vote", "world": 1, "position": 1, "ok": True},
            {"event": "release", "world": 1, "outcome": "resume"},
            {"event": "train", "world": 1, "position": 1, "frontier": 5},
        ],
    }
    for name, recs in run.items():
        rank = int("".join(c for c in name.split(".")[0] if c.isdigit()))
        for seq, rec in enumerate(recs, start=1):
            rec.update(kind="membership", seq=seq * 10, rank=rank)
    return run


def _reseq(recs: list[dict]) -> list[dict]:
    for seq, rec in enumerate(recs, start=1):
        rec["seq"] = seq * 10
    return recs


def _rules(violations: list[str]) -> set[str]:
    return {v.split("]")[0].lstrip("[") for v in violations}


def test_a_correct_replacement_run_keeps_every_rule():
    assert check_membership_traces(_run()) == []
    # the replica sets may come from the caller instead of the decided record
    run = _run()
    for recs in run.values():
        for rec in recs:
            rec.pop("replicas", None)
    assert check_membership_traces(run, replicas=REPLICAS) == []
    assert any("no replica sets" in v for v in check_membership_traces(run))


def test_other_records_are_ignored_and_files_are_read(tmp_path):
    run = _run()
    run["rank0.jsonl"].insert(0, {"kind": "edge", "seq": 1, "trigger": "commit_update"})
    for name, recs in run.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    loaded = load_membership_traces(tmp_path)
    assert set(loaded) == set(run) and all(r["kind"] == "membership" for rs in loaded.values() for r in rs)
    assert check_membership_traces(loaded) == []


def test_release_before_the_spare_verified_its_state_is_refused():
    run = _run()
    spare = run["spare4.jsonl"]
    verified = spare.pop(3)
    spare.insert(4, verified)  # vote ok, then verify
    bad = check_membership_traces({**run, "spare4.jsonl": _reseq(spare)})
    assert _rules(bad) == {"SpareValidatedBeforeRelease"}, bad
    assert "before verifying the transfer" in bad[0]
    # a release while the spare never voted
    run = _run()
    run["spare4.jsonl"] = _reseq([r for r in run["spare4.jsonl"] if r["event"] not in ("vote", "train")])
    bad = check_membership_traces(run)
    assert any(v.startswith("[SpareValidatedBeforeRelease] world 1: release=resume") and "[1]" in v for v in bad), bad


def test_training_in_a_world_whose_connections_it_closed_is_refused():
    """A rank that closed its connections of world 0 (the loss it saw retires that world) must
    not train in it again, even when no decision ever left it out."""
    run = _run()
    survivor = run["rank2.jsonl"]
    at = next(i for i, r in enumerate(survivor) if r["event"] == "left_world")
    survivor.insert(at + 1, {"kind": "membership", "event": "train", "world": 0, "position": 2, "frontier": 5})
    bad = check_membership_traces({**run, "rank2.jsonl": _reseq(survivor)})
    assert _rules(bad) == {"NoTrainOnRetiredWorld"}, bad
    assert "after closing its connections" in bad[0]


def test_a_digest_that_was_never_sent_is_refused():
    run = _run()
    run["spare4.jsonl"][3]["digest"] = "sha256:bb"
    bad = check_membership_traces(run)
    assert _rules(bad) == {"SpareValidatedBeforeRelease"}, bad


def test_a_fenced_process_that_trains_is_refused():
    run = _run()
    run["rank1.jsonl"].append({"kind": "membership", "event": "train", "world": 0, "position": 1,
                               "frontier": 5, "seq": 99})
    bad = check_membership_traces(run)
    assert _rules(bad) == {"FencedNeverTrains"}, bad
    assert bad[0].startswith("[FencedNeverTrains] rank1.jsonl seq 99: trains in world 0 after")
    # also when it only read the decision that left it out
    run = _run()
    run["rank1.jsonl"] = _reseq(run["rank1.jsonl"][:2] + [
        {"kind": "membership", "event": "train", "world": 0, "position": 1, "frontier": 5}])
    bad = check_membership_traces(run)
    assert _rules(bad) == {"FencedNeverTrains"}, bad


def test_two_processes_training_one_position_are_refused():
    run = _run()
    # a second spare activates into position 1 (the register never named it) and trains
    run["spare5.jsonl"] = _reseq([copy.deepcopy(r) for r in run["spare4.jsonl"]])
    run["spare5.jsonl"][1]["spare"] = 5
    bad = check_membership_traces(run)
    assert "OnePositionOneProcess" in _rules(bad), bad
    assert any("position 1 trained by 2 processes" in v for v in bad), bad
    assert any("did not assign to it" in v for v in bad), bad


def test_a_source_outside_the_replica_set_is_refused():
    run = _run()
    for recs in run.values():
        for rec in recs:
            if rec["event"] == "decided":
                rec["source"] = {"1": 0}  # 0 holds the other shard
            if rec["event"] == "transfer_sent":
                rec["position"] = 0
    run["rank0.jsonl"].insert(4, run["rank3.jsonl"].pop(4))
    bad = check_membership_traces({k: _reseq(v) for k, v in run.items()})
    assert _rules(bad) == {"StateFromReplica"}, bad
    assert "outside its replica set [1, 3]" in bad[0]


def test_two_decisions_for_one_world_are_refused():
    run = _run()
    run["rank2.jsonl"][3] = {**run["rank2.jsonl"][3], "assign": {"1": 5}}
    bad = check_membership_traces(run)
    assert "OutcomeAgreement" in _rules(bad), bad
    assert any("one decision per world" in v for v in bad)


def test_training_before_the_release_is_refused():
    run = _run()
    recs = run["rank0.jsonl"]
    recs[-2], recs[-1] = recs[-1], recs[-2]  # train, then read release=resume
    bad = check_membership_traces({**run, "rank0.jsonl": _reseq(recs)})
    assert _rules(bad) == {"TrainAfterRelease"}, bad
    assert "before release=resume" in bad[0]


def test_a_decision_over_split_frontiers_is_refused():
    run = _run()
    run["rank2.jsonl"][1]["frontier"] = 6
    bad = check_membership_traces(run)
    assert _rules(bad) == {"NoSplitFrontier"}, bad


def _rolled_run() -> dict[str, list[dict]]:
    """Position 1 was lost inside the boundary check of update 6: ranks 0 and 2 committed it
    (PRESENT at F=6), rank 3's check failed after its contribution left (PRESENT at F=5,
    at_check); the decision rolls rank 3 forward and the new world starts at F=6."""
    run = _run()
    for recs in run.values():
        for rec in recs:
            if rec["event"] == "decided":
                rec.update(frontier=6, rolled=[3])
            if rec["event"] == "present":
                rec["frontier"] = 5 if rec["position"] == 3 else 6
                rec["at_check"] = rec["position"] == 3
            if rec["event"] == "train" and rec["world"] == 1:
                rec["frontier"] = 6
    r3 = run["rank3.jsonl"]
    r3.insert(4, {"event": "rolled_forward", "world": 0, "position": 3, "frontier": 6, "kind": "membership",
                  "rank": 3})
    _reseq(r3)
    return run


def test_a_roll_forward_keeps_every_rule_and_its_doctored_copies_are_refused():
    assert check_membership_traces(_rolled_run()) == []
    # the rolled rank never committed the update before training in the new world
    run = _rolled_run()
    run["rank3.jsonl"] = _reseq([r for r in run["rank3.jsonl"] if r["event"] != "rolled_forward"])
    bad = check_membership_traces(run)
    assert _rules(bad) == {"NoSplitFrontier"} and "without committing update 6" in bad[0], bad
    # rolled forward although it never reached the check
    run = _rolled_run()
    for rec in run["rank3.jsonl"]:
        if rec["event"] == "present":
            rec["at_check"] = False
    bad = check_membership_traces(run)
    assert _rules(bad) == {"NoSplitFrontier"} and "without a contribution to the check" in bad[0], bad
    # a rank the decision does not roll forward commits the update anyway
    run = _rolled_run()
    run["rank0.jsonl"].insert(4, {"event": "rolled_forward", "world": 0, "position": 0, "frontier": 6,
                                  "kind": "membership", "rank": 0})
    bad = check_membership_traces({**run, "rank0.jsonl": _reseq(run["rank0.jsonl"])})
    assert _rules(bad) == {"NoSplitFrontier"} and "position 0 rolls forward to F=6" in bad[0], bad


@pytest.mark.parametrize("doctor", ["seq", "field"])
def test_malformed_records_are_refused(doctor):
    run = _run()
    if doctor == "seq":
        run["rank0.jsonl"][3]["seq"] = 5
    else:
        del run["rank0.jsonl"][3]["world"]
    bad = check_membership_traces(run)
    assert bad and _rules(bad) == {"TraceFormat"}, bad


def test_training_after_a_reject_is_refused_with_or_without_the_decision_on_record():
    """Found by review: the checks of a world formed by a change ran only where its `decided`
    record was on record; a process that trained in world 1 after release=reject (or with no
    release at all) passed when it was not."""
    def proc(*recs):
        return {"rank0.jsonl": _reseq([{"kind": "membership", "rank": 0, **r} for r in recs])}

    after_reject = proc({"event": "release", "world": 1, "outcome": "reject"},
                        {"event": "train", "world": 1, "position": 0, "frontier": 5})
    found = check_membership_traces(after_reject)
    assert any(v.startswith("[TrainAfterRelease]") and "after release=reject" in v for v in found), found
    found = check_membership_traces(proc({"event": "train", "world": 1, "position": 0, "frontier": 5}))
    assert any("before release=resume" in v for v in found) and any("never joined" in v for v in found), found
