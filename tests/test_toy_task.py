"""The built-in toy task: scorers, determinism, round trips, provenance of the offline data, caching."""

import dataclasses
import hashlib
import json
import os

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import toy_task

TINY = dataclasses.replace(
    toy_task.ToyConfig(), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, sft_steps=4,
    sft_batch_size=8, strong_steps=2, weak_step=2, n_train_prompts=40, n_test_prompts=8,
    offline_prompts=(("strong", 12), ("weak", 8)),
)


def file_hashes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name != "stats.json":  # holds the build time
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


# --- scorers on hand-written cases -------------------------------------------------------------


def test_demonstration_is_the_worked_sum():
    assert toy_task.demonstration(123, 789) == "3+9+0=12;2+8+1=11;1+7+1=09>0912"
    assert toy_task.demonstration(456, 321) == "6+1+0=07;5+2+0=07;4+3+0=07>0777"


def test_scorers_on_hand_written_completions():
    p = "123+789="
    right = "3+9+0=12;2+8+1=11;1+7+1=09>0912"
    # first carry dropped: column 1 wrong, column 2 wrong (wrong carry-in), column 3 right; answer 0902
    dropped = "3+9+0=02;2+8+0=10;1+7+1=09>0902"
    assert toy_task.score(p, right) == (1.0, 1.0)
    graded, exact = toy_task.score(p, dropped)
    assert exact == 0.0
    assert graded == pytest.approx(0.5 * 1 / 3 + 0.5 * 3 / 4)
    assert toy_task.score(p, "3+9+0=12;2+8+1=11;1+7+1=09>912") == (pytest.approx(0.5 + 0.5 * 0.5 * 0 / 4), 1.0)
    assert toy_task.score(p, "garbage") == (0.0, 0.0)
    assert toy_task.score(p, "") == (0.0, 0.0)
    # TRL signatures, plain and conversational, extra columns ignored
    conv_p = [{"role": "user", "content": p}]
    conv_c = [{"role": "assistant", "content": right}]
    assert toy_task.reward([p, p], [right, dropped], solution=["912", "912"]) == [1.0, graded]
    assert toy_task.verify([conv_p], [conv_c]) == [1.0]


def test_tokenizer_is_character_level_with_special_tokens():
    tok = toy_task.make_tokenizer()
    ids = tok("12+3=1<eos>")["input_ids"]
    assert len(ids) == 7 and ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "12+3=1"
    assert tok.pad_token_id != tok.eos_token_id
    chat = [{"role": "user", "content": "12+3="}, {"role": "assistant", "content": "1"}]
    assert tok.apply_chat_template(chat, tokenize=False) == "12+3=1<eos>"


# --- building --------------------------------------------------------------------------------


def test_build_is_deterministic(tmp_path):
    a = toy_task.build(str(tmp_path / "a"), TINY, verbose=False)
    b = toy_task.build(str(tmp_path / "b"), TINY, verbose=False)
    ha, hb = file_hashes(a.root), file_hashes(b.root)
    assert "model/model.safetensors" in ha and "offline_strong.jsonl" in ha
    assert ha == hb


def test_half_written_cache_is_rebuilt(tmp_path):
    paths = toy_task.build(str(tmp_path), TINY, verbose=False)
    reference = file_hashes(paths.root)
    # a crash halfway: the directory is there but incomplete and unmarked, plus a stale temp dir
    os.remove(os.path.join(paths.root, "COMPLETE"))
    os.remove(paths.offline["weak"])
    with open(paths.offline["strong"], "w") as f:
        f.write('{"prompt": "1+')
    os.makedirs(paths.root + ".tmp-99999")
    again = toy_task.build(str(tmp_path), TINY, verbose=False)
    assert os.path.exists(os.path.join(again.root, "COMPLETE"))
    assert file_hashes(again.root) == reference


def test_round_trip_through_from_pretrained_and_load_dataset(toy):
    tok = AutoTokenizer.from_pretrained(toy.model)
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    assert model.config.model_type == "llama"
    assert 0.4e6 < sum(p.numel() for p in model.parameters()) < 1.5e6
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>" and tok.chat_template
    prefs = datasets.load_dataset("json", data_files=toy.offline["strong"], split="train")
    assert {"prompt", "chosen", "rejected", "score_chosen", "score_rejected"} <= set(prefs.column_names)
    assert len(prefs) > 2000
    assert all(c >= r + 0.01 for c, r in zip(prefs["score_chosen"], prefs["score_rejected"]))
    prompts = datasets.load_dataset("json", data_files=toy.prompts_test, split="train")
    assert prompts.column_names == ["prompt", "solution"]
    train = datasets.load_dataset("json", data_files=toy.prompts_train, split="train")
    assert not set(train["prompt"]) & set(prompts["prompt"])
    # the loaded policy generates well-formed completions that the scorer can read
    out = toy_task.generate(model, tok, prompts["prompt"][:32], temperature=0.0)
    assert sum(toy_task.reward(prompts["prompt"][:32], out)) / 32 > 0.4


def test_warm_start_leaves_headroom(toy):
    stats = json.load(open(toy.stats))
    assert 0.15 < stats["policy/test_accuracy"] < 0.6  # stably partial: alignment has room to improve
    assert stats["strong/test_accuracy"] > stats["policy/test_accuracy"] > stats["weak/test_accuracy"]
    assert stats["offline_strong"]["chosen_ref_logp"] > stats["offline_weak"]["chosen_ref_logp"]


def test_offline_data_comes_from_another_model(toy):
    tok = AutoTokenizer.from_pretrained(toy.model)
    policy = AutoModelForCausalLM.from_pretrained(toy.model).eval()
    rows = [json.loads(line) for line in open(toy.offline["strong"])][:256]
    prompts, chosen = [r["prompt"] for r in rows], [r["chosen"] for r in rows]
    under_policy = toy_task.mean_token_logps(policy, tok, prompts, chosen)
    assert under_policy == pytest.approx([r["chosen_ref_logp"] for r in rows], abs=1e-4)
    for name in ("strong", "weak"):
        source = AutoModelForCausalLM.from_pretrained(toy.sources[name]).eval()
        differs = [not torch.equal(a, b) for a, b in zip(source.parameters(), policy.parameters())]
        assert all(differs)
        rows = [json.loads(line) for line in open(toy.offline[name])][:256]
        ps, cs = [r["prompt"] for r in rows], [r["chosen"] for r in rows]
        # the data is more likely under the model that sampled it than under the starting policy
        gap = sum(toy_task.mean_token_logps(source, tok, ps, cs)) - sum(toy_task.mean_token_logps(policy, tok, ps, cs))
        assert gap / len(rows) > 0.02
