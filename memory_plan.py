"""The memory a run needs per GPU, from the models' config.json files alone (no weights), the flags and the process
count. Every training script prints it at start-up; `--plan_only` prints it and exits without loading anything:

    WORLD_SIZE=8 python dpo_humanline.py --plan_only --model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct ...

What it counts, per process (W processes, P parameters, FSDP2 shards the fp32 states):
- sharded states: fp32 weights of the policy and of each extra model (the two-model reference, GRPO's frozen
  initial policy), the policy's fp32 gradient (kept sharded across micro-batches) and AdamW's two moments;
- gathered weights: FSDP2 gathers a decoder layer at a time (this one and the next, prefetched) in --precision and
  keeps the root (embeddings, final norm, head) gathered in the head's dtype; one process instead holds one copy,
  plus autocast's bf16 copy of every weight when computing in bf16 (with --gradient_checkpointing of one layer:
  autocast's cache ends with the forward, and each layer's recompute casts its weights again);
- activations of the longest micro-batch (its sequences x --max_length tokens): every decoder layer's saved
  tensors, or with --gradient_checkpointing each layer's input plus one layer's recompute. The bytes per token and
  layer are measured (tests/test_gpu_path.py): fp32 24d + 16f + 8q + 8kv, bf16 26d + 8f + 4q + 4kv, for hidden
  size d, MLP size f, q = heads x head_dim and kv = key-value heads x head_dim;
- the log-prob head: the fp32 final hidden states of the completion positions, and one chunk of fp32 logits with
  its softmax and gradient;
- generation (online runs; evaluation): the whole policy gathered once for the call, the KV cache of the largest
  generate call (--generation_batch_size sequences of --max_prompt_length + --max_new_tokens) and its fp32
  next-token logits, beside the sharded states (gradients are freed by then);
- a reward model, replicated on every process in --precision, and its forward on --reward_batch_size sequences;
- with --lora_r: the frozen base in --precision (its only copy), the adapters' fp32 weights, gradients and AdamW
  moments (their count from the model built on the meta device), checkpointed layer inputs in the base's dtype.
- with --lora_r in bf16: head_logps' fp32 copy of the frozen bf16 head (one process), and the layers' activations
  at fp32's bytes (peft computes each adapter on an fp32 copy of its input; measured).
The peak is the largest of the training, generation and scoring phases, plus what all keep (sharded states, the
reward model's weights), plus 1 GiB for the CUDA context on a GPU. It is an estimate: the tests hold it within 20%
of peaks measured on a CPU, in fp32 and in bf16. Saving gathers the model in host memory on process 0: the plan
states how much beside a checkpoint's size.
"""

import math
import os
from types import SimpleNamespace

GIB = 2**30
CHUNK = 1024  # positions per head chunk: token_logps' default


def shapes(config):
    """The sizes the plan needs from a transformers config: parameters counted on a model built on the meta device
    (any family transformers builds), activations from a Llama-like decoder's sizes."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    d, layers, heads = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    # the MLP's width under its families' names (GPT-2 and GPT-J: n_inner, OPT: ffn_dim; None means 4 d)
    widths = [getattr(c, k, None) for k in ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")]
    f = next(filter(None, widths), 4 * d)
    hd = getattr(c, "head_dim", None) or d // heads
    q, kv = heads * hd, (getattr(c, "num_key_value_heads", None) or heads) * hd
    bias = q + 2 * kv if getattr(c, "attention_bias", False) or c.model_type.startswith("qwen2") else 0
    layer = d * q + 2 * d * kv + q * d + bias + 3 * d * f + 2 * d  # a Llama layer, where the model cannot be built
    tied = getattr(c, "tie_word_embeddings", False)
    root = c.vocab_size * d * (1 if tied else 2) + d
    params = layers * layer + root
    built = counted(config)
    if built:
        params, layer = built.params, built.layer
        root = params - layers * layer
    return SimpleNamespace(
        d=d, f=f, q=q, kv=kv, layers=layers, vocab=c.vocab_size, layer=layer, root=root, params=params, tied=tied
    )


def counted(config, cache={}):
    """What the plan reads of the causal LM a config builds, on the meta device (no memory, about a second at 8B):
    its parameters, its largest decoder layer's, its linear layers (name, in + out), the modules an adapter cannot
    train (embeddings, the head) and whether it has learned positions; None for a config transformers cannot build
    alone (remote code, a reward model)."""
    import torch
    import transformers

    key = config.to_json_string()
    if key not in cache:
        try:
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(config)
        except Exception:  # noqa: BLE001 (whatever stops a family building here, the arithmetic below stands in)
            cache[key] = None
            return None
        layers = [m for m in model.modules() if type(m).__name__ in (model._no_split_modules or [])]
        size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        head, conv1d = model.get_output_embeddings(), transformers.pytorch_utils.Conv1D  # (GPT-2's linear layers)
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, conv1d))]
        linears = [(n.rsplit(".", 1)[-1], sum(m.weight.shape)) for n, m in linears if m is not head]  # r (in + out)
        # an adapter on these is never read by the log-prob head (the head) or merged (embeddings): not trainable
        fixed = [n for n, m in model.named_modules() if m is head or isinstance(m, torch.nn.Embedding)]
        learned = sum(isinstance(m, torch.nn.Embedding) for m in model.modules()) > 1  # a table of positions
        params, layer = size(model), max(map(size, layers), default=0)
        cache[key] = SimpleNamespace(params=params, layer=layer, linears=linears, fixed=fixed, learned=learned)
    return cache[key]


def positions(config):
    """The longest sequence a model with learned position embeddings (GPT-2, OPT) reads; None for rotary and others."""
    built = counted(config)
    return built and built.learned and config.get_text_config().max_position_embeddings or None


def misfits(args, config):
    """(stop, message) for flags the model's config rules out: a sequence past its learned positions (an IndexError
    at step 0, not a message, if it started)."""
    n = positions(config)
    past = f"--max_length {args.max_length} is above the {n} positions of {args.model_name_or_path}"
    return [(n and args.max_length > n, past)]


def adapter_params(config, args):
    """--lora_r's trained parameters: r (in + out) for each linear layer --lora_target_modules names (all-linear: all
    but the head); where the model cannot be built, a Llama's seven projections per layer. Names that match no linear
    layer stop here, before any weights load."""
    s, built, names = shapes(config), counted(config), args.lora_target_modules.split(",")
    d, f, q, kv = s.d, s.f, s.q, s.kv
    llama = dict(
        q_proj=d + q, k_proj=d + kv, v_proj=d + kv, o_proj=q + d, gate_proj=d + f, up_proj=d + f, down_proj=f + d
    )
    linears = built.linears if built else list(llama.items()) * s.layers
    fixed = [n for n in built.fixed for t in names if n == t or n.endswith("." + t)] if built else []
    why = "an embedding's or the head's adapter is neither read by the log-prob head nor merged: name linear layers"
    if fixed:
        raise SystemExit(f"--lora_target_modules {args.lora_target_modules}: {', '.join(fixed)}: {why}")
    a = args.lora_r * sum(w for n, w in linears if args.lora_target_modules == "all-linear" or n in names)
    if not a and built:
        found = ", ".join(sorted({n for n, _ in linears}))
        raise SystemExit(f"--lora_target_modules {args.lora_target_modules}: names no linear layer (they are: {found})")
    return a


def act_bytes(s, bf16):
    """Saved activation bytes per token of one decoder layer (measured, see the module docstring)."""
    return 26 * s.d + 8 * s.f + 4 * s.q + 4 * s.kv if bf16 else 24 * s.d + 16 * s.f + 8 * s.q + 8 * s.kv


def fill_defaults(args, world):
    """Unset --micro_batch_size and --save_total_limit. The toy's (or a copy's) keep one forward per step and every
    checkpoint, as its committed figures were run; another model takes 4 sequences (DPO: pairs) a forward, or the
    largest divisor of its per-process share below that (the whole share was 232 GiB for a 1.5B model's batch of
    32 pairs on one process), and keeps the newest 2 checkpoints (resume needs one; at 8B each is about 105 GiB).
    Returns the policy's config (the plan's, read once) and whether the model is the toy's or a copy of it."""
    config = read_config(args.model_name_or_path, args)
    toy = config.vocab_size == read_config("toy", args).vocab_size
    share = max(1, args.batch_size // world)
    small = max(d for d in range(1, min(4, share) + 1) if share % d == 0)
    args.micro_batch_size = args.micro_batch_size or (share if toy else small)
    if args.save_total_limit is None:
        args.save_total_limit = 0 if toy else 2
    return config, toy


def at_start(args, script, world, config):
    """(rows, the lines a run prints): the plan, from the configs alone on every process (so that none is late to the
    start), for a GPU where there is one or with --plan_only, which prints the table and ends the run here."""
    import sys

    import torch

    rows = plan(args, script, world, config=config, gpu=args.plan_only or torch.cuda.is_available())
    if args.plan_only:
        print(report(args, world, rows, config, details=True))
        sys.exit(0)
    return rows, report(args, world, rows, config)


def plan(args, script, world, config=None, gpu=True):
    """Bytes per process by component: a list of (name, bytes, phase), phase 'train', 'generate', 'score' or 'both'.
    `config`: the policy's transformers config (read from --model_name_or_path if None)."""
    config = config or read_config(args.model_name_or_path, args)
    scorers = {args.reward_model} if args.eval_prompts != "none" else set()
    if args.online:  # GRPO samples with --reward_funcs, DPO and KTO with --reward_model
        scorers |= set((getattr(args, "reward_funcs", "") or args.reward_model).split(","))
    reward_configs = [read_config(name, args) for name in sorted(scorers) if is_model(name)]
    s, W = shapes(config), world
    bf16, head32 = args.precision == "bf16", getattr(args, "fp32_head", True)
    b, bh = 2 if bf16 else 4, 4 if head32 or not bf16 else 2
    on_policy = script == "grpo" and args.on_policy()  # GRPO reuses the policy's own log-probs: no reference
    extra = (getattr(args, "ref_free", "on") == "off" and not on_policy) + (
        script == "grpo" and args.kl_baseline == "initial" and (args.online or args.sync != "none")
    )
    seqs = args.micro_batch_size * (2 if script == "dpo" else 1)  # DPO: chosen + rejected (KTO's KL rows: no grad)
    tokens, lora, sharded = seqs * args.max_length, args.lora_r, ", sharded" * (W > 1)
    if lora:  # the base frozen in --precision (its only copy: no extra model, no autocast copy); adapters in fp32
        a, synced = adapter_params(config, args), args.ref_free == "off" and not (args.offline and args.sync == "none")
        rows = [
            (f"base weights, {args.precision}, frozen{sharded or ', replicated' * (W > 1)}", s.params * b / W, "both"),
            (
                f"adapters (r = {lora}, {a / 1e6:.1f}M): fp32 weights + AdamW"
                + " + the reference's" * synced
                + sharded,
                a * (12 + 4 * synced) / W,
                "both",
            ),
            (f"adapter gradients, fp32{sharded}", a * 4 / W, "train"),
        ]
    else:
        rows = [
            (
                f"weights, fp32{sharded}" + (f" (policy + {extra} more)" if extra else ""),
                (1 + extra) * s.params * 4 / W,
                "both",
            ),
            (f"gradients, fp32{sharded}", s.params * 4 / W, "train"),
            (f"AdamW moments, fp32{sharded}", 8 * s.params / W, "both"),
        ]
    if W > 1:
        rows.append(("gathered: root in the head's dtype, two layers", s.root * bh + 2 * s.layer * b, "train"))
    elif bf16 and not lora and not args.gradient_checkpointing:  # cached by autocast, saved for the backward
        rows.append(("autocast's bf16 copy of the weights", s.params * 2, "train"))
    elif bf16 and not lora:  # checkpointed: each layer is cast again in its recompute, freed after its backward
        rows.append(("autocast's bf16 copy of one layer (recomputed)", s.layer * 2, "train"))
    layer_act = act_bytes(s, bf16 and not lora)  # peft casts each adapter's input to fp32: LoRA saves fp32's bytes
    if args.gradient_checkpointing:  # each layer's input (the residual stream: fp32, LoRA's in the base's dtype)
        acts, how = tokens * (s.layers * s.d * (b if lora else 4) + layer_act), ", checkpointed"
    else:
        acts, how = tokens * s.layers * layer_act, ""
    rows.append((f"activations: {seqs} x {args.max_length} tokens{how}", acts, "train"))
    rows.append(
        (
            "log-prob head: fp32 hidden states + one chunk of logits",
            tokens * s.d * 4 + 3 * min(CHUNK, tokens) * s.vocab * 4,
            "train",
        )
    )
    if lora and bf16 and head32 and W == 1:  # head_logps casts the frozen bf16 head to fp32 in each chunk's call
        rows.append(("log-prob head: the bf16 head's fp32 copy", s.vocab * s.d * 4, "train"))
    n = (args.num_samples if hasattr(args, "num_samples") else args.num_generations) if args.online else 1
    per_process = (
        math.ceil(prompts_per_sampling(args, script) / W)
        if args.online
        else math.ceil(args.num_eval_prompts / W)
        if args.eval_prompts != "none"
        else 0
    )
    if per_process:
        gen = min(max(1, args.generation_batch_size // n), per_process) * n
        length = args.max_prompt_length + args.max_new_tokens
        gathered = (s.params - s.root) * b + s.root * bh if W > 1 else s.params * 2 if bf16 and not lora else 0
        rows += [
            (
                "generation: the policy gathered" if W > 1 else "generation: autocast's bf16 weights",
                gathered,
                "generate",
            ),
            (f"generation: KV cache, {gen} x {length} tokens", gen * length * 2 * s.layers * s.kv * b, "generate"),
            ("generation: next-token logits, fp32", gen * s.vocab * 4 * 3, "generate"),
        ]
    for reward_config in reward_configs:
        r = shapes(reward_config)
        rows += [
            ("reward model, replicated", (r.params - r.vocab * r.d * (0 if r.tied else 1)) * b, "both"),
            (
                f"reward model forward: {args.reward_batch_size} sequences",
                args.reward_batch_size * args.max_length * (4 * r.d + 3 * r.f) * b,
                "score",
            ),
        ]
    if gpu:
        rows.append(("CUDA context and allocator slack", GIB, "both"))
    return rows


def report(args, world, rows, config, details=False):
    """What a run prints at start-up: the peak and a checkpoint's size, or with `details` (--plan_only) the table."""
    per_process = f"{world} process{'es' * (world > 1)}, {args.precision}, micro-batches of {args.micro_batch_size}"
    kept = f"{args.save_total_limit or 'all'} kept (--save_total_limit)"
    size = checkpoint_bytes(config, args)
    mib = size / 2**20  # (the toy's: a few MiB; its LoRA adapters: under one)
    on_disk = f"{size / GIB:.1f} GiB" if size >= GIB else f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.2g} MiB"
    ckpt = f"a checkpoint: {on_disk} on disk, {kept}"
    host = saving_bytes(config, args)
    when = "the final merged model" if args.lora_r else "each checkpoint"
    saving = f"saving {when} takes {host / GIB:.1f} GiB of host memory on process 0"
    if details:
        return table(rows, per_process) + f"\n  {ckpt}; {saving}"
    summary = f"memory plan: {peak(rows) / GIB:.2f} GiB per process at the peak ({per_process}; --plan_only: details)"
    return f"{summary}; {ckpt}" + f"; {saving}" * (host > peak(rows))


def saving_bytes(config, args):
    """The host (CPU) memory process 0 gathers the model in to save it: every checkpoint in fp32, or with --lora_r the
    final merged model in the base's dtype (merged a weight at a time, each cast before the next)."""
    return shapes(config).params * (2 if args.lora_r and args.precision == "bf16" else 4)


def checkpoint_bytes(config, args):
    """A checkpoint's files: the model in its own dtype, and the fp32 weights and AdamW's two moments of every
    process's shard (12 bytes a parameter in all); with --lora_r the adapters alone, fp32 (16 bytes a parameter)."""
    if args.lora_r:
        return adapter_params(config, args) * 16
    dtype = str(getattr(config, "dtype", None) or "float32")
    return shapes(config).params * ((2 if "16" in dtype else 4) + 12)


def stop_if_over(args, world, rows, config, rank0):
    """On a GPU: a run whose plan is above the device's memory prints the table and stops with one line (unless
    --ignore_memory_plan)."""
    import torch

    if not torch.cuda.is_available() or args.ignore_memory_plan:
        return
    device = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", 0))).total_memory
    if peak(rows) > device:
        if rank0:
            print(report(args, world, rows, config, details=True))
        raise SystemExit(too_big(rows, device, args))


def too_big(rows, device, args):
    """The one line a GPU run whose plan does not fit stops with: the flags that lower its largest phase."""
    phase = max(("train", "generate", "score"), key=lambda p: sum(v for _, v, q in rows if q == p))
    lower = {
        "train": "--micro_batch_size, --max_length" + ", --gradient_checkpointing" * (not args.gradient_checkpointing),
        "generate": "--generation_batch_size, --max_new_tokens" + ", --num_eval_prompts" * (not args.online),
        "score": "--reward_batch_size",
    }[phase]
    return (
        f"memory plan: {peak(rows) / GIB:.1f} GiB per process at the peak, above this GPU's {device / GIB:.1f} GiB "
        f"(most in {phase}): lower {lower}, or add processes; --ignore_memory_plan starts anyway (an estimate)"
    )


def peak(rows):
    both = sum(v for _, v, p in rows if p == "both")
    return both + max(sum(v for _, v, p in rows if p == phase) for phase in ("train", "generate", "score"))


def table(rows, per_process="", gpu_gib=80):
    """The plan as a table, with the peak and whether it fits a GPU of `gpu_gib`."""
    out = [f"memory plan per process ({per_process}), GiB ({'phase':>8}: 'both' is held throughout)"]
    out += [f"  {name:<58} {phase:>8} {v / GIB:8.2f}" for name, v, phase in rows if v]
    total = peak(rows) / GIB
    out.append(
        f"  {'peak: the largest phase + both':<58} {'':>8} {total:8.2f}"
        + (
            ""
            if total <= gpu_gib
            else f"  > {gpu_gib} GiB: see --gradient_checkpointing, --micro_batch_size, --generation_batch_size"
        )
    )
    return "\n".join(out)


def prompts_per_sampling(args, script):
    """Prompts sampled at once: a round, or GRPO's --sample_every steps of groups."""
    if script != "grpo" or args.pairs_from_samples:
        return args.round_size
    return args.sample_every * args.batch_size // args.num_generations


def peak_memory_gib(device):
    """What a run measures and logs: peak CUDA memory allocated, or on a CPU the process's peak resident set size."""
    import resource
    import sys

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)


def is_model(name):
    """A reward model to load, not a built-in scorer (the scripts' make_scorer) or a module:function."""
    import math_rewards

    builtin = ("toy", "toy_verify", *math_rewards.REWARD_FUNCS)
    return name not in builtin and not (":" in name and not os.path.exists(name))


def read_config(name, args):
    from transformers import AutoConfig

    if name == "toy":
        import toy_task

        name = os.path.join(toy_task.INSTANCE_DIR, "model")
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=getattr(args, "trust_remote_code", False))
    except (OSError, ValueError) as e:
        raise SystemExit(f"{name}: {str(e).strip().splitlines()[0]}") from None
