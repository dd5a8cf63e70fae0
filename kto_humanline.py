"""Offline, online and humanline KTO in one file.

Humanline (Liu, Muennighoff, Ethayarajh 2025, https://arxiv.org/abs/2509.24207) makes two changes
to an alignment objective so that offline data trains like online data:

1. syncing: every `--sync_every` k steps, after the gradients are computed and clipped but before
   `optimizer.step()`, the policy's weights are copied into the reference (so with k = 1 the
   reference is always the policy of the previous step);
2. clipping: each token's log-ratio log pi_theta - log pi_ref is clamped to
   [`--log_eps_P`, `--log_eps_R`] = [-1.5, 1.5] before it enters the loss (no gradient outside).

`grep -n HUMANLINE kto_humanline.py` shows every line that exists because of them.

KTO (appendix C.1) trains on unpaired examples (x, y, desirable?): with r the summed token
log-ratio of y and z0 a reference point shared by the batch, the loss is
lambda_D (1 - sigmoid(beta (r - z0))) for a desirable y and lambda_U (1 - sigmoid(beta (z0 - r)))
for an undesirable one. z0 estimates KL(pi_theta || pi_ref) from mismatched pairs (x_i, y_j), each
prompt with another example's completion: the mean of their summed (under humanline, clamped)
log-ratios, floored at 0, with no gradient. Preference pairs are split into one desirable and one
undesirable example, with twice DPO's batch size so that the step count matches DPO.

Modes
- `--offline` (default): a fixed dataset, the reference frozen at the initial policy. Unpaired rows
  (prompt, completion, label) or preference rows (prompt, chosen, rejected), split.
- `--online`: the paper's Algorithm 1. In rounds of `--round_size` prompts: set the reference to the
  current policy, sample `--num_samples` completions per prompt from the policy, score them, keep
  (best, worst) when their score gap is at least `--reward_threshold`, split each pair into a
  desirable and an undesirable example, train on the round's examples.
- `--humanline` on top of either (= `--sync humanline --clip clamp`). Ablations: `--sync
  trust_region` (copy *after* the optimizer step, as in TR-DPO), `--clip sampling` (Beta-based
  token rejection, humanline_sampling.py), or either change alone.

The KL pairs and z0
- Pairing: over the step's whole batch, before it is split across processes, example i's prompt
  takes the completion of example (i + 1) mod n (`kto_kl_pairs`), truncated to `--max_length`.
  Each micro-batch's KL pairs go through the same forward pass as its examples (one forward per
  model on [examples; KL pairs]).
- Estimate: per forward pass, over all processes: the (sum, count) of the KL pairs' log-ratios is
  all-reduced across processes, then averaged and floored at 0 (`kto_kl_estimate`). With one
  micro-batch per step (the default) z0 covers the whole batch. With gradient accumulation each
  micro-step has its own z0, from the batch_size / grad_accum examples of that micro-step over
  all processes (as in the paper's code, which estimates z0 per forward pass and averages it
  across devices); a per-step z0 would need a separate forward on the KL pairs before the
  backward passes. So one process with `--micro_batch_size` m * W trains exactly like W processes
  with m, and z0 depends on `--micro_batch_size` x processes, not on the number of processes alone.

Memory and speed
- Reference-free humanline, k = 1 (`--ref_free auto`: on with `--sync humanline --sync_every 1`): no reference
  model. Syncing before each update makes the reference of step t + 1 the policy as it is during step t, so at the
  start of step t the policy computes its log-probs of step t + 1's batch, and no copy is kept; at step 0 and when
  an online round starts (reference <- policy) the reference is the policy itself. The same losses as two models
  synced in place (`--ref_free off`), with one model's memory, no copy and the same forwards. After a step skipped
  for a non-finite loss (no update, no sync) the reference is the unchanged policy, where two models would keep
  the one before it.
- `--precompute_ref` (offline, `--sync none`): the frozen reference is the initial policy, so its log-probs of
  every training sequence are computed once before training (grouped by length) and no reference model is kept.
- Each micro-batch is padded to its own longest sequence; generation uses the KV cache, `--generation_batch_size`
  prompts per call. `experiments/bench.py` measures what each variant costs per step.

Deviations from the paper
- Defaults are for the built-in toy task (toy_task.py: a 0.6M-parameter Llama on 3-digit addition,
  trained on a laptop CPU in minutes), so the learning rate is much larger than the paper's.
  The paper's settings are in the commands below.
- Training length is set in optimizer steps (`--max_steps`); offline data is cycled if needed and
  online rounds are drawn until the step budget is spent. A round's examples that do not fill a
  whole batch are dropped.
- Offline preference pairs are split before shuffling, so a pair's two examples usually land in
  different batches (online rounds likewise).

Commands
    python kto_humanline.py                              # offline KTO on the toy task (CPU, ~2 min)
    python kto_humanline.py --offline --humanline        # offline + humanline
    python kto_humanline.py --online --humanline         # online + humanline
    torchrun --standalone --nproc_per_node 2 kto_humanline.py --humanline   # FSDP2, gloo on CPU
    # the paper's offline+humanline run (Llama3-8B-Instruct, UltraFeedback ArmoRM; 8 GPUs; not run here;
    # --micro_batch_size 8 x 8 GPUs = the whole batch in one pass, so z0 covers all 64 examples)
    torchrun --standalone --nproc_per_node 8 kto_humanline.py --offline --humanline \\
        --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct \\
        --dataset princeton-nlp/llama3-ultrafeedback-armorm --dataset_split train \\
        --eval_prompts none --learning_rate 5e-6 --max_grad_norm 4.0 --beta 0.25 \\
        --desirable_weight 1.1 --undesirable_weight 1.0 \\
        --batch_size 64 --micro_batch_size 8 --max_steps 312 --adam_eps 1e-5 \\
        --max_prompt_length 1024 --max_length 3072
"""

import importlib
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta

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
    offline: bool = field(default=False, metadata={"help": "Train on a fixed dataset (the default mode)."})
    online: bool = field(default=False, metadata={"help": "Algorithm 1: sample pairs from the policy in rounds."})
    humanline: bool = field(default=False, metadata={"help": "Shorthand for --sync humanline --clip clamp."})
    # --- model and data ---
    model_name_or_path: str = field(default="toy", metadata={"help": "'toy' (the built-in task) or a causal LM."})
    dataset: str = field(default="toy", metadata={
        "help": "Unpaired (prompt, completion, label) or preference (prompt, chosen, rejected; each pair split "
                "in two) data: 'toy', 'toy:weak', a hub name or a local json/jsonl/parquet file. Online mode "
                "uses only its prompts ('toy': the toy train prompts)."})
    dataset_split: str = field(default="train", metadata={"help": "Split of --dataset."})
    eval_prompts: str = field(default="toy", metadata={"help": "Held-out prompts for evaluation ('toy', a file or hub name, 'none')."})
    reward_model: str = field(default="toy", metadata={
        "help": "Scorer for online sampling and evaluation: 'toy' (graded), 'toy_verify' (exact), a sequence-"
                "classification model path, or module:function (a Python reward function f(prompts, completions, "
                "**columns) -> floats, imported from the working directory or PYTHONPATH)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code from the hub."})
    on_bad_reward: str = field(default="drop", metadata={
        "help": "A sample whose reward is NaN, inf or None, or whose scorer raises: drop (the sample is left out and "
                "counted: online/bad_rewards, eval/bad_rewards) | stop (the run stops, naming the prompt)."})
    max_prompt_length: int = field(default=512, metadata={"help": "Longer prompts keep their last tokens (counted)."})
    max_length: int = field(default=1024, metadata={"help": "Prompt + completion; longer completions are cut (counted)."})
    precompute_ref: bool = field(default=False, metadata={
        "help": "Offline with a frozen reference (--sync none): compute the reference's log-probs of every training "
                "sequence once, before training (it is the initial policy), and keep no reference model in memory."})
    # --- optimisation ---
    max_steps: int = field(default=120, metadata={"help": "Optimizer steps."})
    batch_size: int = field(default=64, metadata={"help": "Examples per optimizer step, over all processes (a pair gives two)."})
    micro_batch_size: int = field(default=64, metadata={"help": "Examples per forward pass per process (plus as many KL pairs)."})
    learning_rate: float = field(default=5e-6, metadata={"help": "Peak learning rate (paper: 5e-6 offline, 2.5e-6 online)."})
    warmup_ratio: float = field(default=0.1, metadata={"help": "Linear warmup fraction, then linear decay to 0."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    adam_eps: float = field(default=1e-5, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    max_bad_steps: int = field(default=3, metadata={
        "help": "A step whose loss or gradient is not finite is skipped (no update, counted in bad_steps); this many "
                "in a row stop the run."})
    beta: float = field(default=0.25, metadata={"help": "KTO temperature."})
    desirable_weight: float = field(default=1.1, metadata={"help": "lambda_D: weight of desirable examples."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "lambda_U: weight of undesirable examples."})
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
                "applies (--sync humanline --sync_every 1) | on | off (two models, synced in place)."})
    # --- online sampling ---
    round_size: int = field(default=256, metadata={"help": "Prompts per online round (paper: 1024)."})
    num_samples: int = field(default=8, metadata={"help": "Completions sampled per prompt."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling."})
    max_new_tokens: int = field(default=40, metadata={"help": "Longest sampled completion (paper: 2048)."})
    reward_threshold: float = field(default=0.01, metadata={"help": "tau: keep a pair only if best - worst >= tau."})
    generation_batch_size: int = field(default=64, metadata={"help": "Prompts per generate() call per process."})
    # --- evaluation and checkpoints ---
    eval_every: int = field(default=20, metadata={"help": "Evaluate at step 0 and every N steps (0: only at the end)."})
    num_eval_prompts: int = field(default=256, metadata={"help": "Held-out prompts per evaluation."})
    output_dir: str = field(default="", metadata={"help": "Default: runs/kto-<mode>-seed<seed>."})
    save_every: int = field(default=50, metadata={"help": "Checkpoint every N steps (0: only at the end)."})
    resume: bool = field(default=False, metadata={"help": "Continue from the newest checkpoint in --output_dir."})
    log_every: int = field(default=1, metadata={"help": "Write metrics every N steps."})
    # --- distributed ---
    dist_timeout: int = field(default=1800, metadata={
        "help": "Seconds a collective waits for the other processes: a dead process stops the run instead of hanging it."})


# ----------------------------------------------------------------------------------------------
# ALGO LOGIC: the loss
# ----------------------------------------------------------------------------------------------


def kto_loss(policy_logps, ref_logps, mask, desirable, kl, beta, lambda_D, lambda_U, log_eps_P=None, log_eps_R=None):
    """KTO on per-token log-probs (appendix C.1): lambda_D * (1 - sigmoid(beta * (r - kl))) for a
    desirable example, lambda_U * (1 - sigmoid(beta * (kl - r))) for an undesirable one, r the summed
    token log-ratios of the completion and kl the batch's reference point z0 (no gradient).
    logps and mask (batch, seq), mask 1 on completion tokens; desirable a bool tensor (batch,).
    HUMANLINE: with both bounds, each token log-ratio is clamped to [log_eps_P, log_eps_R] first
    (a clamped token passes no gradient). Returns (losses (batch,), metrics): rewards/chosen and
    rewards/rejected hold beta * r of the desirable and of the undesirable examples; rewards/margins
    the argument of each example's sigmoid, beta * (r - kl) or beta * (kl - r) (as DPO's margins are),
    rewards/accuracies whether it is positive."""
    ratio = policy_logps - ref_logps
    if log_eps_P is not None and log_eps_R is not None:  # HUMANLINE: clip each token's log-ratio
        ratio = ratio.clamp(log_eps_P, log_eps_R)
    r = (ratio * mask).sum(-1)
    kl = torch.as_tensor(kl, dtype=r.dtype, device=r.device).detach()
    logits = torch.where(desirable, beta * (r - kl), beta * (kl - r))
    losses = torch.where(desirable, r.new_tensor(lambda_D), r.new_tensor(lambda_U)) * torch.sigmoid(-logits)  # = 1 - sigmoid
    rewards = beta * r.detach()
    metrics = {
        "rewards/chosen": rewards[desirable],
        "rewards/rejected": rewards[~desirable],
        "rewards/margins": logits.detach(),
        "rewards/accuracies": (logits.detach() > 0).float(),
        "kl": kl.reshape(1),
    }
    return losses, metrics


def kto_kl_estimate(policy_kl_logps, ref_kl_logps, kl_mask, log_eps_P=None, log_eps_R=None, all_reduce=None):
    """z0, the KTO reference point: the mean over the mismatched pairs of their summed token log-ratios,
    floored at 0, with no gradient. Per-token tensors (batch, seq), mask 1 on completion tokens.
    HUMANLINE: with both bounds the token log-ratios are clamped, as in the loss.
    `all_reduce` (e.g. torch.distributed.all_reduce) sums (sum, count) across processes before the
    mean, so that z0 is the mean over every process's pairs and is floored only once, after it."""
    ratio = (policy_kl_logps - ref_kl_logps).detach()
    if log_eps_P is not None and log_eps_R is not None:  # HUMANLINE: the KL pairs are clamped too
        ratio = ratio.clamp(log_eps_P, log_eps_R)
    r = (ratio * kl_mask).sum(-1)
    total = torch.stack([r.sum(), r.new_tensor(float(r.numel()))])
    if all_reduce is not None:
        all_reduce(total)
    return (total[0] / total[1]).clamp(min=0)


def kto_kl_pairs(examples, max_length):
    """The mismatched (prompt_ids, completion_ids) pairs of a batch of (prompt_ids, completion_ids,
    desirable): example i's prompt with example (i + 1) mod n's completion, cut to max_length tokens."""
    n = len(examples)
    if n < 2:
        raise ValueError("the KL estimate needs at least two examples per batch")
    return [(p, examples[(i + 1) % n][1][: max(0, max_length - len(p))]) for i, (p, _, _) in enumerate(examples)]


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


def encode_examples(rows, tokenizer, args, sampled=False):
    """Validated, tokenised KTO examples: list of (prompt_ids, completion_ids, desirable). An unpaired
    row (prompt, completion, label) gives one example, a preference row (prompt, chosen, rejected) two:
    the chosen completion desirable, the rejected one undesirable."""
    counts = {"truncated_prompts": 0, "truncated_completions": 0}
    examples = []
    for i, row in enumerate(rows):
        unpaired = row.get("completion") is not None or row.get("label") is not None
        for column in ("prompt", "completion", "label") if unpaired else ("prompt", "chosen", "rejected"):
            if column not in row or row[column] is None:
                raise ValueError(f"row {i}: missing column '{column}' (KTO data needs prompt, completion, label "
                                 "or prompt, chosen, rejected)")
        prompt = as_text(row["prompt"], i, "prompt", tokenizer)
        if unpaired:
            if not isinstance(row["label"], (bool, np.bool_)):
                raise ValueError(f"row {i}, column 'label': expected a boolean (is the completion desirable?), "
                                 f"got {row['label']!r}")
            completions = [(as_text(row["completion"], i, "completion", tokenizer, prompt=row["prompt"],
                                    allow_empty=sampled), bool(row["label"]))]
        else:
            chosen = as_text(row["chosen"], i, "chosen", tokenizer, prompt=row["prompt"], allow_empty=sampled)
            rejected = as_text(row["rejected"], i, "rejected", tokenizer, prompt=row["prompt"], allow_empty=sampled)
            if chosen == rejected:
                raise ValueError(f"row {i}, columns 'chosen'/'rejected': identical completions")
            completions = [(chosen, True), (rejected, False)]  # ALGO LOGIC: a pair gives two examples
        p, ids = encode(tokenizer, prompt, [text for text, _ in completions], args, counts)
        examples += [(p, c, desirable) for c, (_, desirable) in zip(ids, completions)]
    return examples, counts


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
    """ALGO LOGIC: this process's forwards of a step's batch: per micro-batch, (its examples, the (prompt_ids,
    completion_ids) sequences of its one forward per model: the examples, then their KL pairs). The KL pairs are
    formed over the whole batch (`kto_kl_pairs`), then split like the examples."""
    kl_batch = kto_kl_pairs(batch, args.max_length)
    return [(examples, [(p, c) for p, c, _ in examples] + kl_pairs)
            for examples, kl_pairs in zip(micro_batches(batch, args, rank, world), micro_batches(kl_batch, args, rank, world))]


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


# ----------------------------------------------------------------------------------------------
# ALGO LOGIC: sampling, scoring and pairing (online rounds and evaluation)
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
            rows.append({"prompt": prompt, "chosen": best, "rejected": worst})
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


def online_round(policy, tokenizer, scorer, prompts, args, seed, rank, world):
    """Sample, score and pair this process's share of a round's prompts; all processes get all pairs."""
    mine = prompts[rank::world]
    n_real = len(mine)
    padded = mine + prompts[:1] * (math.ceil(len(prompts) / world) - n_real)  # the same generate calls on every rank
    texts = [as_text(p, i, "prompt", tokenizer) for i, p in enumerate(padded)]
    completions = generate(policy, tokenizer, texts, args.num_samples, args, greedy=False,
                           seed=seed * 1000 + rank)[: n_real * args.num_samples]
    flat_prompts = [p for p in mine for _ in range(args.num_samples)]
    scores, bad = score_samples(scorer, flat_prompts, completions)
    bad = [(flat_prompts[j], j % args.num_samples, what) for j, what in bad]
    rows = best_worst_pairs(mine, completions, scores, args.num_samples, args.reward_threshold)
    good = [s for s in scores if s is not None]
    stats = torch.tensor([sum(good), len(good), len(rows), len(bad)], dtype=torch.float64)
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, (rows, bad))
        rows, bad = [r for part, _ in gathered for r in part], [b for _, part in gathered for b in part]
    if bad and args.on_bad_reward == "stop":  # every process has every bad sample: all stop together
        raise SystemExit(bad_reward_message(bad))
    return rows, stats


@torch.no_grad()
def evaluate(policy, tokenizer, scorer, prompts, args, rank, world):
    """Mean reward (and exact accuracy on the toy task) of greedy completions on held-out prompts."""
    mine = prompts[rank::world]
    n_real = len(mine)
    mine += prompts[:1] * (math.ceil(len(prompts) / world) - n_real)  # the same generate calls on every rank
    texts = [as_text(p, i, "prompt", tokenizer) for i, p in enumerate(mine)]
    completions = generate(policy, tokenizer, texts, 1, args, greedy=True, seed=0)[:n_real]
    scores, bad = score_samples(scorer, mine[:n_real], completions)
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
    ref_free_applies = args.sync == "humanline" and args.sync_every == 1
    if args.ref_free not in ("auto", "on", "off") or (args.ref_free == "on" and not ref_free_applies):
        raise SystemExit(f"--ref_free must be auto|on|off, on only with --sync humanline --sync_every 1, got {args.ref_free}")
    args.ref_free = "on" if ref_free_applies and args.ref_free != "off" else "off"
    if args.precompute_ref and (args.online or args.sync != "none"):
        raise SystemExit("--precompute_ref needs an offline run whose reference never changes (--sync none)")
    mode = ("online" if args.online else "offline") + ("-humanline" if args.humanline else "")
    if not args.humanline and (args.sync != "none" or args.clip != "none"):
        mode += f"-sync_{args.sync}-clip_{args.clip}"
    args.output_dir = args.output_dir or os.path.join("runs", f"kto-{mode}-seed{args.seed}")

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
    # (train_pairs and round_pairs keep DPO's names but hold KTO examples: prompt, completion, desirable)
    if args.offline:
        train_pairs, trunc = encode_examples(load_rows(args.dataset, args.dataset_split, toy_paths, "preferences"), tokenizer, args)
        if len(train_pairs) < args.batch_size:
            raise SystemExit(f"{args.dataset} has {len(train_pairs)} examples, fewer than one batch ({args.batch_size})")
    else:
        train_prompts = [row.get("prompt") for row in load_rows(args.dataset, args.dataset_split, toy_paths, "prompts")]
        trunc = check_prompts(train_prompts, tokenizer, args, args.dataset)
        if len(train_prompts) < args.round_size:
            raise SystemExit(f"{args.dataset} has {len(train_prompts)} prompts, fewer than one round (--round_size {args.round_size})")
    eval_prompts = [] if args.eval_prompts == "none" else [
        r.get("prompt") for r in load_rows(args.eval_prompts, "test", toy_paths, "eval")][: args.num_eval_prompts]
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
    # the reference, sharded exactly like the policy; none with --ref_free on (HUMANLINE) or --precompute_ref
    ref = None if args.ref_free == "on" or args.precompute_ref else load_model().eval().requires_grad_(False)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and not distributed)
    scorer = make_scorer(args.reward_model, tokenizer, device, args) if args.online or eval_prompts else None

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
            return offline_batch(train_pairs, s, args.batch_size, args.seed)
        if s - round_start >= len(round_pairs) // args.batch_size:
            return None
        return round_pairs[(s - round_start) * args.batch_size: (s - round_start + 1) * args.batch_size]

    ref_cache = None  # --precompute_ref: the frozen reference is the initial policy: its log-probs of every training sequence
    if args.precompute_ref:
        forwards = [seqs for s in range(args.max_steps) for _, seqs in forward_batches(step_batch(s), args, rank, world)]
        ref_cache = precompute_logps(policy, [x for seqs in forwards for x in seqs], len(forwards[0]), tokenizer.pad_token_id,
                                     device, autocast, rank, world)

    # resume
    step, round_index, round_pairs, round_start = 0, 0, [], 0
    ref_ahead = None  # HUMANLINE: --ref_free on: the next step's reference log-probs per micro-batch (None: the policy's own)
    bad_steps, bad_streak = 0, 0  # steps skipped for a non-finite loss or gradient: in all, and in a row
    ckpt = newest_checkpoint(args.output_dir) if args.resume else None
    if ckpt:
        state = load_checkpoint(ckpt, policy, ref, optimizer, scheduler, rank, world)
        step, round_index, round_start = state["step"], state["round_index"], state["round_start"]
        round_pairs = state["round_pairs"]
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
                        {"round_index": round_index, "round_pairs": round_pairs, "round_start": round_start,
                         "ref_ahead": None if ref_ahead is None else [t.cpu() for t in ref_ahead],  # HUMANLINE: --ref_free
                         "sampling_gen": sampling_gen.get_state(), "bad_steps": bad_steps, "args": asdict(args)}, rank, world)

    # TRY NOT TO MODIFY: a SIGTERM (a scheduler's preemption; torchrun passes it on to every process) asks for a
    # checkpoint at the end of the current step and a clean exit; --resume continues from there
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

    # the loop
    if eval_prompts and args.eval_every and step == 0:  # the starting policy: every curve starts where training starts
        log({"step": 0} | evaluate(policy, tokenizer, scorer, eval_prompts, args, rank, world))
    bar = tqdm(total=args.max_steps, initial=step, desc=f"kto {mode}", disable=rank != 0, dynamic_ncols=True)
    while step < args.max_steps:
        t0, cpu0 = time.time(), time.process_time()
        if args.online and step - round_start >= len(round_pairs) // args.batch_size:
            # ALGO LOGIC: a new round of Algorithm 1: reference <- policy, sample, score, pair
            sync_reference(ref, policy)
            prompts = [train_prompts[i] for i in round_prompts(len(train_prompts), args.round_size, round_index, args.seed)]
            rows, stats = online_round(policy, tokenizer, scorer, prompts, args, args.seed + round_index, rank, world)
            if world > 1:
                dist.all_reduce(stats)
            (round_pairs, truncated), round_start, round_index = encode_examples(rows, tokenizer, args, sampled=True), step, round_index + 1
            shuffle = torch.Generator().manual_seed(1_000_003 * (args.seed + 1) + round_index)
            round_pairs = [round_pairs[i] for i in torch.randperm(len(round_pairs), generator=shuffle).tolist()]
            log({"step": step, "online/round": round_index, "online/sample_reward": (stats[0] / stats[1].clamp(min=1)).item(),
                 "online/bad_rewards": int(stats[3]), "online/pairs": len(rows),
                 "online/truncated_completions": truncated["truncated_completions"],
                 "online/kept_frac": len(rows) / len(prompts), "online/seconds": time.time() - t0})
            if len(round_pairs) < args.batch_size:
                raise SystemExit(f"round {round_index} kept {len(round_pairs)} examples, fewer than one batch; "
                                 "raise --round_size or lower --reward_threshold")
            continue
        batch = step_batch(step)
        if args.ref_free == "on":  # HUMANLINE: the next step's reference is the policy as it is until this step's update (syncing
            # would copy it then): its log-probs of the next batch, computed now, before gradients take memory; None when
            # a round ends (the next round starts with reference = policy)
            upcoming = step_batch(step + 1) if step + 1 < args.max_steps else None
            ref_next = None if upcoming is None else no_grad_logps(
                policy, [sequences for _, sequences in forward_batches(upcoming, args, rank, world)], tokenizer.pad_token_id, device, autocast)

        sums, counts, n_tokens = {}, {}, 0
        for micro, (examples, sequences) in enumerate(forward_batches(batch, args, rank, world)):
            # ALGO LOGIC: one forward per model on the examples and their KL pairs (formed over the whole batch) concatenated
            ids, attn, mask = collate(sequences, tokenizer.pad_token_id, device)
            if distributed:
                policy.set_requires_gradient_sync(micro == grad_accum - 1)  # reduce-scatter once per step
            with autocast:
                with torch.no_grad():
                    ref_logps = token_logps(ref, ids, attn, mask) if ref is not None else None
                policy_logps = token_logps(policy, ids, attn, mask)
            if ref_cache is not None:  # --precompute_ref: computed before training
                ref_logps = completion_values([ref_cache[sequence_key(p, c)] for p, c in sequences], sequences, policy_logps)
            elif args.ref_free == "on":  # HUMANLINE: computed by the previous step's policy; at step 0 and when a round starts, the policy's own
                ref_logps = ref_ahead[micro] if ref_ahead is not None else policy_logps.detach()
            mask = mask[:, 1:]
            bounds = (args.log_eps_P, args.log_eps_R) if args.clip == "clamp" else (None, None)
            if args.clip == "sampling":  # HUMANLINE (ablation): rejected tokens are detached instead of clamped
                policy_logps, rejected = humanline_sampling.apply_humanline_sampling(
                    policy_logps, ref_logps, *sampling_params, generator=sampling_gen)
            n = len(examples)
            desirable = torch.tensor([d for _, _, d in examples], dtype=torch.bool, device=device)
            # ALGO LOGIC: z0 from this forward pass's KL pairs on every process (sum, count all-reduced), no gradient
            kl = kto_kl_estimate(policy_logps[n:], ref_logps[n:], mask[n:], *bounds, all_reduce=dist.all_reduce if world > 1 else None)
            losses, metrics = kto_loss(policy_logps[:n], ref_logps[:n], mask[:n], desirable, kl, args.beta,
                                       args.desirable_weight, args.undesirable_weight, *bounds)
            (losses.sum() * world / args.batch_size).backward()
            metrics["loss"] = losses.detach()
            metrics["humanline/clamped_frac"] = clamped_fraction(policy_logps, ref_logps, mask, args.log_eps_P, args.log_eps_R)
            logps = policy_logps[:n].detach().sum(-1) / mask[:n].sum(-1)
            metrics["logps/chosen"], metrics["logps/rejected"] = logps[desirable], logps[~desirable]
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v.sum().item()
                counts[k] = counts.get(k, 0) + v.numel()
            n_tokens += int(mask.sum().item())
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
        keys = sorted(sums)  # each metric is a mean over its entries (a group may be empty in a step)
        totals = torch.tensor([sums[k] for k in keys] + [counts[k] for k in keys] + [n_tokens], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(totals)
        record = {k: s / c for k, s, c in zip(keys, totals[: len(keys)].tolist(), totals[len(keys): -1].tolist()) if c}
        record |= {"step": step, "grad_norm": grad_norm.item(), "lr": lr, "bad_steps": bad_steps,
                   "tokens_per_s": totals[-1].item() / (time.time() - t0), "perf/step_seconds": seconds,
                   "perf/step_cpu_seconds": cpu_seconds, "perf/peak_memory_gib": peak_memory_gib(device)}
        if eval_prompts and ((args.eval_every and step % args.eval_every == 0) or step == args.max_steps):
            record |= evaluate(policy, tokenizer, scorer, eval_prompts, args, rank, world)
        if step % args.log_every == 0 or "eval/reward" in record:
            log(record)
        bar.update(1)
        bar.set_postfix({k.split("/")[-1]: f"{record[k]:.3g}" for k in ("loss", "rewards/margins", "eval/reward") if k in record})
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
