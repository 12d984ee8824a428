"""`accelpact goodput`: is in-memory recovery worth its guard for a given campaign?

The paper's net-saving model (seed 000, "net cluster time saved"):

    ΔT = N_eligible · (A · t_update − T_repair) − N_other · C_reject − h · T0

N_eligible failures strike at committed boundaries and are repaired in memory, each saving the
replay of A updates of t_update seconds minus the repair time; N_other communication failures
strike elsewhere and are rejected fail-stop, each costing C_reject (detect + reject) on top of the
restart they would have had anyway; the boundary guard costs the fraction h of the campaign T0.

Defaults are the numbers seed 000 uses (24-hour campaign, Llama 3 405B interruption rates from
Meta's training logs: 7.76 interruptions/day, 0.916/day of them network and NCCL-watchdog issues;
A = 5, t_update = 220 s, T_repair = 0.77 s, h = 0.2 %, C_reject < 0.1 s). With them the model
reproduces the seed's figures: at a 2 % committed share the replay saved (170 s/day) about offsets
the guard (172.8 s/day); at 10 % the net saving is ≈ 680 s/day.

The same model with this product's measured inputs is printed beside it (`measured_params`):

    N_in_memory = s · F,  N_other = (1 − s) · F,  h = c_guard / t_update

where s is the share of failures the fault campaign recovered in memory (Preserve + Rewind +
Replace, from its summary file: `make campaign-spares` writes one), F the failures per day it is
applied to (seed 000's communication-failure rate unless given), and c_guard the boundary's
measured cost per update (`bench/guard.py`'s guarded − plain, median over ranks). The paper counts
only committed-boundary failures as recoverable and charges the guard as a share of runtime; the
boundary's cost is a few small collectives whatever the update computes, so the measured model
charges it per update (the printout also says what it would be as a share of the bench's own update).

The model functions are pure (numbers in, numbers out); reading the input files, printing and
plotting live below them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

DAY_S = 86_400.0

#: Where each default comes from (printed by the CLI so every number can be checked).
SOURCES = {
    "t0_s": "seed 000: 24-hour campaign, T0 = 86,400 s",
    "interruptions_per_day": "seed 000 citing Meta's Llama 3 405B logs: 7.76 interruptions/day",
    "comm_failures_per_day": "seed 000 citing the same logs: network and NCCL-watchdog issues 0.916/day",
    "committed_share": "seed 000 scenarios: 2 % and 10 % of interruptions at committed boundaries",
    "age": "seed 000: checkpoint age A = 5 (checkpoint at update 10, fault after update 15)",
    "t_update_s": "seed 000: 220 s per update (16-GPU Mistral-7B)",
    "t_repair_s": "seed 000: S = 5 x 220 - 0.77 s",
    "c_reject_s": "seed 000: safe rejection overhead C = T_detect + T_reject < 0.1 s (upper bound used)",
    "guard_overhead": "seed 000: h = 0.002, the measured 16-GPU guard overhead of +0.200 %",
}


#: The repository's measured results (the defaults of the measured model's input files).
RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"
DEFAULT_CAMPAIGN = RESULTS_DIR / "campaign-spares2-40.json"
DEFAULT_GUARD = RESULTS_DIR / "guard-4r.json"
#: The arm of `bench/guard.py` a user pays for: `rt.step` with the default boundary ("step"); files
#: from before the bench had arms carry one guarded arm ("guarded").
GUARD_ARMS = ("step", "guarded")
IN_MEMORY_ACTIONS = ("preserve", "rewind", "replace", "shrink")
#: Campaign recoveries that ended in a restart (older summaries say "restart", newer "reject").
RESTART_ACTIONS = ("reject", "restart")


@dataclass(frozen=True)
class GoodputParams:
    """Every term of the model; the defaults are seed 000's (see SOURCES)."""

    t0_s: float = DAY_S
    interruptions_per_day: float = 7.76
    comm_failures_per_day: float = 0.916
    committed_share: float = 0.02
    age: float = 5.0
    t_update_s: float = 220.0
    t_repair_s: float = 0.77
    c_reject_s: float = 0.1
    guard_overhead: float = 0.002
    #: explicit event counts over T0; None derives them from the rates and the share
    n_eligible: float | None = None
    n_other: float | None = None

    def __post_init__(self) -> None:
        # NaN passes every comparison below (nan < 0 is False) and inf turns the model into nan:
        # refuse both by name before any bound is checked
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in ("n_eligible", "n_other"):
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
        if self.t0_s <= 0:
            raise ValueError(f"t0_s must be positive, got {self.t0_s}")
        if not 0.0 <= self.committed_share <= 1.0:
            raise ValueError(f"committed_share must be in [0, 1], got {self.committed_share}")
        for name in ("interruptions_per_day", "comm_failures_per_day", "age", "t_update_s", "t_repair_s",
                     "c_reject_s", "guard_overhead"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("n_eligible", "n_other"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    @property
    def days(self) -> float:
        return self.t0_s / DAY_S

    def replace(self, **changes: float | None) -> GoodputParams:
        return dataclasses.replace(self, **changes)


def eligible_events(p: GoodputParams) -> float:
    """N_eligible over T0: the committed share of all interruptions, as seed 000 counts them."""
    if p.n_eligible is not None:
        return p.n_eligible
    return p.committed_share * p.interruptions_per_day * p.days


def other_events(p: GoodputParams) -> float:
    """N_other over T0: communication failures outside committed boundaries, which AccelPact
    rejects. Seed 000 leaves it unquantified; we take the communication-failure rate less the
    eligible ones (never negative)."""
    if p.n_other is not None:
        return p.n_other
    return max(0.0, p.comm_failures_per_day * p.days - eligible_events(p))


def saving_per_event(p: GoodputParams) -> float:
    """S = A · t_update − T_repair: replay avoided by one in-memory recovery, net of the repair."""
    return p.age * p.t_update_s - p.t_repair_s


def net_saving(p: GoodputParams) -> float:
    """ΔT over the campaign T0, in seconds (positive: AccelPact saves time)."""
    b = breakdown(p)
    return b["net_s"]


def breakdown(p: GoodputParams) -> dict[str, float]:
    """Each term of ΔT, in seconds over T0, with the event counts used."""
    n_e, n_o = eligible_events(p), other_events(p)
    gross = n_e * saving_per_event(p)
    reject = n_o * p.c_reject_s
    guard = p.guard_overhead * p.t0_s
    return {"n_eligible": n_e, "n_other": n_o, "saving_per_event_s": saving_per_event(p), "gross_s": gross,
            "reject_cost_s": reject, "guard_cost_s": guard, "net_s": gross - reject - guard}


def break_even_interval_days(p: GoodputParams) -> float:
    """Mean interval between eligible failures at which ΔT = 0 (longer intervals lose time).

    Holding N_other at its value for p, ΔT = 0 needs N* = (N_other·C_reject + h·T0) / S eligible
    events over T0, one every T0 / N*. `inf` when one in-memory recovery would already pay for
    all costs, 0 when recovery cannot pay at all (S <= 0)."""
    s = saving_per_event(p)
    if s <= 0:
        return 0.0
    cost = other_events(p) * p.c_reject_s + p.guard_overhead * p.t0_s
    if cost <= 0:
        return math.inf
    return p.days / (cost / s)


def break_even_share(p: GoodputParams, tol: float = 1e-9) -> float | None:
    """Smallest committed share in [0, 1] with ΔT ≥ 0, by bisection (ΔT grows with the share
    when S > 0); None if even a share of 1 does not pay."""
    if p.n_eligible is not None:
        raise ValueError("break_even_share derives N_eligible from the share; unset n_eligible")
    if net_saving(p.replace(committed_share=1.0)) < 0:
        return None
    if net_saving(p.replace(committed_share=0.0)) >= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if net_saving(p.replace(committed_share=mid)) >= 0:
            hi = mid
        else:
            lo = mid
    return hi


def sweep(p: GoodputParams, name: str, values: Sequence[float]) -> list[float]:
    """ΔT for each value of one parameter, the others held at p."""
    if name not in {f.name for f in dataclasses.fields(GoodputParams)}:
        raise ValueError(f"unknown parameter {name!r}")
    return [net_saving(p.replace(**{name: v})) for v in values]


# ------------------------------------------------------------------------------ measured -------
class GoodputInputError(ConfigError):
    """A measured input file is missing or malformed; the message names the file and the problem."""

    def __init__(self, path: str | Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


@dataclass(frozen=True)
class MeasuredEnvelope:
    """What a fault campaign recovered in memory, per action, of the failures its first attempts met."""

    source: str
    counts: dict[str, int]  # preserve, rewind, replace, restarted (reject/restart), killed
    label: str  # envelope, spares, schedules, seed: what was run
    faults_in_memory_share: float | None = None  # the summary's fault-level share, where it has one

    @property
    def failures(self) -> int:
        return sum(self.counts.values())

    @property
    def shares(self) -> dict[str, float]:
        """Each in-memory action's share of the failures; a shrink only where the campaign met one
        (it is opt-in: most campaigns never do, and a 0 % line would only be noise)."""
        return {a: self.counts[a] / self.failures for a in IN_MEMORY_ACTIONS if a != "shrink" or self.counts[a]}

    @property
    def in_memory_share(self) -> float:
        return sum(self.shares.values())


@dataclass(frozen=True)
class MeasuredGuard:
    """The boundary's cost per update, from `bench/guard.py`'s paired runs."""

    source: str
    cost_s: float  # median over ranks of (guarded − plain) median update time, never below 0
    update_s: float  # median over ranks of the plain update time
    ranks: int
    setting: str
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ratio(self) -> float:
        return (self.update_s + self.cost_s) / self.update_s


def _number(doc: Mapping[str, Any], key: str, source: str, *, where: str = "") -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GoodputInputError(source, f"{where}{key!r} must be a finite number, got {value!r}")
    return float(value)


def envelope_from_summary(doc: Any, source: str) -> MeasuredEnvelope:
    """The measured envelope from a campaign summary (`accelpact.testing.campaign --summary`). Pure.

    Failures are every recovery of the first attempts plus every schedule a kill ended with none
    (the summary's own `recovered_in_memory_share` denominator, which is checked against)."""
    if not isinstance(doc, Mapping):
        raise GoodputInputError(source, f"not a campaign summary: a JSON object expected, got {type(doc).__name__}")
    recoveries = doc.get("recoveries")
    if not isinstance(recoveries, Mapping):
        raise GoodputInputError(source, "not a campaign summary: no 'recoveries' object (write one with "
                                "`make campaign` or `make campaign-spares`)")
    unknown = sorted(set(recoveries) - set(IN_MEMORY_ACTIONS) - set(RESTART_ACTIONS))
    if unknown:
        raise GoodputInputError(source, f"'recoveries' has unknown actions {unknown}")
    counts = {}
    for action in (*IN_MEMORY_ACTIONS, *RESTART_ACTIONS):
        n = _number(recoveries, action, source, where="recoveries ") if action in recoveries else 0.0
        if n < 0 or n != int(n):
            raise GoodputInputError(source, f"recoveries {action!r} must be a count, got {recoveries[action]!r}")
        counts[action] = int(n)
    killed = _number(doc, "killed", source)
    if killed < 0 or killed != int(killed):
        raise GoodputInputError(source, f"'killed' must be a count, got {doc['killed']!r}")
    measured = {**{a: counts[a] for a in IN_MEMORY_ACTIONS},
                "restarted": counts["reject"] + counts["restart"], "killed": int(killed)}
    if not sum(measured.values()):
        raise GoodputInputError(source, "the campaign met no failure: no share can be measured from it")
    env = MeasuredEnvelope(source, measured, _campaign_label(doc),
                           doc.get("faults_in_memory_share") if isinstance(doc.get("faults_in_memory_share"),
                                                                           (int, float)) else None)
    stated = doc.get("recovered_in_memory_share")
    if isinstance(stated, (int, float)) and abs(stated - env.in_memory_share) > 0.0015:
        raise GoodputInputError(source, f"inconsistent: 'recovered_in_memory_share' says {stated}, its counts give "
                                f"{env.in_memory_share:.3f}")
    return env


def _campaign_label(doc: Mapping[str, Any]) -> str:
    parts = [f"envelope {doc.get('envelope', '?')}"]
    if doc.get("spares"):
        parts.append(f"{doc['spares']} spares")
    if "schedules" in doc:
        parts.append(f"{doc['schedules']} schedules")
    if doc.get("seed") is not None:
        parts.append(f"seed {doc['seed']}")
    return ", ".join(parts)


def guard_from_bench(doc: Any, source: str) -> MeasuredGuard:
    """The guard's cost per update from `bench/guard.py`'s JSON: ``ranks``, each with the median
    update time of every arm (``plain_s``, ``step_s``, ...). The cost is the user's arm (`GUARD_ARMS`)
    less plain, median over ranks; the other arms (the one-collective floor, the deferred
    boundary) are named in the notes. Pure."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("ranks"), list) or not doc["ranks"]:
        raise GoodputInputError(source, "not a bench/guard.py result: a non-empty 'ranks' list expected "
                                "(run `python bench/guard.py`)")
    rows = doc["ranks"]
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise GoodputInputError(source, f"ranks[{i}] is not an object")
    arm = next((a for a in GUARD_ARMS if all(f"{a}_s" in row for row in rows)), None)
    if arm is None:
        raise GoodputInputError(source, f"no guarded arm on every rank: want one of "
                                f"{[f'{a}_s' for a in GUARD_ARMS]} beside plain_s")
    plain = [_positive(row, "plain_s", source, i) for i, row in enumerate(rows)]
    cost = _median([_positive(row, f"{arm}_s", source, i) - p for i, (row, p) in enumerate(zip(rows, plain))])
    notes = [] if cost >= 0 else [f"{arm} ran faster than plain by {-cost * 1e3:.3f} ms (noise): cost taken as 0"]
    for other, what in (("floor", "one bare collective per update (the floor)"),
                        ("deferred", "the deferred boundary (Config.boundary='deferred')")):
        if other != arm and all(isinstance(row.get(f"{other}_s"), (int, float)) for row in rows):
            extra = _median([row[f"{other}_s"] - p for row, p in zip(rows, plain)])
            notes.append(f"{what}: {extra * 1e3:+.2f} ms per update in the same run")
    for own in (a for a in (arm, "deferred") if all(isinstance(row.get(f"{a}_own_cpu_s"), (int, float)) for row in rows)):
        cpu = _median([row[f"{own}_own_cpu_s"] for row in rows])
        notes.append(f"AccelPact's own CPU on the training thread, arm {own}: {cpu * 1e6:.0f} µs per update (what "
                     "remains where the collectives' threads have cores of their own)")
    args = doc.get("args") if isinstance(doc.get("args"), Mapping) else {}
    setting = ", ".join(f"{k} {args[k]}" for k in ("framework", "dim", "layers", "nproc", "updates") if k in args)
    if "load_before" in doc:
        setting += f", load {doc['load_before']}"
    return MeasuredGuard(source, max(0.0, cost), _median(plain), len(plain),
                         f"arm {arm}; " + (setting or "setting not recorded"), tuple(notes))


def _positive(row: Mapping[str, Any], key: str, source: str, i: int) -> float:
    value = _number(row, key, source, where=f"ranks[{i}] ")
    if value <= 0:
        raise GoodputInputError(source, f"ranks[{i}] {key!r}: update times must be positive, got {value}")
    return value


def _median(xs: Sequence[float]) -> float:
    ordered = sorted(xs)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def measured_params(p: GoodputParams, env: MeasuredEnvelope, guard: MeasuredGuard,
                    failures_per_day: float | None = None) -> GoodputParams:
    """The paper's model with the measured inputs: in-memory and rejected events from the
    campaign's share of `failures_per_day` (default: p's communication-failure rate), and h from
    the guard's cost per update over p's update time. The workload terms (T0, A, t_update,
    T_repair, C_reject) stay p's. Pure."""
    rate = p.comm_failures_per_day if failures_per_day is None else failures_per_day
    if not (math.isfinite(rate) and rate >= 0):
        raise ValueError(f"failures_per_day must be a finite number >= 0, got {rate}")
    if p.t_update_s <= 0:
        raise ValueError("the measured guard is a cost per update: t_update_s must be positive")
    failures = rate * p.days
    return p.replace(n_eligible=env.in_memory_share * failures, n_other=(1 - env.in_memory_share) * failures,
                     guard_overhead=guard.cost_s / p.t_update_s)


def read_json(path: str | Path) -> Any:
    """A measured input file's JSON, or a `GoodputInputError` naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GoodputInputError(_shown(path), "missing") from None
    except OSError as exc:
        raise GoodputInputError(_shown(path), f"unreadable ({exc.strerror or exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GoodputInputError(_shown(path), f"not JSON ({exc})") from None


def load_measured(campaign: str | Path = DEFAULT_CAMPAIGN,
                  guard: str | Path = DEFAULT_GUARD) -> tuple[MeasuredEnvelope, MeasuredGuard]:
    """Read and check both measured inputs (each error names its file)."""
    return (envelope_from_summary(read_json(campaign), _shown(campaign)),
            guard_from_bench(read_json(guard), _shown(guard)))


def _shown(path: str | Path) -> str:
    """The path as a reader can find it: relative to the working directory when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------ output ---------
def format_report(p: GoodputParams) -> str:
    b = breakdown(p)
    per_day = 1.0 / p.days
    interval = break_even_interval_days(p)
    share = break_even_share(p) if p.n_eligible is None else None
    lines = [
        "net-saving model  dT = N_eligible*(A*t_update - T_repair) - N_other*C_reject - h*T0",
        f"  T0 {p.t0_s:,.0f} s ({p.days:g} d)  A {p.age:g}  t_update {p.t_update_s:g} s  T_repair {p.t_repair_s:g} s  "
        f"C_reject {p.c_reject_s:g} s  h {p.guard_overhead:.4%}",
        f"  interruptions {p.interruptions_per_day:g}/day, communication failures {p.comm_failures_per_day:g}/day, "
        f"committed share {p.committed_share:.1%}",
        f"  N_eligible {b['n_eligible']:.3f}  N_other {b['n_other']:.3f}  saving per event S {b['saving_per_event_s']:,.1f} s",
        f"  gross saving {b['gross_s']:,.1f} s  - rejections {b['reject_cost_s']:,.2f} s  - guard {b['guard_cost_s']:,.1f} s"
        f"  = dT {b['net_s']:,.1f} s ({b['net_s'] * per_day:,.1f} s/day, {b['net_s'] / p.t0_s:+.3%} of T0)",
        f"  break-even: one eligible failure every {interval:.2f} days"
        + ("" if share is None else f"; committed share {share:.2%} of interruptions"),
    ]
    return "\n".join(lines)


def format_side_by_side(paper: GoodputParams, env: MeasuredEnvelope, guard: MeasuredGuard,
                        failures_per_day: float | None = None) -> str:
    """The paper's model and the measured one in two columns, then every input with its source."""
    measured = measured_params(paper, env, guard, failures_per_day)
    rate = paper.comm_failures_per_day if failures_per_day is None else failures_per_day
    bp, bm = breakdown(paper), breakdown(measured)
    per_day = 1.0 / paper.days
    by_action = ", ".join(f"{a} {share * rate:.3f}" for a, share in env.shares.items())

    def interval(q: GoodputParams) -> str:
        days = break_even_interval_days(q)
        return "any rate pays" if math.isinf(days) else f"one every {days:.2f} days"

    rows = [
        ("recovered in memory /day",
         f"{bp['n_eligible'] * per_day:.3f} ({paper.committed_share:.1%} of {paper.interruptions_per_day:g})",
         f"{bm['n_eligible'] * per_day:.3f} ({env.in_memory_share:.1%} of {rate:g})"),
        ("  by action /day", f"preserve {bp['n_eligible'] * per_day:.3f}", by_action),
        ("rejected (restart) /day", f"{bp['n_other'] * per_day:.3f}", f"{bm['n_other'] * per_day:.3f}"),
        ("guard h (share of runtime)", f"{paper.guard_overhead:.4%}",
         f"{measured.guard_overhead:.4%} ({guard.cost_s * 1e3:.2f} ms per {paper.t_update_s:g} s update)"),
        ("gross saving s/day", f"{bp['gross_s'] * per_day:,.1f}", f"{bm['gross_s'] * per_day:,.1f}"),
        ("- rejections s/day", f"{bp['reject_cost_s'] * per_day:,.2f}", f"{bm['reject_cost_s'] * per_day:,.2f}"),
        ("- guard s/day", f"{bp['guard_cost_s'] * per_day:,.1f}", f"{bm['guard_cost_s'] * per_day:,.1f}"),
        ("= net saving dT s/day", f"{bp['net_s'] * per_day:,.1f}", f"{bm['net_s'] * per_day:,.1f}"),
        ("break-even (recoveries)", interval(paper), interval(measured)),
    ]
    head = ("", "paper's model (seed 000)", "measured (this product)")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(3)]
    lines = ["dT = N_in_memory*(A*t_update - T_repair) - N_other*C_reject - h*T0, per day:",
             "  " + "  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    fault_share = ("" if env.faults_in_memory_share is None
                   else f"; of fired faults {env.faults_in_memory_share:.1%} (the summary's fault-level share)")
    if_relative = measured.replace(guard_overhead=guard.ratio - 1)
    lines += [
        "inputs of the measured column:",
        f"  in-memory share {env.in_memory_share:.1%} ("
        + ", ".join(f"{a} {share:.1%}" for a, share in env.shares.items())
        + f") of {env.failures} failures the campaign's first attempts met ({env.counts['restarted']} restarted, "
        f"{env.counts['killed']} killed){fault_share}: {env.source} ({env.label})",
        f"  applied to {rate:g} failures/day: "
        + (SOURCES["comm_failures_per_day"] if failures_per_day is None else "given (--failures-per-day)"),
        f"  guard cost {guard.cost_s * 1e3:.2f} ms per update: median over {guard.ranks} ranks of guarded - plain "
        f"at a {guard.update_s * 1e3:.1f} ms update ({guard.setting}; ratio {guard.ratio:.3f}): {guard.source}",
        f"    charged per update of the model's {paper.t_update_s:g} s; were it a share of every update "
        f"(h {guard.ratio - 1:.1%}), dT would be {net_saving(if_relative) * per_day:,.0f} s/day",
        *(f"    note: {n}" for n in guard.notes),
        f"  workload (both columns): T0 {paper.t0_s:,.0f} s, A {paper.age:g}, t_update {paper.t_update_s:g} s, "
        f"T_repair {paper.t_repair_s:g} s, C_reject {paper.c_reject_s:g} s (seed 000; --sources)",
        "  the campaign draws faults (skip/late/kill of a rank, any phase) uniformly, not in production's mix",
    ]
    return "\n".join(lines)


def plot(p: GoodputParams, path: str | Path) -> Path:
    """ΔT against the committed share and against the checkpoint age A (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    shares = [i / 200 for i in range(0, 61)]  # 0 .. 30 %
    per_day = 1.0 / p.days
    ax1.plot([s * 100 for s in shares], [v * per_day for v in sweep(p, "committed_share", shares)],
             label=f"A={p.age:g}, t_update={p.t_update_s:g}s")
    ax1.axhline(0, color="black", linewidth=0.8)
    be = break_even_share(p) if p.n_eligible is None else None
    if be is not None and be <= shares[-1]:
        ax1.axvline(be * 100, color="#c44e52", linestyle=":", label=f"break-even {be:.2%}")
    ax1.set_xlabel("failures at committed boundaries (% of interruptions)")
    ax1.set_ylabel("net saving dT (s/day)")
    ax1.legend(fontsize=8)
    ages = list(range(0, 31))
    for share in sorted({p.committed_share, 0.02, 0.10}):
        q = p.replace(committed_share=share)
        ax2.plot(ages, [v * per_day for v in sweep(q, "age", ages)], label=f"share {share:.0%}")
    ax2.axhline(0, color="black", linewidth=0.8)
    ax2.set_xlabel("checkpoint age A (updates replayed by a cold restart)")
    ax2.set_ylabel("net saving dT (s/day)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"AccelPact net saving, h={p.guard_overhead:.2%}, T_repair={p.t_repair_s:g}s")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = GoodputParams()
    a = parser.add_argument
    a("--t0", type=float, default=d.t0_s, help="campaign length T0 in seconds (default 86400)")
    a("--interruptions-per-day", type=float, default=d.interruptions_per_day)
    a("--comm-failures-per-day", type=float, default=d.comm_failures_per_day)
    a("--share", type=float, default=d.committed_share, help="share of interruptions at committed boundaries")
    a("--n-eligible", type=float, default=None, help="N_eligible over T0 (overrides rate x share)")
    a("--n-other", type=float, default=None, help="N_other over T0 (overrides the derived count)")
    a("--age", "-A", type=float, default=d.age, help="checkpoint age A in updates")
    a("--t-update", type=float, default=d.t_update_s, help="seconds per update")
    a("--t-repair", type=float, default=d.t_repair_s, help="seconds per in-memory repair")
    a("--c-reject", type=float, default=d.c_reject_s, help="seconds per safe rejection (detect + reject)")
    a("--h", type=float, default=d.guard_overhead, help="guard overhead as a fraction of runtime")
    a("--png", default=None, help="plot dT against the share and against A here")
    a("--json", dest="json_out", default=None, help="write the breakdown as JSON here")
    a("--sources", action="store_true", help="print where every default comes from")
    a("--campaign", default=str(DEFAULT_CAMPAIGN),
      help="campaign summary giving the measured in-memory share (default: bench/results/campaign-spares2-40.json)")
    a("--guard", default=str(DEFAULT_GUARD),
      help="bench/guard.py result giving the measured guard cost (default: bench/results/guard-4r.json)")
    a("--failures-per-day", type=float, default=None,
      help="failures/day the measured share applies to (default: --comm-failures-per-day)")
    a("--paper-only", action="store_true", help="the paper's model alone, without the measured inputs")


def params_from_args(args: argparse.Namespace) -> GoodputParams:
    return GoodputParams(
        t0_s=args.t0, interruptions_per_day=args.interruptions_per_day,
        comm_failures_per_day=args.comm_failures_per_day, committed_share=args.share, age=args.age,
        t_update_s=args.t_update, t_repair_s=args.t_repair, c_reject_s=args.c_reject,
        guard_overhead=args.h, n_eligible=args.n_eligible, n_other=args.n_other,
    )


def run(args: argparse.Namespace) -> int:
    try:
        p = params_from_args(args)
        rate = args.failures_per_day
        if rate is not None and not (math.isfinite(rate) and rate >= 0):  # checked even where unused
            raise ValueError(f"--failures-per-day must be a finite number >= 0, got {rate}")
        measured = None if args.paper_only else load_measured(args.campaign, args.guard)
        if measured is not None:
            measured_params(p, *measured, args.failures_per_day)  # refuse bad combinations before printing
    except GoodputInputError as exc:
        print(f"accelpact goodput: measured input {exc} (--paper-only prints the paper's model alone)")
        return 2
    except ValueError as exc:
        print(f"accelpact goodput: {exc}")
        return 2
    print(format_report(p))
    if measured is not None:
        print("\n" + format_side_by_side(p, *measured, args.failures_per_day))
    if args.sources:
        print("\ndefaults:")
        for key, text in SOURCES.items():
            print(f"  {key}: {text}")
    try:
        if args.json_out:
            doc = {"params": dataclasses.asdict(p), **breakdown(p),
                   "break_even_interval_days": break_even_interval_days(p),
                   "break_even_share": break_even_share(p) if p.n_eligible is None else None}
            if measured is not None:
                doc["measured"] = measured_document(p, *measured, args.failures_per_day)
            Path(args.json_out).write_text(json.dumps(doc, indent=2))
        if args.png:
            try:
                print(f"plot: {plot(p, args.png)}")
            except ImportError:
                print("matplotlib is not installed: no plot (pip install matplotlib)")
    except OSError as exc:  # --json or --png where nothing can be written: the user's path, named
        print(f"accelpact goodput: cannot write {exc.filename or args.json_out or args.png}: {exc.strerror or exc}")
        return 2
    return 0


def measured_document(p: GoodputParams, env: MeasuredEnvelope, guard: MeasuredGuard,
                      failures_per_day: float | None = None) -> dict[str, Any]:
    """The measured column as JSON, with its inputs and their sources."""
    q = measured_params(p, env, guard, failures_per_day)
    return {"params": dataclasses.asdict(q), **breakdown(q), "break_even_interval_days": break_even_interval_days(q),
            "inputs": {"campaign": {"source": env.source, "label": env.label, "counts": env.counts,
                                    "shares": env.shares, "in_memory_share": env.in_memory_share,
                                    "faults_in_memory_share": env.faults_in_memory_share},
                       "guard": {"source": guard.source, "cost_s": guard.cost_s, "update_s": guard.update_s,
                                 "ratio": guard.ratio, "ranks": guard.ranks, "setting": guard.setting},
                       "failures_per_day": p.comm_failures_per_day if failures_per_day is None else failures_per_day}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelpact goodput", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
