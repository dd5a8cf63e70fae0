"""A suite's plot (`<suite>.png`, when matplotlib is installed): the reward against the learning rate (a sweep), the
held-out reward and the training diagnostics against the step (curves), or each configuration's final reward (bars).
"""

import math
import os

import numpy as np
from suites import rate_of

# training diagnostics: metrics.jsonl key -> column name (GRPO logs `logps` and `ratio/abs_log`, DPO/KTO the others)
DIAGNOSTICS = {
    "humanline/clamped_frac": "clamped frac",
    "rewards/margins": "margin",
    "ratio/abs_log": "mean |log-ratio|",
    "logps/chosen": "logp chosen",
    "logps/rejected": "logp rejected",
    "logps": "logp completions",
    "grpo/no_signal": "sequences without signal",
}


# the diagnostics panels beside each reward curve: the first metric of each that a run logs
PANELS = [
    ("clamped", ["humanline/clamped_frac"]),
    ("spread", ["rewards/margins", "ratio/abs_log"]),
    ("chosen", ["logps/chosen", "logps"]),
    ("rejected", ["logps/rejected"]),
]


def mean_curve(series):
    """Mean and standard error over seeds of per-step (step, value) series; seeds of unequal length are left out."""
    steps = [s for s, _ in series[0]]
    values = np.array([[v for _, v in c] for c in series if [s for s, _ in c] == steps], dtype=float)
    se = values.std(0, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else np.zeros(len(steps))
    return np.array(steps), values.mean(0), se


def smooth(values, width=9):
    """A centred running mean (the per-step training metrics are noisy)."""
    if len(values) < width:
        return values
    padded = np.pad(values, width // 2, mode="edge")
    return np.convolve(padded, np.ones(width) / width, mode="valid")


def plot(results, suite, entry, rows, start=None):
    """`<suite>.png`, of the kind its entry names: against the learning rate (a sweep), against the step (curves: the
    held-out reward evaluated every 10 steps, then the training diagnostics), or each configuration's final reward."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plots; `pip install -r experiments/requirements.txt` for them)")
        return
    fig = {"sweep": sweep_plot, "curves": curves_plot, "bars": bars_plot}[entry.plot](plt, rows, start)
    if entry.plot == "bars":
        fig.axes[0].set_title(f"{entry.model}: {suite}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_size_inches()[1]))  # leave the suptitle its own strip
    fig.savefig(os.path.join(results, f"{suite}.png"), dpi=100, bbox_inches="tight")
    plt.close(fig)


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
            steps, mean, se = mean_curve([[(s, v) for s, v, _ in c] for c in r["curves"]])
            label = f"{r['config'].split(': ')[-1]} (n={r['seeds']})"
            (line,) = row_axes[0].plot(steps, mean, marker="o", ms=2.5, label=label)
            row_axes[0].fill_between(steps, mean - se, mean + se, alpha=0.2, color=line.get_color())
            for ax, key in zip(row_axes[1:], keys):
                series = [t[key] for t in r["train"] if key and t[key]]
                if series:
                    s, m, _ = mean_curve(series)
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
            ax.set_title(f"{group}: {DIAGNOSTICS[key]}", fontsize=9) if key else ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step", fontsize=8)
    title = "held-out reward (mean ± s.e. over seeds) and training diagnostics (mean over seeds, running mean of 9 "
    fig.suptitle(title + "steps) on one step axis", fontsize=10)
    return fig


def bars_plot(plt, rows, start):
    """Each configuration's final held-out reward (mean ± s.e.), the starting policy's as a line."""
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(rows) + 1.2))
    errors = [0 if math.isnan(r["reward"][1]) else r["reward"][1] for r in rows]
    ax.barh(range(len(rows)), [r["reward"][0] for r in rows], xerr=errors, color="tab:blue", alpha=0.7)
    ax.set_yticks(range(len(rows)), [f"{r['config']} (n={r['seeds']})" for r in rows], fontsize=7)
    ax.invert_yaxis()
    lo = min([r["reward"][0] for r in rows] + ([start] if start is not None else []))
    if start is not None:
        ax.axvline(start, color="gray", ls="--", lw=1, label="starting policy")
        ax.legend(fontsize=7)
    ax.set_xlim(max(0.0, lo - 0.1), 1.0)
    ax.set_xlabel("final held-out reward (greedy), mean ± s.e.")
    return fig
