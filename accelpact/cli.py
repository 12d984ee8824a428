"""`accelpact` command line: demo, qualify, check, table, report, goodput."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from .errors import AccelPactError, ConfigError
from .paths import usable_directory


def _count(minimum: int):
    """An argparse type: a whole number >= `minimum` (`--spares -1` started nproc - 1 agents)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def _check_demo(args: argparse.Namespace) -> None:
    """Everything the workers or their agents would refuse, refused before any process starts:
    a refusal after the launch costs every agent's start-up and says it once per rank. `--faults`
    is normalised in place ('none', in any case, is what the worker reads as no faults)."""
    from .faults import FaultKind, FaultPlan

    if args.replicate != "off" and not args.spares:
        raise ConfigError("--replicate keeps copies for a spare to take over from: add --spares 1 (or more)")
    if args.on_loss == "shrink" and args.replicate != "off":  # attach refuses it on every rank
        raise ConfigError(f"--on-loss shrink with --replicate {args.replicate} is not supported: a shrink does not "
                          "rebuild the neighbour ring; drop one of them")
    if args.faults is not None and args.faults.strip().lower() == "none":
        args.faults = "none"
    if args.faults is None:
        from .demo_worker import DEFAULT_FAULTS  # what the workers run without --faults

        text = DEFAULT_FAULTS
    else:
        text = "" if args.faults == "none" else args.faults
    source = "--faults" if args.faults is not None else f"the workers' default fault plan ({text})"
    try:
        plan = FaultPlan.parse(text)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        plan.validate(args.nproc)  # positions 0..nproc-1: a spare takes over one, it adds none
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc} (--nproc {args.nproc})") from None
    if (args.spares or args.on_loss == "shrink") and any(f.rank == 0 and f.kind is FaultKind.KILL
                                                        for f in plan.faults):
        raise ConfigError("rank 0 runs on the agent that hosts the job's store, which cannot be lost: kill another "
                          "rank")
    late = sorted({f.update for f in plan.faults if f.update > args.updates})
    if late:  # found by review: they never fired, and the demo still said PASS
        raise ConfigError(f"{source}: faults at update(s) {late} come after the last update (--updates "
                          f"{args.updates}): they would never fire; raise --updates or change the plan")
    if args.nproc % 2:  # the workers emulate nodes of 2 ranks (demo_worker --local 2)
        raise ConfigError(f"--nproc {args.nproc}: the demo emulates nodes of 2 ranks each, so --nproc must be even")
    if args.envelope is not None and args.envelope not in ("builtin", "permissive"):
        from .envelope.file import EnvelopeFileError, read_envelope

        try:
            read_envelope(args.envelope)
        except EnvelopeFileError as exc:
            raise ConfigError(f"--envelope: {exc}") from None
    if args.trace_dir is not None:
        usable_directory(args.trace_dir, "--trace-dir")


def _demo(args: argparse.Namespace) -> int:
    trace_dir = args.trace_dir or os.path.join(tempfile.gettempdir(), f"accelpact-demo-{int(time.time())}")
    try:
        _check_demo(args)
    except ConfigError as exc:
        print(f"accelpact demo: {exc}", file=sys.stderr)
        return 2
    if args.spares or args.on_loss == "shrink":
        return _demo_with_spares(args, trace_dir)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
        "--max-restarts=0", "-m", "accelpact.demo_worker", f"--framework={args.framework}",
        f"--updates={args.updates}", f"--trace-dir={trace_dir}",
    ]
    if args.faults is not None:
        cmd.append(f"--faults={args.faults}")
    if args.no_rebind:
        cmd.append("--no-rebind")
    if args.envelope is not None:
        cmd.append(f"--envelope={args.envelope}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    print(f"$ {' '.join(cmd)}", flush=True)
    code = subprocess.call(cmd, env=env)
    _print_incidents(trace_dir)
    print(f"traces: {trace_dir}  (accelpact report {trace_dir})")
    return code


def _worker_args(args: argparse.Namespace, trace_dir: str) -> list[str]:
    out = ["-m", "accelpact.demo_worker", f"--framework={args.framework}", f"--updates={args.updates}",
           f"--trace-dir={trace_dir}", f"--replicate={args.replicate}", f"--on-loss={args.on_loss}"]
    if args.faults is not None:
        out.append(f"--faults={args.faults}")
    if args.no_rebind:
        out.append("--no-rebind")
    if args.envelope is not None:
        out.append(f"--envelope={args.envelope}")
    return out


def _demo_with_spares(args: argparse.Namespace, trace_dir: str) -> int:
    """The production recipe on one machine (with spares, or allowed to shrink): one torchrun
    agent per rank (a lost worker takes only its own agent down), spares in the first rendezvous, `--max-restarts=0` (a restarted
    agent would re-rendezvous and restart every survivor; a Reject exits 75 for the scheduler
    to restart the job). The first agent hosts the c10d endpoint, the job's store: it is started
    first and its rank (0) cannot be lost (`_check_demo` refuses a plan that kills it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agents = args.nproc + args.spares
    os.makedirs(trace_dir, exist_ok=True)
    result = os.path.join(trace_dir, "result.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={agents}", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=accelpact-demo-{os.getpid()}",
           "--max-restarts=0", "--monitor-interval=0.5", *_worker_args(args, trace_dir), f"--result={result}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ACCELPACT_SPARES=str(args.spares),
               ACCELPACT_RDZV_ENDPOINT=f"127.0.0.1:{port}", ACCELPACT_ON_LOSS=args.on_loss)
    print(f"$ ACCELPACT_SPARES={args.spares} ACCELPACT_ON_LOSS={args.on_loss} ACCELPACT_RDZV_ENDPOINT=127.0.0.1:{port} "
          f"{' '.join(cmd)}"
          f"   # x{agents}, one agent per rank", flush=True)
    procs = []
    for i in range(agents):
        log = open(os.path.join(trace_dir, f"agent{i}.log"), "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stderr=log), log))
        if i == 0:
            _wait_for_port(port)
    for proc, log in procs:
        proc.wait()
        log.close()
    _print_incidents(trace_dir)
    print(f"traces and agent logs: {trace_dir}  (accelpact report {trace_dir})")
    try:
        with open(result) as fh:
            got = json.load(fh)
    except (OSError, ValueError):
        return 1
    return 0 if got.get("bitwise_ok") and got.get("all_in_memory") else 1


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def _print_incidents(trace_dir: str) -> None:
    """Every incident of the run as a sentence, read back from its traces."""
    from . import run_report

    try:
        summary = run_report.summarize(run_report.load_traces(trace_dir))
    except FileNotFoundError:  # the run never attached: nothing to tell
        return
    run_report.attach_evidence(summary, trace_dir)
    print("\n".join(run_report.incident_lines(summary)))


def _check(args: argparse.Namespace) -> int:
    from model_checking import check

    return check.run(args)


def _table(args: argparse.Namespace) -> int:
    from .fsm.table import render_markdown

    print(render_markdown())
    return 0


def _report(args: argparse.Namespace) -> int:
    """A missing run directory or an unreadable trace is the user's input: one line, exit 2."""
    from . import run_report

    try:
        return run_report.run(args)
    except (OSError, ValueError, AccelPactError) as exc:
        print(f"accelpact report: {_said(exc)}", file=sys.stderr)
        return 2


def _said(exc: BaseException) -> str:
    """An error as one sentence: an OSError's reason and path rather than its errno tuple."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _goodput(args: argparse.Namespace) -> int:
    from . import goodput

    return goodput.run(args)


def _qualify(args: argparse.Namespace) -> int:
    from .envelope import default_envelope_path
    from .qualify import probes

    out = args.out or str(default_envelope_path())
    frameworks = ("fsdp2",) if args.quick and args.frameworks is None else tuple(
        f.strip() for f in (args.frameworks or ",".join(probes.DEFAULT_FRAMEWORKS)).split(",") if f.strip())
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    phases = tuple(p.strip() for p in (args.phases or ",".join(probes.DEFAULT_PHASES)).split(",") if p.strip())
    print(f"qualifying {', '.join(frameworks)} x {', '.join(phases)}, {repeats} run(s) each", flush=True)
    try:
        result = probes.qualify(out, frameworks=frameworks, repeats=repeats, phases=phases,
                                data_timeout_s=args.data_timeout, trace_dir=args.traces,
                                progress=lambda line: print(line, flush=True), replace=not args.no_replace)
    except ValueError as exc:
        print(f"accelpact qualify: {exc}", file=sys.stderr)
        return 2
    except probes.QualifyError as exc:
        print(f"accelpact qualify: the probes could not run: {exc}", file=sys.stderr)
        return 1
    for finding in result.findings:
        print(f"finding: {finding}")
    if not result.platform_ok:
        print("finding: retire-and-rebuild failed on this platform: only restart is qualified")
    skipped = sorted(set(probes.DEFAULT_FRAMEWORKS) - set(frameworks))
    if skipped or set(phases) != set(probes.DEFAULT_PHASES):
        print(f"not probed (their rows allow only reject): frameworks {', '.join(skipped) or 'none'}; phases "
              f"{', '.join(sorted(set(probes.DEFAULT_PHASES) - set(phases))) or 'none'}. "
              "`accelpact qualify` without --quick probes every one")
    if result.timeouts is not None:  # what a runtime's "auto" timeouts start from
        print(f"timeouts: {result.timeouts.describe()}")
    print(f"wrote {result.path} ({len(result.rows)} rows, {result.wall_s:.0f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accelpact", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="4-rank HSDP training with faults, then a bitwise verdict")
    fw = demo.add_mutually_exclusive_group()
    fw.add_argument("--fsdp1", dest="framework", action="store_const", const="fsdp1")
    fw.add_argument("--ddp", dest="framework", action="store_const", const="ddp")
    fw.add_argument("--fsdp2", dest="framework", action="store_const", const="fsdp2")
    fw.add_argument("--profile", dest="framework", choices=("fsdp2", "fsdp1", "ddp", "fsdp2-full", "fsdp1-full"),
                    help="the job's shape: fsdp2 (HSDP 2x2, the default), fsdp1, ddp, or fsdp2-full / fsdp1-full "
                         "(FSDP2 fully_shard / FSDP1 FULL_SHARD over every rank: no replica holds a shard, see "
                         "--replicate)")
    demo.set_defaults(framework="fsdp2", func=_demo)
    demo.add_argument("--updates", type=_count(1), default=40)
    demo.add_argument("--nproc", type=_count(1), default=4)
    demo.add_argument("--spares", type=_count(0), default=0,
                      help="hot spares beside the --nproc ranks: one torchrun agent per rank (e.g. --spares 2 "
                           "--faults kill@12:forward:3,kill@25:committed:1)")
    demo.add_argument("--replicate", default="off", choices=("off", "neighbour"),
                      help="with --spares: 'neighbour' copies each shard no replica holds to a ring neighbour's "
                           "memory after every step, so a spare can take over a fully sharded rank "
                           "(e.g. --profile fsdp2-full --replicate neighbour --spares 1 --faults kill@12:backward:2)")
    demo.add_argument("--on-loss", default="reject", choices=("reject", "shrink"),
                      help="'shrink': a lost rank no spare takes over takes its replica group out of the job, which "
                           "goes on with the other replicas (opt-in: it changes the experiment; e.g. --on-loss shrink "
                           "--faults kill@12:committed:3)")
    demo.add_argument("--faults", default=None, help="fault plan, e.g. skip@8:committed:2 ('none' for none)")
    demo.add_argument("--trace-dir", default=None)
    demo.add_argument("--no-rebind", action="store_true", help="ablation: replace groups without rebinding")
    demo.add_argument("--envelope", default=None,
                      help="envelope file from `accelpact qualify` (default: its default path if present), "
                           "'builtin' or 'permissive'; backward/forward faults are rewound only where qualified")

    chk = sub.add_parser("check", help="model-check the protocol spec with TLC")
    try:
        from model_checking import check as _mc

        _mc.add_arguments(chk)
    except ImportError as exc:  # pragma: no cover - only in a broken install
        chk.add_argument("--ranks", type=int, default=3)
        chk.set_defaults(import_error=str(exc))
    chk.set_defaults(func=_check)

    tbl = sub.add_parser("table", help="print the protocol's transition table")
    tbl.set_defaults(func=_table)

    from . import goodput, run_report  # both import matplotlib only when they draw

    rep = sub.add_parser("report", help="recoveries, MTTD, repair per phase, RTO and a timeline PNG of a run")
    run_report.add_arguments(rep)
    rep.set_defaults(func=_report)

    gp = sub.add_parser("goodput", help="net time saved by in-memory recovery: the paper's model and the measured one")
    goodput.add_arguments(gp)
    gp.set_defaults(func=_goodput)

    qual = sub.add_parser("qualify", help="measure which recovery actions work here; write the envelope file")
    qual.add_argument("--out", default=None, help="envelope file (default: $ACCELPACT_ENVELOPE_DIR, "
                      "$XDG_CACHE_HOME/accelpact or ~/.cache/accelpact, envelope.json)")
    qual.add_argument("--frameworks", default=None, help="comma-separated: fsdp2,fsdp1,ddp (default: all)")
    qual.add_argument("--phases", default=None, help="comma-separated failure phases (default: "
                      "committed,forward,backward,optimizer)")
    qual.add_argument("--repeats", type=int, default=None, help="faults per probe (default 3; 1 with --quick)")
    qual.add_argument("--quick", action="store_true", help="fsdp2 only, one fault per probe (a few minutes)")
    qual.add_argument("--no-replace", action="store_true",
                      help="skip the Replace probes (a rank killed and taken over by a spare, per phase)")
    qual.add_argument("--data-timeout", type=float, default=1.0, help="data-plane timeout of the probes (s)")
    qual.add_argument("--traces", default=None, help="keep the probes' traces in this directory")
    qual.set_defaults(func=_qualify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
