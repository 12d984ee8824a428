"""Standby communicators: a group's successor, connected before it is needed.

Why: building the replacement is the part of a repair that grows with the group. gloo connects a
full mesh in the constructor (3-4 ms at 4 ranks, 8-10 ms at 8 on this machine; the largest phase of
a Preserve), and NCCL initialises a communicator (hundreds of ms to seconds at scale). A standby is
built by a group's members while nothing fails, so that a recovery only renames and registers it.

A standby is built under a name and a store prefix of its own (``accelpact:L:s<token>``,
``accelpact/L/s<token>/r0.r1…/``), is *not* registered with c10d (nothing can resolve or use it,
and a failure that retires the live group does not touch it), and keeps its connections idle.
`Standby.adopt` turns it into exactly what `lifecycle.replace_group` would have built at that
generation: the retired group's name, the generation's identity, the same c10d tables, the
data-plane timeout.

Every member must adopt the same standby or none: members that adopt and members that build
afresh would wait for each other's connections until the timeout. Which groups come from a
standby is therefore agreed (`fsm.decisions.agreed_standbys`, on the token each member reports),
not decided here. A standby whose connections a peer closed while it waited is dropped before it
is reported (`connections.intact`); what that cannot see is caught by the validation all-reduce
that follows every replacement, like a replacement that failed to build.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroup, Store

from accelpact.comm import _c10d, connections
from accelpact.comm.backends import parse_backends, uses_nccl
from accelpact.comm.lifecycle import (
    MembershipError,
    as_timedelta,
    connect,
    normalise_ranks,
    require_member,
)

__all__ = ["Standby", "build_standby", "standby_name", "standby_prefix"]


def standby_name(label: str, token: int) -> str:
    """Name of a standby until it is adopted (never registered with c10d)."""
    return f"accelpact:{label}:s{token}"


def standby_prefix(label: str, token: int, ranks: Sequence[int]) -> str:
    """World-unique store prefix of a standby: apart from every generation's (``g<g>``) keys."""
    return f"accelpact/{label}/s{token}/{'.'.join(str(r) for r in ranks)}/"


@dataclass
class Standby:
    """A connected, unregistered group over `ranks`, waiting to succeed the group `label`."""

    pg: ProcessGroup
    label: str
    token: int
    ranks: tuple[int, ...]
    backend: str
    store: PrefixStore
    device: torch.device | None = None  # the device it is bound to: its successor's must match

    def adopt(self, *, ranks: Sequence[int], name: str, identity: str,
              timeout: datetime.timedelta | float) -> ProcessGroup:
        """Become the successor `replace_group` would have built: registered with c10d under the
        retired group's ``name``, described by the generation's ``identity`` (both checked
        free by `replace_group`), with the data-plane ``timeout``."""
        members = normalise_ranks(ranks)
        if list(self.ranks) != members:
            raise MembershipError(f"standby {standby_name(self.label, self.token)} connects {list(self.ranks)}, "
                                  f"the group to replace has {members}")
        if _c10d.name_is_taken(name):
            raise ValueError(f"standby {standby_name(self.label, self.token)} cannot take the name {name!r}: "
                             "a live group has it")
        self.pg._set_group_name(name)
        self.pg._set_group_desc(identity)
        for backend in _c10d.group_backends(self.pg):  # as a built successor's (found by review: the
            options = getattr(backend, "options", None)  # backend kept the standby's name in its logs)
            if options is not None and hasattr(options, "group_name"):
                options.group_name = name
        connections.renamed(self.pg, identity)
        _c10d.register_group(self.pg, name=name, ranks=members, store=self.store, backend=self.backend)
        _c10d.set_group_timeout(self.pg, as_timedelta(timeout))
        return self.pg

    def discard(self) -> None:
        """Close a standby that will not be adopted (never registered: nothing else holds it). An
        NCCL one is aborted, never shut down: a graceful shutdown finalises the communicator with
        its peers, and a membership change discards standbys that span a dead one (`lifecycle`'s
        rule: abort, never destroy)."""
        if uses_nccl(parse_backends(self.backend)):
            self.pg.abort()
        else:
            self.pg.shutdown()


def build_standby(
    ranks: Sequence[int],
    *,
    label: str,
    token: int,
    timeout: datetime.timedelta | float,
    backend: str,
    store: Store | None = None,
    device: torch.device | None = None,
) -> Standby:
    """Connect a standby for the group ``label`` over ``ranks``; called by every member, with the
    same ``token`` (two standbys of one label never share store keys), bound to ``device`` as the
    group it will succeed is (`lifecycle.replace_group` refuses a standby bound otherwise). Blocks
    until every member has arrived, for at most ``timeout``; raises what the backend raises when
    one does not."""
    members = normalise_ranks(ranks)
    require_member(members, "build a standby")
    name = standby_name(label, token)
    pg, prefix = connect(members, name=name, identity=name, prefix=standby_prefix(label, token, members),
                         timeout=timeout, store=store, backend=backend, device=device)
    return Standby(pg, label, token, tuple(members), backend, prefix, device)
