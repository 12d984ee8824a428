"""DDP references (torch 2.13): the Python ``process_group`` and the C++ reducer's own copy.

Setting ``ddp.process_group`` alone is not enough, the reducer keeps its group in C++ with no
getter. The cheapest working route is the private ``DistributedDataParallel._update_process_group``
(resets the reducer, which rebuilds its buckets on the next backward; ~0.1 ms). It does not touch
comm-hook state: a hook state *object* holding the group is found by the generic walk and
rebound in place (the C++ side shares that Python object); a hook whose state *is* the group
sits in a tuple in ``_comm_hooks`` and is refused as unwritable. A *built-in* (C++) hook
(``_register_builtin_comm_hook``) copies the group into C++ at registration, out of reach of
``_update_process_group`` and of every getter: it would keep all-reducing on the retired group
behind a passing proof, so it is refused at discovery, by the name DDP's logger recorded for it.

The reducer is a C++ object: the proof can only check that the last rebind call bound the current
group to this very reducer; the validation collective checks the wire.
"""

from __future__ import annotations

from torch._C._distributed_c10d import BuiltinCommHookType, Logger, Reducer
from torch.nn.parallel import DistributedDataParallel

from accelpact.rebind.rule import RuleContext
from accelpact.rebind.sites import Access, Site

__all__ = ["DDPRule", "builtin_comm_hook"]

#: how ``_register_builtin_comm_hook`` names its hook in DDP's logging data (``str`` of the enum)
_BUILTIN_HOOK_NAMES = frozenset(str(hook) for hook in BuiltinCommHookType.__members__.values())


def builtin_comm_hook(ddp: DistributedDataParallel) -> str | None:
    """The built-in (C++) comm hook registered on ``ddp``, or None: only the logger remembers it."""
    if getattr(ddp, "logger", None) is None:
        return None
    name = ddp._get_ddp_logging_data().get("comm_hook")
    return name if name in _BUILTIN_HOOK_NAMES else None


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
            hook = builtin_comm_hook(ddp)
            ctx.expect(hook is None,
                       f"{path or '<root>'}: the built-in comm hook {hook} keeps its own C++ copy of the group, "
                       "which no call rebinds; register a Python hook instead (register_comm_hook, e.g. "
                       "default_hooks.allreduce_hook on state.process_group) whose state is an object holding "
                       "the group (a bare group as state sits in a tuple and is refused), or no hook at all")
            ctx.add(Site(f"{path}.reducer" if path else "reducer", "ddp.reducer", Access.CALL, ddp.reducer,
                         call=ddp._update_process_group, bound=ctx.target))
