"""The clamp study, on addition: off-policy GRPO sampled every 64 steps for 192 (3 sampling rounds, the horizon's
batch), where a reference synced every 12-24 steps is old enough for the clamp to act.

The pilot (`clamp_pilot`, before the plan): humanline synced every 16 or 24 steps, with the scripts' defaults and with
the authors' math settings (docs/paper-runs.md: KL 1e-4, clip 0.2, log-probs at the sampling temperature 0.7, so the
clamp acts on temperature-scaled log-ratios); one seed each on the validation prompts, the horizon's 2e-5; no tests.
The comparison (`clamp`, docs/results.md, "The clamp study: the plan", committed before its runs): six arms at the
authors' settings, 6 seeds, 2e-5, the test prompts every 32 steps; four paired tests, Holm. After its last run:

    python experiments/studies/clamp_study.py read    # draws the blind read of its answers (clamp_read/)
"""

import argparse
import json
import os
import sys
from dataclasses import replace

import numpy as np

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, EXPERIMENTS)  # `python experiments/studies/clamp_study.py read` from the root
import plots  # noqa: E402
import report  # noqa: E402
import runner  # noqa: E402
import stat_tests  # noqa: E402
from report import fmt  # noqa: E402
from suites import Config, arm_flags, lr_flags, one_real_suite  # noqa: E402

from studies.second_study import HL, NO_ANCHOR, OFF  # noqa: E402
from studies.third_study import HORIZON_SECTIONS, SYNC_ONLY, VALID_EVERY_32, horizon, horizon_plot  # noqa: E402

N64 = runner.strip(OFF, "--max_steps") + ["--sample_every", "64"] + HL + VALID_EVERY_32
AUTHORS_MATH = ["--beta", "1e-4", "--eps", "0.2", "--logps_temperature", "0.7", "--advantage_std", "sample"]
ARMS = {
    f"grpo off-policy+humanline, N = 64, k = {k}{label}": ("grpo", "online", N64 + ["--sync_every", str(k)] + more)
    for k in (16, 24)
    for label, more in (("", []), (", authors' math settings", AUTHORS_MATH))
}


def pilot_runs(results, chosen):
    return [
        Config(name, "grpo_humanline.py", arm_flags("addition", arm) + lr_flags(2e-5), (100,))
        for name, arm in ARMS.items()
    ]


NOTE = "The clamp study's pilot: one seed a setting, before the study's plan; no tests."
# its k = 16 runs ran the scripts before their restructuring (the numbered phases, make_reference in each), its k = 24
# runs after: the check below shows the two computing alike, so one table holds both
SAME_NUMBERS = (
    "Its k = 16 runs ran code c853f2810f45741b, its k = 24 runs 9c9db21969b175b6 (the scripts restructured): each"
    " setting's command with --sample_every 2 --sync_every 2 --max_steps 4 --num_eval_prompts 8 gave the same metrics,"
    " key for key, and the same answers under both, and tests/test_pinned.py passed unchanged."
)


SMOOTH = 8  # the clamp's panel averages this many steps: a step's share swings too much to read arm by arm


def pilot_plot(plt, rows, start, title="the clamp study's pilot: one seed a setting", scored="validation"):
    """The horizon's two panels (success and drift every 32 steps) and a third: the share of tokens the clamp acts on,
    what the study is about, each arm's mean over seeds and SMOOTH steps, on a log scale so that an arm at 1% shows
    beside one at 10% (dotted: the sampling rounds' starts); the legend below all three."""
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.2))
    horizon_plot(plt, rows, start, axes=axes[:2], scored=scored)
    for i, r in enumerate(rows):
        steps, mean, _ = plots.mean_curve([run["humanline/clamped_frac"] for run in r["train"]])
        w = min(SMOOTH, len(mean))  # a short run (the tests') averages all its steps
        axes[2].plot(steps[w - 1 :], np.convolve(mean, np.ones(w) / w, "valid"), color=f"C{i}", lw=1.5)
    for step in range(64, int(steps[-1]), 64):
        axes[2].axvline(step, color="gray", ls=":", lw=0.8)
    axes[2].set_yscale("symlog", linthresh=1e-3)
    axes[2].set_ylim(bottom=0)
    axes[2].set_title(f"the clamp: share of tokens outside [-1.5, 1.5], mean of {SMOOTH} steps", fontsize=9)
    axes[2].set_xlabel("optimizer step", fontsize=8)
    axes[0].get_legend().remove()
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def clamp_when(rows, ctx):
    """Where in training the clamp acts: its share of tokens over the first and the second half of each sync window
    (the reference k steps old at most) and over each sampling round, every step of the row's seeds weighed alike."""
    lines = [
        "",
        "The clamp's share of tokens by where a step falls: in the first or the second half of a sync window (the",
    ]
    lines += ["reference synced every k steps: in the second half it is k/2 steps old or more) and in each sampling"]
    lines += ["round of 64 steps:"]
    shown = []
    for r in [r for r in rows if "--sync_every" in r["flags"]]:  # the arms synced every k > 1 steps
        k, n = (int(r["flags"][r["flags"].index(f) + 1]) for f in ("--sync_every", "--sample_every"))
        steps = [(step, v) for run in r["train"] for step, v in run["humanline/clamped_frac"]]
        share = lambda keep: f"{np.mean([v for step, v in steps if keep(step - 1)]):.4f}"  # noqa: E731
        cells = [share(lambda i: i % k < k // 2), share(lambda i: i % k >= k // 2)]
        cells += [share(lambda i, j=j: i // n == j) for j in range(max(step for step, _ in steps) // n)]
        shown.append([r["config"], k, *cells])
    return lines + [
        "",
        *report.table("configuration | k | first half | second half | round 1 | round 2 | round 3", shown),
    ]


SECTIONS = (*HORIZON_SECTIONS[:-1], clamp_when, HORIZON_SECTIONS[-1])  # before the answers
PILOT = one_real_suite("addition", pilot_runs, SECTIONS, f"{NOTE} {SAME_NUMBERS}", "valid", 128)
SUITES = {"clamp_pilot": replace(PILOT, plot=pilot_plot, same_numbers=SAME_NUMBERS)}


# ---- the comparison (docs/results.md, "The clamp study: the plan"): the pilot's choice, the authors' math settings
# at k = 24 (the clamp acts on 1.13% of tokens there), in every arm but where an arm changes one of them
TEST_EVERY_32 = ["--keep_every_eval", "--max_steps", "192", "--eval_every", "32"]  # the test prompts: nothing is chosen
BASE = runner.strip(OFF, "--max_steps") + TEST_EVERY_32 + AUTHORS_MATH
N64_AUTHORS = BASE + ["--sample_every", "64"]
INITIAL = ["--kl_baseline", "initial"]  # the KL to the starting model (the authors' TRL reference, never synced)
HUMANLINE, SYNC = "grpo off-policy+humanline, N = 64, k = 24", "grpo off-policy, sync only, N = 64, k = 24"
ONLINE, CONTROL, PLAIN = "grpo online, N = 1", "grpo off-policy, N = 64, no anchor", "grpo off-policy, N = 64"
K1 = "grpo off-policy+humanline, N = 64, k = 1"
STUDY_ARMS = {  # in the order each seed runs them: the clamp's own test first
    HUMANLINE: N64_AUTHORS + HL + ["--sync_every", "24"],
    SYNC: N64_AUTHORS + SYNC_ONLY + ["--sync_every", "24"],  # the same sync, no clamp
    # the plan's amendment (before either arm ran): without a sync, the authors' KL is to the initial model
    ONLINE: BASE + INITIAL,  # sampled every step
    CONTROL: runner.strip(runner.strip(N64_AUTHORS, "--beta"), "--eps") + NO_ANCHOR,  # no KL, a clip that never binds
    PLAIN: N64_AUTHORS + INITIAL,  # the ratio clipped around the stale sampler, the KL to the start
    K1: N64_AUTHORS + HL,  # synced every step: the paper's collapse
}
SEEDS = tuple(range(6))
PAIRS = [(HUMANLINE, SYNC), (HUMANLINE, ONLINE), (HUMANLINE, CONTROL), (K1, HUMANLINE)]


def study_runs(results, chosen):
    return [
        Config(name, "grpo_humanline.py", arm_flags("addition", ("grpo", "online", flags)) + lr_flags(2e-5), SEEDS)
        for name, flags in STUDY_ARMS.items()
    ]


def clip(rows, ctx):
    """The ratio clip's share of tokens, averaged over training and on the largest step (the clamp's: `signal`)."""
    lines = ["", "The share of tokens the ratio clip binds on, averaged over training (mean ± standard error over"]
    lines += ["seeds) and on the largest step of any seed:", ""]
    shown = [
        [r["config"], r["seeds"], fmt(r["clip_frac"], 4), f"{report.largest_step(r, 'clip_frac'):.4f}"] for r in rows
    ]
    return lines + report.table("configuration | seeds | clipped tokens | largest step's", shown)


COLLAPSE_FALL = 0.20  # the plan's rule: a seed whose last evaluation is this far below its best has collapsed


def collapsed(curve, start):
    """A seed's curve [(step, success, _)] collapsed: its last evaluation 0.20 or more below its best, or below the
    starting model's success."""
    values = [v for _, v, _ in curve]
    return round(max(values) - values[-1], 9) >= COLLAPSE_FALL or values[-1] < start  # 0.6 - 0.4 is 0.1999...


def collapse(rows, ctx):
    """The plan's collapse rule, read from each seed's curve; an arm collapses where at least half its seeds do."""
    start, shown = ctx.entry.start(), []
    for r in rows:
        fell = [s["seed"] for s, curve in zip(r["args"], r["curves"]) if collapsed(curve, start)]
        verdict = "collapses" if 2 * len(fell) >= r["seeds"] else "does not collapse"
        shown.append([r["config"], r["seeds"], ", ".join(map(str, fell)) or "none", verdict])
    lines = ["", f"A seed collapses (the plan's rule) if its last evaluation is {COLLAPSE_FALL:.2f} or more below its"]
    lines += [f"best, or below the starting model's {start:.3f}; an arm collapses if at least half its seeds do:", ""]
    return lines + report.table("configuration | seeds | seeds collapsed | the arm", shown)


# ---- the blind read (the plan's): drawn after the last run, labelled by a reader who sees neither arm nor seed
READ = os.path.join(EXPERIMENTS, "results", "clamp_read")  # sample.jsonl, key.jsonl, labels.jsonl
SUCCESSES, FAILURES, RULE_SHARE = 4, 2, 0.10  # drawn from each run; the not-counted share that re-runs the tests


def draw(out=READ):
    """Draw the blind read from the study's archive: up to 4 successes and 2 failures of every run."""
    results = os.path.join(EXPERIMENTS, "results")
    rows = report.summarize(runner.load_runs(results, "clamp"), study_runs(results, {}))
    runs = [(r["config"], s["seed"], run) for r in rows for s, run in zip(r["args"], r["answers"])]
    drawn = report.blind_read(runs, out, SUCCESSES, FAILURES, key=lambda answer: dict(reward=answer["reward"]))
    print(f"{drawn} answers drawn into {out}")


def read(rows, ctx, out=READ):
    """The read against the reward: per arm, the share of its drawn successes the reader would not count as the sum
    and of its failures they would (95% Wilson intervals). Where an arm's first share reaches 10%, the four tests
    again on each run's success times the share of its drawn successes the reader counts (the plan)."""
    if not os.path.exists(os.path.join(out, "labels.jsonl")):
        return ["", "The blind read: drawn and read after the study's last run (`clamp_study.py read`)."]
    key = {k["id"]: k for k in map(json.loads, open(os.path.join(out, "key.jsonl")))}
    labelled = [key[x["id"]] | x for x in map(json.loads, open(os.path.join(out, "labels.jsonl")))]
    shown, worst = [], 0.0
    for r in rows:
        cells = [r["config"]]
        for success in (True, False):
            mine = [x for x in labelled if x["arm"] == r["config"] and (x["reward"] == 1) == success]
            odd = sum(x["countable"] != success for x in mine)  # a success not counted, a failure counted
            lo, hi = stat_tests.wilson(odd, len(mine))
            cells += [len(mine), f"{odd / len(mine):.2f} ({lo:.2f}, {hi:.2f})" if mine else "–"]
            worst = max(worst, odd / len(mine)) if success and mine else worst
        shown.append(cells)
    lines = ["", "The blind read: per arm, its drawn successes and the share the reader would not count as the sum,"]
    lines += ["its drawn failures and the share the reader would (95% Wilson intervals):", ""]
    lines += report.table("arm | successes read | not counted | failures read | counted", shown)
    if worst < RULE_SHARE:
        return lines + ["", f"No arm reaches {RULE_SHARE:.0%} of successes not counted: the tests above stand alone."]

    def counted(r, seed):  # the share of a run's drawn successes the reader counts (1 where none was drawn)
        mine = [x["countable"] for x in labelled if (x["arm"], x["seed"], x["reward"]) == (r["config"], seed, 1)]
        return np.mean(mine) if mine else 1.0

    adjusted = [r | dict(rewards=[x * counted(r, s["seed"]) for x, s in zip(r["rewards"], r["args"])]) for r in rows]
    tests = stat_tests.paired(adjusted, ctx.entry.pairs(ctx.names), ctx.entry.margin, resamples=0)
    shown = [[t["comparison"], t["seeds"], f"{t['diff']:+.3f} ({t['ci'][0]:+.3f}, {t['ci'][1]:+.3f})"] for t in tests]
    shown = [cells + [f"{t['p_holm']:.3g}", t["verdict"]] for cells, t in zip(shown, tests)]
    lines += ["", "The four tests on each run's success times the share of its drawn successes the reader counts:", ""]
    return lines + report.table("comparison | seeds | difference (95% interval) | p (paired, Holm) | verdict", shown)


PLAN = 'The plan of these runs: docs/results.md, "The clamp study: the plan", committed before them.'
STUDY = one_real_suite(
    "addition", study_runs, ("long", "paired", "real", "signal", clip, clamp_when, horizon, collapse), PLAN
)
STUDY = replace(STUDY, sections=(*STUDY.sections, "phrasing", "answers", read), pairs=lambda names: PAIRS)
SUITES["clamp"] = replace(STUDY, plot=lambda plt, rows, start: pilot_plot(plt, rows, start, "the clamp study", "test"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Draw the clamp study's blind read (after its last run).")
    parser.add_argument("command", choices=["read"], help="write clamp_read/sample.jsonl and key.jsonl")
    parser.parse_args()
    draw()
