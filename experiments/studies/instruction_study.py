"""The instruction study (docs/results.md, "The instruction study: the plan", committed before its runs in f1ac939):
the constraints task again, under the current reward; DPO, KTO and GRPO offline, offline + humanline and online, and
GRPO offline without an anchor (`instructions_sweep`, 2 seeds a rate; `instructions`: 8 seeds for DPO's and GRPO's
offline + humanline and online arms, 5 for the others), scored on the 256 test prompts and 128 on held-out topics.
Its rate rule is the second study's (the grid grows past an edge that wins), amended for KTO online. Its rates' keys:
"constraints instruction study: <arm>".
"""

import json
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import report
import runner
import smollm2
from report import table
from suites import lr_flags, real_suites

from studies.first_study import MODES, MULTIPLES, PAIRS
from studies.second_study import NO_ANCHOR, SWEEP_SEEDS

INSTRUCTION = "instruction study: "
FIVE, EIGHT = tuple(range(5)), tuple(range(8))  # 8: DPO's and GRPO's arms but offline, as the power analysis asked
ARMS = {
    f"{a} {m}": (a, m, [], MULTIPLES, EIGHT if a != "kto" and m != "offline" else FIVE)
    for a in ("dpo", "kto", "grpo")
    for m in MODES
}
ARMS["grpo offline, no anchor"] = ("grpo", "offline", NO_ANCHOR, MULTIPLES, FIVE)
INSTRUCTION_PAIRS = PAIRS + [("grpo offline+humanline", "grpo offline, no anchor")]
# the plan's amendment: KTO online at its sweep's second rate, 1.6e-4 (validation 0.543 against 6.4e-4's 0.570). At the
# chosen 6.4e-4 a run can stall (its samples cut, 0-1 pairs a round) and need over 3 hours on its one thread
KTO_ONLINE_RATE = 1.6e-4


# ways to score without doing the task well, hunted in every success (the report's "hacks" section): the asked word
# twice ("The dog is cold due to the cold weather."), a word doubled ("A dog is soft and soft."), and a template: the
# same run of four words, the topic's and the asked word's put aside, in many answers ("_ _ is a type of _ that is _")
DOUBLED = re.compile(r"\b([a-z]+)\b,?\s+(?:and|or|but)\s+(?:so\s+|very\s+)?\1\b", re.IGNORECASE)


def skeleton(text, topic, asked):
    """The answer's words, the topic's words and the asked word each read as "_"."""
    aside = set(smollm2.words(topic)) | smollm2.noun_forms(topic) | {asked}
    return ["_" if w.removesuffix("'s") in aside else w for w in smollm2.words(text)]


def four_grams(text, topic, asked):
    ws = skeleton(text, topic, asked)
    return {" ".join(ws[i : i + 4]) for i in range(len(ws) - 3)}


def as_read(answer, rows):
    """(text, topic, asked word) of an answer, as four_grams reads it, from its prompt's row (report.test_rows)."""
    row = rows[json.dumps(answer["prompt"])]
    return answer["completion"], row["topic"], smollm2.asked_word(row["constraint"])


def commonest(wins):
    """The four words (four_grams) most of these successes hold, the first in order among equals, and the
    share that holds them."""
    counts = Counter(g for win in wins for g in four_grams(*win))
    common = sorted(counts.items(), key=lambda c: (-c[1], c[0]))[:1] or [("–", 0)]
    return common[0][0], common[0][1] / max(len(wins), 1)


def hacks(rows, ctx):
    """Of each row's successes (its seeds' pooled), the shares that talk about the task, say the asked word twice,
    double a word ("soft and soft"), and hold the row's commonest four words (a template); and the run whose
    successes hold their own commonest four words most, the first seed among equals (one seed's template, which
    pooling hides)."""
    split = report.test_rows(ctx.entry.task)
    lines = ["", "Of each row's successes (all seeds), the shares that talk about the task, say the asked word twice,"]
    lines += [
        'double a word ("soft and soft") and hold its commonest four words ("_": the topic or the asked word), and',
        "the seed whose own successes hold their commonest four words most, with that share:",
        "",
    ]

    shown = []
    for r in rows:
        runs = [[as_read(a, split) for a in run if a["reward"] == 1] for run in r["answers"]]
        wins = [w for run in runs for w in run]
        share = lambda says: f"{np.mean([says(*w) for w in wins]):.3f}" if wins else "–"  # noqa: E731
        cells = [share(lambda t, *_: smollm2.talks_about_the_task(t))]
        cells += [share(lambda t, _, w: w is not None and smollm2.words(t).count(w) >= 2)]
        cells += [share(lambda t, *_: DOUBLED.search(t) is not None)]
        gram, most = commonest(wins)
        cells += [f"{most:.3f} ({gram})"]
        by_seed = {seed["seed"]: commonest(run) for run, seed in zip(runs, r["args"])}
        seed = max(by_seed, key=lambda s: by_seed[s][1])  # the first seed among equals
        cells += [f"seed {seed}: {by_seed[seed][1]:.3f} ({by_seed[seed][0]})"]
        shown.append([r["config"], r["seeds"], len(wins), *cells])
    columns = "configuration | seeds | successes | talk about the task | asked word twice | a word doubled"
    return lines + table(columns + " | commonest four words | one seed's commonest", shown)


PLAN = 'The plan of these runs: docs/results.md, "The instruction study", committed before them in f1ac939.'
AMENDED = PLAN + " Its amendment, KTO online at 1.6e-4 (not 6.4e-4): committed before that arm's runs."
STUDY = ("instructions", ARMS, INSTRUCTION_PAIRS, SWEEP_SEEDS, INSTRUCTION, True, [hacks, "phrasing"], PLAN)
SUITES = real_suites("constraints", *STUDY, test=("test_heldout", 384))


def instructions(results, chosen, at_chosen_rates=SUITES["instructions"].runs):
    configs = at_chosen_rates(results, chosen)
    for i, c in enumerate(configs):
        if c.name == "kto online":
            configs[i] = c._replace(flags=runner.strip(c.flags, "--learning_rate") + lr_flags(KTO_ONLINE_RATE))
    return configs


SUITES["instructions"] = replace(SUITES["instructions"], runs=instructions, note=lambda results, chosen: AMENDED)
