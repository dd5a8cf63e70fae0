"""How a run is kept, imported by dpo_humanline.py, kto_humanline.py and grpo_humanline.py: the argument checks and
the run-management flags, seeds and provenance, Hugging Face loading (one process reads the weights), scorers,
generation and evaluation, checkpoints and resume, metrics.jsonl and trackers, signals. The data formats, read and
checked row by row, are data_formats.py's.

Each script holds the method and the whole loop: the loss, the reference and its sync, batching and log-probs, the
sharding, the optimizer, in run order. Run-keeping, online sampling and the default reference are imported. So a
few things here do shape what a step trains on, and a script says so where it uses them: online sampling and
scoring (Session.sample_round, sample_and_score) and which of a round's samples make groups (scored_groups); dropout
off unless --keep_dropout (build_model); --humanline read as --sync humanline --clip clamp (parse_args). The default
reference, without a second model, is ref_free.py's. This module is imported rather than copied (as CleanRL's scripts
import cleanrl_utils) because it is the same for the three methods: a fix is made once. It imports no script; a
script passes it what it needs of its own (its Args and checks, its token_logps for the check at load)."""

import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, NamedTuple, Optional

import numpy as np
import torch
import torch.distributed as dist
import transformers
from tqdm.auto import tqdm

import data_formats  # TRL's dataset formats, read and checked row by row
import lora  # --lora_r: LoRA adapters, from their build to the export
import math_rewards
import memory_plan
import toy_task


def arg(default, help):  # a flag: its default and its --help line
    return field(default=default, metadata={"help": help})


@dataclass
class RunArgs:
    """The flags of how a run is kept: data formats, evaluation, checkpoints, logging, processes and precision; each
    script's Args (the method, its data and optimisation, humanline, sampling) extends them."""

    eval_prompts: str = arg("toy", "Held-out prompts: 'toy' (test split), 'toy:valid', a hub name, a file, or 'none'.")
    as_chat: bool = arg(False, "Wrap plain-string prompts as a user message (chat template).")
    system_prompt: str = arg("", "With --as_chat, a system message: text, r1 (Open-R1's), humanline_math (paper's).")
    trust_remote_code: bool = arg(False, "Allow custom model code from the hub.")
    on_bad_reward: Literal["drop", "stop"] = arg("drop", "A NaN, None or raising reward: drop it (counted), or stop.")
    max_bad_steps: int = arg(3, "Steps with a non-finite loss are skipped; this many in a row stop the run.")
    generation_batch_size: int = arg(512, "Sequences per generate() call per process (KV cache).")
    reward_batch_size: int = arg(16, "Sequences per reward-model forward.")
    eval_every: int = arg(20, "Evaluate at step 0 and every N steps (0: only at the end).")
    eval_at_start: bool = arg(True, "Evaluate the starting policy at step 0 (--no_eval_at_start: not, e.g. known).")
    num_eval_prompts: int = arg(256, "Held-out prompts per evaluation.")
    keep_every_eval: bool = arg(False, "Also keep each evaluation's answers, as eval_samples-step<N>.jsonl.")
    output_dir: str = arg("", "Default: runs/<script>-<mode>-seed<seed>.")
    save_every: int = arg(50, "Checkpoint every N steps (0: only at the end).")
    save_total_limit: Optional[int] = arg(None, "Keep the newest N checkpoints (0: all); unset: 2, or all for the toy.")
    resume: bool = arg(False, "Continue from the newest checkpoint in --output_dir.")
    overwrite_output_dir: bool = arg(False, "Replace the run in --output_dir (else another run's folder is refused).")
    report_to: str = arg("none", "Also log to tensorboard, wandb, or both (tensorboard,wandb); metrics.jsonl always.")
    log_every: int = arg(1, "Write metrics every N steps.")
    dist_timeout: int = arg(1800, "Seconds a collective waits: a dead process stops the run.")
    plan_only: bool = arg(False, "Print the memory plan per GPU for these flags and exit (loads no weights).")
    ignore_memory_plan: bool = arg(False, "Start on a GPU even where the plan's peak is above its memory.")
    precision: Optional[Literal["bf16", "fp32"]] = arg(None, "Compute dtype (and LoRA's base); unset: bf16 on a GPU.")
    fp32_head: bool = arg(True, "LM head and log-softmax in fp32 under bf16 (--no_fp32_head: bf16).")

    def __post_init__(self):  # the built-in task's files (not a flag), found once: when a flag names the toy
        names = (self.model_name_or_path, self.dataset, self.eval_prompts)
        self.toy = (
            toy_task.load() if any(v == "toy" or v.startswith("toy:") for v in names) else None
        )  # digests checked


def every(step, n):  # step is a multiple of n (n = 0: never)
    return bool(n) and step % n == 0


# arguments, seeds, provenance
def parse_args(Args, name, checks):
    """Parse the flags, derive the mode, check every argument: a bad one stops the run with one line naming it."""
    parser = transformers.HfArgumentParser(Args)
    parser.error = lambda message: fail(True, message)  # one line, not argparse's usage block (e.g. a bad choice)
    parser.allow_abbrev = False  # --max_step is a typo, not --max_steps
    run = {f.name for f in fields(RunArgs)}  # --help: the method's flags first (a subclass's fields come last)
    for actions in [parser._actions] + [group._group_actions for group in parser._action_groups]:
        actions.sort(key=lambda action: action.dest in run)
    signal.signal(signal.SIGINT, lambda *_: fail(True, "interrupted before training began"))  # no traceback
    args, unknown = parser.parse_args_into_dataclasses(look_for_args_file=False, return_remaining_strings=True)
    fail(unknown, f"unknown arguments: {' '.join(unknown)} (--help lists them)")
    given = {f.name for f in fields(Args) if getattr(args, f.name) != f.default}  # set to other than their default
    typed = {word.split("=")[0] for word in sys.argv[1:]}  # the flags given, whatever their value (`--sync none` too)
    explicit = " ".join(f"--{k} {getattr(args, k)}" for k in ("sync", "clip") if f"--{k}" in typed)
    means = f"--humanline means --sync humanline --clip clamp: drop {explicit} or --humanline"
    fail(args.humanline and explicit, means)
    fail(args.offline and args.online, "choose one of --offline and --online")
    args.offline = not args.online
    if args.humanline:
        args.sync, args.clip = "humanline", "clamp"
    world = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's process count
    positive = "max_steps batch_size micro_batch_size sync_every max_bad_steps round_size max_new_tokens log_every "
    for rule, ok, flags in [
        ("at least 1", lambda v: v is None or v >= 1, positive + "generation_batch_size reward_batch_size"),
        ("at least 1", lambda v: v >= 1, "num_eval_prompts max_prompt_length dist_timeout"),
        ("above 0", lambda v: v > 0, "learning_rate adam_eps max_grad_norm temperature sampling_c lora_alpha"),
        ("at least 0", lambda v: v is None or v >= 0, "eval_every save_every save_total_limit weight_decay seed"),
        ("at least 0", lambda v: v >= 0, "lora_r"),
        ("in [0, 1)", lambda v: 0 <= v < 1, "warmup_ratio"),
        ("in (0, 1]", lambda v: 0 < v <= 1, "top_p"),
    ]:
        for flag in flags.split():
            fail(not ok(getattr(args, flag)), f"--{flag} must be {rule}, got {getattr(args, flag)}")
    fail(args.sync == "none" and args.sync_every != 1, f"--sync_every {args.sync_every} needs --sync or --humanline")
    trackers = f"--report_to {args.report_to}: none, tensorboard, wandb or tensorboard,wandb"
    fail(not set(args.report_to.split(",")) <= {"none", "tensorboard", "wandb"}, trackers)
    fail(args.system_prompt and not args.as_chat, "--system_prompt needs --as_chat (it is the chat's system message)")
    bounds = f"--log_eps_P < 0 < --log_eps_R is needed, got {args.log_eps_P}, {args.log_eps_R}"
    fail(not args.log_eps_P < 0 < args.log_eps_R, bounds)
    lengths = f"--max_prompt_length ({args.max_prompt_length}) must be below --max_length ({args.max_length})"
    fail(args.max_prompt_length >= args.max_length, lengths)
    longest = args.max_prompt_length + args.max_new_tokens
    cut = f"--max_prompt_length + --max_new_tokens = {longest} is above --max_length {args.max_length}: samples would"
    fail(args.online and longest > args.max_length, cut + " be cut before training")
    args.precision = args.precision or ("bf16" if torch.cuda.is_available() or args.plan_only else "fp32")
    for flag in ("model_name_or_path", "dataset", "eval_prompts", "reward_model"):
        value = getattr(args, flag)  # a path, not a hub name: it starts with ., / or ~ or ends in a data file's suffix
        local = value.startswith((".", "/", "~")) or os.path.splitext(value)[1] in data_formats.SUFFIXES
        fail(local and not os.path.exists(value), f"--{flag} {value}: no such file or directory")
        data, folder = flag in ("dataset", "eval_prompts"), os.path.isdir(value) and value != "toy"  # (the built-in)
        fail(folder and data, f"--{flag} {value}: a directory, not a data file")
        no_model = f"--{flag} {value}: no config.json, not a model folder (a run's model is written at its end)"
        fail(folder and not data and not os.path.exists(os.path.join(value, "config.json")), no_model)
    config, toy_model = memory_plan.fill_defaults(args, world)  # --micro_batch_size, --save_total_limit
    batch = f"--batch_size {args.batch_size} must be a multiple of --micro_batch_size x processes"
    fail(args.batch_size % (args.micro_batch_size * world), f"{batch} = {args.micro_batch_size} x {world}")
    misused = toy_task.misused(args) if not (toy_model or args.plan_only) else []  # the toy's defaults, a real model
    fail("sampling_c" in given and args.clip != "sampling", "--sampling_c acts only with --clip sampling")
    lora = "--lora_alpha and --lora_target_modules act only with --lora_r"
    fail(not args.lora_r and given & {"lora_alpha", "lora_target_modules"}, lora)
    fail(args.offline and given & {"temperature", "top_p"}, "--temperature and --top_p act only with --online")
    rounds = sorted(given & {"round_size", "num_samples", "reward_threshold"}) if hasattr(args, "num_samples") else []
    idle_rounds = f"--{', --'.join(rounds)}: online sampling's, idle offline (add --online)"  # DPO's, KTO's flags
    fail(args.offline and rounds, idle_rounds)
    scores = args.eval_prompts != "none" or args.online and not hasattr(args, "reward_funcs")  # GRPO: reward funcs
    idle = "--reward_model acts only with --eval_prompts (DPO's and KTO's also --online): here it scores nothing"
    fail("reward_model" in given and not scores, idle)
    misused += memory_plan.misfits(args, config)  # what the model's config rules out
    for bad, message in misused + checks(args, given):  # (--plan_only plans a run: it need not be ready to start)
        fail(bad, message)
    mode = ("online" if args.online else "offline") + ("-pairs" if getattr(args, "pairs_from_samples", False) else "")
    mode += f"-every{args.sample_every}" if getattr(args, "sample_every", 1) > 1 else ""
    mode += "-humanline" * args.humanline
    if not args.humanline and (args.sync != "none" or args.clip != "none"):
        mode += f"-sync_{args.sync}-clip_{args.clip}"
    settings = {k: getattr(args, k) for k in sorted(given - set(RESUMABLE) - set(MODE))}  # the rest, by their digest
    tag = "-" + hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:6] if settings else ""
    args.output_dir = args.output_dir or os.path.join("runs", f"{name}-{mode}{tag}-seed{args.seed}")
    rows, plan = memory_plan.at_start(args, name, world, config)  # --plan_only: printed, and the run ends there
    rank0 = int(os.environ.get("RANK", 0)) == 0  # (another node's processes may not see the folder: Session says so)
    fail(rank0 and args.resume and not checkpoints(args.output_dir), f"--resume: no checkpoint in {args.output_dir}")
    taken = os.path.exists(os.path.join(args.output_dir, "args.json")) and rank0
    replace = "holds another run: --resume continues it, --overwrite_output_dir replaces it"
    fail(taken and not (args.resume or args.overwrite_output_dir), f"--output_dir {args.output_dir} {replace}")
    if rank0:
        print(plan)
    memory_plan.stop_if_over(args, world, rows, config, rank0)  # on a GPU, a plan above its memory: not an hour in
    parent = args.output_dir  # it is made when training starts: now, check that it can be
    while not os.path.exists(parent):
        parent = os.path.dirname(parent) or "."
    writable = os.path.isdir(parent) and os.access(parent, os.W_OK)
    fail(not writable, f"--output_dir {args.output_dir}: not a writable folder")
    return args


def fail(condition, message):
    if condition:
        raise SystemExit(message)


STREAMS = ("init", "data", "prompts", "sampling", "shuffle", "rejection")


def stream_seed(seed, stream, *index):
    """The seed of one random stream of a run (data order of epoch i, sampling of round i, ...): numpy's SeedSequence
    hashes (seed, stream, index), so no two seeds share a stream (seed + i would replay seed + 1's, shifted)."""
    return int(np.random.SeedSequence(seed, spawn_key=(STREAMS.index(stream), *index)).generate_state(1)[0])


def provenance():
    """What ran, for args.json: the git commit, whether the code had uncommitted changes, a digest of the code and toy
    task (every .py file beside this one, the scripts and the modules they import, and toy/SHA256SUMS) and the versions
    of the libraries that decide a step (torch, transformers, datasets, numpy, scipy, peft)."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = sorted(f for f in os.listdir(here) if f.endswith(".py")) + ["toy/SHA256SUMS"]

    def git(*a):
        return subprocess.run(["git", "-C", here, *a], capture_output=True, text=True, timeout=30).stdout.strip()

    try:
        commit, dirty = git("rev-parse", "HEAD") or None, bool(git("status", "--porcelain", "--", *files))
    except (OSError, subprocess.SubprocessError):  # no git: no commit
        commit, dirty = None, None
    code = b"".join(open(os.path.join(here, f), "rb").read() for f in files if os.path.exists(os.path.join(here, f)))
    versions = dict(torch=torch.__version__, transformers=transformers.__version__)
    for name in ("datasets", "numpy", "scipy", "peft"):  # read from the installed metadata: nothing is imported
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return dict(commit=commit, dirty=dirty, code=hashlib.sha256(code).hexdigest()[:16], **versions)


def model_name(args):  # what from_pretrained reads: --model_name_or_path, or the toy's committed model
    return args.toy.model if args.model_name_or_path == "toy" else args.model_name_or_path


def load_tokenizer(args):
    tokenizer = pretrained(transformers.AutoTokenizer, model_name(args), args)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.pad_token or tokenizer.eos_token, "right"
    return tokenizer


def pretrained(cls, name, args, **kwargs):
    try:
        return cls.from_pretrained(name, trust_remote_code=args.trust_remote_code, **kwargs)
    except (OSError, ValueError) as e:  # not found, no network, not a model of that kind
        raise SystemExit(f"{name}: {str(e).strip().splitlines()[0]}") from None


def build_model(args, rt, source=False):
    """The causal LM a script trains: fp32 weights, dropout off unless --keep_dropout (with k = 1 the log-ratio of two
    consecutive policies would be mostly dropout noise), --gradient_checkpointing applied, --lora_r's adapters added.
    On several processes it is built on the meta device, for the script to shard and load_shards to fill from process
    0's `source`: the model as the file holds it (its own dtype, on the CPU), its adapters drawn as on one process."""
    config = pretrained(transformers.AutoConfig, model_name(args), args)
    dtype = rt.dtype if args.lora_r else torch.float32  # a frozen base in --precision: only trained weights are fp32
    if rt.distributed and not source:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(
                config, dtype=dtype, trust_remote_code=args.trust_remote_code
            )
        # known and harmless: the first hidden state transformers returns is a view, and nothing writes to it in place
        warnings.filterwarnings("ignore", r"FSDP2-wrapped module \(\w+\) returned a view tensor", UserWarning)
    else:
        device, dtype = ("cpu", "auto") if source else (rt.device, dtype)
        model = pretrained(transformers.AutoModelForCausalLM, model_name(args), args, dtype=dtype).to(device)
    for module in model.modules() if not args.keep_dropout else ():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):  # attention dropout passed to the kernel
            module.attention_dropout = 0.0
    if args.gradient_checkpointing:  # each decoder layer recomputed in the backward: one layer's activations, not all
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model = lora.add_adapters(model, args, stream_seed(args.seed, "init")) if args.lora_r else model
    model.export_dtype = config.dtype or torch.float32  # checkpoints are written in the model's own dtype
    return model


def load_shards(model, args, rt):
    """Fill a model sharded on the meta device: process 0 reads the file, and each tensor is broadcast a tensor at a
    time and cut to shards; buffers the file does not hold (rotary tables) are broadcast by name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = build_model(args, rt, source=True) if rt.rank == 0 else None
    outside = [k for k, _ in model.named_buffers() if k not in model.state_dict()]
    model.to_empty(device=rt.device)  # this process's shards, allocated: the file's values are copied into them
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full.state_dict() if full else {}, options=options)
    model.tie_weights()
    for key, buffer in [(k, b) for k, b in model.named_buffers() if k in outside]:
        value = full.get_buffer(key).to(rt.device) if full else torch.empty_like(buffer, device=rt.device)
        dist.broadcast(value, src=0)
        module, _, attr = key.rpartition(".")
        model.get_submodule(module).register_buffer(attr, value, persistent=False)


def check_logps(model, args, rt, token_logps):
    """What training reads must be the model's own log-probs: a family that changes its logits in a way the script's
    token_logps does not (it applies the head's bias, a logit scale and a softcap) stops here, before any step."""
    name = model_name(args)
    ids = torch.arange(3, 11, device=rt.device)[None] % model.config.get_text_config().vocab_size
    try:
        with torch.no_grad(), rt.autocast():
            own = model.eval()(input_ids=ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
            ours = token_logps(model, ids, torch.ones_like(ids), torch.ones(ids.shape, device=rt.device), rt.head_dtype)
    except (TypeError, AttributeError, ValueError) as e:  # no hidden states, no logits_to_keep, no output embeddings
        raise SystemExit(f"{name}: token_logps cannot read this model: {type(e).__name__}: {str(e).splitlines()[0]}")
    if hasattr(model, "reshard"):  # FSDP2 leaves the root gathered after a no-grad forward: the optimizer takes shards
        model.reshard()
    exact = rt.dtype == rt.head_dtype == torch.float32  # else one of the two heads rounds its logits to bf16
    gap, tolerance = (own - ours[0]).abs().max().item(), 1e-3 if exact else 0.5
    fail(not gap <= tolerance, f"{name}: the log-probs token_logps computes differ from the model's own by {gap:.3g}")


def plan_run(args, rows, per_step, unit, rank):
    """--max_steps unset: one pass over the data, `rows` at `per_step` a step (on the built-in toy data 120 steps, the
    length of the committed figures). Prints the run's plan."""
    toy = args.dataset == "toy" or args.dataset.startswith("toy:")
    args.max_steps = args.max_steps or (120 if toy else max(1, rows // per_step))
    passes = args.max_steps * per_step / rows
    if rank == 0:
        print(f"run: {args.max_steps} steps x {per_step} {unit} = {passes:.2f} passes over {rows} {unit}")


# scoring, generation, evaluation
def make_scorer(name, args, rt):
    """reward(prompts, completions, **columns) -> floats: a built-in (toy, toy_verify, tag_count, format, accuracy),
    module:function (user code, imported from the working directory or PYTHONPATH), or a reward model."""
    builtin = {"toy": toy_task.reward, "toy_verify": toy_task.verify, **math_rewards.REWARD_FUNCS}
    if name in builtin:
        return builtin[name]
    if ":" in name and not os.path.exists(name):
        module, _, function = name.partition(":")
        sys.path.insert(0, os.getcwd())
        try:
            return getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as e:
            raise SystemExit(f"{name}: {type(e).__name__}: {e}") from None
    rm = pretrained(transformers.AutoModelForSequenceClassification, name, args, dtype=rt.dtype).to(rt.device).eval()
    rm_tok = pretrained(transformers.AutoTokenizer, name, args)
    rm_tok.pad_token = rm_tok.pad_token or rm_tok.eos_token  # the score is read at each row's last non-pad token
    rm.config.pad_token_id = rm_tok.pad_token_id

    @torch.no_grad()
    def score(prompts, completions, **_):
        """The chat template's rendering (its BOS once) where the RM has one and the prompts are conversations."""
        chat = rm_tok.chat_template and isinstance(prompts[0], list)
        turns = [p + [{"role": "assistant", "content": c}] if chat else p + c for p, c in zip(prompts, completions)]
        texts = [rm_tok.apply_chat_template(t, tokenize=False) if chat else t for t in turns]
        scores, size = [], args.reward_batch_size
        for batch in (texts[i : i + size] for i in range(0, len(texts), size)):
            ids = [data_formats.prompt_ids(rm_tok, t) for t in batch]
            enc = rm_tok.pad({"input_ids": ids}, padding_side="right", return_tensors="pt").to(rt.device)
            try:
                out = rm(**enc)
            except torch.OutOfMemoryError:  # a batch too large, not a bad sample (SystemExit passes score_samples)
                fail(True, f"{name}: out of memory scoring {len(batch)} sequences at once; lower --reward_batch_size")
            out = out.score if hasattr(out, "score") else out.logits  # ArmoRM's output is .score
            scores += out.float().reshape(len(batch), -1)[:, 0].tolist()
        return scores

    return score


def score_samples(name, scorer, prompts, completions, columns):
    """Each sample's reward, or None where it is NaN, inf, None or not a number, or the scorer raises on it (a call
    that raises is retried one sample at a time). Returns (scores, bad {index: what the scorer did})."""

    def call(idx):
        given = {k: [v[j] for j in idx] for k, v in columns.items()}
        out = list(scorer([prompts[j] for j in idx], [completions[j] for j in idx], **given))
        if len(out) != len(idx):
            raise ValueError(f"returned {len(out)} rewards for {len(idx)} samples")
        return out

    try:
        raw = call(range(len(completions)))
    except Exception:  # noqa: BLE001 (a scorer is user code: find the samples it fails on)
        raw = []
        for j in range(len(completions)):
            try:
                raw += call([j])
            except Exception as e:  # noqa: BLE001 (recorded for --on_bad_reward)
                raw.append(e)
    scores, bad = [], {}
    for j, r in enumerate(raw):
        try:
            scores.append(None if isinstance(r, (Exception, str, bytes)) or not math.isfinite(float(r)) else float(r))
        except (TypeError, ValueError):
            scores.append(None)
        if scores[-1] is None:
            did = f"raised {type(r).__name__}: {r}" if isinstance(r, Exception) else f"is {r!r}"
            bad[j] = f"reward {name} of prompt {prompts[j]!r} {did}"
    return scores, bad


@torch.no_grad()
def generate(model, tokenizer, prompts, n, args, greedy, seed):
    """n completions per prompt (token ids, grouped per prompt), at most --generation_batch_size sequences per call,
    with the KV cache, FSDP2's shard groups gathered once for all. A completion stops at an end token (kept; the chat
    template's end of turn too); one cut at --max_new_tokens has none. Returns (completions, whether each finished)."""
    model.eval()
    units = [m for m in model.modules() if hasattr(m, "set_reshard_after_forward")]  # FSDP2's shard groups
    for m in units:  # gathered for the whole call, here: peft's generate enters the model below the root's forward
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    torch.manual_seed(seed)
    ends = [tokenizer.eos_token_id]
    if tokenizer.chat_template:  # e.g. <|eot_id|>: the first token after an assistant message
        turns = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!!"}]
        text = tokenizer.apply_chat_template(turns, tokenize=False).rsplit("!!", 1)[1]
        after = tokenizer(text, add_special_tokens=False)["input_ids"][:1]
        ends += [t for t in after if t in tokenizer.added_tokens_decoder]
    out, finished, per_call = [], [], max(1, args.generation_batch_size // n)
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0)
    options = dict(max_new_tokens=args.max_new_tokens, eos_token_id=ends, pad_token_id=tokenizer.pad_token_id)
    options |= dict(do_sample=False) if greedy else sampling
    calls = range(0, len(prompts), per_call)
    quiet = len(calls) < 2 or int(os.environ.get("RANK", 0)) > 0  # rank 0 shows progress
    for i in tqdm(calls, "sampling", leave=False, dynamic_ncols=True, disable=quiet):
        enc = tokenizer.pad({"input_ids": prompts[i : i + per_call]}, padding_side="left", return_tensors="pt")
        enc = enc.to(next(model.parameters()).device)
        try:  # gathered weights: no collective in a forward, so processes need not decode in step (synced_gpus)
            seqs = model.generate(**enc, num_return_sequences=n, synced_gpus=False, **options)
        except torch.OutOfMemoryError:
            fail(True, f"out of memory sampling {per_call * n} sequences at once; lower --generation_batch_size")
        for s in seqs[:, enc["input_ids"].shape[1] :].tolist():
            out.append(next((s[: j + 1] for j, t in enumerate(s) if t in ends), s))
            finished.append(out[-1][-1] in ends)
    for m in units:  # back to shards; in training the root keeps its weights gathered after a forward (FSDP2's default)
        m.set_reshard_after_forward(m is not model, recurse=False)
        m.reshard()
    model.train()
    return out, finished


def round_prompts(n_prompts, round_size, round_index, seed):
    """Indices of a round's prompts: consecutive slices of one shuffled pass after another."""
    n_pass, pos = divmod(round_index, n_prompts // round_size)
    order = torch.randperm(n_prompts, generator=torch.Generator().manual_seed(stream_seed(seed, "prompts", n_pass)))
    return order[pos * round_size : (pos + 1) * round_size].tolist()


def shuffled(items, seed, round_index):
    """A round's training items (pairs, examples, groups) in random order, from the round's own random stream."""
    order = torch.randperm(
        len(items), generator=torch.Generator().manual_seed(stream_seed(seed, "shuffle", round_index))
    )
    return [items[i] for i in order.tolist()]


class Group(NamedTuple):  # a prompt's samples, as sample_and_score returns them
    prompt_ids: list
    completions: list  # token ids, each cut to --max_length
    scores: list  # each sample's weighted reward, None where a scorer failed on it
    finished: list  # whether each sample ended on its own (an end token, within --max_new_tokens and --max_length)
    row: dict  # the prompt row, with its other columns


def scored_groups(groups):
    """A round's Groups as (prompt_ids, completions, rewards), each without the samples whose reward failed (None),
    and only where two samples remain: what a group's advantages are computed over (GRPO)."""
    out = []
    for g in groups:
        ok = [j for j, r in enumerate(g.scores) if r is not None]
        if len(ok) >= 2:
            out.append((g.prompt_ids, [g.completions[j] for j in ok], [g.scores[j] for j in ok]))
    return out


def sample_and_score(policy, tokenizer, scorers, rows, n, args, round_index, rt, prefix="online", failures=None):
    """n samples of each prompt row (greedy for prefix 'eval'; round_index picks the sampling stream), scored by the
    weighted sum of scorers [(name, weight, fn)], each given the rows' other columns and `finished` (a completion cut
    by --max_new_tokens or --max_length has not). Each process samples its share; every process gets all groups (Group)
    and the record: the mean reward of the scored samples, bad and truncated counts, each scorer's mean. A scorer
    failing on every sample stops the run; `failures` (a list) collects what the scorers did on the others."""
    mine = rows[rt.rank :: rt.world]
    padded = mine + rows[:1] * (math.ceil(len(rows) / rt.world) - len(mine))  # the same generate calls on every process
    prompts = [
        data_formats.prompt_ids(tokenizer, data_formats.as_text(r["prompt"], "prompt", tokenizer)) for r in padded
    ]
    prompts = [p[-args.max_prompt_length :] for p in prompts]
    with rt.autocast():  # one GPU samples in bf16 as it trains
        seed = stream_seed(args.seed, "sampling", round_index, rt.rank)
        completions, ended = generate(policy, tokenizer, prompts, n, args, prefix == "eval", seed)
    completions, ended = completions[: len(mine) * n], ended[: len(mine) * n]  # not the padding
    finished = [
        e and len(prompts[j // n]) + len(c) <= args.max_length for j, (c, e) in enumerate(zip(completions, ended))
    ]
    flat = [r for r in mine for _ in range(n)]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    columns = {k: [r[k] for r in flat] for k in (flat[0] if flat else {}) if k != "prompt"} | {"finished": finished}
    per_fn, bad, fatal = [], {}, []
    for name, _, fn in scorers:
        fn_scores, fn_bad = score_samples(name, fn, [r["prompt"] for r in flat], texts, columns)
        per_fn.append(fn_scores)
        bad = fn_bad | bad
        fatal += list(fn_bad.values())[:1] if fn_bad and len(fn_bad) == len(texts) else []
    scores = [None if j in bad else sum(w * s[j] for (_, w, _), s in zip(scorers, per_fn)) for j in range(len(texts))]
    good = [j for j, s in enumerate(scores) if s is not None]
    cut = len(finished) - sum(finished)
    sums = [sum(scores[j] for j in good), len(good), len(bad), cut, len(texts)] + [
        sum(s[j] for j in good) for s in per_fn
    ]
    stats = torch.tensor(sums, dtype=torch.float64)
    kept = [c[: args.max_length - len(prompts[j // n])] for j, c in enumerate(completions)]
    span = [slice(i * n, (i + 1) * n) for i in range(len(mine))]  # each prompt's n samples
    groups = [Group(prompts[i], kept[s], scores[s], finished[s], r) for i, (r, s) in enumerate(zip(mine, span))]
    bad = list(bad.values())
    if rt.world > 1:  # every process gets every group and failure: all go on or stop together
        gathered = [None] * rt.world
        dist.all_gather_object(gathered, (groups, bad, fatal))
        groups, bad, fatal = ([x for part in gathered for x in part[i]] for i in range(3))
        dist.all_reduce(stats)
    fail(fatal, f"stopping, a scorer failed on every sample: the {fatal[0] if fatal else ''}")
    stop = f"stopping: the {bad[0] if bad else ''} ({len(bad)} bad rewards in this batch); --on_bad_reward drop would"
    fail(bad and args.on_bad_reward == "stop", stop + " leave such samples out")
    if failures is not None:
        failures.extend(bad)
    record = {f"{prefix}/reward": (stats[0] / stats[1]).item(), f"{prefix}/bad_rewards": int(stats[2])}
    record |= {
        f"{prefix}/truncated_completions": int(stats[3]),
        f"{prefix}/truncated_frac": (stats[3] / stats[4]).item(),
    }
    for (name, _, _), s in zip(scorers, stats[5:]) if len(scorers) > 1 else ():
        record[f"{prefix}/{name}"] = (s / stats[1]).item()
    return groups, record


def evaluate(policy, tokenizer, scorer, rows, args, rt):
    """Mean reward of greedy completions of held-out prompt rows (on the toy task also the exact accuracy); process 0
    writes them to --output_dir's eval_samples.jsonl (the latest evaluation's: prompt, completion, reward, finished)."""
    scorers = [("reward", 1.0, scorer)] + [("accuracy", 0.0, toy_task.verify)] * args.reward_model.startswith("toy")
    groups, record = sample_and_score(policy, tokenizer, scorers, rows, 1, args, 0, rt, prefix="eval")
    if rt.rank == 0:  # in the rows' order (each process scored every world-th row)
        order = [i for r in range(rt.world) for i in range(r, len(rows), rt.world)]
        with open(os.path.join(args.output_dir, "eval_samples.jsonl"), "w") as f:
            for _, g in sorted(zip(order, groups), key=lambda t: t[0]):
                text = tokenizer.decode(g.completions[0], skip_special_tokens=True)
                sample = dict(prompt=g.row["prompt"], completion=text, reward=g.scores[0], finished=g.finished[0])
                f.write(json.dumps(sample) + "\n")
    return record


def clamped_fraction(policy_logps, ref_logps, mask, log_eps_P, log_eps_R):  # the humanline/clamped_frac metric
    """Per sequence, the fraction of its completion tokens whose log-ratio is outside the clip."""
    ratio = (policy_logps - ref_logps).detach()
    return (((ratio < log_eps_P) | (ratio > log_eps_R)).float() * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def accumulate(sums, metrics):
    """Add each metric's (sum, count) of entries: a step's value is the mean over micro-batches and processes."""
    for k, v in metrics.items():
        s, c = sums.get(k, (0.0, 0))
        sums[k] = (s + v.sum().item(), c + v.numel())


# the run's bookkeeping: metrics.jsonl, progress bar, SIGTERM, checkpoints, the final save
class Session:
    """What a run keeps on every process: its folder (args.json, metrics.jsonl, trackers), resume, the progress bar,
    SIGTERM and Ctrl-C, each step's record, checkpoints and the final model."""

    def __init__(
        self, args, rt, tokenizer, policy, optimizer, scheduler, sampling_gen, state, reference=None, item=None
    ):
        """With --resume, restores `state` (and the policy, optimizer, scheduler, RNGs, reference) from the newest
        checkpoint; `item`: the class of a round's items, which a checkpoint keeps as plain tuples (None: tuples)."""
        self.args, self.rt, self.tokenizer, self.policy, self.state = args, rt, tokenizer, policy, state
        self.optimizer, self.scheduler = optimizer, scheduler
        self.sampling_gen, self.reference, self.item = sampling_gen, reference, item
        self.stop, self.bad_steps, self.bad_streak, self.trackers = [], 0, 0, []
        self.lines = 0  # of metrics.jsonl: a checkpoint keeps how many were written, so a resumed run writes each once
        # online rounds in a row too short for a batch: their samples, prompts left without two rewards, the failures
        self.short, self.sampled, self.lost, self.failures = 0, 0, 0, []
        if rt.world > 1:  # several nodes need one --output_dir that all of them see: checked before anything is read
            stamp = torch.tensor([time.time_ns() if rt.rank == 0 else 0], dtype=torch.int64)
            dist.broadcast(stamp, src=0)
            probe = os.path.join(args.output_dir, f".shared-{stamp.item()}")
            if rt.rank == 0:
                os.makedirs(args.output_dir, exist_ok=True)
                open(probe, "w").close()
            try:
                self.all_see([probe], f"the file process 0 wrote in --output_dir {args.output_dir}")
            finally:
                if rt.rank == 0:
                    os.remove(probe)
        ckpt = (checkpoints(args.output_dir) or [None])[-1] if args.resume else None
        if ckpt:
            self.load(ckpt)
        if rt.rank == 0:
            os.makedirs(args.output_dir, exist_ok=True)
            for d in os.listdir(args.output_dir):  # half-written checkpoints of a killed run; all with --overwrite
                if d.startswith("checkpoint-") and (d.endswith(".tmp") or args.overwrite_output_dir and not ckpt):
                    shutil.rmtree(os.path.join(args.output_dir, d), ignore_errors=True)
            path, now = os.path.join(args.output_dir, "args.json"), provenance()
            attempts = json.load(open(path)).get("attempts", []) if ckpt else []  # each attempt's code, kept
            with open(path, "w") as f:
                json.dump(
                    asdict(args) | {"provenance": now, "attempts": attempts + [now | {"from_step": state.step}]},
                    f,
                    indent=2,
                )
            self.file = open_metrics(os.path.join(args.output_dir, "metrics.jsonl"), self.lines)
            self.trackers = open_trackers(args)
            if ckpt:
                print(f"resumed from {ckpt} at step {state.step}")
        # SIGTERM (preemption; torchrun passes it on) or Ctrl-C: a checkpoint after the current step and a clean exit
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.interrupt)
        name = os.path.basename(os.path.normpath(args.output_dir))
        self.bar = tqdm(total=args.max_steps, initial=state.step, desc=name, disable=rt.rank != 0, dynamic_ncols=True)

    def interrupt(self, signum, frame):
        fail(self.stop and signum == signal.SIGINT, "interrupted twice: stopped without a checkpoint")
        self.stop.append(signum)
        if self.rt.rank == 0:
            print(f"\n{signal.Signals(signum).name}: stopping after this step with a checkpoint", file=sys.stderr)

    def log(self, record):
        """One line of metrics.jsonl, and a record of each --report_to tracker."""
        if self.rt.rank == 0:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            self.lines += 1
            for write, _ in self.trackers:
                write(record)
            if self.args.keep_every_eval and "eval/reward" in record:  # the answers' drift over training, step by step
                kept = os.path.join(self.args.output_dir, f"eval_samples-step{record['step']}.jsonl")
                shutil.copyfile(os.path.join(self.args.output_dir, "eval_samples.jsonl"), kept)

    def skip_or_stop(self, sums):
        """(skip, stop): a non-finite loss on any process skips the step everywhere; a SIGTERM stops every process."""
        flags = [float(not math.isfinite(sums.get("loss", (0.0,))[0])), float(bool(self.stop))]
        flags = torch.tensor(flags, dtype=torch.float64)
        if self.rt.world > 1:
            dist.all_reduce(flags)
        return bool(flags[0]), bool(flags[1])

    def record(self, sums, grad_norm, lr, skipped, t0, cpu0):
        """The record of the step just taken: each metric's mean over micro-batches and processes, the update's grad
        norm and learning rate, the time spent on the reference, speed and memory; a skipped step is counted."""
        state = self.state
        seconds, cpu_seconds = time.time() - t0, time.process_time() - cpu0  # data, forwards, backward, update
        bad = skipped or not torch.isfinite(grad_norm).item()
        self.bad_steps += bad
        self.bad_streak = self.bad_streak + 1 if bad else 0
        keys = sorted(sums)
        totals = torch.tensor([sums[k][0] for k in keys] + [sums[k][1] for k in keys], dtype=torch.float64)
        if self.rt.world > 1:
            dist.all_reduce(totals)
        means = {k: s / c for k, s, c in zip(keys, totals[: len(keys)].tolist(), totals[len(keys) :].tolist()) if c}
        record = {k: v for k, v in means.items() if k != "tokens"} | {"step": state.step}
        record |= {"grad_norm": grad_norm.item(), "lr": lr, "bad_steps": self.bad_steps}
        record["perf/sync_seconds"] = getattr(self.reference, "seconds", 0.0)  # the reference's forwards or copy
        if self.reference is not None:
            self.reference.seconds = 0.0
        record["tokens_per_s"] = totals[keys.index("tokens")].item() / seconds
        record |= {"perf/step_seconds": seconds, "perf/step_cpu_seconds": cpu_seconds}
        record["perf/peak_memory_gib"] = memory_plan.peak_memory_gib(self.rt.device)
        self.bar.update(1)
        shown = ("loss", "rewards/margins", "kl")
        self.bar.set_postfix({k.split("/")[-1]: f"{record[k]:.3g}" for k in shown if k in record})
        return record

    def stop_if_stuck(self):
        """--max_bad_steps skipped steps in a row stop the run, naming the newest checkpoint (from before them)."""
        newest = (checkpoints(self.args.output_dir) or [None])[-1]
        message = f"stopping: the last {self.bad_streak} steps (up to step {self.state.step}) had a non-finite loss or "
        message += f"gradient and were skipped; the newest checkpoint, {newest}, is from before them. Lower "
        stuck = self.bad_streak >= self.args.max_bad_steps
        fail(stuck, message + "--learning_rate or --max_grad_norm, or look for bad data.")

    def sample_round(self, scorers, prompts, round_size, n):
        """An online round: its `round_size` prompt rows (round_prompts), n samples of each from the policy, scored
        (Groups, one per row), and the round's record."""
        args, rt, i = self.args, self.rt, self.state.round_index
        rows = [prompts[j] for j in round_prompts(len(prompts), round_size, i, args.seed)]
        return sample_and_score(self.policy, self.tokenizer, scorers, rows, n, args, i, rt, failures=self.failures)

    def end_of_round(self, ready, groups, rounds_per_pass, evaluate):
        """Whether the run ends after an online round; `ready`: a batch is there. A round too short for a batch is
        followed by the next; a whole pass of them in a row leaves no step to take. Where failed rewards left a prompt
        fewer than two scored samples, the run stops there (exit 1) naming the reward and how many samples failed;
        else every prompt's samples scored alike (the policy has converged) and the run ends as at --max_steps,
        evaluated and saved."""
        if ready:  # the streak of short rounds is over
            self.short, self.sampled, self.lost, self.failures = 0, 0, 0, []
            return False
        self.short += 1
        self.sampled += sum(len(g.scores) for g in groups)
        self.lost += sum(None in g.scores and len(g.scores) - g.scores.count(None) < 2 for g in groups)
        if self.short < rounds_per_pass:
            return False
        what = f"{self.short} rounds in a row (a whole pass over the prompts) gave less than a batch"
        failed = f"rewards failed on {len(self.failures)} of {self.sampled} samples"
        lost = f"leaving {self.lost} prompts fewer than two scored; the first: {(self.failures or [''])[0]}"
        if self.lost:
            self.bar.close()  # the line that says why stands alone
            fail(True, f"stopping: {what}: {failed}, {lost}")
        self.end_early(f"{what}: each prompt's samples scored alike, the policy has converged on them", evaluate)
        return True

    def end_early(self, reason, evaluate):
        """A whole pass over the prompts gave no batch, every prompt's samples scoring alike: no step can follow. The
        run ends here as it would at --max_steps: evaluated, saved, its reason the last line printed."""
        self.log({"step": self.state.step, "ended_early": 1} | (evaluate() if evaluate else {}))
        self.save()
        self.bar.close()
        if self.rt.rank == 0:
            print(f"training ends at step {self.state.step} of {self.args.max_steps}: {reason}", file=sys.stderr)

    def exit_after_signal(self):
        """After a SIGTERM or Ctrl-C, and the checkpoint saved after it: leave with exit code 0."""
        self.bar.close()
        if self.rt.rank == 0:
            name = signal.Signals(self.stop[0]).name
            print(f"{name}: stopped after step {self.state.step} with a checkpoint; continue with --resume")
        if self.rt.distributed:
            dist.destroy_process_group()
        sys.exit(0)

    def save(self):
        """output_dir/checkpoint-STEP: the policy (save_pretrained) and each process's training state (its shards of
        policy, reference and optimizer, RNG states, the loop's state), written to a temporary name, then renamed."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        final = os.path.join(self.args.output_dir, f"checkpoint-{self.state.step}")
        tmp, rank = final + ".tmp", self.rt.rank
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing this step
        self.save_pretrained(tmp)
        model, optimizer = get_state_dict(self.policy, self.optimizer)
        model = lora.trained_only(model, self.policy)  # --lora_r: the adapters, not the frozen base
        rng = {"torch": torch.get_rng_state(), "sampling": self.sampling_gen.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        ref = getattr(self.reference, "model", None)  # a reference model's shards, or what the policy computed ahead
        ref = get_model_state_dict(ref) if ref is not None else getattr(self.reference, "held", None)
        saved = dict(policy=model, optimizer=optimizer, ref=ref, rng=rng)
        state = vars(self.state) | {"round": [tuple(s) for s in self.state.round]}  # plain: weights_only loads no class
        saved |= dict(scheduler=self.scheduler.state_dict(), world_size=self.rt.world, state=state)
        saved |= dict(bad_steps=self.bad_steps, metrics_lines=self.lines)
        os.makedirs(tmp, exist_ok=True)  # process 0 made it: here only if this node does not see its folder
        torch.save(saved | {"args": asdict(self.args)}, os.path.join(tmp, f"state-rank{rank}.pt"))
        states = [os.path.join(tmp, f"state-rank{r}.pt") for r in range(self.rt.world)]
        self.all_see(states, f"the training states of checkpoint {tmp}")  # or none is renamed into a checkpoint
        if rank == 0:
            fsync(tmp)  # the files reach the disk before the rename makes them the checkpoint
            shutil.rmtree(final, ignore_errors=True)  # a step saved twice (the last one)
            os.replace(tmp, final)
            fsync(self.args.output_dir, files=False)  # the rename itself
            for old in checkpoints(self.args.output_dir)[: -self.args.save_total_limit or 0]:
                shutil.rmtree(old, ignore_errors=True)
        self.barrier()

    def load(self, path):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

        saved = torch.load(os.path.join(path, f"state-rank{self.rt.rank}.pt"), weights_only=True)  # no unpickling
        world = f"{path} was written by {saved['world_size']} processes; resume with as many"
        fail(saved["world_size"] != self.rt.world, world)
        changed = [k for k, v in asdict(self.args).items() if k not in RESUMABLE and saved["args"].get(k) != v]
        was = ", ".join(f"--{k} {saved['args'].get(k)} (now {getattr(self.args, k)})" for k in changed)
        fail(changed, f"{path} was written with other settings: {was}")
        states = dict(model_state_dict=saved["policy"], optim_state_dict=saved["optimizer"])
        options = StateDictOptions(strict=not self.args.lora_r)  # --lora_r: the adapters, the frozen base as loaded
        set_state_dict(self.policy, self.optimizer, **states, options=options)
        if getattr(self.reference, "model", None) is not None:
            set_model_state_dict(self.reference.model, saved["ref"])
        elif self.reference is not None:
            self.reference.held = saved["ref"]
        self.scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"]["torch"])
        self.sampling_gen.set_state(saved["rng"]["sampling"])
        if "cuda" in saved["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state(saved["rng"]["cuda"])
        vars(self.state).update(saved["state"])
        self.state.round = [self.item(*s) for s in self.state.round] if self.item else self.state.round
        self.bad_steps, self.lines = saved["bad_steps"], saved["metrics_lines"]

    def save_pretrained(self, directory, merged=False):
        """A Hugging Face model directory of the policy, gathered from its shards (rank 0 writes). With --lora_r the
        adapters alone (peft's format, fp32), or `merged` into the base: W + alpha / r B A in fp32, a model that
        from_pretrained loads without peft."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=not merged)
        full, model = get_model_state_dict(self.policy, options=options), self.policy
        # in the model's own dtype (bf16 for most), not training's fp32; adapters stay fp32
        dtype = None if self.args.lora_r and not merged else getattr(self.policy, "export_dtype", None)
        if self.rt.rank == 0 and merged:
            full, model = lora.merge_adapters(full, model, dtype)
        if self.rt.rank == 0:
            cast = {}  # tensor by tensor, each fp32 one freed as its copy replaces it; a tied pair stays one tensor
            for k, v in full.items():
                if (v.data_ptr(), v.shape) not in cast:
                    cast[v.data_ptr(), v.shape] = v.to(dtype or v.dtype)
                full[k] = cast[v.data_ptr(), v.shape]
            model.save_pretrained(directory, state_dict=full)
            if dtype is not None:  # the config names the dtype written (save_pretrained names the model's: fp32)
                kept, model.config.dtype = model.config.dtype, str(dtype).removeprefix("torch.")
                model.config.save_pretrained(directory)
                model.config.dtype = kept
            self.tokenizer.save_pretrained(directory)
        self.barrier()

    def barrier(self):
        if self.rt.world > 1:
            dist.barrier()

    def all_see(self, paths, what):
        """After a barrier, every process must see every one of `paths`, or all of them stop with one line."""
        self.barrier()
        blind = torch.tensor([float(not all(map(os.path.exists, paths)))], dtype=torch.float64)
        if self.rt.world > 1:
            dist.all_reduce(blind)
        shared = "on several nodes --output_dir must be a folder every node sees"
        fail(blind.item(), f"{int(blind.item())} of {self.rt.world} processes do not see {what}: {shared}")

    def finish(self):
        """The final model: the last checkpoint's files, linked into --output_dir (gathered and written once)."""
        self.bar.close()
        for _, close in self.trackers:
            close()
        out = self.args.output_dir
        into = os.path.join(out, "adapter") if self.args.lora_r else out  # --lora_r: the adapters; merged in out
        if self.args.lora_r:
            self.save_pretrained(out, merged=True)
        if self.rt.rank == 0:
            last = os.path.join(out, f"checkpoint-{self.state.step}")  # the last step always saves
            os.makedirs(into, exist_ok=True)
            for f in os.listdir(last) if os.path.isdir(last) else []:
                if not f.startswith("state-rank"):
                    link(os.path.join(last, f), os.path.join(into, f))
            print(f"saved to {out}" + f" (the adapters alone: {into})" * bool(self.args.lora_r))
        if self.rt.distributed:
            dist.barrier()  # leave together: a process tearing down gloo while another still saves can abort
            dist.destroy_process_group()


MODE = ("offline", "online", "humanline", "sync", "clip", "pairs_from_samples", "sample_every", "seed", "plan_only")
RESUMABLE = (  # settings a resumed run may change
    "resume output_dir save_every log_every eval_every eval_at_start num_eval_prompts eval_prompts dist_timeout "
    "report_to overwrite_output_dir save_total_limit on_bad_reward max_bad_steps trust_remote_code ignore_memory_plan "
    "keep_every_eval"
).split()


def open_trackers(args):
    """--report_to: [(write(record), close())] for TensorBoard (output_dir/tensorboard) and W&B (project
    $WANDB_PROJECT or humanline, continued by --resume), each record's keys at its step, the arguments as config."""
    trackers = []
    for name in [n for n in args.report_to.split(",") if n != "none"]:
        try:
            tracker = importlib.import_module("torch.utils.tensorboard" if name == "tensorboard" else "wandb")
        except ImportError:
            fail(True, f"--report_to {name}: the package is not installed (pip install {name})")
        if name == "tensorboard":
            tb = tracker.SummaryWriter(os.path.join(args.output_dir, "tensorboard"))
            tb.add_text("args", json.dumps(asdict(args), indent=2))
            trackers.append((lambda r: [tb.add_scalar(k, v, r["step"]) for k, v in r.items() if k != "step"], tb.close))
            continue
        id_file = os.path.join(args.output_dir, "wandb_id")
        run_id = open(id_file).read() if args.resume and os.path.exists(id_file) else os.urandom(6).hex()
        with open(id_file, "w") as f:
            f.write(run_id)
        project, name = os.environ.get("WANDB_PROJECT", "humanline"), os.path.basename(os.path.abspath(args.output_dir))
        run = tracker.init(
            project=project, name=name, id=run_id, resume="allow", config=asdict(args), dir=args.output_dir
        )
        trackers.append((lambda r: run.log({k: v for k, v in r.items() if k != "step"}, step=r["step"]), run.finish))
    return trackers


def checkpoints(output_dir):  # the complete ones, oldest first
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    steps = [int(d.split("-")[1]) for d in names if d.startswith("checkpoint-") and d.split("-")[1].isdigit()]
    return [os.path.join(output_dir, f"checkpoint-{s}") for s in sorted(steps)]


def link(src, dest):
    if os.path.lexists(dest + ".tmp"):  # left by a run killed here: it may be src itself under that name
        os.remove(dest + ".tmp")
    try:
        os.link(src, dest + ".tmp")  # the same bytes under two names: no second copy on disk
    except OSError:
        shutil.copy2(src, dest + ".tmp")
    os.replace(dest + ".tmp", dest)


def open_metrics(path, lines):
    """metrics.jsonl for appending: a resumed run keeps the `lines` its checkpoint had seen written (later ones were the
    stopped attempt's: a round sampled after that checkpoint is sampled again), a new run (lines 0) starts afresh."""
    kept = []
    if lines and os.path.exists(path):
        with open(path) as f:
            kept = f.readlines()[:lines]
    with open(path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)  # a kill leaves the old records or the kept ones, never none
    return open(path, "a")


def fsync(path, files=True):
    """Flush a directory's entries (with files, every file under it too) to disk."""
    for p in ([os.path.join(root, n) for root, _, names in os.walk(path) for n in names] if files else []) + [path]:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
