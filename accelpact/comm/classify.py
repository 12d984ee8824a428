"""Say why a collective failed, looking through the exceptions c10d wraps around the real one.

When a collective runs on a destroyed group, c10d's error path itself fails and raises
``ValueError: Process group … is not initialized in the world group map``, leaving the real gloo
error in ``__context__``. The cause that matters for recovery is the outermost evidence that a
*retired* communicator was used (a stale reference: rebind, don't replace again); otherwise the
innermost gloo/NCCL error decides between a timeout and a closed connection.

Pure string and exception logic: no torch import, no global state.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from accelpact.comm.naming import group_identity

__all__ = ["Classification", "FailureCause", "classify_failure", "exception_chain", "is_communication_failure"]

_MAX_CHAIN = 32
_MAX_FRAMES = 200


class FailureCause(enum.Enum):
    TIMEOUT = "timeout"
    CONNECTION_CLOSED = "connection_closed"
    RETIRED_COMMUNICATOR = "retired_communicator"
    OTHER = "other"


@dataclass(frozen=True)
class Classification:
    """``message``: the real (innermost) error's text; ``chain``: "Type: text", outermost first."""

    cause: FailureCause
    message: str
    chain: tuple[str, ...]


_RETIRED_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"not initialized in the world group map",  # c10d: group destroyed (or never registered)
        r"could not resolve the process group",  # DeviceMesh / funcol: name unregistered
        r"invalid process group specified",  # c10d: destroy/abort of an unknown group
        r"process ?group (has been|was|is) (destroyed|shut ?down|aborted)",
        r"backend.*(has been|was|is) (shut ?down|aborted)",
    )
)
_TIMEOUT_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"timed out",  # gloo: "Timed out waiting 1000ms for recv operation to complete"
        r"timeout caused pair closure",  # gloo: a pair closed by an earlier timeout
        r"watchdog caught collective operation timeout",  # NCCL
        r"watchdog got stuck",  # NCCL: the heartbeat monitor's verdict on a hung collective
        r"\btimeout\b",
    )
)
_CLOSED_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"connection closed by peer",  # gloo
        r"connection reset by peer",  # gloo / sockets
        r"broken pipe",
        r"socket (is )?closed",
        r"remote (process|peer|worker) (exited|closed|crashed)",
        r"ncclRemoteError",
        r"closed by remote peer",  # NCCL socket transport
        r"NCCL communicator (was|has been) aborted",  # the watchdog aborted it (no other reason given)
        r"unhandled system error",  # ncclSystemError: a socket or IB link failed
        r"NET/(IB|Socket) ?:",  # NCCL network plugins: a failed link
        r"connection refused",
    )
)


#: torch.distributed's own error types (c10d, the store, the backends), by name: no torch import
_DIST_TYPES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
_COMM_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"third_party/gloo/",  # every gloo transport error names its source file
        r"\bgloo\b", r"nccl", r"\bc10d\b", r"process ?group", r"connectFullMesh",
        r"watchdog caught collective",  # NCCL's watchdog ("… timeout: WorkNCCL(…)")
        r"NET/(IB|Socket) ?:",  # NCCL's network plugins name themselves
    )
)


def is_communication_failure(exc: BaseException, classification: Classification | None = None) -> bool:
    """Whether `exc` is a failure of communication (recoverable by rebuilding groups) rather than
    a bug in the training step, which must reach the user as it is: a rebuild cannot fix it and a
    rewind would only run into it again.

    Communication: a retired communicator, torch.distributed's own error types, an error text from
    gloo, NCCL or c10d anywhere in the chain, an error of AccelPact's own communication paths, and
    an exception that declares its cause (`failure_cause`: the drills' injected faults). A timeout
    or a closed connection counts only with such evidence: a DataLoader that "timed out" or a
    remote data source's ConnectionResetError is the training step's own failure, which a rebuild
    cannot fix and a rewind would only meet again. Everything else (a KeyError, a malformed batch,
    out of memory) is a bug. `classification`: `exc`'s, when the caller already has it (with its
    retired-group evidence)."""
    if isinstance(getattr(exc, "failure_cause", None), str):
        return True
    if (classification or classify_failure(exc)).cause is FailureCause.RETIRED_COMMUNICATOR:
        return True
    return any(type(link).__name__ in _DIST_TYPES or type(link).__module__.startswith("accelpact.")
               or _raised_in_communication_code(link) or _matches(_text(link), _COMM_PATTERNS)
               for link in exception_chain(exc))


#: Where a bare TimeoutError or ConnectionError raised is communication's: torch.distributed's
#: Python side, and AccelPact's own control plane and groups.
_COMM_SOURCES = ("/torch/distributed/", "/accelpact/comm/", "/accelpact/control/")


def _raised_in_communication_code(exc: BaseException) -> bool:
    """Whether `exc` was raised (its innermost frame) in communication code: its traceback's
    outer frames are the training loop and AccelPact's step, which every error passes through."""
    tb, frames = exc.__traceback__, 0
    if tb is None:
        return False
    while tb.tb_next is not None and frames < _MAX_FRAMES:
        tb, frames = tb.tb_next, frames + 1
    where = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return any(source in where for source in _COMM_SOURCES)


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from (``__cause__``, else ``__context__`` unless ``raise …
    from None`` suppressed it), outermost first: a suppressed context is what the raiser said is
    not the cause (`wait_unless` hides its poll's "Operation timed out!")."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(chain) < _MAX_CHAIN:
        chain.append(current)
        seen.add(id(current))
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__
    return chain


def classify_failure(
    exc: BaseException,
    *,
    retired_names: Iterable[str] = (),
    used_group_names: Iterable[str] = (),
    live_names: Iterable[str] = (),
) -> Classification:
    """Classify ``exc`` by the evidence in its whole chain.

    ``retired_names``: identities (`naming.group_identity`) of groups this process retired
    (``retired_group_names()``). The failure is RETIRED_COMMUNICATOR when c10d says the group is
    gone, when an error text names a retired group, when a frame of the traceback holds a retired
    group (``dist.all_reduce``'s ``group`` argument), or when ``used_group_names`` — the
    identities of the groups the failed step used, e.g. ``data_plane_groups(model)`` — include a
    retired one. The last is the only evidence for DDP, whose C++ reducer raises the bare gloo
    error. Identities, not c10d names: a successor keeps its predecessor's name, so a name cannot
    say whether the group that failed was the retired one or the live one. For the same reason a
    text is no evidence for a retired identity that is also a ``live_names`` entry (the name a
    group built by `make_group` passes on to its successors: NCCL's "PG GUID <name>(<identity>)"
    about the live successor names it).
    """
    chain = exception_chain(exc)
    texts = [_text(link) for link in chain]
    root = texts[-1]
    described = tuple(f"{type(link).__name__}: {text}" for link, text in zip(chain, texts))
    retired = {name for name in retired_names if name}
    if _retired_evidence(chain, texts, retired, used_group_names, frozenset(live_names)):
        return Classification(FailureCause.RETIRED_COMMUNICATOR, root, described)
    for link, text in zip(reversed(chain), reversed(texts)):
        cause = _transport_cause(link, text)
        if cause is not None:
            return Classification(cause, text, described)
    return Classification(FailureCause.OTHER, root, described)


def _retired_evidence(
    chain: list[BaseException], texts: list[str], retired: set[str], used_group_names: Iterable[str],
    live_names: frozenset[str],
) -> bool:
    if any(_matches(text, _RETIRED_PATTERNS) for text in texts):
        return True
    if not retired:
        return False
    if any(name in retired for name in used_group_names):
        return True
    if any(_names(text, name) for text in texts for name in retired - live_names):
        return True
    return any(name in retired for link in chain for name in _group_names_in_traceback(link))


def _names(text: str, name: str) -> bool:
    """Whether `text` names the group `name` itself: "accelpact:dp:g1" is not named by a text about
    the live "accelpact:dp:g12" (after ten recoveries every failure read as a retired one). c10d's
    own names are numbers ("1", "2"): no text is searched for them, or the "1" of "[10.0.0.1]:23456"
    in a live group's error read as the retired group "1" (the traceback's frames and the groups
    the step used still name it)."""
    if name.isdigit():
        return False
    return re.search(r"(?<![\w.@:/-])" + re.escape(name) + r"(?![\w.@-])", text) is not None


def _group_names_in_traceback(exc: BaseException) -> Iterable[str]:
    """Identities of process groups held by the locals of ``exc``'s frames (duck-typed, no torch)."""
    tb = exc.__traceback__
    frames = 0
    while tb is not None and frames < _MAX_FRAMES:
        for value in tb.tb_frame.f_locals.values():
            if "ProcessGroup" in type(value).__name__:
                yield group_identity(value)
        tb = tb.tb_next
        frames += 1


def _transport_cause(link: BaseException, text: str) -> FailureCause | None:
    if isinstance(link, TimeoutError) or _matches(text, _TIMEOUT_PATTERNS):
        return FailureCause.TIMEOUT
    if isinstance(link, ConnectionError) or _matches(text, _CLOSED_PATTERNS):
        return FailureCause.CONNECTION_CLOSED
    return None


def _matches(text: str, patterns: tuple[re.Pattern[str], ...]) -> bool:
    return any(pattern.search(text) for pattern in patterns)


def _text(exc: BaseException) -> str:
    text = str(exc)
    return text if text else repr(exc)
