"""Offline, online and humanline KTO in one file: the method and the whole loop, in run order.

Humanline (Liu, Muennighoff, Ethayarajh 2025, https://arxiv.org/abs/2509.24207) makes two changes to
an alignment objective so that offline data trains like online data (lines tagged HUMANLINE):
1. syncing: every `--sync_every` k steps, after the gradients are clipped and before the update,
   the reference takes the policy's weights (with k = 1 it is the policy of the step before);
2. clamping: each token's log-ratio log pi_theta - log pi_ref is clamped to [-1.5, 1.5]
   (`--log_eps_P`, `--log_eps_R`) before the loss: a clamped token passes no gradient.

KTO trains on unpaired examples (x, y, desirable?). With r the summed token log-ratio of y and z0 a
reference point, the loss is lambda_D (1 - sigmoid(beta (r - z0))) for a desirable y and lambda_U
(1 - sigmoid(beta (z0 - r))) for an undesirable one. z0 estimates KL(pi_theta || pi_ref) from
mismatched pairs (example i's prompt with example i + 1's completion): the mean of their summed
(under humanline, clamped) log-ratios over every process's pairs, floored at 0, without gradient.

Modes: `--offline` (default: unpaired or preference rows, a pair giving two examples; the reference
frozen at the initial policy); `--online` (Algorithm 1: each round of `--round_size` prompts
resets the reference to the policy, which samples `--num_samples` completions per prompt; the best
and worst, if `--reward_threshold` apart, give a desirable and an undesirable example);
`--humanline` on either (= `--sync humanline --clip clamp`). Ablations: `--sync trust_region`,
`--clip sampling`. One GPU: `--lora_r 16`, LoRA adapters on a frozen base (docs/paper-runs.md).

Where this script departs from the paper (with flags: docs/paper-runs.md):
1. No second model holds the reference (`--ref_free on`): at each sync the policy computes the
   log-probs the reference would give (the same values).
2. z0 divides by the number of mismatched pairs; the authors' code by its non-zero log-ratios.
3. Dropout is off (`--keep_dropout`); the learning rate decays (`--lr_scheduler`).

    python kto_humanline.py --offline --humanline    # the toy task on a CPU, about two minutes
    torchrun --standalone --nproc_per_node 8 kto_humanline.py --humanline --max_grad_norm 4.0 \\
        --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct --lr_scheduler constant \\
        --dataset princeton-nlp/llama3-ultrafeedback-armorm --dataset_split "train[:10000]" \\
        --eval_prompts none --micro_batch_size 8 --gradient_checkpointing    # docs/paper-runs.md
"""

import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from types import SimpleNamespace
from typing import Literal, Optional

import torch
import torch.distributed as dist
import torch.utils.checkpoint
import transformers
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import data_formats  # TRL's dataset formats: each row checked, tokenised
import humanline_sampling
import lora  # --lora_r: the reference without a second copy of the base (--ref_free off)
import plumbing  # how a run is kept (checks, checkpoints, logging), and online sampling and scoring
import ref_free  # the default reference (--ref_free on): no second model
from plumbing import RunArgs, arg


@dataclass
class Args(RunArgs):  # RunArgs: how a run is kept
    # mode
    offline: bool = arg(False, "Train on a fixed dataset (implied unless --online).")
    online: bool = arg(False, "Algorithm 1: sample pairs from the policy in rounds.")
    humanline: bool = arg(False, "= --sync humanline --clip clamp.")
    # model and data
    model_name_or_path: str = arg("toy", "'toy' (the built-in task) or a causal LM.")
    dataset: str = arg("toy", "[prompt,] completion, label or chosen, rejected rows: toy, a file...")
    dataset_split: str = arg("train", "Split of --dataset (a file's: train), or 'train[:1000]'.")
    reward_model: str = arg("toy", "Scorer: toy, toy_verify, a reward model, module:function.")
    keep_dropout: bool = arg(False, "Keep dropout (else off: it would swamp the log-ratios).")
    max_prompt_length: int = arg(512, "Longer prompts keep their last tokens (counted).")
    max_length: int = arg(1024, "Prompt + completion; longer completions are cut (counted).")
    # optimisation
    max_steps: Optional[int] = arg(None, "Optimizer steps; unset: one pass (the toy: 120).")
    batch_size: int = arg(64, "Examples per optimizer step, over all processes (a pair: two).")
    micro_batch_size: Optional[int] = arg(
        None, "Examples (+ KL pairs) per forward per process; unset: all (toy), else up to 4."
    )
    gradient_checkpointing: bool = arg(False, "Recompute each layer in the backward (8B: on).")
    lora_r: int = arg(0, "LoRA rank: train adapters on the frozen base (0: train every weight).")
    lora_alpha: float = arg(16.0, "LoRA scale: each adapted weight is W + alpha / r x B A.")
    lora_target_modules: str = arg("all-linear", "all-linear, or names, e.g. q_proj,v_proj")
    learning_rate: float = arg(5e-6, "Peak learning rate (paper: 5e-6 offline, 2.5e-6 online).")
    warmup_ratio: float = arg(0.1, "Linear warmup over this fraction of the steps.")
    lr_scheduler: Literal["linear", "constant"] = arg("linear", "After warmup: decay to 0 or hold.")
    weight_decay: float = arg(0.01, "AdamW weight decay.")
    adam_eps: float = arg(1e-5, "AdamW epsilon.")
    max_grad_norm: float = arg(1.0, "Gradient clipping norm.")
    beta: float = arg(0.25, "KTO temperature.")
    desirable_weight: float = arg(1.1, "lambda_D: weight of desirable examples.")
    undesirable_weight: float = arg(1.0, "lambda_U: weight of undesirable examples.")
    seed: int = arg(0, "Random seed (data order, sampling).")
    # humanline
    sync: Literal["none", "humanline", "trust_region"] = arg("none", "humanline: before an update, trust_region after.")
    sync_every: int = arg(1, "k: sync every k optimizer steps.")
    clip: Literal["none", "clamp", "sampling"] = arg("none", "Log-ratios: clamp to [P, R], or Beta rejection.")
    log_eps_P: float = arg(-1.5, "Lower bound of the token log-ratio.")
    log_eps_R: float = arg(1.5, "Upper bound of the token log-ratio.")
    sampling_c: float = arg(humanline_sampling.DEFAULT_C, "--clip sampling: Beta concentration c.")
    ref_free: Literal["on", "off"] = arg("on", "on: no reference model (same values); off: one.")
    # online sampling
    round_size: int = arg(256, "Prompts per online round (paper: 1024).")
    num_samples: int = arg(8, "Completions sampled per prompt.")
    temperature: float = arg(0.7, "Sampling temperature.")
    top_p: float = arg(0.95, "Nucleus sampling.")
    max_new_tokens: int = arg(40, "Longest sampled completion (paper: 2048).")
    reward_threshold: float = arg(0.01, "tau: keep a pair only if best - worst >= tau.")


def flag_checks(a, given):  # KTO's own, beside parse_args' checks of every flag: (bad, its line)
    weights = (a.desirable_weight, a.undesirable_weight)  # lambda_D, lambda_U
    return [
        (a.beta <= 0, f"--beta must be above 0, got {a.beta}"),
        (a.batch_size < 2, "--batch_size must be at least 2: z0 pairs examples with others' outputs"),
        (min(weights) <= 0, f"--desirable_weight and --undesirable_weight must be above 0, got {weights}"),
        (a.num_samples < 2, f"--num_samples must be at least 2, got {a.num_samples}"),
    ]


# ALGO LOGIC: the loss, on per-token log-probs (the paper, appendix C.1)
def kto_loss(policy_logps, ref_logps, mask, desirable, kl, beta, lambda_D, lambda_U, log_eps_P=None, log_eps_R=None):
    """lambda_D (1 - sigmoid(beta (r - kl))) for a desirable example, lambda_U (1 - sigmoid(beta
    (kl - r))) for an undesirable one; r the completion's summed token log-ratios, kl the batch's z0
    (no gradient). logps and mask (batch, seq), mask 1 on completion tokens; desirable (batch,) bool.
    With both bounds each token's log-ratio is clamped first. Metrics: rewards/chosen, rejected: beta
    r of the desirable, undesirable examples; margins: each sigmoid's argument (as DPO's)."""
    ratio = policy_logps - ref_logps  # (batch, seq)
    if log_eps_P is not None and log_eps_R is not None:
        ratio = ratio.clamp(log_eps_P, log_eps_R)  # HUMANLINE: clamp per token, (batch, seq)
    r = (ratio * mask).sum(-1)  # (batch,)
    kl = torch.as_tensor(kl, dtype=r.dtype, device=r.device).detach()  # a scalar, ()
    logits = torch.where(desirable, beta * (r - kl), beta * (kl - r))  # (batch,)
    weights = torch.where(desirable, r.new_tensor(lambda_D), r.new_tensor(lambda_U))  # (batch,)
    losses = weights * torch.sigmoid(-logits)  # (batch,), = 1 - sigmoid(logits)
    rewards = beta * r.detach()  # (batch,)
    metrics = {  # chosen, rejected: of the (un)desirable; margins, accuracies: (batch,); kl: (1,)
        "rewards/chosen": rewards[desirable],
        "rewards/rejected": rewards[~desirable],
        "rewards/margins": logits.detach(),
        "rewards/accuracies": (logits.detach() > 0).float(),
        "kl": kl.reshape(1),
    }
    return losses, metrics


def kto_kl_estimate(policy_kl_logps, ref_kl_logps, kl_mask, log_eps_P=None, log_eps_R=None, all_reduce=None):
    """z0, KTO's reference point: the mean over the mismatched pairs of their summed token
    log-ratios (clamped as in the loss), floored at 0, no gradient. `all_reduce` (e.g. dist's) sums
    (sum, count) over processes first: z0 is the mean over every process's pairs, floored once."""
    ratio = (policy_kl_logps - ref_kl_logps).detach()  # (pairs, seq)
    if log_eps_P is not None and log_eps_R is not None:  # the KL pairs are clamped too
        ratio = ratio.clamp(log_eps_P, log_eps_R)  # (pairs, seq)
    r = (ratio * kl_mask).sum(-1)  # (pairs,)
    total = torch.stack([r.sum(), r.new_tensor(float(r.numel()))])  # (2,): the sum and the count
    if all_reduce is not None:
        all_reduce(total)
    return (total[0] / total[1]).clamp(min=0)  # a scalar, ()


def kto_kl_pairs(examples, max_length):
    """The mismatched pairs of a batch of (prompt_ids, completion_ids, desirable): example i's
    prompt with example (i + 1) mod n's completion, cut to max_length."""
    n = len(examples)
    if n < 2:
        raise ValueError("the KL estimate needs at least two examples per batch")
    return [(p, examples[(i + 1) % n][1][: max(0, max_length - len(p))]) for i, (p, _, _) in enumerate(examples)]


def best_worst_pairs(groups, threshold):
    """ALGO LOGIC: Algorithm 1's pairing: per prompt, the (best, worst) of its scored samples if
    best - worst >= tau. groups: (prompt_ids, completions, scores, ...), a None score (a bad
    reward) left out. Returns groups of two."""
    pairs = []
    for p, completions, scores, *_ in groups:
        ranked = sorted(((s, c) for s, c in zip(scores, completions) if s is not None), key=lambda t: t[0])
        if len(ranked) >= 2 and ranked[-1][0] - ranked[0][0] >= threshold and ranked[-1][1] != ranked[0][1]:
            pairs.append((p, [ranked[-1][1], ranked[0][1]], [ranked[-1][0], ranked[0][0]]))
    return pairs


# the reference and the update (rt: the runtime setup() makes: processes, device, dtypes)
class ReferenceModel:
    """The textbook reference (--ref_free off): a second copy of the policy, sharded exactly like
    it, so that a sync copies each process's shards in place (no communication). The default
    (ref_free.py) holds the same reference without the copy, behind the same methods."""

    def __init__(self, model, rt, temperature=1.0):  # of the log-probs (GRPO's --logps_temperature)
        self.model, self.rt, self.temperature = model.eval().requires_grad_(False), rt, temperature
        self.seconds = 0.0  # spent syncing since the last step's record

    @torch.no_grad()
    def logps(self, step, micro, inputs):  # of micro-batch `micro` of step `step`: collate's inputs
        return token_logps(self.model, *inputs, self.rt.head_dtype, self.temperature)

    @torch.no_grad()
    def sync(self, policy, step):  # the reference takes the policy's weights: a copy of each shard
        t0 = time.time()
        for model in (self.model, policy):
            if hasattr(model, "reshard"):  # FSDP2 keeps the root gathered after a no-grad forward
                model.reshard()
        for r, p in zip(self.model.parameters(), policy.parameters()):
            ref_free.local(r).copy_(ref_free.local(p))
        self.seconds += time.time() - t0

    reset = sync  # at step 0 and at an online round's start (Algorithm 1)


def sync_due(step, sync_every):  # the one schedule: steps k - 1, 2k - 1, ... (ref_free asks it too)
    return (step + 1) % sync_every == 0


def optimizer_step(policy, reference, optimizer, scheduler, max_grad_norm, sync, sync_every, step, skip=False):
    """Clip the gradients, then update. Every k-th step (from 0) `humanline` syncs the reference
    *before* the update (so it holds the pre-update weights), `trust_region` (the ablation) *after*.
    A skipped step (non-finite loss or grad norm) leaves out the update, never the sync: the
    reference's schedule depends on the step alone."""
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    due = sync_due(step, sync_every)
    if sync == "humanline" and due:
        reference.sync(policy, step)  # HUMANLINE: sync after clipping, before the update
    if not skip and torch.isfinite(grad_norm):
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if sync == "trust_region" and due:
        reference.sync(policy, step)
    return grad_norm


# batching and log-probs
def offline_batch(examples, step, batch_size, seed):
    """A step's offline batch: one fixed permutation per epoch, so a function of the step alone."""
    epoch, pos = divmod(step, len(examples) // batch_size)
    shuffle = torch.Generator().manual_seed(plumbing.stream_seed(seed, "data", epoch))
    order = torch.randperm(len(examples), generator=shuffle)
    return [examples[i] for i in order[pos * batch_size : (pos + 1) * batch_size].tolist()]


def micro_batches(batch, args, rank, world):
    """This process's share of a step's batch, in micro-batches of --micro_batch_size."""
    mine = batch[rank * len(batch) // world : (rank + 1) * len(batch) // world]
    return [mine[i : i + args.micro_batch_size] for i in range(0, len(mine), args.micro_batch_size)]


def forward_batches(batch, args, rank, world):
    """ALGO LOGIC: per micro-batch, (its examples, the (prompt_ids, completion_ids) of its one forward
    per model: the examples, then their KL pairs, formed over the whole batch and split like it)."""
    kl_batch = kto_kl_pairs(batch, args.max_length)
    micro = zip(micro_batches(batch, args, rank, world), micro_batches(kl_batch, args, rank, world))
    return [(examples, [(p, c) for p, c, _ in examples] + kl_pairs) for examples, kl_pairs in micro]


def collate(token_ids, pad_id, device):
    """(input_ids, attention_mask, loss_mask) of (prompt_ids, completion_ids), right-padded."""
    width = max(len(p) + len(c) for p, c in token_ids)
    ids = torch.full((len(token_ids), width), pad_id, dtype=torch.long)
    attn, loss_mask = torch.zeros(len(token_ids), width, dtype=torch.long), torch.zeros(len(token_ids), width)
    for j, (p, c) in enumerate(token_ids):
        ids[j, : len(p) + len(c)], attn[j, : len(p) + len(c)] = torch.tensor(p + c), 1
        loss_mask[j, len(p) : len(p) + len(c)] = 1
    return ids.to(device), attn.to(device), loss_mask.to(device)


def token_logps(model, input_ids, attention_mask, loss_mask, head_dtype=torch.float32, temperature=1.0, chunk=1024):
    """Per-token log-probs of the completion tokens, (batch, seq - 1), 0 elsewhere: plainly
    logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None]) * mask (docs/your-trainer.md,
    tested against this). Here only completion positions reach the LM head, in chunks recomputed in
    the backward, in `head_dtype` (fp32: k = 1's log-ratios, ~1e-3, are below bf16's rounding of
    large logits), and no (batch, seq, vocab) logits are made: at 8B they would not fit."""
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = model(**inputs, output_hidden_states=True, logits_to_keep=1).hidden_states[-1][:, :-1]  # final norm
    where = loss_mask[:, 1:].bool()
    h, targets, head = hidden[where], input_ids[:, 1:][where], model.get_output_embeddings()
    # the head as the model applies it: some scale their logits (Cohere, Granite), some softcap
    config = model.config.get_text_config()
    scale = getattr(config, "logit_scale", None) or 1 / (getattr(config, "logits_scaling", None) or 1)
    softcap = getattr(config, "final_logit_softcapping", None)
    shared = (head.weight, head.bias, head_dtype, scale, softcap, temperature)
    chunks = [(h[i : i + chunk], targets[i : i + chunk]) for i in range(0, len(h), chunk)]
    logps = [torch.utils.checkpoint.checkpoint(head_logps, *c, *shared, use_reentrant=False) for c in chunks]
    return torch.zeros(where.shape, device=h.device).masked_scatter(where, torch.cat(logps))


def head_logps(h, targets, weight, bias, dtype, scale=1.0, softcap=None, temperature=1.0):
    """log softmax(logits / temperature)[target] per row of h, in `dtype` (outside any autocast):
    logits = (h W^T + bias) * scale, then softcap * tanh(logits / softcap)."""
    with torch.autocast(h.device.type, enabled=False):
        bias = bias if bias is None else bias.to(dtype)
        logits = torch.nn.functional.linear(h.to(dtype), weight.to(dtype), bias).float() * scale
        logits = softcap * torch.tanh(logits / softcap) if softcap else logits
        logits = logits / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


# distributed setup, models, optimizer
def setup(args):
    """rt, the runtime: processes (torchrun sets RANK, WORLD_SIZE; else one), device, dtypes, seeds."""
    distributed, cuda = "RANK" in os.environ, torch.cuda.is_available()
    if distributed:  # a dead or hung peer raises after --dist_timeout, never hangs
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=timedelta(seconds=args.dist_timeout))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    transformers.set_seed(plumbing.stream_seed(args.seed, "init", rank))
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32  # weights stay fp32
    rt = SimpleNamespace(distributed=distributed, rank=rank, world=world, device=device, dtype=dtype)
    rt.head_dtype = torch.float32 if args.fp32_head else dtype  # of the LM head and log-softmax
    # a new context at each use: an autocast object entered inside itself stays on after
    rt.autocast = lambda: torch.autocast(device.type, dtype, enabled=dtype == torch.bfloat16)
    return rt


def load_model(args, rt):
    """The policy (or the reference's copy). On several processes FSDP2: each decoder layer a shard
    group, gathered one at a time; process 0 reads the weights, the others receive their shards."""
    model = plumbing.build_model(args, rt)  # LoRA's adapters too; on several processes: on the meta device
    if rt.distributed:
        # layers compute in --precision under autocast with the residual stream in fp32, as on one GPU; norm weights
        # stay fp32 (near 1, a bf16 one moves in steps of 0.008: the reference would differ by rounding, not training)
        layer = MixedPrecisionPolicy(rt.dtype, torch.float32, cast_forward_inputs=False)
        fp32 = MixedPrecisionPolicy(torch.float32, torch.float32, cast_forward_inputs=False)
        for module in model.modules():
            if type(module).__name__ in (model._no_split_modules or []):
                for norm in [m for m in module.modules() if "Norm" in type(m).__name__ and rt.dtype != torch.float32]:
                    fully_shard(norm, mp_policy=fp32)
                fully_shard(module, mp_policy=layer)
        fully_shard(model, mp_policy=MixedPrecisionPolicy(rt.head_dtype, torch.float32))
        plumbing.load_shards(model, args, rt)
    plumbing.check_logps(model, args, rt, token_logps)  # a head token_logps misreads stops
    return model


def make_reference(args, policy, rt, step_inputs):
    """| flags | the reference (GRPO's make_reference also picks the KL's baseline) |
    | --ref_free off --lora_r r | lora.AdapterReference: the base with synced adapters, or none |
    | --ref_free off | ReferenceModel: a second model, sharded exactly like the policy |
    | --ref_free on (default) | REF-FREE: the policy's log-probs where it would take its weights |"""
    if args.ref_free == "off" and args.lora_r:
        return lora.AdapterReference(policy, token_logps, rt, frozen=args.offline and args.sync == "none")
    if args.ref_free == "off":
        return ReferenceModel(load_model(args, rt), rt)
    due = partial(sync_due, sync_every=args.sync_every) if args.sync != "none" else None
    return ref_free.PolicyAsReference(policy, step_inputs, token_logps, rt, due, args.max_steps)


def make_optimizer(policy, args):
    """Fused AdamW (5x for-each's speed on a CPU); warmup over --warmup_ratio, then decay to 0 or hold."""
    adamw = dict(lr=args.learning_rate, eps=args.adam_eps, weight_decay=args.weight_decay)
    optimizer = torch.optim.AdamW(policy.parameters(), **adamw, fused=True)
    warmup, end = max(1, int(args.warmup_ratio * args.max_steps)), args.max_steps
    after = (lambda s: max(0.0, (end - s) / max(1, end - warmup))) if args.lr_scheduler == "linear" else (lambda s: 1.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, after(s)))


def main():
    # ---- 1. flags, processes, tokenizer ----------------------------------------------------------
    args = plumbing.parse_args(Args, "kto", flag_checks)  # a bad flag stops with one line
    rt = setup(args)  # the runtime: processes, device, dtypes
    tokenizer = plumbing.load_tokenizer(args)

    # ---- 2. data: every row checked before any model loads (bad data stops a run in seconds) -----
    if args.offline:
        rows = data_formats.load_data(args, "examples", tokenizer, rt)
        train_examples = [(row.prompt_ids, c, d) for row in rows for c, d in zip(row.completions, row.labels)]
        few = f"{args.dataset}: {len(train_examples)} examples, fewer than a batch ({args.batch_size})"
        plumbing.fail(len(train_examples) < args.batch_size, few)
        plumbing.plan_run(args, len(train_examples), args.batch_size, "examples", rt.rank)
    else:  # at most one pair (two examples) per prompt: a round that keeps fewer gives fewer steps
        train_prompts = data_formats.load_data(args, "prompts", tokenizer, rt, need=args.round_size)
        plumbing.plan_run(args, len(train_prompts), args.batch_size // 2, "prompts", rt.rank)
    eval_prompts = data_formats.load_data(args, "eval", tokenizer, rt)
    state = SimpleNamespace(step=0, round_index=0, round=[], round_start=0)

    def step_batch(s):  # step s's examples: offline a function of s; online a slice of the round
        if args.offline:
            return offline_batch(train_examples, s, args.batch_size, args.seed)
        i, b = s - state.round_start, args.batch_size
        return state.round[i * b : (i + 1) * b] if i < len(state.round) // b else None

    def step_inputs(s):  # step s's micro-batches as the models read them (None until sampled)
        batch = step_batch(s)
        forwards = batch and forward_batches(batch, args, rt.rank, rt.world)
        return forwards and [collate(token_ids, tokenizer.pad_token_id, rt.device) for _, token_ids in forwards]

    # ---- 3. models: the policy and its reference, the scorer; the optimizer and schedule ---------
    policy = load_model(args, rt).train()
    reference = make_reference(args, policy, rt, step_inputs)
    scorer = plumbing.make_scorer(args.reward_model, args, rt) if args.online or eval_prompts else None
    optimizer, scheduler = make_optimizer(policy, args)
    eps_P, eps_R = math.exp(args.log_eps_P), math.exp(args.log_eps_R)
    sampling_params = humanline_sampling.limit_parameters(eps_P, eps_R, c=args.sampling_c)
    sampling_gen = torch.Generator(rt.device).manual_seed(plumbing.stream_seed(args.seed, "rejection", rt.rank))

    # ---- 4. the session (--resume restores state here), the start --------------------------------
    session = plumbing.Session(args, rt, tokenizer, policy, optimizer, scheduler, sampling_gen, state, reference)
    evaluate = partial(plumbing.evaluate, policy, tokenizer, scorer, eval_prompts, args, rt)
    if state.step == 0:  # (not when resuming)
        reference.reset(policy, step=0)  # the reference starts as the initial policy
        if eval_prompts and args.eval_at_start:  # every curve starts at the starting policy
            session.log({"step": 0} | evaluate())

    # ---- 5. the loop; an online round when the last one's examples are spent ---------------------
    rounds_per_pass = math.ceil(len(train_prompts) / args.round_size) if args.online else None
    while state.step < args.max_steps:
        t0, cpu0 = time.time(), time.process_time()
        if args.online and step_batch(state.step) is None:
            # ALGO LOGIC: Algorithm 1's round: the policy samples; each prompt's (best, worst) gives a
            # desirable and an undesirable example; the reference is reset
            scorers = [(args.reward_model, 1.0, scorer)]
            groups, record = session.sample_round(scorers, train_prompts, args.round_size, args.num_samples)
            pairs = best_worst_pairs(groups, args.reward_threshold)
            # a short round trained no step: its examples, still on-policy, join this one's
            kept = state.round if state.step == state.round_start else []
            state.round_index, state.round_start = state.round_index + 1, state.step
            examples = [(p, c, d) for p, cs, _ in pairs for c, d in zip(cs, (True, False))]
            state.round = kept + plumbing.shuffled(examples, args.seed, state.round_index)
            reference.reset(policy, step=state.step)
            record = {"step": state.step, "online/round": state.round_index, "online/pairs": len(pairs)} | record
            session.log(record | {"online/kept_frac": len(pairs) / len(groups), "online/seconds": time.time() - t0})
            # fewer examples than a batch: another round; a whole pass of such rounds ends the run
            ready = len(state.round) >= args.batch_size
            if session.end_of_round(ready, groups, rounds_per_pass, eval_prompts and evaluate):
                break
            continue

        # ---- 6. the step: per micro-batch one forward per model, examples then KL pairs ----------
        sums = {}
        forwards = forward_batches(step_batch(state.step), args, rt.rank, rt.world)
        for micro, (examples, token_ids) in enumerate(forwards):
            inputs = collate(token_ids, tokenizer.pad_token_id, rt.device)
            n = len(examples)  # the examples first, then their KL pairs
            with rt.autocast():  # ref_free's reference: computed at the last sync, reads no inputs
                ref_logps = reference.logps(state.step, micro, inputs)
                with torch.no_grad():  # KL pairs only set z0, which takes no gradient: no activations
                    kl_logps = token_logps(policy, *(x[n:] for x in inputs), rt.head_dtype)
                policy_logps = token_logps(policy, *(x[:n] for x in inputs), rt.head_dtype)
            policy_logps = torch.cat([policy_logps, kl_logps])
            mask = inputs[2][:, 1:]  # the completion tokens, aligned with the log-probs
            # log-probs enter the loss only in the ratio: detaching them stops it (unlike GRPO's KL)
            if args.clip == "sampling":  # HUMANLINE: the ablation: rejected tokens are detached
                sample = humanline_sampling.apply_humanline_sampling
                policy_logps, _ = sample(policy_logps, ref_logps, *sampling_params, generator=sampling_gen)
            desirable = torch.tensor([d for _, _, d in examples], dtype=torch.bool, device=rt.device)
            # ALGO LOGIC: z0 from this forward's KL pairs on every process (all-reduced), no gradient
            kl = kto_kl_estimate(
                policy_logps[n:],
                ref_logps[n:],
                mask[n:],
                log_eps_P=args.log_eps_P if args.clip == "clamp" else None,
                log_eps_R=args.log_eps_R if args.clip == "clamp" else None,
                all_reduce=dist.all_reduce if rt.world > 1 else None,
            )
            losses, metrics = kto_loss(
                policy_logps[:n],
                ref_logps[:n],
                mask[:n],
                desirable,
                kl,
                beta=args.beta,
                lambda_D=args.desirable_weight,
                lambda_U=args.undesirable_weight,
                log_eps_P=args.log_eps_P if args.clip == "clamp" else None,
                log_eps_R=args.log_eps_R if args.clip == "clamp" else None,
            )
            (losses.sum() * rt.world / args.batch_size).backward()  # FSDP2 averages over processes
            logps = policy_logps[:n].detach().sum(-1) / mask[:n].sum(-1)
            clamped = plumbing.clamped_fraction(policy_logps, ref_logps, mask, args.log_eps_P, args.log_eps_R)
            metrics |= {"loss": losses.detach(), "tokens": mask.sum(), "humanline/clamped_frac": clamped}
            metrics |= {"logps/chosen": logps[desirable], "logps/rejected": logps[~desirable]}
            plumbing.accumulate(sums, metrics)

        # ---- 7. the update (and the sync); a NaN loss skips it, a SIGTERM stops after it ---------
        skip, stop = session.skip_or_stop(sums)
        lr = scheduler.get_last_lr()[0]
        grad_norm = optimizer_step(
            policy, reference, optimizer, scheduler, args.max_grad_norm, args.sync, args.sync_every, state.step, skip
        )
        state.step += 1

        # ---- 8. log, evaluate, checkpoint, stop --------------------------------------------------
        record = session.record(sums, grad_norm=grad_norm, lr=lr, skipped=skip, t0=t0, cpu0=cpu0)
        if eval_prompts and (state.step == args.max_steps or plumbing.every(state.step, args.eval_every)):
            record |= evaluate()
        if plumbing.every(state.step, args.log_every) or "eval/reward" in record:
            session.log(record)
        session.stop_if_stuck()  # --max_bad_steps skipped steps in a row
        periodic = plumbing.every(state.step, args.save_every) and not session.bad_streak
        if periodic or stop or state.step == args.max_steps:
            session.save()
        if stop:
            session.exit_after_signal()
    session.finish()


if __name__ == "__main__":
    main()
