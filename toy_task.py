"""The built-in toy task: 3-digit addition with a worked scratchpad, small enough for a laptop CPU.

Every training script defaults to it, every end-to-end test runs on it. It is a miniature of the
paper's setting, built from real Hugging Face parts loaded by the same code paths as a real run:

- a character-level fast tokenizer (`PreTrainedTokenizerFast`, pad/eos tokens, a chat template);
- a 0.64M-parameter Llama (`LlamaForCausalLM`) trained from scratch by supervised fine-tuning and
  saved with `save_pretrained`: the *starting policy*;
- prompts with train/validation/test splits and a `solution` column (`datasets.load_dataset("json", ...)`);
- offline preference data in TRL columns (`prompt, chosen, rejected` + scores), made the way the
  paper's offline data was: samples from *another* model, scored, best vs worst kept when the
  score gap is at least tau;
- two scorers with TRL's reward-function signature: `verify` (exact, 1 or 0: GRPO's verifiable
  reward) and `reward` (graded, in [0, 1]: the paper's reward model).

The task. Prompt `"123+789="`; the completion adds column by column from the right, each column
written `a+b+carry=sum` with a two-digit sum, then `>` and the 4-digit answer:

    123+789=3+9+0=12;2+8+1=11;1+7+1=09>0912<eos>

32 completion tokens, so sequence log-ratios accumulate over tens of tokens as for real LLM outputs.

Why the starting policy is *stably partial*: it is trained to convergence on demonstrations that
drop the carry (write `=02` instead of `=12`) with probability 0.6 whenever a column sums to 10-13.
It learns that mixture, so greedy decoding drops those carries (under half of the problems are right)
while sampling gets them right 40% of the time: there is headroom, and on-policy samples carry the
signal needed to fix it. The offline data come from two other models:

- `strong`: the starting policy fine-tuned on *differently* noised demonstrations (carries dropped
  less often, but answer digits miscopied from the scratchpad): decent data, off-policy errors;
- `weak`: a checkpoint of the starting policy's own SFT run stopped early (format mostly right,
  arithmetic poor): bad data, far from the policy.

Their average token log-probability under the starting policy (the paper's data-quality proxy,
stored per row as `chosen_ref_logp`/`rejected_ref_logp`) spans a range.

One canonical instance ships with the repository, in `toy/` next to this file: the starting policy
(`save_pretrained` files), the prompt splits, both offline datasets and their statistics, with
their SHA-256 digests in `toy/SHA256SUMS`. Every script loads it (`load()`, which checks the
digests), so every machine trains from the same bytes. Building it from scratch is deterministic on
one machine but not across CPUs: float32 rounding differs between SIMD code paths (AVX-512, AVX2,
NEON, plain), and 300 SFT steps plus sampling turn that into a different task. `build()` builds an
instance from a `ToyConfig` into a cache directory (the tests use it on a tiny configuration).

    python toy_task.py              # check the committed instance and print its statistics
    python toy_task.py --rebuild    # rebuild toy/ from scratch on this machine (1-2 minutes)
"""

import argparse
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass

import torch

BUILD_VERSION = 1  # bump when the build changes, so that old caches are not reused
INSTANCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy")  # the canonical instance, committed
VOCAB = ["<pad>", "<eos>", "<unk>"] + list("0123456789+=;>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


@dataclass(frozen=True)
class ToyConfig:
    seed: int = 0
    n_digits: int = 3
    # model
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 384
    # supervised warm start of the starting policy: noisy demonstrations (see `demonstration`)
    sft_steps: int = 300
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    drop_carry_prob: float = 0.6
    drop_carry_sums: tuple = (10, 13)  # columns whose sum lies in this range may drop the carry
    # the `strong` offline source: the policy fine-tuned on differently noised demonstrations
    strong_steps: int = 60
    strong_drop_carry_prob: float = 0.3
    strong_miscopy_prob: float = 0.3
    # the `weak` offline source: the policy's SFT run stopped at this step
    weak_step: int = 150
    # data
    n_train_prompts: int = 4096
    n_test_prompts: int = 256
    n_valid_prompts: int = 256  # for choosing hyperparameters; disjoint from train and test
    offline_prompts: tuple = (("strong", 4096), ("weak", 768))  # source -> prompts sampled
    num_samples: int = 4  # per prompt, best vs worst (UltraFeedback also has 4 per prompt)
    temperature: float = 1.0
    reward_threshold: float = 0.01

    def fingerprint(self) -> str:
        blob = json.dumps([BUILD_VERSION, dataclasses.asdict(self)], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


@dataclass(frozen=True)
class ToyPaths:
    root: str
    model: str  # starting policy (and its tokenizer): AutoModelForCausalLM.from_pretrained(model)
    prompts_train: str  # jsonl: prompt, solution
    prompts_test: str
    prompts_valid: str  # jsonl: prompt, solution (a validation split, disjoint from both)
    offline: dict  # source name -> jsonl: prompt, chosen, rejected, scores, ref log-probs
    sources: dict  # source name -> the model that sampled that data (built instances only; not shipped)
    stats: str  # json written at build time


# ---------------------------------------------------------------------------------------------
# The task: problems, demonstrations, scorers
# ---------------------------------------------------------------------------------------------


def make_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def parse_prompt(prompt: str) -> tuple[int, int]:
    if not isinstance(prompt, str):  # conversational: the user turn holds the problem
        prompt = "".join(m["content"] for m in prompt if m["role"] == "user")
    left, right = prompt.rstrip("=").split("+")
    return int(left), int(right)


def demonstration(
    a: int, b: int, n_digits: int = 3, rng=None, drop_carry_prob=0.0, miscopy_prob=0.0, drop_sums=(10, 13)
):
    """The worked completion for a + b. With an `rng`, the noisy demonstrations of the warm start:
    a column whose sum lies in `drop_sums` drops its carry with `drop_carry_prob` (and so does the answer, which
    stays consistent with the scratchpad); with `miscopy_prob` one answer digit is miscopied."""
    columns, digits, carry = [], [], 0
    for i in range(n_digits):
        x, y = (a // 10**i) % 10, (b // 10**i) % 10
        s = x + y + carry
        if rng is not None and drop_sums[0] <= s <= drop_sums[1] and rng.random() < drop_carry_prob:
            s -= 10
        columns.append(f"{x}+{y}+{carry}={s:02d}")
        digits.append(s % 10)
        carry = s // 10
    answer = [carry] + digits[::-1]
    if rng is not None and rng.random() < miscopy_prob:
        j = rng.randrange(len(answer))
        answer[j] = (answer[j] + rng.choice([1, 9])) % 10
    return ";".join(columns) + ">" + "".join(map(str, answer))


def _completion_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m["role"] == "assistant")  # conversational


def score(prompt, completion) -> tuple[float, float]:
    """(graded score in [0, 1], exact 0/1) of one completion. The graded score is the mean of the
    fraction of scratchpad columns that are exactly right and the fraction of answer digits that
    are right (position by position); exact means the final answer equals a + b."""
    a, b = parse_prompt(prompt)
    text = _completion_text(completion).replace("<eos>", "")
    n_digits = max(len(str(a)), len(str(b)))
    truth = demonstration(a, b, n_digits)
    true_cols, true_answer = truth.split(">")
    true_cols = true_cols.split(";")
    cols, _, answer = text.partition(">")
    cols = cols.split(";")
    col_score = sum(c == t for c, t in zip(cols, true_cols)) / len(true_cols)
    digit_score = sum(c == t for c, t in zip(answer, true_answer)) / len(true_answer)
    if len(answer) != len(true_answer):
        digit_score *= 0.5
    exact = float(answer.isdigit() and int(answer) == a + b)
    return 0.5 * col_score + 0.5 * digit_score, exact


def reward(prompts, completions, **columns) -> list[float]:
    """Graded reward (TRL reward-function signature): plays the paper's reward model."""
    return [score(p, c)[0] for p, c in zip(prompts, completions)]


def verify(prompts, completions, **columns) -> list[float]:
    """Exact-answer verifier (TRL reward-function signature): 1.0 if the answer is a + b, else 0.0."""
    return [score(p, c)[1] for p, c in zip(prompts, completions)]


# ---------------------------------------------------------------------------------------------
# Building: tokenizer, models, data
# ---------------------------------------------------------------------------------------------


def misused(args):
    """(stop, message) for what would evaluate or train a model other than the toy's on this task by default: its
    data, its prompts, its reward (the scripts' defaults)."""
    toy = lambda v: v.split(":")[0] in ("toy", "toy_verify")  # noqa: E731  (the built-in data and scorers)
    evaluates, online = args.eval_prompts != "none", f"--reward_model {args.reward_model}"
    if hasattr(args, "reward_funcs"):  # GRPO trains online on its reward funcs (unset: the toy's, as it fills them)
        online = "--reward_funcs " + (args.reward_funcs or ("toy" if args.pairs_from_samples else "toy_verify"))
    bring = f"(the toy task's) with --model_name_or_path {args.model_name_or_path}: give your own"
    return [
        (toy(args.dataset), f"--dataset {args.dataset} {bring} data to train on"),
        (evaluates and toy(args.eval_prompts), f"--eval_prompts {args.eval_prompts} {bring} held-out prompts, or none"),
        (evaluates and toy(args.reward_model), f"--reward_model {args.reward_model} {bring} evaluation scorer"),
        (args.online and any(map(toy, online.split()[1].split(","))), f"{online} {bring} reward to train on"),
    ]


def data_file(toy, name, kind):
    """The file a built-in data name reads: for training (kind 'preferences', 'examples') toy (= toy:strong) and
    toy:weak, the pairs each source's samples made, online (kind 'prompts') the training prompts; held out (kind
    'eval') toy (= toy:test) and toy:valid."""
    source = name.partition(":")[2]
    if kind == "eval":
        files = {"": toy.prompts_test, "test": toy.prompts_test, "valid": toy.prompts_valid}
        if source not in files:
            raise SystemExit(f"{name}: the toy's held-out prompts are toy (its test split) and toy:valid")
    else:
        files = {"": toy.offline["strong"]} | toy.offline
        files = {s: toy.prompts_train if kind == "prompts" else path for s, path in files.items()}
        if source not in files:
            raise SystemExit(f"{name}: the toy datasets are toy (= toy:strong) and toy:weak")
    return files[source]


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    # special tokens first, then one token per character
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[a-z]+>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.add_special_tokens({"pad_token": "<pad>", "eos_token": "<eos>", "unk_token": "<unk>"})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_model(cfg: ToyConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    seq_len = 2 * (cfg.n_digits + 1) + 11 * cfg.n_digits  # prompt + completion + eos, with room
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=2 ** math.ceil(math.log2(seq_len)),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def _random_operands(rng, n_digits):
    lo, hi = 10 ** (n_digits - 1), 10**n_digits - 1
    return rng.randint(lo, hi), rng.randint(lo, hi)


def _sft_batch(rng, cfg, tokenizer, drop_carry_prob, miscopy_prob):
    prompts, completions = [], []
    for _ in range(cfg.sft_batch_size):
        a, b = _random_operands(rng, cfg.n_digits)
        prompts.append(make_prompt(a, b))
        completions.append(demonstration(a, b, cfg.n_digits, rng, drop_carry_prob, miscopy_prob, cfg.drop_carry_sums))
    # every toy sequence has the same length, so no padding is needed
    ids = torch.tensor([tokenizer(p + c + tokenizer.eos_token)["input_ids"] for p, c in zip(prompts, completions)])
    labels = ids.clone()
    labels[:, : len(prompts[0])] = -100  # loss on the completion only
    return ids, labels


def _sft(model, cfg, tokenizer, steps, lr, rng, drop_carry_prob, miscopy_prob, on_step=None):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )
    model.train()
    for step in range(steps):
        ids, labels = _sft_batch(rng, cfg, tokenizer, drop_carry_prob, miscopy_prob)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step(step + 1)
    model.eval()
    return model


@torch.no_grad()
def generate(model, tokenizer, prompts, num_samples=1, temperature=1.0, max_new_tokens=40, batch_size=512, seed=0):
    """Completions for each prompt (grouped: prompt 0's samples first), with the KV cache, in batches.
    temperature 0 is greedy decoding."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    flat = [p for p in prompts for _ in range(num_samples)]
    out = []
    for i in range(0, len(flat), batch_size):
        enc = tokenizer(flat[i : i + batch_size], return_tensors="pt", padding=True)
        kw = (
            dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            if temperature > 0
            else dict(do_sample=False)
        )
        seqs = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            cache_implementation="static",
            **kw,
        )
        out += tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    torch.random.set_rng_state(generator_state)
    return out


@torch.no_grad()
def mean_token_logps(model, tokenizer, prompts, completions, batch_size=1024):
    """Average log-probability per completion token (eos included) under `model`."""
    out = []
    for i in range(0, len(prompts), batch_size):
        p_ids = [tokenizer(p)["input_ids"] for p in prompts[i : i + batch_size]]
        c_ids = [tokenizer(c + tokenizer.eos_token)["input_ids"] for c in completions[i : i + batch_size]]
        seqs = [p + c for p, c in zip(p_ids, c_ids)]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
        mask = torch.zeros(len(seqs), width)
        for j, (p, s) in enumerate(zip(p_ids, seqs)):
            ids[j, : len(s)] = torch.tensor(s)
            mask[j, len(p) : len(s)] = 1
        logits = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long()).logits[:, :-1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        m = mask[:, 1:]
        out += ((logps * m).sum(1) / m.sum(1)).tolist()
    return out


def accuracy(model, tokenizer, prompts):
    """Greedy exact-match accuracy and mean graded reward on `prompts`."""
    completions = generate(model, tokenizer, prompts, temperature=0.0)
    return sum(verify(prompts, completions)) / len(prompts), sum(reward(prompts, completions)) / len(prompts)


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _preference_pairs(model, tokenizer, policy, prompts, cfg, seed):
    """Best vs worst of `num_samples` samples of `model` per prompt, kept when the gap >= tau."""
    samples = generate(model, tokenizer, prompts, cfg.num_samples, cfg.temperature, seed=seed)
    scores = reward([p for p in prompts for _ in range(cfg.num_samples)], samples)
    rows = []
    for i, p in enumerate(prompts):
        group = [
            (s, c)
            for s, c in zip(scores[i * cfg.num_samples : (i + 1) * cfg.num_samples], samples[i * cfg.num_samples :])
            if c.strip()
        ]  # an empty completion is not a valid training example
        if len(group) < 2:
            continue
        best, worst = max(group, key=lambda t: t[0]), min(group, key=lambda t: t[0])
        if best[0] - worst[0] >= cfg.reward_threshold:
            rows.append(
                dict(prompt=p, chosen=best[1], rejected=worst[1], score_chosen=best[0], score_rejected=worst[0])
            )
    ps = [r["prompt"] for r in rows]
    for key in ("chosen", "rejected"):  # the data-quality proxy: mean token log-prob under the start
        for r, lp in zip(rows, mean_token_logps(policy, tokenizer, ps, [r[key] for r in rows])):
            r[f"{key}_ref_logp"] = round(lp, 5)
    return rows, len(prompts)


def _build(root, cfg: ToyConfig, log):
    t0 = time.time()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tokenizer = make_tokenizer()

    # prompts: disjoint train / test splits
    seen, problems = set(), []
    while len(problems) < cfg.n_train_prompts + cfg.n_test_prompts:
        ab = _random_operands(rng, cfg.n_digits)
        if ab not in seen:
            seen.add(ab)
            problems.append(ab)
    split = {"test": problems[: cfg.n_test_prompts], "train": problems[cfg.n_test_prompts :]}
    for name, probs in split.items():
        _write_jsonl(
            os.path.join(root, f"prompts_{name}.jsonl"),
            [dict(prompt=make_prompt(a, b), solution=str(a + b)) for a, b in probs],
        )
    # the validation split from its own random stream, so that the splits and everything after them are unchanged
    valid_rng, split["valid"] = random.Random(f"valid-{cfg.seed}"), []
    while len(split["valid"]) < cfg.n_valid_prompts:
        ab = _random_operands(valid_rng, cfg.n_digits)
        if ab not in seen:
            seen.add(ab)
            split["valid"].append(ab)
    _write_jsonl(
        os.path.join(root, "prompts_valid.jsonl"),
        [dict(prompt=make_prompt(a, b), solution=str(a + b)) for a, b in split["valid"]],
    )
    test_prompts = [make_prompt(a, b) for a, b in split["test"]]

    # the starting policy, and the early checkpoint of the same run that is the `weak` source
    policy = make_model(cfg, tokenizer)
    weak = {}

    def snapshot(step):
        if step == cfg.weak_step:
            weak["state"] = {k: v.clone() for k, v in policy.state_dict().items()}

    _sft(policy, cfg, tokenizer, cfg.sft_steps, cfg.sft_lr, rng, cfg.drop_carry_prob, 0.0, on_step=snapshot)
    log(f"warm start: {cfg.sft_steps} SFT steps in {time.time() - t0:.1f}s")
    model_dir = os.path.join(root, "model")
    policy.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    # the `strong` source: the policy fine-tuned on differently noised demonstrations
    strong = make_model(cfg, tokenizer)
    strong.load_state_dict(policy.state_dict())
    _sft(
        strong,
        cfg,
        tokenizer,
        cfg.strong_steps,
        cfg.sft_lr / 3,
        rng,
        cfg.strong_drop_carry_prob,
        cfg.strong_miscopy_prob,
    )
    weak_model = make_model(cfg, tokenizer)
    weak_model.load_state_dict(weak["state"])
    weak_model.eval()

    stats = {"config": dataclasses.asdict(cfg), "params": sum(p.numel() for p in policy.parameters())}
    for name, model in (("policy", policy), ("strong", strong), ("weak", weak_model)):
        acc, rew = accuracy(model, tokenizer, test_prompts)
        stats[f"{name}/test_accuracy"], stats[f"{name}/test_reward"] = acc, rew
    sources = {"strong": strong, "weak": weak_model}
    for name, model in sources.items():
        model.save_pretrained(os.path.join(root, f"source_{name}"))
    for i, (name, n_prompts) in enumerate(cfg.offline_prompts):
        offline_prompts = [make_prompt(a, b) for a, b in split["train"][:n_prompts]]
        rows, n = _preference_pairs(sources[name], tokenizer, policy, offline_prompts, cfg, seed=cfg.seed + 1 + i)
        _write_jsonl(os.path.join(root, f"offline_{name}.jsonl"), rows)
        mean = lambda k: sum(r[k] for r in rows) / max(1, len(rows))  # noqa: E731
        stats[f"offline_{name}"] = dict(
            pairs=len(rows),
            kept_frac=len(rows) / n,
            score_chosen=mean("score_chosen"),
            score_rejected=mean("score_rejected"),
            chosen_ref_logp=mean("chosen_ref_logp"),
            rejected_ref_logp=mean("rejected_ref_logp"),
        )
        log(f"offline data `{name}`: {len(rows)} pairs ({time.time() - t0:.1f}s)")
    log(f"built in {time.time() - t0:.1f}s")
    with open(os.path.join(root, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)


def _paths(root) -> ToyPaths:
    return ToyPaths(
        root=root,
        model=os.path.join(root, "model"),
        prompts_train=os.path.join(root, "prompts_train.jsonl"),
        prompts_test=os.path.join(root, "prompts_test.jsonl"),
        prompts_valid=os.path.join(root, "prompts_valid.jsonl"),
        offline={n: os.path.join(root, f"offline_{n}.jsonl") for n in ("strong", "weak")},
        sources={n: os.path.join(root, f"source_{n}") for n in ("strong", "weak")},
        stats=os.path.join(root, "stats.json"),
    )


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_sums(root) -> dict:
    """relative path -> SHA-256 digest, from `root/SHA256SUMS` (the format `sha256sum -c` reads)."""
    with open(os.path.join(root, "SHA256SUMS")) as f:
        return {name: digest for digest, name in (line.split(maxsplit=1) for line in f.read().splitlines() if line)}


def load(root=INSTANCE_DIR) -> ToyPaths:
    """The canonical toy instance that ships with the repository, every file checked against its digest."""
    fix = "restore it with `git checkout -- toy`, or rebuild it with `python toy_task.py --rebuild`"
    if not os.path.exists(os.path.join(root, "SHA256SUMS")):
        raise SystemExit(f"{root}/SHA256SUMS is missing: {fix}")
    changed = [
        n
        for n, d in read_sums(root).items()
        if not os.path.exists(os.path.join(root, n)) or sha256(os.path.join(root, n)) != d
    ]
    if changed:
        raise SystemExit(f"{root}: {', '.join(changed)} missing or not matching SHA256SUMS: {fix}")
    return _paths(root)


def cached(cache_dir, config: ToyConfig) -> ToyPaths:
    """Where `build(cache_dir, config)` puts (or has put) that instance, without building it."""
    return _paths(os.path.join(cache_dir, f"seed{config.seed}-{config.fingerprint()}"))


def build(cache_dir=None, config: ToyConfig = ToyConfig(), verbose=True) -> ToyPaths:
    """Build an instance from `config` into `cache_dir` if it is not there yet, and return its paths.
    Safe to call from several processes at once; a build that died halfway is never used."""
    cache_dir = (
        cache_dir
        or os.environ.get("HUMANLINE_TOY_CACHE")
        or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "toy_task")
    )
    paths = cached(cache_dir, config)
    root = paths.root
    complete = os.path.join(root, "COMPLETE")
    if os.path.exists(complete):
        return paths
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait and then reuse its result
        if os.path.exists(complete):
            return paths
        log = print if verbose else (lambda *a: None)
        log(f"building the toy task into {root} (about a minute on 2 CPU cores)")
        tmp = f"{root}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        n_threads = torch.get_num_threads()
        try:
            _build(tmp, config, log)
            open(os.path.join(tmp, "COMPLETE"), "w").close()
            shutil.rmtree(root, ignore_errors=True)  # a half-written directory from an older layout
            os.rename(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            torch.set_num_threads(n_threads)
    return paths


def rebuild(config: ToyConfig = ToyConfig(), root=INSTANCE_DIR, verbose=True) -> bool:
    """Build `config` from scratch and install it as the instance in `root` (the source models, not
    needed to train, are left out), with a fresh SHA256SUMS. True if it equals what was there."""
    before = read_sums(root) if os.path.exists(os.path.join(root, "SHA256SUMS")) else {}
    with tempfile.TemporaryDirectory() as cache:
        built = build(cache, config, verbose)
        tmp = root + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(built.model, os.path.join(tmp, "model"))
        names = ["model/" + n for n in sorted(os.listdir(built.model))]
        for path in (
            built.prompts_train,
            built.prompts_test,
            built.prompts_valid,
            *built.offline.values(),
            built.stats,
        ):
            shutil.copy(path, tmp)
            names.append(os.path.basename(path))
        with open(os.path.join(tmp, "SHA256SUMS"), "w") as f:
            f.writelines(f"{sha256(os.path.join(tmp, n))}  {n}\n" for n in names)
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)
    after = read_sums(root)
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if verbose:
        print(
            f"{root}: "
            + (
                "installed (there was none)"
                if not before
                else "identical to the instance that was there"
                if not changed
                else f"{len(changed)} of {len(after)} files differ from the instance that was there "
                f"({', '.join(changed)}). Expected on a CPU with other SIMD code paths than the one that built it: "
                "every figure in the README was "
                "measured on the committed instance, which `git checkout -- toy` restores"
            )
        )
    return not changed


def main():
    parser = argparse.ArgumentParser(
        description="The built-in toy task: check the committed instance and print its statistics."
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="rebuild toy/ from scratch on this machine (1-2 minutes on 2 CPU cores)"
    )
    if parser.parse_args().rebuild:
        rebuild()
    paths = load()
    with open(paths.stats) as f:
        s = json.load(f)
    print(f"toy task at {paths.root} (every file matches SHA256SUMS)")
    print(f"  model: {s['params']:,} parameters")
    for name in ("policy", "strong", "weak"):
        print(
            f"  {name:7s} greedy test accuracy {s[f'{name}/test_accuracy']:.3f}, reward {s[f'{name}/test_reward']:.3f}"
        )
    for name in ("strong", "weak"):
        o = s[f"offline_{name}"]
        print(
            f"  offline `{name}`: {o['pairs']} pairs ({o['kept_frac']:.0%} kept), score chosen {o['score_chosen']:.3f} "
            f"rejected {o['score_rejected']:.3f}, mean token log-prob under the start policy: "
            f"chosen {o['chosen_ref_logp']:.3f} rejected {o['rejected_ref_logp']:.3f}"
        )


if __name__ == "__main__":
    main()
