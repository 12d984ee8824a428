"""`accelpact qualify` and the envelope file: what is written is read back exactly or refused with a
message that says what to run; an action is qualified only when every run of its probe passed."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from accelpact import cli
from accelpact.envelope import (
    EXPECTED_ACTION,
    PROFILES,
    CorruptEnvelopeError,
    Envelope,
    MissingEnvelopeError,
    ObservationKey,
    ProbeResult,
    QualifiedRow,
    StaleEnvelopeError,
)
from accelpact.envelope import file as ef
from accelpact.fsm.phases import FailurePhase, RecoveryAction
from accelpact.qualify import probes

FP = {"torch": "2.13.0", "backend": "gloo", "device": "cpu", "accelpact": "0.1.0", "python": "3.11"}
REBUILD_OK = ProbeResult("rebuild", 3, 3, None, repair_s=(0.004, 0.005, 0.006), detect_s=(1.0, 1.01, 1.0))


def probe(phase: str, action: str, *, passed: int = 3, bitwise: bool | None = True, profile: str = "fsdp2-hsdp",
          **kw) -> ProbeResult:
    return ProbeResult(action, 3, passed, bitwise, profile=profile, phase=phase, repair_s=(0.02, 0.03, 0.05),
                       detect_s=(1.0, 1.0, 1.1), wall_s=12.5, **kw)


def good_results() -> list[ProbeResult]:
    return [REBUILD_OK, probe("committed", "preserve"), probe("forward", "rewind"), probe("backward", "rewind"),
            probe("optimizer", "rewind", requires=("step_copy",))]


def rows_of(results=None) -> list[QualifiedRow]:
    return ef.envelope_from_results(good_results() if results is None else results, "cpu-gloo",
                                    torch_version="2.13.0")


def actions(rows, profile: str, phase: str) -> tuple[str, ...]:
    (row,) = [r for r in rows if (r.profile, r.phase) == (profile, phase)]
    return row.actions


def written(tmp_path, rows=None, fingerprint=FP):
    return ef.write_envelope(tmp_path / "envelope.json", rows_of() if rows is None else rows, fingerprint)


def rewrite(path, mutate) -> None:
    document = json.loads(path.read_text())
    mutate(document)
    path.write_text(json.dumps(document))


# ------------------------------------------------------------------------------ fingerprint and path


def test_fingerprint_names_torch_backend_device_accelpact_and_python():
    import sys

    import torch

    import accelpact

    fp = ef.platform_fingerprint("gloo", "cpu")
    assert fp == {"torch": torch.__version__, "backend": "gloo", "device": "cpu",
                  "accelpact": accelpact.__version__, "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    assert ef.platform_key("gloo", "cpu") == "cpu-gloo"


def test_cuda_fingerprint_adds_cuda_and_nccl_versions():
    fp = ef.platform_fingerprint("nccl", "cuda")
    assert {"cuda", "nccl"} <= set(fp) and fp["device"] == "cuda"


def test_default_path_follows_env_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCELPACT_ENVELOPE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ef.default_envelope_path() == tmp_path / "mine" / "envelope.json"
    monkeypatch.delenv("ACCELPACT_ENVELOPE_DIR")
    assert ef.default_envelope_path() == tmp_path / "xdg" / "accelpact" / "envelope.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ef.default_envelope_path() == tmp_path / "home" / ".cache" / "accelpact" / "envelope.json"


# ------------------------------------------------------------------------------ qualification rule


def test_passing_probes_qualify_their_action_before_restart():
    rows = rows_of()
    assert actions(rows, "fsdp2-hsdp", "committed") == ("preserve", "reject")
    for phase in ("forward", "backward", "optimizer"):
        assert actions(rows, "fsdp2-hsdp", phase) == ("rewind", "reject")
    optimizer = next(r for r in rows if (r.profile, r.phase) == ("fsdp2-hsdp", "optimizer"))
    assert optimizer.evidence["rewind"]["requires"] == ["step_copy"]
    backward = next(r for r in rows if (r.profile, r.phase) == ("fsdp2-hsdp", "backward"))
    assert backward.evidence["rewind"] == {
        "qualified": True, "runs": 3, "passed": 3, "bitwise": True,
        "repair_s": {"n": 3, "median": 0.03, "max": 0.05}, "detect_s": {"n": 3, "median": 1.0, "max": 1.1},
        "wall_s": 12.5, "torch": "2.13.0", "requires": [], "failures": [], "notes": []}
    assert backward.evidence["rebuild"]["passed"] == 3


def test_one_failed_run_or_one_differing_bit_leaves_only_restart():
    results = good_results()
    results[2] = probe("forward", "rewind", passed=2, failures=("recovery at update [4] took ['reject']",))
    results[3] = probe("backward", "rewind", bitwise=False)
    results[1] = probe("committed", "preserve", bitwise=None)  # never compared: not evidence of equality
    rows = rows_of(results)
    assert actions(rows, "fsdp2-hsdp", "forward") == ("reject",)
    assert actions(rows, "fsdp2-hsdp", "backward") == ("reject",)
    assert actions(rows, "fsdp2-hsdp", "committed") == ("reject",)
    forward = next(r for r in rows if (r.profile, r.phase) == ("fsdp2-hsdp", "forward"))
    assert forward.evidence["rewind"]["qualified"] is False  # the finding stays in the file
    assert "2/3" in ef.compact_evidence(forward.evidence)


def test_a_probe_that_never_ran_qualifies_nothing():
    results = good_results()
    results[2] = ProbeResult("rewind", 0, 0, None, profile="fsdp2-hsdp", phase="forward", failures=("skipped",))
    assert actions(rows_of(results), "fsdp2-hsdp", "forward") == ("reject",)


def test_without_a_passing_platform_probe_only_restart_is_qualified():
    failed = dataclasses.replace(REBUILD_OK, passed=2, failures=("run 3: no member saw the collective fail",))
    for results in ([failed, *good_results()[1:]], good_results()[1:]):
        rows = rows_of(results)
        assert all(row.actions == ("reject",) for row in rows)
        committed = next(r for r in rows if (r.profile, r.phase) == ("fsdp2-hsdp", "committed"))
        assert committed.evidence["rebuild"]["qualified"] is False
        assert "withheld" in committed.evidence


def test_every_profile_and_phase_gets_a_row_and_unprobed_keys_say_so():
    rows = rows_of([REBUILD_OK, probe("committed", "preserve")])
    assert {(r.profile, r.phase) for r in rows} == {(p, f.value) for p in PROFILES for f in FailurePhase}
    assert all(r.actions[-1] == "reject" for r in rows)
    ddp = next(r for r in rows if (r.profile, r.phase) == ("ddp", "committed"))
    assert ddp.actions == ("reject",) and "accelpact qualify" in ddp.evidence["not_probed"]
    assert actions(rows, "fsdp2-hsdp", "forward") == ("reject",)


def test_results_that_cannot_be_placed_are_refused():
    with pytest.raises(ValueError, match="unknown profiles"):
        rows_of([REBUILD_OK, probe("committed", "preserve", profile="megatron")])
    with pytest.raises(ValueError, match="two probe results"):
        rows_of([REBUILD_OK, probe("committed", "preserve"), probe("committed", "preserve", passed=0)])


def test_compact_evidence_is_one_line():
    row = next(r for r in rows_of() if (r.profile, r.phase) == ("fsdp2-hsdp", "optimizer"))
    text = ef.compact_evidence(row.evidence)
    assert "\n" not in text
    assert text.startswith("rewind 3/3 bitwise repair~30ms requires step_copy; rebuild 3/3")


# ------------------------------------------------------------------------------ file round trip


def test_written_file_loads_as_the_same_envelope(tmp_path):
    path = written(tmp_path)
    envelope = ef.load_envelope(path, expect=FP)
    assert isinstance(envelope, Envelope) and len(envelope) == len(PROFILES) * len(FailurePhase)
    key = ObservationKey("cpu-gloo", "fsdp2-hsdp", FailurePhase.BACKWARD)
    assert envelope.qualified(key) == (RecoveryAction.REWIND, RecoveryAction.REJECT)
    assert envelope.lookup(key).evidence.startswith("rewind 3/3 bitwise")
    assert not envelope.permits(ObservationKey("cpu-gloo", "ddp", FailurePhase.BACKWARD), RecoveryAction.REWIND)
    parsed = ef.read_envelope(path)
    assert parsed.rows == tuple(rows_of())
    assert [r.evidence for r in parsed.rows] == [r.evidence for r in rows_of()]  # the dicts are kept
    document = json.loads(path.read_text())
    assert document["format"] == "accelpact-envelope/1" and document["platform"] == FP
    assert set(document["rows"][0]) == {"platform", "profile", "phase", "objective", "actions", "evidence"}


def test_an_action_qualified_only_with_a_pre_step_copy_is_withheld_from_a_run_without_one(tmp_path):
    """The optimizer row's Rewind passed its probe only with Config.step_copy: a run without a copy
    is not what was measured, so it gets no Rewind there, and attach says why."""
    from accelpact.fsm.decisions import envelope_facts, envelope_warning

    envelope = ef.load_envelope(written(tmp_path), expect=FP)
    row = envelope.lookup(ObservationKey("cpu-gloo", "fsdp2-hsdp", FailurePhase.OPTIMIZER))
    assert row.needs(RecoveryAction.REWIND) == ("step_copy",) and row.needs(RecoveryAction.REJECT) == ()
    without = envelope_facts(envelope, "cpu-gloo", "fsdp2-hsdp")
    assert without.rewind_phases == (FailurePhase.FORWARD, FailurePhase.BACKWARD)
    assert without.withheld == ((FailurePhase.OPTIMIZER, RecoveryAction.REWIND, ("step_copy",)),)
    assert dict(without.allowed)[FailurePhase.OPTIMIZER] == (RecoveryAction.REJECT,)
    warning = envelope_warning(without, "fsdp2-hsdp", "envelope.json")
    assert "rewind in phase optimizer" in warning and "Config.step_copy=True" in warning
    with_copy = envelope_facts(envelope, "cpu-gloo", "fsdp2-hsdp", met=("step_copy",))
    assert FailurePhase.OPTIMIZER in with_copy.rewind_phases and not with_copy.withheld
    assert envelope_warning(with_copy, "fsdp2-hsdp", "envelope.json") is None


def test_an_unknown_condition_withholds_its_action_and_a_malformed_one_is_refused(tmp_path):
    from accelpact.fsm.decisions import envelope_facts, envelope_warning

    path = written(tmp_path)

    def needs(requires):
        def mutate(document):
            for row in document["rows"]:
                if (row["profile"], row["phase"]) == ("fsdp2-hsdp", "backward"):
                    row["evidence"]["rewind"]["requires"] = requires
        return mutate

    rewrite(path, needs(["a_newer_condition"]))  # written by a newer accelpact: never assumed met
    facts = envelope_facts(ef.load_envelope(path, expect=FP), "cpu-gloo", "fsdp2-hsdp", met=("step_copy",))
    assert FailurePhase.BACKWARD not in facts.rewind_phases
    assert "a condition this accelpact does not know" in envelope_warning(facts, "fsdp2-hsdp", "f")
    rewrite(path, needs("step_copy"))
    with pytest.raises(CorruptEnvelopeError, match="'requires' must be a list of strings"):
        ef.load_envelope(path, expect=FP)


def test_write_is_atomic_and_refuses_rows_it_could_not_read_back(tmp_path):
    path = written(tmp_path)
    before = path.read_text()
    bad = [dataclasses.replace(rows_of()[0], actions=("rewind",))]
    with pytest.raises(CorruptEnvelopeError, match="'reject' is missing"):
        ef.write_envelope(path, bad, FP)
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["envelope.json"]  # no temporary file left behind
    ef.write_envelope(path, rows_of(), FP, qualify={"wall_s": 3.0})
    assert ef.read_envelope(path).extra == {"qualify": {"wall_s": 3.0}}


def test_missing_file_says_to_run_qualify(tmp_path):
    path = tmp_path / "nowhere" / "envelope.json"
    with pytest.raises(MissingEnvelopeError) as info:
        ef.load_envelope(path, expect=FP)
    assert str(info.value) == f"no qualified envelope at {path}; run `accelpact qualify --out {path}` on this platform"


def test_stale_file_names_every_field_that_differs(tmp_path):
    path = written(tmp_path, fingerprint={**FP, "torch": "2.12.0"})
    with pytest.raises(StaleEnvelopeError) as info:
        ef.load_envelope(path, expect=FP)
    assert str(info.value) == (f"envelope {path} was qualified for torch 2.12.0, this is 2.13.0; "
                               f"run `accelpact qualify --out {path}`")
    here = {**FP, "accelpact": "0.2.0", "cuda": "12.4"}
    with pytest.raises(StaleEnvelopeError) as info:
        ef.load_envelope(path, expect=here)
    assert info.value.differences == {"accelpact": ("0.1.0", "0.2.0"), "cuda": (None, "12.4"),
                                      "torch": ("2.12.0", "2.13.0")}
    for text in ("accelpact 0.1.0, this is 0.2.0", "cuda (none), this is 12.4", "torch 2.12.0, this is 2.13.0"):
        assert text in str(info.value)
    assert len(ef.load_envelope(path, expect=None)) > 0  # inspection only


CORRUPTIONS = {
    "not JSON": lambda p: p.write_text("{\"format\": "),
    "format tag": lambda p: rewrite(p, lambda d: d.update(format="accelpact-envelope/2")),
    "unknown failure phase 'comitted'": lambda p: rewrite(p, lambda d: d["rows"][3].update(phase="comitted")),
    "unknown action 'rewnd'": lambda p: rewrite(p, lambda d: d["rows"][0].update(actions=["rewnd", "reject"])),
    "'reject' is missing": lambda p: rewrite(p, lambda d: d["rows"][5].update(actions=["rewind"])),
    "'reject' must come last": lambda p: rewrite(p, lambda d: d["rows"][5].update(actions=["reject", "rewind"])),
    "listed twice": lambda p: rewrite(p, lambda d: d["rows"][5].update(actions=["rewind", "rewind", "reject"])),
    "both cover": lambda p: rewrite(p, lambda d: d["rows"].append(dict(d["rows"][2]))),
    "for platform 'cuda-nccl'": lambda p: rewrite(p, lambda d: d["rows"][1].update(platform="cuda-nccl")),
    "unknown profile": lambda p: rewrite(p, lambda d: d["rows"][1].update(profile="megatron")),
    "unknown objective": lambda p: rewrite(p, lambda d: d["rows"][1].update(objective="close-enough")),
    "lacks evidence": lambda p: rewrite(p, lambda d: d["rows"][1].pop("evidence")),
    "'rows' must be a list": lambda p: rewrite(p, lambda d: d.update(rows={})),
    "fingerprint has no 'torch'": lambda p: rewrite(p, lambda d: d["platform"].pop("torch")),
    # found by review: a row's actions were trusted over its own evidence (and dropping the
    # evidence dropped the conditions it records with it)
    "but its evidence for": lambda p: rewrite(p, lambda d: _granting(d)["evidence"][_granting(d)["actions"][0]]
                                              .update(qualified=False)),
    "but has no evidence for": lambda p: rewrite(p, lambda d: _granting(d)["evidence"].pop(_granting(d)["actions"][0])),
    "runs passed": lambda p: rewrite(p, lambda d: _granting(d)["evidence"][_granting(d)["actions"][0]].update(passed=2)),
    "platform probe ('rebuild') did not pass": lambda p: rewrite(p, lambda d: _granting(d)["evidence"].pop("rebuild")),
}


def _granting(document: dict) -> dict:
    """The first row of an envelope document that grants something besides reject."""
    return next(row for row in document["rows"] if row["actions"] != ["reject"])


@pytest.mark.parametrize("why", sorted(CORRUPTIONS))
def test_a_corrupt_file_is_refused_whole_never_partly_used(tmp_path, why):
    path = written(tmp_path)
    CORRUPTIONS[why](path)
    with pytest.raises(CorruptEnvelopeError) as info:
        ef.load_envelope(path, expect=FP)
    message = str(info.value)
    assert why in message
    assert message.startswith(f"envelope {path} is corrupt: ")
    assert message.endswith(f"re-run `accelpact qualify --out {path}`")


def test_file_errors_are_config_errors():
    from accelpact.errors import ConfigError

    for cls in (MissingEnvelopeError, StaleEnvelopeError, CorruptEnvelopeError):
        assert issubclass(cls, ef.EnvelopeFileError) and issubclass(cls, ConfigError)


# ------------------------------------------------------------------------------ judging probe worlds


def rank_result(rank: int, history, *, mismatches=(), rejected=None) -> dict:
    return {"rank": rank, "history": history, "mismatches": list(mismatches), "rejected": rejected}


def rec(update: int, phase: str, action: str, repair_s: float = 0.05, detect_s: float = 1.0) -> dict:
    return {"update": update, "failure_phase": phase, "action": action, "repair_s": repair_s, "detect_s": detect_s}


def test_drill_passes_when_every_rank_took_the_expected_action_and_ended_bitwise_equal():
    results = [rank_result(r, [rec(2, "backward", "rewind", 0.05 + r / 100), rec(4, "backward", "rewind")])
               for r in range(4)]
    verdict = probes.judge_drill(results, phase=FailurePhase.BACKWARD, fault_updates=(2, 4))
    assert (verdict.action, verdict.runs, verdict.passed, verdict.bitwise) == ("rewind", 2, 2, True)
    assert verdict.repair_s == (0.08, 0.05)  # the slowest rank bounds each recovery
    assert verdict.qualified and verdict.failures == ()


def test_drill_fails_on_another_action_a_rejection_a_differing_bit_or_a_lost_fault():
    wrong = [rank_result(r, [rec(2, "forward", "reject" if r == 3 else "rewind")]) for r in range(4)]
    verdict = probes.judge_drill(wrong, phase=FailurePhase.FORWARD, fault_updates=(2,))
    assert (verdict.passed, verdict.qualified) == (0, False)
    assert "took ['reject', 'rewind'], expected rewind" in verdict.failures[0]

    rejected = [rank_result(r, [rec(2, "forward", "reject")], rejected=["outside a committed boundary"])
                for r in range(4)]
    rejected = [{k: v for k, v in r.items() if k != "mismatches"} for r in rejected]
    verdict = probes.judge_drill(rejected, phase=FailurePhase.FORWARD, fault_updates=(2,))
    assert verdict.bitwise is None and not verdict.qualified
    assert verdict.failures[0] == "ranks [0, 1, 2, 3] rejected: outside a committed boundary"

    differs = [rank_result(r, [rec(2, "committed", "preserve")], mismatches=["param/w"] if r == 1 else [])
               for r in range(4)]
    verdict = probes.judge_drill(differs, phase=FailurePhase.COMMITTED, fault_updates=(2,))
    assert verdict.bitwise is False and verdict.passed == 1 and not verdict.qualified
    assert verdict.failures == ("rank 1 differs from the reference in param/w",)

    lost = [rank_result(r, [rec(2, "committed", "preserve")]) for r in range(4)]
    verdict = probes.judge_drill(lost, phase=FailurePhase.COMMITTED, fault_updates=(2, 4))
    assert (verdict.runs, verdict.passed, verdict.qualified) == (2, 1, False)
    assert verdict.failures == ("only 1 of 2 injected faults led to a recovery",)

    uneven = [rank_result(r, [rec(2, "committed", "preserve")] * (2 if r else 1)) for r in range(4)]
    verdict = probes.judge_drill(uneven, phase=FailurePhase.COMMITTED, fault_updates=(2,))
    assert not verdict.qualified and "different numbers of recoveries" in verdict.failures[0]


def test_drill_notes_a_spurious_boundary_recovery_without_judging_its_action():
    # the peers of a rank that fails in forward may already be in backward; a boundary timeout
    # after the re-run (even at the faulted update) is a separate event
    results = [rank_result(r, [rec(2, "forward", "rewind"), rec(3, "committed", "preserve"),
                               rec(4, "backward" if r < 2 else "forward", "rewind"),
                               rec(4, "committed", "preserve")]) for r in range(4)]
    verdict = probes.judge_drill(results, phase=FailurePhase.FORWARD, fault_updates=(2, 4))
    assert verdict.qualified and (verdict.runs, verdict.passed) == (2, 2)
    assert verdict.notes == ("extra recovery at update [3] (committed): preserve",
                             "extra recovery at update [4] (committed): preserve",
                             "ranks reported phases backward+forward (1x), forward (1x)")


def test_rebuild_passes_only_after_a_real_timeout_and_a_proven_replacement():
    def world(*, cause="TIMEOUT", waited=1.01, validated=True):
        runs = [{"members": [0, 2]}, {"members": [1, 3]}]
        out = []
        for rank in range(4):
            mine = []
            for run in runs:
                run = dict(run)
                if rank in run["members"]:
                    run.update(repair_s=0.004 + rank / 1000, validated=validated, data_ok=True)
                    if rank == run["members"][0]:
                        run.update(cause=cause, detect_s=waited)
                mine.append(run)
            out.append({"rank": rank, "runs": mine})
        return out

    verdict = probes.judge_rebuild(world(), 2, 1.0)
    assert verdict.qualified and (verdict.runs, verdict.passed) == (2, 2)
    assert verdict.repair_s == (0.006, 0.007) and verdict.detect_s == (1.01, 1.01)
    assert "not a timeout" in probes.judge_rebuild(world(cause="RETIRED_COMMUNICATOR"), 2, 1.0).failures[0]
    assert "before the 1.0 s timeout" in probes.judge_rebuild(world(waited=0.01), 2, 1.0).failures[0]
    assert "did not validate" in probes.judge_rebuild(world(validated=False), 2, 1.0).failures[0]
    assert not probes.judge_rebuild(world(validated=False), 2, 1.0).qualified


def test_a_rewind_rejected_for_a_split_step_is_probed_again_with_a_pre_step_copy(monkeypatch, tmp_path):
    calls = []

    def fake_world(framework, phase, *, step_copy, trace_dir, **kw):
        calls.append((phase.value, step_copy, trace_dir.name))
        if phase is FailurePhase.FORWARD and not step_copy:
            return probe("forward", "rewind", passed=0, bitwise=None, failures=("ranks [0] rejected: split",)), True
        return probe(phase.value, EXPECTED_ACTION[phase].value), False

    monkeypatch.setattr(probes, "_drill_world", fake_world)
    kw = {"repeats": 3, "world": 4, "data_timeout_s": 1.0, "control_timeout_s": 6.0}
    forward = probes._probe_drill("ddp", FailurePhase.FORWARD, trace_dir=tmp_path / "ddp-forward", **kw)
    assert calls == [("forward", False, "ddp-forward"), ("forward", True, "ddp-forward-copy")]
    assert forward.qualified and forward.requires == ("step_copy",) and forward.profile == "ddp"
    assert forward.notes[-1] == "without a pre-step copy: 0/3 (ranks [0] rejected: split)"
    calls.clear()
    optimizer = probes._probe_drill("ddp", FailurePhase.OPTIMIZER, trace_dir=tmp_path / "o", **kw)
    committed = probes._probe_drill("ddp", FailurePhase.COMMITTED, trace_dir=tmp_path / "c", **kw)
    assert calls == [("optimizer", True, "o"), ("committed", False, "c")]
    assert optimizer.requires == ("step_copy",) and committed.requires == ()


def test_fault_plan_spaces_faults_so_each_is_recovered_before_the_next():
    plan, updates, at = probes.fault_plan(FailurePhase.BACKWARD, 3, 4)
    assert plan == "skip@2:backward:2,skip@4:backward:1,skip@6:backward:0"
    assert (updates, at) == (7, (2, 4, 6))
    from accelpact.faults.plan import FaultPlan

    FaultPlan.parse(plan).validate(4)


def test_probe_line_shows_where_action_counts_verdict_and_median_repair():
    line = probes.format_probe(probe("optimizer", "rewind", requires=("step_copy",)))
    assert line.startswith("fsdp2-hsdp  optimizer  rewind   3/3  bitwise     repair median    30.0 ms")
    assert line.endswith("qualified [requires step_copy]")
    line = probes.format_probe(probe("forward", "rewind", passed=0, bitwise=None, failures=("world died",)))
    assert "0/3" in line and line.endswith("NOT qualified: world died")


def test_bad_arguments_are_refused_before_any_world_starts(tmp_path):
    for kwargs, match in (({"frameworks": ("jax",)}, "unknown frameworks"),
                          ({"phases": ("idle",)}, "unknown failure phases"),
                          ({"repeats": 0}, "repeats"), ({"world": 3}, "even number"),
                          ({"data_timeout_s": 9.0}, "control_timeout_s")):
        with pytest.raises(ValueError, match=match):
            probes.qualify(tmp_path / "e.json", progress=lambda _: None, **kwargs)
    assert not (tmp_path / "e.json").exists()


# ------------------------------------------------------------------------------ CLI


def test_cli_quick_probes_fsdp2_once_and_exits_zero_when_the_file_is_written(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_qualify(out, **kw):
        seen.update(kw, out=out)
        results = [REBUILD_OK, probe("committed", "preserve"), probe("backward", "rewind", passed=0)]
        rows = ef.envelope_from_results(results, "cpu-gloo")
        path = ef.write_envelope(out, rows, FP)
        return probes.QualifyResult(path, FP, tuple(results), tuple(rows), 1.0)

    monkeypatch.setattr(probes, "qualify", fake_qualify)
    out = tmp_path / "e.json"
    assert cli.main(["qualify", "--quick", "--out", str(out)]) == 0
    assert (seen["frameworks"], seen["repeats"], seen["out"]) == (("fsdp2",), 1, str(out))
    text = capsys.readouterr().out
    assert "finding: fsdp2-hsdp backward rewind" in text  # not qualified: a finding, still exit 0
    assert text.rstrip().splitlines()[-1].startswith(f"wrote {out}")


def test_cli_exits_nonzero_when_the_probes_cannot_run(monkeypatch, capsys, tmp_path):
    def broken(out, **kw):
        raise probes.QualifyError("cannot run a 4-rank gloo world on this machine: rank 0 died")

    monkeypatch.setattr(probes, "qualify", broken)
    assert cli.main(["qualify", "--out", str(tmp_path / "e.json"), "--frameworks", "ddp"]) == 1
    assert "could not run" in capsys.readouterr().err
    monkeypatch.undo()  # the real probes refuse bad arguments before any world starts
    assert cli.main(["qualify", "--out", str(tmp_path / "e.json"), "--frameworks", "jax"]) == 2


# ------------------------------------------------------------------------------ the real probes


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_qualify_measures_preserve_at_the_boundary_and_rewind_in_backward(tmp_path):
    from accelpact.testing.drills import Drill

    if not {"rewind", "envelope", "step_copy"} <= {f.name for f in dataclasses.fields(Drill)}:
        pytest.fail("the drill harness has no Rewind fields: the runtime does not support Rewind yet")
    lines: list[str] = []
    result = probes.qualify(tmp_path / "envelope.json", frameworks=("fsdp2",), phases=("committed", "backward"),
                            repeats=1, progress=lines.append, replace=False)
    assert result.platform_ok, lines
    envelope = ef.load_envelope(result.path, expect=ef.platform_fingerprint("gloo", "cpu"))
    committed = envelope.lookup(ObservationKey("cpu-gloo", "fsdp2-hsdp", FailurePhase.COMMITTED))
    backward = envelope.lookup(ObservationKey("cpu-gloo", "fsdp2-hsdp", FailurePhase.BACKWARD))
    assert committed.actions == (RecoveryAction.PRESERVE, RecoveryAction.REJECT), lines
    assert backward.actions == (RecoveryAction.REWIND, RecoveryAction.REJECT), lines
    rows = {(r.profile, r.phase): r for r in ef.read_envelope(result.path).rows}
    for (phase, action) in (("committed", "preserve"), ("backward", "rewind")):
        evidence = rows[("fsdp2-hsdp", phase)].evidence[action]
        assert (evidence["runs"], evidence["passed"], evidence["bitwise"]) == (1, 1, True)
        assert evidence["repair_s"]["median"] > 0
    assert rows[("fsdp2-hsdp", "forward")].actions == ("reject",)  # not probed: nothing assumed
    assert len(lines) == 4  # world up, platform probe, one line per drill probe


def test_replace_qualifies_only_a_bitwise_replacement_of_the_killed_rank():
    ok = {"bitwise_ok": True, "verdicts": [{"history": [
        {"action": "replace", "repair_s": 1.5, "replacement": {"lost": [2]}}], "mismatches": []}, {"mismatches": []}]}
    got = probes.judge_replace(ok, 2)
    assert (got.action, got.runs, got.passed, got.bitwise, got.repair_s) == ("replace", 1, 1, True, (1.5,))
    assert not probes.judge_replace({**ok, "bitwise_ok": False}, 2).qualified
    # found by review: the trainer's bitwise_ok stays true when no comparison ran (--no-reference)
    uncompared = {**ok, "verdicts": [{k: v for k, v in ok["verdicts"][0].items() if k != "mismatches"}, {}]}
    verdict = probes.judge_replace(uncompared, 2)
    assert not verdict.qualified and "was not compared" in verdict.failures[0]
    differing = {**ok, "verdicts": [ok["verdicts"][0], {"mismatches": ["param layers.0.weight"]}]}
    assert not probes.judge_replace(differing, 2).qualified
    assert "no Replace of rank 3" in probes.judge_replace(ok, 3).failures[0]
    assert "wrote no result" in probes.judge_replace(None, 2).failures[0]
    placed = dataclasses.replace(got, profile="fsdp2-hsdp", phase="forward")
    rows = rows_of([REBUILD_OK, probe("forward", "rewind"), placed])
    assert actions(rows, "fsdp2-hsdp", "forward") == ("rewind", "replace", "reject")
    forward = next(r for r in rows if (r.profile, r.phase) == ("fsdp2-hsdp", "forward"))
    assert forward.evidence["replace"]["bitwise"] and forward.evidence["replace"]["passed"] == 1
