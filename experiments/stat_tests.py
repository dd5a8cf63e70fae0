"""The statistics of a suite's report: mean and standard error over seeds, a share's Wilson interval, where one more
seed should land, Welch's t-test of a difference and a TOST of equivalence between two rows' seeds, the same paired by
seed (with a bootstrap over the held-out prompts), and Holm-Bonferroni over a table's comparisons. Each takes plain
numbers or report rows; the tests are scipy.stats' own, Holm a few lines of numpy.
"""

import json
import math

import numpy as np
from scipy import stats


def mean_se(values):
    """Mean and standard error over seeds, leaving out seeds without the value (NaN); NaN where no seed has it, and a
    NaN error for one seed."""
    v = np.array(values, dtype=float)
    v = v[~np.isnan(v)] if not np.isnan(v).all() else v
    return float(v.mean()), float(stats.sem(v)) if len(v) > 1 else math.nan


def wilson(k, n, level=0.95):
    """The Wilson score interval of k successes in n trials (scipy's); NaN without a trial."""
    return tuple(stats.binomtest(k, n).proportion_ci(level, method="wilson")) if n else (math.nan, math.nan)


def new_seed_range(values, level=0.95):
    """Where one more seed's result should land, if seeds' results are normal: a prediction interval,
    mean +- t(n - 1) * sd * sqrt(1 + 1/n). With 5 seeds it is about +-3 sd: wider than their range, which a sixth seed
    leaves one time in three."""
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    spread = np.std(values, ddof=1) * math.sqrt(1 + 1 / n)
    if spread == 0:  # every seed the same result (scipy's interval needs a spread)
        return float(values[0]), float(values[0])
    return tuple(float(x) for x in stats.t.interval(level, n - 1, loc=np.mean(values), scale=spread))


def holm(pvalues):
    """Holm-Bonferroni adjusted p-values (step-down, monotone)."""
    order = np.argsort(pvalues)
    steps = np.minimum(1.0, (len(pvalues) - np.arange(len(pvalues))) * np.asarray(pvalues, float)[order])
    adjusted = np.empty(len(pvalues))
    adjusted[order] = np.maximum.accumulate(steps)
    return adjusted


def tost(a, b, margin):
    """Two one-sided Welch t-tests of |mean(a) - mean(b)| < margin: a small p shows the two equivalent within it."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.var() + b.var() == 0:  # no spread: scipy's t is undefined, the answer certain
        return 0.0 if abs(a.mean() - b.mean()) < margin else 1.0
    above = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue  # H0: a - b <= -margin
    below = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue  # H0: a - b >= margin
    return float(max(above, below))


def significance(rows, pairs, margin):
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
    held-out prompts (prompt_bootstrap). The verdict as significance's, from the paired tests; the difference the
    seeds could detect at the level Holm holds each test to (5% / the tests not yet passed, by rank of p)."""
    by, tests, differences = {r["config"]: r for r in rows}, [], []
    for a, b in [(a, b) for a, b in pairs if a in by and b in by]:
        runs = [
            {s["seed"]: (x, ans) for s, x, ans in zip(by[c]["args"], by[c]["rewards"], by[c]["answers"])}
            for c in (a, b)
        ]
        seeds = sorted(set(runs[0]) & set(runs[1]))
        if len(seeds) > 1:
            test = dict(a=a, b=b, comparison=f"{a} vs {b}", seeds=len(seeds))
            differences.append([runs[0][s][0] - runs[1][s][0] for s in seeds])
            test |= paired_test(differences[-1], margin)
            answers = [[side[s][1] for s in seeds] for side in runs]
            test["prompts_ci"] = prompt_bootstrap(answers, resamples) if resamples else (math.nan, math.nan)
            tests.append(test)
    for rank, i in enumerate(np.argsort([t["p"] for t in tests])):
        tests[i]["detectable"] = paired_test(differences[i], margin, 0.05 / (len(tests) - rank))["detectable"]
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


def paired_test(differences, margin, level=0.05):
    """Of per-seed differences: their mean and its 95% t-interval, the paired t-test's p, the paired TOST's p (within
    +-margin), and the smallest difference these seeds could detect (80% power at `level`, from their spread)."""
    d = np.asarray(differences, float)
    n, mean, se = len(d), float(d.mean()), float(stats.sem(d))
    if se == 0:  # every seed the same difference: scipy's t is undefined, the tests certain
        p, p_tost, ci = float(mean == 0), float(abs(mean) >= margin), (mean, mean)
    else:
        test = stats.ttest_1samp(d, 0.0)
        p, ci = float(test.pvalue), tuple(float(x) for x in test.confidence_interval(0.95))
        above = stats.ttest_1samp(d, -margin, alternative="greater").pvalue  # H0: the difference <= -margin
        below = stats.ttest_1samp(d, margin, alternative="less").pvalue  # H0: the difference >= margin
        p_tost = float(max(above, below))
    detectable = float((stats.t.ppf(1 - level / 2, n - 1) + stats.t.ppf(0.8, n - 1)) * se)
    return dict(diff=mean, ci=ci, p=p, p_tost=p_tost, detectable=detectable)


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
    if np.ptp(diff) == 0:  # every prompt the same difference: so is every resample's mean
        return float(diff[0]), float(diff[0])
    boot = stats.bootstrap((diff,), np.mean, n_resamples=resamples, method="percentile", random_state=0)
    return float(boot.confidence_interval.low), float(boot.confidence_interval.high)
