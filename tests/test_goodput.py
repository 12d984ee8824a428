"""The net-saving model: the seed's worked figures, each term, the break-even points, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from accelpact import goodput
from accelpact.goodput import (
    GoodputParams,
    break_even_interval_days,
    break_even_share,
    breakdown,
    eligible_events,
    net_saving,
    other_events,
    saving_per_event,
    sweep,
)


def test_defaults_reproduce_the_seed_figures():
    p = GoodputParams()
    assert saving_per_event(p) == pytest.approx(1099.23)  # S = 5 x 220 - 0.77
    assert p.guard_overhead * p.t0_s == pytest.approx(172.8)  # h * T0
    # 2 % of 7.76 interruptions/day: 0.155 events/day saving about 170 s/day, ~98.6 % of the guard
    two = p.replace(committed_share=0.02)
    assert eligible_events(two) == pytest.approx(0.1552)
    assert breakdown(two)["gross_s"] == pytest.approx(170.6, abs=0.1)
    assert breakdown(two)["gross_s"] / 172.8 == pytest.approx(0.986, abs=0.002)
    # 10 %: gross 852.9-853.0 s/day, net 680.2 s/day (~3.9x the guard cost)
    ten = p.replace(committed_share=0.10)
    assert breakdown(ten)["gross_s"] == pytest.approx(853.0, abs=0.2)
    assert net_saving(ten) == pytest.approx(680.2, abs=0.1)
    # one eligible failure every ~6.3 days pays for the guard (1099.2 / 172.8 = 6.36)
    assert break_even_interval_days(ten) == pytest.approx(1099.23 / (172.8 + other_events(ten) * 0.1), rel=1e-9)
    assert 6.3 <= break_even_interval_days(ten) <= 6.4


def test_each_term_enters_with_its_sign():
    base = GoodputParams(n_eligible=2.0, n_other=3.0, age=4, t_update_s=10.0, t_repair_s=1.0, c_reject_s=0.5,
                         guard_overhead=0.01, t0_s=1000.0)
    assert net_saving(base) == pytest.approx(2 * (4 * 10 - 1) - 3 * 0.5 - 0.01 * 1000)
    assert net_saving(base.replace(n_eligible=3.0)) > net_saving(base)
    assert net_saving(base.replace(n_other=4.0)) < net_saving(base)
    assert net_saving(base.replace(guard_overhead=0.02)) < net_saving(base)
    assert net_saving(base.replace(t_repair_s=2.0)) == pytest.approx(net_saving(base) - 2.0)
    assert net_saving(base.replace(age=5)) - net_saving(base) == pytest.approx(2 * 10)


def test_counts_scale_with_the_campaign_and_never_go_negative():
    p = GoodputParams(committed_share=0.5)
    assert eligible_events(p.replace(t0_s=2 * 86_400)) == pytest.approx(2 * eligible_events(p))
    assert other_events(p) == 0.0  # 3.88 eligible/day exceed the 0.916 communication failures/day
    assert other_events(GoodputParams(committed_share=0.0)) == pytest.approx(0.916)


def test_break_even_share_is_where_the_net_saving_crosses_zero():
    p = GoodputParams()
    share = break_even_share(p)
    assert share is not None and 0.02 < share < 0.021
    assert net_saving(p.replace(committed_share=share)) == pytest.approx(0.0, abs=1e-3)
    assert net_saving(p.replace(committed_share=share * 0.99)) < 0 < net_saving(p.replace(committed_share=share * 1.01))
    assert break_even_share(p.replace(t_update_s=0.0, age=0.0)) is None  # nothing to save


def test_break_even_interval_edges():
    assert break_even_interval_days(GoodputParams(age=0.0)) == 0.0  # repair costs more than it saves
    free = GoodputParams(guard_overhead=0.0, c_reject_s=0.0)
    assert math.isinf(break_even_interval_days(free))


def test_sweep_is_monotone_in_share_and_age():
    p = GoodputParams()
    by_share = sweep(p, "committed_share", [0.0, 0.05, 0.1, 0.2])
    by_age = sweep(p, "age", [1, 5, 10, 20])
    assert by_share == sorted(by_share) and by_age == sorted(by_age)
    with pytest.raises(ValueError, match="unknown parameter"):
        sweep(p, "nonsense", [1])


@pytest.mark.parametrize("bad", [{"committed_share": 1.5}, {"t0_s": 0}, {"age": -1}, {"n_other": -2}])
def test_invalid_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        GoodputParams(**bad)


def test_cli_prints_the_model_and_writes_json_and_plot(tmp_path, capsys):
    from accelpact import cli

    out_json, png = tmp_path / "g.json", tmp_path / "g.png"
    assert cli.main(["goodput", "--paper-only", "--share", "0.1", "--json", str(out_json), "--png", str(png),
                     "--sources"]) == 0
    text = capsys.readouterr().out
    assert "dT 680.2 s" in text and "break-even: one eligible failure every 6.3" in text
    assert "Llama 3 405B" in text
    doc = json.loads(out_json.read_text())
    assert doc["net_s"] == pytest.approx(680.2, abs=0.1) and doc["params"]["committed_share"] == 0.1
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.stat().st_size > 10_000


def test_model_functions_do_not_need_matplotlib(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert goodput.net_saving(GoodputParams()) < 0  # 2 % share: just short of break-even


# ------------------------------------------------------------------------------ measured model


SPARES_SUMMARY = {"envelope": "rewind", "spares": 2, "schedules": 40, "seed": 15, "killed": 7,
                  "recoveries": {"rewind": 50, "replace": 42, "preserve": 22, "reject": 7},
                  "recovered_in_memory_share": 0.891, "faults_in_memory_share": 0.905}
GUARD = {"args": {"updates": 60, "dim": 64, "layers": 4, "framework": "fsdp2"},
         "ranks": [{"rank": r, "plain_s": 0.090 + r * 0.001, "guarded_s": 0.100 + r * 0.002} for r in range(4)]}


def _write(path, doc):
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_the_measured_envelope_is_each_actions_share_of_the_failures_met():
    env = goodput.envelope_from_summary(SPARES_SUMMARY, "c.json")
    assert env.failures == 128 and env.counts["restarted"] == 7 and env.counts["killed"] == 7
    assert env.shares == {"preserve": 22 / 128, "rewind": 50 / 128, "replace": 42 / 128}
    assert env.in_memory_share == pytest.approx(0.891, abs=5e-4) and env.faults_in_memory_share == 0.905
    assert "2 spares" in env.label and "seed 15" in env.label
    # an older summary says "restart" where newer ones say "reject"; both end in a restart
    old = goodput.envelope_from_summary({"recoveries": {"rewind": 50, "preserve": 35, "restart": 19}, "killed": 132,
                                         "recovered_in_memory_share": 0.36}, "old.json")
    assert old.counts["restarted"] == 19 and old.in_memory_share == pytest.approx(85 / 236)


@pytest.mark.parametrize(("doc", "problem"), [
    ([], "JSON object expected"),
    ({"killed": 1}, "no 'recoveries'"),
    ({"recoveries": {"teleport": 1}, "killed": 0}, "unknown actions"),
    ({"recoveries": {"rewind": -1}, "killed": 0}, "must be a count"),
    ({"recoveries": {"rewind": "5"}, "killed": 0}, "finite number"),
    ({"recoveries": {"rewind": 1}}, "'killed'"),
    ({"recoveries": {}, "killed": 0}, "no failure"),
    ({**SPARES_SUMMARY, "recovered_in_memory_share": 0.5}, "inconsistent"),
])
def test_a_malformed_campaign_summary_is_refused_naming_the_file_and_the_problem(doc, problem):
    with pytest.raises(goodput.GoodputInputError, match=problem) as err:
        goodput.envelope_from_summary(doc, "runs/summary.json")
    assert str(err.value).startswith("runs/summary.json: ") and err.value.path == "runs/summary.json"


def test_the_guard_cost_is_the_median_over_ranks_of_guarded_minus_plain():
    g = goodput.guard_from_bench(GUARD, "guard.json")
    assert g.cost_s == pytest.approx((0.011 + 0.012) / 2) and g.update_s == pytest.approx(0.0915)
    assert g.ranks == 4 and "fsdp2" in g.setting and g.ratio == pytest.approx((0.0915 + 0.0115) / 0.0915)
    faster = goodput.guard_from_bench({"ranks": [{"plain_s": 0.1, "guarded_s": 0.099}]}, "g.json")
    assert faster.cost_s == 0.0 and "noise" in faster.notes[0]
    # the bench with arms: rt.step is what a user pays; the floor and the deferred boundary are named
    arms = {"args": {"nproc": 4}, "load_before": [1.2, 1.0, 0.9],
            "ranks": [{"plain_s": 0.100, "floor_s": 0.101, "update_s": 0.108, "step_s": 0.109, "deferred_s": 0.1005}
                      for _ in range(4)]}
    g = goodput.guard_from_bench(arms, "guard-4r.json")
    assert g.cost_s == pytest.approx(0.009) and "arm step" in g.setting and "load [1.2" in g.setting
    assert any("floor" in n and "+1.00 ms" in n for n in g.notes) and any("deferred" in n for n in g.notes)
    assert not any("own CPU" in n for n in g.notes)  # an older result has no such column
    for row in arms["ranks"]:
        row.update(step_own_cpu_s=0.0012, deferred_own_cpu_s=0.0006)
    g = goodput.guard_from_bench(arms, "guard-4r.json")
    assert [n for n in g.notes if "own CPU" in n] == [
        "AccelPact's own CPU on the training thread, arm step: 1200 µs per update (what remains where the "
        "collectives' threads have cores of their own)",
        "AccelPact's own CPU on the training thread, arm deferred: 600 µs per update (what remains where the "
        "collectives' threads have cores of their own)"]
    for bad, problem in [({}, "'ranks' list"), ({"ranks": [3]}, "not an object"),
                         ({"ranks": [{"plain_s": 0.1}]}, "no guarded arm"),
                         ({"ranks": [{"plain_s": 0.1, "step_s": 0.1}, {"plain_s": 0.1}]}, "no guarded arm"),
                         ({"ranks": [{"plain_s": 0.0, "guarded_s": 0.1}]}, "positive")]:
        with pytest.raises(goodput.GoodputInputError, match=problem):
            goodput.guard_from_bench(bad, "g.json")


def test_the_measured_model_is_the_papers_with_measured_counts_and_a_per_update_guard():
    p = GoodputParams()
    env = goodput.envelope_from_summary(SPARES_SUMMARY, "c.json")
    guard = goodput.guard_from_bench(GUARD, "g.json")
    q = goodput.measured_params(p, env, guard)
    share = 114 / 128
    assert eligible_events(q) == pytest.approx(share * 0.916) and other_events(q) == pytest.approx((1 - share) * 0.916)
    assert q.guard_overhead == pytest.approx(0.0115 / 220)
    expected = share * 0.916 * (5 * 220 - 0.77) - (1 - share) * 0.916 * 0.1 - 0.0115 / 220 * 86_400
    assert net_saving(q) == pytest.approx(expected)
    assert net_saving(goodput.measured_params(p, env, guard, failures_per_day=2.0)) > net_saving(q)
    assert (q.age, q.t_update_s, q.t_repair_s, q.t0_s) == (p.age, p.t_update_s, p.t_repair_s, p.t0_s)
    with pytest.raises(ValueError):
        goodput.measured_params(p, env, guard, failures_per_day=-1)


def test_cli_prints_both_models_with_every_measured_inputs_source(tmp_path, capsys):
    from accelpact import cli

    campaign, guard = _write(tmp_path / "camp.json", SPARES_SUMMARY), _write(tmp_path / "guard.json", GUARD)
    out_json = tmp_path / "g.json"
    assert cli.main(["goodput", "--campaign", str(campaign), "--guard", str(guard), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "paper's model (seed 000)" in text and "measured (this product)" in text
    assert str(campaign) in text and str(guard) in text and "0.916" in text
    assert "89.1% of 0.916" in text and "rewind 39.1%" in text and "11.50 ms per 220 s update" in text
    doc = json.loads(out_json.read_text())
    assert doc["net_s"] == pytest.approx(-2.3, abs=0.1)  # the paper's column is unchanged
    assert doc["measured"]["inputs"]["campaign"]["source"] == str(campaign)
    assert doc["measured"]["net_s"] > 800


def test_cli_names_a_missing_or_malformed_input_and_stops(tmp_path, capsys):
    from accelpact import cli

    guard = _write(tmp_path / "guard.json", GUARD)
    assert cli.main(["goodput", "--campaign", str(tmp_path / "nope.json"), "--guard", str(guard)]) == 2
    assert f"{tmp_path / 'nope.json'}: missing" in capsys.readouterr().out
    broken = _write(tmp_path / "broken.json", "{not json")
    assert cli.main(["goodput", "--campaign", str(broken), "--guard", str(guard)]) == 2
    assert f"{broken}: not JSON" in capsys.readouterr().out
    assert cli.main(["goodput", "--campaign", str(guard), "--guard", str(guard)]) == 2
    assert "no 'recoveries'" in capsys.readouterr().out
    assert cli.main(["goodput", "--paper-only", "--campaign", str(broken)]) == 0
    assert "measured" not in capsys.readouterr().out


def test_the_default_inputs_are_the_repositorys_measured_results():
    assert goodput.DEFAULT_CAMPAIGN.parent == goodput.DEFAULT_GUARD.parent == goodput.RESULTS_DIR
    assert goodput.RESULTS_DIR.parts[-2:] == ("bench", "results")
    env, guard = goodput.load_measured()
    assert 0.0 < env.in_memory_share <= 1.0 and guard.cost_s >= 0.0
