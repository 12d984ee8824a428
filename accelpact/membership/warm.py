"""A warm spare: pay the framework's import costs while waiting, not after being claimed.

Why: a claimed spare runs the trainer's script from `init_process_group` on, and the first
``fully_shard`` / DTensor / DeviceMesh use imports half of torch.distributed (measured: an FSDP2
model of 2 blocks built in 1.40 s cold, 0.09 s once these modules were imported; the imports
themselves 1.26 s). Every second of that sat between the membership decision and the spare's
join, with every survivor waiting. A spare has nothing else to do, so it imports them (and any
module named in ``ACCELPACT_SPARE_PRELOAD``, e.g. the trainer's model package) on a thread of its
own while it waits for a claim; Python's import locks make a script that imports the same module
meanwhile wait for that one import, never run it twice.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence

from ..errors import ConfigError

log = logging.getLogger("accelpact.membership")

#: ACCELPACT_SPARE_PRELOAD=pkg.a,pkg.b: more modules a waiting spare imports (the trainer's own).
ENV_PRELOAD = "ACCELPACT_SPARE_PRELOAD"

#: What a trainer's first FSDP/DDP wrapping and `attach` import lazily (torch 2.13), heaviest first.
FRAMEWORK_MODULES: tuple[str, ...] = (
    "torch._dynamo",
    "torch.distributed.tensor",
    "torch.distributed.device_mesh",
    "torch.distributed.fsdp",
    "torch.distributed.fsdp._fully_shard",
    "torch.nn.parallel",
    "torch.distributed.checkpoint",
    "accelpact.runtime",  # attach's own modules (imported lazily by `accelpact.attach`): 0.35 s measured
)


def modules_to_preload(env: Mapping[str, str]) -> tuple[str, ...]:
    """The framework's modules, then the ones ``ACCELPACT_SPARE_PRELOAD`` names (checked here, so
    that a typo is a clear error at launch rather than a silently cold spare)."""
    extra = tuple(name.strip() for name in env.get(ENV_PRELOAD, "").split(",") if name.strip())
    bad = [name for name in extra if not all(part.isidentifier() for part in name.split("."))]
    if bad:
        raise ConfigError(f"{ENV_PRELOAD} names {bad}, which are not module names (comma-separated "
                          "dotted names, e.g. mypkg.model)")
    return FRAMEWORK_MODULES + extra


def preload(modules: Sequence[str]) -> dict[str, float | str]:
    """Import each module; seconds per module, or the error's text for one that failed (a
    framework module missing in this torch is not fatal: the script would import it cold)."""
    took: dict[str, float | str] = {}
    for name in modules:
        t0 = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported with its cause; the spare still works
            took[name] = f"{type(exc).__name__}: {exc}"
            log.warning("a waiting spare could not preload %s: %s: %s", name, type(exc).__name__, exc)
            continue
        took[name] = time.perf_counter() - t0
    log.info("spare preloaded", extra={"modules": took})
    return took


def warm_up_in_background(modules: Sequence[str]) -> threading.Thread:
    """Start preloading on a daemon thread (the spare keeps heartbeating on its main thread)."""
    thread = threading.Thread(target=preload, args=(modules,), name="accelpact-spare-warm-up", daemon=True)
    thread.start()
    return thread
