"""Standby successors (`comm.standby`, `runtime.standby`): a repair adopts a group connected ahead
of the failure instead of building one; which groups may is agreed, all members or none."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelpact.config import Config
from accelpact.errors import ConfigError
from accelpact.fsm.decisions import AgreementDecision, GroupId, RankReport, agreed_standbys, decide_agreement
from accelpact.fsm.phases import FailurePhase, RecoveryAction
from accelpact.runtime.standby import StandbyPool, covers
from accelpact.testing.drills import Drill, run_drill
from accelpact.testing.spawn import run_world
from model_checking.trace_validation import assert_valid_run

R02, R13 = GroupId("replicate", (0, 2)), GroupId("replicate", (1, 3))
S01, S23 = GroupId("shard", (0, 1)), GroupId("shard", (2, 3))


def report(rank: int, standby=(), phase=FailurePhase.COMMITTED, failed=(), **kw) -> RankReport:
    held = tuple(sorted(g for g in (R02, R13, S01, S23) if rank in g.ranks))
    return RankReport(rank=rank, frontier=3, generation=1, opt_step=3, failure_phase=phase, failed_groups=failed,
                      held_groups=held, standby=tuple(standby), **kw)


# --------------------------------------------------------------------------- decision (pure) --

@pytest.mark.parametrize(("tokens", "adopted"), [
    ({0: 1, 2: 1}, (("replicate[0,2]", 1),)),  # every member holds the one token: adopt
    ({0: 1}, ()),  # a member holds none (its build failed, or it dropped a dead one): build
    ({0: 1, 2: 0}, ()),  # two tokens: rank 0's standby is connected to another build's sockets
    ({}, ()),
])
def test_a_group_adopts_standbys_only_when_every_member_holds_one_of_the_same_token(tokens, adopted):
    reports = [report(r, [("replicate", tokens[r])] if r in tokens else []) for r in range(4)]
    assert agreed_standbys([R02], reports) == adopted


def test_peers_outside_the_group_have_no_say():
    reports = [report(r, [("replicate", 1)] if r in (0, 2) else [("replicate", 7)]) for r in range(4)]
    assert agreed_standbys([R02], reports) == (("replicate[0,2]", 1),)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=4, max_size=4))
def test_agreement_adopts_exactly_where_all_members_report_one_token(tokens):
    reports = [report(r, [] if t is None else [("replicate", t)]) for r, t in enumerate(tokens)]
    got = dict(agreed_standbys([R02, R13], reports))
    for g in (R02, R13):
        mine = {tokens[m] for m in g.ranks}
        if len(mine) == 1 and None not in mine:
            assert got[g.key] == tokens[g.ranks[0]]
        else:
            assert g.key not in got


def test_preserve_and_rewind_carry_the_agreed_standbys():
    both = [("replicate", 1), ("shard", 1)]
    preserve = decide_agreement([report(r, both, failed=(R02,) if r == 0 else ()) for r in range(4)], 4)
    assert preserve.action is RecoveryAction.PRESERVE
    assert preserve.standby == (("replicate[0,2]", 1),)  # only the failed group is rebuilt
    rewind_kw = dict(phase=FailurePhase.BACKWARD, rewind_phases=(FailurePhase.BACKWARD,), rerun_ok=True)
    reports = [report(r, both if r != 3 else [("replicate", 1)], **rewind_kw) for r in range(4)]
    rewind = decide_agreement(reports, 4)
    assert rewind.action is RecoveryAction.REWIND  # every group rebuilt; shard[2,3] lacks rank 3's standby
    assert dict(rewind.standby) == {"replicate[0,2]": 1, "replicate[1,3]": 1, "shard[0,1]": 1}
    assert rewind.standby_of([R13, S23]) == (("replicate[1,3]", 1),)  # what rank 3 adopts


def test_reports_and_decisions_carry_standbys_through_the_wire_format():
    rep = report(0, [("replicate", 4), ("shard", 4)])
    assert RankReport.from_dict(rep.to_dict()) == rep
    dec = AgreementDecision(RecoveryAction.PRESERVE, 4, 1, (R02,), (), (("replicate[0,2]", 4),))
    assert AgreementDecision.from_dict(dec.to_dict()) == dec


def test_which_groups_get_a_standby():
    assert covers("gloo", "gloo") and covers("gloo", "cpu:gloo,cuda:gloo")
    assert not covers("gloo", "nccl") and not covers("gloo", "cpu:gloo,cuda:nccl")  # NCCL: "all" only
    assert covers("all", "nccl") and not covers("off", "gloo")
    assert StandbyPool("off").tokens() == ()
    with pytest.raises(ValueError, match="standby mode"):
        StandbyPool("some")


class _Plane:
    timeout_s = 1.0
    gids = {"replicate": R02, "shard": S01}
    backend_specs = {"replicate": "gloo", "shard": "nccl"}
    groups = {"replicate": SimpleNamespace(bound_device_id=None), "shard": SimpleNamespace(bound_device_id=None)}

    def replacement_label(self, label: str) -> str:
        return f"{label}@scope"


def test_a_failed_build_costs_only_that_standby_and_is_logged_with_its_cause(monkeypatch, caplog):
    import accelpact.runtime.standby as standby_module

    asked = []

    def refuse(ranks, **kw):
        asked.append((tuple(ranks), kw["label"], kw["token"], kw["backend"], kw["device"]))
        raise RuntimeError("Socket Timeout: peer never came")

    monkeypatch.setattr(standby_module, "build_standby", refuse)
    pool = StandbyPool("gloo")
    with caplog.at_level("WARNING", logger="accelpact.standby"):
        pool.fill(_Plane(), ["replicate", "shard"], token=3)
    assert asked == [((0, 2), "replicate@scope", 3, "gloo", None)]  # the NCCL group is "all"'s only
    assert pool.tokens() == () and "Socket Timeout" in pool.failures["replicate"]
    assert any(getattr(r, "cause", "").startswith("RuntimeError: Socket Timeout") for r in caplog.records)


def test_a_standby_is_bound_to_the_device_its_group_is_bound_to(monkeypatch):
    """A group bound by `init_process_group(device_id=...)` must get a successor bound the same
    way: `replace_group` refuses a standby bound otherwise, so an unbound standby is wasted."""
    import torch

    import accelpact.runtime.standby as standby_module

    class Plane(_Plane):
        backend_specs = {"replicate": "gloo", "shard": "gloo"}
        groups = {"replicate": SimpleNamespace(bound_device_id=torch.device("cuda", 1)),
                  "shard": SimpleNamespace(bound_device_id=None)}

    asked = {}
    monkeypatch.setattr(standby_module, "build_standby", lambda ranks, **kw: asked.update({kw["label"]: kw["device"]}))
    StandbyPool("gloo").fill(Plane(), ["replicate", "shard"], token=2)
    assert asked == {"replicate@scope": torch.device("cuda", 1), "shard@scope": None}


def test_after_a_failed_build_the_rest_of_the_fill_is_skipped_not_waited_out(monkeypatch):
    """Each failed build waits out the data timeout; building on after one would hold this rank up
    one timeout per group while its peers train on (and time out on it)."""
    import accelpact.runtime.standby as standby_module

    class Plane(_Plane):
        gids = {"a": R02, "b": S01, "c": R02}
        backend_specs = {"a": "gloo", "b": "gloo", "c": "gloo"}
        groups = {label: SimpleNamespace(bound_device_id=None) for label in "abc"}

    asked = []

    def first_fails(ranks, **kw):
        asked.append(kw["label"])
        raise RuntimeError("Socket Timeout: peer never came")

    monkeypatch.setattr(standby_module, "build_standby", first_fails)
    pool = StandbyPool("gloo")
    pool.fill(Plane(), ["c", "b", "a"], token=4)
    assert asked == ["a@scope"]  # in label order; b and c never waited for
    assert pool.failures["b"] == pool.failures["c"] == "not built: the standby of a failed before it"
    assert pool.tokens() == ()


class _FakeGroup:
    def __init__(self):
        self.calls = []

    def abort(self):
        self.calls.append("abort")

    def shutdown(self):
        self.calls.append("shutdown")


@pytest.mark.parametrize("backend, closed_by", [("gloo", "shutdown"), ("cpu:gloo,cuda:nccl", "abort"),
                                                ("nccl", "abort")])
def test_a_discarded_nccl_standby_is_aborted_never_shut_down(backend, closed_by):
    """A graceful NCCL shutdown finalises the communicator with its peers: a membership change
    discards standbys that span a dead one."""
    from accelpact.comm.standby import Standby

    pg = _FakeGroup()
    Standby(pg, "replicate", 3, (0, 2), backend, store=None).discard()
    assert pg.calls == [closed_by]


def test_a_bad_setting_is_refused_by_name():
    with pytest.raises(ConfigError, match="standby_groups must be one of off, gloo, all"):
        Config(standby_groups="nccl")
    assert Config().with_env({"ACCELPACT_STANDBY_GROUPS": "off"}).standby_groups == "off"


# ----------------------------------------------------------------------- comm (4 gloo ranks) --

def adopt_world(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    from accelpact.comm import _c10d, connections, make_group, replace_group
    from accelpact.comm.lifecycle import MembershipError
    from accelpact.comm.standby import build_standby

    mine = [0, 2] if rank in (0, 2) else [1, 3]  # two groups of one label: their keys must not mix
    old = make_group(mine, label="rep", generation=0, timeout=5)
    standby = build_standby(mine, label="rep", token=0, timeout=5, backend="gloo")
    with pytest.raises(MembershipError, match="connects"):
        standby.adopt(ranks=[0, 1, 2, 3], name=old.group_name, identity="accelpact:rep:g1", timeout=5)
    quiet = connections.intact(standby.pg)
    with pytest.raises(MembershipError, match="was built with 'gloo'"):  # refused before the old group is retired
        replace_group(old, ranks=mine, label="rep", generation=1, timeout=2.5, backend="cpu:gloo", standby=standby)
    kept = _c10d.is_registered(old)
    new = replace_group(old, ranks=mine, label="rep", generation=1, timeout=2.5, standby=standby)
    value = torch.tensor([rank + 1])
    dist.all_reduce(value, group=new)
    # a bound group (init_process_group(device_id=...) binds every subgroup) keeps its binding:
    # built afresh, and from a standby, which must be bound the same way
    cpu0 = torch.device("cpu", 0)
    bound = make_group(mine, label="bnd", generation=0, timeout=5, device=cpu0)
    unbound = build_standby(mine, label="bnd", token=0, timeout=5, backend="gloo")
    with pytest.raises(MembershipError, match="bound to None"):
        replace_group(bound, ranks=mine, label="bnd", generation=1, timeout=2.5, standby=unbound)
    unbound.discard()
    fresh = replace_group(bound, ranks=mine, label="bnd", generation=1, timeout=2.5)
    held = build_standby(mine, label="bnd", token=1, timeout=5, backend="gloo", device=cpu0)
    adopted = replace_group(fresh, ranks=mine, label="bnd", generation=2, timeout=2.5, standby=held)
    check = torch.tensor([1])
    dist.all_reduce(check, group=adopted)
    return {"bound": [str(g.bound_device_id) for g in (bound, fresh, adopted)], "bound_sum": int(check),
            "adopted_standby": adopted is held.pg, "backend_name": new._get_backend(torch.device("cpu")).options.group_name,
            "same": new is standby.pg, "name": new.group_name, "identity": new.group_desc,
            "resolved": _c10d.resolve_name("accelpact:rep:g0") is new,
            "ranks": dist.get_process_group_ranks(new), "sum": int(value), "quiet": quiet,
            "timeout": _c10d.group_timeout(new), "connections": len(connections.connections_of(new)),
            "old_registered": _c10d.is_registered(old), "kept_after_refusal": kept}


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_an_adopted_standby_is_the_group_replace_group_would_have_built():
    results = run_world(adopt_world, 4, timeout_s=60, pg_timeout_s=20)
    for rank, r in enumerate(results):
        pair = [0, 2] if rank in (0, 2) else [1, 3]
        # the retired group's name (what meshes and compiled regions hold), the generation's identity
        assert r["same"] and r["resolved"] and r["name"] == "accelpact:rep:g0" and r["identity"] == "accelpact:rep:g1"
        assert r["ranks"] == pair and r["sum"] == sum(p + 1 for p in pair)
        assert r["timeout"] == datetime.timedelta(seconds=2.5)  # the data timeout, not the standby's
        assert r["quiet"] and r["connections"] >= 1  # its sockets followed it under the new name
        assert not r["old_registered"] and r["kept_after_refusal"]
        assert r["bound"] == ["cpu:0"] * 3 and r["bound_sum"] == 2 and r["adopted_standby"]
        assert r["backend_name"] == "accelpact:rep:g0"  # its backend's logs name it as a built one's do


# --------------------------------------------------------------------- runtime (4 gloo ranks) --

def drill(tmp_path, **kw) -> list[dict]:
    d = Drill(trace_dir=str(tmp_path / "trace"), framework="fsdp2", updates=6, data_timeout_s=2.0, **kw)
    results = run_world(run_drill, 4, d, timeout_s=150, pg_timeout_s=30)
    assert_valid_run(tmp_path / "trace")
    for r in results:
        assert r["rejected"] is None, r["rejected"]
        assert r["mismatches"] == [], f"rank {r['rank']}: {r['mismatches']}"
    return results


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_repairs_adopt_the_standbys_and_stay_bitwise(tmp_path):
    results = drill(tmp_path, faults="skip@3:committed:2,skip@5:committed:2")
    for r in results:
        assert [h["action"] for h in r["history"]] == ["preserve", "preserve"]
        assert [h["adopted"] for h in r["history"]] == [["replicate[0,2]"]] * 2  # the second: one built after the first
        member = r["rank"] in (0, 2)
        assert all((h["standby_s"] > 0) == member for h in r["history"]), r["history"]  # replenished by members only


@pytest.mark.multiproc
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["forget", "sever"])
def test_a_group_one_member_holds_no_live_standby_for_is_built_afresh(tmp_path, how):
    """Rank 2 loses its standbys before the failed update ("forget": its peers still hold theirs;
    "sever": held, but their connections closed): the group is built, the next one is adopted."""
    results = drill(tmp_path, faults="skip@3:committed:2,skip@5:committed:1", spoil_standby=(3, 2, how))
    for r in results:
        assert [h["action"] for h in r["history"]] == ["preserve", "preserve"]
        assert [h["adopted"] for h in r["history"]] == [[], ["replicate[1,3]"]]
