"""The statistics of a suite's report: mean and standard error over seeds, where one more seed should land, Welch's
t-test of a difference and a TOST of equivalence between two rows' seeds, the same paired by seed (with a bootstrap over
the held-out prompts), and Holm-Bonferroni over a table's comparisons. Each takes plain numbers or report rows.
"""

import json
import math

import numpy as np
from scipy import stats

EQUIVALENCE_MARGIN = 0.01  # the toy's reward: two variants "match" when TOST puts their difference within ±0.01


def mean_se(values):
    """Mean and standard error over seeds, leaving out seeds without the value (NaN); NaN where no seed has it, and a
    NaN error for one seed."""
    v = np.array(values, dtype=float)
    v = v[~np.isnan(v)] if not np.isnan(v).all() else v
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan


def new_seed_range(values, level=0.95):
    """Where one more seed's result should land, if seeds' results are normal: a prediction interval,
    mean +- t(n - 1) * sd * sqrt(1 + 1/n). With 5 seeds it is about +-3 sd: wider than their range, which a sixth seed
    leaves one time in three."""
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    half = stats.t.ppf((1 + level) / 2, n - 1) * np.std(values, ddof=1) * math.sqrt(1 + 1 / n)
    return float(np.mean(values) - half), float(np.mean(values) + half)


def holm(pvalues):
    """Holm-Bonferroni adjusted p-values (step-down, monotone)."""
    order = np.argsort(pvalues)
    adjusted, running = np.empty(len(pvalues)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def tost(a, b, margin):
    """Two one-sided Welch t-tests of |mean(a) - mean(b)| < margin: a small p shows the two equivalent within it."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = a.mean() - b.mean()
    if va + vb == 0:
        return 0.0 if abs(d) < margin else 1.0
    se, df = math.sqrt(va + vb), (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(max(stats.t.sf((d + margin) / se, df), stats.t.cdf((d - margin) / se, df)))


def significance(rows, pairs, margin=EQUIVALENCE_MARGIN):
    """For each pair (a, b): the difference of final rewards, a Welch t-test of a difference and a TOST of equivalence
    within +-margin, each Holm-Bonferroni corrected over the pairs, and what they allow one to say at the 5% level."""
    by, tests = {r["config"]: r for r in rows}, []
    for a, b in [(a, b) for a, b in pairs if a in by and b in by and by[a]["seeds"] > 1 and by[b]["seeds"] > 1]:
        x, y = by[a]["rewards"], by[b]["rewards"]
        test = dict(a=a, b=b, comparison=f"{a} vs {b}", diff=float(np.mean(x) - np.mean(y)))
        tests.append(test | dict(p=float(stats.ttest_ind(x, y, equal_var=False).pvalue), p_tost=tost(x, y, margin)))
    return verdicts(tests, margin)


def paired(rows, pairs, margin, resamples=10_000):
    """Each comparison (a, b) of configurations run with the same seeds (and scored on the same prompts), read from
    paired differences (paired_test) with the Holm correction over the pairs, and beside them a bootstrap over the
    held-out prompts (prompt_bootstrap). The verdict as significance's, from the paired tests."""
    by, tests = {r["config"]: r for r in rows}, []
    for a, b in [(a, b) for a, b in pairs if a in by and b in by]:
        runs = [
            {s["seed"]: (x, ans) for s, x, ans in zip(by[c]["args"], by[c]["rewards"], by[c]["answers"])}
            for c in (a, b)
        ]
        seeds = sorted(set(runs[0]) & set(runs[1]))
        if len(seeds) > 1:
            test = dict(a=a, b=b, comparison=f"{a} vs {b}", seeds=len(seeds))
            test |= paired_test([runs[0][s][0] - runs[1][s][0] for s in seeds], margin)
            test["prompts_ci"] = prompt_bootstrap([[side[s][1] for s in seeds] for side in runs], resamples)
            tests.append(test)
    return verdicts(tests, margin)


def verdicts(tests, margin):
    """Each test's p-values Holm-corrected over the tests, and its verdict at the 5% level: a difference if the test
    of a difference finds one, else equivalence within +-margin if the TOST does."""
    for key in ("p", "p_tost"):
        for t, adjusted in zip(tests, holm([t[key] for t in tests]) if tests else []):
            t[key + "_holm"] = float(adjusted)
    for t in tests:
        differs = ("higher" if t["diff"] > 0 else "lower") if t["p_holm"] < 0.05 else None
        t["verdict"] = differs or (f"equivalent (within ±{margin:g})" if t["p_tost_holm"] < 0.05 else "not decided")
    return tests


def paired_test(differences, margin):
    """Of per-seed differences: their mean and its 95% t-interval, the paired t-test's p, the paired TOST's p (within
    +-margin), and the smallest difference these seeds could detect (80% power at 5%, from their spread)."""
    d = np.asarray(differences, float)
    n, mean, se = len(d), float(d.mean()), float(d.std(ddof=1)) / math.sqrt(len(d))
    q = stats.t.ppf(0.975, n - 1)
    if se == 0:  # every seed the same difference: the tests are certain
        p, p_tost = float(mean == 0), float(abs(mean) >= margin)
    else:
        p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
        p_tost = float(max(stats.t.sf((mean + margin) / se, n - 1), stats.t.cdf((mean - margin) / se, n - 1)))
    detectable = float((q + stats.t.ppf(0.8, n - 1)) * se)
    return dict(diff=mean, ci=(mean - q * se, mean + q * se), p=p, p_tost=p_tost, detectable=detectable)


def prompt_bootstrap(answers, resamples):
    """The 95% percentile interval of a - b's mean reward over the held-out prompts both answered, each prompt's reward
    averaged over seeds first; answers: [a's, b's], each a list per seed of its evaluation's answers (NaN without)."""
    means = []
    for side in answers:
        rewards = {}
        for seed in side:
            for ans in seed:
                rewards.setdefault(json.dumps(ans["prompt"]), []).append(ans["reward"])
        means.append({k: np.mean(v) for k, v in rewards.items()})
    shared = sorted(set(means[0]) & set(means[1]))
    if not shared:
        return math.nan, math.nan
    diff = np.array([means[0][k] - means[1][k] for k in shared])
    draws = diff[np.random.default_rng(0).integers(0, len(diff), (resamples, len(diff)))].mean(1)
    return float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))
