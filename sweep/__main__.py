"""`python -m sweep`: parse, dispatch, map errors to exit codes."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import TYPE_CHECKING

from sweep.errors import Interrupted, SweepError, UsageError, one_line

if TYPE_CHECKING:
    from sweep import StudySession


def _n_jobs(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'auto', got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sweep", description=(
        "Hyperparameter sweeps with per-trial resume. Re-run the same `run` command after any "
        "interruption: finished trials are skipped, interrupted ones resume from their newest checkpoint."),
        epilog="Every study-file key, status --json field, export field and exit code: docs/reference.md; "
               "guides: docs/README.md (in the sweep repository).")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="start a study, or resume it after any interruption")
    run.add_argument("study_file", metavar="STUDY.yaml")
    run.add_argument("--n-jobs", type=_n_jobs, default=None, metavar="N|auto",
                     help="trials at once (overrides parallel.n_jobs); auto: one per device slot")
    run.add_argument("--quiet", action="store_true", help="only warnings, errors and the summary")
    run.add_argument("--verbose", action="store_true", help="also library logs (JAX, Orbax, Optuna)")
    run.add_argument("--log-every", type=float, default=30.0, metavar="SECONDS",
                     help="when stderr is not a terminal: seconds between progress lines (default 30)")
    status = sub.add_parser("status", help="what every trial is doing / has done")
    status.add_argument("study_file", metavar="STUDY.yaml")
    status.add_argument("--json", action="store_true", help="machine-readable output (every field: docs/reference.md, 'status --json')")
    export = sub.add_parser("export", help="write every finished trial's best checkpoint as safetensors + JSON")
    export.add_argument("study_file", metavar="STUDY.yaml")
    export.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    export.add_argument("--trial", type=int, default=None, metavar="N", help="export only trial N")
    export.add_argument("--include-pruned", action="store_true", help="also export PRUNED trials")
    plot = sub.add_parser("plot", help="optimization history, importances and every trial's learning curve")
    plot.add_argument("study_file", metavar="STUDY.yaml")
    plot.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    plan = sub.add_parser("plan", help="what `run` would do now (skip, resume, start, refuse), without running")
    plan.add_argument("study_file", metavar="STUDY.yaml")
    cont = sub.add_parser("continue", help="train finished trials further, from their last checkpoint "
                                           "(a companion study; re-run the same command after any interruption)")
    cont.add_argument("study_file", metavar="STUDY.yaml")
    cont.add_argument("--steps", type=int, required=True, help="train them to this many steps in total")
    which = cont.add_mutually_exclusive_group(required=True)
    which.add_argument("--top", type=int, metavar="K", help="the K best COMPLETE trials")
    which.add_argument("--trial", type=int, action="append", metavar="N", help="trial N (repeatable)")
    cont.add_argument("--quiet", action="store_true", help="only warnings, errors and the summary")
    for reader in (status, export, plot):
        reader.add_argument("--continued", type=int, metavar="STEPS", default=None,
                            help="the study's trials continued to STEPS steps (see `continue`)")
    drill = sub.add_parser("drill", help="recovery drill: kill a short copy of the study, restart it, measure")
    drill.add_argument("study_file", metavar="STUDY.yaml")
    drill.add_argument("--seed", type=int, default=None, help="seed of the random kill step")
    drill.add_argument("--keep", action="store_true", help="keep the drill's temporary workdir")
    retry = sub.add_parser("retry", help="train FAIL trials again under their number and params (after fixing the "
                                         "code), then run the study as `run` does")
    retry.add_argument("study_file", metavar="STUDY.yaml")
    retry.add_argument("--trial", type=int, action="append", metavar="N", help="only trial N (repeatable; default: "
                       "every FAIL trial)")
    retry.add_argument("--from-scratch", action="store_true", help="from step 0 (its checkpoints removed), not from "
                       "its newest checkpoint")
    retry.add_argument("--n-jobs", type=_n_jobs, default=None, metavar="N|auto", help="as for run")
    retry.add_argument("--quiet", action="store_true", help="only warnings, errors and the summary")
    replay = sub.add_parser("replay", help="scheduler pbt: retrain a trial's lineage from scratch and compare its "
                                           "final state with the saved one, bit for bit")
    replay.add_argument("study_file", metavar="STUDY.yaml")
    replay.add_argument("--trial", type=int, default=None, metavar="N", help="trial N (default: the best trial)")
    return p


def _cmd_replay(args: argparse.Namespace) -> int:
    import sweep
    from sweep.run import logs

    with sweep.open(args.study_file) as session:
        logs.setup()
        report = session.replay(args.trial)
    print("\n".join(report.lines()))
    return 0 if report.identical else 1


def _cmd_run(args: argparse.Namespace) -> int:
    import sweep
    from sweep.run import logs
    from sweep.run import pool as workers

    if isinstance(args.n_jobs, int) and args.n_jobs < 1:
        raise UsageError(f"--n-jobs: must be >= 1, got {args.n_jobs}")
    workers.prestart(args.study_file, args.n_jobs)  # n_jobs > 1: helpers import while we validate
    from sweep.commands.summary import incomplete

    try:
        with sweep.open(args.study_file) as session:
            if args.command == "retry":  # reopen the FAIL trials, then run: it resumes them
                logs.setup(args.quiet)
                session.retry(args.trial, from_scratch=args.from_scratch)
            # The summary instead of status(): it skips reading every trial again (a big study).
            session.run(args.n_jobs, quiet=args.quiet, verbose=getattr(args, "verbose", False),
                        log_every=getattr(args, "log_every", 30.0), exit_on_signal=True, read_status=False)
            print(session.summary())
            # exit 0 needs a COMPLETE trial (docs/reference.md, exit codes), feasible or not
            why = incomplete(session.config)
            if why is not None:
                raise SweepError(why)
    finally:
        workers.stop_prestarted()  # helpers run never used: it ended early (a study-file error, say)
    return 0


def _open(args: argparse.Namespace) -> StudySession:
    """The study named on the command line, or with --continued its companion study."""
    import sweep

    # Readers import the trial module only where they need it (status and plot never do).
    session = sweep.open(args.study_file, import_trial=False)
    if getattr(args, "continued", None) is None:
        return session
    return session.continued(args.continued)


def _cmd_continue(args: argparse.Namespace) -> int:
    import sweep

    with sweep.open(args.study_file).continue_(args.steps, args.top, args.trial, quiet=args.quiet,
                                               exit_on_signal=True) as session:
        print(session.summary())
        print(f"continued trials: python -m sweep status {args.study_file} --continued {args.steps}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from sweep.commands import status

    with _open(args) as session:
        report = session.status()
        changed = status.file_changes(session.config) if args.continued is None else []
    if changed:  # a reader still reads the study; the file is what `run` would refuse
        from sweep.study.fingerprint import mismatch_warning

        print(f"warning: {mismatch_warning(session.config, changed)}", file=sys.stderr)
    print(json.dumps(report, indent=1) if args.json else status.table(report, highlight=sys.stdout.isatty()))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sweep.run import logs
    from sweep.words import count

    with _open(args) as session:
        logs.setup(quiet=True)
        index = session.export(args.out, trial=args.trial, include_pruned=args.include_pruned)
    for entry in index["trials"]:
        front = " (Pareto-optimal)" if entry.get("pareto") else ""
        print(f"trial {entry['number']}: {entry['metric']}={entry['best_value']!r} at step {entry['best_step']}{front} "
              f"-> {Path(args.out) / entry['dir']}")
    for number, why in index.get("removed", {}).items():
        print(f"trial {number}: not exported, its checkpoints were removed ({why})")
    print(f"exported {count(len(index['trials']), 'trial')} of study {session.config.name} to {args.out} "
          f"({'Pareto-optimal' if 'objectives' in index else 'best'} first, index.json)")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sweep.run import logs
    from sweep.words import count

    with _open(args) as session:
        logs.setup()
        written = session.plot(args.out)
    out = Path(args.out)
    curves = [p for p in written if p.parent.name == "curves"]
    for path in written:
        if path not in curves:
            print(path)
    print(f"{out / 'curves'}: learning curves of {count(len(curves) // 2, 'trial')} (PNG + HTML)")
    print(f"wrote {count(len(written), 'file')} to {out}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    import sweep
    from sweep.run import plan as plan_lib

    with sweep.open(args.study_file, import_trial=False) as session:
        found = session.plan()
        print(plan_lib.text(session.config, found))
    return 2 if found.refused else 0  # what `run` would exit with


def _cmd_drill(args: argparse.Namespace) -> int:
    import sweep
    from sweep.run import logs
    from sweep.words import count

    with sweep.open(args.study_file) as session:
        logs.setup()
        report = session.drill(seed=args.seed, keep=args.keep)
    print(f"recovery drill of {session.config.path} (trial 0, {count(session.config.study.train.steps, 'step')}):")
    print("\n".join("  " + line for line in report.lines()))
    return 0 if report.bit_identical else 1


def main(argv: list[str] | None = None) -> int:
    from sweep.study.credentials import scrub

    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage; its code is 2 for errors, 0 for --help
        return int(exc.code or 0)
    from sweep.run import logs

    logs.route_warnings(verbose=getattr(args, "verbose", False))
    try:
        return {"run": _cmd_run, "status": _cmd_status, "export": _cmd_export, "plot": _cmd_plot,
                "plan": _cmd_plan, "drill": _cmd_drill, "replay": _cmd_replay,
                "continue": _cmd_continue, "retry": _cmd_run}[args.command](args)
    except Interrupted as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return exc.exit_code
    except SweepError as exc:
        if args.debug:
            print(scrub(traceback.format_exc()), end="", file=sys.stderr)
        print(f"error: {scrub(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # anything else is a bug or an environment problem: short message, exit 1
        if args.debug:
            print(scrub(traceback.format_exc()), end="", file=sys.stderr)
        print(f"error: {type(exc).__name__}: {scrub(one_line(exc))} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    from sweep.trial.guard import exit_now

    exit_now(main())  # not held up by threads a trial's code left running
