"""Reproduce the paper's comparisons on the toy task and on a real model: rates chosen per variant, seeds, p-values.

    python experiments/run.py                      # the toy's suites, in order (240 runs, ~3 h on 2 cores; resumable)
    python experiments/run.py --suite sweep        # or main
    python experiments/run.py --report             # only rebuild the toy's tables and plots from finished runs
    python experiments/run.py --quick              # each code path of every toy suite, 2 steps (about 2.5 minutes)
    python experiments/run.py --suite addition_sweep && python experiments/run.py --suite addition      # real model
    python experiments/run.py --suite instructions_sweep && python experiments/run.py --suite instructions
    python experiments/run.py --suite horizon --commands   # each pending run as one line, for a scheduler to run

The order matters: a suite's runs train at the rates its sweep chose (each study's file in studies/ says what its
suites run; the real model's run only when named, once `python experiments/smollm2.py model` has made it). runner.py
runs them (one CPU thread each, `--jobs` at a time; finished runs are skipped, so an interrupted invocation continues
where it stopped) and packs them into `results/<suite>.tar.gz`; with `--commands` a scheduler runs them instead (each
line a runner.py of its own, which finishes its run as the local runner does) and `--report` packs what finished.
report.py writes `results/<suite>.md` (tables), `<suite>.jsonl` (one line
per configuration) and `<suite>.png` from the archives. A table holds runs of one version of the code (every attempt's
`provenance.code` in their `args.json`) unless `--mix_code` says otherwise.
"""

import argparse
import os

import report
import runner
import smollm2
import studies

RESULTS = os.path.join(runner.ROOT, "experiments", "results")


def configurations(results, quick):
    """suite -> its configurations at the rates chosen so far; --quick: each code path once, 2 steps, paper's rates."""
    if not quick:
        chosen = report.choose_rates(results)
        return {name: entry.runs(results, chosen) for name, entry in studies.SUITES.items()}, chosen
    chosen = {variant: rate for entry in studies.SUITES.values() for variant, rate in (entry.paper_rates or {}).items()}
    seen, out = set(), {}
    for name in sorted(studies.SUITES, key=lambda n: n != "main"):  # main first: the sweep adds no new path
        entry = studies.SUITES[name]
        out[name] = runner.quick(entry.runs(results, chosen), seen, real=entry.task is not None)
    return out, chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = list(studies.SUITES)
    parser.add_argument("--suite", default="all", choices=["all"] + names, help="all: the toy's suites")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each uses one CPU thread)")
    parser.add_argument("--quick", action="store_true", help="each code path of every suite once, 2 steps")
    parser.add_argument("--report", action="store_true", help="only pack and summarise finished runs")
    parser.add_argument("--commands", action="store_true", help="print each pending run as one line, run nothing")
    parser.add_argument("--only", default="", help="only configurations whose name contains this text")
    parser.add_argument("--mix_code", action="store_true", help="allow a table to hold runs of several code versions")
    parser.add_argument("--results", default=RESULTS, help="results directory (--quick: a `quick` folder in it)")
    args = parser.parse_args()
    results = os.path.join(args.results, "quick") if args.quick else args.results
    os.makedirs(results, exist_ok=True)
    entries = {n: studies.SUITES[n] for n in names}
    chosen_suites = [n for n in names if not entries[n].task] if args.suite == "all" else [args.suite]
    real = os.path.exists(os.path.join(runner.ROOT, smollm2.MODEL))
    if entries[chosen_suites[0]].task and not (real or args.report or args.commands):
        parser.error("the model is not made yet: python experiments/smollm2.py model")
    for suite in [s for s in chosen_suites if not entries[s].reads] if not args.report else []:  # re-scorings run none
        configs, chosen = configurations(results, args.quick)  # again for each suite: the sweep before it chose
        if args.commands:  # for a scheduler: its lines, one per pending run, and nothing else on stdout
            for name, script, flags, seed in runner.pending(results, suite, entries[suite], configs[suite], args.only):
                print(runner.command(results, suite, name, script, flags, seed, entries[suite].task))
            continue
        runner.run_suite(results, suite, entries[suite], configs[suite], args.jobs, args.only)
    if args.commands:
        return
    configs, chosen = configurations(results, args.quick)
    for suite in chosen_suites:
        runner.pack(results, suite)  # the runs finished outside run_suite (--commands'), as run_suite packs its own
        note = "" if args.quick else entries[suite].note(results, chosen)
        report.report(results, suite, configs[suite], args.mix_code, note)


if __name__ == "__main__":
    main()
