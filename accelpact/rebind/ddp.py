"""DDP references (torch 2.13): the Python ``process_group`` and the C++ reducer's own copy.

Setting ``ddp.process_group`` alone is not enough, the reducer keeps its group in C++ with no
getter. The cheapest working route is the private ``DistributedDataParallel._update_process_group``
(resets the reducer, which rebuilds its buckets on the next backward; ~0.1 ms). It does not touch
comm-hook state: a hook state *object* holding the group is found by the generic walk and
rebound in place (the C++ side shares that Python object); a hook whose state *is* the group
sits in a tuple in ``_comm_hooks`` and is refused as unwritable.

The reducer is a C++ object: the proof can only check that the last rebind call bound the current
group to this very reducer; the validation collective checks the wire.
"""

from __future__ import annotations

from torch._C._distributed_c10d import Logger, Reducer
from torch.nn.parallel import DistributedDataParallel

from accelpact.rebind.rule import RuleContext
from accelpact.rebind.sites import Access, Site

__all__ = ["DDPRule"]


class DDPRule:
    name = "ddp"
    watch = {"ddp": (DistributedDataParallel,)}

    def apply(self, ctx: RuleContext) -> None:
        for ddp, path in ctx.watched("ddp"):
            for internal in (getattr(ddp, "reducer", None), getattr(ddp, "logger", None)):
                if isinstance(internal, Reducer | Logger):
                    ctx.claim_opaque(internal)
            if ddp.__dict__.get("process_group") is not ctx.target:
                continue
            ctx.expect(ctx.label(ddp.__dict__, "process_group", "ddp.process_group") is not None,
                       f"{path}.process_group holds the group but the walk did not report it")
            ctx.expect(isinstance(getattr(ddp, "reducer", None), Reducer),
                       f"{path} has no C++ reducer (DDP internals changed?)")
            ctx.add(Site(f"{path}.reducer" if path else "reducer", "ddp.reducer", Access.CALL, ddp.reducer,
                         call=ddp._update_process_group, bound=ctx.target))
