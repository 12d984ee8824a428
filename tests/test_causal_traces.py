"""Causal trace validation (issue #18): the vector clock, the control plane that carries it, and
the checker that refuses records no run could have written.

The real trace in tests/fixtures/traces/preserve-ddp4 was recorded by
`test_runtime.py::test_one_committed_fault_is_preserved_bitwise[ddp]` (4 CPU ranks, one host, a
fault at the committed boundary of update 3 on replicate[0,2], preserved); the two doctored copies
are the issue's: a release given the seq of a peer's rebind (with the clock it had before the
votes), and a release moved before a peer's report in wall-clock time only."""

from __future__ import annotations

import datetime
import json
import shutil
import time
from pathlib import Path

import pytest

from accelpact.control.auth import Sealer
from accelpact.control.clock import VectorClock, as_clock, merged, ticked
from accelpact.control.plane import ControlPlane
from accelpact.fsm.decisions import ReleaseVote
from accelpact.testing.spawn import run_world
from model_checking.causality import causal_merge, causal_needs, stuck, total_needs, violations
from model_checking.trace_validation import Source, check_runs, merge, read_run

REAL = Path(__file__).parent / "fixtures" / "traces" / "preserve-ddp4"


# -- the clock (pure) -------------------------------------------------------------------------------
def test_clock_ticks_its_own_slot_and_merges_by_elementwise_max():
    assert merged([3, 0, 2], [1, 4, 2]) == [3, 4, 2]
    assert ticked([3, 0, 2], 1) == [3, 1, 2]
    with pytest.raises(ValueError, match="cannot be merged"):
        merged([1], [1, 2])
    c = VectorClock(1, 3)
    assert c.tick() == [0, 1, 0]
    c.merge([5, 0, 7])
    assert c.tick() == [5, 2, 7]
    for junk in (None, "x", [1, 2], [1, -1, 0], [True, 0, 0]):  # an old peer's message: ignored
        c.merge(junk)
    assert c.read() == [5, 2, 7] and as_clock((1, 2, 3), 3) == [1, 2, 3]


def test_the_trace_writer_stamps_every_record_with_a_tick_and_names_the_host(tmp_path):
    from accelpact.trace import TraceWriter

    clock = VectorClock(1, 2)
    writer = TraceWriter(tmp_path, 1, clock=clock)
    clock.merge([4, 0])  # an exchange between two records
    writer.edge(seq=1, action="commit_update", src="Train", dst="Train", frontier=1, generation=0, refs={})
    writer.close()
    attach, edge = _lines(tmp_path / "trace-rank1.jsonl")
    assert attach["vc"] == [0, 1] and attach["host"] and edge["vc"] == [4, 2]


# -- the control plane carries it (store and sealed values; no process group) ----------------------
class DictStore:
    def __init__(self):
        self.kv: dict[str, str] = {}

    def set(self, key, value):
        self.kv[key] = value

    def get(self, key):
        return self.kv[key]

    def check(self, keys):
        return all(k in self.kv for k in keys)

    def wait(self, keys, timeout=None):
        assert self.check(keys)

    def compare_set(self, key, expected, desired):
        if self.kv.get(key, "") == expected:
            self.kv[key] = desired
        return self.kv[key]


def _plane(rank: int, store: DictStore) -> ControlPlane:
    plane = ControlPlane.__new__(ControlPlane)
    plane.rank, plane.world_size, plane.seq, plane.forged, plane.timeout_s = rank, 2, 0, {}, 1.0
    plane.timeout = None
    plane.sealer, plane.store, plane.clock = Sealer(b"k" * 32, "ns"), store, VectorClock(rank, 2)
    return plane


def test_votes_and_the_outcome_register_carry_the_clock_inside_what_is_sealed():
    store = DictStore()
    zero, one = _plane(0, store), _plane(1, store)
    for _ in range(3):
        one.clock.tick()  # rank 1 has written three records, then votes
    one.post_vote("r1", ReleaseVote(1, True, ""))
    zero.post_vote("r1", ReleaseVote(0, True, ""))
    assert json.loads(json.loads(store.kv["r1/vote/1"])["v"])["vc"] == [0, 3]  # sealed with the vote
    votes = zero.collect_votes("r1")
    assert [v.ok for v in votes] == [True, True] and zero.clock.read() == [0, 3]
    zero.clock.tick()
    assert zero.publish_outcome("r1", "resume") == "resume"
    assert one.await_outcome("r1", 1.0) == "resume" and one.clock.read() == [1, 3]
    # a stamped value is sealed as a whole: the clock cannot be changed without the secret
    raw = json.loads(store.kv["r1/outcome"])
    raw["v"] = raw["v"].replace("[1,3]", "[9,9]")
    store.kv["r2/outcome"] = json.dumps(raw)
    assert one.await_outcome("r2", 1.0) == "reject" and one.clock.read() == [1, 3]
    # a register written without a clock (an older writer) is still obeyed
    store.kv["r3/outcome"] = one.sealer.seal("resume", "r3", "outcome")
    assert one.await_outcome("r3", 1.0) == "resume"


def _exchange(rank: int, world_size: int) -> dict:
    from accelpact.control import ControlPlane

    control = ControlPlane(timeout_s=10.0, attempt=0)
    for _ in range(rank + 1):
        control.clock.tick()
    out = {"flag": control.boundary_check(1 if rank == 1 else 0, 0.1 * (rank + 1))}
    out["after_check"], out["times"] = control.clock.read(), control.update_times
    control.clock.tick()
    got = control.gather({"rank": rank})
    out["gathered"], out["after_gather"] = got, control.clock.read()
    control.close()
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_the_boundary_check_and_the_gather_merge_every_ranks_clock():
    """The clock rides in the boundary check's tensor (no extra collective; the flag and the
    update times still arrive) and next to the report in a gather."""
    results = run_world(_exchange, 2, timeout_s=45)
    for out in results:
        assert out["flag"] == 1 and out["times"] == pytest.approx((0.1, 0.2), abs=2e-6)
        assert out["after_check"] == [1, 2]
        assert out["gathered"] == [{"rank": 0}, {"rank": 1}]  # the clock is not the message
        assert out["after_gather"] == [2, 3]


# -- the checker (pure) -----------------------------------------------------------------------------
def _items(rank: int, recs: list[dict]) -> list:
    return [(Source(f"trace-rank{rank}.jsonl", n), rec) for n, rec in enumerate(recs, start=1)]


def test_the_merge_puts_a_record_after_what_it_has_seen_whatever_its_seq_says():
    a = {"kind": "edge", "action": "rebind_refs", "seq": 9, "vc": [1, 0]}
    b = {"kind": "edge", "action": "release", "seq": 1, "vc": [1, 1]}  # has seen a, lower key
    out = causal_merge({0: _items(0, [a]), 1: _items(1, [b])}, lambda r, rec: rec["seq"])
    assert [rec["action"] for _, rec in out] == ["rebind_refs", "release"]
    c = {"kind": "edge", "action": "release", "seq": 1, "vc": [0, 1]}  # concurrent: the key decides
    out = causal_merge({0: _items(0, [a]), 1: _items(1, [c])}, lambda r, rec: rec["seq"])
    assert [rec["action"] for _, rec in out] == ["release", "rebind_refs"]


def test_needs_leave_concurrent_records_free_and_keep_implied_ones_in_place():
    """What TLC may reorder: rank 1's record is concurrent with rank 0's first and needs nothing;
    rank 0's second has seen it. A record without a clock (implied) keeps its listed place."""
    ranks = [0, 1, 0]
    assert causal_needs(ranks, [[1, 0], [0, 1], [2, 1]], 2) == [(0, 0), (0, 0), (1, 1)]
    assert total_needs(ranks, 2) == [(0, 0), (1, 0), (1, 1)]
    assert causal_needs([0, 1, 1], [[1, 0], None, [0, 1]], 2) == [(0, 0), (1, 0), (1, 1)]


def test_stuck_names_the_record_every_order_fails_at_not_the_ones_waiting_on_it():
    ranks, needs = [0, 1, 0, 1], [(0, 0), (0, 0), (1, 1), (1, 1)]
    assert stuck(ranks, needs, {0: 1, 1: 0}) == [1]  # rank 0's second waits on it: not named
    assert stuck(ranks, needs, {0: 1, 1: 1}) == [2, 3]  # both had their past taken, neither went


@pytest.mark.parametrize("recs0, recs1, needle", [
    ([{"vc": [1, 0]}, {"vc": [3, 0]}], [{"vc": [0, 1]}], "own clock goes from 1 to 3"),
    ([{"vc": [1, 1]}, {"vc": [2, 0]}], [{"vc": [0, 1]}], "forgets what rank 0 had seen"),
    ([{"vc": [1, 0]}], [{"vc": [0, 1]}, {"vc": [5, 2]}], "has seen rank 0's record #5, which rank 0 never wrote"),
    ([{"vc": [1, 1]}], [{"vc": [1, 1]}], "have each seen the other"),
    ([{"vc": [1, 0]}], [{"vc": [0, 1]}, {"vc": [1, 2, 0]}], "no vector clock of 2 ranks"),
    ([{"vc": [1, 0], "t": 5.0}, {"vc": [2, 0], "t": 4.0}], [{"vc": [0, 1]}], "before rank 0's previous record"),
])
def test_clocks_no_run_could_produce_are_named(recs0, recs1, needle):
    found = violations({0: _items(0, recs0), 1: _items(1, recs1)}, 2)
    assert any(needle in v.describe() for v in found), [v.describe() for v in found]


def test_records_of_a_rank_that_left_no_trace_are_named():
    """Found by review: the cross-rank check looked only at ranks with a file, so a run missing a
    whole rank's trace passed although rank 0 had seen rank 1's records."""
    found = violations({0: _items(0, [{"vc": [1, 3]}, {"vc": [2, 6]}])}, 2)
    assert any("has seen rank 1's record #3, but rank 1 left no trace" in v.describe() for v in found), found


# -- the real run, and the two doctored copies of it ---------------------------------------
def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _doctor(tmp_path: Path, name: str, change) -> Path:
    out = tmp_path / name
    shutil.copytree(REAL, out)
    ranks = {r: _lines(out / f"trace-rank{r}.jsonl") for r in range(4)}
    change(ranks)
    for r, recs in ranks.items():
        (out / f"trace-rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    return out


def _at(recs: list[dict], action: str) -> int:
    return next(n for n, x in enumerate(recs) if x.get("action") == action)


def alongside_rebind(ranks: dict[int, list[dict]]) -> None:
    """Rank 0 releases with the seq of rank 2's rebind and the clock it had before the votes."""
    n = _at(ranks[0], "release")
    ranks[0][n]["seq"] = ranks[2][_at(ranks[2], "rebind_refs")]["seq"]
    ranks[0][n]["vc"] = ticked(ranks[0][n - 1]["vc"], 0)


def moved_in_time(ranks: dict[int, list[dict]]) -> None:
    """Rank 0's release moved before rank 2's report in wall-clock time only."""
    ranks[0][_at(ranks[0], "release")]["t"] = ranks[2][_at(ranks[2], "submit_report")]["t"] - 1e-3


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    runs = {"real": REAL, "alongside": _doctor(tmp, "alongside", alongside_rebind),
            "moved": _doctor(tmp, "moved", moved_in_time)}
    return dict(zip(runs, check_runs(list(runs.values()), workers=2)))  # ~100,000 states: both cores


def test_the_recorded_run_is_clocked_causal_and_a_behaviour_of_the_spec(real):
    rep = real["real"]
    assert rep.ok and rep.clocked and not rep.causal, rep.describe()
    logs = read_run(REAL)[0]
    release = next(rec for _, rec in merge(logs) if rec["action"] == "release")
    for r in (1, 2, 3):  # rank 0's release has seen every peer's report through the gather
        report = next(rec for rec in _lines(REAL / f"trace-rank{r}.jsonl") if rec.get("action") == "submit_report")
        assert release["vc"][r] >= report["vc"][r]


def test_the_real_release_alongside_a_peers_rebind_is_refused_naming_it(real):
    rep = real["alongside"]
    assert rep.result.ok, "merged by seq and stage, TLC alone accepts it"
    assert not rep.ok
    text = rep.describe()
    first = rep.causal[0]
    assert first.rank == 0 and first.what.startswith("release") and first.where.startswith("trace-rank0.jsonl:")
    assert "released before every rank validated: it has not seen rank 2's rebind_refs" in text, text


def test_the_real_release_moved_before_a_peers_report_in_time_only_is_refused_naming_it(real):
    rep = real["moved"]
    assert rep.result.ok and not rep.ok
    assert rep.causal and all(v.rank == 0 and v.what.startswith("release") for v in rep.causal), rep.describe()
    assert any("that it has seen (both on host" in v.why and "before rank 2's" in v.why for v in rep.causal)


class CountingStore(DictStore):
    """A store with multi_get that counts the round trips the vote collection makes."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def get(self, key):
        self.calls.append("get")
        return super().get(key)

    def check(self, keys):
        self.calls.append("check")
        return super().check(keys)

    def multi_get(self, keys):
        self.calls.append("multi_get")
        return [self.kv[k] for k in keys]

    def wait(self, keys, timeout=None):
        if not all(k in self.kv for k in keys):
            raise RuntimeError("wait timeout")


def test_all_votes_are_read_in_one_round_trip_and_a_missing_one_one_by_one():
    """Rank 0 reads the release votes with one multi_get once they are all there (a check and a
    get per rank cost 2W round trips on the repair path); with one missing it reads them one by
    one and the missing vote is None; a store without multi_get (DictStore) still works."""
    store = CountingStore()
    zero, one = _plane(0, store), _plane(1, store)
    zero.post_vote("r1", ReleaseVote(0, True, ""))
    one.post_vote("r1", ReleaseVote(1, False, "validate failed"))
    votes = zero.collect_votes("r1")
    assert [(v.ok, v.reason) for v in votes] == [(True, ""), (False, "validate failed")]
    assert store.calls == ["multi_get"]
    store.calls.clear()
    zero.post_vote("r2", ReleaseVote(0, True, ""))
    votes = zero.collect_votes("r2")
    assert votes[0].ok and votes[1] is None and "multi_get" not in store.calls
    plain = DictStore()
    zero, one = _plane(0, plain), _plane(1, plain)
    zero.post_vote("r1", ReleaseVote(0, True, ""))
    one.post_vote("r1", ReleaseVote(1, True, ""))
    assert [v.ok for v in zero.collect_votes("r1")] == [True, True]


def test_a_store_that_stops_answering_ends_rank_0s_collection_at_once():
    """Found by review: after the votes' wait failed on an unreachable store, rank 0 read each
    rank's vote in turn, each read waiting out its own bound: W x C in all, where its peers gave
    up after C. Now a store that does not answer ends the collection: every unread vote missing."""
    from accelpact.control.bounded import BoundedStore

    class Blackholed(DictStore):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def wait(self, keys, timeout=None):
            self.calls += 1
            time.sleep(3)

        check = get = multi_get = wait

    for ranks_reachable in (False, True):
        inner = Blackholed()
        zero = _plane(0, BoundedStore(inner, bound_s=0.5))
        zero.world_size, zero.timeout = 8, datetime.timedelta(seconds=0.1)
        if ranks_reachable:  # the wait timed out (a vote missing), then the store went away mid-read
            zero.store.wait = lambda keys, timeout: (_ for _ in ()).throw(RuntimeError("Socket Timeout"))
        t0 = time.monotonic()
        votes = zero.collect_votes("r1")
        assert votes == [None] * 8 and time.monotonic() - t0 < 2.5  # before: 1.1 s + 8 x 0.5 s
        assert inner.calls == 1  # one call that did not answer, not one per rank
