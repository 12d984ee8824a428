"""The standby successors a rank holds for its data-plane groups (`comm.standby`): when they are
built, which groups get one, and what a rank reports of them to agreement.

When: at attach, for every group (after the line-up, every rank at the same point); after a
recovery, for each group it replaced (its members leave the recovery together); after a
membership change, for every group of the new world. Never on the way into a recovery: a repair
only adopts. The token is the generation at which the standby was built, so every member of a
group builds it under the same token, and no two standbys of one label share store keys.

Order: each rank builds its groups' standbys in label order. Every rank uses that one order, so
ranks that share several groups never wait on each other in a cycle (each build waits for all of
its members).

A failed build costs that standby and the ones this rank would have built after it in the same
fill: they are logged with their cause, and those groups' next replacements are built afresh (the
members' tokens then differ, and `agreed_standbys` sees it). Why the rest too: a build that failed
waited out the data timeout, so this rank comes late to every later build and each would wait out
its own (one timeout per group while its peers train on and time out on it); skipping them, every
rank is held up by at most one timeout, and its peers in the skipped groups fail theirs alike.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from torch.distributed import ProcessGroup

from ..comm import connections
from ..comm.backends import parse_backends, uses_nccl
from ..comm.standby import Standby, build_standby
from ..config import STANDBY_MODES
from ..fsm.phases import RecoveryAction

if TYPE_CHECKING:
    from ..fsm.driver import RecoveryOutcome
    from .data_plane import DataPlane

log = logging.getLogger("accelpact.standby")

def covers(mode: str, backend: str) -> bool:
    """Whether `mode` gives a group served by `backend` a standby. "gloo" (the default) leaves
    NCCL groups out: a standby communicator holds its own device buffers, so doubling every NCCL
    communicator is the user's call ("all")."""
    if mode == "off":
        return False
    return mode == "all" or not uses_nccl(parse_backends(backend))


class StandbyPool:
    """At most one standby per data-plane label, with the token it was built under."""

    def __init__(self, mode: str = "off"):
        if mode not in STANDBY_MODES:
            raise ValueError(f"standby mode must be one of {', '.join(STANDBY_MODES)}, got {mode!r}")
        self.mode = mode
        self._held: dict[str, Standby] = {}
        #: label -> why its last build failed (cleared by the next successful one)
        self.failures: dict[str, str] = {}

    def tokens(self) -> tuple[tuple[str, int], ...]:
        """(label, token) of each standby held and still connected: what this rank reports to
        agreement. One whose connections a peer closed while it waited (`connections.intact`) is
        dropped here, before anyone could adopt it: the group is then built afresh, where adopting
        it would have failed the validation and rejected the recovery."""
        for label, sb in sorted(self._held.items()):
            if not connections.intact(sb.pg):
                self.failures[label] = f"the standby's connections closed while it waited (token {sb.token})"
                log.warning("accelpact dropped a standby whose connections closed; the group is built afresh",
                            extra={"label": label, "token": sb.token})
                self.drop(label)
        return tuple(sorted((label, sb.token) for label, sb in self._held.items()))

    def groups(self) -> dict[str, ProcessGroup]:
        """The standby groups held, by label (evidence, drills)."""
        return {label: sb.pg for label, sb in self._held.items()}

    def take(self, label: str, token: int) -> Standby | None:
        """The standby of `label` built under `token`, handed over (None if this rank has none)."""
        held = self._held.get(label)
        if held is None or held.token != token:
            return None
        del self._held[label]
        return held

    def fill(self, plane: DataPlane, labels: Iterable[str], token: int) -> float:
        """Build a standby under `token` for each of `labels` this mode covers (an older one of the
        label is closed first); returns the seconds spent. Collective over each group's members."""
        t0 = time.perf_counter()
        timeout = datetime.timedelta(seconds=plane.timeout_s)
        failed: str | None = None
        for label in sorted(set(labels)):
            if not covers(self.mode, plane.backend_specs[label]):
                continue
            self.drop(label)
            gid = plane.gids[label]
            if failed is not None:  # see `skipped`
                self.failures[label] = f"not built: the standby of {failed} failed before it"
                continue
            try:
                self._held[label] = build_standby(gid.ranks, label=plane.replacement_label(label), token=token,
                                                  timeout=timeout, backend=plane.backend_specs[label],
                                                  device=plane.groups[label].bound_device_id)
            except RuntimeError as exc:  # c10d's DistError family and gloo's connect errors
                self.failures[label] = f"{type(exc).__name__}: {exc}"
                failed = label
                log.warning("accelpact could not build a standby; the next replacement of this group and of the "
                            "groups after it in this fill is built afresh",
                            extra={"group": gid.key, "token": token, "cause": self.failures[label]})
                continue
            self.failures.pop(label, None)
        return time.perf_counter() - t0

    def after_recovery(self, plane: DataPlane, rank: int, outcome: RecoveryOutcome) -> float:
        """After a recovery released: replenish the standbys of the groups it replaced on this rank
        (adopted or built afresh: an unused standby of such a group may not match its peers' any
        more), under the generation it ended at. Nothing after a Reject."""
        if outcome.decision is None or outcome.action is RecoveryAction.REJECT or self.mode == "off":
            return 0.0
        mine = [g.label for g in outcome.decision.failed_groups if rank in g.ranks]
        return self.fill(plane, mine, outcome.generation) if mine else 0.0

    def drop(self, label: str) -> None:
        held = self._held.pop(label, None)
        if held is not None:
            held.discard()

    def clear(self) -> None:
        """Close every standby (the world is left, or the runtime closes)."""
        for label in list(self._held):
            self.drop(label)
