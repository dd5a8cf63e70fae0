"""Offline, online and humanline GRPO in one file.

Humanline (Liu, Muennighoff, Ethayarajh 2025, https://arxiv.org/abs/2509.24207) makes two changes
to an alignment objective so that offline data trains like online data:

1. syncing: every `--sync_every` k steps, after the gradients are computed and clipped but before
   `optimizer.step()`, the policy's weights are copied into the reference (so with k = 1 the
   reference is always the policy of the previous step);
2. clipping: each token's log-ratio log pi_theta - log pi_ref is clamped to
   [`--log_eps_P`, `--log_eps_R`] = [-1.5, 1.5] before it enters the loss (no gradient outside).
   GRPO then clips the (already clamped) ratio a second time with its own [1 - eps, 1 + eps].

`grep -n HUMANLINE grpo_humanline.py` shows every line that exists because of them.

The loss (eq. 1, appendix C.1), per completion token t of output i of a group:
    -min(r * A_i, clip(r, 1 - eps, 1 + eps) * A_i) + beta * KL_t,
    r = pi_theta / pi_ref (clamped in log space under humanline),  A_i = (R_i - mean R) / std R,
    KL_t = exp(q - p) - (q - p) - 1  (k3; p = policy, q = baseline log-prob; never clamped),
averaged over all completion tokens of the optimizer step (DAPO), over micro-batches and processes.

Modes
- `--offline` (default): the paper's Algorithm 2. Each preference tuple (prompt, chosen, rejected) is a
  group of two with advantages +1 / -1; the reference is frozen at the initial policy; eps 0.5.
- `--online`: groups of `--num_generations` G completions per prompt, sampled from the policy and scored
  by `--reward_funcs`. Every `--sample_every` N steps the policy samples the data of the next N steps
  (N times as many prompts): N = 1 is fully on-policy, N = 64 is the paper's off-policy math setting.
  The ratio's denominator is the policy that sampled the data (PPO's theta_old: its token log-probs,
  recorded right after sampling) or, under `--sync`, the synced reference.
- `--online --pairs_from_samples`: the paper's instruction-following variant. In rounds of
  `--round_size` prompts (like online DPO, Algorithm 1) keep the (best, worst) of G samples with their
  raw scores when the gap is at least `--reward_threshold`: groups of two.
- `--humanline` on top of any of them (= `--sync humanline --clip clamp`). Ablations: `--sync
  trust_region` (copy *after* the optimizer step), `--clip sampling` (Beta-based token rejection,
  humanline_sampling.py), or either change alone.

Memory and speed
- Reference-free humanline, k = 1 (`--ref_free auto`: on with `--offline --sync humanline --sync_every 1`;
  online the next batch is sampled after the update, too late): no reference model. Syncing before each update
  makes the reference of step t + 1 the policy as it is during step t, so at the start of step t the policy
  computes its log-probs of step t + 1's batch, and no copy is kept; at step 0 the reference is the policy itself.
  The same losses as two models synced in place (`--ref_free off`), with one model's memory, no copy and the same
  forwards. After a step skipped for a non-finite loss (no update, no sync) the reference is the unchanged policy,
  where two models would keep the one before it.
- `--precompute_ref` (offline, `--sync none`): the frozen reference is the initial policy, so its log-probs of
  every training sequence are computed once before training (grouped by length) and no reference model is kept.
- Each micro-batch is padded to its own longest sequence; generation uses the KV cache, `--generation_batch_size`
  prompts per call. `experiments/bench.py` measures what each variant costs per step.

Deviations from the paper
- Defaults are for the built-in toy task (toy_task.py: a 0.6M-parameter Llama on 3-digit addition,
  trained on a laptop CPU in minutes), so the learning rate is much larger than the paper's.
  The paper's settings are in the commands below.
- Training length is set in optimizer steps (`--max_steps`); offline data is cycled if needed and
  online data is sampled until the step budget is spent. Sampled sequences that do not fill a whole
  batch are dropped. Each sampled batch is used for one optimizer step (no PPO epochs).
- The KL baseline is the reference (the paper's choice, no third model). Online without syncing the
  reference is the sampler, so a fully on-policy run (`--sample_every 1`) has a KL term of exactly 0;
  `--kl_baseline initial` keeps a frozen copy of the starting policy instead (DeepSeekMath, TRL).
- Online with `--sync humanline` the reference is only synced every k steps, not also at sampling time.
- `--eps` defaults to 0.5 for plain offline GRPO (no syncing, no clipping) and to 0.15 otherwise.
- Groups whose rewards are all equal get advantage 0 (no DAPO dynamic sampling); their tokens still
  count in the normalisation and in the KL term.
- Sampled completions are decoded and re-tokenised with an end-of-sequence token (a completion cut at
  `--max_new_tokens` is trained as if it had ended). The sampler's log-probs are computed on the
  re-tokenised sequences, so the ratio is exact on what is trained.
- `accuracy` is a light answer normaliser, not Open-R1's math_verify (see `accuracy_reward`).

Commands
    python grpo_humanline.py                                 # offline GRPO on the toy task (CPU)
    python grpo_humanline.py --offline --humanline           # offline + humanline
    python grpo_humanline.py --online                        # online GRPO, toy verifier reward
    python grpo_humanline.py --online --humanline --sample_every 8 --sync_every 2   # off-policy
    torchrun --standalone --nproc_per_node 2 grpo_humanline.py --humanline   # FSDP2, gloo on CPU
    # the paper's math run (Qwen2.5-1.5B-Instruct, MATH, Open-R1 rewards; 8 GPUs; not run here):
    # off-policy humanline as below; plain online GRPO: drop --humanline, --sample_every 1
    torchrun --standalone --nproc_per_node 8 grpo_humanline.py --online --humanline \\
        --sample_every 64 --sync_every 16 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
        --dataset DigitalLearningGmbH/MATH-lighteval --dataset_split train --as_chat --system_prompt r1 \\
        --reward_funcs tag_count,format,accuracy --reward_weights 1,1,8 \\
        --eval_prompts HuggingFaceH4/MATH-500 --reward_model accuracy --num_eval_prompts 500 --eval_every 100 \\
        --learning_rate 1e-6 --adam_eps 1e-8 --weight_decay 0 --max_grad_norm 1.0 --beta 0.01 --eps 0.15 \\
        --batch_size 256 --micro_batch_size 4 --num_generations 8 --generation_batch_size 16 \\
        --max_new_tokens 2048 --top_p 1.0 --temperature 0.7 --max_length 2560 --max_steps 1600
    # the paper's instruction-following online+humanline GRPO (Llama3-8B-Instruct, UltraFeedback
    # prompts, ArmoRM scores; 8 GPUs; not run here; plain online: drop --humanline, --max_grad_norm 1.0)
    torchrun --standalone --nproc_per_node 8 grpo_humanline.py --online --pairs_from_samples --humanline \\
        --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct \\
        --dataset princeton-nlp/llama3-ultrafeedback-armorm --dataset_split train --as_chat \\
        --reward_funcs RLHFlow/ArmoRM-Llama3-8B-v0.1 --trust_remote_code --eval_prompts none \\
        --learning_rate 5e-6 --max_grad_norm 0.5 --beta 0.01 --eps 0.15 --sync_every 1 \\
        --batch_size 64 --micro_batch_size 2 --round_size 1024 --num_generations 8 --max_steps 312 \\
        --max_new_tokens 2048 --top_p 0.95 --temperature 0.7 --reward_threshold 0.01 --adam_eps 1e-5 \\
        --max_prompt_length 1024 --max_length 3072
"""

import importlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from fractions import Fraction
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, HfArgumentParser

import humanline_sampling
import toy_task


@dataclass
class Args:
    # --- mode ---
    offline: bool = field(default=False, metadata={"help": "Algorithm 2: a fixed preference dataset, each pair a group of two (the default mode)."})
    online: bool = field(default=False, metadata={"help": "Sample groups of --num_generations completions from the policy every --sample_every steps."})
    humanline: bool = field(default=False, metadata={"help": "Shorthand for --sync humanline --clip clamp."})
    pairs_from_samples: bool = field(default=False, metadata={
        "help": "With --online, the instruction-following variant: in rounds of --round_size prompts keep (best, worst) "
                "of the samples with their raw scores as a group of two, as online DPO pairs them."})
    # --- model and data ---
    model_name_or_path: str = field(default="toy", metadata={"help": "'toy' (the built-in task) or a causal LM."})
    dataset: str = field(default="toy", metadata={
        "help": "Offline: preference data (prompt, chosen, rejected): 'toy', 'toy:weak', a hub name or a local "
                "json/jsonl/parquet file. Online: prompt rows ('prompt' or 'problem', other columns such as 'solution' "
                "go to the reward functions; 'toy': the toy train prompts)."})
    dataset_split: str = field(default="train", metadata={"help": "Split of --dataset."})
    eval_prompts: str = field(default="toy", metadata={"help": "Held-out prompts for evaluation ('toy', a file or hub name, 'none')."})
    reward_model: str = field(default="toy", metadata={
        "help": "Scorer for evaluation: 'toy' (graded), 'toy_verify' (exact), a --reward_funcs name such as 'accuracy', "
                "a sequence-classification model path, or module:function (as in --reward_funcs)."})
    reward_funcs: str = field(default="", metadata={
        "help": "Online rewards, comma-separated: toy, toy_verify, tag_count, format, accuracy, a sequence-"
                "classification model path, or module:function (a Python reward function f(prompts, completions, "
                "**columns) -> floats, imported from the working directory or PYTHONPATH). Default: toy_verify (toy "
                "with --pairs_from_samples)."})
    reward_weights: str = field(default="", metadata={
        "help": "Comma-separated weights of --reward_funcs. Default: 1 each; tag_count, format, accuracy: 1, 1, 8."})
    as_chat: bool = field(default=False, metadata={"help": "Online and evaluation: wrap plain-string prompts as a user message (chat template)."})
    system_prompt: str = field(default="", metadata={"help": "With --as_chat, a system message first ('r1': Open-R1's <think>/<answer> prompt)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code from the hub."})
    on_bad_reward: str = field(default="drop", metadata={
        "help": "A sample whose reward is NaN, inf or None, or whose scorer raises: drop (the sample is left out, a sampled "
                "group with it; counted: online/bad_rewards, eval/bad_rewards) | stop (the run stops, naming the prompt)."})
    max_prompt_length: int = field(default=512, metadata={"help": "Longer prompts keep their last tokens (counted)."})
    max_length: int = field(default=1024, metadata={"help": "Prompt + completion; longer completions are cut (counted)."})
    precompute_ref: bool = field(default=False, metadata={
        "help": "Offline with a frozen reference (--sync none): compute the reference's log-probs of every training "
                "sequence once, before training (it is the initial policy), and keep no reference model in memory."})
    # --- optimisation ---
    max_steps: int = field(default=120, metadata={"help": "Optimizer steps."})
    batch_size: int = field(default=64, metadata={"help": "Sequences per optimizer step, over all processes, groups included (prompts = batch_size / group size)."})
    micro_batch_size: int = field(default=64, metadata={"help": "Sequences per forward pass per process."})
    learning_rate: float = field(default=5e-6, metadata={"help": "Peak learning rate (paper: 5e-6; math 1e-6)."})
    warmup_ratio: float = field(default=0.1, metadata={"help": "Linear warmup fraction, then linear decay to 0."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    adam_eps: float = field(default=1e-5, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    max_bad_steps: int = field(default=3, metadata={
        "help": "A step whose loss or gradient is not finite is skipped (no update, counted in bad_steps); this many "
                "in a row stop the run."})
    beta: float = field(default=0.01, metadata={"help": "KL coefficient (k3 estimator, against --kl_baseline)."})
    eps: Optional[float] = field(default=None, metadata={"help": "GRPO's ratio clip [1 - eps, 1 + eps]. Default: 0.5 plain offline, else 0.15."})
    kl_baseline: str = field(default="reference", metadata={
        "help": "Baseline of the KL term: reference (the ratio's denominator, the paper's choice) | initial (a frozen "
                "copy of the starting policy)."})
    seed: int = field(default=0, metadata={"help": "Random seed (data order, sampling)."})
    # --- humanline ---
    sync: str = field(default="none", metadata={"help": "Reference syncing: none | humanline (before the optimizer step) | trust_region (after it)."})
    sync_every: int = field(default=1, metadata={"help": "k: sync every k optimizer steps."})
    clip: str = field(default="none", metadata={"help": "Token log-ratio clipping: none | clamp | sampling (Beta rejection)."})
    log_eps_P: float = field(default=-1.5, metadata={"help": "Lower bound of the token log-ratio."})
    log_eps_R: float = field(default=1.5, metadata={"help": "Upper bound of the token log-ratio."})
    sampling_c: float = field(default=humanline_sampling.DEFAULT_C, metadata={"help": "--clip sampling: Beta concentration c (large c = clamp)."})
    ref_free: str = field(default="auto", metadata={
        "help": "Reference-free humanline, k = 1: no reference model; just before each update the policy computes the "
                "next step's reference log-probs (syncing would make it that step's reference). auto: on where it "
                "applies (--sync humanline --sync_every 1, offline) | on | off (two models, synced in place)."})
    # --- online sampling ---
    num_generations: int = field(default=8, metadata={"help": "G: completions sampled per prompt."})
    sample_every: int = field(default=1, metadata={
        "help": "Sample every N steps the data of N steps (1: fully on-policy; paper's off-policy math setting: 64)."})
    round_size: int = field(default=256, metadata={"help": "--pairs_from_samples: prompts per round (paper: 1024)."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling (paper: 0.95; math 1.0)."})
    max_new_tokens: int = field(default=40, metadata={"help": "Longest sampled completion (paper: 2048)."})
    reward_threshold: float = field(default=0.01, metadata={"help": "--pairs_from_samples: tau, keep a pair only if best - worst >= tau."})
    generation_batch_size: int = field(default=64, metadata={"help": "Prompts per generate() call per process."})
    # --- evaluation and checkpoints ---
    eval_every: int = field(default=20, metadata={"help": "Evaluate at step 0 and every N steps (0: only at the end)."})
    num_eval_prompts: int = field(default=256, metadata={"help": "Held-out prompts per evaluation."})
    output_dir: str = field(default="", metadata={"help": "Default: runs/grpo-<mode>-seed<seed>."})
    save_every: int = field(default=50, metadata={"help": "Checkpoint every N steps (0: only at the end)."})
    resume: bool = field(default=False, metadata={"help": "Continue from the newest checkpoint in --output_dir."})
    log_every: int = field(default=1, metadata={"help": "Write metrics every N steps."})
    # --- distributed ---
    dist_timeout: int = field(default=1800, metadata={
        "help": "Seconds a collective waits for the other processes: a dead process stops the run instead of hanging it."})


# ----------------------------------------------------------------------------------------------
# ALGO LOGIC: the loss
# ----------------------------------------------------------------------------------------------


def group_advantages(rewards, group_size):
    """A_i = (R_i - mean R) / std R within each group (population std), rewards (n,) laid out group after
    group; returns (n,). A group of equal rewards gets 0; a group of two distinct rewards exactly -1, +1."""
    r = rewards.reshape(-1, group_size)
    if group_size == 2:  # the formula's value, exactly: (R_i - mean) / std = sign(R_i - R_j)
        return torch.sign(r - r.flip(-1)).reshape(-1)
    centred = r - r.mean(-1, keepdim=True)
    std = r.std(-1, unbiased=False, keepdim=True)
    equal = (r == r[:, :1]).all(-1, keepdim=True)  # exact test: a rounded mean may leave a tiny nonzero std
    return torch.where(equal, torch.zeros_like(r), centred / torch.where(equal, torch.ones_like(std), std)).reshape(-1)


def grpo_loss(policy_logps, ref_logps, baseline_logps, mask, advantages, eps, beta, log_eps_P=None, log_eps_R=None,
              num_tokens=None, rejected=None):
    """GRPO (eq. 1) on per-token log-probs: the mean over valid tokens of
    -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta KL_t, r = exp(policy - ref), KL_t = exp(q - p) - (q - p) - 1
    with p = policy_logps, q = baseline_logps (k3 estimator). Tensors (batch, seq), mask 1 on completion
    tokens, advantages (batch,). The mean divides by `num_tokens` when given (DAPO: the valid tokens of the
    whole optimizer step, so that summing the micro-batches' losses gives the step's loss), else mask.sum().
    HUMANLINE: with both bounds, each token log-ratio is clamped to [log_eps_P, log_eps_R] first (a clamped
    token passes no gradient), then GRPO's clip applies; `rejected` (bool, --clip sampling) detaches those
    tokens' ratios instead. The KL term always uses the unclamped log-probs. Returns (loss, metrics)."""
    log_ratio = policy_logps - ref_logps
    if log_eps_P is not None and log_eps_R is not None:  # HUMANLINE: clip each token's log-ratio
        log_ratio = log_ratio.clamp(log_eps_P, log_eps_R)
    if rejected is not None:  # HUMANLINE (ablation): rejected tokens pass no gradient through the ratio
        log_ratio = torch.where(rejected, log_ratio.detach(), log_ratio)
    ratio = log_ratio.exp()
    a = advantages[:, None].to(ratio.dtype)
    surrogate = torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    d = baseline_logps - policy_logps
    kl = d.exp() - d - 1
    n = mask.sum() if num_tokens is None else num_tokens
    loss = ((-surrogate + beta * kl) * mask).sum() / n
    valid = mask.bool()
    metrics = {  # per valid token: their mean over a whole step is the step's value; "loss" is the step's loss
        "loss": (-surrogate + beta * kl).detach()[valid],
        "kl": kl.detach()[valid],
        "clip_frac": (((ratio > 1 + eps) & (a > 0)) | ((ratio < 1 - eps) & (a < 0))).float()[valid],
        "ratio/abs_log": (policy_logps - ref_logps).detach().abs()[valid],
        "logps": policy_logps.detach()[valid],
    }
    return loss, metrics


# HUMANLINE: the fraction of completion tokens whose log-ratio lies outside the clip range
def clamped_fraction(policy_logps, ref_logps, mask, log_eps_P, log_eps_R):
    ratio = (policy_logps - ref_logps).detach()
    outside = ((ratio < log_eps_P) | (ratio > log_eps_R)).float() * mask
    return outside.sum(-1) / mask.sum(-1).clamp(min=1)


# HUMANLINE: the reference takes the policy's weights: a local, in-place copy of each shard
@torch.no_grad()
def sync_reference(ref, policy):
    if ref is None:  # HUMANLINE: reference-free k = 1 keeps no reference (the next step's log-probs were computed instead)
        return
    for model in (ref, policy):
        if hasattr(model, "reshard"):  # FSDP2 leaves the root's parameters gathered after a no-grad forward
            model.reshard()
    for r, p in zip(ref.parameters(), policy.parameters()):
        local(r).copy_(local(p))


def optimizer_step(policy, ref, optimizer, scheduler, max_grad_norm, sync, sync_every, step, skip=False):
    """Clip the gradients, then update; syncing every `sync_every` steps (step counted from 0):
    `humanline` copies the policy into the reference *before* the update (the reference then holds
    the pre-update weights), `trust_region` (TR-DPO, the ablation) *after* it. Returns the grad norm.
    With `skip` (a non-finite loss) or a non-finite grad norm, the gradients are dropped and nothing
    else happens: no update, no sync, no scheduler step (the caller counts the bad step)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # the same on every process
    if skip or not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm
    due = (step + 1) % sync_every == 0
    if sync == "humanline" and due:
        sync_reference(ref, policy)  # HUMANLINE: sync after the gradients are clipped, before the step
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if sync == "trust_region" and due:
        sync_reference(ref, policy)
    return grad_norm


def local(t):
    """The local shard of an FSDP2 parameter (DTensor), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


# ----------------------------------------------------------------------------------------------
# Data: validation, chat templates, tokenisation, collation
# ----------------------------------------------------------------------------------------------


def as_text(value, row, column, tokenizer, prompt=None, allow_empty=False):
    """A prompt or completion as text: plain strings as they are; conversational lists of
    {"role", "content"} through the chat template (completions after their prompt). Only sampled
    completions (online rounds) may be empty."""
    where = f"row {row}, column '{column}'"
    if value is None:
        raise ValueError(f"{where}: missing")
    if isinstance(value, str):
        if not value.strip() and not allow_empty:
            raise ValueError(f"{where}: empty text")
        return value if prompt is None else value + tokenizer.eos_token
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: expected a string or a non-empty list of messages, got {type(value).__name__}")
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"{where}: each message needs a role (system, user, assistant or tool), got {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: message content must be a string, got {m.get('content')!r}")
    if prompt is None:
        return tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
    if not isinstance(prompt, list):
        raise ValueError(f"{where}: a conversational completion needs a conversational prompt")
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + value, tokenize=False)
    return full[len(prefix):]


def prompt_ids(tokenizer, prompt_text):
    """A prompt's token ids, the same for training and generation: the tokenizer's special tokens
    (e.g. BOS) are added unless the chat template already wrote them."""
    add_special = not (tokenizer.bos_token and prompt_text.startswith(tokenizer.bos_token))
    return tokenizer(prompt_text, add_special_tokens=add_special)["input_ids"]


def encode(tokenizer, prompt_text, completion_texts, args, counts):
    """Token ids of a prompt and its completions. Truncation policy: the prompt keeps its last
    --max_prompt_length tokens, each completion its first (--max_length - prompt) tokens; both are
    counted (once per prompt, once per completion) and reported."""
    p, limit = prompt_ids(tokenizer, prompt_text), min(args.max_prompt_length, args.max_length - 1)
    if len(p) > limit:
        p, counts["truncated_prompts"] = p[-limit:], counts["truncated_prompts"] + 1
    completions = []
    for text in completion_texts:
        c = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(p) + len(c) > args.max_length:
            c, counts["truncated_completions"] = c[: args.max_length - len(p)], counts["truncated_completions"] + 1
        completions.append(c)
    return p, completions


def check_prompts(prompts, tokenizer, args, source):
    """Prompts for sampling or evaluation, each checked before training (as_text names a bad row); counts
    those longer than --max_prompt_length, which sampling cuts to their last tokens."""
    counts = {"truncated_prompts": 0}
    for i, prompt in enumerate(prompts):
        try:
            text = as_text(prompt, i, "prompt", tokenizer)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        counts["truncated_prompts"] += len(prompt_ids(tokenizer, text)) > args.max_prompt_length
    return counts


def encode_pairs(rows, tokenizer, args, sampled=False):
    """Validated, tokenised preference pairs: list of (prompt_ids, chosen_ids, rejected_ids)."""
    counts = {"truncated_prompts": 0, "truncated_completions": 0}
    pairs = []
    for i, row in enumerate(rows):
        for column in ("prompt", "chosen", "rejected"):
            if column not in row or row[column] is None:
                raise ValueError(f"row {i}: missing column '{column}' (preference data needs prompt, chosen, rejected)")
        prompt = as_text(row["prompt"], i, "prompt", tokenizer)
        chosen = as_text(row["chosen"], i, "chosen", tokenizer, prompt=row["prompt"], allow_empty=sampled)
        rejected = as_text(row["rejected"], i, "rejected", tokenizer, prompt=row["prompt"], allow_empty=sampled)
        if chosen == rejected:
            raise ValueError(f"row {i}, columns 'chosen'/'rejected': identical completions")
        p, (c, r) = encode(tokenizer, prompt, [chosen, rejected], args, counts)
        pairs.append((p, c, r))
    return pairs, counts


def encode_groups(groups, tokenizer, args):
    """Tokenised sampled groups: (prompt, completions, rewards) -> (prompt_ids, [completion_ids], rewards)."""
    counts = {"truncated_prompts": 0, "truncated_completions": 0}
    out = []
    for i, (prompt, completions, rewards) in enumerate(groups):
        texts = [as_text(c, i, "completion", tokenizer, prompt=prompt, allow_empty=True) for c in completions]
        p, ids = encode(tokenizer, as_text(prompt, i, "prompt", tokenizer), texts, args, counts)
        out.append((p, ids, list(rewards)))
    return out, counts


def group_sequences(groups):
    """ALGO LOGIC: groups (prompt_ids, [completion_ids], rewards) -> training sequences, group after group:
    (prompt_ids, completion_ids, advantage, reward, sampler_logps=None)."""
    out = []
    for p, completions, rewards in groups:
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), len(rewards)).tolist()
        out += [(p, c, a, r, None) for c, a, r in zip(completions, advantages, rewards)]
    return out


def offline_batch(examples, step, batch_size, seed):
    """The offline batch of a step: a fixed permutation per epoch, so a step's batch depends on the step only
    (--precompute_ref and --ref_free rely on it)."""
    per_epoch = len(examples) // batch_size
    epoch, pos = divmod(step, per_epoch)
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed + epoch))
    return [examples[i] for i in order[pos * batch_size: (pos + 1) * batch_size].tolist()]


def micro_batches(batch, args, rank, world):
    """This process's share of a step's sequences, in micro-batches: the layout of every training forward."""
    mine = batch[rank * len(batch) // world: (rank + 1) * len(batch) // world]
    return [mine[i: i + args.micro_batch_size] for i in range(0, len(mine), args.micro_batch_size)]


def forward_batches(batch, args, rank, world):
    """ALGO LOGIC: this process's forwards of a step's batch: per micro-batch, (its sequences, their (prompt_ids,
    completion_ids))."""
    return [(seqs, [s[:2] for s in seqs]) for seqs in micro_batches(batch, args, rank, world)]


def collate(sequences, pad_id, device):
    """Right-padded (input_ids, attention_mask, loss_mask) for (prompt_ids, completion_ids) pairs,
    padded to the longest sequence of this micro-batch only."""
    width = max(len(p) + len(c) for p, c in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(sequences), width, dtype=torch.long)
    loss_mask = torch.zeros(len(sequences), width)
    for j, (p, c) in enumerate(sequences):
        ids[j, : len(p) + len(c)] = torch.tensor(p + c)
        attn[j, : len(p) + len(c)] = 1
        loss_mask[j, len(p): len(p) + len(c)] = 1
    return ids.to(device), attn.to(device), loss_mask.to(device)


def token_logps(model, input_ids, attention_mask, loss_mask):
    """Per-token log-probs of the completion tokens, (batch, seq - 1), 0 elsewhere."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    labels = input_ids[:, 1:, None]
    logps = logits.gather(-1, labels).squeeze(-1) - logits.logsumexp(-1)
    return logps * loss_mask[:, 1:]


def completion_values(values, sequences, like):
    """Per-sequence completion-token values (e.g. recorded log-probs) laid out like token_logps' output."""
    out = torch.zeros_like(like)
    for j, ((p, c), v) in enumerate(zip(sequences, values)):
        out[j, len(p) - 1: len(p) + len(c) - 1] = v
    return out


def sequence_key(prompt_ids, completion_ids):
    """A dictionary key of a (prompt_ids, completion_ids) sequence: the prompt length and a hash of the tokens."""
    return len(prompt_ids), hash(tuple(prompt_ids) + tuple(completion_ids))


@torch.no_grad()
def no_grad_logps(model, forwards, pad_id, device, autocast, per_sequence=False, desc=None):
    """token_logps of each forward's (prompt_ids, completion_ids) sequences, collated as training collates them,
    without gradient and in eval mode (as the reference runs), then back in training mode; with `per_sequence`,
    each sequence's completion-token log-probs on the CPU instead. FSDP2 keeps the root's parameters gathered
    after a no-grad forward: they are resharded, so that the next update reaches them."""
    model.eval()
    out = []
    for sequences in tqdm(forwards, desc=desc, disable=desc is None, leave=False, dynamic_ncols=True):
        with autocast:
            logps = token_logps(model, *collate(sequences, pad_id, device))
        out.append([logps[j, len(p) - 1: len(p) + len(c) - 1].cpu() for j, (p, c) in enumerate(sequences)] if per_sequence else logps)
    model.train()
    if hasattr(model, "reshard"):
        model.reshard()
    return out


def precompute_logps(model, sequences, rows, pad_id, device, autocast, rank, world):
    """--precompute_ref: the completion-token log-probs under `model` (before training: the frozen reference) of
    each distinct (prompt_ids, completion_ids) sequence, {sequence_key: 1-D CPU tensor}, computed once, `rows`
    sequences per forward, grouped by length (little padding). Every process runs as many forwards (FSDP2)."""
    unique = sorted({sequence_key(p, c): (p, c) for p, c in sequences}.items(), key=lambda kv: len(kv[1][0]) + len(kv[1][1]))
    chunks = [unique[i: i + rows] for i in range(0, len(unique), rows)]
    n = torch.tensor(len(chunks))
    if world > 1:
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
    chunks += chunks[-1:] * (int(n) - len(chunks))  # the same number of forwards on every process
    values = no_grad_logps(model, [[s for _, s in chunk] for chunk in chunks], pad_id, device, autocast,
                           per_sequence=True, desc="reference log-probs" if rank == 0 else None)
    return {key: v for chunk, vs in zip(chunks, values) for (key, _), v in zip(chunk, vs)}


@torch.no_grad()
def record_sampler_logps(policy, seqs, pad_id, args, device, autocast, rank, world):
    """ALGO LOGIC: PPO's theta_old. Each sequence's completion-token log-probs under the policy now (right
    after sampling), computed in the micro-batches training will use, so that at the first step after
    sampling the ratio is exactly 1. Only this process's sequences get them (the others keep None)."""
    out = list(seqs)
    for s in range(len(seqs) // args.batch_size):
        for micro in micro_batches(range(s * args.batch_size, (s + 1) * args.batch_size), args, rank, world):
            ids, attn, mask = collate([seqs[i][:2] for i in micro], pad_id, device)
            with autocast:
                logps = token_logps(policy, ids, attn, mask)
            for j, i in enumerate(micro):
                p, c = seqs[i][:2]
                out[i] = seqs[i][:4] + (logps[j, len(p) - 1: len(p) + len(c) - 1].clone(),)
    return out


def load_rows(name, split, toy_paths, kind):
    """Rows of a dataset: 'toy' names, a local file, or a hub dataset."""
    import datasets

    if name.startswith("toy"):
        source = name.split(":")[1] if ":" in name else "strong"
        files = {"preferences": toy_paths.offline[source], "prompts": toy_paths.prompts_train, "eval": toy_paths.prompts_test}
        name, split = files[kind], "train"
    if os.path.isfile(name):  # a local file has a single split; plain data formats only, nothing is unpickled
        builder = {"json": "json", "jsonl": "json", "parquet": "parquet", "csv": "csv"}.get(os.path.splitext(name)[1].lstrip("."))
        if builder is None:
            raise SystemExit(f"{name}: a local dataset must be a .json, .jsonl, .parquet or .csv file")
        try:
            ds = datasets.load_dataset(builder, data_files=name, split="train")
        except datasets.exceptions.DatasetGenerationError as e:  # e.g. malformed JSON: the cause names the line
            raise SystemExit(f"{name}: {e.__cause__ or e}") from None
    else:
        ds = datasets.load_dataset(name, split=split)
    return ds.to_list()


R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think><answer> answer here </answer>")


def prompt_row(row, i, args):
    """A prompt row for sampling or evaluation: 'prompt' (or a math dataset's 'problem'), optionally wrapped as
    a conversation (--as_chat, --system_prompt), with the row's other columns for the reward functions."""
    prompt = row.get("prompt", row.get("problem"))
    if prompt is None:
        raise ValueError(f"row {i}: missing column 'prompt' (or 'problem')")
    if args.as_chat and isinstance(prompt, str):
        system = R1_SYSTEM_PROMPT if args.system_prompt == "r1" else args.system_prompt
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return {**row, "prompt": prompt}


# ----------------------------------------------------------------------------------------------
# ALGO LOGIC: reward functions (TRL's signature: f(prompts, completions, **columns) -> list of floats)
# ----------------------------------------------------------------------------------------------


def completion_text(completion):
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion if m["role"] == "assistant")


def tag_count_reward(prompts, completions, **columns):
    """Open-R1's tag_count: 0.25 for each of '<think>\\n', '\\n</think>\\n', '\\n<answer>\\n', '\\n</answer>'
    that appears exactly once."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for t in tags if completion_text(c).count(t) == 1) for c in completions]


FORMAT = re.compile(r"<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>\s*", re.DOTALL)


def format_reward(prompts, completions, **columns):
    """Open-R1's format: 1 if the whole completion is '<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>'
    (trailing whitespace allowed), else 0."""
    return [float(FORMAT.fullmatch(completion_text(c)) is not None) for c in completions]


def last_boxed(text):
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    i = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if i < 0:
        return None
    start = text.index("{", i) + 1
    depth = 1
    for j in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[start:j]
    return None


def extract_answer(text):
    """The final answer of a completion or a solution: the last \\boxed{} inside the last <answer>...</answer>
    (or anywhere when there are no tags), else the tags' content; None if neither is there."""
    tagged = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    boxed = last_boxed(tagged[-1] if tagged else text)
    return boxed if boxed is not None else (tagged[-1] if tagged else None)


def normalize_answer(s):
    """Strip spaces, $, a trailing '.', \\text{} / \\mbox{} wrappers, \\left / \\right, thin spaces, a leading
    '+' and a leading 'x =' ; \\dfrac and \\tfrac become \\frac."""
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])|\\[!,;:]|\$", "", s)
    s = re.sub(r"\s+", "", s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")).rstrip(".")
    s = re.sub(r"^[a-zA-Z]=", "", s)
    return s[1:] if s.startswith("+") else s


NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"


def to_number(s):
    """An exact Fraction for a normalised integer, decimal, a/b, \\frac{a}{b} or \\frac ab (one digit each),
    with an optional '-'; None otherwise."""
    sign = -1 if s.startswith("-") else 1
    s = s[1:] if sign < 0 else s
    m = (re.fullmatch(rf"\\frac\{{({NUMBER})\}}\{{({NUMBER})\}}", s) or re.fullmatch(r"\\frac(\d)(\d)", s)
         or re.fullmatch(rf"({NUMBER})/({NUMBER})", s))
    try:
        if m:
            return sign * Fraction(m.group(1)) / Fraction(m.group(2))
        return sign * Fraction(s) if re.fullmatch(NUMBER, s) else None
    except ZeroDivisionError:
        return None


def answers_match(predicted, gold):
    p, g = normalize_answer(predicted), normalize_answer(gold)
    if p == g:
        return True
    p, g = to_number(p), to_number(g)
    return p is not None and g is not None and p == g


def accuracy_reward(prompts, completions, solution=None, **columns):
    """1 if the completion's answer (last \\boxed{}, or <answer> tags) equals the solution's (its last \\boxed{},
    else its <answer> tags, else the whole solution), else 0. Equal means equal after `normalize_answer`, or,
    where both are numbers (integers, decimals, a/b, \\frac), numerically equal (exact fractions: 0.5 = 1/2).
    What a full math verifier (Open-R1's math_verify) judges and this does not: symbolic equivalence
    (2\\sqrt{2} vs \\sqrt{8}, x+1 vs 1+x, \\pi/2 vs \\frac{\\pi}{2}), sets, tuples and intervals up to order or
    spacing conventions, thousands separators (10,000), percentages, units and degrees, scientific notation,
    equations other than a leading 'x =', matrices, and answers stated without tags or \\boxed{}."""
    if solution is None:
        raise ValueError("the 'accuracy' reward needs a 'solution' column in the dataset")
    out = []
    for c, sol in zip(completions, solution):
        predicted = extract_answer(completion_text(c))
        gold = extract_answer(sol)
        gold = sol if gold is None else gold
        out.append(float(predicted is not None and answers_match(predicted, gold)))
    return out


REWARD_FUNCS = {"tag_count": tag_count_reward, "format": format_reward, "accuracy": accuracy_reward}


def default_reward_weights(names):
    """--reward_weights when not given: 1 each, but 1, 1, 8 for tag_count, format, accuracy (Open-R1's math runs)."""
    math_rewards = set(names) == {"tag_count", "format", "accuracy"}
    return ",".join("8" if math_rewards and n == "accuracy" else "1" for n in names)


# ----------------------------------------------------------------------------------------------
# ALGO LOGIC: sampling, scoring and grouping (online rounds and evaluation)
# ----------------------------------------------------------------------------------------------


def make_scorer(name, tokenizer, device, args):
    """reward(prompts, completions) -> list of floats: a built-in function, a Python function named
    module:function (code the user chose to run, imported from the working directory or PYTHONPATH), or a
    reward model."""
    builtin = {"toy": toy_task.reward, "toy_verify": toy_task.verify}
    if name in builtin:
        return builtin[name]
    if ":" in name and not os.path.exists(name):
        module, _, function = name.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return getattr(importlib.import_module(module), function)
    rm = AutoModelForSequenceClassification.from_pretrained(name, trust_remote_code=args.trust_remote_code).to(device).eval()
    rm_tok = AutoTokenizer.from_pretrained(name, trust_remote_code=args.trust_remote_code)

    @torch.no_grad()
    def score(prompts, completions, **_):
        if rm_tok.chat_template and isinstance(prompts[0], list):
            texts = [rm_tok.apply_chat_template(p + [{"role": "assistant", "content": c}], tokenize=False)
                     for p, c in zip(prompts, completions)]
        else:
            texts = [p + c for p, c in zip(prompts, completions)]
        enc = rm_tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=args.max_length).to(device)
        return rm(**enc).logits[:, 0].float().tolist()

    return score


def score_samples(scorer, prompts, completions, columns=None):
    """Each sample's reward as a float, or None where the scorer gives NaN, inf, None or a non-number, or
    raises (a call that raises is retried one sample at a time to find the samples it fails on).
    Returns (scores, bad): bad lists (index, what the scorer did) for the None entries."""
    columns = columns or {}

    def call(idx):
        out = list(scorer([prompts[j] for j in idx], [completions[j] for j in idx],
                          **{k: [v[j] for j in idx] for k, v in columns.items()}))
        if len(out) != len(idx):
            raise ValueError(f"returned {len(out)} rewards for {len(idx)} samples")
        return out

    try:
        raw = call(range(len(completions)))
    except Exception:  # a scorer is user code: find the samples it fails on
        raw = []
        for j in range(len(completions)):
            try:
                raw += call([j])
            except Exception as e:  # noqa: BLE001 (recorded for --on_bad_reward)
                raw.append(e)
    scores, bad = [], []
    for j, r in enumerate(raw):
        try:
            value = None if isinstance(r, (Exception, str, bytes)) else float(r)
        except (TypeError, ValueError):
            value = None
        if value is None or not math.isfinite(value):
            bad.append((j, f"raised {type(r).__name__}: {r}" if isinstance(r, Exception) else f"is {r!r}"))
            value = None
        scores.append(value)
    return scores, bad


def bad_reward_message(bad):
    """--on_bad_reward stop: what stopped the run; bad lists (prompt, sample index, what the scorer did)."""
    prompt, sample, what = bad[0]
    return (f"the reward of sample {sample} of prompt {prompt!r} {what} ({len(bad)} bad rewards in this batch); "
            "--on_bad_reward drop would leave such samples out")


@torch.no_grad()
def generate(model, tokenizer, prompt_texts, n, args, greedy, seed):
    """n completions per prompt (grouped per prompt), in batches of --generation_batch_size prompts."""
    model.eval()
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    out = []
    for i in range(0, len(prompt_texts), args.generation_batch_size):
        ids = [prompt_ids(tokenizer, t)[-args.max_prompt_length:] for t in prompt_texts[i: i + args.generation_batch_size]]
        enc = tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(next(model.parameters()).device)
        sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0)
        seqs = model.generate(**enc, max_new_tokens=args.max_new_tokens, num_return_sequences=n,
                              pad_token_id=tokenizer.pad_token_id, synced_gpus=dist.is_initialized(), use_cache=True, **sampling)  # KV cache
        out += tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    tokenizer.padding_side = "right"
    model.train()
    return out


def best_worst_pairs(prompts, completions, scores, n, threshold):
    """Algorithm 1's pairing: per prompt, (best, worst) of its n samples if best - worst >= threshold."""
    rows = []
    for i, prompt in enumerate(prompts):
        group = sorted(((s, c) for s, c in zip(scores[i * n: (i + 1) * n], completions[i * n: (i + 1) * n])
                        if s is not None), key=lambda t: t[0])  # a None score (a bad reward) is left out
        if len(group) < 2:
            continue
        (worst_score, worst), (best_score, best) = group[0], group[-1]
        if best_score - worst_score >= threshold and best != worst:
            rows.append({"prompt": prompt, "chosen": best, "rejected": worst, "score_chosen": best_score, "score_rejected": worst_score})
    return rows


def round_prompts(n_prompts, round_size, round_index, seed):
    """Indices of round `round_index`'s prompts: consecutive slices of one shuffled pass over the
    prompts after another, so a prompt comes back only in the next pass."""
    per_pass = n_prompts // round_size
    if per_pass == 0:
        raise ValueError(f"--round_size {round_size} is larger than the {n_prompts} training prompts")
    n_pass, pos = divmod(round_index, per_pass)
    order = torch.randperm(n_prompts, generator=torch.Generator().manual_seed(seed + n_pass))
    return order[pos * round_size: (pos + 1) * round_size].tolist()


def online_round(policy, tokenizer, reward_fns, rows, args, seed, rank, world):
    """Sample --num_generations completions for this process's share of a round's prompt rows and score them
    (the weighted sum of `reward_fns` [(name, weight, fn)], which receive the rows' other columns). Groups of
    G, or with --pairs_from_samples Algorithm 1's (best, worst) with their raw scores. All processes get all
    groups: a list of (prompt, completions, rewards); stats (summed over processes by the caller)."""
    g = args.num_generations
    mine = rows[rank::world]
    n_real = len(mine)
    mine = mine + rows[:1] * (math.ceil(len(rows) / world) - n_real)  # the same generate calls on every rank
    texts = [as_text(r["prompt"], i, "prompt", tokenizer) for i, r in enumerate(mine)]
    completions = generate(policy, tokenizer, texts, g, args, greedy=False, seed=seed * 1000 + rank)[: n_real * g]
    flat = [r for r in mine[:n_real] for _ in range(g)]
    columns = {k: [r[k] for r in flat] for k in (flat[0] if flat else {}) if k != "prompt"}
    flat_prompts = [r["prompt"] for r in flat]
    per_fn, bad = [], {}
    for name, _, fn in reward_fns:
        fn_scores, fn_bad = score_samples(fn, flat_prompts, completions, columns)
        per_fn.append(fn_scores)
        for j, what in fn_bad:
            bad.setdefault(j, f"{what} ({name})")
    scores = [None if j in bad else sum(w * s[j] for (_, w, _), s in zip(reward_fns, per_fn)) for j in range(len(completions))]
    bad = [(flat_prompts[j], j % g, what) for j, what in sorted(bad.items())]
    prompts = [r["prompt"] for r in mine[:n_real]]
    if args.pairs_from_samples:
        groups = [(r["prompt"], [r["chosen"], r["rejected"]], [r["score_chosen"], r["score_rejected"]])
                  for r in best_worst_pairs(prompts, completions, scores, g, args.reward_threshold)]
    else:  # a group with a bad reward is left out whole: its advantages need every reward
        groups = [(p, completions[i * g: (i + 1) * g], scores[i * g: (i + 1) * g]) for i, p in enumerate(prompts)
                  if None not in scores[i * g: (i + 1) * g]]
    good = [j for j, s in enumerate(scores) if s is not None]
    stats = torch.tensor([sum(scores[j] for j in good), len(good), len(groups), sum(len(set(r)) == 1 for _, _, r in groups)]
                         + [sum(s[j] for j in good) for s in per_fn] + [len(bad)], dtype=torch.float64)
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, (groups, bad))
        groups, bad = [x for part, _ in gathered for x in part], [b for _, part in gathered for b in part]
    if bad and args.on_bad_reward == "stop":  # every process has every bad sample: all stop together
        raise SystemExit(bad_reward_message(bad))
    return groups, stats


@torch.no_grad()
def evaluate(policy, tokenizer, scorer, prompts, args, rank, world, columns=None):
    """Mean reward (and exact accuracy on the toy task) of greedy completions on held-out prompts;
    `columns` (e.g. solution) go to the scorer."""
    mine = prompts[rank::world]
    n_real = len(mine)
    mine += prompts[:1] * (math.ceil(len(prompts) / world) - n_real)  # the same generate calls on every rank
    texts = [as_text(p, i, "prompt", tokenizer) for i, p in enumerate(mine)]
    completions = generate(policy, tokenizer, texts, 1, args, greedy=True, seed=0)[:n_real]
    scores, bad = score_samples(scorer, mine[:n_real], completions, {k: v[rank::world] for k, v in (columns or {}).items()})
    good = [s for s in scores if s is not None]
    sums = [sum(good), len(good), n_real, len(bad)]
    if args.reward_model.startswith("toy"):
        sums.append(sum(toy_task.verify(mine[:n_real], completions)))
    sums = torch.tensor(sums, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    if sums[3] and args.on_bad_reward == "stop":  # the process with the bad sample names it
        raise SystemExit(bad_reward_message([(mine[j], 0, what) for j, what in bad]) if bad else "a bad reward in evaluation")
    out = {"eval/reward": (sums[0] / sums[1].clamp(min=1)).item(), "eval/bad_rewards": int(sums[3])}
    if len(sums) > 4:
        out["eval/accuracy"] = (sums[4] / sums[2]).item()
    return out


# ----------------------------------------------------------------------------------------------
# TRY NOT TO MODIFY: checkpoints
# ----------------------------------------------------------------------------------------------


def save_checkpoint(output_dir, step, policy, ref, optimizer, scheduler, tokenizer, extra, rank, world):
    """output_dir/checkpoint-STEP: the policy (save_pretrained, rank 0) and each process's training
    state (its shards of policy, reference and optimizer; RNG states; data position). Written to a
    temporary directory that is renamed when complete."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = final + ".tmp"
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing this step
        os.makedirs(tmp)
        unwrap(policy).save_pretrained(tmp, state_dict=full)
        tokenizer.save_pretrained(tmp)
    if world > 1:
        dist.barrier()
    state = {
        "policy": {k: local(v).clone() for k, v in policy.state_dict().items()},
        "ref": {k: local(v).clone() for k, v in ref.state_dict().items()} if ref is not None else None,
        "optimizer": localize(optimizer.state_dict()),
        "scheduler": scheduler.state_dict(),
        "rng": {"python": random.getstate(), "numpy": numpy_state(), "torch": torch.get_rng_state()},
        "step": step, "world_size": world, **extra,
    }
    torch.save(state, os.path.join(tmp, f"state-rank{rank}.pt"))
    if world > 1:
        dist.barrier()
    if rank == 0:
        fsync(tmp)  # the files reach the disk before the rename makes them the checkpoint (a power cut keeps either)
        shutil.rmtree(final, ignore_errors=True)  # only when a step is saved twice (the last one)
        os.replace(tmp, final)
        fsync(output_dir, files=False)  # the rename itself
    if world > 1:
        dist.barrier()


def fsync(path, files=True):
    """Flush a directory's entries (and, with files, every file under it) to disk."""
    inside = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names] if files else []
    for p in inside + [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def numpy_state():
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached  # loadable with weights_only=True


def localize(obj):
    if isinstance(obj, dict):
        return {k: localize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [localize(v) for v in obj]
    return local(obj).clone() if isinstance(obj, torch.Tensor) else obj


def load_checkpoint(path, policy, ref, optimizer, scheduler, rank, world):
    state = torch.load(os.path.join(path, f"state-rank{rank}.pt"), weights_only=True)  # tensors and plain data only
    if state["world_size"] != world:
        raise ValueError(f"{path} was written by {state['world_size']} processes; resume with the same number")
    with torch.no_grad():
        for module, saved in ((policy, state["policy"]), (ref, state["ref"])):
            if module is not None and saved is not None:  # a reference never saved (--precompute_ref) is the initial one
                for k, v in module.state_dict().items():
                    local(v).copy_(saved[k])
    opt_state = optimizer.state_dict()
    restore_into(opt_state, state["optimizer"], [p for group in optimizer.param_groups for p in group["params"]])
    optimizer.load_state_dict(opt_state)
    scheduler.load_state_dict(state["scheduler"])
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr  # the saved param_groups are not restored (they hold parameter ids), so set the lr
    random.setstate(state["rng"]["python"])
    kind, keys, pos, has_gauss, cached = state["rng"]["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["rng"]["torch"])
    return state


def restore_into(live, saved, params):
    """Put saved local tensors into a live optimizer state dict, in place: the state of an FSDP2 parameter
    (a DTensor; `params` in the state dict's order) becomes a DTensor sharded like it, so that a freshly
    built optimizer, which has no state yet, resumes with the same layout it would have built itself."""
    from torch.distributed.tensor import DTensor

    for k, v in saved.items():
        if k == "state":
            for pid, s in v.items():
                p = params[pid]
                live["state"][pid] = {
                    name: DTensor.from_local(t.to(local(p).device), p.device_mesh, p.placements, run_check=False,
                                             shape=p.shape, stride=p.stride())
                    if isinstance(p, DTensor) and t.dim() and t.shape == local(p).shape else t
                    for name, t in s.items()}
        elif k != "param_groups":
            live[k] = v


def newest_checkpoint(output_dir):
    steps = [int(d.split("-")[1]) for d in os.listdir(output_dir)
             if d.startswith("checkpoint-") and not d.endswith(".tmp") and d.split("-")[1].isdigit()] if os.path.isdir(output_dir) else []
    return os.path.join(output_dir, f"checkpoint-{max(steps)}") if steps else None


def open_metrics(path, step):
    """metrics.jsonl for appending: a new run starts it afresh; a resumed run keeps the records up
    to the step it resumes from (later ones belong to the attempt that crashed)."""
    kept = []
    if step and os.path.exists(path):
        with open(path) as f:  # a last line cut short by a kill is dropped
            kept = [line for line in f if line.endswith("\n") and json.loads(line).get("step", 0) <= step]
    with open(path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)  # a kill leaves the old records or the kept ones, never none
    return open(path, "a")


def peak_memory_gib(device):
    """Peak memory of this process so far: the most CUDA memory allocated at once on a GPU, else the peak
    resident set size (weights, optimizer state, activations, and the Python interpreter with its libraries)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)


def unwrap(model):
    return getattr(model, "module", model)


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    args = HfArgumentParser(Args).parse_args_into_dataclasses(look_for_args_file=False)[0]
    for flag in ("batch_size", "micro_batch_size", "max_steps"):  # a zero here would fail deep in the loop
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.offline and args.online:
        raise SystemExit("choose one of --offline and --online")
    args.offline = not args.online
    if args.humanline:  # HUMANLINE: the design pattern = syncing before the optimizer step + clamping
        args.sync, args.clip = "humanline", "clamp"
    if args.sync not in ("none", "humanline", "trust_region") or args.clip not in ("none", "clamp", "sampling"):
        raise SystemExit(f"--sync must be none|humanline|trust_region and --clip none|clamp|sampling, got {args.sync}, {args.clip}")
    if args.on_bad_reward not in ("drop", "stop") or args.max_bad_steps < 1:
        raise SystemExit(f"--on_bad_reward must be drop|stop and --max_bad_steps at least 1, got {args.on_bad_reward}, {args.max_bad_steps}")
    # HUMANLINE: reference-free k = 1 applies when every step's reference is the policy of the step before (or the policy)
    ref_free_applies = args.sync == "humanline" and args.sync_every == 1 and args.offline
    if args.ref_free not in ("auto", "on", "off") or (args.ref_free == "on" and not ref_free_applies):
        raise SystemExit(f"--ref_free must be auto|on|off, on only with --sync humanline --sync_every 1 and --offline (online, the next batch is sampled after the update), got {args.ref_free}")
    args.ref_free = "on" if ref_free_applies and args.ref_free != "off" else "off"
    if args.precompute_ref and (args.online or args.sync != "none"):
        raise SystemExit("--precompute_ref needs an offline run whose reference never changes (--sync none)")
    # ALGO LOGIC: derived GRPO settings
    if args.pairs_from_samples and (args.offline or args.sample_every != 1):
        raise SystemExit("--pairs_from_samples needs --online and samples once per round (--round_size), not --sample_every")
    if args.kl_baseline not in ("reference", "initial"):
        raise SystemExit(f"--kl_baseline must be reference|initial, got {args.kl_baseline}")
    if args.eps is None:  # the paper: 0.5 for plain offline GRPO, 0.15 for everything else
        args.eps = 0.5 if args.offline and args.sync == "none" and args.clip == "none" else 0.15
    args.reward_funcs = args.reward_funcs or ("toy" if args.pairs_from_samples else "toy_verify")
    reward_names = args.reward_funcs.split(",")
    args.reward_weights = args.reward_weights or default_reward_weights(reward_names)
    reward_weights = [float(w) for w in args.reward_weights.split(",")]
    if len(reward_weights) != len(reward_names):
        raise SystemExit(f"--reward_weights needs one weight per --reward_funcs name, got {args.reward_weights} for {args.reward_funcs}")
    group_size = 2 if args.offline or args.pairs_from_samples else args.num_generations
    if args.batch_size % group_size:
        raise SystemExit(f"--batch_size {args.batch_size} must be a multiple of the group size {group_size}")
    mode = ("online" if args.online else "offline") + ("-pairs" if args.pairs_from_samples else "") + \
        (f"-every{args.sample_every}" if args.sample_every > 1 else "") + ("-humanline" if args.humanline else "")
    if not args.humanline and (args.sync != "none" or args.clip != "none"):
        mode += f"-sync_{args.sync}-clip_{args.clip}"
    args.output_dir = args.output_dir or os.path.join("runs", f"grpo-{mode}-seed{args.seed}")

    # TRY NOT TO MODIFY: distributed setup (torchrun sets RANK/WORLD_SIZE; otherwise one process)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo",
                                timeout=timedelta(seconds=args.dist_timeout))  # a dead or hung peer raises, never hangs
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.batch_size % (args.micro_batch_size * world):
        raise SystemExit(f"--batch_size {args.batch_size} must be a multiple of --micro_batch_size x processes "
                         f"= {args.micro_batch_size} x {world}")
    grad_accum = args.batch_size // (args.micro_batch_size * world)
    if args.max_prompt_length >= args.max_length:
        raise SystemExit(f"--max_prompt_length ({args.max_prompt_length}) must be below --max_length ({args.max_length})")
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)

    # tokenizer
    toy_paths = toy_task.load() if "toy" in (args.model_name_or_path, args.dataset.split(":")[0],
                                             args.eval_prompts, args.reward_model.split("_")[0]) else None
    model_path = toy_paths.model if args.model_name_or_path == "toy" else args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=args.trust_remote_code)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.padding_side = "right"

    # data: every row is checked before any model loads, so that bad data stops a run in seconds
    if args.offline:  # ALGO LOGIC: Algorithm 2: each pair is a group of two whose rewards rank chosen first
        train_pairs, trunc = encode_pairs(load_rows(args.dataset, args.dataset_split, toy_paths, "preferences"), tokenizer, args)
        train_groups = [(p, [c, r], [1.0, 0.0]) for p, c, r in train_pairs]
        if len(train_groups) < args.batch_size // 2:
            raise SystemExit(f"{args.dataset} has {len(train_groups)} pairs, fewer than one batch ({args.batch_size // 2})")
    else:
        train_rows = [prompt_row(r, i, args) for i, r in enumerate(load_rows(args.dataset, args.dataset_split, toy_paths, "prompts"))]
        trunc = check_prompts([r["prompt"] for r in train_rows], tokenizer, args, args.dataset)
        prompts_per_round = args.round_size if args.pairs_from_samples else args.sample_every * args.batch_size // group_size
        if len(train_rows) < prompts_per_round:
            raise SystemExit(f"{args.dataset} has {len(train_rows)} prompts, fewer than one round ({prompts_per_round})")
    eval_rows = [] if args.eval_prompts == "none" else [
        prompt_row(r, i, args) for i, r in enumerate(load_rows(args.eval_prompts, "test", toy_paths, "eval"))][: args.num_eval_prompts]
    eval_prompts = [r["prompt"] for r in eval_rows]
    eval_columns = {k: [r[k] for r in eval_rows] for k in (eval_rows[0] if eval_rows else {}) if k != "prompt"}
    trunc |= {f"eval_{k}": v for k, v in check_prompts(eval_prompts, tokenizer, args, args.eval_prompts).items()}
    if rank == 0 and any(trunc.values()):
        print(f"truncated: {trunc} (see --max_prompt_length, --max_length)")

    # models: the policy, its reference, the scorers
    def load_model():
        model = AutoModelForCausalLM.from_pretrained(model_path, trust_remote_code=args.trust_remote_code,
                                                     dtype=torch.float32).to(device)
        if distributed:  # FSDP2: shard each decoder layer, then the rest; bf16 compute on CUDA
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda" else MixedPrecisionPolicy()
            for module in model.modules():
                if type(module).__name__ in (model._no_split_modules or []):
                    fully_shard(module, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
        return model

    policy = load_model()
    policy.train()
    # ALGO LOGIC: online without syncing, the ratio's denominator is the sampler's recorded log-probs: no reference model
    sampler_denominator = args.online and args.sync == "none"
    # the reference, sharded exactly like the policy; none with --ref_free on (HUMANLINE) or --precompute_ref
    ref = None if sampler_denominator or args.ref_free == "on" or args.precompute_ref else load_model().eval().requires_grad_(False)
    base = None  # ALGO LOGIC: --kl_baseline initial: a frozen starting policy (the offline reference when never synced)
    if args.kl_baseline == "initial":
        base = ref if args.offline and args.sync == "none" else load_model().eval().requires_grad_(False)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and not distributed)
    if args.online:
        reward_fns = [(n, w, REWARD_FUNCS.get(n) or make_scorer(n, tokenizer, device, args)) for n, w in zip(reward_names, reward_weights)]
    if eval_prompts:
        scorer = REWARD_FUNCS.get(args.reward_model) or make_scorer(args.reward_model, tokenizer, device, args)

    # optimizer and schedule
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, betas=(0.9, 0.999),
                                  eps=args.adam_eps, weight_decay=args.weight_decay)
    warmup = max(1, int(args.warmup_ratio * args.max_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (args.max_steps - s) / max(1, args.max_steps - warmup))))
    sampling_params = humanline_sampling.limit_parameters(  # HUMANLINE: --clip sampling's Beta parameters
        math.exp(args.log_eps_P), math.exp(args.log_eps_R), c=args.sampling_c)
    sampling_gen = torch.Generator(device).manual_seed(args.seed + rank)

    def step_batch(s):
        """The batch of step s: offline a pure function of s; online a slice of the current round (None past its end)."""
        if args.offline:
            return group_sequences(offline_batch(train_groups, s, args.batch_size // 2, args.seed))
        if s - round_start >= len(round_seqs) // args.batch_size:
            return None
        return round_seqs[(s - round_start) * args.batch_size: (s - round_start + 1) * args.batch_size]

    ref_cache = None  # --precompute_ref: the frozen reference is the initial policy: its log-probs of every training sequence
    if args.precompute_ref:
        forwards = [seqs for s in range(args.max_steps) for _, seqs in forward_batches(step_batch(s), args, rank, world)]
        ref_cache = precompute_logps(policy, [x for seqs in forwards for x in seqs], len(forwards[0]), tokenizer.pad_token_id,
                                     device, autocast, rank, world)

    # resume
    step, round_index, round_seqs, round_start = 0, 0, [], 0
    ref_ahead = None  # HUMANLINE: --ref_free on: the next step's reference log-probs per micro-batch (None: the policy's own)
    bad_steps, bad_streak = 0, 0  # steps skipped for a non-finite loss or gradient: in all, and in a row
    ckpt = newest_checkpoint(args.output_dir) if args.resume else None
    if ckpt:
        state = load_checkpoint(ckpt, policy, ref, optimizer, scheduler, rank, world)
        step, round_index, round_start = state["step"], state["round_index"], state["round_start"]
        round_seqs = state["round_seqs"]
        sampling_gen.set_state(state["sampling_gen"])
        if state["args"].get("ref_free", "off") != args.ref_free:  # HUMANLINE: the reference lives in the model or in ref_ahead
            raise SystemExit(f"{ckpt} was written with --ref_free {state['args'].get('ref_free', 'off')}: resume with the same")
        ref_ahead = None if state.get("ref_ahead") is None else [t.to(device) for t in state["ref_ahead"]]  # HUMANLINE
        bad_steps = state.get("bad_steps", 0)
        if rank == 0:
            print(f"resumed from {ckpt} at step {step}")
    if rank == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        for d in os.listdir(args.output_dir):  # half-written checkpoints of a killed run (never loaded): removed
            if d.startswith("checkpoint-") and d.endswith(".tmp"):
                shutil.rmtree(os.path.join(args.output_dir, d), ignore_errors=True)
        with open(os.path.join(args.output_dir, "args.json"), "w") as f:
            json.dump(asdict(args), f, indent=2)
    log_file = open_metrics(os.path.join(args.output_dir, "metrics.jsonl"), step) if rank == 0 else None

    def log(record):
        if rank == 0:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()

    def checkpoint():
        save_checkpoint(args.output_dir, step, policy, ref, optimizer, scheduler, tokenizer,
                        {"round_index": round_index, "round_seqs": round_seqs, "round_start": round_start,
                         "ref_ahead": None if ref_ahead is None else [t.cpu() for t in ref_ahead],  # HUMANLINE: --ref_free
                         "sampling_gen": sampling_gen.get_state(), "bad_steps": bad_steps, "args": asdict(args)}, rank, world)

    # TRY NOT TO MODIFY: a SIGTERM (a scheduler's preemption; torchrun passes it on to every process) asks for a
    # checkpoint at the end of the current step and a clean exit; --resume continues from there
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

    # the loop
    if eval_prompts and args.eval_every and step == 0:  # the starting policy: every curve starts where training starts
        log({"step": 0} | evaluate(policy, tokenizer, scorer, eval_prompts, args, rank, world, eval_columns))
    bar = tqdm(total=args.max_steps, initial=step, desc=f"grpo {mode}", disable=rank != 0, dynamic_ncols=True)
    while step < args.max_steps:
        t0, cpu0 = time.time(), time.process_time()
        if args.online and step - round_start >= len(round_seqs) // args.batch_size:
            # ALGO LOGIC: the sample buffer is spent: sample the next --sample_every steps' groups (or a round
            # of pairs) from the policy, score them, compute the advantages, record the sampler's log-probs
            rows = [train_rows[i] for i in round_prompts(len(train_rows), prompts_per_round, round_index, args.seed)]
            groups, stats = online_round(policy, tokenizer, reward_fns, rows, args, args.seed + round_index, rank, world)
            if world > 1:
                dist.all_reduce(stats)
            round_index += 1
            if args.pairs_from_samples:  # a round's pairs in random order, as online DPO
                shuffle = torch.Generator().manual_seed(1_000_003 * (args.seed + 1) + round_index)
                groups = [groups[i] for i in torch.randperm(len(groups), generator=shuffle).tolist()]
            encoded, truncated = encode_groups(groups, tokenizer, args)
            round_seqs = group_sequences(encoded)
            round_seqs, round_start = round_seqs[: len(round_seqs) // args.batch_size * args.batch_size], step
            if sampler_denominator:
                round_seqs = record_sampler_logps(policy, round_seqs, tokenizer.pad_token_id, args, device, autocast, rank, world)
            record = {"step": step, "online/round": round_index, "online/sample_reward": (stats[0] / stats[1].clamp(min=1)).item(),
                      "online/bad_rewards": int(stats[-1]), "online/groups": len(groups), "online/zero_std_frac": (stats[3] / max(1, stats[2])).item(),
                      "online/steps": len(round_seqs) // args.batch_size, "online/seconds": time.time() - t0,
                      "online/truncated_completions": truncated["truncated_completions"]}
            if args.pairs_from_samples:
                record["online/kept_frac"] = len(groups) / len(rows)
            if len(reward_fns) > 1:
                record |= {f"online/rewards/{n}": (s / stats[1]).item() for (n, _, _), s in zip(reward_fns, stats[4:-1])}
            log(record)
            if not round_seqs:
                raise SystemExit(f"round {round_index} gave {len(groups)} groups, fewer than one batch of {args.batch_size} "
                                 "sequences; raise --round_size or lower --reward_threshold (pairs), or use more prompts")
            continue
        batch = step_batch(step)
        if args.ref_free == "on":  # HUMANLINE: the next step's reference is the policy as it is until this step's update (syncing
            # would copy it then): its log-probs of the next batch, computed now, before gradients take memory; None when
            # a round ends (the next round starts with reference = policy)
            upcoming = step_batch(step + 1) if step + 1 < args.max_steps else None
            ref_next = None if upcoming is None else no_grad_logps(
                policy, [sequences for _, sequences in forward_batches(upcoming, args, rank, world)], tokenizer.pad_token_id, device, autocast)
        forwards = forward_batches(batch, args, rank, world)
        # ALGO LOGIC: DAPO normalisation: the step's completion tokens over all micro-batches and processes
        local_tokens = sum(len(c) for _, sequences in forwards for _, c in sequences)
        n_tokens = torch.tensor(float(local_tokens), dtype=torch.float64, device=device)
        if world > 1:
            dist.all_reduce(n_tokens)
        n_tokens = max(1.0, n_tokens.item())

        sums, counts = {}, {}
        for micro, (seqs, sequences) in enumerate(forwards):
            ids, attn, mask = collate(sequences, tokenizer.pad_token_id, device)
            if distributed:
                policy.set_requires_gradient_sync(micro == grad_accum - 1)  # reduce-scatter once per step
            with autocast:
                with torch.no_grad():
                    ref_logps = token_logps(ref, ids, attn, mask) if ref is not None else None
                    base_logps = token_logps(base, ids, attn, mask) if base is not None and base is not ref else None
                policy_logps = token_logps(policy, ids, attn, mask)
            if ref_cache is not None:  # --precompute_ref: computed before training
                ref_logps = completion_values([ref_cache[sequence_key(p, c)] for p, c in sequences], sequences, policy_logps)
            elif args.ref_free == "on":  # HUMANLINE: computed by the previous step's policy; at step 0 and when a round starts, the policy's own
                ref_logps = ref_ahead[micro] if ref_ahead is not None else policy_logps.detach()
            mask = mask[:, 1:]
            # ALGO LOGIC: the ratio's denominator: the sampler (PPO's theta_old) online without syncing, else the
            # reference (frozen offline, synced under --sync); the KL baseline: the denominator, or the initial policy
            denominator = completion_values([s[4] for s in seqs], [s[:2] for s in seqs], mask) if sampler_denominator else ref_logps
            baseline = denominator if base is None else (ref_logps if base is ref else base_logps)
            bounds = (args.log_eps_P, args.log_eps_R) if args.clip == "clamp" else (None, None)
            rejected = None
            if args.clip == "sampling":  # HUMANLINE (ablation): rejected tokens' ratios are detached instead of clamped
                rejected = humanline_sampling.rejection_mask(policy_logps, denominator, *sampling_params, generator=sampling_gen)
            advantages = torch.tensor([s[2] for s in seqs], device=device)
            loss, metrics = grpo_loss(policy_logps, denominator, baseline, mask, advantages, args.eps, args.beta, *bounds,
                                      num_tokens=n_tokens, rejected=rejected)
            (loss * world).backward()  # FSDP2 averages the gradients over processes
            metrics["humanline/clamped_frac"] = clamped_fraction(policy_logps, denominator, mask, args.log_eps_P, args.log_eps_R)
            metrics["completion_length"] = mask.sum(-1)
            if args.online:
                metrics["reward"] = torch.tensor([s[3] for s in seqs])
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v.sum().item()
                counts[k] = counts.get(k, 0) + v.numel()
        # a non-finite loss or gradient skips the step; a SIGTERM stops the run after it (every process agrees on both)
        flags = torch.tensor([float(not math.isfinite(sums.get("loss", 0.0))), float(bool(stop))], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(flags)
        if args.ref_free == "on":
            ref_ahead = ref_next  # HUMANLINE: the next step's reference log-probs
        lr = scheduler.get_last_lr()[0]  # the learning rate of this step's update
        grad_norm = optimizer_step(policy, ref, optimizer, scheduler, args.max_grad_norm, args.sync, args.sync_every, step,
                                   skip=bool(flags[0]))
        bad = bool(flags[0]) or not torch.isfinite(grad_norm).item()
        bad_steps, bad_streak = bad_steps + bad, bad_streak + 1 if bad else 0
        step += 1
        # the step's wall time and CPU time (all threads): data, forwards, backward, update (not logging, evaluation, checkpoints)
        seconds, cpu_seconds = time.time() - t0, time.process_time() - cpu0

        # TRY NOT TO MODIFY: logging, evaluation, checkpoints
        keys = sorted(sums)  # each metric is a mean over its entries, across micro-batches and ranks
        totals = torch.tensor([sums[k] for k in keys] + [counts[k] for k in keys] + [local_tokens], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(totals)
        record = {k: s / c for k, s, c in zip(keys, totals[: len(keys)].tolist(), totals[len(keys): -1].tolist()) if c}
        record |= {"step": step, "grad_norm": grad_norm.item(), "lr": lr, "bad_steps": bad_steps,
                   "tokens_per_s": totals[-1].item() / (time.time() - t0), "perf/step_seconds": seconds,
                   "perf/step_cpu_seconds": cpu_seconds, "perf/peak_memory_gib": peak_memory_gib(device)}
        if args.online:  # which sample buffer this step trained on, and how many steps after it was sampled
            record |= {"online/round": round_index, "online/staleness": step - 1 - round_start}
        if eval_prompts and ((args.eval_every and step % args.eval_every == 0) or step == args.max_steps):
            record |= evaluate(policy, tokenizer, scorer, eval_prompts, args, rank, world, eval_columns)
        if step % args.log_every == 0 or "eval/reward" in record:
            log(record)
        bar.update(1)
        bar.set_postfix({k.split("/")[-1]: f"{record[k]:.3g}" for k in ("loss", "kl", "reward", "eval/reward") if k in record})
        if bad_streak >= args.max_bad_steps:
            raise SystemExit(f"stopping: the last {bad_streak} steps (up to step {step}) had a non-finite loss or gradient and "
                             f"were skipped; the newest checkpoint, {newest_checkpoint(args.output_dir)}, is from before them. "
                             "Lower --learning_rate or --max_grad_norm, or look for bad data.")
        if (args.save_every and step % args.save_every == 0 and not bad_streak) or step == args.max_steps or flags[1]:
            checkpoint()
        if flags[1]:
            bar.close()
            if rank == 0:
                print(f"SIGTERM: stopped after step {step} with a checkpoint; continue with --resume")
            if distributed:
                dist.destroy_process_group()
            sys.exit(0)
    bar.close()

    # final save: a Hugging Face model directory
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        unwrap(policy).save_pretrained(args.output_dir, state_dict=full)
        tokenizer.save_pretrained(args.output_dir)
        print(f"saved to {args.output_dir}")
    if distributed:
        dist.barrier()  # leave together: a rank tearing down gloo while another still saves can abort
        dist.destroy_process_group()
