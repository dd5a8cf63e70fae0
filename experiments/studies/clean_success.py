"""The clean-success study: the instruction study's answers re-scored by rules that fail a success a careful reader
would not count, the same rules for every arm, and a blind read that measures the rules.

    python experiments/run.py --report --suite instructions_clean    # its tables, from the instruction study's archive

A success is *clean* when the reward passes it and none of the rules below fires. Each rule is a function of one answer
(its text, its topic, the word its prompt asks for) but the first, which reads a whole run: the plan (docs/results.md,
"The clean-success study: the plan") defines them, and tests/test_clean_success.py holds each to its definition. The
blind read (`python experiments/studies/clean_success.py sample` draws it) labels successes with the arm and seed
hidden; the report sets each rule against it.
"""

import argparse
import json
import os
import re
import sys
from collections import Counter
from dataclasses import replace

import numpy as np

EXPERIMENTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, EXPERIMENTS)  # `python experiments/studies/clean_success.py sample` from the root
import report  # noqa: E402
import runner  # noqa: E402
import smollm2  # noqa: E402
import stat_tests  # noqa: E402

from studies import instruction_study  # noqa: E402
from studies.instruction_study import DOUBLED, as_read, four_grams  # noqa: E402

START_ANSWERS = os.path.join(EXPERIMENTS, "smollm2", "constraints", "start_answers.jsonl")  # the starting model's
READ = os.path.join(EXPERIMENTS, "results", "instructions_read")  # the blind read: sample, key, labels
PER_RUN = 6  # successes the blind read draws from each run (all where it has fewer), with seed 0
FRAME_SHARE, FRAME_LIFT = 0.15, 3.0  # a learned frame: in >= 15% of a run's successes, >= 3x the starting model's share


# ---- the rules -------------------------------------------------------------------------------------------------------
def learned_frames(successes, start_answers):
    """A run's learned frames: the four words (four_grams: the topic and the asked word read as "_") held by at
    least 15% of its successes and at least 3 times as often as by the starting model's answers to the same prompts.
    successes, start_answers: lists of (text, topic, asked word)."""
    held = Counter(g for s in successes for g in four_grams(*s))
    start = Counter(g for s in start_answers for g in four_grams(*s))
    return {
        g
        for g, n in held.items()
        if n / len(successes) >= FRAME_SHARE and n / len(successes) >= FRAME_LIFT * start[g] / len(start_answers)
    }


REPEAT = re.compile(r"\b([a-z]+)\s+\1\b", re.IGNORECASE)  # "fluffy fluffy"


def doubled_word(text):
    """A word joined to itself ("soft and soft", "small or small", "warm, and very warm") or said twice in a row."""
    return DOUBLED.search(text) is not None or REPEAT.search(text) is not None


COPULA = {"is", "are", "was", "were"}


def tautology(text, topic):
    """The topic's noun before the first "is/are/was/were" and again within the four words after it ("Snow is snow.",
    "The book is a blue book.", "Old river is a type of river that is not young.")."""
    ws = [w.removesuffix("'s") for w in smollm2.words(text)]
    at = next((i for i, w in enumerate(ws) if w in COPULA), None)
    forms = smollm2.noun_forms(topic)
    return at is not None and bool(forms & set(ws[:at])) and bool(forms & set(ws[at + 1 : at + 5]))


def asked_as_name(text, asked):
    """The asked word used as a name: in quotes ('Blue', "blue"), after "called", "named", "titled" or "known as", or
    capitalized anywhere but as the answer's first word ("The Blue Book")."""
    if asked is None:
        return False
    w = re.escape(asked)
    quoted = re.search(rf"[\"'‘“]{w}[\"'’”]", text, re.IGNORECASE)
    named = re.search(rf"\b(called|named|titled|known as)\s+[\"'‘“]?{w}\b", text, re.IGNORECASE)
    capital = re.search(rf"(?<=\S)\s+[\"'‘“]?{asked.capitalize()}\b", text)
    return bool(quoted or named or capital)


WORD_TALK = re.compile(r"\b(words?|describ(e|es|ed|ing)|phrases?|adjectives?|nouns?|synonyms?|spell(s|ed|ing)?)\b")


def talks_about_words(text):
    """Talk about words or the task: the reward's own list (sentence, task, answer, response, instruction, "the word")
    or a word, description, phrase, adjective, noun, synonym or spelling ("The sun is a beautiful way to describe the
    sun.")."""
    return smollm2.talks_about_the_task(text) or WORD_TALK.search(text.lower()) is not None


def stray_quote(text):
    """A quotation mark that opens or closes nothing: an odd number of straight double quotes, curly ones unpaired, or
    a single quote after the final full stop with none opening a word before it ("The sun is warm.'")."""
    t = text.strip()
    closing = re.search(r"[.!?]['’]$", t) is not None and re.search(r"(^|\s)['‘]", t) is None
    return t.count('"') % 2 == 1 or t.count("“") != t.count("”") or closing


SUBJECTS = {"it", "he", "she", "this", "that", "which", "who", "one"}  # pronouns a verb in -s may follow


def no_verb(text, topic):
    """No finite verb anywhere: none of smollm2.FINITE's, no contraction ("it's"), no word in -ed, and no word in -s
    right after the topic's noun or a pronoun ("The river flows", "it glows"). A present-tense verb after a plural
    ("Birds sing") goes unseen: the blind read measures how often."""
    ws = smollm2.words(text)
    subjects = smollm2.noun_forms(topic) | SUBJECTS  # the topic's noun, or a pronoun
    for i, w in enumerate(ws):
        if w in smollm2.FINITE or smollm2.CONTRACTED.search(w) or (len(w) > 4 and w.endswith("ed")):
            return False
        if i and ws[i - 1] in subjects and w.endswith("s") and not w.endswith("ss"):
            return False
    return True


def rules(text, topic, asked, frames):
    """Which rules fail this success (a run's `frames`: learned_frames of its successes), in the plan's order."""
    fired = {
        "learned frame": bool(four_grams(text, topic, asked) & frames),
        "word doubled": doubled_word(text),
        "tautology": tautology(text, topic),
        "asked word as a name": asked_as_name(text, asked),
        "talk about words": talks_about_words(text),
        "stray quote": stray_quote(text),
        "no verb": no_verb(text, topic),
    }
    return [name for name, hit in fired.items() if hit]


READER = {  # the reader's label that each rule is measured against
    "learned frame": "template or nonsense",
    "word doubled": "word doubled",
    "tautology": "tautology",
    "asked word as a name": "asked word as a name",
    "talk about words": "talk about words or the task",
    "stray quote": "stray quote",
    "no verb": "no verb",
}
RULES = tuple(READER)  # in the plan's order


# ---- re-scoring a run ------------------------------------------------------------------------------------------------
def rescore(answers, rows, start):
    """A run's answers, each with `clean` (1.0: the reward passed it and no rule fails it) and `rules` (those that
    fire on a success)."""
    wins = [as_read(a, rows) for a in answers if a["reward"] == 1]
    frames = learned_frames(wins, start) if wins else set()
    out = []
    for a in answers:
        fired = rules(*as_read(a, rows), frames) if a["reward"] == 1 else []
        out.append(a | dict(rules=fired, clean=float(a["reward"] == 1 and not fired)))
    return out


# ---- the report's sections -------------------------------------------------------------------------------------------
def rescored(rows):
    """The report's rows, each run's answers re-scored (rescore)."""
    table = report.test_rows("constraints")
    start = [as_read(a, table) for a in map(json.loads, open(START_ANSWERS))]
    return [r | dict(answers=[rescore(run, table, start) for run in r["answers"]]) for r in rows]


def measured(row, key, seeds=lambda seed: True, prompts=lambda answer: True):
    """A row as stat_tests.paired reads it: its runs scored by `key` ("reward" or "clean"), on the seeds and prompts
    chosen."""
    kept = [(s, run) for s, run in zip(row["args"], row["answers"]) if seeds(s["seed"])]
    runs = [[a | dict(reward=a[key]) for a in run if prompts(a)] for _, run in kept]
    rewards = [float(np.mean([a["reward"] for a in run])) for run in runs]
    return row | dict(args=[s for s, _ in kept], answers=runs, rewards=rewards)


def measure_table(rows, ctx):
    """Each arm's success by the reward and clean, and of its successes (all seeds) the share each rule fails."""
    rows = rescored(rows)
    lines = ["", "Success by the reward and clean success (the reward's successes no rule fails), mean ± standard"]
    lines += ["error over seeds, and of each arm's successes (all seeds) the share each rule fails:", ""]
    shown = []
    for r in rows:
        wins = [a for run in r["answers"] for a in run if a["reward"] == 1]
        clean = report.mean_se(measured(r, "clean")["rewards"])
        shares = [f"{np.mean([name in a['rules'] for a in wins]):.3f}" if wins else "–" for name in RULES]
        failed = f"{np.mean([bool(a['rules']) for a in wins]):.3f}" if wins else "–"
        shown.append([r["config"], r["seeds"], len(wins), report.fmt(r["reward"]), report.fmt(clean), failed, *shares])
    columns = "arm | seeds | successes | success (reward) | clean success | any rule | " + " | ".join(RULES)
    return lines + report.table(columns, shown)


def tests_table(rows, ctx):
    """The study's comparisons by both measures, on every seed and prompt, without seed 0 (the pilot's) and on the
    held-out topics alone (never in the pilot): paired by seed, Holm over the comparisons within each."""
    rows, table = rescored(rows), report.test_rows("constraints")
    held_out = lambda a: smollm2.held_out("constraints", table[json.dumps(a["prompt"])])  # noqa: E731
    views = {
        "every seed, 384 prompts": {},
        "without seed 0": dict(seeds=lambda seed: seed != 0),
        "held-out topics alone (128 prompts)": dict(prompts=held_out),
    }

    def tested(key, how):  # the comparisons, each row scored by `key` on the seeds and prompts `how` keeps
        return stat_tests.paired([measured(r, key, **how) for r in rows], ctx.entry.pairs(ctx.names), 0.05, 0)

    lines = []
    for view, how in views.items():
        lines += ["", f"The comparisons, {view}: the mean paired difference (95% interval), Holm's p, the verdict:", ""]
        shown = []
        for t, c in zip(tested("reward", how), tested("clean", how)):  # the same comparisons, in the same order
            cells = [f"{x['diff']:+.3f} ({x['ci'][0]:+.3f}, {x['ci'][1]:+.3f}), p {x['p_holm']:.3g}" for x in (t, c)]
            same = "yes" if t["verdict"] == c["verdict"] else "no"
            shown.append([t["comparison"], t["seeds"], cells[0], t["verdict"], cells[1], c["verdict"], same])
        columns = "comparison | seeds | reward | verdict | clean | verdict | the same verdict"
        lines += report.table(columns, shown)
    return lines


def mix_table(rows, ctx):
    """Success on the held-out topics beside the training topics', each kind of constraint weighted as among the
    training topics' prompts (the held-out third asks for a word more often)."""
    table = report.test_rows("constraints")
    kind = lambda a: smollm2.kind("constraints", table[json.dumps(a["prompt"])])  # noqa: E731
    held_out = lambda a: smollm2.held_out("constraints", table[json.dumps(a["prompt"])])  # noqa: E731
    trained = Counter(kind(a) for a in rows[0]["answers"][0] if not held_out(a))
    weights = {k: n / sum(trained.values()) for k, n in trained.items()}

    def weighted(run):  # held-out success, each kind of constraint at its weight among the training topics
        by = {k: [a["reward"] for a in run if held_out(a) and kind(a) == k] for k in weights}
        return sum(w * np.mean(by[k]) for k, w in weights.items())

    lines = ["", "Success on the training topics, on the held-out topics, and on the held-out topics with each kind of"]
    lines += ["constraint weighted as among the training topics' prompts (mean ± standard error over seeds):", ""]
    shown, lower = [], 0
    for r in rows:
        train = [np.mean([a["reward"] for a in run if not held_out(a)]) for run in r["answers"]]
        raw = [np.mean([a["reward"] for a in run if held_out(a)]) for run in r["answers"]]
        mixed = [weighted(run) for run in r["answers"]]
        lower += np.mean(mixed) < np.mean(train)
        cells = [report.fmt(report.mean_se(x)) for x in (train, raw, mixed)]
        shown.append([r["config"], r["seeds"], *cells, f"{np.mean(mixed) - np.mean(train):+.3f}"])
    columns = "arm | seeds | training topics | held-out | held-out, training mix | weighted - training"
    lines += report.table(columns, shown)
    return lines + ["", f"Lower on the held-out topics at the training mix: {lower} of {len(rows)} arms."]


def read_table(rows, ctx):
    """The blind read against the rules: per arm, the share of its drawn successes the reader would not count (95%
    Wilson interval) beside the rules'; per rule, its precision and recall against the reader's label."""
    key = {k["id"]: k for k in map(json.loads, open(os.path.join(READ, "key.jsonl")))}
    read = [key[x["id"]] | x for x in map(json.loads, open(os.path.join(READ, "labels.jsonl")))]
    lines = ["", f"The blind read: {len(read)} successes drawn across every run (up to {PER_RUN} each), read shuffled"]
    lines += ["with the arm and seed hidden. Per arm, the share the reader would not count (95% Wilson interval)"]
    lines += ["beside the share any rule fails, and the arm's success by the reward times the share the reader would"]
    lines += ["count (a description: each seed's draw weighs alike, and the interval is the read's alone):", ""]
    shown = []
    for r in rows:
        mine = [x for x in read if x["arm"] == r["config"]]
        out = sum(not x["countable"] for x in mine)
        lo, hi = stat_tests.wilson(out, len(mine))
        ruled = np.mean([bool(x["rules"]) for x in mine]) if mine else float("nan")
        success = r["reward"][0]
        counted = f"{success * (1 - out / len(mine)):.3f} ({success * (1 - hi):.3f}, {success * (1 - lo):.3f})"
        share = f"{out / len(mine):.2f} ({lo:.2f}, {hi:.2f})"
        shown.append([r["config"], len(mine), share, f"{ruled:.2f}", counted])
    columns = "arm | read | not countable (reader) | any rule | success the reader would count"
    lines += report.table(columns, shown)
    lines += ["", "Each rule against the reader's label for it (precision: of the successes it fails, the share the"]
    lines += ["reader labelled so; recall: of those the reader labelled so, the share it fails):", ""]
    shown = []
    for rule, label in [*READER.items(), ("any rule", "not countable")]:
        fires = [bool(x["rules"]) if rule == "any rule" else rule in x["rules"] for x in read]
        says = [not x["countable"] if label == "not countable" else label in x["reasons"] for x in read]
        both = sum(f and s for f, s in zip(fires, says))
        precision = f"{both / sum(fires):.2f} ({both}/{sum(fires)})" if sum(fires) else "–"
        recall = f"{both / sum(says):.2f} ({both}/{sum(says)})" if sum(says) else "–"
        shown.append([rule, label, sum(fires), sum(says), precision, recall])
    return lines + report.table("rule | the reader's label | fails | labelled | precision | recall", shown)


PLAN = 'The plan of this re-scoring: docs/results.md, "The clean-success study", committed before it in 8ad68d7.'
SUITES = {
    "instructions_clean": replace(
        instruction_study.SUITES["instructions"],
        reads="instructions",
        sections=(measure_table, tests_table, mix_table, read_table),
        plot=None,
        note=lambda results, chosen: PLAN,
    )
}


def draw(out=READ):
    """Draw the blind read from the instruction study's archive: up to PER_RUN successes of every run, each key line
    with the rules that fail it."""
    results = os.path.join(EXPERIMENTS, "results")
    configs = instruction_study.SUITES["instructions"].runs(results, report.choose_rates(results))
    rows = rescored(report.summarize(runner.load_runs(results, "instructions"), configs))
    runs = [(r["config"], s["seed"], run) for r in rows for s, run in zip(r["args"], r["answers"])]
    drawn = report.blind_read(runs, out, successes=PER_RUN, key=lambda answer: dict(rules=answer["rules"]))
    print(f"{drawn} successes drawn into {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Draw the clean-success study's blind read.")
    parser.add_argument("command", choices=["sample"], help="write instructions_read/sample.jsonl and key.jsonl")
    parser.parse_args()
    draw()
