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
    assert cli.main(["goodput", "--share", "0.1", "--json", str(out_json), "--png", str(png), "--sources"]) == 0
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
