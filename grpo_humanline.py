"""Offline, online and humanline GRPO in one file: the method and the whole loop, in run order.

Humanline (Liu, Muennighoff, Ethayarajh 2025, https://arxiv.org/abs/2509.24207) makes two changes to
an alignment objective so that offline data trains like online data (lines tagged HUMANLINE):
1. syncing: every `--sync_every` k steps, after the gradients are clipped and before the update,
   the reference takes the policy's weights (with k = 1 it is the policy of the step before);
2. clamping: each token's log-ratio log pi_theta - log pi_ref is clamped to [-1.5, 1.5]
   (`--log_eps_P`, `--log_eps_R`): a clamped token passes no gradient; GRPO's clip follows.

The loss (eq. 1), per completion token of output i of a group, averaged over the step:
    -min(r A_i, clip(r, 1 - eps, 1 + eps) A_i) + beta KL_t,   A_i = (R_i - mean R) / std R,
    r = pi_theta / pi_ref,   KL_t = exp(q - p) - (q - p) - 1 (k3; p the policy's, q the baseline's).

Modes: `--offline` (default; Algorithm 2: each preference pair a group of two, advantages +1 and
-1, the reference frozen at the initial policy); `--online` (every `--sample_every` N steps the
policy samples `--num_generations` completions per prompt for the next N steps, scored by
`--reward_funcs`; N = 1 is on-policy, the paper's math runs take 64; without --sync the ratio's
denominator is the sampler, PPO's theta_old); `--online --pairs_from_samples` (Algorithm 1's pairs
as groups of two); `--humanline` on any (= `--sync humanline --clip clamp`). Ablations: `--sync
trust_region`, `--clip sampling`. One GPU: `--lora_r 16`, LoRA adapters on a frozen base.

Where this script departs from the paper (with flags: docs/paper-runs.md):
1. No second model holds the reference (`--ref_free on`): at each sync the policy computes the
   log-probs the reference would give (the same values).
2. The loss is normalised over the step's tokens (both authors' codes: per micro-batch).
3. Groups of two get advantages -1 and +1 exactly; the authors' code divides by std + 0.01.
4. Math, where the paper is silent: KL 0.01 to the ratio's denominator, clip 0.15, log-probs
   at temperature 1 (the authors' 1e-4, 0.2, 0.7: docs/paper-runs.md's math command).
5. Dropout is off (`--keep_dropout`); the learning rate decays (`--lr_scheduler`).

    python grpo_humanline.py --offline --humanline    # the toy task on a CPU, ~30 seconds
    torchrun --standalone --nproc_per_node 8 grpo_humanline.py --humanline --micro_batch_size 8 \\
        --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct --lr_scheduler constant \\
        --dataset princeton-nlp/llama3-ultrafeedback-armorm --dataset_split "train[:10000]" \\
        --eval_prompts none --gradient_checkpointing    # the math runs: docs/paper-runs.md
"""

import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from types import SimpleNamespace
from typing import Literal, NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.utils.checkpoint
import transformers
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import data_formats  # TRL's dataset formats: each row checked, tokenised
import humanline_sampling
import lora  # --lora_r: the reference without a second copy of the base (--ref_free off)
import math_rewards
import plumbing  # how a run is kept (checks, checkpoints, logging), and online sampling and scoring
import ref_free  # the default reference (--ref_free on): no second model
from plumbing import RunArgs, arg


@dataclass
class Args(RunArgs):  # RunArgs: how a run is kept
    # mode
    offline: bool = arg(False, "Algorithm 2: each pair a group of two (implied unless --online).")
    online: bool = arg(False, "Sample groups of --num_generations every --sample_every steps.")
    humanline: bool = arg(False, "= --sync humanline --clip clamp.")
    pairs_from_samples: bool = arg(False, "Online: Algorithm 1's (best, worst) pairs in rounds.")
    # model and data
    model_name_or_path: str = arg("toy", "'toy' (the built-in task) or a causal LM.")
    dataset: str = arg("toy", "Pairs (online: prompt or problem): toy, toy:weak, a hub name, file.")
    dataset_split: str = arg("train", "Split of --dataset (a file's: train), or 'train[:1000]'.")
    reward_model: str = arg("toy", "Evaluation scorer: toy, toy_verify, accuracy, a model, mod:fn.")
    reward_funcs: str = arg("", "Online rewards, scorer names (default toy_verify; pairs: toy).")
    reward_weights: str = arg("", "Their weights (default 1; tag_count, format, accuracy: 1, 1, 8).")
    keep_dropout: bool = arg(False, "Keep dropout (else off: it would swamp the log-ratios).")
    max_prompt_length: int = arg(512, "Longer prompts keep their last tokens (counted).")
    max_length: int = arg(1024, "Prompt + completion; longer completions are cut (counted).")
    # optimisation
    max_steps: Optional[int] = arg(None, "Optimizer steps; unset: one pass (the toy: 120).")
    batch_size: int = arg(64, "Sequences per optimizer step, over all processes.")
    micro_batch_size: Optional[int] = arg(None, "Sequences per forward per process; unset: all (toy), else 4.")
    gradient_checkpointing: bool = arg(False, "Recompute each layer in the backward (8B: on).")
    lora_r: int = arg(0, "LoRA rank: train adapters on the frozen base (0: train every weight).")
    lora_alpha: float = arg(16.0, "LoRA scale: each adapted weight is W + alpha / r x B A.")
    lora_target_modules: str = arg("all-linear", "all-linear, or names, e.g. q_proj,v_proj")
    learning_rate: float = arg(5e-6, "Peak learning rate (paper: 5e-6; math 1e-6).")
    warmup_ratio: float = arg(0.1, "Linear warmup over this fraction of the steps.")
    lr_scheduler: Literal["linear", "constant"] = arg("linear", "After warmup: decay to 0 or hold.")
    weight_decay: float = arg(0.01, "AdamW weight decay.")
    adam_eps: float = arg(1e-5, "AdamW epsilon.")
    max_grad_norm: float = arg(1.0, "Gradient clipping norm.")
    beta: float = arg(0.01, "KL coefficient (k3 estimator, against --kl_baseline).")
    eps: Optional[float] = arg(None, "Ratio clip [1 - eps, 1 + eps]; 0.5 plain offline, else 0.15.")
    logps_temperature: float = arg(1.0, "Log-probs of logits / T (authors' math: sampling's T).")
    advantage_std: Literal["population", "sample"] = arg("population", "std R in A, or sample (n-1, +1e-4).")
    kl_baseline: Literal["reference", "initial"] = arg("reference", "KL to the ratio's denominator or the initial.")
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
    num_generations: int = arg(8, "G: completions sampled per prompt.")
    sample_every: int = arg(1, "Sample every N steps the data of N steps (1: on-policy; math: 64).")
    round_size: int = arg(256, "--pairs_from_samples: prompts per round (paper: 1024).")
    temperature: float = arg(0.7, "Sampling temperature.")
    top_p: float = arg(0.95, "Nucleus sampling.")
    max_new_tokens: int = arg(40, "Longest sampled completion (paper: 2048).")
    reward_threshold: float = arg(0.01, "--pairs_from_samples: keep a pair if best - worst >= tau.")

    def on_policy(self):  # sampled every step and never synced: no reference is kept (memory_plan asks it too)
        return self.online and self.sample_every == 1 and not self.pairs_from_samples and self.sync == "none"


def flag_checks(a, given):  # GRPO's own, beside parse_args' checks of every flag: (bad, its line)
    online_only = a.offline and given & {"sample_every", "reward_funcs", "reward_weights"}
    pairs_only = a.online and not a.pairs_from_samples and given & {"round_size", "reward_threshold"}
    funcs = (a.reward_funcs or "x").split(",")
    weights = (a.reward_weights or a.reward_funcs or "x").split(",")
    idle_beta = "--beta: on-policy the KL is to the sampler, the policy itself, so 0; --kl_baseline initial"
    return [
        (a.num_generations < 2 or a.sample_every < 1, "--num_generations >= 2, --sample_every >= 1"),
        (a.pairs_from_samples and (a.offline or a.sample_every > 1), "--pairs_from_samples: online"),
        (a.eps is not None and a.eps <= 0, f"--eps must be above 0, got {a.eps}"),
        (a.beta < 0 or a.logps_temperature <= 0, "--beta >= 0 and --logps_temperature > 0"),
        (online_only, "--sample_every, --reward_funcs and --reward_weights act only with --online"),
        (pairs_only, "--round_size and --reward_threshold act only with --pairs_from_samples"),
        (a.batch_size % group_size(a), f"--batch_size {a.batch_size}: a multiple of the group size {group_size(a)}"),
        (len(weights) != len(funcs), f"--reward_weights {a.reward_weights}: one per reward func"),
        (a.on_policy() and a.kl_baseline == "reference" and "beta" in given, idle_beta),
        (a.kl_baseline == "initial" and a.beta == 0, "--kl_baseline initial acts only with --beta above 0"),
        (a.on_policy() and "ref_free" in given, "--ref_free: on-policy GRPO has no reference"),
    ]


# ALGO LOGIC: the groups, advantages and the loss (eq. 1, appendix C.1)
def group_size(args):  # a pair offline and with --pairs_from_samples, else G samples of a prompt
    return 2 if args.offline or args.pairs_from_samples else args.num_generations


def group_advantages(rewards, group_size, std="population"):
    """A_i = (R_i - mean R) / std R within each group (population std), rewards (n,) group after
    group. A group of equal rewards gets 0; one of two distinct rewards exactly -1, +1.
    std="sample": (R_i - mean R) / (std R + 1e-4), the n - 1 std, as the authors' math code."""
    r = rewards.reshape(-1, group_size)  # (groups, group_size)
    centred = r - r.mean(-1, keepdim=True)  # R_i - mean R
    if std == "population":
        std = r.std(-1, unbiased=False, keepdim=True)
        equal = (r == r[:, :1]).all(-1, keepdim=True)  # exact: a rounded mean may leave a tiny std
        scaled = centred / torch.where(equal, torch.ones_like(std), std)
        pair = torch.sign(r - r.flip(-1))  # a pair: the formula's value exactly, sign(R_i - R_j)
        return torch.where(equal, 0.0, pair if group_size == 2 else scaled).reshape(-1)
    return (centred / (r.std(-1, keepdim=True) + 1e-4)).reshape(-1)  # std="sample"


class Sequence(NamedTuple):  # what a step trains on: a completion of a prompt, its advantage and reward
    prompt_ids: list
    completion_ids: list
    advantage: float  # A_i, of its group
    reward: float  # R_i


def group_sequences(groups, std="population"):
    """ALGO LOGIC: groups (prompt_ids, [completion_ids], rewards) -> Sequences, group after group."""
    out = []
    for p, completions, rewards in groups:
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), len(rewards), std).tolist()
        out += [Sequence(p, c, a, r) for c, a, r in zip(completions, advantages, rewards)]
    return out


def grpo_loss(
    policy_logps,
    ref_logps,
    baseline_logps,
    mask,
    advantages,
    eps,
    beta,
    log_eps_P=None,
    log_eps_R=None,
    num_tokens=None,
    rejected=None,
):
    """GRPO (eq. 1): the mean over valid tokens of -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta KL,
    r = exp(policy - ref), KL = exp(q - p) - (q - p) - 1, p policy_logps, q baseline_logps (k3).
    Tensors (batch, seq), mask 1 on completion tokens, advantages (batch,). The mean divides by
    `num_tokens` if given (DAPO: the step's valid tokens, so the micro-batches' losses sum to the
    step's), else mask.sum(). With both bounds each token log-ratio is clamped first, then GRPO's
    clip applies; `rejected` (--clip sampling) detaches those tokens' ratios instead. KL is of the
    unclamped log-probs. ref_logps: the reference's (frozen or synced), else online the sampler's."""
    log_ratio = policy_logps - ref_logps  # (batch, seq)
    if log_eps_P is not None and log_eps_R is not None:
        log_ratio = log_ratio.clamp(log_eps_P, log_eps_R)  # HUMANLINE: clamp per token
    if rejected is not None:  # the ablation: rejected tokens pass no gradient through the ratio
        log_ratio = torch.where(rejected, log_ratio.detach(), log_ratio)
    ratio = log_ratio.exp()  # (batch, seq)
    a = advantages[:, None].to(ratio.dtype)  # (batch, 1): each sequence's on all its tokens
    surrogate = torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)  # (batch, seq)
    d = baseline_logps - policy_logps  # (batch, seq)
    kl = d.exp() - d - 1  # (batch, seq), k3: >= 0, and 0 where the two agree
    n = mask.sum() if num_tokens is None else num_tokens
    loss = ((-surrogate + beta * kl) * mask).sum() / n  # a scalar; mask (batch, seq): completions
    valid = mask.bool()
    metrics = {  # per valid token: their mean over the step is its value (so is "loss")
        "loss": (-surrogate + beta * kl).detach()[valid],
        "kl": kl.detach()[valid],
        "clip_frac": (((ratio > 1 + eps) & (a > 0)) | ((ratio < 1 - eps) & (a < 0))).float()[valid],
        "ratio/abs_log": (policy_logps - ref_logps).detach().abs()[valid],
        "logps": policy_logps.detach()[valid],
    }
    return loss, metrics


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
    """Per micro-batch, (its Sequences, their token ids (prompt_ids, completion_ids))."""
    return [(m, [(s.prompt_ids, s.completion_ids) for s in m]) for m in micro_batches(batch, args, rank, world)]


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


def make_reference(args, policy, rt, step_inputs, wait):
    """(reference, base): the ratio's denominator and the KL's baseline (None: the reference)
    | flags (the first row that holds) | reference |
    | on-policy (online, N = 1, no --sync) | None: the policy's own log-probs, detached |
    | --ref_free off --lora_r r | lora.AdapterReference: the base with synced adapters, or none |
    | --ref_free off | ReferenceModel: a second model, sharded exactly like the policy |
    | --ref_free on (default) | REF-FREE: the policy's log-probs where it would take its weights |
    | base: --kl_baseline initial, online or --sync | the start: the adapterless base, or a model |"""
    if args.on_policy():
        reference = None
    elif args.ref_free == "off" and args.lora_r:
        frozen = args.offline and args.sync == "none"  # never synced: the base without adapters
        reference = lora.AdapterReference(policy, token_logps, rt, frozen=frozen, temperature=args.logps_temperature)
    elif args.ref_free == "off":
        reference = ReferenceModel(load_model(args, rt), rt, args.logps_temperature)
    else:  # REF-FREE: the policy computes the reference's log-probs where it would take its weights
        due = partial(sync_due, sync_every=args.sync_every) if args.sync != "none" else None
        reference = ref_free.PolicyAsReference(
            policy, step_inputs, token_logps, rt, due, args.max_steps, wait, args.logps_temperature
        )
    if args.kl_baseline != "initial" or not (args.online or args.sync != "none"):
        return reference, None  # the KL's baseline is the reference
    if args.lora_r:  # the base with the adapters disabled: no second copy of it
        base = lora.AdapterReference(policy, token_logps, rt, frozen=True, temperature=args.logps_temperature)
        return reference, base
    return reference, ReferenceModel(load_model(args, rt), rt, args.logps_temperature)


def make_optimizer(policy, args):
    """Fused AdamW (5x for-each's speed on a CPU); warmup over --warmup_ratio, then decay to 0 or hold."""
    adamw = dict(lr=args.learning_rate, eps=args.adam_eps, weight_decay=args.weight_decay)
    optimizer = torch.optim.AdamW(policy.parameters(), **adamw, fused=True)
    warmup, end = max(1, int(args.warmup_ratio * args.max_steps)), args.max_steps
    after = (lambda s: max(0.0, (end - s) / max(1, end - warmup))) if args.lr_scheduler == "linear" else (lambda s: 1.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, after(s)))


def main():
    # ---- 1. flags, the values they leave to the run (filled here), processes, tokenizer ----------
    args = plumbing.parse_args(Args, "grpo", flag_checks)  # a bad flag stops with one line
    if args.eps is None:  # the paper: 0.5 for plain offline GRPO, 0.15 for everything else
        args.eps = 0.5 if args.offline and args.sync == "none" and args.clip == "none" else 0.15
    args.reward_funcs = args.reward_funcs or ("toy" if args.pairs_from_samples else "toy_verify")
    args.reward_weights = args.reward_weights or math_rewards.default_weights(args.reward_funcs.split(","))
    # prompts a round samples: --round_size's (pairs), else --sample_every steps' groups
    per_round = args.round_size if args.pairs_from_samples else args.sample_every * args.batch_size // group_size(args)
    rt = setup(args)  # the runtime: processes, device, dtypes
    tokenizer = plumbing.load_tokenizer(args)

    # ---- 2. data: every row checked before any model loads (bad data stops a run in seconds) -----
    if args.offline:  # ALGO LOGIC: Algorithm 2: a pair is a group of two, chosen ranked first
        rows = data_formats.load_data(args, "preferences", tokenizer, rt, need=args.batch_size // 2)
        train_groups = [(row.prompt_ids, row.completions, [1.0, 0.0]) for row in rows]
        plumbing.plan_run(args, len(train_groups), args.batch_size // 2, "pairs", rt.rank)
    else:
        train_prompts = data_formats.load_data(args, "prompts", tokenizer, rt, need=per_round)
        plumbing.plan_run(args, len(train_prompts), args.batch_size // group_size(args), "prompts", rt.rank)
    eval_prompts = data_formats.load_data(args, "eval", tokenizer, rt)
    state = SimpleNamespace(step=0, round_index=0, round=[], round_start=0)

    def step_batch(s):  # step s's sequences: offline a function of s; online a slice of the round
        if args.offline:
            pairs = offline_batch(train_groups, s, args.batch_size // 2, args.seed)
            return group_sequences(pairs, args.advantage_std)
        i, b = s - state.round_start, args.batch_size
        return state.round[i * b : (i + 1) * b] if i < len(state.round) // b else None

    def step_inputs(s):  # step s's micro-batches as the models read them (None until sampled)
        batch = step_batch(s)
        forwards = batch and forward_batches(batch, args, rt.rank, rt.world)
        return forwards and [collate(token_ids, tokenizer.pad_token_id, rt.device) for _, token_ids in forwards]

    # ---- 3. models: the policy, its reference and KL baseline, the scorers; the optimizer --------
    policy = load_model(args, rt).train()
    reset_each_round = args.sync == "none" or args.pairs_from_samples  # else syncing spans rounds
    reference, base = make_reference(args, policy, rt, step_inputs, wait=args.online and not reset_each_round)
    funcs = zip(args.reward_funcs.split(","), args.reward_weights.split(",")) if args.online else []
    reward_fns = [(name, float(weight), plumbing.make_scorer(name, args, rt)) for name, weight in funcs]
    scorer = plumbing.make_scorer(args.reward_model, args, rt) if eval_prompts else None
    optimizer, scheduler = make_optimizer(policy, args)
    eps_P, eps_R = math.exp(args.log_eps_P), math.exp(args.log_eps_R)  # humanline's bounds as ratios (not --eps)
    sampling_params = humanline_sampling.limit_parameters(eps_P, eps_R, c=args.sampling_c)
    sampling_gen = torch.Generator(rt.device).manual_seed(plumbing.stream_seed(args.seed, "rejection", rt.rank))

    # ---- 4. the session (--resume restores state here, a round's items as Sequences), the start --
    session = plumbing.Session(
        args, rt, tokenizer, policy, optimizer, scheduler, sampling_gen, state, reference, item=Sequence
    )
    evaluate = partial(plumbing.evaluate, policy, tokenizer, scorer, eval_prompts, args, rt)
    if state.step == 0:  # (not when resuming)
        if reference is not None:
            reference.reset(policy, step=0)  # the reference starts as the initial policy
        if eval_prompts and args.eval_at_start:  # every curve starts at the starting policy
            session.log({"step": 0} | evaluate())

    # ---- 5. the loop; a round when the last one's sequences are spent ----------------------------
    rounds_per_pass = math.ceil(len(train_prompts) / per_round) if args.online else None
    while state.step < args.max_steps:
        t0, cpu0 = time.time(), time.process_time()
        if args.online and step_batch(state.step) is None:
            # ALGO LOGIC: the round is spent: sample the next (--sample_every steps' groups, or pairs);
            # the reference becomes the sampler (PPO's theta_old), unless syncing spans rounds
            groups, record = session.sample_round(reward_fns, train_prompts, per_round, args.num_generations)
            # a short round trained no step: its sequences, still on-policy, join this one's
            kept = state.round if state.step == state.round_start else []
            state.round_index, state.round_start = state.round_index + 1, state.step
            if args.pairs_from_samples:  # a round's pairs in random order, as online DPO
                pairs = best_worst_pairs(groups, args.reward_threshold)
                scored = plumbing.shuffled(pairs, args.seed, state.round_index)
                record["online/kept_frac"] = len(pairs) / len(groups)
            else:  # each prompt's samples a group (those whose reward failed left out)
                scored = plumbing.scored_groups(groups)
            state.round = kept + group_sequences(scored, args.advantage_std)
            if reference is not None and reset_each_round:
                reference.reset(policy, step=state.step)
            record = {"step": state.step, "online/round": state.round_index} | record
            zero_std = sum(len(set(r)) == 1 for _, _, r in scored) / max(1, len(scored))
            record |= {"online/groups": len(scored), "online/zero_std_frac": zero_std}
            record["online/steps"] = len(state.round) // args.batch_size
            session.log(record | {"online/seconds": time.time() - t0})
            # less than a batch: another round; a whole pass of such rounds ends the run
            ready = len(state.round) >= args.batch_size
            if session.end_of_round(ready, groups, rounds_per_pass, eval_prompts and evaluate):
                break
            continue

        # ---- 6. the step: a forward per model and micro-batch ------------------------------------
        # ALGO LOGIC: DAPO normalisation: the step's completion tokens, micro-batches and processes
        forwards = forward_batches(step_batch(state.step), args, rt.rank, rt.world)
        n_tokens = float(sum(len(c) for _, token_ids in forwards for _, c in token_ids))
        n_tokens = torch.tensor(n_tokens, dtype=torch.float64, device=rt.device)
        if rt.world > 1:
            dist.all_reduce(n_tokens)
        n_tokens = max(1.0, n_tokens.item())

        sums = {}
        for micro, (sequences, token_ids) in enumerate(forwards):
            inputs = collate(token_ids, tokenizer.pad_token_id, rt.device)
            with rt.autocast():  # ref_free's reference: computed at the last sync, reads no inputs
                ref_logps = reference.logps(state.step, micro, inputs) if reference else None
                base_logps = base.logps(state.step, micro, inputs) if base is not None else None
                policy_logps = token_logps(policy, *inputs, rt.head_dtype, args.logps_temperature)
            ref_logps = policy_logps.detach() if reference is None else ref_logps  # on-policy
            mask = inputs[2][:, 1:]  # the completion tokens, aligned with the log-probs
            # ALGO LOGIC: ref_logps: the ratio's denominator; base_logps: the KL's baseline
            rejected = None  # --clip sampling's mask: the loss detaches the ratio alone (its KL reads log-probs)
            if args.clip == "sampling":  # HUMANLINE: the ablation: rejected tokens are detached
                reject = humanline_sampling.rejection_mask
                rejected = reject(policy_logps, ref_logps, *sampling_params, generator=sampling_gen)
            loss, metrics = grpo_loss(
                policy_logps,
                ref_logps,
                ref_logps if base is None else base_logps,
                mask,
                advantages=torch.tensor([s.advantage for s in sequences], device=rt.device),
                eps=args.eps,
                beta=args.beta,
                log_eps_P=args.log_eps_P if args.clip == "clamp" else None,
                log_eps_R=args.log_eps_R if args.clip == "clamp" else None,
                num_tokens=n_tokens,
                rejected=rejected,
            )
            (loss * rt.world).backward()  # FSDP2 averages the gradients over processes
            clamped = plumbing.clamped_fraction(policy_logps, ref_logps, mask, args.log_eps_P, args.log_eps_R)
            metrics |= {"tokens": mask.sum(), "completion_length": mask.sum(-1), "humanline/clamped_frac": clamped}
            # a group scored all alike gives its sequences advantage 0: a step of only such has no reward signal
            metrics["grpo/no_signal"] = torch.tensor([float(s.advantage == 0) for s in sequences])
            if args.online:
                metrics["reward"] = torch.tensor([s.reward for s in sequences])
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
        if args.online:  # staleness: how many updates old the samples are
            record |= {"online/round": state.round_index, "online/staleness": state.step - 1 - state.round_start}
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
