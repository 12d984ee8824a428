"""The out-of-band control plane: a Gloo group of its own plus a compare-and-set register.

Why two channels: collectives over the control group carry the per-update boundary check and the
rank reports (everyone needs everyone's), while *outcomes* go through a single compare-and-set
register in the rendezvous store. The register is written once per recovery: rank 0 writes
"resume" after every rank voted ok; any rank that times out writes "reject" if it is still
empty. Every rank then follows the register's one value, so no rank can resume while another
rejects (OutcomeAgreement), even if a rank dies mid-protocol. Under torchrun the store is hosted
by the elastic agent, so it outlives any worker.

The control group must never time out during a healthy recovery (a gloo group that timed out is
closed for good), hence its timeout is longer than the data-plane timeout by a wide margin.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..fsm.decisions import ReleaseVote, decide_release

log = logging.getLogger("accelpact.control")

#: Fixed size of one rank's control-plane message (a report is well under 2 KiB).
GATHER_BYTES = 8192


class ControlPlaneError(RuntimeError):
    """The control plane timed out or lost a peer; the recovery must reject."""


class ControlPlane:
    def __init__(self, *, timeout_s: float, namespace: str, store: dist.Store | None = None):
        if not dist.is_initialized():
            raise RuntimeError("accelpact needs torch.distributed initialised (init_process_group) before attach")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        # Every world rank calls this once at attach, so plain new_group is safe here.
        self.group = dist.new_group(backend="gloo", timeout=self.timeout)
        base = store if store is not None else dist.distributed_c10d._get_default_store()
        self.store = dist.PrefixStore(f"accelpact/{namespace}/", base)
        self.seq = 0  # control-plane sequence number: equal on every rank at the same protocol step
        self._flag = torch.zeros(1, dtype=torch.int64)

    # -- collectives ------------------------------------------------------------------------------
    def boundary_check(self, flag: int) -> int:
        """All-reduce MAX of a small flag at every boundary: >0 means some rank needs recovery.

        This is the only per-update control-plane cost. Every rank reaches it, also a rank whose
        update failed, so that the control plane's collective sequence never diverges."""
        self.seq += 1
        self._flag.fill_(flag)
        try:
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group)
        except Exception as exc:
            raise ControlPlaneError(f"boundary check #{self.seq} failed: {exc}") from exc
        return int(self._flag.item())

    def gather(self, obj: object) -> list[object]:
        """Every rank's JSON-serialisable object (reports), in rank order.

        One all-gather of fixed-size byte buffers: `all_gather_object` would cost two collectives
        plus pickling, and the agreement phase sits on the repair path."""
        self.seq += 1
        payload = json.dumps(obj, separators=(",", ":")).encode()
        if len(payload) > GATHER_BYTES - 4:
            raise ValueError(f"control-plane message of {len(payload)} bytes exceeds {GATHER_BYTES - 4}")
        buf = torch.zeros(GATHER_BYTES, dtype=torch.uint8)
        buf[:4] = torch.tensor(list(len(payload).to_bytes(4, "little")), dtype=torch.uint8)
        buf[4 : 4 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        out = [torch.empty_like(buf) for _ in range(self.world_size)]
        try:
            dist.all_gather(out, buf, group=self.group)
        except Exception as exc:
            raise ControlPlaneError(f"gather #{self.seq} failed: {exc}") from exc
        result: list[object] = []
        for t in out:
            raw = t.numpy().tobytes()
            n = int.from_bytes(raw[:4], "little")
            result.append(json.loads(raw[4 : 4 + n]) if n else None)
        return result

    # -- the outcome register -----------------------------------------------------------------------
    def _outcome_key(self, epoch: str) -> str:
        return f"{epoch}/outcome"

    def force_reject(self, epoch: str, reason: str) -> str:
        """Set the register to "reject" unless already decided; return its value."""
        self.seq += 1
        try:
            self.store.set(f"{epoch}/reject-reason/{self.rank}", reason)
            value = self.store.compare_set(self._outcome_key(epoch), "", "reject")
        except Exception as exc:  # store gone: nobody can release either
            log.error("outcome register unreachable: %s", exc, extra={"epoch": epoch})
            return "reject"
        return _decode(value)

    def vote(self, epoch: str, ok: bool, reason: str, on_decided: Callable[[str], None] | None = None) -> str:
        """Post this rank's release vote; rank 0 decides; everyone reads the register."""
        self.seq += 1
        key = self._outcome_key(epoch)
        self.store.set(f"{epoch}/vote/{self.rank}", json.dumps({"ok": ok, "reason": reason}))
        deadline = time.monotonic() + self.timeout_s
        if self.rank == 0:
            keys = [f"{epoch}/vote/{r}" for r in range(self.world_size)]
            try:
                self.store.wait(keys, self.timeout)
                votes = [ReleaseVote(r, **json.loads(self.store.get(k))) for r, k in enumerate(keys)]
            except Exception as exc:
                votes = []
                log.warning("release votes incomplete: %s", exc, extra={"epoch": epoch})
            release, reasons = decide_release(votes, self.world_size)
            if reasons:
                self.store.set(f"{epoch}/release-reasons", json.dumps(list(reasons)))
            value = _decode(self.store.compare_set(key, "", "resume" if release else "reject"))
            if on_decided:
                on_decided(value)
            return value
        remaining = max(0.001, deadline - time.monotonic())
        try:
            self.store.wait([key], datetime.timedelta(seconds=remaining))
            return _decode(self.store.get(key))
        except Exception as exc:
            raise ControlPlaneError(f"no release decision within {self.timeout_s}s: {exc}") from exc

    def release_reasons(self, epoch: str) -> list[str]:
        try:
            if self.store.check([f"{epoch}/release-reasons"]):
                return json.loads(self.store.get(f"{epoch}/release-reasons"))
        except Exception:  # pragma: no cover - diagnostics only
            pass
        return []

    def close(self) -> None:
        try:
            dist.destroy_process_group(self.group)
        except Exception:  # pragma: no cover - best effort at shutdown
            pass


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
