"""What every suite is made of: a configuration (Config), a suite (Suite: its runs at the learning rates chosen so
far, and what its report adds), the paper's rates, the one chooser of rates, and a real model's study built from its
arms (real_suites). Each study defines its suites in its own file of studies/, which `studies.SUITES` gathers; the
runner and the report read these entries, never a suite's name. A sweep trains each variant at several rates on the
validation prompts; the rate with the best mean there is the one the other suites train it at, on the test prompts.
What each suite shows: docs/results.md.
"""

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import runner
import smollm2


class Config(NamedTuple):  # one configuration of a suite: its runs are one per seed
    name: str
    script: str
    flags: list  # the script's, its learning rate's included
    seeds: tuple
    variant: str = None  # a sweep's: the variant ("dpo offline", "addition dpo offline") whose rate it measures
    rate: float = None  # a sweep's: the learning rate it measures (best_rates chooses among a variant's)


# the paper's learning rates (its Table 3) per objective and mode; a humanline variant starts from its mode's rate
PAPER_LR = {"dpo offline": 5e-6, "dpo online": 2.5e-6, "kto offline": 5e-6, "kto online": 2.5e-6}
PAPER_LR |= {"grpo offline": 5e-6, "grpo online": 5e-6}


def paper_lr(cell):
    return PAPER_LR[cell.split("+")[0]]


def rate_of(flags):
    return float(flags[flags.index("--learning_rate") + 1]) if "--learning_rate" in flags else math.nan


def lr_flags(rate):
    return ["--learning_rate", f"{rate:g}"]


def best_rates(configs, rewards):
    """The one chooser of rates: per variant of a sweep's configurations, the rate with the highest mean final
    validation reward (the first of equals), once every rate has finished every seed (a rate chosen from partial data
    could still change); a variant not complete yet is left out. rewards(config): its finished seeds' final rewards."""
    chosen = {}
    for variant in dict.fromkeys(c.variant for c in configs):
        mine = [c for c in configs if c.variant == variant]
        found = [rewards(c) for c in mine]
        if all(len(r) == len(c.seeds) for r, c in zip(found, mine)):
            chosen[variant] = mine[int(np.argmax([np.mean(r) for r in found]))].rate
    return chosen


def final_rewards(results, suite):
    """config -> the final held-out rewards of its finished seeds in a suite's runs (as report.summarize reads them)."""
    runs = runner.load_runs(results, suite)

    def rewards(c):
        done = [runs.get(runner.run_key(c.name, seed)) for seed in c.seeds]
        done = [r for r in done if runner.finished(r, runner.max_steps_of(c.flags))]
        return [[r for r in runner.records(run) if "eval/reward" in r][-1]["eval/reward"] for run in done]

    return rewards


# ---- the real model's suites -----------------------------------------------------------------------------------------
def arm_flags(task, arm, split="test", n=256):
    """An arm's flags: the task's for its objective and mode, the arm's own in place of those they set."""
    algo, mode, more, *_ = arm
    flags = smollm2.flags(task, algo, mode, split, n)
    for name, value in zip(more, more[1:] + ["--"]):
        flags = runner.strip(flags, name) if name.startswith("--") and not value.startswith("--") else flags
    return flags + more


def real_sweep(task, arms, seeds, prefix="", grow=None):
    """A real model's sweep: each arm at each rate of its grid, on the validation prompts (`grow`, the suite's name:
    the grid grown past an edge that wins). An arm's rate is chosen as "<task> <prefix><arm>"."""

    def runs(results, chosen):
        out = []
        for name, arm in arms.items():
            flags, key = arm_flags(task, arm, "valid", 128), f"{task} {prefix}{name}"

            def make(m, arm=arm, flags=flags, key=key, name=name):
                rate = m * paper_lr(f"{arm[0]} {arm[1]}")
                config = f"{task} {name} lr {rate:g}"
                return Config(config, f"{arm[0]}_humanline.py", flags + lr_flags(rate), seeds, key, rate)

            out += grown(results, grow, make, arm[3]) if grow else [make(m) for m in arm[3]]
        return out

    return runs


def real(task, arms, prefix="", test=("test", 256), earlier=(), earlier_prefix=""):
    """A real model's comparison: each arm at its rate chosen on the validation prompts (the `earlier` arms' by an
    earlier study's sweep, whose keys hold `earlier_prefix`), scored on test[1] prompts of the split test[0]."""

    def runs(results, chosen):
        return [
            Config(name, f"{arm[0]}_humanline.py", arm_flags(task, arm, *test) + lr_flags(chosen[key]), arm[4])
            for name, arm in arms.items()
            for key in [f"{task} {earlier_prefix if name in earlier else prefix}{name}"]
            if key in chosen
        ]

    return runs


def grown(results, suite, make, multiples):
    """A variant's sweep configurations (make(multiple) -> Config) on its grid, grown by one rate 4x past an edge that
    won with every seed, until a rate inside wins or the grid reaches 1/4x or 256x the paper's (the second study's
    rule: docs/results.md)."""
    multiples, rewards = sorted(multiples), final_rewards(results, suite)
    while True:
        configs = [make(m) for m in multiples]
        best = best_rates(configs, rewards).get(configs[0].variant)
        at = None if best is None else [c.rate for c in configs].index(best)
        if at == len(configs) - 1 and multiples[-1] < 256:
            multiples.append(multiples[-1] * 4)
        elif at == 0 and multiples[0] > 0.25:
            multiples.insert(0, multiples[0] / 4)
        else:
            return configs


# ---- a suite ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Suite:
    runs: Callable  # (results folder, chosen rates) -> [Config]
    # the report's tables, in order: a name of report.SECTIONS, or a study's own (rows, ctx) -> lines
    sections: tuple = ("long", "tests", "time")
    pairs: Callable = lambda names: []  # the comparisons it tests: (a, b) asks how a differs from b
    plot: object = "bars"  # "bars" (each row's final reward), a study's own (plt, rows, start) -> figure, or None
    note: Callable = lambda results, chosen: ""  # text under the title
    held_out: str = "the toy test problems"
    margin: float = 0.01  # TOST's equivalence margin of the reward, fixed before the runs
    start: Callable = lambda: None  # the starting policy's reward on the held-out prompts
    chooses_rates: bool = False  # a rate sweep: its configurations' variant and rate (report.choose_rates)
    paper_rates: dict = None  # a sweep's: each variant's rate under --quick (the paper's)
    model: str = "toy task"
    task: str = None  # the real model's task: runs only when named; its runs checkpoint and measure quality
    arms: tuple = None  # a real model's sweep: (the prefix of its rates' keys, its arms), for its table
    copies: str = None  # a suite whose runs of the same configuration and seed it copies before running its own
    reads: str = None  # a suite whose archive it re-scores: it runs nothing of its own
    same_numbers: str = None  # a table of two code versions: the check that showed them computing alike (its note says)


def real_suites(task, name, arms, pairs, sweep_seeds, prefix="", grow=False, more=(), note="", welch=False, **more_of):
    """A real-model study's two suites, {name: Suite}: `<name>_sweep` chooses each arm's rate on the task's
    validation prompts (its grid grown past an edge that wins where `grow`), `<name>` compares the arms at those rates
    on the test prompts, paired by seed (the first study's tables keep their Welch tests beside: `welch`), with the
    report's `more` sections; `note` goes under both titles. `more_of`: earlier=(arms whose rate an earlier study
    chose, not swept again), earlier_prefix=(that study's prefix of its rates' keys), copies=(the suite whose runs of
    those arms it copies), test=(its test split, its size: the test prompts' 256 unless said)."""
    test, earlier = more_of.get("test", ("test", 256)), more_of.get("earlier", ())
    swept, out = {n: arm for n, arm in arms.items() if n not in earlier}, {}
    if swept:  # a study of arms whose rates an earlier sweep chose has none of its own
        out[f"{name}_sweep"] = Suite(
            runs=real_sweep(task, swept, sweep_seeds, prefix, grow=f"{name}_sweep" if grow else None),
            arms=(prefix, swept),
            sections=("long", "real sweep"),
            held_out=f"the {task} task's 128 validation prompts (success rate)",
            start=lambda: smollm2.starting(task, "valid"),
            chooses_rates=True,
            **real_model(task, note),
        )
    out[name] = Suite(
        runs=real(task, arms, prefix, test, earlier, more_of.get("earlier_prefix", "")),
        copies=more_of.get("copies"),
        sections=("long", *["tests"] * welch, "paired", "real", "time", *more, "answers"),
        pairs=lambda names: pairs,
        held_out=f"the {task} task's {test[1]} test prompts (success rate)",
        margin=0.05,  # 256 test prompts of 0/1 give a run a standard error near 0.03, so ±0.01 is out of reach
        start=lambda: smollm2.starting(task, test[0]),
        **real_model(task, note),
    )
    return out


def one_real_suite(task, runs, sections, note, split="test", n=256):
    """A real-model suite of its own (no sweep, no tests): its runs scored on n prompts of a split."""
    return Suite(
        runs=runs,
        sections=sections,
        held_out=f"the {task} task's {n} {dict(valid='validation').get(split, split)} prompts (success rate)",
        start=lambda: smollm2.starting(task, split),
        margin=0.05,
        **real_model(task, note),
    )


def real_model(task, note):
    """The fields every real-model suite shares: the model, the task, the note under its title."""
    return dict(model="SmolLM2-135M-Instruct", task=task, note=lambda results, chosen: note)
