"""Reward functions for the tests (some misbehave on purpose): passed to the scripts as
`--reward_model tests.support.faulty_rewards:flaky` (or in GRPO's --reward_funcs), the way a user passes their own
module:function."""

import math
import zlib

import toy_task


def kind(prompt, completion):
    """Which fault (if any) a sample gets: fixed by its text, so that a retry gives the same answer."""
    return zlib.crc32(f"{prompt}|{completion}".encode()) % 20


def flaky(prompts, completions, **columns):
    """The toy reward, except for about one sample in five (fixed by the sample's text): an exception (the
    whole call raises), NaN, None or inf."""
    out = []
    for p, c in zip(prompts, completions):
        k = kind(p, c)
        if k == 0:
            raise ValueError(f"cannot score {c!r}")
        out.append({1: math.nan, 2: None, 3: math.inf}.get(k, toy_task.reward([p], [c])[0]))
    return out


def always_raises(prompts, completions, **columns):
    """A reward that fails on every sample (a missing column, a wrong signature): the run must stop and say why."""
    raise KeyError("solution")


def length(prompts, completions, **columns):
    """Any model's reward: the completion's length in characters."""
    return [float(len(c)) for c in completions]


def checksum(prompts, completions, **columns):
    """Any model's reward that differs between samples of equal length: the character codes' sum modulo 97."""
    return [float(sum(map(ord, c)) % 97) for c in completions]


def solution_length(prompts, completions, solution, **columns):
    """Needs the dataset's extra 'solution' column (as a math accuracy reward does)."""
    return [float(len(c) == len(s)) + r for c, s, r in zip(completions, solution, checksum(prompts, completions))]


def ties(prompts, completions, **columns):
    """Every sample scores the same: no round keeps a (best, worst) pair."""
    return [1.0] * len(completions)


def ties_at_first(prompts, completions, **columns):
    """`ties` for the first call (the first round's scoring), then the toy reward: a round that keeps no pair, then
    rounds that do (`ties_at_first.calls` counts the calls; a test sets it to 0)."""
    ties_at_first.calls += 1
    return ties(prompts, completions) if ties_at_first.calls == 1 else toy_task.reward(prompts, completions)


ties_at_first.calls = 0


def few_pairs_at_first(prompts, completions, **columns):
    """Call i (1-based) of the first len(`few_pairs_at_first.keep`) calls: a (best, worst) pair for the first
    keep[i-1] prompts whose samples differ, ties for the rest (so that round keeps exactly that many pairs); then the
    toy reward. A test sets `.keep` and `.calls`."""
    few_pairs_at_first.calls += 1
    if few_pairs_at_first.calls > len(few_pairs_at_first.keep):
        return toy_task.reward(prompts, completions)
    samples = {}
    for i, p in enumerate(prompts):
        samples.setdefault(p, []).append(i)
    scores, paired = [1.0] * len(completions), 0
    for rows in samples.values():
        first = completions[rows[0]]
        if paired < few_pairs_at_first.keep[few_pairs_at_first.calls - 1] and any(
            completions[i] != first for i in rows
        ):
            paired += 1
            for i in rows[1:]:
                scores[i] = 0.0 if completions[i] != first else 1.0
    return scores


few_pairs_at_first.calls, few_pairs_at_first.keep = 0, []


def ties_every_other(prompts, completions, **columns):
    """`ties` on odd calls (rounds 1, 3, ...), the toy reward on even ones: short rounds, never two in a row."""
    ties_every_other.calls += 1
    return ties(prompts, completions) if ties_every_other.calls % 2 else toy_task.reward(prompts, completions)


ties_every_other.calls = 0


def fails_once_per_prompt(prompts, completions, **columns):
    """None for each prompt's first sample, the toy reward for the others (a group keeps all but one)."""
    return [
        None if p not in prompts[:i] else toy_task.reward([p], [c])[0]
        for i, (p, c) in enumerate(zip(prompts, completions))
    ]


def fails_all_but_one(prompts, completions, **columns):
    """None for all but each prompt's last sample: no prompt keeps two rewards (75% fail with 4 samples a prompt)."""
    return [
        None if p in prompts[i + 1 :] else toy_task.reward([p], [c])[0]
        for i, (p, c) in enumerate(zip(prompts, completions))
    ]


def finished_only(prompts, completions, finished, **columns):
    """1.0 for an answer that ended on its own, 0.0 for one cut at the token limit (the `finished` column the scripts
    pass every scorer), and a failed reward (None) for about one sample in four, fixed by its text."""
    return [None if kind(p, c) % 4 == 0 else float(f) for p, c, f in zip(prompts, completions, finished)]


SCORED = {}  # prompt -> [the order in which it was first scored, how many of its samples were scored]


def some_ties(prompts, completions, **columns):
    """Every other prompt (in the order first scored) scores each sample 1.0; the others score each sample by its
    order, 1, 2, 3, ...: a group of those has distinct rewards around a mean none of them equals, so no sequence of it
    has advantage 0."""
    out = []
    for p in prompts:
        order, count = SCORED.setdefault(p, [len(SCORED), 0])
        SCORED[p][1] = count + 1
        out.append(1.0 if order % 2 == 0 else float(count + 1))
    return out
