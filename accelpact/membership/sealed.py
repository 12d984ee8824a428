"""The job store, every value of which is sealed under the job's secret (`ACCELPACT_SECRET`).

Why: a membership change obeys what it reads from the job's store: presences, the decision, a
spare's claim, votes and the release, heartbeats (a death certificate among them), digests, a
lost rank's small state (unpickled by the spare that continues it) and where a neighbour copy
listens. The TCPStore has no authentication, so a client that reached its port could forge any
of them: release a rejected change, hand a spare a position, or run code in a spare through the
pickle. With a secret every process holds, spares included, each value carries an HMAC over the
job's namespace (run and attempt), its key (which names the world, the position and the kind)
and the value: a value forged without the secret, copied from another key, world, attempt or
run, or garbled is refused (`ForgedValue`) and never obeyed. Where a value is read for what it
says (a presence, the decision, a vote, the release, a digest, a small state) a membership change
that meets a forged one rejects with it as the reason. Where a key is obeyed for being there (a
change under way, a shrink, a spare's claim, a beat) a forged value counts as absent (`holds`):
what the same client could do by deleting the key, never more.

What stays unsigned: the store's counters and lists (`add`, `append`: how many positions are done
or were lost, which spares registered, which holders were lost or fenced). Forging them can end
the spares' wait early or miscount the exit barrier; it can neither put a process in the job nor
change its state. The per-attach control plane seals its own values (`control.auth`).

Without a secret nothing is sealed (a spare could not know the secret rank 0 draws per attach);
`launch` warns once.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping

import torch.distributed as dist

from ..control.auth import ForgedValue, Sealer, job_secret

__all__ = ["SealedStore", "holds", "membership_store", "opened_or_none", "unsealed"]

log = logging.getLogger("accelpact.membership")


class SealedStore:
    """`raw` with `set`/`get`/`compare_set` values sealed and opened (`Sealer.seal_bytes`, the key
    as context); everything else passes through. Values come back as bytes, as TCPStore's do."""

    def __init__(self, raw: dist.Store, sealer: Sealer) -> None:
        self.raw, self.sealer = raw, sealer

    def set(self, key: str, value: bytes | str) -> None:
        self.raw.set(key, self._seal(key, value))

    def get(self, key: str) -> bytes:
        return self.sealer.open_bytes(self.raw.get(key), key)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Create-once only (`expected` empty): a sealed value is never compared by content, and
        every register of the membership change is written once."""
        if expected not in ("", b""):
            raise ValueError(f"compare_set on {key!r} expects a value: only create-once writes are sealed")
        return self.sealer.open_bytes(self.raw.compare_set(key, "", self._seal(key, desired)), key)

    def check(self, keys: list[str]) -> bool:
        return self.raw.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        if timeout is None:
            self.raw.wait(keys)
        else:
            self.raw.wait(keys, timeout)

    def add(self, key: str, amount: int) -> int:
        return self.raw.add(key, amount)

    def append(self, key: str, value: bytes | str) -> None:
        self.raw.append(key, value)

    def delete_key(self, key: str) -> bool:
        return self.raw.delete_key(key)

    def clone(self) -> SealedStore:
        return SealedStore(self.raw.clone(), self.sealer)

    def _seal(self, key: str, value: bytes | str) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return self.sealer.seal_bytes(data, key)


def membership_store(store: dist.Store, environ: Mapping[str, str], namespace: str) -> dist.Store | SealedStore:
    """`store` sealed under the job's secret when `environ` gives one, else `store` itself."""
    secret = job_secret(environ)
    if secret is None:
        return store
    return SealedStore(store, Sealer(secret, f"membership/{namespace}"))


def holds(store: dist.Store | SealedStore, key: str) -> bool:
    """Whether `key` holds a value this process may obey for being there: one that fails
    authentication counts as absent (a client without the secret could as well have deleted the
    key; what it wrote is never obeyed)."""
    if not isinstance(store, SealedStore):
        return store.check([key])  # nothing to open: one round trip (the boundary's wait polls this)
    return opened_or_none(store, key) is not None


def opened_or_none(store: dist.Store | SealedStore, key: str) -> bytes | None:
    """`key`'s value, or None when there is none or it fails authentication (reported once per key)."""
    if not store.check([key]):
        return None
    try:
        return store.get(key)
    except ForgedValue as exc:
        if key not in _REFUSED:  # the watchers poll: once per key is enough
            _REFUSED.add(key)
            log.warning("ignored as absent: %s", exc)
        return None


#: Keys whose value failed authentication here (each reported once).
_REFUSED: set[str] = set()


def unsealed(store: dist.Store | SealedStore) -> dist.Store:
    """The c10d store under `store`: a world's default group keys its rendezvous there itself."""
    return store.raw if isinstance(store, SealedStore) else store
