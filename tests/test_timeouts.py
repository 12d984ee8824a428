"""Timeouts derived from measurement: the pure derivation, the "auto" setting, the envelope file's
timeouts section, and attach measuring them the same on every rank (one 2-rank world)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelpact.config import AUTO, Config, unknown_variables
from accelpact.envelope import CorruptEnvelopeError, QualifiedRow, read_envelope, write_envelope
from accelpact.errors import ConfigError
from accelpact.stats import quantile
from accelpact.testing.spawn import run_world
from accelpact.timeouts import DEFAULT_POLICY, DerivedTimeouts, TimeoutPolicy, derive_timeouts

ROOT = Path(__file__).resolve().parents[1]
FAST = [0.001] * 99 + [0.5]  # one outlier above the p99: nearest rank ignores it
CTRL = [0.002] * 100


# ------------------------------------------------------------------------------ derivation (pure)


def test_fast_collectives_get_the_floor_and_control_gets_its_margin():
    t = derive_timeouts({"replicate": FAST, "shard": FAST}, CTRL)
    assert (t.data_timeout_s, t.data_source) == (DEFAULT_POLICY.data_floor_s, "derived")
    # control = 3 x data + 20 x control p99, rounded up to 0.1 s
    assert t.control_timeout_s == pytest.approx(math.ceil((3 * 2.0 + 20 * 0.002) * 10) / 10)
    assert [m.name for m in t.measured] == ["replicate", "shard", "control"]
    assert t.measured[0].samples == 100 and t.measured[0].quantile_s == 0.001 and t.measured[0].max_s == 0.5


def test_slow_collectives_get_factor_times_the_high_quantile_of_the_slowest_group():
    slow = [0.2] * 100
    t = derive_timeouts({"replicate": FAST, "shard": slow}, CTRL)
    assert t.data_timeout_s == pytest.approx(20 * 0.2)
    assert "shard" in t.describe() and "p99" in t.describe() and "20 x" in t.describe()
    policy = TimeoutPolicy(quantile=0.5, factor=5, data_floor_s=0.1, control_ratio=2)
    t = derive_timeouts({"shard": [0.1, 0.2, 0.3, 10.0]}, [0.01], policy=policy)
    assert t.data_timeout_s == pytest.approx(1.0)  # 5 x nearest-rank median 0.2
    assert t.control_timeout_s == pytest.approx(2.1)  # 2 x 1.0 + 5 x 0.01, rounded up


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 3), min_size=1, max_size=60), st.lists(st.floats(0, 3), min_size=1, max_size=30),
       st.randoms())
def test_control_always_exceeds_data_and_rank_order_does_not_matter(data, ctrl, rnd):
    t = derive_timeouts({"g": data}, ctrl)
    assert t.control_timeout_s > t.data_timeout_s >= DEFAULT_POLICY.data_floor_s
    assert t.data_timeout_s >= 20 * quantile(data, 0.99) - 1e-9
    shuffled = list(data)
    rnd.shuffle(shuffled)  # ranks' samples arrive in rank order; every rank must derive the same
    assert derive_timeouts({"g": shuffled}, list(reversed(ctrl))) == t


def test_explicit_values_are_kept_and_a_contradiction_names_both():
    t = derive_timeouts({"g": FAST}, CTRL, given_data=0.5)
    assert (t.data_timeout_s, t.data_source, t.control_source) == (0.5, "given", "derived")
    assert t.control_timeout_s == pytest.approx(1.6)
    t = derive_timeouts({"g": FAST}, CTRL, given_control=9.0)
    assert (t.data_timeout_s, t.control_timeout_s, t.control_source) == (2.0, 9.0, "given")
    with pytest.raises(ConfigError, match=r"control_timeout_s \(1.5, given\) must exceed data_timeout_s "
                                          r"\(2.0, derived\)"):
        derive_timeouts({"g": FAST}, CTRL, given_control=1.5)


def test_the_qualified_values_are_a_lower_bound():
    t = derive_timeouts({"g": FAST}, CTRL, qualified=(3.0, 12.0))
    assert (t.data_timeout_s, t.data_source, t.control_timeout_s, t.control_source) == (3.0, "qualified", 12.0,
                                                                                        "qualified")
    t = derive_timeouts({"g": [1.0] * 10}, CTRL, qualified=(3.0, 12.0))
    assert (t.data_timeout_s, t.data_source) == (20.0, "derived")  # the measurement exceeds it


@pytest.mark.parametrize("samples, what", [([], "non-empty"), ([0.1, float("nan")], "nan"), ([-1.0], "-1.0")])
def test_bad_samples_are_refused_by_name(samples, what):
    with pytest.raises(ValueError, match=f"'shard'.*{what}"):
        derive_timeouts({"shard": samples}, CTRL)
    with pytest.raises(ValueError, match="factor"):
        TimeoutPolicy(factor=0.5)


def test_evidence_round_trips_through_json():
    t = derive_timeouts({"replicate": FAST}, CTRL, qualified=(1.0, 4.0), bytes_per_collective=4096)
    assert DerivedTimeouts.from_json(json.loads(json.dumps(t.to_json()))) == t
    broken = {**t.to_json(), "control_timeout_s": 1.0}
    with pytest.raises(ValueError, match="data .* < control"):
        DerivedTimeouts.from_json(broken)


# ------------------------------------------------------------------------------ Config


def test_auto_is_the_default_and_explicit_numbers_stay_as_given():
    assert (Config().data_timeout_s, Config().control_timeout_s, Config().calibrates) == (AUTO, AUTO, True)
    config = Config(data_timeout_s=3.0, control_timeout_s=9.0).with_env(
        {"ACCELPACT_DATA_TIMEOUT_S": "auto", "ACCELPACT_CONTROL_TIMEOUT_S": "AUTO"})
    assert (config.data_timeout_s, config.control_timeout_s, config.calibrates) == (AUTO, AUTO, True)
    config = Config().with_env({"ACCELPACT_DATA_TIMEOUT_S": "4", "ACCELPACT_CONTROL_TIMEOUT_S": "12"})
    assert (config.data_timeout_s, config.control_timeout_s, config.calibrates) == (4.0, 12.0, False)
    assert Config(data_timeout_s=AUTO, control_timeout_s=1.0).calibrates  # checked against the measurement
    assert Config(data_timeout_s=40.0).calibrates  # the control timeout is derived above it (was: refused)
    assert not Config(data_timeout_s=10.0, control_timeout_s=30.0).calibrates
    with pytest.raises(ConfigError, match="data_timeout_s must be a number or 'auto', got 'fast'"):
        Config(data_timeout_s="fast")
    with pytest.raises(ConfigError, match=r"ACCELPACT_DATA_TIMEOUT_S='soon'"):
        Config().with_env({"ACCELPACT_DATA_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError, match=r"control_timeout_s \(5.0\) must exceed data_timeout_s \(5.0\)"):
        Config(data_timeout_s=5.0, control_timeout_s=5.0)


def test_straggler_settings_come_from_the_environment_and_are_checked():
    env = {"ACCELPACT_STRAGGLER_FACTOR": "3", "ACCELPACT_STRAGGLER_WINDOW": "7"}
    assert unknown_variables(env) == []
    config = Config().with_env(env)
    assert (config.straggler_factor, config.straggler_window) == (3.0, 7)
    with pytest.raises(ConfigError, match="straggler_factor must be a number > 1"):
        Config(straggler_factor=1.0)
    with pytest.raises(ConfigError, match="straggler_window must be an integer >= 1"):
        Config(straggler_window=0)


# ------------------------------------------------------------------------------ envelope file


def test_the_envelope_file_keeps_timeouts_with_their_evidence(tmp_path):
    t = derive_timeouts({"replicate": FAST}, CTRL)
    row = QualifiedRow("cpu-gloo", "ddp", "committed", ("reject",), {})
    path = write_envelope(tmp_path / "e.json", [row], {"torch": "x", "backend": "gloo", "device": "cpu"}, timeouts=t)
    parsed = read_envelope(path)
    assert parsed.timeouts == t and parsed.envelope().timeouts == t and "timeouts" not in parsed.extra
    document = json.loads(path.read_text())
    document["timeouts"]["data_timeout_s"] = 99.0  # above its control timeout
    path.write_text(json.dumps(document))
    with pytest.raises(CorruptEnvelopeError, match="timeouts: need"):
        read_envelope(path)


def test_a_file_written_before_timeouts_still_reads(tmp_path):
    old = tmp_path / "old.json"
    shutil.copy(ROOT / "bench" / "results" / "envelope-cpu-gloo.json", old)
    assert "timeouts" not in json.loads(old.read_text())
    parsed = read_envelope(old)
    assert parsed.timeouts is None and parsed.envelope().timeouts is None and len(parsed.rows) > 0


# ------------------------------------------------------------------------------ attach, 2 ranks


def _attach_auto(rank: int, world_size: int, trace_dir: str, qualified_file: str) -> dict:
    import time

    import torch.distributed as dist

    import accelpact
    from accelpact.comm import _c10d
    from accelpact.workloads import build_hsdp_job, next_token_loss

    model, opt, data = build_hsdp_job("ddp", layers=1, dim=16, seed=1, seq_len=8, batch_size=2, local=1)
    config = accelpact.Config(data_timeout_s=AUTO, control_timeout_s=AUTO, on_reject="raise", trace_dir=trace_dir,
                              envelope="builtin", straggler_window=4)
    rt = accelpact.attach(model, opt, data_state=data, config=config)

    def update():
        next_token_loss(model, data.next_batch()).backward()
        opt.step()
        opt.zero_grad()
        if rank == 1:
            time.sleep(0.15)  # after the update's last collective: rank 1 arrives late at every boundary

    for _ in range(7):
        rt.step(update)
    out = {"config": (rt.config.data_timeout_s, rt.config.control_timeout_s), "timeouts": rt.timeouts.to_json(),
           "group_s": [_c10d.group_timeout(pg).total_seconds() for pg in rt.groups.values()],
           "control_s": (_c10d.group_timeout(rt.control.group).total_seconds(), rt.control.timeout_s),
           "stragglers": rt.stragglers.report(), "history": len(rt.history)}
    rt.close()
    dist.barrier()
    try:  # an explicit control timeout below the measured data timeout: refused on every rank alike
        accelpact.attach(model, opt, data_state=data, config=accelpact.Config(
            data_timeout_s=AUTO, control_timeout_s=0.5, on_reject="raise", envelope="builtin"))
        out["refused"] = None
    except ConfigError as exc:
        out["refused"] = str(exc)
    dist.barrier()
    rt = accelpact.attach(model, opt, data_state=data, config=accelpact.Config(  # the file's values: a floor
        data_timeout_s=AUTO, control_timeout_s=AUTO, on_reject="raise", envelope=qualified_file))
    out["with_file"] = (rt.config.data_timeout_s, rt.config.control_timeout_s, rt.timeouts.data_source)
    rt.close()
    # an envelope only one rank refuses (its host's file is corrupt) fails every rank's attach at
    # the first collective (found by review: the peers waited a minute in the control plane's
    # construction and failed with a store timeout that named nothing)
    corrupt = os.path.join(os.path.dirname(trace_dir), "corrupt-envelope.json")
    if rank == 1:
        with open(corrupt, "w") as fh:
            fh.write("{not json")
    dist.barrier()
    try:
        accelpact.attach(model, opt, data_state=data, config=accelpact.Config(
            data_timeout_s=AUTO, control_timeout_s=AUTO, on_reject="raise",
            envelope=corrupt if rank == 1 else "builtin"))
        out["one_refused"] = None
    except ConfigError as exc:
        out["one_refused"] = str(exc)
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_attach_measures_the_same_timeouts_on_every_rank_and_uses_them(tmp_path):
    from accelpact.envelope import envelope_from_results, platform_fingerprint
    from accelpact.runtime import calibrate
    from model_checking.trace_validation import assert_valid_run

    qualified = derive_timeouts({"g": FAST}, CTRL, qualified=(3.5, 12.5))
    path = write_envelope(tmp_path / "envelope.json", envelope_from_results([], "cpu-gloo"),
                          platform_fingerprint("gloo", "cpu"), timeouts=qualified)
    results = run_world(_attach_auto, 2, str(tmp_path / "trace"), str(path), timeout_s=100, pg_timeout_s=30)
    assert results[0]["config"] == results[1]["config"] and results[0]["timeouts"] == results[1]["timeouts"]
    data_s, control_s = results[0]["config"]
    assert control_s > data_s >= DEFAULT_POLICY.data_floor_s
    evidence = DerivedTimeouts.from_json(results[0]["timeouts"])
    rounds = calibrate.WARMUP_ROUNDS  # 2 ranks x rounds
    assert {m.name: m.samples for m in evidence.measured} == {"replicate": 2 * rounds, "control": 2 * rounds}
    assert evidence.bytes_per_collective > 0
    for r in results:
        assert r["history"] == 0, "a healthy run under derived timeouts recovered"
        assert r["group_s"] == [data_s] and r["control_s"] == (control_s, control_s)
        assert r["stragglers"].stragglers == (1,), r["stragglers"]
        assert r["stragglers"].p50[1] > 2 * r["stragglers"].p50[0]
        assert r["refused"] and "control_timeout_s (0.5, given)" in r["refused"] and f"({data_s}, derived)" in \
            r["refused"]
        assert r["with_file"] == (3.5, 12.5, "qualified")  # the runtime starts from what qualify measured
    assert "envelope refused" in results[1]["one_refused"] and "Config.envelope" in results[1]["one_refused"]
    assert "another rank was given settings that differ" in results[0]["one_refused"]
    traced = [json.loads(line) for line in (tmp_path / "trace" / "trace-rank0.jsonl").read_text().splitlines()]
    config = next(rec for rec in traced if rec.get("kind") == "config")
    assert config["timeouts"] == results[0]["timeouts"] and config["data_timeout_s"] == data_s
    assert_valid_run(tmp_path / "trace")  # the widened boundary check is invisible to the protocol


# ------------------------------------------------------------------------------ accelpact qualify


def _rank_result(rank: int, derived: dict, recoveries=(), rejected=None) -> dict:
    out = {"rank": rank, "derived": {"ddp": derived, "fsdp2": derived}, "recoveries": {"ddp": list(recoveries)}}
    if rejected:
        out["rejected"] = {"ddp": rejected}
    return out


def test_qualify_keeps_the_slowest_frameworks_timeouts_only_when_every_rank_agreed_and_nothing_recovered():
    from accelpact.qualify.probes import judge_timeouts

    fast, slow = derive_timeouts({"g": FAST}, CTRL).to_json(), derive_timeouts({"g": [0.5]}, CTRL).to_json()
    results = [{"rank": r, "derived": {"ddp": fast, "fsdp2": slow}, "recoveries": {}} for r in range(2)]
    chosen, findings, evidence = judge_timeouts(results, ("ddp", "fsdp2"))
    assert findings == [] and chosen == DerivedTimeouts.from_json(slow) and evidence["ddp"]["data_timeout_s"] == 2.0
    chosen, findings, _ = judge_timeouts([_rank_result(0, fast, recoveries=[3]), _rank_result(1, fast)], ("ddp",))
    assert chosen is None and "recovered at updates [3]" in findings[0]
    chosen, findings, _ = judge_timeouts([_rank_result(0, fast), _rank_result(1, slow)], ("ddp",))
    assert chosen is None and "ranks derived different timeouts" in findings[0]


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_the_qualify_timeout_probe_derives_and_trains_under_them():
    from accelpact.qualify import probes

    chosen, findings, evidence = probes._probe_timeouts(("ddp",), 4, updates=3)
    assert findings == [], findings
    assert chosen is not None and chosen.data_source == "derived"
    assert {m.name: m.samples for m in chosen.measured}["control"] == 4 * probes.TIMEOUT_ROUNDS
    assert evidence["ddp"]["recoveries_at"] == [] and evidence["ddp"]["data_timeout_s"] == chosen.data_timeout_s


# ------------------------------------------------------------------------------ settle_timeouts (the effect)


class _FakePlane:
    groups = {"replicate": None, "shard": None}
    timeout_s = 10.0
    enforced: list[float] = []

    def enforce_timeout(self):
        self.enforced.append(self.timeout_s)


class _FakeControl:
    def __init__(self, world: int):
        self.world, self.timeouts = world, []

    def gather_floats(self, values):
        return [tuple(values)] * self.world  # every rank measured the same here

    def set_timeout(self, seconds):
        self.timeouts.append(seconds)


@pytest.mark.parametrize("rank", [0, 1])
def test_settling_applies_the_derived_timeouts_to_both_planes_and_rank_0_says_why(rank, monkeypatch, capsys, caplog):
    from accelpact.runtime import calibrate

    def fake_measure(plane, control, model, rounds):
        return {"replicate": [0.001] * rounds, "shard": [0.2] * rounds}, [0.002] * rounds, 4096

    monkeypatch.setattr(calibrate, "measure", fake_measure)
    monkeypatch.setattr(calibrate, "largest_collective_bytes", lambda model: 4096)  # as large as the warm-up
    plane, control = _FakePlane(), _FakeControl(world=2)
    plane.enforced = []
    config, derived = calibrate.settle_timeouts(Config(data_timeout_s=AUTO, control_timeout_s=AUTO), plane, control,
                                                None, rank=rank)
    assert (config.data_timeout_s, config.control_timeout_s) == (4.0, 12.1)  # 20 x 0.2; 3 x 4 + 20 x 0.002
    assert derived.measured[1].samples == 2 * calibrate.WARMUP_ROUNDS and derived.bytes_per_collective == 4096
    assert plane.timeout_s == 4.0 and plane.enforced == [4.0] and control.timeouts == [12.1]
    said = capsys.readouterr().err
    assert ("[accelpact] timeouts measured at attach: data timeout 4 s = max(floor 2 s, 20 x p99 200.00 ms on "
            "shard; " in said) == (rank == 0)
    assert ("control timeout 12.1 s = 3 x data + 20 x control-plane p99 2.00 ms; to choose them yourself set "
            "Config.data_timeout_s" in said) == (rank == 0)
    given = Config(data_timeout_s=10.0, control_timeout_s=30.0)
    unchanged, none = calibrate.settle_timeouts(given, plane, control, None, rank=rank)
    assert none is None and unchanged == given and plane.enforced == [4.0]  # nothing measured, nothing set


def test_the_qualify_command_says_which_timeouts_it_wrote(tmp_path, monkeypatch, capsys):
    from accelpact import cli
    from accelpact.qualify import probes

    derived = derive_timeouts({"shard": [0.2] * 10}, CTRL)

    def fake_qualify(out, **kw):
        path = write_envelope(out, [], {"torch": "x", "backend": "gloo", "device": "cpu"}, timeouts=derived)
        return probes.QualifyResult(path, {}, (), (), 1.0, derived)

    monkeypatch.setattr(probes, "qualify", fake_qualify)
    assert cli.main(["qualify", "--quick", "--out", str(tmp_path / "e.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == f"timeouts: {derived.describe()}" and lines[-1].startswith("wrote")
    assert read_envelope(tmp_path / "e.json").timeouts == derived


def test_settling_refuses_samples_of_different_groups_on_every_rank(monkeypatch):
    from accelpact.runtime import calibrate

    class Mixed(_FakeControl):
        def gather_floats(self, values):
            return [tuple(values), (values[0] + 1, *values[1:])]  # rank 1 measured other groups

    monkeypatch.setattr(calibrate, "measure", lambda *a: ({"shard": [0.1] * 20}, [0.1] * 20, 4))
    monkeypatch.setattr(calibrate, "largest_collective_bytes", lambda model: 4)
    with pytest.raises(ConfigError, match=r"ranks measured different data-plane groups \(this rank: \['shard'\]\)"):
        calibrate.settle_timeouts(Config(data_timeout_s=AUTO), _FakePlane(), Mixed(2), None, rank=0)


def test_big_collectives_take_fewer_warm_up_rounds_never_under_the_minimum():
    from accelpact.runtime import calibrate

    assert calibrate.warmup_rounds(61184, calibrate.WARMUP_ROUNDS) == calibrate.WARMUP_ROUNDS  # a tiny model
    assert calibrate.warmup_rounds(16 * 2**20, 8) == 4  # 64 MiB per group
    assert calibrate.warmup_rounds(25 * 2**20, 8) == calibrate.MIN_ROUNDS  # DDP's bucket cap
    assert calibrate.warmup_rounds(61184, 50) == 50  # qualify's rounds
    assert calibrate.warmup_rounds(25 * 2**20, 2) == 2  # never more than asked


def test_the_floor_is_the_largest_of_the_ranks_envelope_files(monkeypatch):
    """Each host reads its own envelope file: ranks that derived from different floors would time
    out at different moments, so the floor travels with the samples and the largest applies."""
    from accelpact.runtime import calibrate

    class PeerFloor(_FakeControl):
        def __init__(self, floor):
            super().__init__(2)
            self.floor = floor

        def gather_floats(self, values):
            return [tuple(values), (*values[:3], *self.floor, *values[5:])]  # the peer read its own file

    monkeypatch.setattr(calibrate, "measure", lambda *a: ({"shard": [0.001] * 8}, [0.001] * 8, 4))
    monkeypatch.setattr(calibrate, "largest_collective_bytes", lambda model: 4)
    qualified = derive_timeouts({"g": FAST}, CTRL, qualified=(3.5, 12.5))
    for mine, peers in ((qualified, (0.0, 0.0)), (None, (3.5, 12.5))):  # the file here, or only at the peer
        plane = _FakePlane()
        plane.enforced = []
        config, derived = calibrate.settle_timeouts(Config(), plane, PeerFloor(peers), None, rank=1, qualified=mine)
        assert (config.data_timeout_s, config.control_timeout_s, derived.data_source) == (3.5, 12.5, "qualified")
    config, derived = calibrate.settle_timeouts(Config(), _FakePlane(), PeerFloor((0.0, 0.0)), None, rank=1)
    assert (config.data_timeout_s, derived.data_source) == (2.0, "derived")  # no file anywhere


def test_a_joining_spare_runs_with_the_survivors_timeouts_and_refuses_its_own_that_differ():
    """Found by review: a spare's explicit value was kept; given 30 s among survivors at 2 s it
    waited in a collective they had left, and came to the boundary check past their control timeout."""
    import torch.distributed as dist

    from accelpact.runtime import calibrate

    store = dist.HashStore()
    calibrate.publish_timeouts(store, Config(data_timeout_s=2.5, control_timeout_s=7.6))
    plane, control = _FakePlane(), _FakeControl(2)
    plane.enforced = []
    adopted = calibrate.adopt_timeouts(store, Config(), plane, control)
    assert (adopted.data_timeout_s, adopted.control_timeout_s) == (2.5, 7.6)
    assert plane.enforced == [2.5] and control.timeouts == [7.6]
    same = calibrate.adopt_timeouts(store, Config(data_timeout_s=2.5, control_timeout_s=7.6), plane, control)
    assert (same.data_timeout_s, same.control_timeout_s) == (2.5, 7.6)
    with pytest.raises(ConfigError, match="given control_timeout_s=20.0, the job it joins runs with 7.6"):
        calibrate.adopt_timeouts(store, Config(control_timeout_s=20.0), plane, control)
    with pytest.raises(ConfigError, match="given data_timeout_s=1.0, the job it joins runs with 2.5"):
        calibrate.adopt_timeouts(store, Config(data_timeout_s=1.0, control_timeout_s=4.0), plane, control)


def test_a_given_pair_with_the_control_timeout_under_twice_the_data_timeout_is_named():
    from accelpact.timeouts import timeouts_too_close

    assert timeouts_too_close(2.0, 6.1) is None and timeouts_too_close(10.0, 20.0) is None
    assert "give at least 20 s" in timeouts_too_close(10.0, 15.0)


def test_a_given_data_timeout_that_leaves_no_room_for_a_derived_control_one_is_named_not_blamed_on_the_measurement():
    """Found by review: data_timeout_s=30000 with "auto" control derived 3 x 30000 s, past the maximum,
    and the message said the measurement was broken."""
    with pytest.raises(ConfigError, match=r"control_timeout_s 90000.* s \(derived\) .* give control_timeout_s too"):
        derive_timeouts({"shard": FAST}, CTRL, given_data=30000.0)
