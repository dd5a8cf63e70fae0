"""The built-in toy task: scorers, the committed instance (the same on every CPU), the from-scratch build
(determinism, caching, provenance of the offline data)."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys

import datasets
import pytest
import torch
import warm
from paths import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

import toy_task

TINY = dataclasses.replace(
    toy_task.ToyConfig(),
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    sft_steps=4,
    sft_batch_size=8,
    strong_steps=2,
    weak_step=2,
    n_train_prompts=40,
    n_test_prompts=8,
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
    valid = datasets.load_dataset("json", data_files=toy.prompts_valid, split="train")
    assert len(valid) == 256 and valid.column_names == ["prompt", "solution"]
    assert not set(train["prompt"]) & set(prompts["prompt"]) and not set(valid["prompt"]) & (
        set(train["prompt"]) | set(prompts["prompt"])
    )
    # the loaded policy generates well-formed completions that the scorer can read
    out = toy_task.generate(model, tok, prompts["prompt"][:32], temperature=0.0)
    assert sum(toy_task.reward(prompts["prompt"][:32], out)) / 32 > 0.4


def test_warm_start_leaves_headroom(toy):
    stats = json.load(open(toy.stats))
    assert 0.25 < stats["policy/test_accuracy"] < 0.55  # stably partial: alignment has room to improve
    assert stats["strong/test_accuracy"] > stats["policy/test_accuracy"] + 0.1 > stats["weak/test_accuracy"] + 0.2
    assert stats["offline_strong"]["chosen_ref_logp"] > stats["offline_weak"]["chosen_ref_logp"] + 0.2


def test_offline_data_comes_from_another_model(toy):
    """The stored proxy is the data's log-prob under the starting policy, and the data is off-policy: the
    policy's own best-vs-worst of 4 samples on the same prompts are more likely under it than the pairs the
    other models made (strong: -0.22 against -0.15 per token; weak: -0.76). That the sources are other
    models is checked on a built instance, which keeps them (test_a_built_instance_has_its_sources)."""
    tok = AutoTokenizer.from_pretrained(toy.model)
    policy = AutoModelForCausalLM.from_pretrained(toy.model).eval()
    for name, margin in (("strong", 0.03), ("weak", 0.3)):
        rows = [json.loads(line) for line in open(toy.offline[name])][:256]
        prompts = [r["prompt"] for r in rows]
        under_policy = toy_task.mean_token_logps(policy, tok, prompts, [r["chosen"] for r in rows])
        assert under_policy == pytest.approx([r["chosen_ref_logp"] for r in rows], abs=1e-4)
        data = sum(r["chosen_ref_logp"] + r["rejected_ref_logp"] for r in rows) / (2 * len(rows))
        flat = [p for p in prompts for _ in range(4)]
        own = toy_task.generate(policy, tok, prompts, num_samples=4, temperature=1.0, seed=1)
        scores, logps = toy_task.reward(flat, own), toy_task.mean_token_logps(policy, tok, flat, own)
        groups = [sorted(zip(scores[i : i + 4], logps[i : i + 4])) for i in range(0, len(flat), 4)]
        own_pairs = sum(g[0][1] + g[-1][1] for g in groups) / (2 * len(groups))
        assert data < own_pairs - margin, (name, data, own_pairs)


def test_a_built_instance_has_its_sources(tmp_path):
    paths = toy_task.build(str(tmp_path), TINY, verbose=False)
    policy = AutoModelForCausalLM.from_pretrained(paths.model)
    for name in ("strong", "weak"):
        source = AutoModelForCausalLM.from_pretrained(paths.sources[name])
        assert all(not torch.equal(a, b) for a, b in zip(source.parameters(), policy.parameters()))
        assert os.path.getsize(paths.offline[name]) > 0


# --- the canonical instance ----------------------------------------------------------------------

PROBE = """
import hashlib, json, torch, toy_task
from transformers import AutoModelForCausalLM, AutoTokenizer
paths = toy_task.load()
model = AutoModelForCausalLM.from_pretrained(paths.model).eval()
tok = AutoTokenizer.from_pretrained(paths.model)
prompts = [json.loads(line)["prompt"] for line in open(paths.prompts_test)]
accuracy, reward = toy_task.accuracy(model, tok, prompts)
print(json.dumps(dict(
    capability=torch.backends.cpu.get_cpu_capability(),
    weights=hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values())).hexdigest(),
    accuracy=accuracy, reward=reward)))
"""


def probe(capability):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_canonical_instance_is_the_same_on_every_cpu():
    """The committed instance is what every machine trains from: its files match the committed digests, and
    under torch's plain code path and under this CPU's best one the weights load to the same values and the
    starting policy's greedy evaluation is the one in stats.json (and the README)."""
    committed = toy_task.read_sums(toy_task.INSTANCE_DIR)
    assert len(committed) == 12 and "model/model.safetensors" in committed and "prompts_valid.jsonl" in committed
    assert {n: toy_task.sha256(os.path.join(toy_task.INSTANCE_DIR, n)) for n in committed} == committed
    plain, best = probe("default"), probe(None)
    assert plain["capability"] == "DEFAULT" and best["capability"] != ""  # each variable took effect
    assert best["weights"] == plain["weights"]
    stats = json.load(open(os.path.join(toy_task.INSTANCE_DIR, "stats.json")))
    for run in (plain, best):  # greedy decoding is where float32 differences between code paths would show
        assert (run["accuracy"], run["reward"]) == (stats["policy/test_accuracy"], stats["policy/test_reward"])


def test_a_changed_or_missing_file_is_refused(tmp_path):
    root = str(tmp_path / "toy")
    shutil.copytree(toy_task.INSTANCE_DIR, root)
    assert toy_task.load(root).model == os.path.join(root, "model")
    with open(os.path.join(root, "offline_weak.jsonl"), "a") as f:
        f.write("\n")
    with pytest.raises(SystemExit, match="offline_weak.jsonl missing or not matching SHA256SUMS"):
        toy_task.load(root)
    os.remove(os.path.join(root, "SHA256SUMS"))
    with pytest.raises(SystemExit, match="SHA256SUMS is missing"):
        toy_task.load(root)


def test_rebuild_installs_an_instance_with_its_digests(tmp_path):
    root = str(tmp_path / "toy")
    assert toy_task.rebuild(TINY, root, verbose=False) is False  # nothing was there
    sums = toy_task.read_sums(root)
    assert set(sums) == set(toy_task.read_sums(toy_task.INSTANCE_DIR))  # the same files as the committed instance
    assert toy_task.load(root).root == root
    assert toy_task.rebuild(TINY, root, verbose=False) is True  # deterministic on one machine


@pytest.mark.parametrize("script", ["dpo_humanline.py", "kto_humanline.py", "grpo_humanline.py"])
def test_every_script_evaluates_the_starting_policy_at_step_0(script, toy, tmp_path):
    """metrics.jsonl starts where training starts: a step-0 evaluation of the starting policy, equal to
    scoring its greedy completions directly."""
    out = tmp_path / "run"
    proc = warm.run(
        [
            sys.executable,
            script,
            "--max_steps",
            "1",
            "--batch_size",
            "4",
            "--micro_batch_size",
            "4",
            "--eval_every",
            "1",
            "--num_eval_prompts",
            "8",
            "--output_dir",
            str(out),
            "--save_every",
            "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert records[0]["step"] == 0 and "loss" not in records[0]
    assert [r["step"] for r in records if "eval/reward" in r] == [0, 1]
    prompts = [json.loads(line)["prompt"] for line in open(toy.prompts_test)][:8]
    accuracy, reward = toy_task.accuracy(
        AutoModelForCausalLM.from_pretrained(toy.model).eval(), AutoTokenizer.from_pretrained(toy.model), prompts
    )
    assert records[0]["eval/reward"] == pytest.approx(reward, abs=1e-9)
    assert records[0]["eval/accuracy"] == pytest.approx(accuracy, abs=1e-9)
