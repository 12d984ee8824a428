"""Runtime settings. Every field can come from an ``ACCELPACT_<FIELD>`` environment variable so
that an existing trainer can be tuned without code changes (`attach` applies the environment on
top of the given config). Drill settings (fault plans) are not here: see `accelpact.faults`."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from dataclasses import dataclass, field, fields
from typing import Literal

from .errors import ConfigError

ENV_PREFIX = "ACCELPACT_"

#: ACCELPACT_* variables that are not Config fields: the drill's (accelpact.faults), the qualify
#: command's and the test and chaos harnesses' (ACCELPACT_TEST_SEED replays a random test;
#: ACCELPACT_WORLD_PACKAGE: `testing.spawn.PACKAGE_ENV`, set on every rank `run_world` starts).
#: Anything else is most likely a misspelling.
OTHER_VARIABLES = frozenset({"ACCELPACT_FAULTS", "ACCELPACT_FAULTS_EVERY_ATTEMPT", "ACCELPACT_ENVELOPE_DIR",
                             "ACCELPACT_TEST_ENV", "ACCELPACT_SECRET", "ACCELPACT_RDZV_ENDPOINT",
                             "ACCELPACT_WORLD_PACKAGE", "ACCELPACT_SPARE_PRELOAD", "ACCELPACT_TEST_SEED"})
OTHER_PREFIXES = ("ACCELPACT_CHAOS_",)

#: Timeouts are bounded: gloo counts milliseconds (1e-9 s would become 0, "no timeout"), and a
#: detection bound of more than a day is a typo, not a setting (inf overflows c10d's timedelta).
MIN_TIMEOUT_S = 0.01
MAX_TIMEOUT_S = 86_400.0
#: A timeout measured at attach instead of given (`accelpact.timeouts`, `runtime/calibrate.py`).
AUTO = "auto"
#: `Config.boundary`: when a committed boundary is agreed (`accelpact.fsm.deferral`).
BOUNDARY_MODES = ("sync", "deferred")
#: Where shard state that no replica holds is copied (`Config.replicate`).
REPLICATE_MODES = ("off", "neighbour")
#: Which data-plane groups keep a standby successor (`Config.standby_groups`, `runtime.standby`).
STANDBY_MODES = ("off", "gloo", "all")
#: What a lost rank no spare can take over leads to (`Config.on_loss`).
ON_LOSS_MODES = ("reject", "shrink")

log = logging.getLogger("accelpact.config")


@dataclass
class Config:
    #: Timeout of every data-plane group AccelPact builds, and the detection bound: gloo
    #: collectives cannot be aborted from another thread, so a failure is seen after this long.
    #: "auto" (the default): derived at attach from measured collective latencies
    #: (`accelpact.timeouts`), because a guessed bound is either slow to detect or spurious.
    data_timeout_s: float | Literal["auto"] = AUTO
    #: Timeout of the control plane. Must exceed the data timeout: the boundary check waits for
    #: peers that are themselves waiting out a data-plane timeout. "auto" (the default): derived
    #: at attach from the data timeout and the measured control-plane latency.
    control_timeout_s: float | Literal["auto"] = AUTO
    #: Per-rank JSON-lines traces and rejection evidence go here (None: no trace files).
    trace_dir: str | None = None
    #: Debug switch for the paper's causal ablation: replace groups but do not rebind references.
    rebind: bool = True
    #: Health-check each data-plane group at every boundary (a tiny all-reduce per group).
    health_check: bool = True
    #: "sync": every committed boundary is agreed before the next update starts (one control-plane
    #: all-reduce and the probes on the critical path). "deferred": inside `rt.step`, with Rewind
    #: qualified for forward and backward and no step_copy, a clean boundary posts its flag and is
    #: agreed before the next update's optimizer step; the probes are left out (a broken link is
    #: met, and rewound, in the next update). See `accelpact.fsm.deferral`.
    boundary: str = "sync"
    #: What a Reject does: "exit" ends the process with EXIT_REJECTED (for torchrun), "raise"
    #: raises RecoveryRejected (for embedding and tests).
    on_reject: str = "exit"
    #: Verified checkpoints (L2 fallback): directory, and save every K committed updates (0: never).
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    #: Checkpoint signing key (ACCELPACT_CHECKPOINT_KEY): COMMITTED then carries an HMAC of the
    #: manifest, and an unsigned or mis-signed step is refused before any file is unpickled.
    #: Without it, verification catches corruption, not tampering (see the README).
    checkpoint_key: str | None = field(default=None, repr=False)
    #: Newest verified checkpoints kept by retention.
    checkpoint_keep: int = 3
    #: Checkpoint saves that may fail in a row, each on every rank alike (a full disk), before the
    #: job fails stop; until then training goes on without them (`checkpoint.failed_saves`). 0:
    #: the first failed save fails stop.
    checkpoint_failures_tolerated: int = 3
    #: Restore the newest verified checkpoint at attach (when checkpoint_dir is set).
    restore: bool = True
    #: Run identity for checkpoints and attempt records (default: the run that wrote the newest step
    #: in checkpoint_dir, so that a job launched again goes on from it; else torchrun's
    #: TORCHELASTIC_RUN_ID). Given, a step written by another run is refused.
    run_id: str | None = None
    #: Restart budget enforced at attach: past it the job stops with a clear message.
    max_restarts: int = 3
    #: The qualified recovery envelope (`accelpact qualify` writes it): a JSON file path;
    #: None: the default path if it exists, else the built-in envelope (Preserve at committed
    #: boundaries only, no Rewind) with a message; "builtin": that envelope, silently;
    #: "permissive": every action allowed (the qualification probes themselves use it).
    envelope: str | None = None
    #: Keep a host copy of parameters and optimizer state before every optimizer.step(), so a
    #: failure during or after the step on some ranks (split tau) can still be rewound. Off by
    #: default: it costs one copy of the rank's shard per update (bench/rewind.py measures it).
    step_copy: bool = False
    #: How often one update may be rewound before the recovery rejects (fail-stop).
    max_rewinds_per_update: int = 3
    #: Hot spares launched beside the W active ranks (the launch's last S processes). Read by
    #: `accelpact.init_process_group` from ACCELPACT_SPARES (it must know before any group
    #: exists); here it is checked against the launch. With spares, `step_copy` is on: a rank lost
    #: after its peers' optimizer step is replaced by re-running that update from F.
    spares: int = 0
    #: How often each active rank's heartbeat reaches the store (a dead rank is known after about
    #: 2.5 beats, also one whose sockets never reset).
    heartbeat_s: float = 0.5
    #: Platform and resource profile of the recovery envelope key (None: detected).
    platform: str | None = None
    profile: str | None = None
    #: Prometheus metrics (`accelpact.observe.metrics`; needs prometheus_client): an HTTP
    #: endpoint on port `metrics_port + LOCAL_RANK` (one per rank of a host), and/or one text
    #: file per rank for node_exporter's textfile collector ("{rank}" in the path is replaced,
    #: else -rank<r> goes before the suffix). Spans follow the standard OTEL_* variables.
    metrics_port: int | None = None
    metrics_textfile: str | None = None
    #: The rolling window of the goodput ratio metric, in seconds.
    metrics_window_s: float = 300.0
    #: Straggler signal: a rank whose median update time over the last `straggler_window` clean
    #: boundaries exceeds this factor times its peers' median is named in a warning.
    straggler_factor: float = 2.0
    straggler_window: int = 20
    #: Hang watch: once an update phase has run this fraction of the data timeout, the stacks of
    #: every thread are taken (at most once per phase), so a timeout's evidence shows where the
    #: rank hung, not the recovery code it runs afterwards. 0 turns the watch off.
    hang_watch_fraction: float = 0.5
    #: Replica digest agreement (silent data corruption): every K commits the holders of each shard
    #: compare SHA-256 digests of their parameters and optimizer state; a minority is repaired from
    #: the majority, two holders that differ fail-stop (`accelpact.integrity`). 0 (the default): off.
    digest_every: int = 0
    #: Neighbour-memory replication (`accelpact.membership.neighbour`): "neighbour" sends each
    #: rank's shard state that no replica holds (parameters, buffers, optimizer state) to a ring
    #: neighbour's host memory after every optimizer step, off the critical path, so that a spare
    #: can take over a fully sharded rank. Needs spares. "off" (the default): replicas only.
    replicate: str = "off"
    #: The ring's stride: rank r's copy goes to rank (r + stride) mod W. 0 (the default): the
    #: ranks of one host (LOCAL_WORLD_SIZE) when the world spans several hosts, else 1, so that a
    #: copy never shares its rank's node (the blast radius one lost node may take).
    replicate_stride: int = 0
    #: A lost rank that no spare can take over: "reject" (the default) fail-stops to the last
    #: verified checkpoint; "shrink" (opt-in: it changes the experiment) lets the replica groups
    #: that are still whole go on without the lost rank's replica group, with the gradient average,
    #: the data partition and the effective batch following the smaller world
    #: (`accelpact.membership.shrink`). Read by `accelpact.init_process_group` from
    #: ACCELPACT_ON_LOSS, like the spares: every rank must watch its peers from the start.
    on_loss: str = "reject"
    #: Standby successors (`accelpact.runtime.standby`): each data-plane group's members keep a
    #: second group over the same ranks connected and idle, so that a repair adopts it instead of
    #: building one (the largest part of a repair that grows with the group). Built at attach and
    #: again after each recovery that used it, off the repair's path. "gloo" (the default): for
    #: groups without NCCL; "all": NCCL groups too (each standby is one more communicator, with
    #: its device buffers); "off": every replacement is built during the repair.
    standby_groups: str = "gloo"
    #: A rank that saw a failure probes its control-plane peers' hosts with fresh TCP connections
    #: this often (seconds) and sends its boundary check once each answered: a check sent into a
    #: cut link waits for TCP's next retransmission after the link returns (up to 1 s), a fresh
    #: connection gets through at once (`runtime.link_wait`). 0: send at once, as before.
    link_probe_s: float = 0.01

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> Config:
        self._check_types()
        if self.checkpoint_key is not None and not self.checkpoint_key:
            raise ConfigError("checkpoint_key is empty: an empty secret would sign nothing (unset it to write "
                              "unsigned checkpoints)")
        if self.spares < 0:
            raise ConfigError(f"spares must be >= 0, got {self.spares}")
        if not 0.01 <= self.heartbeat_s <= 60:
            raise ConfigError(f"heartbeat_s must be in [0.01, 60] seconds, got {self.heartbeat_s!r}")
        for name in ("data_timeout_s", "control_timeout_s"):
            value = getattr(self, name)
            if value != AUTO and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S):
                raise ConfigError(f"{name} must be a number of seconds in [{MIN_TIMEOUT_S}, {MAX_TIMEOUT_S:g}] "
                                  f"or {AUTO!r}, got {value!r}")
        # with "auto", an explicit one is checked against the derived one at attach (accelpact.timeouts)
        if not self.calibrates and not self.control_timeout_s > self.data_timeout_s:  # type: ignore[operator]
            raise ConfigError(
                f"control_timeout_s ({self.control_timeout_s}) must exceed data_timeout_s "
                f"({self.data_timeout_s}): the control plane waits out data-plane timeouts"
            )
        if not (isinstance(self.link_probe_s, (int, float)) and not isinstance(self.link_probe_s, bool)
                and 0 <= self.link_probe_s <= 1):
            raise ConfigError(f"link_probe_s must be a number of seconds in [0, 1] (0: no probing), "
                              f"got {self.link_probe_s!r}")
        if self.boundary not in BOUNDARY_MODES:
            raise ConfigError(f"boundary must be one of {', '.join(BOUNDARY_MODES)}, got {self.boundary!r}")
        if self.on_reject not in ("exit", "raise"):
            raise ConfigError(f"on_reject must be 'exit' or 'raise', got {self.on_reject!r}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ConfigError("checkpoint_every is set but checkpoint_dir is not")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"checkpoint_keep must be >= 1, got {self.checkpoint_keep}")
        if self.checkpoint_failures_tolerated < 0:
            raise ConfigError(f"checkpoint_failures_tolerated must be >= 0, got {self.checkpoint_failures_tolerated}")
        if self.max_rewinds_per_update < 0:
            raise ConfigError(f"max_rewinds_per_update must be >= 0, got {self.max_rewinds_per_update}")
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be a TCP port (the base; each rank adds its local rank), "
                              f"got {self.metrics_port}")
        if not self.metrics_window_s > 0:
            raise ConfigError(f"metrics_window_s must be positive, got {self.metrics_window_s}")
        if not (isinstance(self.straggler_factor, (int, float)) and self.straggler_factor > 1):
            raise ConfigError(f"straggler_factor must be a number > 1 (times the peers' median update time), "
                              f"got {self.straggler_factor!r}")
        if not (isinstance(self.hang_watch_fraction, (int, float)) and 0 <= self.hang_watch_fraction < 1):
            raise ConfigError(f"hang_watch_fraction must be in [0, 1) (of the data timeout: the stacks must be taken "
                              f"before the timeout ends the hang; 0: off), got {self.hang_watch_fraction!r}")
        if not (isinstance(self.straggler_window, int) and self.straggler_window >= 1):
            raise ConfigError(f"straggler_window must be an integer >= 1 (boundaries), got {self.straggler_window!r}")
        if not (isinstance(self.digest_every, int) and not isinstance(self.digest_every, bool)
                and self.digest_every >= 0):
            raise ConfigError(f"digest_every must be an integer >= 0 (commits between replica digest checks; "
                              f"0: off), got {self.digest_every!r}")
        if self.replicate not in REPLICATE_MODES:
            raise ConfigError(f"replicate must be one of {', '.join(REPLICATE_MODES)}, got {self.replicate!r}")
        if self.standby_groups not in STANDBY_MODES:
            raise ConfigError(f"standby_groups must be one of {', '.join(STANDBY_MODES)}, got {self.standby_groups!r}")
        if self.on_loss not in ON_LOSS_MODES:
            raise ConfigError(f"on_loss must be one of {', '.join(ON_LOSS_MODES)}, got {self.on_loss!r}")
        if not (isinstance(self.replicate_stride, int) and not isinstance(self.replicate_stride, bool)
                and self.replicate_stride >= 0):
            raise ConfigError(f"replicate_stride must be an integer >= 0 (ranks between a rank and the holder of "
                              f"its copy; 0: one host's worth), got {self.replicate_stride!r}")
        return self

    def _check_types(self) -> None:
        """Each field's value is of its declared type: `restore="false"` is a true string, and
        `spares="2"` would fail later with a bare TypeError far from the setting that caused it.
        Paths may be `os.PathLike`, the checkpoint key bytes; a float field takes an int (its range,
        NaN included, is each field's own check below); nothing takes a bool but a bool."""
        for f in fields(self):
            value = getattr(self, f.name)
            kinds = [k.strip() for k in str(f.type).split("|")]
            if (value is None and "None" in kinds) or (value == AUTO and any(k.startswith("Literal") for k in kinds)):
                continue
            if "bool" in kinds:
                ok, want = isinstance(value, bool), "True or False"
            elif "int" in kinds:
                ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
            elif "float" in kinds:
                ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
            else:
                ok, want = isinstance(value, (str, bytes, os.PathLike)), "a string"
            if not ok:
                raise ConfigError(f"{f.name} must be {want}" + (" or None" if "None" in kinds else "")
                                  + (f" or {AUTO!r}" if any(k.startswith("Literal") for k in kinds) else "")
                                  + f", got {value!r} ({type(value).__name__})")

    @property
    def calibrates(self) -> bool:
        """Whether attach measures collective latencies to derive a timeout ("auto")."""
        return AUTO in (self.data_timeout_s, self.control_timeout_s)

    def with_env(self, env: dict[str, str] | None = None) -> Config:
        """This config with environment overrides applied on top (used by `attach`)."""
        env = dict(os.environ if env is None else env)
        warn_unknown_variables(env)
        over = {}
        for f in fields(self):
            key = ENV_PREFIX + f.name.upper()
            if key in env:
                over[f.name] = _coerce(type(self), f.name, env[key], key)
        return dataclasses.replace(self, **over) if over else self


def known_variables() -> frozenset[str]:
    return frozenset(ENV_PREFIX + f.name.upper() for f in fields(Config)) | OTHER_VARIABLES


def unknown_variables(env: dict[str, str]) -> list[tuple[str, str | None]]:
    """(name, closest valid name or None) for each ACCELPACT_* variable nothing reads."""
    known = known_variables()
    out = []
    for key in sorted(env):
        if key.startswith(ENV_PREFIX) and key not in known and not key.startswith(OTHER_PREFIXES):
            names = {name[len(ENV_PREFIX):]: name for name in known}  # compare what follows the prefix
            close = difflib.get_close_matches(key[len(ENV_PREFIX):], sorted(names), n=1, cutoff=0.6)
            out.append((key, names[close[0]] if close else None))
    return out


def warn_unknown_variables(env: dict[str, str]) -> None:
    """A misspelled variable is otherwise silently ignored (a drill would run with no faults)."""
    for key, close in unknown_variables(env):
        hint = f"; did you mean {close}?" if close else f"; valid names: {', '.join(sorted(known_variables()))}"
        log.warning("%s is not an AccelPact setting and is ignored%s", key, hint)


def _coerce(cls, name: str, raw: str, key: str):
    f = {f.name: f for f in fields(cls)}[name]
    typ = str(f.type)
    try:
        if typ.startswith("bool"):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if "Literal" in typ and raw.strip().lower() == AUTO:
            return AUTO
        # empty is unset for every optional setting, numbers too (found by review: an empty
        # ACCELPACT_METRICS_PORT was "not an integer"); an empty key is refused
        if "None" in typ and raw.strip() == "" and name != "checkpoint_key":
            return None
        if typ.startswith("float"):
            return float(raw)
        if typ.startswith("int"):
            return int(raw)
        return raw
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r}: {exc}") from None
