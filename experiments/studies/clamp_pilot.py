"""The clamp study's pilot, before its plan (`clamp_pilot`): off-policy humanline GRPO on addition sampled every 64
steps for 192 (3 sampling rounds, the horizon's batch, validation every 32 steps), the reference synced every 16 or 24
steps, with the scripts' defaults and with the authors' math settings (docs/paper-runs.md: KL 1e-4, clip 0.2, log-probs
at the sampling temperature 0.7, so the clamp acts on temperature-scaled log-ratios); one seed each, the horizon's
2e-5. It measures where the clamp acts (its share of tokens, averaged and on its largest step), with the horizon's
tables; no tests.
"""

from dataclasses import replace

import numpy as np
import report
import runner
from suites import Config, arm_flags, lr_flags, one_real_suite

from studies.second_study import HL, OFF
from studies.third_study import HORIZON_SECTIONS, VALID_EVERY_32, horizon_plot

N64 = runner.strip(OFF, "--max_steps") + ["--sample_every", "64"] + HL + VALID_EVERY_32
AUTHORS_MATH = ["--beta", "1e-4", "--eps", "0.2", "--logps_temperature", "0.7", "--advantage_std", "sample"]
ARMS = {
    f"grpo off-policy+humanline, N = 64, k = {k}{label}": ("grpo", "online", N64 + ["--sync_every", str(k)] + more)
    for k in (16, 24)
    for label, more in (("", []), (", authors' math settings", AUTHORS_MATH))
}


def clamp_pilot(results, chosen):
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


def pilot_plot(plt, rows, start):
    """The horizon's two panels (validation success and drift every 32 steps) and a third: the share of tokens the
    clamp acts on at each step, what the pilot is for (the sampling rounds start at steps 0, 64 and 128)."""
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.2))
    horizon_plot(plt, rows, start, axes=axes[:2])
    for i, r in enumerate(rows):
        for run in r["train"]:
            axes[2].plot(*zip(*run["humanline/clamped_frac"]), color=f"C{i}", lw=0.8)
    axes[2].set_title("the clamp: share of tokens outside [-1.5, 1.5] at each step", fontsize=9)
    axes[2].set_xlabel("optimizer step", fontsize=8)
    fig.suptitle("the clamp study's pilot: one seed a setting", fontsize=10)
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
    for r in rows:
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
PILOT = one_real_suite("addition", clamp_pilot, SECTIONS, f"{NOTE} {SAME_NUMBERS}", "valid", 128)
SUITES = {"clamp_pilot": replace(PILOT, plot=pilot_plot, same_numbers=SAME_NUMBERS)}
