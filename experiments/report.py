"""The report of a suite, from its runs' archive: its tables (`<suite>.md`, one line per configuration in
`<suite>.jsonl`), with the statistics of stat_tests.py, and its plot (`<suite>.png`, when matplotlib is installed).
What a suite's report holds is its entry (its study's file in studies/): `sections` names the common tables below, in
order, or holds the study's own.
"""

import json
import math
import os
import random
import re
from types import SimpleNamespace

import numpy as np
import plots
import runner
import smollm2
import suites
from stat_tests import mean_se, new_seed_range, paired, significance
from suites import rate_of

EQUATION = re.compile(r"\d+\s*\+\s*\d+\s*=\s*-?\d")  # a written sum, "47 + 38 = 85"


# ---- summaries -------------------------------------------------------------------------------------------------------
def regime(flags, clamped_frac):
    """Which regime a run is in: does the humanline clamp act on its tokens (the paper's regime) or not?"""
    clip = flags[flags.index("--clip") + 1] if "--clip" in flags else "none"
    if "--humanline" not in flags and clip not in ("clamp", "sampling"):
        return "no clamp"
    return "clamp active" if clamped_frac >= 0.01 else "clamp rare" if clamped_frac >= 0.001 else "clamp idle"


def summarize(runs, configs):
    """Per configuration with finished runs: final held-out reward and accuracy (mean, standard error over seeds), wall
    and CPU time, the humanline diagnostics (clamped fraction and margin or |log-ratio| averaged over training,
    log-probs at the last step), their per-step curves and each run's args.json."""
    rows = []
    for name, script, flags, seeds, *_ in configs:
        per_seed = []
        for seed in seeds:
            run = runs.get(runner.run_key(name, seed))
            if not runner.finished(run, runner.max_steps_of(flags)):
                continue
            recs = runner.records(run)
            steps = [r for r in recs if "loss" in r]
            evals = [r for r in recs if "eval/reward" in r]
            last = evals[-1]
            seed_row = dict(reward=last["eval/reward"], accuracy=last.get("eval/accuracy", math.nan))
            seed_row["curve"] = [(r["step"], r["eval/reward"], r.get("eval/accuracy")) for r in evals]
            seed_row["train"] = {k: [(r["step"], r[k]) for r in steps if k in r] for k in plots.DIAGNOSTICS}
            seed_row["clamped"] = np.mean([r.get("humanline/clamped_frac", 0) for r in steps])
            seed_row["margin"] = np.mean([r.get("rewards/margins", math.nan) for r in steps])
            seed_row["abs_log_ratio"] = np.mean([r.get("ratio/abs_log", math.nan) for r in steps])
            seed_row["clip"] = np.mean([r.get("clip_frac", math.nan) for r in steps])  # GRPO: the ratio clip's share
            seed_row["logp_chosen"] = steps[-1].get("logps/chosen", steps[-1].get("logps", math.nan))
            seed_row["logp_rejected"] = steps[-1].get("logps/rejected", math.nan)
            seed_row |= dict(wall=float(run["wall_seconds"]), cpu=float(run["cpu_seconds"]))
            # the training loop alone: optimizer steps, online sampling and scoring (no start-up, no evaluation)
            seed_row["loop"] = sum(r.get("perf/step_seconds", 0) + r.get("online/seconds", 0) for r in recs)
            seed_row["args"] = json.loads(run.get("args.json", "{}"))
            # the real model's: the cut share of its last answers, what the reward leaves out (quality.json)
            seed_row["cut"] = last.get("eval/truncated_frac", math.nan)
            seed_row["quality"] = json.loads(run.get("quality.json", "{}"))
            seed_row["answers"] = [json.loads(line) for line in run.get("eval_samples.jsonl", "").splitlines()]
            kept = {n.removeprefix("quality-step").removesuffix(".json"): t for n, t in run.items()}
            kept = {int(step): json.loads(t) for step, t in kept.items() if step.isdigit()}
            seed_row["drift"] = [(step, kept[step]["perplexity"]) for step in sorted(kept)]  # --keep_every_eval's
            per_seed.append(seed_row)
        if not per_seed:
            continue

        def ms(key):
            return mean_se([s[key] for s in per_seed])

        def each(key):
            return [s[key] for s in per_seed]

        row = dict(config=name, script=script, flags=flags, seeds=len(per_seed), reward=ms("reward"))
        row |= dict(accuracy=ms("accuracy"), rewards=each("reward"), new_seed=new_seed_range(each("reward")))
        row |= dict(accuracies=each("accuracy"), walls=each("wall"), cpus=each("cpu"), loops=each("loop"))
        row |= dict(wall=ms("wall"), cpu=ms("cpu"), loop=ms("loop"), clamped_frac=ms("clamped"), clip_frac=ms("clip"))
        row |= dict(regime=regime(flags, ms("clamped")[0]), margin=ms("margin"), abs_log_ratio=ms("abs_log_ratio"))
        row |= dict(logp_chosen=ms("logp_chosen"), logp_rejected=ms("logp_rejected"), curves=each("curve"))
        rows.append(row | dict(train=each("train"), args=each("args")))
        if all(s["quality"] for s in per_seed):  # the real model's runs: their answers' quality, their cut share
            rows[-1] |= dict(cut=ms("cut"), cuts=each("cut"), answers=each("answers"))
            for key in ("perplexity", "repeated_words"):
                rows[-1][key] = mean_se([s["quality"][key] for s in per_seed])
        if any(each("drift")):  # the horizon's: each evaluation's perplexity under the starting model
            rows[-1]["drifts"] = each("drift")
    return rows


def code_versions(rows):
    """The versions of the code (provenance.code in args.json, of every attempt of a resumed run; None: not recorded)
    that a table's runs ran."""
    attempts = [p for r in rows for a in r["args"] for p in a.get("attempts") or [a.get("provenance", {})]]
    return sorted({str(p.get("code")) for p in attempts})


def choose_rates(results):
    """variant -> its learning rate, chosen by suites.best_rates from the finished runs of every sweep suite. Keys: the
    toy's variants, "<task> <variant>" (a study's: "<task> <its prefix><arm>")."""
    import studies

    chosen = {}
    for suite, entry in studies.SUITES.items():
        if entry.chooses_rates:
            chosen |= suites.best_rates(entry.runs(results, {}), suites.final_rewards(results, suite))
    return chosen


def best_rates(configs, rows):  # suites.best_rates of a table's rows
    by = {r["config"]: r for r in rows}
    return suites.best_rates(configs, lambda c: by[c.name]["rewards"] if c.name in by else [])


def at_rates(configs, rows):
    """(variant, rate as printed) -> its row, of a sweep's configurations (None where no seed has finished)."""
    by = {r["config"]: r for r in rows}
    return {(c.variant, f"{c.rate:g}"): by.get(c.name) for c in configs}


def table(columns, rows):
    """A markdown table: its columns ("a | b | c"), then a line per row, each row a list of its cells."""
    lines = [f"| {columns} |", "|---" * (columns.count(" | ") + 1) + "|"]
    return lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]


def fmt(pair, digits=3):
    mean, se = pair
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" + ("" if math.isnan(se) else f" ± {se:.{digits}f}")


# ---- tables ----------------------------------------------------------------------------------------------------------
def provenance_line(rows):
    runs = [a.get("provenance", {}) for r in rows for a in r["args"]]
    commits = sorted({str(p.get("commit"))[:10] for p in runs})
    dirty = sum(bool(p.get("dirty")) for p in runs)
    versions = {k: sorted({str(p.get(k)) for p in runs}) for k in ("code", "torch", "transformers")}
    line = f"{len(runs)} runs of code {', '.join(versions['code'])} (commit {', '.join(commits)}"
    line += f"; {dirty} with uncommitted changes to it" if dirty else ""
    line += f"), torch {', '.join(versions['torch'])}, transformers {', '.join(versions['transformers'])}."
    for v in versions["code"] if len(versions["code"]) > 1 else []:  # a table of mixed code (--mix_code)
        line += f" Code {v}: {'; '.join(r['config'] for r in rows if v in code_versions([r]))}."  # names hold commas
    return line


def long_table(rows, ctx):
    """Two tables: the held-out results, then time and the humanline diagnostics."""
    lines = [
        f"Final held-out greedy reward and exact accuracy on {ctx.entry.held_out} (mean ± standard error over seeds); "
        "`new seed`: where one more seed's reward should land (a 95% prediction interval from these seeds); the "
        "learning rate; the regime of the humanline diagnostics below (clamp active: >= 1% of tokens outside the "
        "clamp's range, rare: 0.1-1%, idle: < 0.1%).",
        "",
    ]
    span = lambda lo, hi: "–" if math.isnan(lo) else f"{lo:.3f} to {hi:.3f}"  # noqa: E731 (the new seed's range)
    cells = lambda r: [fmt(r["reward"]), span(*r["new_seed"]), fmt(r["accuracy"]), f"{rate_of(r['flags']):g}"]  # noqa: E731
    columns = "configuration | seeds | reward | new seed | accuracy | lr | regime"
    lines += table(columns, [[r["config"], r["seeds"], *cells(r), r["regime"]] for r in rows])
    lines += [
        "",
        "Wall and CPU time per run (1 CPU thread, two runs at a time) and the wall time of its training loop alone "
        "(optimizer steps plus online sampling and scoring). Humanline diagnostics: the fraction of tokens whose "
        "log-ratio to the reference lies outside the clamp's range (clamped by the runs that clamp; for the others, "
        "what [-1.5, 1.5] would have cut) and the DPO/KTO reward margin (GRPO: the mean |token log-ratio| to the "
        "reference), both averaged over training; mean token log-probs of chosen and rejected (GRPO: of the trained "
        "completions) at the last step.",
        "",
    ]
    columns = "configuration | wall s | CPU s | loop s | clamped frac | margin | mean abs log-ratio | logp chosen"
    shown = [("wall", 0), ("cpu", 0), ("loop", 0), ("clamped_frac", 4), ("margin", 3), ("abs_log_ratio", 4)]
    shown += [("logp_chosen", 3), ("logp_rejected", 3)]  # (each row's key, its digits)
    return lines + table(columns + " | logp rejected", [[r["config"], *(fmt(r[k], d) for k, d in shown)] for r in rows])


def tests_table(rows, ctx):
    """Welch's tests of the suite's comparisons, with TOST (stat_tests.significance)."""
    margin = ctx.entry.margin
    tests = significance(rows, ctx.entry.pairs(ctx.names), margin)
    if not tests:
        return []
    ps = ("p", "p_holm", "p_tost", "p_tost_holm")
    return [
        "",
        f"Welch t-tests of a difference in final reward and two one-sided tests (TOST) of equivalence within "
        f"±{margin:g} reward (the margin fixed before the runs), each Holm-Bonferroni corrected over "
        "the comparisons of this table; the verdict at the 5% level:",
        "",
        *table(
            "comparison | reward difference | p (Welch) | p (Holm) | p (TOST) | p (TOST, Holm) | verdict",
            [[t["comparison"], f"{t['diff']:+.3f}", *(f"{t[k]:.3g}" for k in ps), t["verdict"]] for t in tests],
        ),
    ]


def paired_table(rows, ctx):
    """The suite's comparisons paired by seed (stat_tests.paired)."""
    margin = ctx.entry.margin
    tests = paired(rows, ctx.entry.pairs(ctx.names), margin)
    if not tests:
        return []
    return [
        "",
        "The same comparisons paired by seed (the two rows of a seed see the same data in the same order and are "
        "scored on the same prompts): the mean of the per-seed differences with its 95% interval, the paired t-test "
        f"and the paired TOST within ±{margin:g}, each Holm-corrected over these comparisons, the smallest difference "
        "these seeds could detect (80% power at the level Holm holds the test to: 5% over the tests left by rank of "
        "p), and a bootstrap over the test prompts (each prompt's success averaged over seeds) beside them; the "
        "verdict at 5%, from the paired tests:",
        "",
        *table(
            "comparison | seeds | difference (95% interval) | p (paired, Holm) | p (TOST, Holm) | detectable | "
            "prompts' bootstrap 95% | verdict",
            [
                [t["comparison"], t["seeds"], f"{t['diff']:+.3f} ({t['ci'][0]:+.3f}, {t['ci'][1]:+.3f})"]
                + [f"{t['p_holm']:.3g}", f"{t['p_tost_holm']:.3g}", f"{t['detectable']:.3f}"]
                + [f"{t['prompts_ci'][0]:+.3f}, {t['prompts_ci'][1]:+.3f}", t["verdict"]]
                for t in tests
            ],
        ),
    ]


def time_ratios(rows, ctx):
    by = {r["config"]: r for r in rows}
    pairs = [
        (f"{algo} {slow}", f"{algo} {fast}")
        for algo in ("dpo", "kto", "grpo")
        for slow, fast in (("online", "offline+humanline"), ("offline+humanline", "offline"))
    ]
    pairs = [(by[a], by[b]) for a, b in pairs if a in by and b in by]
    if not pairs:
        return []
    ratio = lambda a, b, k: f"{np.median(a[k]) / np.median(b[k]):.2f}"  # noqa: E731 (medians: a seed run on a busier machine moves a mean)
    ratios = [
        [f"{a['config']} / {b['config']}", *(ratio(a, b, k) for k in ("walls", "cpus", "loops"))] for a, b in pairs
    ]
    return ["", *table("time ratio (medians over seeds) | wall | CPU | training loop", ratios)]


def blind_read(runs, out, successes, failures=0, key=lambda answer: {}, seed=0):
    """Draw a blind read: up to `successes` successes (reward 1) and `failures` failures of every run (runs: (arm, seed,
    answers)), shuffled and numbered. `out`/sample.jsonl holds what the reader sees (id, prompt, answer), key.jsonl the
    id, arm, seed and what `key(answer)` adds. Returns how many were drawn."""
    rng, drawn = random.Random(seed), []
    for arm, run_seed, answers in runs:
        for success, n in ((True, successes), (False, failures)):
            pool = [a for a in answers if (a["reward"] == 1) == success]
            drawn += [(arm, run_seed, a) for a in rng.sample(pool, min(n, len(pool)))]
    rng.shuffle(drawn)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sample.jsonl"), "w") as s, open(os.path.join(out, "key.jsonl"), "w") as k:
        for i, (arm, run_seed, a) in enumerate(drawn):
            s.write(json.dumps(dict(id=i, prompt=a["prompt"][-1]["content"], answer=a["completion"])) + "\n")
            k.write(json.dumps(dict(id=i, arm=arm, seed=run_seed) | key(a)) + "\n")
    return len(drawn)


# ---- the report ------------------------------------------------------------------------------------------------------
def real_sweep_table(rows, ctx):
    """A real model's sweep: validation success (and cut share) at each rate, x the paper's, and the rate chosen."""
    task, (prefix, arms) = ctx.entry.task, ctx.entry.arms
    at, chosen = at_rates(ctx.configs, rows), best_rates(ctx.configs, rows)
    keys = {name: f"{task} {prefix}{name}" for name in arms}
    paper = {name: suites.paper_lr(f"{arm[0]} {arm[1]}") for name, arm in arms.items()}  # each arm's paper rate
    multiples = sorted({round(c.rate / paper[n], 6) for n in arms for c in ctx.configs if c.variant == keys[n]})
    lines = [
        "",
        "Validation success (cut share) at each learning rate, x the paper's rate for that variant, and the one",
    ]
    lines += ["chosen:", ""]
    shown = []
    for name in arms:
        rates, key = [f"{m * paper[name]:g}" for m in multiples], keys[name]
        found = [at.get((key, rate)) for rate in rates]
        cells = [f"{c['reward'][0]:.3f} ({c['cut'][0]:.2f}) at {rate}" if c else "" for c, rate in zip(found, rates)]
        shown.append([name, *cells, "not yet" if chosen.get(key) is None else f"{chosen[key]:g}"])
    return lines + table("variant | " + " | ".join(f"{m:g}x" for m in multiples) + " | chosen", shown)


def scored_on(entry):  # the prompts a real-model suite's tables read: the test prompts, or the horizon's validation
    return "validation" if "validation" in entry.held_out else "test"


def real_table(rows, ctx):
    """The real model's comparison: each configuration's success before (the starting model, greedy) and after, the
    share of its answers cut off, and what the reward leaves out, on every trained model (smollm2.quality)."""
    start, prompts = ctx.entry.start(), scored_on(ctx.entry)
    lines = [
        "",
        f"{prompts.capitalize()} success after training (the starting model: {start:.3f}), the share of answers cut "
        "off at the",
        f"token limit (each a failure), and what the reward leaves out, measured on every trained model's {prompts}",
        "answers: their per-token perplexity under the frozen starting model and their share of repeated words:",
    ]
    gain = lambda r: fmt(mean_se([x - start for x in r["rewards"]]))  # noqa: E731
    shown = [[r["config"], r["seeds"], fmt(r["reward"]), gain(r), fmt(r["cut"])] for r in rows]
    shown = [cells + [fmt(r["perplexity"], 2), fmt(r["repeated_words"])] for cells, r in zip(shown, rows)]
    columns = "configuration | seeds | success | success - start | cut off | perplexity | repeated words"
    return lines + ["", *table(columns, shown)]


def test_rows(task):
    """The task's evaluation prompts (validation, test, the constraints' held-out test): each prompt's row (its
    constraint and topic, or answer), by the prompt."""
    rows = {}
    for split in ("valid", "test", "test_heldout"):  # a suite scored on validation prompts (the horizon's) reads them
        path = os.path.join(runner.ROOT, smollm2.data(task, split))
        rows |= {json.dumps(row["prompt"]): row for row in map(json.loads, open(path))} if os.path.exists(path) else {}
    return rows


def answers(rows, ctx):
    """What every trained model writes: each run's answer to the first prompt of each kind (constraint, or phrasing;
    read from the prompt's row in its split), its reward and whether it finished; the success of the reward is read in
    these, not in a few."""
    split, prompts = test_rows(ctx.entry.task), scored_on(ctx.entry)
    lines = [
        "",
        f"Every run's answer to the first {prompts} prompt of each kind, its reward, and `cut` where it did not "
        "finish:",
    ]
    for r in rows:
        for seed, answered in zip(r["args"], r["answers"]):
            first = {}
            for a in answered:
                first.setdefault(smollm2.kind(ctx.entry.task, split[json.dumps(a["prompt"])]), a)
            lines += ["", f"**{r['config']}, seed {seed['seed']}**", ""]
            for a in first.values():
                said = a["completion"].strip().replace("\n", " ").replace("|", "/")
                cut = ", cut" * (not a["finished"])
                lines.append(f"- {a['prompt'][-1]['content']} → {said!r} ({a['reward']:.0f}{cut})")
    return lines


def largest_step(row, key):  # a training metric's largest value on any step of any of the row's seeds
    return max((v for t in row["train"] for _, v in t[key]), default=math.nan)


def signal(rows, ctx):
    """GRPO's groups: the share of training steps without signal from the rewards (every group of the step scored
    alike: grpo/no_signal 1.0), the share of sequences with advantage 0, and the share of tokens the clamp acts on."""
    lines = ["", "The share of training steps whose every group scored all alike (no signal from the rewards), the"]
    lines += ["share of trained sequences with advantage 0, and the share of tokens the clamp acts on (outside [-1.5,"]
    lines += ["1.5]), each averaged over training (mean ± standard error over seeds), and the clamp's largest step:"]
    shown = []
    for r in rows:
        values = [[v for _, v in t["grpo/no_signal"]] for t in r["train"]]
        steps = mean_se([np.mean([v == 1.0 for v in run]) if run else math.nan for run in values])
        sequences = mean_se([np.mean(run) if run else math.nan for run in values])
        largest = largest_step(r, "humanline/clamped_frac")
        shown.append([r["config"], r["seeds"], fmt(steps), fmt(sequences), fmt(r["clamped_frac"], 4), f"{largest:.4f}"])
    columns = "steps without signal | sequences without signal | clamped tokens | largest step's"
    return lines + ["", *table(f"configuration | seeds | {columns}", shown)]


def phrasing(rows, ctx):
    """By kind of prompt: each row's success on prompts like the training ones and on the held-out ones (addition: the
    fourth phrasing, with each row's share of finished equations; constraints: topics and words no training prompt
    uses), the shares of tokens the clamp cut (or would have) and the ratio clip bound; then each comparison on each
    kind apart (paired, Holm over the comparisons within the kind)."""
    task, split, addition = ctx.entry.task, test_rows(ctx.entry.task), ctx.entry.task == "addition"
    # an answer not in the split (a test's) holds its prompt, all that addition's kind reads
    held_out = lambda a: smollm2.held_out(task, split.get(json.dumps(a["prompt"]), a))  # noqa: E731
    names = ["training phrasings", "held-out phrasing"] if addition else ["training topics", "held-out topics"]
    parts = {names[0]: lambda a: not held_out(a), names[1]: held_out}
    parts = {p: keep for p, keep in parts.items() if any(keep(a) for r in rows for run in r["answers"] for a in run)}
    part_rows = {}
    for part, keep in parts.items():  # each row with only its answers of that kind, its success theirs
        kept = [[[a for a in run if keep(a)] for run in r["answers"]] for r in rows]
        rewards = [[np.mean([a["reward"] for a in run]) for run in k] for k in kept]
        part_rows[part] = [dict(r, answers=k, rewards=x) for r, k, x in zip(rows, kept, rewards)]
    equation = lambda a: a["finished"] and EQUATION.search(a["completion"]) is not None  # noqa: E731
    both = len(parts) > 1
    if addition:
        head = 'By phrasing: success and the share of answers that are finished equations ("a + b = c", not cut) on'
        lines = ["", head, "the three training phrasings" + " and on the held-out one" * both + ", and the shares of"]
    else:
        head = "By topic: success on the training topics and words" + " and on the held-out ones" * both
        lines = ["", head, "(topics and words no training prompt uses), and the shares of"]
    tail = "tokens outside [-1.5, 1.5] and bound by the ratio clip, averaged over training (mean ± standard error over"
    lines += [tail, "seeds):", ""]
    shown = []
    for i, r in enumerate(rows):
        success = [fmt(mean_se(p[i]["rewards"])) for p in part_rows.values()]
        equations = [
            fmt(mean_se([np.mean([equation(a) for a in run]) for run in p[i]["answers"]])) for p in part_rows.values()
        ]
        clamp_clip = [fmt(r["clamped_frac"], 4), fmt(r["clip_frac"], 4)]
        shown.append([r["config"], r["seeds"], *success, *equations * addition, *clamp_clip])
    short = [names[0], "held-out"][: len(parts)]  # the validation prompts hold no held-out phrasing
    columns = f"configuration | seeds | success: {' | '.join(short)} | "
    columns += f"finished equations: {' | '.join(n.split()[0] for n in short)} | " * addition
    lines += table(columns + "clamped | clipped", shown)
    if not both:
        return lines
    pairs = ctx.entry.pairs(ctx.names)
    tests = {part: paired(p, pairs, ctx.entry.margin, resamples=0) for part, p in part_rows.items()}
    if not tests[names[1]]:
        return lines
    kind = "phrasing" if addition else "kind of topic"
    lines += ["", f"Each comparison on each {kind} apart (paired by seed, Holm within the {kind}; the pooled"]
    lines += ["verdict above decides):", ""]
    cell = lambda t: f"{t['diff']:+.3f} ({t['ci'][0]:+.3f}, {t['ci'][1]:+.3f}), p {t['p_holm']:.3g}"  # noqa: E731
    found = zip(*tests.values())
    return lines + table("comparison | " + " | ".join(parts), [[a["comparison"], cell(a), cell(b)] for a, b in found])


SECTIONS = {
    "long": long_table,
    "tests": tests_table,
    "paired": paired_table,
    "time": time_ratios,
    "real sweep": real_sweep_table,
    "real": real_table,
    "answers": answers,
    "signal": signal,
    "phrasing": phrasing,
}


def report(results, suite, configs, mix_code=False, note=""):
    """Write `<suite>.md`, `<suite>.jsonl` and the plot from the suite's finished runs (its entry in suites.SUITES says
    which tables)."""
    import studies

    entry = studies.SUITES[suite]
    runs = runner.load_runs(results, entry.reads or suite)  # a re-scoring reads the archive of the suite it re-scores
    rows = summarize(runs, configs)
    if not rows:
        print(f"{suite}: no finished runs yet")
        return rows
    versions = code_versions(rows)
    if len(versions) > 1 and not (mix_code or entry.copies or entry.same_numbers):  # copied runs keep their code
        raise SystemExit(
            f"{suite}: its runs ran {len(versions)} versions of the code ({', '.join(versions)}); rerun the old "
            f"ones (remove them from {suite}.tar.gz) or pass --mix_code"
        )
    with open(os.path.join(results, f"{suite}.jsonl"), "w") as f:
        for r in rows:  # the flags' paths the same on every machine
            r = dict(r, flags=[x.replace(results + os.sep, "<results>/") for x in r["flags"]])
            f.write(json.dumps({k: v for k, v in r.items() if k not in ("curves", "train", "args", "answers")}) + "\n")
    lines = [f"# {suite}", "", provenance_line(rows), "", *([note, ""] if note else [])]
    early = [  # online runs whose whole pass of prompts gave no batch end early, evaluated
        f"{c.name} seed {seed} at step {r['step']}"
        for c in configs
        for seed in c.seeds
        if runner.finished(runs.get(runner.run_key(c.name, seed)), runner.max_steps_of(c.flags))
        for r in runner.records(runs[runner.run_key(c.name, seed)])
        if r.get("ended_early")
    ]
    if early:
        lines += [f"Ended before their last step, a whole pass of prompts giving no batch: {', '.join(early)}.", ""]
    ctx = SimpleNamespace(entry=entry, results=results, configs=configs, names=[r["config"] for r in rows])
    for section in entry.sections:
        lines += (SECTIONS[section] if isinstance(section, str) else section)(rows, ctx)
    with open(os.path.join(results, f"{suite}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if entry.plot:
        plots.plot(results, suite, entry, rows, entry.start())
    return rows
