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

from ..errors import ControlPlaneError

#: The secret's length in bytes when rank 0 draws it.
SECRET_BYTES = 32


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
