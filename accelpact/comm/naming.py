"""How a group is named to c10d, and how AccelPact tells its generations apart.

A replacement keeps the name of the group it succeeds. Why: everything that found the group by
name keeps finding it without being told. Dynamo guards a compiled region that issues
collectives on a mesh on the mesh's group names (``G['mesh']._dim_group_names[0] == '1'``). A new
name per generation made every such region recompile after every recovery, and after
``recompile_limit`` (8) recoveries run eagerly for the rest of the job. Functional collectives,
DeviceMesh's ``get_group`` and c10d's registry resolve the kept name to the successor at their
next call.

A name then no longer says *which* generation a group object is. The generation's identity,
``accelpact:<label>:g<n>``, is the group's description (``group_desc``, which c10d uses only in
logs): a retired group and its successor share a name, never an identity. Whatever must tell
them apart (the retired-group ledger and the failure classifier, a group's recorded connections)
reads the identity; whatever must find the live group reads the name.

Pure string logic: no torch import (the classifier, which is pure, reads identities too).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["group_identity", "group_name", "parse_group_name", "store_prefix"]


def group_name(label: str, generation: int) -> str:
    """The identity of the group ``label`` at ``generation``; also the registered name of a group
    AccelPact builds from nothing (`make_group`), which its successors then keep."""
    return f"accelpact:{label}:g{generation}"


def parse_group_name(name: str) -> tuple[str, int] | None:
    """``(label, generation)`` of a name made by ``group_name``; None for other groups' names."""
    prefix, _, rest = name.partition(":")
    label, _, generation = rest.rpartition(":g")
    if prefix != "accelpact" or not label or not generation.isdigit():
        return None
    return label, int(generation)


def group_identity(group: object) -> str:
    """Which generation ``group`` is: its description when AccelPact built that generation
    (``accelpact:<label>:g<n>``), else its c10d name (a group the job made, never replaced).
    Duck-typed, so that pure code can read it from a frame's locals."""
    desc = getattr(group, "group_desc", None)
    if isinstance(desc, str) and parse_group_name(desc) is not None:
        return desc
    name = getattr(group, "group_name", None)
    return name if isinstance(name, str) else repr(group)


def store_prefix(label: str, generation: int, ranks: Sequence[int]) -> str:
    """World-unique store prefix: label, generation and the member list."""
    return f"accelpact/{label}/g{generation}/{'.'.join(str(r) for r in ranks)}/"
