"""The third study (docs/results.md, "The third study: the plan", committed before its runs in d37e3e0), on the
addition task: D, what in offline humanline GRPO does the work (`dissection_sweep`, `dissection`: 10 seeds, A's
humanline and control runs copied from `anchor`), E, C's two decisive off-policy comparisons with the seeds their power
asks (`offpolicy_powered`: 14 seeds, C's 5 copied), and F, the horizon (`horizon`: C's online, k = 1 and control arms
for 192 steps, validation success and drift every 32 steps; no tests). Its rates' keys: "addition third study: <arm>";
the arms the second study swept keep its rates.
"""

from dataclasses import replace

import plots
import runner
import smollm2
from report import fmt, mean_se, scored_on, table
from suites import Config, arm_flags, lr_flags, one_real_suite, real, real_suites

from studies.second_study import ANCHOR_ARMS, CONTROL, K1, K4, NO_ANCHOR, OFFPOLICY_ARMS, ON, STUDY, SWEEP_SEEDS

THIRD, TEN = "third study: ", tuple(range(10))
SYNC_ONLY = ["--sync", "humanline", "--clip", "none"]
HUMANLINE, NO_ANCHOR_ARM = "grpo offline+humanline", "grpo offline, no anchor"  # A's, at its rates, its runs copied
DISSECTION_ARMS = {name: ANCHOR_ARMS[name] for name in (HUMANLINE, NO_ANCHOR_ARM)} | {
    # humanline without its clamp: the reference synced every step, the ratio clip (0.15) and KL (0.01) to it
    "grpo offline, sync only": ("grpo", "offline", SYNC_ONLY, (1, 4, 16), TEN),
    # ... and without either: policy gradient weighted by pi_theta / pi_(previous step), about 1
    "grpo offline, sync only, no clip or KL": ("grpo", "offline", SYNC_ONLY + NO_ANCHOR, (1, 4, 16), TEN),
    # plain offline GRPO's two anchors to the starting model, one at a time
    "grpo offline, ratio clip only": ("grpo", "offline", ["--beta", "0"], (1, 4, 16), TEN),
    "grpo offline, KL only": ("grpo", "offline", ["--eps", "1e9"], (1, 4, 16), TEN),
}
DISSECTION_PAIRS = [(arm, to) for arm in list(DISSECTION_ARMS)[2:] for to in (HUMANLINE, NO_ANCHOR_ARM)]
# the plan's amendment: the ratio clip alone at 2e-5 too (its sweep chose a higher rate), so that every arm has a row at
# the rate the others chose, and two more comparisons (Holm over ten)
CLIP_AT_2E5, CLIP_ONLY = "grpo offline, ratio clip only, at 2e-5", DISSECTION_ARMS["grpo offline, ratio clip only"]
DISSECTION_PAIRS += [(CLIP_AT_2E5, HUMANLINE), (CLIP_AT_2E5, NO_ANCHOR_ARM)]
# C's two decisive comparisons with the seeds their power asks (seeds 0-4: C's runs, copied)
POWERED_ARMS = {name: OFFPOLICY_ARMS[name][:4] + (tuple(range(14)),) for name in (ON, K4, CONTROL)}
POWERED_PAIRS = [(CONTROL, ON), (K4, CONTROL)]
# F: C's online, k = 1 and control arms for 192 steps (12 sampling rounds), validation success and the answers' drift
# every 32 steps (each evaluation's answers kept, their perplexity under the starting model measured); no tests
VALID_EVERY_32 = ["--eval_prompts", smollm2.data("addition", "valid"), "--num_eval_prompts", "128", "--keep_every_eval"]
VALID_EVERY_32 += ["--max_steps", "192", "--eval_every", "32"]
HORIZON_ARMS = {
    name: (algo, mode, runner.strip(more, "--max_steps") + VALID_EVERY_32, grid, (0, 1, 2))
    for name in (ON, K1, CONTROL)
    for algo, mode, more, grid, _ in [OFFPOLICY_ARMS[name]]
}


def horizon(rows, ctx):
    """Each arm's validation success and drift (its answers' perplexity under the starting model) at each evaluation,
    and per seed its last success against its best (the plan's collapse rule reads them)."""
    steps = sorted({s for r in rows for c in r["curves"] for s, _, _ in c})
    at = lambda series, step: [v for run in series for s, v, *_ in run if s == step]  # noqa: E731
    scored = scored_on(ctx.entry).capitalize()  # the horizon's validation prompts, the clamp study's test ones
    lines = ["", f"{scored} success at each evaluation (the starting model's: {ctx.entry.start():.3f}) and, in"]
    lines += ["brackets, the drift (the answers' perplexity under the starting model); mean ± standard error over"]
    lines += ["seeds:", ""]
    cell = lambda r, s: f"{fmt(mean_se(at(r['curves'], s)))} ({fmt(mean_se(at(r.get('drifts', []), s)), 2)})"  # noqa: E731
    lines += table(
        "configuration | " + " | ".join(map(str, steps)), [[r["config"]] + [cell(r, s) for s in steps] for r in rows]
    )
    lines += ["", "Each seed's last success, its best evaluation, and the fall from that best:", ""]
    shown = []
    for r in rows:
        for seed, curve in zip(r["args"], r["curves"]):
            last, best = curve[-1][1], max(v for _, v, _ in curve)
            shown.append([r["config"], seed["seed"], f"{last:.3f}", f"{best:.3f}", f"{best - last:.3f}"])
    return lines + table("configuration | seed | last | best | fall", shown)


def horizon_plot(plt, rows, start, axes=None, scored="validation"):
    """The horizon's curves: validation success and drift (the answers' perplexity under the starting model) at each
    evaluation, each seed a thin line and the arm's mean over seeds a thick one (on two given axes: another study's
    figure)."""
    fig, axes = (None, axes) if axes is not None else plt.subplots(1, 2, figsize=(13, 4.2))
    for i, r in enumerate(rows):
        success = [[(step, value) for step, value, _ in curve] for curve in r["curves"]]
        for ax, series in zip(axes, (success, r.get("drifts", []))):
            for run in series:
                ax.plot(*zip(*run), color=f"C{i}", lw=0.8, alpha=0.4)
            if series:
                steps, mean, _ = plots.mean_curve(series)
                ax.plot(steps, mean, color=f"C{i}", lw=2.2, marker="o", ms=3, label=f"{r['config']} (n={r['seeds']})")
                ax.set_xticks(steps)
    if start is not None:
        axes[0].axhline(start, color="gray", ls="--", lw=1, label="starting model")
    axes[0].set_title(f"{scored} success", fontsize=9)
    axes[1].set_title("drift: the answers' perplexity under the starting model", fontsize=9)
    for ax in axes:
        ax.set_xlabel("optimizer step", fontsize=8)
    axes[0].legend(fontsize=7)
    if fig is not None:
        fig.suptitle("the horizon: each seed (thin) and the mean over seeds (thick) at each evaluation", fontsize=10)
    return fig


THIRD_PLAN = 'The plan of these runs: docs/results.md, "The third study", committed before them in d37e3e0.'
A_RATES = dict(earlier_prefix=STUDY, note=THIRD_PLAN)  # the arms the second study swept, at its rates
D = ("dissection", DISSECTION_ARMS, DISSECTION_PAIRS, SWEEP_SEEDS, THIRD, True, ["phrasing"])
SUITES = real_suites("addition", *D, earlier=(HUMANLINE, NO_ANCHOR_ARM), copies="anchor", **A_RATES)


def dissection(results, chosen, at_chosen_rates=SUITES["dissection"].runs):
    fixed = Config(CLIP_AT_2E5, "grpo_humanline.py", arm_flags("addition", CLIP_ONLY) + lr_flags(2e-5), TEN)
    return at_chosen_rates(results, chosen) + [fixed]


SUITES["dissection"] = replace(SUITES["dissection"], runs=dissection)
POWERED = dict(earlier=tuple(POWERED_ARMS), copies="offpolicy_addition", more=["signal", "phrasing"], **A_RATES)
SUITES |= real_suites("addition", "offpolicy_powered", POWERED_ARMS, POWERED_PAIRS, (), THIRD, **POWERED)
HORIZON_SECTIONS = ("long", "real", horizon, "signal", "phrasing", "answers")
HORIZON = real("addition", HORIZON_ARMS, THIRD, earlier=tuple(HORIZON_ARMS), earlier_prefix=STUDY)
SUITES["horizon"] = replace(
    one_real_suite("addition", HORIZON, HORIZON_SECTIONS, THIRD_PLAN, "valid", 128), plot=horizon_plot
)
