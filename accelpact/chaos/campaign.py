"""Bounded campaigns of real link cuts: scenarios (pure), one fresh fabric per scenario, a table.

    python -m accelpact.chaos campaign [--quick] [--seed N] [--out DIR] [--budget-s 300] [--envelope auto]
    python -m accelpact.chaos run --schedule "port-block:1.5@8,switch-down:9@14" [--updates 20]
    python -m accelpact.chaos nodeloss [--loss node-vanish:n1~5] [--budget-s 300]

Scenarios are data (`Scenario`, `default_campaign`), built from the job's timeouts so that each
cut's length class means what it says: *short* cuts end before the data-plane timeout can fire
(absorbed: a stall), *medium* ones outlast it but end inside the recovery budget (the control
plane's timeout after detection: Preserve), *long* ones outlast the budget (all ranks reject;
torchrun restarts from the last verified checkpoint once the link is back). Every scenario's traces,
marks, nemesis log and outputs stay under its own directory for trace validation.

The trainer is the demo's (`rt.step`, so an interrupted update can be run again) under a qualified
envelope, as the README tells a user to run (`qualified`: the default envelope file if it is
usable here, else `accelpact qualify` first; ``--envelope builtin`` shows what the built-in envelope
does instead). Each cut is reported with where it landed, what the runtime did and the run's bitwise
verdict, and the campaign prints the fraction of failure-causing cuts recovered in memory.

Node loss (`NodeLossScenario`, `default_node_loss`, `make chaos-nodeloss`): three emulated nodes,
the HSDP 2x2 job on nodes 0 and 1 and a spare node 2 with two hot spares (ACCELPACT_SPARES=2, one
agent per node, ``--max-restarts=0``); node 1 is lost for good mid-training (`nodeloss`) and node
2's workers must take over ranks 2 and 3 with their state from ranks 0 and 1, bitwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..config import Config, known_variables, unknown_variables
from ..errors import ConfigError
from .analysis import (
    NodeLossResult,
    ScenarioResult,
    analyse,
    analyse_node_loss,
    format_node_loss,
    format_share,
    format_table,
    in_memory_share,
    load_run,
)
from .job import Job, JobSpec
from .nemesis import Cut, CutMethod, Nemesis, format_schedule, method_available, parse_schedule, plan_random
from .nodeloss import LossMethod, NodeLoss, Reaper, parse_loss
from .qualified import AUTO, EnvelopePlan, EnvelopeUnavailable, resolve_envelope
from .topology import ChaosUnavailable, TeardownIncomplete, Topology, TopologySpec, emulated_nodes, preflight

__all__ = ["NodeLossScenario", "Scenario", "default_campaign", "default_node_loss", "length_classes", "main",
           "run_campaign", "run_node_loss", "run_node_losses", "run_scenario"]


@dataclass(frozen=True)
class Scenario:
    name: str
    job: JobSpec
    cuts: tuple[Cut, ...]
    timeout_s: float = 150.0
    expect: str = ""  # what the scenario is meant to show, for the printout


def length_classes(job: JobSpec) -> dict[str, float]:
    """Cut lengths, in seconds from the cut, for an aligned cut `offset` into a `dwell`.

    The health check starts when the dwell ends (`lead` after the cut) and fails `data_timeout`
    later; the control plane then waits at most `control_timeout` for the link."""
    lead = job.dwell_s - 0.05
    detect = lead + job.data_timeout_s
    return {
        "short": round(max(0.1, lead + 0.05), 2),  # restored ~when the health check starts
        "medium": round(detect + 0.2, 2),  # restored just after detection
        "medium+": round(detect + 0.45 * job.control_timeout_s, 2),  # well inside the budget
        "long": round(detect + job.control_timeout_s + 3.5, 2),  # past the budget
    }


def _drop_method() -> CutMethod:
    return CutMethod.BRIDGE_DROP if method_available(CutMethod.BRIDGE_DROP) is None else CutMethod.PORT_BLOCK


def default_campaign(seed: int = 7, *, quick: bool = False, envelope: str | None = None) -> list[Scenario]:
    """The `make chaos` campaign (pure). Full: mixed (6 cuts aligned to the committed window), random
    (3 unaligned), inside (2 cuts aligned to a dwell before the forward: they land in backward);
    quick: one Preserve cut. `envelope`: what every worker obeys (`JobSpec.envelope`;
    `qualified.resolve_envelope`)."""
    base = JobSpec(data_timeout_s=2.0, control_timeout_s=5.0, dwell_s=0.4, checkpoint_every=4, envelope=envelope)
    drop = _drop_method()
    if quick:
        cuts = (Cut(CutMethod.PORT_BLOCK, length_classes(base)["medium"], 6),)
        job = replace(base, updates=10, dwell_updates=(6,), run_id="chaos-quick", rdzv_port=29411)
        return [Scenario("quick", job, cuts, timeout_s=80, expect="preserve, bitwise identical")]
    L = length_classes(base)
    mixed_cuts = (
        Cut(CutMethod.PORT_BLOCK, L["short"], 5),
        Cut(drop, L["medium"], 8),
        Cut(CutMethod.SWITCH_DOWN, L["medium+"], 11),
        Cut(CutMethod.NODE_DOWN, L["medium"], 14),
        Cut(drop, L["medium+"], 17),
        Cut(CutMethod.SWITCH_DOWN, L["long"], 22),  # past the budget: restart from checkpoint 20
    )
    mixed = replace(base, updates=24, dwell_updates=tuple(c.update for c in mixed_cuts if c.aligned),
                    run_id="chaos-mixed", rdzv_port=29421)
    # unaligned: wherever training happens to be, with a seed: the honest landing distribution
    # (backward's gradient all-reduce and the boundary, where HSDP's cross-node collectives are,
    # or a checkpoint save). A restart budget of 1 also shows the stop: a second reject ends the
    # job with a clear message. The reference run gives the rewound cuts their bitwise verdict.
    random_cuts = tuple(plan_random(seed, 3, lengths=(L["medium"] + 0.5, L["medium+"]),
                                    methods=(drop, CutMethod.SWITCH_DOWN, CutMethod.NODE_DOWN),
                                    first_update=5, gap=(3, 4), aligned=False, max_offset_s=0.15))
    unaligned = replace(base, updates=random_cuts[-1].update + 2, max_restarts=1, run_id="chaos-random",
                        rdzv_port=29431)
    # inside an update, reproducibly: the ranks dwell before the forward, whose collectives stay
    # inside a node, so the cut first meets backward's cross-node gradient all-reduce (Rewind)
    inside_cuts = (Cut(drop, L["medium"] + 0.3, 5), Cut(CutMethod.SWITCH_DOWN, L["medium+"], 10))
    inside = replace(base, updates=12, dwell_phase="forward", dwell_updates=tuple(c.update for c in inside_cuts),
                     run_id="chaos-inside", rdzv_port=29441)
    return [
        Scenario("mixed", mixed, mixed_cuts, timeout_s=170,
                 expect="short: absorbed; medium: preserve; long: restart from checkpoint; bitwise identical"),
        Scenario("random", unaligned, random_cuts, timeout_s=120,
                 expect="unaligned cuts land wherever training is (rewound where qualified); restart budget 1: "
                        "a second reject stops"),
        Scenario("inside", inside, inside_cuts, timeout_s=90,
                 expect="cuts inside the update (backward): rewind where qualified, bitwise identical"),
    ]


@contextlib.contextmanager
def _fabric(topo: Topology | None, nodes: int, incomplete: list[str]) -> Iterator[Topology]:
    """`topo`, or a fresh fabric of `nodes` nodes torn down whatever happens. A teardown that left
    something behind after the scenario ran is appended to `incomplete` instead of raised: the
    scenario's result stands (its report says so, and the campaign fails), where raising lost it
    and every earlier scenario's, and the summary with them."""
    if topo is not None:
        yield topo
        return
    try:
        with emulated_nodes(TopologySpec.fresh(nodes=nodes)) as fresh:
            yield fresh
    except TeardownIncomplete as exc:
        if exc.__context__ is not None:  # the scenario failed too: its error, with this one chained, goes up
            raise
        incomplete.append(str(exc))


def run_scenario(sc: Scenario, out: Path, *, topo: Topology | None = None, log=print) -> ScenarioResult:
    """One scenario, on `topo` or on a fresh fabric of its own (then torn down whatever happens)."""
    root = out / sc.name
    if root.exists():
        shutil.rmtree(root)
    log(f"\n== {sc.name}: {format_schedule(sc.cuts)}  ({sc.expect})")
    t0 = time.monotonic()
    incomplete: list[str] = []
    with _fabric(topo, 2, incomplete) as topo:
        with Job(topo, sc.job, root) as job:
            nemesis = Nemesis(topo.spec, sc.cuts, marks_dir=job.paths.marks, log_path=job.paths.nemesis_log,
                              job_alive=job.alive).start()
            try:
                codes = job.wait(sc.timeout_s)
            finally:
                nemesis.stop()
    report = analyse(load_run(root, codes, local=sc.job.nproc), sc.name)
    if job.timed_out:
        report.message = (report.message + f"; killed after {sc.timeout_s:.0f}s").lstrip("; ")
    if nemesis.error is not None:
        report.message = (report.message + f"; nemesis error: {nemesis.error!r}").lstrip("; ")
    report.fabric_error = "; ".join(incomplete)
    if incomplete:
        report.message = (report.message + f"; {report.fabric_error}").lstrip("; ")
    (root / "report.json").write_text(json.dumps(report.to_dict() | {"scenario": asdict(sc),
                                                                      "wall_s": time.monotonic() - t0},
                                                 indent=2, default=str))
    log(f"   {time.monotonic() - t0:.0f}s, agents exit {codes}, placement {report.placement}, "
        f"restarts {report.restarts}, bitwise {report.bitwise}" + (f" — {report.message}" if report.message else ""))
    return report


def run_campaign(scenarios: Sequence[Scenario], out: Path, *, budget_s: float = 300.0, log=print) -> list[ScenarioResult]:
    """Scenarios in order, one at a time, skipping those that no longer fit in `budget_s`."""
    return _within_budget(scenarios, out, run_scenario, budget_s=budget_s, log=log)


def _within_budget(scenarios: Sequence[Any], out: Path, run: Any, *, budget_s: float, log) -> list[Any]:
    """Run each scenario (`run(scenario, out, log=log)`) with the budget left as its timeout,
    skipping one that no longer fits (under 60 % of its own timeout left)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    reports = []
    for sc in scenarios:
        left = budget_s - (time.monotonic() - t0)
        if left < sc.timeout_s * 0.6:
            log(f"\n== {sc.name}: skipped, {left:.0f}s left of the {budget_s:.0f}s budget")
            continue
        reports.append(run(replace(sc, timeout_s=min(sc.timeout_s, left)), out, log=log))
    return reports


@dataclass(frozen=True)
class NodeLossScenario:
    """A whole node lost for good while a job with spare nodes trains (`nodeloss`)."""

    name: str
    job: JobSpec
    loss: NodeLoss
    nodes: int = 3  # active nodes + spare nodes
    timeout_s: float = 200.0
    expect: str = ""

    @property
    def world_size(self) -> int:
        return (self.nodes - self.job.spare_nodes) * self.job.nproc


def default_node_loss(*, methods: Sequence[LossMethod] = (LossMethod.KILL, LossMethod.VANISH),
                      update: int = 5) -> list[NodeLossScenario]:
    """The `make chaos-nodeloss` scenarios (pure): HSDP 2x2 on nodes 0-1, a spare node 2 with 2
    spares, node 1 lost 0.05 s after update `update` committed, wherever update `update`+1 then is:
    an update takes about 0.1 s here, so forward, backward or already past the step (the survivors
    then put it back from the pre-step copy). Not at the boundary itself: a loss while the
    boundary check completes on some ranks and not on others splits the frontier, which is
    rejected (see the README).
    No checkpoints: there is no restart to reload one (``--max-restarts=0``)."""
    base = JobSpec(updates=update + 5, data_timeout_s=2.0, control_timeout_s=5.0, checkpoint_every=0, spares=2,
                   run_id="chaos-nodeloss", rdzv_port=29461)
    out = []
    for i, method in enumerate(methods):
        why = ("killed: its sockets reset, the survivors fail at once" if method is LossMethod.KILL
               else "off the fabric, then killed: no reset, the survivors wait out their timeouts")
        out.append(NodeLossScenario(f"nodeloss-{str(method).removeprefix('node-')}",
                                    replace(base, run_id=f"chaos-nodeloss-{i}", rdzv_port=base.rdzv_port + i),
                                    NodeLoss(method, update, offset_s=0.05),
                                    expect=f"node 1 {why}; node 2's spares take over "
                                    "ranks 2 and 3 from ranks 0 and 1, bitwise"))
    return out


def run_node_loss(sc: NodeLossScenario, out: Path, *, topo: Topology | None = None, log=print) -> NodeLossResult:
    """One node-loss scenario on `topo` (`sc.nodes` nodes) or on a fresh fabric of its own."""
    root = out / sc.name
    if root.exists():
        shutil.rmtree(root)
    log(f"\n== {sc.name}: {sc.loss.spec()}, {sc.nodes} nodes ({sc.job.spare_nodes} spare)  ({sc.expect})")
    t0 = time.monotonic()
    incomplete: list[str] = []
    with _fabric(topo, sc.nodes, incomplete) as topo:
        if topo.spec.nodes != sc.nodes:
            raise ValueError(f"scenario {sc.name} needs {sc.nodes} nodes, the fabric has {topo.spec.nodes}")
        with Job(topo, sc.job, root) as job:
            reaper = Reaper(topo.spec, sc.loss, marks_dir=job.paths.marks, log_path=job.paths.nemesis_log,
                            world_size=sc.world_size, job_alive=job.alive).start()
            try:
                codes = job.wait(sc.timeout_s)
            finally:
                reaper.stop()
    report = analyse_node_loss(load_run(root, codes, local=sc.job.nproc), sc.name, world_size=sc.world_size)
    wall = time.monotonic() - t0
    if job.timed_out:
        report.message = (report.message + f"; killed after {sc.timeout_s:.0f}s").lstrip("; ")
    if reaper.error is not None:
        report.message = (report.message + f"; reaper error: {reaper.error!r}").lstrip("; ")
    report.fabric_error = "; ".join(incomplete)
    if incomplete:
        report.message = (report.message + f"; {report.fabric_error}").lstrip("; ")
    (root / "report.json").write_text(json.dumps(report.to_dict() | {"scenario": asdict(sc), "wall_s": wall},
                                                 indent=2, default=str))
    log(f"   {wall:.0f}s\n" + format_node_loss(report))
    return report


def run_node_losses(scenarios: Sequence[NodeLossScenario], out: Path, *, budget_s: float = 300.0,
                    log=print) -> list[NodeLossResult]:
    """Node-loss scenarios in order, skipping those that no longer fit in `budget_s`."""
    return _within_budget(scenarios, out, run_node_loss, budget_s=budget_s, log=log)


def node_loss_ok(r: NodeLossResult) -> bool:
    return r.outcome == "replace" and r.completed and r.bitwise == "IDENTICAL" and not r.fabric_error


def landing_summary(reports: Sequence[ScenarioResult]) -> str:
    """Where cuts landed, per anchor kind: the honest fraction that Preserve can handle."""
    lines = []
    for aligned in (True, False):
        cuts = [c for r in reports for c in r.cuts if c.aligned == aligned and c.outcome != "skipped"]
        if not cuts:
            continue
        counts: dict[str, int] = {}
        for c in cuts:
            counts[f"{c.landed}→{c.outcome}"] = counts.get(f"{c.landed}→{c.outcome}", 0) + 1
        parts = ", ".join(f"{k} {v}/{len(cuts)}" for k, v in sorted(counts.items()))
        lines.append(f"  {'aligned (@k)' if aligned else 'unaligned (~k)'}: {parts}")
    return "\n".join(lines)


def print_summary(reports: Sequence[ScenarioResult], out: Path, log=print, *, envelope: str = "") -> bool:
    log("\n" + format_table(reports))
    if envelope:
        log(f"envelope: {envelope}")
    log("\nwhere cuts landed → outcome:\n" + landing_summary(reports))
    log("\n" + format_share(in_memory_share(c for r in reports for c in r.cuts)))
    rtp = [c.restore_to_progress_s for r in reports for c in r.cuts
           if c.outcome == "preserve" and c.restore_to_progress_s is not None]
    rtp_rewind = sorted(c.restore_to_progress_s for r in reports for c in r.cuts
                        if c.outcome == "rewind" and c.restore_to_progress_s is not None)
    if rtp_rewind:
        log(f"\nrestore→progress after Rewind (the re-run update committed): median "
            f"{rtp_rewind[len(rtp_rewind) // 2]:.2f}s, max {rtp_rewind[-1]:.2f}s over {len(rtp_rewind)} cuts")
    if rtp:
        rtp.sort()
        log(f"\nrestore→progress after Preserve: median {rtp[len(rtp) // 2]:.2f}s, max {rtp[-1]:.2f}s "
            f"over {len(rtp)} cuts (goal < 0.5s)")
    for r in reports:
        if r.message:
            log(f"  {r.name}: {r.message}")
    log(f"\ntraces (per rank, per scenario, with nemesis.jsonl beside them): {out}/<scenario>/trace/")
    # a run whose end state differs from its reference is a failed campaign, whatever its cuts did
    different = [r.name for r in reports if r.bitwise.startswith("DIFFERENT")]
    if different:
        log(f"FAILED: end state bitwise DIFFERENT from the reference in {', '.join(different)}")
    leaked = [r.name for r in reports if r.fabric_error]
    if leaked:
        log(f"FAILED: the emulated fabric was not wholly torn down after {', '.join(leaked)} (the next run reaps "
            "what is left)")
    return not different and not leaked and all(not c.same_node_replaced for r in reports for c in r.cuts)


def parse_settings(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`--set` values as (name, value) pairs; ValueError naming an item that is not NAME=VALUE or
    whose name no worker reads (the job drops every other ACCELPACT_* variable)."""
    known = known_variables()
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set {item!r}: expected ACCELPACT_NAME=VALUE")
        if name not in known:
            close = dict(unknown_variables({name: value})).get(name)
            hint = f"; did you mean {close}?" if close else " (Config's fields, upper-cased, after ACCELPACT_)"
            raise ValueError(f"--set {item!r}: {name} is no AccelPact setting{hint}")
        try:  # a value of the wrong kind is refused here, not in every worker (found by review)
            Config().with_env({name: value})
        except ConfigError as exc:
            raise ValueError(f"--set {item!r}: {exc}") from None
        out.append((name, value))
    return tuple(out)


def with_settings(scenarios: Sequence[Scenario], settings: tuple[tuple[str, str], ...]) -> list[Scenario]:
    """`scenarios` with `settings` in every worker's environment."""
    return [replace(sc, job=replace(sc.job, extra_env=sc.job.extra_env + settings)) for sc in scenarios]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accelpact.chaos", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    envelope_help = ("what the workers obey: auto (default: the default envelope file if usable here, else "
                     "`accelpact qualify --quick` first), qualify, builtin, permissive, or an envelope file")
    c = sub.add_parser("campaign", help="the bounded default campaign (make chaos)")
    c.add_argument("--quick", action="store_true", help="one short Preserve cut (CI-sized)")
    c.add_argument("--seed", type=int, default=7)
    c.add_argument("--budget-s", type=float, default=300.0)
    c.add_argument("--out", default="runs/chaos")
    c.add_argument("--envelope", default=AUTO, help=envelope_help)
    c.add_argument("--set", action="append", default=[], metavar="ACCELPACT_NAME=VALUE",
                   help="a setting for every worker (repeatable), e.g. ACCELPACT_LINK_PROBE_S=0 to run the "
                        "campaign without link probing beside one with it")
    r = sub.add_parser("run", help="one job under a schedule of your own")
    r.add_argument("--schedule", required=True, help="e.g. 'port-block:1.6@6,switch-down:9@12' (see nemesis)")
    r.add_argument("--updates", type=int, default=20)
    r.add_argument("--data-timeout", type=float, default=1.0)
    r.add_argument("--control-timeout", type=float, default=4.0)
    r.add_argument("--dwell-s", type=float, default=0.4)
    r.add_argument("--dwell-phase", choices=("committed", "forward"), default="committed",
                   help="where aligned (@k) cuts land: the committed window (Preserve) or before the forward "
                        "(the cut meets backward's cross-node all-reduce: Rewind under a qualified envelope)")
    r.add_argument("--checkpoint-every", type=int, default=4)
    r.add_argument("--max-restarts", type=int, default=3)
    r.add_argument("--timeout-s", type=float, default=240)
    r.add_argument("--out", default="runs/chaos")
    r.add_argument("--envelope", default=AUTO, help=envelope_help)
    n = sub.add_parser("nodeloss", help="a whole node lost, a spare node takes over (make chaos-nodeloss)")
    n.add_argument("--loss", action="append", default=None,
                   help="e.g. node-kill:n1~5 or node-vanish:n1~5+0.1 (repeatable; default: both methods at ~5)")
    n.add_argument("--updates", type=int, default=None, help="default: the loss's update + 5")
    n.add_argument("--budget-s", type=float, default=300.0)
    n.add_argument("--timeout-s", type=float, default=200.0, help="per scenario")
    n.add_argument("--out", default="runs/chaos")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    if args.cmd == "nodeloss":
        return _node_loss_main(args, out)
    settings: tuple[tuple[str, str], ...] = ()
    if args.cmd == "campaign":
        try:
            settings = parse_settings(args.set)
        except ValueError as exc:
            p.error(str(exc))
    try:
        preflight()  # before a qualification that would be wasted on a machine without namespaces
        envelope = resolve_envelope(args.envelope, out)
        print(f"chaos: envelope {envelope.source}", flush=True)
        if args.cmd == "campaign":
            scenarios = with_settings(default_campaign(args.seed, quick=args.quick, envelope=envelope.envelope),
                                      settings)
            reports = run_campaign(scenarios, out, budget_s=args.budget_s)
        else:
            cuts = tuple(parse_schedule(args.schedule))
            job = JobSpec(updates=args.updates, data_timeout_s=args.data_timeout,
                          control_timeout_s=args.control_timeout, dwell_s=args.dwell_s, dwell_phase=args.dwell_phase,
                          checkpoint_every=args.checkpoint_every, max_restarts=args.max_restarts,
                          dwell_updates=tuple(c.update for c in cuts if c.aligned), run_id="chaos-run",
                          rdzv_port=29451, envelope=envelope.envelope)
            reports = [run_scenario(Scenario("run", job, cuts, timeout_s=args.timeout_s), out)]
    except ChaosUnavailable as exc:
        print(f"chaos: cannot emulate nodes here: {exc}", file=sys.stderr)
        return 2
    except EnvelopeUnavailable as exc:
        print(f"chaos: no usable recovery envelope: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nchaos: interrupted; fabric torn down", file=sys.stderr)
        return 130
    summary = campaign_summary(reports, envelope)
    if settings:
        summary["settings"] = dict(settings)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    ok = print_summary(reports, out, envelope=envelope.source)
    return 0 if ok and reports else 1


def campaign_summary(reports: Sequence[ScenarioResult], envelope: EnvelopePlan) -> dict:
    """What `summary.json` keeps: the envelope, the in-memory share, and every scenario's cuts."""
    share = in_memory_share(c for r in reports for c in r.cuts)
    return {"envelope": envelope.source, "envelope_file": envelope.envelope if envelope.qualified else None,
            "in_memory": share.to_dict(), "scenarios": [r.to_dict() for r in reports]}


def _node_loss_main(args: argparse.Namespace, out: Path) -> int:
    if args.loss:
        scenarios = []
        for i, text in enumerate(args.loss):
            loss = parse_loss(text)
            (sc,) = default_node_loss(methods=(loss.method,), update=loss.update)
            job = replace(sc.job, rdzv_port=sc.job.rdzv_port + i,
                          updates=args.updates or sc.job.updates, run_id=f"{sc.job.run_id}-{i}")
            scenarios.append(replace(sc, name=f"{sc.name}-{i}" if len(args.loss) > 1 else sc.name, job=job,
                                     loss=loss))
    else:
        scenarios = default_node_loss()
        if args.updates:
            scenarios = [replace(sc, job=replace(sc.job, updates=args.updates)) for sc in scenarios]
    scenarios = [replace(sc, timeout_s=args.timeout_s) for sc in scenarios]
    try:
        reports = run_node_losses(scenarios, out, budget_s=args.budget_s)
    except ChaosUnavailable as exc:
        print(f"chaos: cannot emulate nodes here: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nchaos: interrupted; fabric torn down", file=sys.stderr)
        return 130
    out.mkdir(parents=True, exist_ok=True)
    (out / "nodeloss-summary.json").write_text(json.dumps([r.to_dict() for r in reports], indent=2, default=str))
    ok = bool(reports) and all(node_loss_ok(r) for r in reports)
    print(f"\nnode loss: {sum(node_loss_ok(r) for r in reports)}/{len(reports)} replaced in memory, bitwise "
          f"identical (traces: {out}/<scenario>/trace/)")
    return 0 if ok else 1
