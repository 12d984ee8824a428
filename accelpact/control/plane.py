"""The out-of-band control plane: a Gloo group of its own plus a compare-and-set register.

Why two channels: collectives over the control group carry the per-update boundary check and the
rank reports (everyone needs everyone's), while *outcomes* go through a single compare-and-set
register in the rendezvous store. The register is written once per recovery: rank 0 collects the
votes, the runtime's release handler decides (`decisions.decide_release`) and rank 0 publishes;
any rank that times out writes "reject" if it is still empty. This module only moves bytes: it
decides nothing. Every rank then follows the register's one value, so no rank can resume while another
rejects (OutcomeAgreement), even if a rank dies mid-protocol. Under torchrun the store is hosted
by the elastic agent, so it outlives any worker.

The control group must never time out during a healthy recovery (a gloo group that timed out is
closed for good), hence its timeout is longer than the data-plane timeout by a wide margin.

The boundary check's tensor also carries each rank's update time in a slot of its own (MAX of a
slot only one rank writes is that rank's value), so every rank learns every rank's pace at no
extra collective: the straggler signal (`accelpact.stragglers`).

Every exchange also carries this rank's vector clock (`clock.py`): in slots of its own in the
boundary check's tensor (MAX is the clocks' merge), next to the report in a gather, inside the
sealed vote and outcome values. So each trace record says what its rank could have seen of the
others, and trace validation checks the run against happens-before, not wall-clock order.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..comm import _c10d
from ..comm.backends import wait_unless
from ..errors import ControlPlaneError
from ..fsm.decisions import ReleaseVote
from . import exchange, reach
from .auth import ENV_SECRET, SECRET_BYTES, ForgedValue, Sealer, job_secret
from .bounded import BoundedStore, StoreUnresponsive
from .clock import VectorClock

log = logging.getLogger("accelpact.control")

#: Fixed part of one rank's control-plane message slot (a report is well under 2 KiB, also at
#: 1,000 ranks: groups are named by rank ranges).
GATHER_BYTES = 8192
#: What every rank of the world adds to each slot: its entry in the vector clock each message
#: carries (an int64 in JSON, up to 20 characters, and a separator). A fixed 8 KiB overflowed at
#: ~1,000 ranks once the clocks reached a million (traced runs advance them every update).
PER_RANK_BYTES = 21


def slot_bytes(world_size: int) -> int:
    """One rank's control-plane message slot in a world of `world_size` ranks."""
    return GATHER_BYTES + PER_RANK_BYTES * world_size
#: Key of the placeholder a rank sends instead of a message too large for its slot.
OVERSIZE = "accelpact_oversize_bytes"
#: Key of the placeholder a gather puts where a report failed authentication.
FORGED = "accelpact_forged"
#: Floor of the time ranks get to reach attach's control-plane group together.
CONNECT_TIMEOUT_S = 60.0


class ControlPlane:
    #: this rank's vector clock (None only for a plane built without a group, in unit tests)
    clock: VectorClock | None = None
    #: every remote host's probe address (empty for a plane built without a group, in unit tests)
    links: reach.LinkTable = reach.LinkTable("")
    _reach_listener: reach.ReachListener | None = None

    def __init__(self, *, timeout_s: float, attempt: int, store: dist.Store | None = None,
                 silent_hosts: frozenset[str] = frozenset()):
        if not dist.is_initialized():
            raise ControlPlaneError("accelpact needs torch.distributed initialised (init_process_group) before attach")
        self.rank = dist.get_rank()
        #: under membership (spares, shrink): whether this world is being abandoned, so that the
        #: boundary check stops waiting for peers that already left (`comm.backends.wait_unless`)
        self.cut_short: Callable[[], bool] | None = None
        self.world_size = dist.get_world_size()
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        # Every world rank calls this once at attach, so plain new_group is safe here. Building it is
        # a rendezvous of processes that reach attach at different times (seen: a rank 5 s late
        # on a loaded machine), so it gets CONNECT_TIMEOUT_S at least; collectives then get ours.
        self.group = dist.new_group(backend="gloo",
                                    timeout=datetime.timedelta(seconds=max(timeout_s, CONNECT_TIMEOUT_S)))
        _c10d.set_group_timeout(self.group, self.timeout)
        # Outcome registers must never be reused: keys are scoped by restart attempt and by a
        # token rank 0 draws for this attach (no process-global counter, and a key nobody can
        # guess in advance). With it rank 0 draws the job's secret unless ACCELPACT_SECRET gives
        # one; both reach every rank over the new group, never through the store.
        # Rank 0's attempt number rides along and is every rank's from here on (found by review:
        # under plain torch.distributed.init_process_group each rank took its own agent's restart
        # count, agents can count apart, and ranks then built different namespaces and hung)
        drawn = self._from_rank0(8 + SECRET_BYTES, tail=int(attempt).to_bytes(8, "little"))
        #: the attempt number every rank of this attach uses: rank 0's
        self.attempt = int.from_bytes(drawn[-8:], "little")
        if self.attempt != attempt:
            log.warning("this rank counted attempt %d, rank 0 attempt %d: rank 0's is used (its torchrun agent "
                        "counted restarts apart from rank 0's)", attempt, self.attempt)
        drawn = drawn[:-8]
        self.namespace = f"attempt{self.attempt}/{int.from_bytes(drawn[:8], 'little') >> 2:016x}"
        self.sealer = Sealer(job_secret(os.environ) or drawn[8:], self.namespace)
        self._check_same_secret()  # on every rank: a secret set on some ranks only must fail here too
        base = store if store is not None else _c10d.default_store()
        # every call bounded by the control timeout: a store behind a cut link blocks far past its own
        self.store = BoundedStore(dist.PrefixStore(f"accelpact/{self.namespace}/", base), timeout_s)
        self.forged: dict[str, list[str]] = {}  # epoch -> values that failed authentication
        self.seq = 0  # control-plane sequence number: equal on every rank at the same protocol step
        self.clock = VectorClock(self.rank, self.world_size)
        # [flag, update time of rank 0 .. world-1 in microseconds + 1 (0: not reported),
        #  vector clock of rank 0 .. world-1 (every rank writes its whole clock: MAX merges them)]
        self._flag = torch.zeros(1 + 2 * self.world_size, dtype=torch.int64)
        self._flag_np = self._flag.numpy()  # the same memory: filled and read without torch's dispatch
        self._max = dist.AllreduceOptions()  # posted straight to the group (`boundary_post`)
        self._max.reduceOp = dist.ReduceOp.MAX
        #: every rank's update time (s) carried by the last boundary check; None where not reported
        self.update_times: tuple[float | None, ...] = (None,) * self.world_size
        # where each peer host takes fresh-connection probes (`reach`; `runtime.link_wait` uses it)
        self._reach_listener, self.links = reach.publish(self.store, self.group, self.rank, self.world_size,
                                                         self.timeout, silent_hosts)

    def _from_rank0(self, n: int, tail: bytes = b"") -> bytes:
        """`n` random bytes drawn by rank 0 and rank 0's `tail`, received by every rank over the
        control group (every rank gives a tail of the same length)."""
        size = n + len(tail)
        mine = secrets.token_bytes(n) + tail if self.rank == 0 else bytes(size)
        buf = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        try:
            dist.broadcast(buf, src=0, group=self.group)
        except Exception as exc:  # gloo raises RuntimeError/DistError kinds
            raise ControlPlaneError(f"control plane could not agree on its namespace: {type(exc).__name__}: {exc}") from exc
        return buf.numpy().tobytes()

    def _check_same_secret(self) -> None:
        """Every rank must hold the same ACCELPACT_SECRET, or every value would fail later."""
        mine = torch.frombuffer(bytearray(bytes.fromhex(self.sealer.mac("secret-check"))), dtype=torch.uint8)
        ref = mine.clone()
        try:
            dist.broadcast(ref, src=0, group=self.group)
            differs = torch.tensor([0 if torch.equal(mine, ref) else 1], dtype=torch.int64)
            dist.all_reduce(differs, op=dist.ReduceOp.MAX, group=self.group)
        except Exception as exc:  # gloo raises RuntimeError/DistError kinds
            raise ControlPlaneError(f"checking {ENV_SECRET} across ranks failed: {type(exc).__name__}: {exc}") from exc
        if int(differs.item()):
            raise ControlPlaneError(f"{ENV_SECRET} differs between ranks (or is set on some ranks only): every rank "
                                    "must be given the same secret")

    def _stamped(self, value: object) -> object:
        """`value` with this rank's clock, for the peers that read it (sealed with it)."""
        return {"m": value, "vc": self.clock.read()} if self.clock is not None else value

    def _unstamped(self, value: object) -> object:
        """The value a peer stamped, its clock merged into ours; a value without one as it is."""
        if isinstance(value, dict) and set(value) == {"m", "vc"}:
            if self.clock is not None:
                self.clock.merge(value["vc"])
            return value["m"]
        return value

    def _obey(self, epoch: str, raw: bytes | str) -> str:
        """The register's outcome if its value verifies; otherwise the value is evidence and the
        outcome is reject."""
        try:
            value = self._unstamped(self.sealer.open(raw, epoch, "outcome"))
        except ForgedValue as exc:
            self.forged.setdefault(epoch, []).append(str(exc))
            log.error("outcome register: %s", exc, extra={"epoch": epoch})
            return "reject"
        return value if value in ("resume", "reject") else "reject"

    # -- collectives ------------------------------------------------------------------------------
    def boundary_check(self, flag: int, update_s: float | None = None) -> int:
        """All-reduce MAX of a small flag at every boundary: >0 means some rank needs recovery.

        This is the only per-update control-plane cost. Every rank reaches it, also a rank whose
        update failed, so that the control plane's collective sequence never diverges. The same
        tensor carries this rank's `update_s` in its own slot: afterwards `update_times` holds
        every rank's."""
        return self.boundary_result(self.boundary_post(flag, update_s))

    def boundary_post(self, flag: int, update_s: float | None = None) -> dist.Work:
        """The boundary check's all-reduce, started and not waited for (a deferred boundary,
        `runtime.deferred`): `boundary_result` settles it. Nothing else may use the control
        plane in between (its collectives would queue behind this one in order anyway)."""
        self.seq += 1
        n, slots = self.world_size, self._flag_np  # numpy writes: ~1 µs where torch indexing took ~15
        slots[:1 + n] = 0
        slots[0] = flag
        if update_s is not None:
            slots[1 + self.rank] = int(max(0.0, update_s) * 1e6) + 1
        slots[1 + n:] = self.clock.read() if self.clock is not None else 0
        try:
            # ProcessGroup.allreduce, not dist.all_reduce: the same collective without the Python
            # wrapper's checks, which cost ~40 µs of the training thread on every update here.
            return self.group.allreduce([self._flag], self._max)
        except Exception as exc:
            raise ControlPlaneError(f"boundary check #{self.seq} failed: {exc}") from exc

    def boundary_result(self, work: dist.Work) -> int:
        """Wait for a posted boundary check (at most the control timeout, less if `cut_short` says
        a membership change abandons this world): the agreed flag."""
        try:
            work.wait() if self.cut_short is None else wait_unless(work, self.cut_short)
        except Exception as exc:
            raise ControlPlaneError(f"boundary check #{self.seq} failed: {exc}{self._peer_left()}") from exc
        n, slots = self.world_size, self._flag_np
        self.update_times = tuple((us - 1) / 1e6 if us else None for us in slots[1:1 + n].tolist())
        if self.clock is not None:
            self.clock.merge(slots[1 + n:].tolist())
        return int(slots[0])

    def round_trips(self, n: int) -> list[float]:
        """Seconds each of `n` boundary-check-sized all-reduces took (timeout calibration). Not
        counted in `seq`: no protocol step, and every rank runs the same number."""
        probe = torch.zeros_like(self._flag)
        out = []
        try:
            for _ in range(n):
                t = time.perf_counter()
                dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=self.group)
                out.append(time.perf_counter() - t)
        except Exception as exc:
            raise ControlPlaneError(f"control-plane latency probe failed: {type(exc).__name__}: {exc}") from exc
        return out

    def gather_floats(self, values: Sequence[float]) -> list[tuple[float, ...]]:
        """Every rank's `values`, in rank order. Every rank must pass as many values; a mismatch
        is found first (one MAX all-reduce) and raised on every rank alike, never a hang."""
        return self._gather_equal(values, torch.float64)

    def gather_ints(self, values: Sequence[int]) -> list[tuple[int, ...]]:
        """`gather_floats` for int64 words (digests: exact bits, no float round trip)."""
        return self._gather_equal(values, torch.int64)

    def _gather_equal(self, values: Sequence, dtype: torch.dtype) -> list[tuple]:
        n = len(values)
        sizes = torch.tensor([n, -n], dtype=torch.int64)
        try:
            dist.all_reduce(sizes, op=dist.ReduceOp.MAX, group=self.group)
            if (int(sizes[0]), -int(sizes[1])) != (n, n):
                raise ControlPlaneError(f"ranks gathered between {-int(sizes[1])} and {int(sizes[0])} values, "
                                        f"this rank {n}: every rank must pass as many (the same groups, the same tensors)")
            mine = torch.tensor(list(values), dtype=dtype)
            out = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(out, mine, group=self.group)
        except ControlPlaneError:
            raise
        except Exception as exc:
            raise ControlPlaneError(f"gathering {dtype} values failed: {type(exc).__name__}: {exc}") from exc
        return [tuple(t.tolist()) for t in out]

    def set_timeout(self, timeout_s: float) -> None:
        """Use `timeout_s` from now on (the control group's collectives and the store waits)."""
        self.timeout_s = timeout_s
        self.timeout = datetime.timedelta(seconds=timeout_s)
        _c10d.set_group_timeout(self.group, self.timeout)
        if isinstance(self.store, BoundedStore):
            self.store.bound_s = timeout_s

    @contextmanager
    def timeout_for(self, timeout_s: float) -> Iterator[None]:
        """`timeout_s` for the collectives inside, the usual timeout again after them, whether
        they passed or failed."""
        usual = self.timeout_s
        self.set_timeout(timeout_s)
        try:
            yield
        finally:
            self.set_timeout(usual)

    def gather(self, obj: object) -> list[object]:
        """Every rank's JSON-serialisable object (reports), in rank order. A rank whose object
        does not fit its slot sends `{OVERSIZE: n, "rank": r}` instead (see `unusable`).

        One exchange of fixed-size byte buffers (`exchange.py`: one round of direct sends, not
        gloo's ring): `all_gather_object` would cost two collectives plus pickling, and the
        agreement phase sits on the repair path."""
        self.seq += 1
        slot = slot_bytes(self.world_size)
        payload = self.sealer.seal(self._stamped(obj), "report", self.seq, self.rank).encode()
        if len(payload) > slot - 4:
            # never raise before the collective (the peers would wait out the timeout): send a
            # placeholder every rank sees, so that all of them reject together, with the reason
            log.error("control-plane message of %d bytes exceeds the %d-byte slot", len(payload), slot - 4)
            payload = self.sealer.seal({OVERSIZE: len(payload), "slot": slot - 4, "rank": self.rank}, "report",
                                       self.seq, self.rank).encode()
        buf = torch.zeros(slot, dtype=torch.uint8)
        buf[:4] = torch.tensor(list(len(payload).to_bytes(4, "little")), dtype=torch.uint8)
        buf[4 : 4 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        try:
            out = exchange.exchange(self.group, buf, rank=self.rank, world_size=self.world_size, tag=self.seq,
                                    timeout=self.timeout)
        except Exception as exc:
            raise ControlPlaneError(f"gather #{self.seq} failed: {exc}{self._peer_left()}") from exc
        result: list[object] = []
        for rank, t in enumerate(out):
            raw = t.numpy().tobytes()
            n = int.from_bytes(raw[:4], "little")
            try:
                result.append(self._unstamped(self.sealer.open(raw[4 : 4 + n], "report", self.seq, rank))
                              if n else None)
            except ForgedValue as exc:  # every rank sees the same bytes: all reject together
                result.append({FORGED: str(exc), "rank": rank})
        return result

    def _peer_left(self) -> str:
        """Why a control-plane collective failed, when a peer left this world for a membership
        change: it closed its connections, and gloo's "Connection closed by peer ... typically
        caused by a remote worker crashing" would otherwise send the reader after a crash that
        never happened (a peer whose boundary check failed where this rank's passed)."""
        if self.cut_short is None or not self.cut_short():
            return ""
        return " (a peer had left this world for a membership change: it closed its connections, it did not crash)"

    @staticmethod
    def unusable(got: list[object]) -> list[str]:
        """Why each placeholder in a gather's result stands there (empty: every message fit and
        verified)."""
        out = []
        for d in got:
            if isinstance(d, dict) and OVERSIZE in d:
                out.append(f"rank {d['rank']}'s control-plane message of {d[OVERSIZE]} bytes exceeds the "
                           f"{d.get('slot', GATHER_BYTES - 4)}-byte slot")
            elif isinstance(d, dict) and FORGED in d:
                out.append(f"rank {d['rank']}'s report: {d[FORGED]}")
        return out

    def probe_links(self, budget_s: float, interval_s: float) -> reach.Probed:
        """Fresh connections to every remote host of this plane until all answered or `budget_s`
        has passed (`reach.probe`): whether the links the next collective needs are up. A world
        being abandoned for a membership change (`cut_short`) ends the wait."""
        return reach.probe(self.links.targets, budget_s=budget_s, interval_s=interval_s, stop=self.cut_short)

    # -- the outcome register -----------------------------------------------------------------------
    def _outcome_key(self, epoch: str) -> str:
        return f"{epoch}/outcome"

    def force_reject(self, epoch: str, reason: str) -> str:
        """Set the register to "reject" unless already decided; return its value.
        ControlPlaneError when the store cannot be reached. Not a step of `seq`: only a rank whose
        control plane failed takes it, and one that reads "resume" goes on beside peers that never
        took it (counted, its next gather would be sealed one step ahead, and every peer would read
        it as forged)."""
        try:
            self.store.set(f"{epoch}/reject-reason/{self.rank}", reason)
            value = self.store.compare_set(self._outcome_key(epoch), "",
                                           self.sealer.seal(self._stamped("reject"), epoch, "outcome"))
        except Exception as exc:  # torch raises RuntimeError/DistStoreError/DistNetworkError
            raise ControlPlaneError(f"outcome register unreachable: {type(exc).__name__}: {exc}") from exc
        return self._obey(epoch, value)

    def force_reject_within(self, epoch: str, reason: str, timeout_s: float, pause_s: float = 0.2) -> str:
        """force_reject, retried while the store is unreachable until `timeout_s` has passed: a rank
        that cannot read the register must not take that for "reject" (a peer may read "resume").
        ControlPlaneError if it stays unreachable."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.force_reject(epoch, reason)
            except ControlPlaneError:
                if time.monotonic() + pause_s > deadline:
                    raise
                time.sleep(pause_s)

    def post_vote(self, epoch: str, vote: ReleaseVote) -> None:
        """Post this rank's release vote."""
        self.seq += 1
        try:
            self.store.set(f"{epoch}/vote/{vote.rank}",
                           self.sealer.seal(self._stamped({"ok": vote.ok, "reason": vote.reason}), epoch, "vote",
                                            vote.rank))
        except Exception as exc:  # torch raises plain RuntimeError/DistStoreError for a lost store
            raise ControlPlaneError(f"posting the release vote failed: {type(exc).__name__}: {exc}") from exc

    def collect_votes(self, epoch: str) -> list[ReleaseVote | None]:
        """Rank 0: every rank's vote, waiting up to the control timeout; None where missing. A store
        that stops answering ends the collection there, every vote not yet read missing (found by
        review: each of the W reads after a failed wait waited out its own bound, W x C in all,
        where the peers gave up after C)."""
        keys = [f"{epoch}/vote/{r}" for r in range(self.world_size)]
        raw: list[bytes | None] = [None] * len(keys)
        try:
            self.store.wait(keys, self.timeout)
        except StoreUnresponsive as exc:
            log.warning("release votes unreadable, the store does not answer: %s", exc, extra={"epoch": epoch})
            return [None] * len(keys)
        except Exception as exc:  # a missing vote is evidence for the decision, not an error here
            log.warning("release votes incomplete: %s: %s", type(exc).__name__, exc, extra={"epoch": epoch})
        else:
            try:  # every vote is there: one round trip instead of a check and a get per rank
                raw = list(self.store.multi_get(keys))
            except Exception as exc:  # a store without multi_get: read them one by one below
                log.debug("multi_get of the votes failed: %s: %s", type(exc).__name__, exc, extra={"epoch": epoch})
        votes: list[ReleaseVote | None] = []
        for r, key in enumerate(keys):
            try:
                if raw[r] is None:  # read one by one only when some vote is missing
                    if not self.store.check([key]):
                        votes.append(None)
                        continue
                    raw[r] = self.store.get(key)
                body = self._unstamped(self.sealer.open(raw[r], epoch, "vote", r))
                votes.append(ReleaseVote(r, bool(body["ok"]), str(body["reason"])))  # type: ignore[index]
            except StoreUnresponsive as exc:
                log.warning("the store stopped answering while the votes were read (ranks %d..%d missing): %s", r,
                            len(keys) - 1, exc, extra={"epoch": epoch})
                votes.extend([None] * (len(keys) - r))
                break
            except ForgedValue as exc:  # never counted: a missing vote, and the reason is kept
                self.forged.setdefault(epoch, []).append(str(exc))
                log.error("release vote of rank %d: %s", r, exc, extra={"epoch": epoch})
                votes.append(None)
            except (RuntimeError, ValueError, TypeError, KeyError) as exc:
                log.warning("vote of rank %d unreadable: %s: %s", r, type(exc).__name__, exc, extra={"epoch": epoch})
                votes.append(None)
        return votes

    def publish_outcome(self, epoch: str, value: str, reasons: tuple[str, ...] = ()) -> str:
        """Rank 0: write the decided outcome unless the register is already set; returns its value.
        ControlPlaneError when the store cannot be reached (then rank 0 forces the register, as
        any rank whose control plane failed)."""
        try:
            if reasons:
                self.store.set(f"{epoch}/release-reasons", json.dumps(list(reasons)))
            value = self.store.compare_set(self._outcome_key(epoch), "",
                                           self.sealer.seal(self._stamped(value), epoch, "outcome"))
        except Exception as exc:  # torch raises RuntimeError/DistStoreError/DistNetworkError
            raise ControlPlaneError(f"publishing the outcome failed: {type(exc).__name__}: {exc}") from exc
        return self._obey(epoch, value)

    def await_outcome(self, epoch: str, timeout_s: float) -> str:
        """Wait for the register to be written; ControlPlaneError if it is not within `timeout_s`."""
        key = self._outcome_key(epoch)
        try:
            self.store.wait([key], datetime.timedelta(seconds=max(0.001, timeout_s)))
            raw = self.store.get(key)
        except Exception as exc:  # torch raises DistStoreError (a RuntimeError) on timeout
            raise ControlPlaneError(f"no release decision within {timeout_s:.1f}s: {type(exc).__name__}: {exc}") from exc
        return self._obey(epoch, raw)

    def release_reasons(self, epoch: str) -> list[str]:
        """Why the release was rejected: values that failed authentication here, then rank 0's
        reasons (diagnostics for the evidence, not obeyed)."""
        out = [f"not obeyed: {why}" for why in self.forged.get(epoch, [])]
        try:
            if self.store.check([f"{epoch}/release-reasons"]):
                got = json.loads(self.store.get(f"{epoch}/release-reasons"))
                out += [str(r) for r in got] if isinstance(got, list) else [f"rank 0's reasons: {got!r}"]
        except (RuntimeError, ValueError) as exc:  # pragma: no cover - store gone at fail-stop
            out.append(f"release reasons unreadable: {type(exc).__name__}: {exc}")
        return out

    def mark(self, name: str) -> None:
        """Tell every rank that `name` happened here (a store key; `await_mark` reads it)."""
        try:
            self.store.set(f"mark/{name}", "1")
        except Exception as exc:  # torch raises RuntimeError/DistStoreError/DistNetworkError
            raise ControlPlaneError(f"marking {name!r} failed: {type(exc).__name__}: {exc}") from exc

    def await_mark(self, name: str, timeout_s: float) -> bool:
        """Whether `name` was marked within `timeout_s` (False also for a store gone: the caller
        only waits for a courtesy, never for a decision)."""
        try:
            self.store.wait([f"mark/{name}"], datetime.timedelta(seconds=max(0.001, timeout_s)))
        except Exception as exc:  # DistStoreError (a RuntimeError) on timeout, network errors
            log.warning("no mark %r within %.1fs: %s: %s", name, timeout_s, type(exc).__name__, exc)
            return False
        return True

    def stop_listening(self) -> None:
        """Take no more link probes (a world left behind: its peers probe the next one's listeners)."""
        if self._reach_listener is not None:
            self._reach_listener.close()
            self._reach_listener = None

    def left_behind(self) -> None:
        """This plane's world was left for the next one (a membership change): no more link
        probes, and its store worker thread ends (found by review: one was left blocked on its
        queue per change). Its group goes with the world (`world.init_world` destroys it)."""
        self.stop_listening()
        if isinstance(self.store, BoundedStore):
            self.store.close()

    def close(self) -> None:
        self.left_behind()
        try:
            dist.destroy_process_group(self.group)
        except (RuntimeError, ValueError) as exc:  # pragma: no cover - best effort at shutdown
            log.debug("closing the control group: %s: %s", type(exc).__name__, exc)
