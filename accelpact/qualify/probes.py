"""`accelpact qualify`: measure, on this platform, which recovery actions keep training bitwise exact.

Whether an action works is a property of the accelerator stack, not of the protocol (seed 000:
destroy + recreate after a timeout works on one stack and kills the process on another), so it
is measured, not assumed. Probes:

* platform: retire and rebuild a group after a *real* timeout (a member skips an all-reduce and
  its peer waits out the group timeout), then prove the new group with a validation all-reduce.
  Every in-memory action rests on this; if it fails, only Restart is qualified;
* per framework and failure phase: a 4-rank drill world under the runtime with ``repeats`` real
  faults of that phase, each recovered before the next, then an uninterrupted reference in the
  same processes. The probed action (Preserve at a committed boundary, Rewind in forward,
  backward and — with a pre-step copy — optimizer) qualifies only if every recovery took it on
  every rank and the end state is bitwise equal to the reference;
* replace: per framework and failure phase, a 4-rank job launched with one spare in which a
  rank is SIGKILLed in that phase; Replace qualifies if the spare took its place and the job
  ended bitwise equal to the uninterrupted reference (`testing.spares`);
* timeouts: per framework, a 4-rank world attaches with derived timeouts ("auto", more warm-up
  rounds than an attach takes) and trains real updates under them; the slowest framework's
  values, with their evidence, go into the file if every rank derived the same and no update
  recovered (a spurious timeout means the values are not qualified).

Everything runs on CPU ranks over gloo (the drill harness has no device workloads), so the
envelope written here is for the ``cpu-gloo`` platform.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from ..envelope.file import (
    ENVELOPE_FILENAME,
    EXPECTED_ACTION,
    FRAMEWORK_PROFILES,
    REBUILD_PROBE,
    ProbeResult,
    QualifiedRow,
    envelope_from_results,
    platform_fingerprint,
    platform_key,
    write_envelope,
)
from ..errors import AccelPactError
from ..fsm.phases import FailurePhase, RecoveryAction
from ..timeouts import DerivedTimeouts

__all__ = ["DEFAULT_FRAMEWORKS", "DEFAULT_PHASES", "QualifyError", "QualifyResult", "judge_drill", "qualify"]

DEFAULT_FRAMEWORKS = ("fsdp2", "fsdp1", "ddp")
DEFAULT_PHASES = tuple(p.value for p in (FailurePhase.COMMITTED, FailurePhase.FORWARD, FailurePhase.BACKWARD,
                                         FailurePhase.OPTIMIZER))
BACKEND, DEVICE = "gloo", "cpu"
#: Set-up timeout of the probe's groups and of the default group: generous, it only bounds a hang.
SETUP_TIMEOUT_S = 30.0
#: The drill's Rewind fields; a tree whose drill harness lacks them cannot probe Rewind.
REWIND_FIELDS = ("rewind", "envelope", "step_copy")
#: The timeout probe: warm-up rounds per group (an attach takes 20) and real updates per framework.
TIMEOUT_ROUNDS = 50
TIMEOUT_UPDATES = 20


class QualifyError(AccelPactError, RuntimeError):
    """The probes could not run at all on this platform (nothing was qualified, no file written)."""


@dataclass(frozen=True)
class QualifyResult:
    path: Path
    fingerprint: dict[str, str]
    probes: tuple[ProbeResult, ...]
    rows: tuple[QualifiedRow, ...]
    wall_s: float
    timeouts: DerivedTimeouts | None = None
    timeout_findings: tuple[str, ...] = ()

    @property
    def platform_ok(self) -> bool:
        """Retire-and-rebuild after a real timeout worked, so in-memory actions could qualify."""
        return any(p.action == REBUILD_PROBE and p.qualified for p in self.probes)

    @property
    def findings(self) -> list[str]:
        """One line per probe that did not qualify its action, with the first reason."""
        return [f"{describe(p)}: {p.failures[0] if p.failures else 'did not pass'}"
                for p in self.probes if not p.qualified] + [f"timeouts: {f}" for f in self.timeout_findings]


def describe(probe: ProbeResult) -> str:
    where = "platform" if probe.action == REBUILD_PROBE else f"{probe.profile} {probe.phase}"
    return f"{where} {probe.action}"


def format_probe(probe: ProbeResult) -> str:
    """The CLI's line per probe: where, action, passed/runs, bitwise verdict, median repair."""
    where = ("platform", "-") if probe.action == REBUILD_PROBE else (probe.profile or "?", probe.phase or "?")
    bitwise = {True: "bitwise", False: "NOT-bitwise", None: "-"}[probe.bitwise]
    repair = f"{statistics.median(probe.repair_s) * 1e3:7.1f} ms" if probe.repair_s else "      - ms"
    verdict = "qualified" if probe.qualified else "NOT qualified"
    line = (f"{where[0]:<11} {where[1]:<10} {probe.action:<8} {probe.passed}/{probe.runs}  {bitwise:<11} "
            f"repair median {repair}  ({probe.wall_s:5.1f} s)  {verdict}")
    if probe.requires:
        line += f" [requires {'+'.join(probe.requires)}]"
    if not probe.qualified and probe.failures:
        line += f": {probe.failures[0]}"
    return line


# ------------------------------------------------------------------------------------- driver


def qualify(
    out: str | Path,
    *,
    frameworks: Sequence[str] = DEFAULT_FRAMEWORKS,
    repeats: int = 3,
    phases: Sequence[str] = DEFAULT_PHASES,
    world: int = 4,
    data_timeout_s: float = 1.0,
    control_timeout_s: float = 6.0,
    trace_dir: str | Path | None = None,
    progress: Callable[[str], Any] = print,
    replace: bool = True,
) -> QualifyResult:
    """Run every probe on this platform and write the envelope file to ``out``.

    Raises `QualifyError` only when the probes cannot run at all; actions that do not qualify are
    findings, recorded in the file (restart-only rows with the evidence of why).
    ``trace_dir`` keeps the drills' traces (default: a temporary directory, removed).
    """
    _check_arguments(frameworks, phases, repeats, world, data_timeout_s, control_timeout_s)
    _check_out(out)
    start = time.perf_counter()
    fingerprint = platform_fingerprint(BACKEND, DEVICE)
    platform = platform_key(BACKEND, DEVICE)
    with tempfile.TemporaryDirectory(prefix="accelpact-qualify-") as scratch:
        traces = Path(trace_dir) if trace_dir is not None else Path(scratch)
        _sanity(world, progress)
        results = [_probe_rebuild(world, repeats, data_timeout_s)]
        progress(format_probe(results[0]))
        for framework in frameworks:
            for phase in phases:
                if not results[0].qualified:
                    probe = _not_run(framework, phase, "skipped: the platform probe (retire and rebuild) failed")
                else:
                    probe = _probe_drill(framework, FailurePhase(phase), repeats=repeats, world=world,
                                         data_timeout_s=data_timeout_s, control_timeout_s=control_timeout_s,
                                         trace_dir=traces / f"{framework}-{phase}")
                results.append(probe)
                progress(format_probe(probe))
                if replace:
                    probe = (_probe_replace(framework, FailurePhase(phase), data_timeout_s, control_timeout_s)
                             if results[0].qualified else _not_run(framework, phase, "skipped: the platform probe failed",
                                                                   action=RecoveryAction.REPLACE.value))
                    results.append(probe)
                    progress(format_probe(probe))
    timeouts, timeout_findings, timeout_evidence = _probe_timeouts(frameworks, world)
    rows = envelope_from_results(results, platform, torch_version=fingerprint["torch"])
    wall_s = time.perf_counter() - start
    settings = {"frameworks": list(frameworks), "phases": list(phases), "repeats": repeats, "world": world,
                "data_timeout_s": data_timeout_s, "control_timeout_s": control_timeout_s}
    path = write_envelope(out, rows, fingerprint, timeouts=timeouts, qualify={
        "settings": settings, "wall_s": round(wall_s, 1), "timeouts_probe": timeout_evidence,
        "platform_probe": results[0].evidence(fingerprint["torch"])})
    return QualifyResult(Path(path), fingerprint, tuple(results), tuple(rows), wall_s, timeouts,
                         tuple(timeout_findings))


def _check_arguments(frameworks: Sequence[str], phases: Sequence[str], repeats: int, world: int,
                     data_timeout_s: float, control_timeout_s: float) -> None:
    unknown = [f for f in frameworks if f not in FRAMEWORK_PROFILES]
    if unknown or not frameworks:
        raise ValueError(f"unknown frameworks {unknown}; choose from {', '.join(FRAMEWORK_PROFILES)}")
    bad = [p for p in phases if p not in DEFAULT_PHASES]
    if bad or not phases:
        raise ValueError(f"unknown failure phases {bad}; choose from {', '.join(DEFAULT_PHASES)}")
    if len(set(frameworks)) != len(frameworks) or len(set(phases)) != len(phases):
        raise ValueError("a framework or phase is listed twice")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if world < 4 or world % 2:
        raise ValueError(f"world must be an even number >= 4 (2 local ranks per node, >= 2 nodes), got {world}")
    # the bounds `Config` puts on every timeout (gloo counts milliseconds): the drills attach with these
    if not MIN_TIMEOUT_S <= data_timeout_s < control_timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"need {MIN_TIMEOUT_S} <= data_timeout_s ({data_timeout_s}) < control_timeout_s "
                         f"({control_timeout_s}) <= {MAX_TIMEOUT_S:g} seconds")


def _check_out(out: str | Path) -> None:
    """``out`` can be written: not a directory, and its nearest existing ancestor a writable
    directory (`write_envelope` creates what is missing). Checked before minutes of probing, and
    without creating anything: a refusal leaves the file system as it was."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"the envelope file {path} is a directory; give a file's path (e.g. "
                         f"{path / ENVELOPE_FILENAME})")
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"cannot write {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {path}: {existing} is not writable")


def _world_error_text(exc: BaseException) -> str:
    """The reason and the last line of the first failing rank's traceback: enough for a finding."""
    from ..testing.spawn import WorldError

    if not isinstance(exc, WorldError):
        return f"{type(exc).__name__}: {exc}"
    for _, outcome in sorted(exc.outcomes.items()):
        if not outcome.ok and outcome.detail.strip():
            return f"{exc.reason}: {outcome.detail.strip().splitlines()[-1]}"
    return exc.reason


# ------------------------------------------------------------------------------------- sanity


def _sanity_rank(rank: int, world_size: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    value = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(value)
    return {"sum": int(value.item()), "backend": str(dist.get_backend())}


def _sanity(world: int, progress: Callable[[str], Any]) -> None:
    """Can this machine run a world of ``world`` ranks at all? If not, nothing can be qualified."""
    from ..testing.spawn import run_world

    start = time.perf_counter()
    try:
        results = run_world(_sanity_rank, world, timeout_s=180, pg_timeout_s=SETUP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - any failure here means the probes cannot run
        raise QualifyError(f"cannot run a {world}-rank {BACKEND} world on this machine: "
                           f"{_world_error_text(exc)}") from exc
    expected = world * (world - 1) // 2
    if any(r["sum"] != expected for r in results):
        raise QualifyError(f"a {world}-rank all-reduce of the ranks gave {[r['sum'] for r in results]}, "
                           f"expected {expected}: the default group is broken")
    progress(f"platform    {BACKEND}/{DEVICE}: {world} ranks up in {time.perf_counter() - start:.1f} s")


# ------------------------------------------------------------------------------------- rebuild


def _rebuild_rank(rank: int, world_size: int, repeats: int, timeout_s: float) -> dict[str, Any]:
    """``repeats`` times: break one replicate group by a real timeout, replace it, prove the new one."""
    import torch
    import torch.distributed as dist

    from ..comm import classify_failure, make_group, replace_group, validate_group
    from ..testing.faults import skip_collective_fault
    from ..workloads import HSDPLayout

    layout = HSDPLayout(nodes=world_size // 2, local=2)
    members = layout.replicate_ranks(rank)
    generation = 0
    group = make_group(members, label="q-replicate", generation=generation, timeout=SETUP_TIMEOUT_S)
    validate_group(group, members)
    runs: list[dict[str, Any]] = []
    for i in range(repeats):
        victims = layout.replicate_ranks(i % layout.local)
        waiter, skipper = (victims[0], victims[-1]) if i % 2 == 0 else (victims[-1], victims[0])
        run: dict[str, Any] = {"members": victims}
        dist.barrier()
        if rank in victims:
            start = time.perf_counter()
            try:
                error = skip_collective_fault(group, waiter=waiter, skipper=skipper,
                                              timeout=datetime.timedelta(seconds=timeout_s))
            except AssertionError as exc:  # the collective did not time out
                run["error"] = str(exc)
                error = None
            if rank == waiter and error is not None:
                run["detect_s"] = time.perf_counter() - start
                run["cause"] = classify_failure(error).cause.name
        dist.barrier()  # the default group is healthy: only the victim group was broken
        if rank in victims and "error" not in run:
            start = time.perf_counter()
            try:
                generation += 1
                group = replace_group(group, ranks=members, label="q-replicate", generation=generation,
                                      timeout=SETUP_TIMEOUT_S)
                validated = validate_group(group, members)
                payload = torch.full((4,), float(rank + 1))
                dist.all_reduce(payload, group=group)  # and real data flows on the new group
                run["repair_s"] = time.perf_counter() - start
                run["validated"] = validated.observed_sum == validated.expected_sum
                run["data_ok"] = bool(torch.equal(payload, torch.full((4,), float(sum(members) + len(members)))))
            except Exception as exc:  # noqa: BLE001 - the finding is the failure
                run["error"] = f"{type(exc).__name__}: {exc}"
        runs.append(run)
    dist.barrier()
    return {"rank": rank, "runs": runs}


def judge_rebuild(results: Sequence[Mapping[str, Any]], repeats: int, timeout_s: float) -> ProbeResult:
    """A run passes when the waiter really timed out and every victim rebuilt and proved the group."""
    passed = 0
    failures: list[str] = []
    repair: list[float] = []
    detect: list[float] = []
    for i in range(repeats):
        runs = [r["runs"][i] for r in results if r["rank"] in r["runs"][i]["members"]]
        problems = [f"rank {r['rank']}: {r['runs'][i]['error']}" for r in results
                    if "error" in r["runs"][i]]
        causes = [run["cause"] for run in runs if "cause" in run]
        if not causes:
            problems.append("no member saw the collective fail")
        elif causes[0] not in ("TIMEOUT", "CONNECTION_CLOSED"):
            problems.append(f"the waiter failed with {causes[0]}, not a timeout")
        waits = [run["detect_s"] for run in runs if "detect_s" in run]
        if waits and waits[0] < 0.5 * timeout_s:
            problems.append(f"the waiter failed after {waits[0]:.2f} s, before the {timeout_s} s timeout")
        if not all(run.get("validated") and run.get("data_ok") for run in runs):
            problems.append("the rebuilt group did not validate on every member")
        if problems:
            failures.append(f"run {i + 1}: {'; '.join(problems)}")
            continue
        passed += 1
        detect.extend(waits)
        repair.append(max(run["repair_s"] for run in runs))
    return ProbeResult(REBUILD_PROBE, repeats, passed, None, repair_s=tuple(repair), detect_s=tuple(detect),
                       failures=tuple(failures))


def _probe_rebuild(world: int, repeats: int, data_timeout_s: float) -> ProbeResult:
    from ..testing.spawn import run_world

    start = time.perf_counter()
    try:
        results = run_world(_rebuild_rank, world, repeats, data_timeout_s,
                            timeout_s=60 + repeats * (data_timeout_s + 20), pg_timeout_s=SETUP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a crash or hang is the finding
        return ProbeResult(REBUILD_PROBE, repeats, 0, None, wall_s=time.perf_counter() - start,
                           failures=(f"the probe world failed: {_world_error_text(exc)}",))
    return dataclasses.replace(judge_rebuild(results, repeats, data_timeout_s), wall_s=time.perf_counter() - start)


# ------------------------------------------------------------------------------------- drills


def fault_plan(phase: FailurePhase, repeats: int, world: int) -> tuple[str, int, tuple[int, ...]]:
    """``repeats`` skips of ``phase`` at updates 2, 4, …, each on another rank; plus the run length.

    Every other update is clean, so each recovery is over (and its groups proven) before the next
    fault; one clean update after the last shows that training goes on.
    """
    updates = tuple(2 + 2 * i for i in range(repeats))
    ranks = [(world // 2 + i * (world // 2 + 1)) % world for i in range(repeats)]
    plan = ",".join(f"skip@{u}:{phase.value}:{r}" for u, r in zip(updates, ranks))
    return plan, updates[-1] + 1, updates


def judge_drill(
    results: Sequence[Mapping[str, Any]], *, phase: FailurePhase, fault_updates: Sequence[int],
) -> ProbeResult:
    """Did every recovery of the injected faults take the expected action on every rank, and is the
    end state bitwise equal to the uninterrupted reference?

    Recoveries are matched to faults by update. A fault inside an update is seen by some ranks in
    a later phase (their peers ran ahead), so ranks may report different phases; a recovery that
    every rank reports at a committed boundary is then a separate event (a spurious boundary
    timeout on a loaded machine): noted, and judged only through the end state.
    """
    expected = EXPECTED_ACTION[phase].value
    failures: list[str] = []
    notes: list[str] = []
    rejected = [r for r in results if r.get("rejected")]
    if rejected:
        failures.append(f"ranks {[r['rank'] for r in rejected]} rejected: {rejected[0]['rejected'][0]}")
    mismatches = [r.get("mismatches") for r in results]
    bitwise: bool | None = None  # not compared (a rank rejected, or no reference ran)
    if all(m is not None for m in mismatches):
        bitwise = all(m == [] for m in mismatches)
        for r in results:
            if r["mismatches"]:
                more = f" and {len(r['mismatches']) - 1} more" if len(r["mismatches"]) > 1 else ""
                failures.append(f"rank {r['rank']} differs from the reference in {r['mismatches'][0]}{more}")
    histories = [list(r.get("history") or []) for r in results]
    lengths = {len(h) for h in histories}
    passed, judged = 0, 0
    covered: set[int] = set()  # the fault updates a judged recovery was for
    repair: list[float] = []
    detect: list[float] = []
    reported: Counter[str] = Counter()
    if len(lengths) > 1:
        failures.append(f"ranks recorded different numbers of recoveries: {[len(h) for h in histories]}")
    else:
        for i in range(lengths.pop() if lengths else 0):
            recs = [h[i] for h in histories]
            updates = sorted({rec["update"] for rec in recs})
            actions = sorted({rec["action"] for rec in recs})
            phases = sorted({rec["failure_phase"] for rec in recs})
            boundary_only = phase is not FailurePhase.COMMITTED and phases == [FailurePhase.COMMITTED.value]
            if boundary_only or not set(updates) & set(fault_updates):
                notes.append(f"extra recovery at update {updates} ({'/'.join(phases)}): {'/'.join(actions)}")
                continue
            judged += 1
            covered |= set(updates) & set(fault_updates)
            reported["+".join(phases)] += 1
            if actions != [expected]:
                failures.append(f"recovery at update {updates} took {actions}, expected {expected}")
                continue
            passed += 1
            repair.append(max(float(rec.get("repair_s", 0.0)) for rec in recs))
            detect.append(max(float(rec.get("detect_s", 0.0)) for rec in recs))
    if set(reported) - {phase.value}:
        notes.append("ranks reported phases " + ", ".join(f"{k} ({n}x)" for k, n in sorted(reported.items())))
    # counted per fault, not per recovery: two recoveries of one fault do not stand in for another
    missing = [u for u in fault_updates if u not in covered]
    if missing:
        failures.append(f"only {len(fault_updates) - len(missing)} of {len(fault_updates)} injected faults led "
                        "to a recovery")
    runs = judged + len(missing)  # a fault without a recovery is a failed run
    return ProbeResult(expected, runs, passed, bitwise, repair_s=tuple(repair), detect_s=tuple(detect),
                       failures=tuple(failures), notes=tuple(notes))


def _not_run(framework: str, phase: str, why: str, action: str | None = None) -> ProbeResult:
    return ProbeResult(action or EXPECTED_ACTION[FailurePhase(phase)].value, 0, 0, None,
                       profile=FRAMEWORK_PROFILES[framework], phase=phase, failures=(why,))


# ------------------------------------------------------------------------------------- replace

#: Frameworks a spare can take over for.
REPLACE_FRAMEWORKS = ("fsdp1", "fsdp2", "ddp")


def judge_replace(result: Mapping[str, Any] | None, lost: int) -> ProbeResult:
    """A kill passes when rank 0 recorded a Replace of exactly `lost` (every rank agrees on the
    change: its release is one register) and every rank's end state was compared with the
    uninterrupted reference and found bitwise equal (the demo trainer's result file). The
    trainer's own `bitwise_ok` is not enough: it stays true when no comparison ran."""
    action = RecoveryAction.REPLACE.value
    if result is None:
        return ProbeResult(action, 1, 0, None, failures=("the job wrote no result (a rank crashed or rejected)",))
    history = result["verdicts"][0]["history"]
    replaced = [h for h in history if h["action"] == action]
    failures = []
    if not replaced or replaced[0].get("replacement", {}).get("lost") != [lost]:
        failures.append(f"no Replace of rank {lost}: recoveries {[h['action'] for h in history]}")
    compared = [verdict.get("mismatches") for verdict in result["verdicts"]]
    bitwise = bool(result.get("bitwise_ok")) and bool(compared) and all(m == [] for m in compared)
    if any(m is None for m in compared) or not compared:
        failures.append("a rank's end state was not compared with the uninterrupted reference")
    elif not bitwise:
        failures.append("the end state differs from the uninterrupted reference")
    repair = tuple(float(h.get("repair_s", 0.0)) for h in replaced[:1])
    return ProbeResult(action, 1, 0 if failures else 1, bitwise, repair_s=repair, failures=tuple(failures))


def _probe_replace(framework: str, phase: FailurePhase, data_timeout_s: float, control_timeout_s: float) -> ProbeResult:
    from ..testing.spares import run_spare_job

    if framework not in REPLACE_FRAMEWORKS:
        return _not_run(framework, phase.value, f"{framework}: a spare cannot take over yet (refused at attach)",
                        action=RecoveryAction.REPLACE.value)
    start = time.perf_counter()
    lost = 2  # not rank 0: its agent hosts the store under torchrun
    job = run_spare_job(framework=framework, faults=f"kill@3:{phase.value}:{lost}", updates=4, spares=1,
                        data_timeout=max(data_timeout_s, 1.0), control_timeout=control_timeout_s, envelope="permissive")
    probe = judge_replace(job.result, lost)
    return dataclasses.replace(probe, profile=FRAMEWORK_PROFILES[framework], phase=phase.value,
                               wall_s=time.perf_counter() - start)


def _probe_drill(framework: str, phase: FailurePhase, *, repeats: int, world: int, data_timeout_s: float,
                 control_timeout_s: float, trace_dir: Path) -> ProbeResult:
    """One drill world; Rewind in the optimizer phase always with a pre-step copy (a split step
    cannot be undone without one). In forward or backward, ranks outside the failed groups may
    finish their step too (DDP's replicate groups are independent): if the protocol rejects
    without a copy, the probe is repeated with one, and passes only as "requires step_copy"."""
    from ..testing.drills import Drill

    fields = {f.name for f in dataclasses.fields(Drill)}
    missing = [name for name in REWIND_FIELDS if name not in fields]
    if missing and phase is not FailurePhase.COMMITTED:
        return _not_run(framework, phase.value, f"this accelpact's drill harness cannot rewind (no {missing})")
    start = time.perf_counter()
    step_copy = phase is FailurePhase.OPTIMIZER
    kwargs = dict(repeats=repeats, world=world, data_timeout_s=data_timeout_s,
                  control_timeout_s=control_timeout_s, fields=fields)
    probe, rejected = _drill_world(framework, phase, step_copy=step_copy, trace_dir=trace_dir, **kwargs)
    notes = probe.notes
    if step_copy:
        notes += ("probed with a pre-step copy (Config.step_copy): without one a split step is rejected",)
    elif phase is not FailurePhase.COMMITTED and rejected:
        first = probe
        probe, _ = _drill_world(framework, phase, step_copy=True, trace_dir=trace_dir.with_name(trace_dir.name + "-copy"),
                             **kwargs)
        step_copy = True
        notes = probe.notes + (f"without a pre-step copy: {first.passed}/{first.runs} "
                               f"({first.failures[0] if first.failures else 'failed'})",)
    return dataclasses.replace(probe, profile=FRAMEWORK_PROFILES[framework], phase=phase.value,
                               requires=("step_copy",) if step_copy else (), notes=notes,
                               wall_s=time.perf_counter() - start)


def _drill_world(framework: str, phase: FailurePhase, *, step_copy: bool, repeats: int, world: int,
                 data_timeout_s: float, control_timeout_s: float, trace_dir: Path,
                 fields: set[str]) -> tuple[ProbeResult, bool]:
    """The verdict of one drill world, and whether the protocol rejected a recovery in it."""
    from ..testing.drills import Drill, run_drill
    from ..testing.spawn import run_world

    plan, updates, fault_updates = fault_plan(phase, repeats, world)
    options: dict[str, Any] = {"rewind": True, "envelope": "permissive", "step_copy": step_copy}
    drill = Drill(framework=framework, updates=updates, faults=plan, data_timeout_s=data_timeout_s,
                  control_timeout_s=control_timeout_s, trace_dir=str(trace_dir),
                  **{k: v for k, v in options.items() if k in fields})
    try:
        results = run_world(run_drill, world, drill, timeout_s=120 + repeats * (control_timeout_s + 30),
                            pg_timeout_s=SETUP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a crash or hang is the finding
        return ProbeResult(EXPECTED_ACTION[phase].value, repeats, 0, None,
                           failures=(f"the drill world failed: {_world_error_text(exc)}",)), False
    return (judge_drill(results, phase=phase, fault_updates=fault_updates),
            any(r.get("rejected") for r in results))


# ------------------------------------------------------------------------------------- timeouts


def _timeouts_rank(rank: int, world_size: int, frameworks: Sequence[str], updates: int) -> dict[str, Any]:
    """Per framework: attach with derived timeouts, train `updates` real updates under them."""
    import accelpact

    from ..config import AUTO, Config
    from ..errors import RecoveryRejected
    from ..runtime import calibrate
    from ..workloads import build_hsdp_job, stochastic_update

    calibrate.WARMUP_ROUNDS = TIMEOUT_ROUNDS  # this probe process only: more samples than an attach takes
    out: dict[str, Any] = {"rank": rank, "derived": {}, "recoveries": {}}
    for framework in frameworks:
        model, optimizer, data = build_hsdp_job(framework, layers=2, seed=7, seq_len=8, batch_size=2)
        config = Config(data_timeout_s=AUTO, control_timeout_s=AUTO, on_reject="raise", envelope="builtin")
        rt = accelpact.attach(model, optimizer, data_state=data, config=config)
        try:
            for _ in range(updates):
                rt.step(lambda m=model, o=optimizer, d=data: stochastic_update(m, o, d))
        except RecoveryRejected as exc:  # a finding, judged below
            out.setdefault("rejected", {})[framework] = list(exc.reasons)
        out["derived"][framework] = rt.timeouts.to_json() if rt.timeouts else None
        out["recoveries"][framework] = [h.update for h in rt.history]
        rt.close()
    return out


def judge_timeouts(results: Sequence[Mapping[str, Any]], frameworks: Sequence[str],
                   ) -> tuple[DerivedTimeouts | None, list[str], dict[str, Any]]:
    """(the file's timeouts, findings, evidence): the framework with the largest derived data
    timeout, if every rank derived the same values for every framework and no update recovered."""
    findings: list[str] = []
    evidence: dict[str, Any] = {}
    chosen: DerivedTimeouts | None = None
    for framework in frameworks:
        derived = [r["derived"].get(framework) for r in results]
        recovered = sorted({u for r in results for u in r["recoveries"].get(framework, [])})
        rejected = [r["rank"] for r in results if framework in r.get("rejected", {})]
        evidence[framework] = {"recoveries_at": recovered, "rejected_ranks": rejected}
        if derived[0] is None or any(d != derived[0] for d in derived):
            findings.append(f"{framework}: ranks derived different timeouts (or none): {derived}")
            continue
        value = DerivedTimeouts.from_json(derived[0])
        evidence[framework].update(data_timeout_s=value.data_timeout_s, control_timeout_s=value.control_timeout_s)
        if recovered or rejected:
            findings.append(f"{framework}: a fault-free run under {value.describe()} recovered at updates "
                            f"{recovered}{f', ranks {rejected} rejected' if rejected else ''}")
        elif chosen is None or value.data_timeout_s > chosen.data_timeout_s:
            chosen = value
    if findings:
        return None, findings, evidence
    return chosen, findings, evidence


def _probe_timeouts(frameworks: Sequence[str], world: int,
                    updates: int = TIMEOUT_UPDATES) -> tuple[DerivedTimeouts | None, list[str], dict[str, Any]]:
    from ..testing.spawn import run_world

    try:
        results = run_world(_timeouts_rank, world, tuple(frameworks), updates,
                            timeout_s=120 + 60 * len(frameworks), pg_timeout_s=SETUP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a crash or hang is the finding
        return None, [f"the timeout probe world failed: {_world_error_text(exc)}"], {}
    return judge_timeouts(results, frameworks)
