"""Timeouts derived from measurement. Pure: no torch, no clock.

The data-plane timeout D is the failure-detection bound (gloo cannot abort a collective, so a lost
peer is noticed only when the collective times out): too long and every fault costs that long,
too short and a healthy but slow collective turns into a spurious recovery. So it is derived from
measured collective latencies: a high quantile times a safety factor, never below a floor. The
floor is there because a warm-up measures transfers, not the skew between ranks that real updates
add, nor the scheduling hiccups of a loaded host.

The control-plane timeout C must be strictly above D with a margin, because the control plane
waits out data-plane timeouts: a rank reaches the boundary check after its update's collective
timed out (one D), its peers after the health check's probe timed out (a second D, in the worst
case after the first), and a recovery's guard may wait out a third. Hence C = ratio x D plus the
control plane's own measured latency x the factor.

Every rank derives from the same gathered samples, so every rank arrives at the same values:
ranks that timed out at different moments would fall out of the protocol's lock-step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .config import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from .errors import ConfigError
from .stats import quantile

__all__ = ["DEFAULT_POLICY", "DerivedTimeouts", "Measured", "TimeoutPolicy", "announce", "derive_timeouts"]

#: Derived timeouts are rounded up to this step: readable, and gloo counts milliseconds anyway.
STEP_S = 0.1


@dataclass(frozen=True)
class TimeoutPolicy:
    """How measured latencies become timeouts (see the module docstring for why)."""

    quantile: float = 0.99
    factor: float = 20.0
    data_floor_s: float = 2.0
    control_ratio: float = 3.0

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError(f"TimeoutPolicy.quantile must be in (0, 1], got {self.quantile!r}")
        if not self.factor >= 1:
            raise ValueError(f"TimeoutPolicy.factor must be >= 1 (a safety factor), got {self.factor!r}")
        if not MIN_TIMEOUT_S <= self.data_floor_s <= MAX_TIMEOUT_S:
            raise ValueError(f"TimeoutPolicy.data_floor_s must be in [{MIN_TIMEOUT_S}, {MAX_TIMEOUT_S:g}], "
                             f"got {self.data_floor_s!r}")
        if not self.control_ratio > 1:
            raise ValueError(f"TimeoutPolicy.control_ratio must be > 1 (control waits out data timeouts), "
                             f"got {self.control_ratio!r}")


DEFAULT_POLICY = TimeoutPolicy()


@dataclass(frozen=True)
class Measured:
    """The latency summary of one data-plane group (by label) or of the control plane."""

    name: str
    samples: int
    p50_s: float
    quantile_s: float
    max_s: float


_SOURCES = {"given": "given", "qualified": "the envelope file's qualified value, above what was measured"}


#: A model whose largest collective moves this many warm-ups' bytes or more is told that the
#: derived data timeout may be short for it (`DerivedTimeouts.undersized`).
UNDERSIZED_RATIO = 8.0


@dataclass(frozen=True)
class DerivedTimeouts:
    """The timeouts a runtime uses, with the evidence for them (written to the trace and to the
    envelope file). ``*_source``: "derived" (from the samples), "given" (an explicit setting) or
    "qualified" (the envelope file's value, a lower bound that the measurement did not exceed)."""

    data_timeout_s: float
    control_timeout_s: float
    data_source: str
    control_source: str
    policy: TimeoutPolicy
    measured: tuple[Measured, ...]
    qualified: tuple[float, float] | None = None
    bytes_per_collective: int = 0
    #: the largest collective one update makes (`calibrate.largest_collective_bytes`; 0: unknown)
    largest_collective_bytes: int = 0

    def undersized(self, ratio: float = UNDERSIZED_RATIO) -> str | None:
        """Why a derived data timeout may be short for this model (None: no reason known): the
        warm-up moves at most a DDP bucket, and an FSDP unit's all-gather can move far more (found
        by review: a 2 GB embedding unit against a 25 MiB warm-up). Not scaled automatically: small
        collectives are latency-bound, and a bound grown by the byte ratio would slow every
        detection; the user is told instead."""
        if self.data_source != "derived" or not self.bytes_per_collective:
            return None
        if self.largest_collective_bytes < ratio * self.bytes_per_collective:
            return None
        return (f"the data timeout {self.data_timeout_s:g} s was derived from {self.bytes_per_collective} B warm-up "
                f"all-reduces, but this model's largest collective moves about {self.largest_collective_bytes} B "
                f"({self.largest_collective_bytes / self.bytes_per_collective:.0f}x): time one update's largest "
                "collective and set ACCELPACT_DATA_TIMEOUT_S above it if it comes near")

    def describe(self) -> str:
        """One line: what was chosen and why."""
        return (f"data timeout {self.data_timeout_s:g} s {self._why_data()}; "
                f"control timeout {self.control_timeout_s:g} s {self._why_control()}")

    def _why_data(self) -> str:
        if self.data_source != "derived":
            return f"({_SOURCES[self.data_source]})"
        data = [m for m in self.measured if m.name != "control"]
        worst = max(data, key=lambda m: m.quantile_s)
        size = f" of {self.bytes_per_collective} B" if self.bytes_per_collective else ""
        return (f"= max(floor {self.policy.data_floor_s:g} s, {self.policy.factor:g} x p{self.policy.quantile * 100:g} "
                f"{worst.quantile_s * 1e3:.2f} ms on {worst.name}; {sum(m.samples for m in data)} warm-up "
                f"all-reduces{size})")

    def _why_control(self) -> str:
        if self.control_source != "derived":
            return f"({_SOURCES[self.control_source]})"
        ctrl = next(m for m in self.measured if m.name == "control")
        return (f"= {self.policy.control_ratio:g} x data + {self.policy.factor:g} x control-plane "
                f"p{self.policy.quantile * 100:g} {ctrl.quantile_s * 1e3:.2f} ms")

    def to_json(self) -> dict[str, Any]:
        return {"data_timeout_s": self.data_timeout_s, "control_timeout_s": self.control_timeout_s,
                "data_source": self.data_source, "control_source": self.control_source,
                "policy": asdict(self.policy), "measured": [asdict(m) for m in self.measured],
                "qualified": list(self.qualified) if self.qualified else None,
                "bytes_per_collective": self.bytes_per_collective,
                "largest_collective_bytes": self.largest_collective_bytes}

    @classmethod
    def from_json(cls, raw: Any) -> DerivedTimeouts:
        """Parse `to_json`'s output; ValueError naming what is wrong."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"timeouts must be an object, got {type(raw).__name__}")
        try:
            measured = tuple(Measured(**m) for m in raw["measured"])
            qualified = raw.get("qualified")
            if qualified is not None and len(qualified) != 2:
                raise ValueError(f"'qualified' must be [data, control], got {qualified!r}")
            out = cls(float(raw["data_timeout_s"]), float(raw["control_timeout_s"]), str(raw["data_source"]),
                      str(raw["control_source"]), TimeoutPolicy(**raw["policy"]), measured,
                      (float(qualified[0]), float(qualified[1])) if qualified else None,
                      int(raw.get("bytes_per_collective", 0)), int(raw.get("largest_collective_bytes", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"timeouts: missing or malformed field ({type(exc).__name__}: {exc})") from None
        sources = ("derived", *_SOURCES)
        if out.data_source not in sources or out.control_source not in sources:
            raise ValueError(f"timeouts: a source must be one of {sources}, got {out.data_source!r} and "
                             f"{out.control_source!r}")
        if ((out.data_source == "derived" and not any(m.name != "control" for m in measured))
                or (out.control_source == "derived" and not any(m.name == "control" for m in measured))):
            raise ValueError("timeouts: a derived value without the measurement it was derived from")
        if not MIN_TIMEOUT_S <= out.data_timeout_s < out.control_timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeouts: need {MIN_TIMEOUT_S} <= data ({out.data_timeout_s}) < control "
                             f"({out.control_timeout_s}) <= {MAX_TIMEOUT_S:g}")
        return out


def announce(t: DerivedTimeouts) -> str:
    """What rank 0 prints at attach: the values, why, and how to choose them instead."""
    how = ("" if "derived" not in (t.data_source, t.control_source) else
           "; to choose them yourself set Config.data_timeout_s / control_timeout_s "
           "(ACCELPACT_DATA_TIMEOUT_S / ACCELPACT_CONTROL_TIMEOUT_S)")
    return f"timeouts measured at attach: {t.describe()}{how}"


def summarise(name: str, samples: Sequence[float], q: float) -> Measured:
    """A group's samples as (count, median, `q`-quantile, max); ValueError on bad samples."""
    bad = [s for s in samples if not (isinstance(s, (int, float)) and math.isfinite(s) and s >= 0)]
    if not samples or bad:
        raise ValueError(f"latency samples of {name!r} must be non-empty finite seconds >= 0, "
                         f"got {len(samples)} samples{f' including {bad[:3]}' if bad else ''}")
    return Measured(name, len(samples), quantile(samples, 0.5), quantile(samples, q), max(samples))


def _round_up(seconds: float) -> float:
    return round(math.ceil(seconds / STEP_S - 1e-9) * STEP_S, 3)


def derive_timeouts(
    data: Mapping[str, Sequence[float]],
    control: Sequence[float],
    *,
    given_data: float | None = None,
    given_control: float | None = None,
    policy: TimeoutPolicy = DEFAULT_POLICY,
    qualified: tuple[float, float] | None = None,
    bytes_per_collective: int = 0,
    largest_collective_bytes: int = 0,
) -> DerivedTimeouts:
    """The data and control timeouts for these latency samples (seconds; ``data`` by group label).

    An explicit ``given_*`` value is kept as it is; ``qualified`` (the envelope file's values) is a
    lower bound for what is derived. Raises `ConfigError` naming both values when the control
    timeout would not exceed the data timeout (only possible with an explicit setting)."""
    if not data:
        raise ValueError("no data-plane latency samples: a runtime always has at least one data-plane group")
    measured = tuple(summarise(label, data[label], policy.quantile) for label in sorted(data))
    ctrl = summarise("control", control, policy.quantile)
    if given_data is not None:
        data_s, data_source = float(given_data), "given"
    else:
        derived = _round_up(max(policy.data_floor_s, policy.factor * max(m.quantile_s for m in measured)))
        data_s, data_source = derived, "derived"
        if qualified and qualified[0] > derived:
            data_s, data_source = qualified[0], "qualified"
    if given_control is not None:
        control_s, control_source = float(given_control), "given"
    else:
        derived = _round_up(policy.control_ratio * data_s + policy.factor * ctrl.quantile_s)
        control_s, control_source = derived, "derived"
        if qualified and qualified[1] > derived:
            control_s, control_source = qualified[1], "qualified"
    if not control_s > data_s:
        raise ConfigError(f"control_timeout_s ({control_s}, {control_source}) must exceed data_timeout_s "
                          f"({data_s}, {data_source}): the control plane waits out data-plane timeouts")
    sources = {"data_timeout_s": data_source, "control_timeout_s": control_source}
    for name, value in (("data_timeout_s", data_s), ("control_timeout_s", control_s)):
        if not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:
            # found by review: a given data timeout above 8 h made the derived control timeout too
            # large, and the message blamed the measurement
            why = ("derived from the data timeout given, which leaves no room for it: give "
                   "control_timeout_s too, or a smaller data_timeout_s" if data_source == "given" else
                   "derived from the measurement: the measurement is broken")
            raise ConfigError(f"{name} {value:g} s ({sources[name]}) is outside [{MIN_TIMEOUT_S}, {MAX_TIMEOUT_S:g}]: "
                              f"{why}")
    return DerivedTimeouts(data_s, control_s, data_source, control_source, policy, (*measured, ctrl),
                           qualified, bytes_per_collective, largest_collective_bytes)


def timeouts_too_close(data_timeout_s: float, control_timeout_s: float) -> str | None:
    """Why a given pair is risky, or None: a rank's boundary check can be posted up to two data
    timeouts after the first rank's (`fsm.link_wait`), and a check that outwaits the control
    timeout rejects the recovery; "auto" derives pairs well past it (found by review: the config
    asked only control > data)."""
    if control_timeout_s >= 2 * data_timeout_s:
        return None
    return (f"control_timeout_s ({control_timeout_s:g} s) is under twice data_timeout_s ({data_timeout_s:g} s): a "
            "rank's boundary check can come two data timeouts after the first rank's, and one that outwaits the "
            f"control timeout rejects the recovery; give at least {2 * data_timeout_s:g} s, or 'auto'")
