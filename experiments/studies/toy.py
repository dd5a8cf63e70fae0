"""The toy's comparison, the README's first result: each of the 12 variants (DPO, KTO, GRPO x offline, offline +
humanline, online, online + humanline) at 5 learning rates on the validation prompts (`sweep`, 3 seeds), then at the
rate each chose on the test prompts (`main`, 5 seeds, evaluated every 10 steps). docs/results.md, "Results on the toy
task".
"""

import json
import math
import os

import numpy as np
import plots
import report
from report import fmt, table
from suites import Config, Suite, lr_flags, paper_lr, rate_of

import toy_task

MULTIPLES = (0.25, 0.5, 1, 2, 4)  # the sweep, x the paper's rate (humanline variants may need 0.1x-4x, the paper says)
SHARED_LR = 5e-6  # one rate in every variant's sweep (the scripts' default): the shared-rate table
SWEEP_SEEDS, SEEDS, FEW_SEEDS = (100, 101, 102), (0, 1, 2, 3, 4), (0, 1, 2)  # the sweep's seeds are used nowhere else
CURVE = ["--eval_every", "10"]  # test prompts, at step 0 and every 10 steps
VALIDATION = ["--eval_prompts", "toy:valid", "--eval_every", "0"]  # validation prompts, at the end
MODES = {
    "offline": ["--offline"],
    "offline+humanline": ["--offline", "--humanline"],
    "online": ["--online"],
    "online+humanline": ["--online", "--humanline"],
}
CELLS = [(f"{a} {mode}", f"{a}_humanline.py", flags) for a in ("dpo", "kto", "grpo") for mode, flags in MODES.items()]
# the real model: each task's variants, rates 1x, 4x and 16x the paper's, one seed each in the sweep (the budget's)


def sweep(results, chosen):
    rates = [(c, s, f, m * paper_lr(c)) for c, s, f in CELLS for m in MULTIPLES]
    return [Config(f"{c} lr {lr:g}", s, f + lr_flags(lr) + VALIDATION, SWEEP_SEEDS, c, lr) for c, s, f, lr in rates]


def main(results, chosen):
    return [Config(c, s, f + lr_flags(chosen[c]) + CURVE, SEEDS) for c, s, f in CELLS if c in chosen]


def toy_start(split):
    """The starting policy's greedy reward on the toy's test prompts (measured when the task was built) or validation
    prompts (measured here, the way the scripts evaluate: greedy, the same scorer)."""
    toy = toy_task.load()
    if split == "test":
        with open(toy.stats) as f:
            return json.load(f)["policy/test_reward"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = [json.loads(line)["prompt"] for line in open(toy.prompts_valid)]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(toy.model).eval(), AutoTokenizer.from_pretrained(toy.model)
    return toy_task.accuracy(model, tokenizer, prompts)[1]


def main_pairs(names):
    return [
        (f"{a} {x}", f"{a} {y}")
        for a in ("dpo", "kto", "grpo")
        for x, y in (("offline+humanline", "offline"), ("offline+humanline", "online"), ("online+humanline", "online"))
    ]


def rates_line(chosen, cells):
    """The line under a suite's title: the rates its rows ran at."""
    names = {c for c, _, _ in cells}
    listed = ", ".join(f"{c} {r:g}" for c, r in chosen.items() if c in names) or "none yet"
    return f"Learning rates chosen on the validation prompts (the sweep): {listed}."


# ---- the sweep's tables and the settings -------------------------------------------------------------------------
def setup_table(rows):
    """What each variant ran with, read from its runs' args.json (the README's setup table): every setting but the
    learning rate, which the sweep varies and the other tables give per row, then the settings all variants share."""
    runs = {}
    for r in rows:
        runs.setdefault(r["config"].rsplit(" lr ", 1)[0], []).extend(r["args"])

    def value(args, key):  # one value, or all that occur
        return ", ".join(sorted({json.dumps(a.get(key)).strip('"') for a in args}))

    columns = "variant | batch | beta | max grad norm | sync | clamp (log bounds) | GRPO PPO eps | online samples"
    found = []
    for cell, args in runs.items():
        v = lambda key: value(args, key)  # noqa: E731
        online, grpo = v("online") == "true", cell.startswith("grpo")
        samples = f"rounds of {v('round_size')} prompts x {v('num_samples')}, best vs worst"
        samples = f"{v('num_generations')} per prompt, every step" if grpo else samples
        sync = v("sync") + (", every " + v("sync_every") + " step(s)" if v("sync") != "none" else "")
        clamp = v("clip") + (" [" + v("log_eps_P") + ", " + v("log_eps_R") + "]" if v("clip") != "none" else "")
        found.append([cell, v("batch_size"), v("beta"), v("max_grad_norm"), sync, clamp, v("eps") if grpo else "–"])
        found[-1] += [samples if online else "–", v("temperature") if online else "–"]
    lines = table(columns + " | temperature", found)
    every = [a for args in runs.values() for a in args]
    lines += [
        "",
        f"All variants: {value(every, 'max_steps')} steps, AdamW (eps {value(every, 'adam_eps')}, weight decay "
        f"{value(every, 'weight_decay')}), warmup {value(every, 'warmup_ratio')} of the steps, reference-free "
        f"{value(every, 'ref_free')}, at most {value(every, 'max_new_tokens')} new tokens per sample.",
    ]
    return lines


def settings(rows, ctx):
    """What each variant ran with; the sweep's is also the README's setup table (the other suites change only the
    learning rate and evaluation)."""
    if ctx.entry.chooses_rates:
        with open(os.path.join(ctx.results, "setup.md"), "w") as f:
            f.write("\n".join(setup_table(rows)) + "\n")
    return ["", "The settings of each variant, from its runs' args.json:", ""] + setup_table(rows)


def sweep_cell(c, bold):
    """A sweep's cell: the mean validation reward, in bold at the chosen rate, (n=) while seeds are missing."""
    if not c:
        return ""
    if bold:
        return f"**{fmt(c['reward'])}**"
    return fmt(c["reward"]) + ("" if c["seeds"] == len(SWEEP_SEEDS) else f" (n={c['seeds']})")


def sweep_tables(rows, ctx):
    """The sweep: each variant's validation reward at each rate, the rate chosen, the shared rate beside it, and the
    mechanism offline (margin or |log-ratio| and the clamped fraction) at each rate."""
    at, chosen, start = report.at_rates(ctx.configs, rows), report.best_rates(ctx.configs, rows), toy_start("valid")
    lines = [
        "Mean reward on the 256 validation prompts (3 seeds, ± standard error) at each learning rate, as a multiple of "
        f"the paper's rate for that variant (its Table 3); the chosen rate has the highest mean. The starting policy "
        f"scores {start:.3f} on these prompts.",
        "",
    ]
    found = []
    for cell, _, _ in CELLS:
        rates = [f"{m * paper_lr(cell):g}" for m in MULTIPLES]
        best = rates.index(f"{chosen[cell]:g}") if cell in chosen else None
        shown = [sweep_cell(at.get((cell, rate)), i == best) for i, rate in enumerate(rates)]
        found.append([cell, f"{paper_lr(cell):g}", *shown, rates[best] if cell in chosen else "not yet"])
    lines += table("variant | paper's rate | " + " | ".join(f"{m:g}x" for m in MULTIPLES) + " | chosen", found)
    lines += [
        "",
        f"The same runs at one rate shared by every variant, {SHARED_LR:g} (the scripts' default), next to each "
        "variant's chosen rate (validation reward):",
        "",
    ]
    found = []
    for cell, _, _ in CELLS:
        shared = at.get((cell, f"{SHARED_LR:g}"))
        best = at.get((cell, f"{chosen[cell]:g}")) if cell in chosen else None
        at_best = fmt(best["reward"]) + f" ({chosen[cell]:g})" if best else ""
        found.append([cell, fmt(shared["reward"]) if shared else "", at_best])
    lines += table("variant | at the shared rate | at its chosen rate", found)
    lines += [
        "",
        "The mechanism, offline: at each rate the validation reward, the DPO/KTO reward margin (GRPO: mean |token "
        "log-ratio| to the reference) and the fraction of tokens outside [-1.5, 1.5], both averaged over training:",
        "",
    ]
    offline = [(cell, m * paper_lr(cell)) for cell, _, _ in CELLS if "offline" in cell for m in MULTIPLES]
    offline = [(cell, lr, at.get((cell, f"{lr:g}"))) for cell, lr in offline]
    shown = [("reward", 3), ("margin", 3), ("abs_log_ratio", 4), ("clamped_frac", 4)]  # (each row's key, its digits)
    found = [[cell, f"{lr:g}", *(fmt(r[k], d) for k, d in shown)] for cell, lr, r in offline if r]
    return lines + table("variant | lr | reward | margin | mean abs log-ratio | clamped frac", found)


# ---- the plots -------------------------------------------------------------------------------------------------------
# the diagnostics panels beside each reward curve: the first metric of each that a run logs
PANELS = [
    ("clamped", ["humanline/clamped_frac"]),
    ("spread", ["rewards/margins", "ratio/abs_log"]),
    ("chosen", ["logps/chosen", "logps"]),
    ("rejected", ["logps/rejected"]),
]


def smooth(values, width=9):
    """A centred running mean (the per-step training metrics are noisy)."""
    if len(values) < width:
        return values
    padded = np.pad(values, width // 2, mode="edge")
    return np.convolve(padded, np.ones(width) / width, mode="valid")


def sweep_plot(plt, rows, start):
    """The mechanism: reward, margin (GRPO: |log-ratio|) and clamped fraction of the offline pair against the
    learning rate, online dotted for reference."""
    algos = [a for a in ("dpo", "kto", "grpo") if any(r["config"].startswith(f"{a} offline") for r in rows)]
    fig, axes = plt.subplots(len(algos), 3, figsize=(13, 3.4 * len(algos)), squeeze=False)
    ticks = {}
    for row_axes, algo in zip(axes, algos):
        spread = ("margin", "mean margin") if algo != "grpo" else ("abs_log_ratio", "mean |log-ratio| to the reference")
        for cell in (f"{algo} offline", f"{algo} offline+humanline", f"{algo} online", f"{algo} online+humanline"):
            members = [r for r in rows if r["config"].rsplit(" lr ", 1)[0] == cell]
            x = [rate_of(r["flags"]) for r in members]
            keys, labels = ("reward", spread[0], "clamped_frac"), ("validation reward", spread[1], "clamped fraction")
            panels = list(zip(row_axes, keys, labels))
            for ax, key, label in (panels if "offline" in cell else panels[:1]) if members else []:
                errors = [0 if math.isnan(r[key][1]) else r[key][1] for r in members]
                style = dict(marker="o", capsize=3, label=cell, ls="-" if "offline" in cell else ":")
                ax.errorbar(x, [r[key][0] for r in members], yerr=errors, **style)
                ax.set_xscale("log")
                ax.set_title(f"{algo}: {label}", fontsize=9)
                ax.set_xlabel("learning rate", fontsize=8)
                ticks.setdefault(ax, set()).update(x)
        row_axes[0].legend(fontsize=7)
    for ax, x in ticks.items():
        ax.set_xticks(sorted(x), [f"{v:.3g}" for v in sorted(x)], fontsize=7)
        ax.minorticks_off()
    title = "offline vs offline+humanline against the learning rate (3 seeds each; margin, |log-ratio| and clamped "
    fig.suptitle(title + "fraction averaged over training; online dotted, for reference)", fontsize=10)
    return fig


def curves_plot(plt, rows, start):
    """One row of panels per objective (the configuration's first word), sharing the step axis: the held-out reward
    (mean ± s.e. over seeds), then each diagnostic of PANELS that the objective logs (a running mean of 9 steps)."""
    groups = {}
    for r in rows:
        groups.setdefault(r["config"].split()[0], []).append(r)
    width, height = 3.8 * (1 + len(PANELS)), 3.0 * max(len(groups), 1.3)
    fig, axes = plt.subplots(len(groups), 1 + len(PANELS), figsize=(width, height), squeeze=False, sharex=True)
    for row_axes, (group, members) in zip(axes, groups.items()):
        # each panel shows the first of its metrics that this group logs (DPO/KTO a margin, GRPO a |log-ratio|)
        logged = {k for r in members for t in r["train"] for k in t if t[k]}
        keys = [next((k for k in options if k in logged), None) for _, options in PANELS]
        for r in members:
            steps, mean, se = plots.mean_curve([[(s, v) for s, v, _ in c] for c in r["curves"]])
            label = f"{r['config'].split(': ')[-1]} (n={r['seeds']})"
            (line,) = row_axes[0].plot(steps, mean, marker="o", ms=2.5, label=label)
            row_axes[0].fill_between(steps, mean - se, mean + se, alpha=0.2, color=line.get_color())
            for ax, key in zip(row_axes[1:], keys):
                series = [t[key] for t in r["train"] if key and t[key]]
                if series:
                    s, m, _ = plots.mean_curve(series)
                    ax.plot(s, smooth(m), lw=1.2, color=line.get_color())
        if start is not None:
            row_axes[0].axhline(start, color="gray", ls="--", lw=1, label="starting policy")
        row_axes[0].set_title(f"{group}: held-out reward", fontsize=9)
        if len(members) > 5:  # too many lines for the reward panel: the legend goes in (or beside) the last panel
            where = dict(loc="center left", bbox_to_anchor=(0, 0.5) if keys[-1] is None else (1.02, 0.5))
            row_axes[-1].legend(*row_axes[0].get_legend_handles_labels(), fontsize=7, **where)
        else:
            row_axes[0].legend(fontsize=6)
        for ax, key in zip(row_axes[1:], keys):
            ax.set_title(f"{group}: {plots.DIAGNOSTICS[key]}", fontsize=9) if key else ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step", fontsize=8)
    title = "held-out reward (mean ± s.e. over seeds) and training diagnostics (mean over seeds, running mean of 9 "
    fig.suptitle(title + "steps) on one step axis", fontsize=10)
    return fig


SUITES = {
    "sweep": Suite(
        runs=sweep,
        sections=(sweep_tables, settings),
        plot=sweep_plot,
        chooses_rates=True,
        start=lambda: toy_start("test"),
        paper_rates={c: paper_lr(c) for c, _, _ in CELLS},
    ),
    "main": Suite(
        runs=main,
        sections=("long", "tests", "time", settings),
        pairs=main_pairs,
        plot=curves_plot,
        note=lambda results, chosen: rates_line(chosen, CELLS),
        start=lambda: toy_start("test"),
    ),
}
