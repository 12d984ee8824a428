"""Authentication of what travels through the rendezvous store and the control group.

The TCPStore has no authentication: anyone who can reach its port can write any key. So every
value AccelPact obeys carries an HMAC-SHA256 under a per-job secret, bound to the attach's
namespace, the recovery epoch, the kind of value (outcome, vote, report) and, for votes and
reports, the sender: a value forged without the secret, copied from another recovery or another
rank, or garbled, fails verification. A value that fails is never obeyed; it is evidence, and
the recovery rejects with that reason.

What it does not protect: a process that holds the secret (every rank does), the store's
availability (a hostile client can still delete keys or flood the store, which makes recoveries
reject rather than resume), and secrecy (values are signed, not encrypted). Firewall the store
port to the job's hosts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping

from ..errors import ControlPlaneError

#: The secret's length in bytes when rank 0 draws it.
SECRET_BYTES = 32
#: A secret given to every process of the job, spares included (e.g. by the launcher's
#: environment); without it rank 0 draws one per attach, which a spare cannot know.
ENV_SECRET = "ACCELPACT_SECRET"
#: Length of the hex MAC ahead of a sealed byte value (`Sealer.seal_bytes`).
_MAC_HEX = 64


def job_secret(environ: Mapping[str, str]) -> bytes | None:
    """The key derived from ``ACCELPACT_SECRET`` (its SHA-256), or None when it is not set."""
    given = environ.get(ENV_SECRET, "").encode()
    return hashlib.sha256(given).digest() if given else None


class ForgedValue(ControlPlaneError):
    """A value failed authentication: forged, replayed from elsewhere, or garbled."""


class Sealer:
    def __init__(self, secret: bytes, namespace: str):
        if len(secret) < 16:
            raise ValueError("the control-plane secret must have at least 16 bytes")
        self._secret = secret
        self.namespace = namespace

    def mac(self, *parts: object) -> str:
        message = "\x1f".join([self.namespace, *map(str, parts)]).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def seal(self, value: object, *context: object) -> str:
        """`value` (JSON-serialisable) with its MAC over the namespace, `context` and the value."""
        body = json.dumps(value, sort_keys=True, separators=(",", ":"))
        return json.dumps({"v": body, "mac": self.mac(*context, body)}, separators=(",", ":"))

    def seal_bytes(self, data: bytes, *context: object) -> bytes:
        """`data` (any bytes: a pickle, a JSON text) behind its hex MAC over the namespace,
        `context` and `data`: no encoding of its own, so a value costs 65 bytes more."""
        return self._mac_bytes(context, data).encode() + b":" + data

    def open_bytes(self, raw: bytes | str, *context: object) -> bytes:
        """The bytes sealed in `raw` if its MAC verifies for `context`; ForgedValue otherwise."""
        data = raw.encode() if isinstance(raw, str) else bytes(raw)
        where = "/".join(map(str, context))
        mac, sep, body = data[:_MAC_HEX], data[_MAC_HEX:_MAC_HEX + 1], data[_MAC_HEX + 1:]
        if sep != b":" or not hmac.compare_digest(mac, self._mac_bytes(context, body).encode()):
            shown = data[:40].decode("ascii", errors="replace")
            raise ForgedValue(f"value {shown!r} for {where} fails authentication (unsigned, forged, replayed, or "
                              f"signed under another {ENV_SECRET})")
        return body

    def _mac_bytes(self, context: tuple[object, ...], data: bytes) -> str:
        head = "\x1f".join([self.namespace, *map(str, context), ""]).encode()
        return hmac.new(self._secret, head + data, hashlib.sha256).hexdigest()

    def open(self, raw: bytes | str, *context: object) -> object:
        """The value inside `raw` if its MAC verifies for `context`; ForgedValue otherwise."""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        where = "/".join(map(str, context))
        try:  # RecursionError: nesting deeper than the parser's stack is as malformed as a bad token
            outer = json.loads(text)
            body, mac = outer["v"], outer["mac"]
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise ForgedValue(f"unsigned or malformed value {text[:60]!r} for {where}") from exc
        # compared as bytes: compare_digest raises TypeError on a str with non-ASCII characters,
        # which escaped as a crash instead of a forged value (no evidence, no exit 75)
        if (not isinstance(body, str) or not isinstance(mac, str)
                or not hmac.compare_digest(mac.encode(errors="replace"), self.mac(*context, body).encode())):
            raise ForgedValue(f"value for {where} fails authentication (forged or replayed)")
        try:  # signed by a holder of the secret, so well formed; kept bounded all the same
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ForgedValue(f"signed value for {where} is not JSON") from exc
