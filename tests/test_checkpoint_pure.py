"""Pure decisions of the checkpoint layer: naming, manifest rules, candidate selection, retention."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelpact.checkpoint.errors import ManifestError, Refusal
from accelpact.checkpoint.manifest import (
    FileEntry,
    Manifest,
    check_committed,
    committed_marker,
    layout_mismatch,
    parse_manifest,
)
from accelpact.checkpoint.naming import classify_entries, parse_step_dir_name, step_dir_name, tmp_dir_name
from accelpact.checkpoint.publish import loadability_problem
from accelpact.checkpoint.retention import retention_plan
from accelpact.checkpoint.selection import Outcome, Selection, judge_latest, parse_latest, select_candidate
from accelpact.checkpoint.verify import Verdict, judge_digests, judge_sizes

SHA = "ab" * 32


def make_manifest(step: int = 7, *, world_size: int = 2, layout: object = "fsdp2 x2", run_id: str = "run") -> Manifest:
    files = (FileEntry("shards/.metadata", 10, SHA), FileEntry("rank-state/rank-00000.pt", 5, SHA))
    return Manifest(run_id=run_id, attempt="0", step=step, world_size=world_size, layout=layout,  # type: ignore[arg-type]
                    torch_version="2.13.0", files=files, created_at="now", frontier=step, opt_step=step)


# -- naming ----------------------------------------------------------------------------------------

def test_step_names_round_trip_and_order_numerically() -> None:
    assert parse_step_dir_name(step_dir_name(12)) == 12
    assert parse_step_dir_name(tmp_dir_name(12, 3)) is None
    names = ["step-9", step_dir_name(10), tmp_dir_name(11, "0"), "latest.json", "step-x", "attempts.jsonl"]
    listing = classify_entries(names)
    assert listing.candidates == (step_dir_name(10), "step-9")  # numeric, not lexicographic
    assert listing.tmps == (tmp_dir_name(11, "0"),)
    assert "step-x" in listing.others
    with pytest.raises(ValueError, match="non-negative"):
        step_dir_name(-1)
    with pytest.raises(ValueError, match="attempt tag"):
        tmp_dir_name(1, "a/b")


@given(st.lists(st.integers(min_value=0, max_value=10**13), unique=True))
def test_classify_orders_any_steps_newest_first(steps: list[int]) -> None:
    listing = classify_entries(step_dir_name(s) for s in steps)
    assert [s for s, _ in listing.steps] == sorted(steps, reverse=True)


# -- manifest --------------------------------------------------------------------------------------

def test_manifest_round_trip_and_committed_binding() -> None:
    m = make_manifest(layout={"dp": 2, "tp": 1})
    raw = m.to_json().encode()
    assert parse_manifest(raw) == m
    marker = committed_marker(m.step, raw).encode()
    assert check_committed(marker, m.step, raw) is None
    assert "differs" in (check_committed(marker, m.step, raw.replace(b"2.13.0", b"2.13.1")) or "")
    assert "names step" in (check_committed(marker, m.step + 1, raw) or "")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("files"), "files"),
        (lambda d: d.__setitem__("schema_version", 99), "schema_version 99"),
        (lambda d: d.__setitem__("step", "7"), "'step' has type str"),
        (lambda d: d["files"][0].__setitem__("path", "../escape"), "clean relative path"),
        (lambda d: d["files"][0].__setitem__("sha256", "xyz"), "64 lowercase hex"),
        (lambda d: d["files"].append(dict(d["files"][0])), "twice"),
        (lambda d: d.__setitem__("world_size", True), "'world_size' has type bool"),
    ],
)
def test_manifest_validation_names_the_violation(mutate, match: str) -> None:
    doc = json.loads(make_manifest().to_json())
    mutate(doc)
    with pytest.raises(ManifestError, match=match):
        parse_manifest(json.dumps(doc))


def test_truncated_manifest_is_refused() -> None:
    raw = make_manifest().to_json()
    with pytest.raises(ManifestError, match="not valid JSON"):
        parse_manifest(raw[: len(raw) // 2])


def test_layout_mismatch_names_both_layouts() -> None:
    m = make_manifest(world_size=2, layout="fsdp2 x2")
    assert layout_mismatch(m, 2, "fsdp2 x2") is None
    why = layout_mismatch(m, 4, "hsdp 2x2 fsdp2") or ""
    assert "world_size=2" in why and "world_size=4" in why and "hsdp 2x2 fsdp2" in why and "fsdp2 x2" in why
    assert layout_mismatch(make_manifest(layout={"b": 1, "a": 2}), 2, {"a": 2, "b": 1}) is None


# -- verification judges ---------------------------------------------------------------------------

def test_judges_report_missing_resized_unlisted_and_corrupt_files() -> None:
    m = make_manifest()
    ok_sizes = {"shards/.metadata": 10, "rank-state/rank-00000.pt": 5}
    present = set(ok_sizes) | {"manifest.json", "COMMITTED"}
    assert judge_sizes(m, ok_sizes, present) is None
    assert "missing: rank-state/rank-00000.pt" in (judge_sizes(m, {**ok_sizes, "rank-state/rank-00000.pt": None},
                                                               present) or "")
    assert "has 4 bytes, manifest says 5" in (judge_sizes(m, {**ok_sizes, "rank-state/rank-00000.pt": 4},
                                                          present) or "")
    assert "not listed" in (judge_sizes(m, ok_sizes, present | {"shards/__9_0.distcp"}) or "")
    assert judge_digests(m, {f.path: SHA for f in m.files}) is None
    assert "shards/.metadata" in (judge_digests(m, {"shards/.metadata": "00" * 32}) or "")


def test_loadability_requires_metadata_every_referenced_shard_and_every_rank_file() -> None:
    entries = [FileEntry(p, 1, SHA) for p in ("shards/.metadata", "shards/__0_0.distcp",
                                               "rank-state/rank-00000.pt", "rank-state/rank-00001.pt")]
    assert loadability_problem(entries, {"__0_0.distcp"}, 2) is None
    assert "__1_0.distcp" in (loadability_problem(entries, {"__0_0.distcp", "__1_0.distcp"}, 2) or "")
    assert "rank-00002" in (loadability_problem(entries, {"__0_0.distcp"}, 3) or "")


# -- selection -------------------------------------------------------------------------------------

def verdicts(table: dict[str, Verdict]):
    calls: list[str] = []

    def verify(name: str) -> Verdict:
        calls.append(name)
        return table[name]

    return verify, calls


def good(step: int, **kw) -> Verdict:
    return Verdict(True, "ok", step, make_manifest(step, **kw))


def test_selection_falls_back_past_refusals_and_stops_at_first_good() -> None:
    names = ["step-5", "step-4", "step-3", "step-2"]
    verify, calls = verdicts({"step-5": Verdict(False, "COMMITTED marker missing", 5),
                              "step-4": Verdict(False, "sha256 mismatch", 4), "step-3": good(3), "step-2": good(2)})
    sel = select_candidate(names, verify, run_id="run", world_size=2, layout="fsdp2 x2")
    assert sel.outcome is Outcome.SELECTED and sel.step == 3 and sel.name == "step-3"
    assert sel.refusals == (Refusal("step-5", "COMMITTED marker missing"), Refusal("step-4", "sha256 mismatch"))
    assert calls == ["step-5", "step-4", "step-3"]  # lazy: step-2 never read


def test_selection_outcomes_none_unverified_foreign_run_and_layout() -> None:
    assert select_candidate([], lambda n: good(1), run_id="run", world_size=2, layout="fsdp2 x2").outcome \
        is Outcome.NO_CHECKPOINT
    bad = select_candidate(["step-1"], lambda n: Verdict(False, "torn", 1), run_id="run", world_size=2,
                           layout="fsdp2 x2")
    assert bad.outcome is Outcome.NONE_VERIFIED and bad.refusals == (Refusal("step-1", "torn"),)
    foreign = select_candidate(["step-1"], lambda n: good(1, run_id="other"), run_id="run", world_size=2,
                               layout="fsdp2 x2")
    assert foreign.outcome is Outcome.NONE_VERIFIED and "run 'other'" in foreign.refusals[0].reason
    verify, calls = verdicts({"step-2": good(2, world_size=4), "step-1": good(1)})
    lay = select_candidate(["step-2", "step-1"], verify, run_id="run", world_size=2, layout="fsdp2 x2")
    assert lay.outcome is Outcome.LAYOUT_MISMATCH and lay.step == 2 and calls == ["step-2"]
    assert "world_size=4" in (lay.saved_layout or "") and "world_size=2" in (lay.current_layout or "")


def test_latest_pointer_is_only_judged_never_trusted() -> None:
    assert parse_latest(None) == (None, "latest.json missing")
    assert parse_latest(b'{"step": 4}') == (4, None)
    assert "unreadable" in (parse_latest(b'{"st') [1] or "")
    sel = Selection(Outcome.SELECTED, (Refusal("step-000000000009", "sha256 mismatch"),), 7, "step-000000000007")
    assert judge_latest((7, None), sel) is None
    assert "refused: sha256 mismatch" in (judge_latest((9, None), sel) or "")
    assert "does not exist" in (judge_latest((8, None), sel) or "")
    assert "older than" in (judge_latest((5, None), sel) or "")


# -- retention -------------------------------------------------------------------------------------

def test_retention_keeps_newest_verified_and_unverified_newer_ones() -> None:
    steps = [(10, "s10", True), (9, "s9", False), (8, "s8", True), (7, "s7", True), (6, "s6", False)]
    plan = retention_plan(steps, keep=2)
    assert plan.keep == ("s10", "s9", "s8") and plan.delete == ("s7", "s6")
    assert retention_plan(steps, keep=5).delete == ()
    milestones = retention_plan([(s, f"s{s}", True) for s in range(1, 9)], keep=2, keep_every=4)
    assert set(milestones.keep) == {"s8", "s7", "s4"}


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), unique_by=lambda t: t[0]), st.integers(1, 5))
def test_retention_never_drops_below_keep_verified(raw: list[tuple[int, bool]], keep: int) -> None:
    steps = [(s, f"s{s}", v) for s, v in raw]
    plan = retention_plan(steps, keep)
    verified = sorted((s for s, v in raw if v), reverse=True)
    kept_steps = {int(n[1:]) for n in plan.keep}
    assert set(verified[:keep]) <= kept_steps  # the newest K verified always survive
    assert set(plan.keep) | set(plan.delete) == {n for _, n, _ in steps}
    if len(verified) >= keep:
        assert all(s >= verified[keep - 1] for s in kept_steps)  # nothing older than the K-th survives


def test_a_directory_fsync_that_fails_stops_the_publish_unless_the_fs_cannot_fsync_directories(tmp_path,
                                                                                               monkeypatch):
    """EIO on the step tree or the root means its entries may not be durable: the step must not be
    published as if they were. A file system that cannot fsync a directory says EINVAL."""
    import errno
    import os

    import pytest

    from accelpact.checkpoint import fsio

    def failing(code):
        def fsync(fd):
            raise OSError(code, os.strerror(code))
        return fsync

    monkeypatch.setattr(fsio.os, "fsync", failing(errno.EINVAL))
    fsio.fsync_dir(tmp_path)  # not supported here: nothing to do
    monkeypatch.setattr(fsio.os, "fsync", failing(errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        fsio.fsync_dir(tmp_path)


def test_an_unknown_version_never_counts_towards_keep_and_a_milestone_stays_unless_known_bad() -> None:
    """Unknown: not hashed by this process (after a restart, every step but the restored one);
    reading it to find out would stall the save's peers."""
    from accelpact.checkpoint.retention import retention_plan

    steps = [(5, "s5", True), (4, "s4", None), (3, "s3", True), (2, "s2", None), (1, "s1", False), (0, "s0", None)]
    plan = retention_plan(steps, keep=2, keep_every=2)
    assert plan.keep == ("s5", "s4", "s3", "s2", "s0") and plan.delete == ("s1",)
    plan = retention_plan(steps, keep=2)
    assert plan.keep == ("s5", "s4", "s3") and plan.delete == ("s2", "s1", "s0")
    assert retention_plan([(2, "s2", None), (1, "s1", None)], keep=1).delete == ()  # nothing known good yet
