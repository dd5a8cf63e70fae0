"""A suite's plot (`<suite>.png`, when matplotlib is installed): each configuration's final reward (bars), or the plot
its study draws (the toy's sweep and curves, the horizon's): what they share is here.
"""

import math
import os

import numpy as np

# training diagnostics: metrics.jsonl key -> column name (GRPO logs `logps` and `ratio/abs_log`, DPO/KTO the others)
DIAGNOSTICS = {
    "humanline/clamped_frac": "clamped frac",
    "rewards/margins": "margin",
    "ratio/abs_log": "mean |log-ratio|",
    "logps/chosen": "logp chosen",
    "logps/rejected": "logp rejected",
    "logps": "logp completions",
    "grpo/no_signal": "sequences without signal",
    "clip_frac": "ratio clip share",  # GRPO's: the share of tokens its ratio clip binds on
}


def mean_curve(series):
    """Mean and standard error over seeds of per-step (step, value) series; seeds of unequal length are left out."""
    steps = [s for s, _ in series[0]]
    values = np.array([[v for _, v in c] for c in series if [s for s, _ in c] == steps], dtype=float)
    se = values.std(0, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else np.zeros(len(steps))
    return np.array(steps), values.mean(0), se


def plot(results, suite, entry, rows, start=None):
    """`<suite>.png`, of the kind its entry names: each configuration's final reward, or its study's own plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plots; `pip install -r experiments/requirements.txt` for them)")
        return
    fig = bars_plot(plt, rows, start) if entry.plot == "bars" else entry.plot(plt, rows, start)
    if entry.plot == "bars":
        fig.axes[0].set_title(f"{entry.model}: {suite}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_size_inches()[1]))  # leave the suptitle its own strip
    fig.savefig(os.path.join(results, f"{suite}.png"), dpi=100, bbox_inches="tight")
    plt.close(fig)


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
