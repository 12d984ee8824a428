"""FSDP1 (``FullyShardedDataParallel``) references, HYBRID_SHARD in particular (torch 2.13).

Per FSDP instance (L blocks + root = L+1 instances):

* inter-node (replicate) group: ``_inter_node_pg`` and ``_inter_node_state.process_group`` (a
  ``DefaultState`` comm-hook state, a ``__slots__`` object): **2·(L+1)** references;
* intra-node (shard) group: ``process_group``, the ``FlatParamHandle``'s ``process_group`` and the
  shared ``_exec_order_data.process_group`` (set at lazy init): 2·(L+1)+1 references;
* with a DeviceMesh, one more in the mesh's ``_pg_registry`` plus its name table (``mesh`` rule);
* a user comm hook's state (``_comm_hook_state``) when one is registered.

The optimizer holds none. ``_exec_order_data`` gets its group at lazy initialisation, so a plan
made before the first forward would miss it: discovery refuses until FSDP is initialised.
"""

from __future__ import annotations

from torch.distributed.fsdp import FullyShardedDataParallel

from accelpact.rebind.errors import NotReadyError
from accelpact.rebind.rule import RuleContext

__all__ = ["FSDP1Rule"]

_INSTANCE_ATTRIBUTES = {
    "_inter_node_pg": "fsdp1.inter_node_pg",
    "process_group": "fsdp1.process_group",
}
_NESTED_ATTRIBUTES = {
    # (attribute of the FSDP instance, attribute of that object) -> kind
    ("_inter_node_state", "process_group"): "fsdp1.inter_node_state",
    ("_comm_hook_state", "process_group"): "fsdp1.comm_hook_state",
    ("_handle", "process_group"): "fsdp1.handle",
    ("_exec_order_data", "process_group"): "fsdp1.exec_order",
}


class FSDP1Rule:
    name = "fsdp1"
    watch = {"fsdp1": (FullyShardedDataParallel,)}

    def apply(self, ctx: RuleContext) -> None:
        instances = ctx.watched("fsdp1")
        for fsdp, path in instances:
            if getattr(fsdp, "_is_root", None) is None:
                raise NotReadyError(
                    f"FSDP1 unit {path or '<root>'} is not lazily initialised yet (it sets "
                    "_exec_order_data.process_group in its first forward): discover after the first update"
                )
            self._label(ctx, fsdp, path)

    @staticmethod
    def _label(ctx: RuleContext, fsdp: FullyShardedDataParallel, path: str) -> None:
        target = ctx.target
        attributes = fsdp.__dict__
        for attribute, kind in _INSTANCE_ATTRIBUTES.items():
            if attributes.get(attribute) is target:
                ctx.expect(
                    ctx.label(attributes, attribute, kind) is not None,
                    f"{path}.{attribute} holds the group but the walk did not report it",
                )
        for (attribute, inner), kind in _NESTED_ATTRIBUTES.items():
            holder = attributes.get(attribute)
            if holder is not None and getattr(holder, inner, None) is target:
                site = ctx.label(holder, inner, kind) or ctx.label(getattr(holder, "__dict__", {}), inner, kind)
                ctx.expect(site is not None, f"{path}.{attribute}.{inner} holds the group but the walk "
                                             "did not report it")
        if attributes.get("_inter_node_pg") is target:
            # HYBRID_SHARD keeps the inter-node group twice; both must be there or the model is wrong
            state = attributes.get("_inter_node_state")
            ctx.expect(
                state is not None and getattr(state, "process_group", None) is target,
                f"{path or '<root>'}: _inter_node_pg is the group but _inter_node_state.process_group is "
                "not (FSDP1 internals changed?)",
            )
