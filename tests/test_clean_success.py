"""The clean-success study's rules, each held to the plan's definition with sentences it must fail and sentences it must
pass; a run's learned frames; the re-scoring of a run; the blind read's draw; and its report on a small archive."""

import json
import os
import sys
from collections import Counter

import pytest
from paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import report  # noqa: E402
import stat_tests  # noqa: E402
from studies import clean_success as cs  # noqa: E402


@pytest.mark.parametrize(
    "text, doubled",
    [
        ("The sun is soft and soft.", True),
        ("The harbor is warm, and very warm today.", True),
        ("A dog was a fluffy fluffy dog in the yard.", True),
        ("The sun is bright and warm in the morning.", False),
        ("The river runs fast and the fish swim slowly.", False),
    ],
)
def test_a_word_doubled(text, doubled):
    assert cs.doubled_word(text) is doubled


@pytest.mark.parametrize(
    "text, topic, tautology",
    [
        ("Snow is snow in the winter of the north.", "snow", True),
        ("The book is a blue book.", "books", True),
        ("Old river is a type of river that is not young.", "a river", True),
        ("A dog is a pet that loves to play fetch with other dogs.", "a dog", False),  # the noun comes back far later
        ("The sun is a bright star that warms the earth.", "the sun", False),
        ("A river of blue water runs past the old mill.", "a river", False),  # no copula
    ],
)
def test_a_tautology(text, topic, tautology):
    assert cs.tautology(text, topic) is tautology


@pytest.mark.parametrize(
    "text, asked, name",
    [
        ('The book is called "Blue" by the author.', "blue", True),
        ("The library is known as blue among the students.", "blue", True),
        ("I read The Blue Book at the library today.", "blue", True),
        ("The dog is named Max and likes warm days.", "warm", False),  # the name is another word
        ("Blue skies hang over the city all summer.", "blue", False),  # capitalized as the first word
        ("The book has a blue cover and old pages.", "blue", False),
        ("The book has a Blue cover.", None, False),  # a constraint that asks for no word
    ],
)
def test_the_asked_word_as_a_name(text, asked, name):
    assert cs.asked_as_name(text, asked) is name


@pytest.mark.parametrize(
    "text, talk",
    [
        ("The sun is a beautiful way to describe the sun.", True),
        ("This sentence is about a dog.", True),  # the reward's own list
        ("Warm is a word that means cozy and nice.", True),
        ("The adjective soft fits the moon.", True),
        ("The moon glows softly over the quiet hills.", False),
        ("The swordfish swims in the deep sea.", False),  # "words" inside another word is none
    ],
)
def test_talk_about_words_or_the_task(text, talk):
    assert cs.talks_about_words(text) is talk


@pytest.mark.parametrize(
    "text, stray",
    [
        ('Small rain showers down from the sky."', True),
        ("The sun is warm.'", True),
        ("The sun is warm.”", True),
        ('She said "warm" and smiled at the sun.', False),
        ("The book 'Blue' sits on the old shelf.'", False),  # a single quote opens a word before the last one
        ("The dog's tail wags all day long.", False),  # an apostrophe is no quote
    ],
)
def test_a_stray_quote(text, stray):
    assert cs.stray_quote(text) is stray


@pytest.mark.parametrize(
    "text, topic, verbless",
    [
        ("Soft moonlight over the quiet hills of the north.", "the moon", True),
        ("A warm market in the market of a warm city.", "a market", True),
        ("The river flows past the old mill.", "a river", False),  # -s after the topic's noun
        ("It glows softly over the quiet hills.", "the moon", False),  # -s after a pronoun
        ("The sun is a bright star.", "the sun", False),
        ("The city glowed under the evening lights.", "a city", False),  # -ed
        ("It's a cold night in the city.", "a city", False),  # a contraction
    ],
)
def test_no_verb(text, topic, verbless):
    assert cs.no_verb(text, topic) is verbless


def test_a_learned_frame_is_common_in_the_run_and_rare_at_the_start():
    frame = [("You have too much coffee, I am soft.", "coffee", "soft")] * 3
    plain = [("The sea is a vast and quiet expanse of water.", "the sea", None)] * 3
    other = [("Birds sing in the morning light over the fields.", "birds", None)] * 14
    start = plain * 10 + other  # the starting model writes the plain shape in 30 of its 44 answers, never the frame
    frames = cs.learned_frames(frame + plain + other, start)  # the run: each shape in 3 of 20 successes (15%)
    assert "you have too much" in frames  # 15% of the run's successes, never at the start
    assert not any(g in frames for g in ("_ _ is a", "is a vast and"))  # 15% of the run's, 68% of the start's
    assert "_ sing in the" not in frames  # 70% of the run's, but as common at the start
    fewer = cs.learned_frames(frame[:2] + plain + other, start)  # 2 of 19: below 15%
    assert "you have too much" not in fewer


def test_rules_name_each_rule_that_fires_in_the_plans_order():
    fired = cs.rules('The dog is a dog and dog."', "a dog", None, frames={"the _ is _"})
    assert fired == ["learned frame", "word doubled", "tautology", "stray quote"]
    assert cs.rules("The moon glows softly over the quiet hills.", "the moon", "soft", set()) == []
    assert set(cs.RULES) == set(cs.READER)  # each rule is measured against one label of the reader's


def test_rescore_fails_a_ruled_success_and_leaves_failures_failed():
    rows = {
        json.dumps(p): dict(prompt=p, topic=t, constraint=c)
        for p, t, c in [
            ([{"role": "user", "content": "Describe a dog."}], "a dog", "include:soft"),
            ([{"role": "user", "content": "Describe the moon."}], "the moon", "no_comma:"),
        ]
    }
    prompts = [json.loads(k) for k in rows]
    answers = [
        dict(prompt=prompts[0], completion="The dog is soft and soft.", reward=1.0),
        dict(prompt=prompts[1], completion="The moon glows softly over the quiet hills.", reward=1.0),
        dict(prompt=prompts[1], completion="The moon.", reward=0.0),
    ]
    start = [("The moon glows softly over the quiet hills.", "the moon", None)] * 4
    out = cs.rescore(answers, rows, start)
    assert [a["clean"] for a in out] == [0.0, 1.0, 0.0]
    assert "word doubled" in out[0]["rules"] and out[1]["rules"] == [] and out[2]["rules"] == []


def test_the_blind_read_hides_the_arm_and_seed_and_draws_successes_and_failures_of_each_run(tmp_path):
    def run(n_wins, tag):
        return [dict(prompt=[{"content": f"p{i}"}], completion=f"{tag} {i}", reward=float(i < n_wins), rules=[i])
                for i in range(10)]  # fmt: skip

    runs = [("arm a", 0, run(8, "a0")), ("arm a", 1, run(2, "a1")), ("arm b", 0, run(0, "b0"))]
    drawn = report.blind_read(runs, tmp_path, successes=4, failures=2, key=lambda a: dict(rules=a["rules"]))
    assert drawn == (4 + 2) + (2 + 2) + (0 + 2)
    seen = [json.loads(line) for line in open(tmp_path / "sample.jsonl")]
    key = [json.loads(line) for line in open(tmp_path / "key.jsonl")]
    assert all(set(s) == {"id", "prompt", "answer"} for s in seen)  # no arm, no seed, no rule
    assert all(list(k) == ["id", "arm", "seed", "rules"] for k in key)
    assert [s["id"] for s in seen] == [k["id"] for k in key] == list(range(12))
    assert sorted(k["seed"] for k in key if k["arm"] == "arm a") == [0] * 6 + [1] * 4
    kinds = Counter()  # (run, success) -> how many drawn: up to 4 successes and 2 failures of each
    for s, k in zip(seen, key):
        tag, i = s["answer"].split()
        kinds[tag, int(i) < {"a0": 8, "a1": 2, "b0": 0}[tag]] += 1
        assert k["rules"] == [int(i)]  # what the study adds, of the answer drawn
    assert kinds == {("a0", True): 4, ("a0", False): 2, ("a1", True): 2, ("a1", False): 2, ("b0", False): 2}
    assert [s["answer"] for s in seen] != sorted(s["answer"] for s in seen)  # shuffled
    again = tmp_path / "again"
    report.blind_read(runs, again, successes=4, failures=2, key=lambda a: dict(rules=a["rules"]))
    assert (again / "sample.jsonl").read_text() == (tmp_path / "sample.jsonl").read_text()  # the same draw


def test_the_blind_read_draws_the_committed_sample_and_key_again(tmp_path):
    """The clean-success study's draw from the instruction study's committed archive is the committed read, byte for
    byte."""
    cs.draw(tmp_path)
    for name in ("sample.jsonl", "key.jsonl"):
        assert (tmp_path / name).read_bytes() == open(os.path.join(cs.READ, name), "rb").read(), name


def test_wilson_interval_by_hand():
    # 3 of 10: centre (0.3 + 1.96^2 / 20) / (1 + 1.96^2 / 10) = 0.3555, half-width 1.96 sqrt(0.3 * 0.7 / 10 +
    # 1.96^2 / 400) / (1 + 1.96^2 / 10) = 0.2477
    lo, hi = stat_tests.wilson(3, 10)
    assert (lo, hi) == pytest.approx((0.3555 - 0.2477, 0.3555 + 0.2477), abs=2e-4)
    assert all(x != x for x in stat_tests.wilson(0, 0))  # no read: no interval


def test_measured_keeps_the_chosen_seeds_and_prompts_and_scores_by_the_measure():
    answers = [dict(prompt=p, reward=r, clean=c) for p, r, c in [("a", 1.0, 1.0), ("b", 1.0, 0.0), ("c", 0.0, 0.0)]]
    row = dict(args=[{"seed": 0}, {"seed": 1}], answers=[answers, answers[:2]], rewards=[0.6, 1.0])
    assert cs.measured(row, "reward")["rewards"] == pytest.approx([2 / 3, 1.0])
    assert cs.measured(row, "clean")["rewards"] == pytest.approx([1 / 3, 0.5])
    later = cs.measured(row, "clean", seeds=lambda seed: seed != 0, prompts=lambda a: a["prompt"] != "a")
    assert later["args"] == [{"seed": 1}] and later["rewards"] == [0.0]
    assert [a["reward"] for a in later["answers"][0]] == [0.0]  # the row's answers carry the measure as the reward


def test_the_topic_mix_weighs_the_held_out_kinds_as_the_training_topics_prompts():
    path = os.path.join(ROOT, "experiments", "smollm2", "constraints", "test_heldout.jsonl")  # the study's 384 prompts
    table = {json.dumps(r["prompt"]): r for r in map(json.loads, open(path))}
    kinds = {k: cs.smollm2.kind("constraints", row) for k, row in table.items()}
    held = {k: cs.smollm2.held_out("constraints", row) for k, row in table.items()}
    # success on every "include" prompt and no other: each kind's success is 1 or 0, so the weighted held-out
    # success is the training topics' share of "include" prompts, whatever the held-out third's own mix
    run = [dict(prompt=json.loads(k), reward=float(kinds[k] == "include")) for k in table]
    rows = [dict(config="arm", seeds=1, answers=[run])]
    trained = [kinds[k] == "include" for k in table if not held[k]]
    raw = [kinds[k] == "include" for k in table if held[k]]
    assert sum(raw) / len(raw) != pytest.approx(sum(trained) / len(trained), abs=0.01)  # the mixes differ
    text = "\n".join(cs.mix_table(rows, None))
    share = f"{sum(trained) / len(trained):.3f}"
    assert f"| arm | 1 | {share} | {sum(raw) / len(raw):.3f} | {share} | +0.000 |" in text
    assert "Lower on the held-out topics at the training mix: 0 of 1 arms." in text
