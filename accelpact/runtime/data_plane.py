"""The data-plane groups of one protected model: who they are, how to probe them at a boundary,
how a failure in them is named, and which generation every cached reference names.

The groups are found in the model (`rebind.data_plane_groups`), named by what they are
(`GroupId`: label and member ranks, independent of c10d names and generations) and replaced in
place of the old ones once a recovery has rebuilt and rebound them."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..comm import _c10d, classify_failure, group_identity, is_communication_failure, retired_group_names
from ..comm.backends import backend_spec, parse_backends, probe_device, uses_nccl, wait_for
from ..errors import ConfigError, UnsupportedModelError
from ..fsm.decisions import GroupId
from ..rebind import data_plane_groups, discover
from .device_fence import DeviceFence
from .listeners import UpdateListener
from .standby import StandbyPool


class DataPlane:
    def __init__(self, model: nn.Module, *, timeout_s: float, extra: Sequence[object] = ()):
        self.model = model
        self.groups: dict[str, dist.ProcessGroup] = dict(data_plane_groups(model))
        if not self.groups:
            raise UnsupportedModelError(f"found no data-plane process group in {type(model).__name__}")
        self.gids = {label: GroupId(label, tuple(sorted(dist.get_process_group_ranks(pg))))
                     for label, pg in self.groups.items()}
        self.timeout_s = timeout_s
        #: the backends each group was built with: every replacement is built with the same ones
        self.backend_specs = {label: backend_spec(pg) or "gloo" for label, pg in self.groups.items()}
        #: agreed by every rank at attach (the control plane's token): replacement groups are
        #: named and keyed "<label>@<scope>", so that a second runtime in this process (attach after
        #: close, another model) never reuses a name or a store prefix of the first one's
        self.scope = ""
        self.extra = list(extra)  # optimizer, meshes: objects that may cache a group too
        self.plans: dict = {}  # label -> RebindPlan, discovered once
        self.ref_generation = {label: 0 for label in self.groups}  # what the references name
        self._probes: dict[str, torch.Tensor] = {}
        self._saved_timeouts: dict[str, datetime.timedelta | None] = {}
        #: under membership (spares, shrink): whether this world is being abandoned, so that a probe
        #: stops waiting for peers that already left (`comm.backends.wait_unless`)
        self.cut_short: Callable[[], bool] | None = None
        #: each group's successor, connected ahead of a failure (`Config.standby_groups`; set by attach)
        self.standby = StandbyPool()
        self.fence = DeviceFence()  # NCCL: the update's device work waited for at its boundary

    def refuse_default_group(self) -> None:
        """Replacing the default group would destroy it, and with it every group of the job."""
        for label, pg in self.groups.items():
            if _c10d.is_default_group(pg):
                raise ConfigError(
                    f"the model's {label!r} data-plane group is the default process group: AccelPact "
                    "replaces a failed data-plane group, and replacing the default group would tear down "
                    "every group of the job. Give the wrapper a group of its own, e.g. "
                    "DistributedDataParallel(model, process_group=dist.new_group(ranks)) or a DeviceMesh")

    def enforce_timeout(self) -> None:
        """Detection is bounded by the data-plane timeout (gloo cannot abort a collective), so
        every data-plane group gets it: a 30-minute default would mean 30 minutes. The previous
        timeouts are kept so that a failed attach can put them back (`restore_timeouts`)."""
        timeout = datetime.timedelta(seconds=self.timeout_s)
        for label, pg in self.groups.items():
            self._saved_timeouts.setdefault(label, _c10d.group_timeout(pg))
            _c10d.set_group_timeout(pg, timeout)

    def restore_timeouts(self) -> None:
        """The timeouts the groups had before attach (a failed attach; `rt.close()`: a replaced
        group's successor gets its predecessor's; a label a shrink dropped has no group left)."""
        for label, previous in self._saved_timeouts.items():
            if previous is not None and label in self.groups:
                _c10d.set_group_timeout(self.groups[label], previous)
        self._saved_timeouts.clear()

    def replacement_label(self, label: str) -> str:
        return f"{label}@{self.scope}" if self.scope else label

    def uses_nccl(self) -> bool:
        return any(uses_nccl(parse_backends(spec)) for spec in self.backend_specs.values())

    def nccl_groups(self) -> dict[str, dist.ProcessGroup]:
        """The groups NCCL serves (those a stuck device kernel can hang on: aborted, not waited)."""
        return {label: pg for label, pg in self.groups.items()
                if uses_nccl(parse_backends(self.backend_specs[label]))}

    def probe_timeout(self) -> datetime.timedelta:
        """How long an NCCL probe is waited for: just below the group timeout, so that the bounded
        wait (which aborts the communicator and raises) answers before c10d's watchdog does."""
        return datetime.timedelta(seconds=0.9 * self.timeout_s)

    def _probe(self, label: str) -> torch.Tensor:
        device = probe_device(parse_backends(self.backend_specs[label]), self.groups[label])
        probe = self._probes.get(label)
        if probe is None or probe.device != device:
            probe = self._probes[label] = torch.ones(1, dtype=torch.int64, device=device)
        return probe.fill_(1)

    def held(self) -> tuple[GroupId, ...]:
        return tuple(sorted(self.gids.values()))

    def prepare(self) -> tuple[dict[str, int], float]:
        """Discover the rebind plans (idempotent): references per label, seconds spent."""
        t = time.perf_counter()
        if not self.plans:
            self.plans = {label: discover(self.model, pg, extra=self.extra) for label, pg in self.groups.items()}
        return {label: len(plan) for label, plan in self.plans.items()}, time.perf_counter() - t

    def health_check(self, listeners: Sequence[UpdateListener] = ()) -> tuple[list[GroupId], list[str]]:
        """A tiny all-reduce on every data-plane group, all in flight at once, on the device each
        group serves; an NCCL probe is waited for at most `probe_timeout` (a bare ``wait()`` on NCCL
        only orders the stream: it would never notice a peer that skipped the probe; see
        `comm.backends.wait_for`). Returns the
        groups that failed and the classified cause of each."""
        labels = sorted(self.groups)
        for listener in listeners:
            labels = listener.probe_order(labels)
        works: list[tuple[str, object]] = []
        for label in labels:
            if not all(listener.before_probe(label) for listener in listeners):
                continue
            try:
                works.append((label, dist.all_reduce(self._probe(label), group=self.groups[label], async_op=True)))
            except Exception as exc:  # evidence, not an error: classified below with the others
                works.append((label, exc))
        failed: list[GroupId] = []
        causes: list[str] = []
        bound = self.probe_timeout()
        for label, work in works:
            try:
                if isinstance(work, Exception):
                    raise work
                wait_for(work, parse_backends(self.backend_specs[label]), bound, self.cut_short)
            except Exception as exc:  # any probe error marks the group failed; its cause is kept
                failed.append(self.gids[label])
                causes.append(f"{self.gids[label].key}: {self.diagnose(exc)[0]}")
        return failed, causes

    def diagnose(self, exc: BaseException) -> tuple[str, bool]:
        """The real cause of a failure as one line, and whether it is a communication failure
        (recoverable) rather than a bug, from one classification. An exception may name its own
        cause (`failure_cause`). The framework may still hold a retired group (rebinding off, or a
        missed reference); naming the groups it uses lets a bare gloo error from DDP's C++
        reducer, which names no group, be recognised as the retired communicator."""
        declared = getattr(exc, "failure_cause", None)
        if isinstance(declared, str):
            return declared, True
        try:
            used = [group_identity(pg) for pg in data_plane_groups(self.model).values()]
        except (RuntimeError, AttributeError, ValueError) as walk_error:  # never fail the recovery here
            used = []
            exc.add_note(f"accelpact: the model's groups could not be listed: {walk_error!r}")
        cls = classify_failure(exc, retired_names=retired_group_names(), used_group_names=used,
                               live_names=_c10d.registered_names())
        return f"{cls.cause.name.lower()}: {cls.message}", is_communication_failure(exc, cls)

    def install(self, label: str, group: dist.ProcessGroup, generation: int, *, rebound: bool) -> None:
        """The replacement of `label` is in use from now on (its references rebound or not)."""
        self.groups[label] = group
        if rebound:
            self.ref_generation[label] = generation
