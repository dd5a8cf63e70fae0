"""What humanline costs per training step: side by side with offline training and with the floor, on the same tokens.

    python experiments/bench.py                       # toy model, a random 30M Llama; DPO, KTO, GRPO (~20 min, 2 cores)
    python experiments/bench.py --models 30m --algos dpo --repeats 2
    python experiments/bench.py --quick               # toy model, 3 steps: a smoke test (~5 min)

For each model and algorithm, every configuration trains on the same offline batches, step for step (the online
rows excepted, which train on what they sample):

    floor            a bare forward + backward of the policy plus a no-grad forward of the reference, nothing else
                     (no loss, no optimizer, no logging): what any trainer with a reference model pays at least
    offline          the script with --offline --ref_free off: a frozen reference model
    offline, ref-free  --offline (--ref_free on, the default): every step's reference log-probs computed at step 0
    humanline k=1    --offline --humanline: reference-free, no reference model
    k=1, 2 models    --offline --humanline --ref_free off: two models, the reference synced in place every step
    humanline k=16   --offline --humanline --sync_every 16: reference-free (16 batches computed at each sync)
    online           --online: a round's sampling (+ scoring, + GRPO's sampler log-probs) and its training steps,
                     timed separately ("round s" column)
    sync             one sync_reference (an in-place copy of every parameter into the reference), timed alone

Measured: each configuration runs in a fresh process (one thread on CPU) for --steps optimizer steps, timed by the
scripts' own perf/ metrics (the step's wall time and CPU time: data, forwards, backward, update; not logging or
checkpoints). A run's step time is its mean over all its steps, so that the reference log-probs a
reference-free run computes ahead (at step 0 and at each sync) count; a configuration's step time is the fastest
such mean over --repeats runs interleaved with the other configurations (the median is in the jsonl): other
processes on a shared machine only ever add time. On CPU the ratios are of CPU times (a
one-thread process's CPU time is close to its wall time on a quiet core, while its wall time on a shared one
mostly measures the neighbours; both are in the table), on a GPU of wall times. Peak memory is the scripts'
perf/peak_memory_gib: on CPU the process's peak resident set size, from a separate 3-step run with glibc told
to map each allocation over 64 KiB on its own and to unmap it when freed (MALLOC_MMAP_THRESHOLD_; otherwise the
allocator's fragmentation moves the peak by 0.1 GiB from run to run, and the page faults would slow the timed
runs), so it is the peak of live memory: weights, gradients, optimizer state, activations, plus the interpreter
and its libraries (the "python + libraries" figure is that part alone); on a GPU the most CUDA memory
allocated at once. The floor and sync rows run this file's worker on the scripts' own
functions (offline_batch, forward_batches, collate, token_logps, sync_reference). tokens/s counts every
non-padding token of the step's forwards (prompt + completion); model FLOPs per step are 8 x parameters x those
tokens (forward + backward of the policy, 6N per token, and a forward of the reference, 2N), and MFU divides
their rate by --peak_tflops. With a CUDA device the whole matrix also runs there (bf16 autocast, as the scripts
do); without one it says so and skips it.

Writes experiments/results/bench.jsonl (one line per row) and bench.md (the table, with the command).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "results")
SCRIPTS = {"dpo": "dpo_humanline.py", "kto": "kto_humanline.py", "grpo": "grpo_humanline.py"}
# --batch_size per model and algorithm (one micro-batch per step): 64 sequences a step on the toy model (DPO: 32 pairs,
# KTO: 32 examples + 32 KL pairs, GRPO: 32 groups of two), 16 on the 30M model
BATCH = {"toy": {"dpo": 32, "kto": 32, "grpo": 64}, "30m": {"dpo": 8, "kto": 8, "grpo": 16}}
OFFLINE = [
    ("offline", ["--offline", "--ref_free", "off"]),
    ("offline, ref-free", ["--offline"]),
    ("humanline k=1", ["--offline", "--humanline"]),
    ("k=1, 2 models", ["--offline", "--humanline", "--ref_free", "off"]),
    ("humanline k=16", ["--offline", "--humanline", "--sync_every", "16"]),
]
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}  # dense bf16


def online_flags(algo, model, batch):
    """A round covers about two steps: DPO/KTO sample 2 x (pairs a step) prompts x 4; GRPO samples groups of 4 for
    two steps (--sample_every 2). The random 30M model's samples all score 0: --reward_threshold 0 keeps its pairs."""
    if algo == "grpo":
        return ["--online", "--num_generations", "4", "--sample_every", "2"]
    pairs_per_step = batch if algo == "dpo" else batch // 2
    flags = [
        "--online",
        "--round_size",
        str(2 * pairs_per_step if algo == "dpo" else 4 * pairs_per_step),
        "--num_samples",
        "4",
    ]
    return flags + (["--reward_threshold", "0"] if model != "toy" else [])


# ----------------------------------------------------------------------------------------------
# The random ~30M-parameter model
# ----------------------------------------------------------------------------------------------


def random_llama(cache):
    """A randomly initialised Llama of 30.7M parameters (hidden 512, 9 layers, MLP 1536, 8 heads) with the toy
    tokenizer (vocabulary 17, so the weights are almost all in the layers), saved once with save_pretrained."""
    path = os.path.join(cache, "llama30m")
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import toy_task

    tok = AutoTokenizer.from_pretrained(toy_task.load().model)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=9,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    tmp = path + ".tmp"
    LlamaForCausalLM(config).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------------------------
# Workers (a fresh process each): the floor and the sync, and the interpreter with its libraries alone
# ----------------------------------------------------------------------------------------------


def peak_gib(device):
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)


def worker(opts):
    import importlib

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import toy_task

    m = importlib.import_module(SCRIPTS[opts.algo][:-3])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    toy = toy_task.load()
    path = toy.model if opts.model_path == "toy" else opts.model_path
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    if opts.worker == "baseline":
        importlib.import_module("datasets")  # the scripts import it to read data
        return {"peak_gib": peak_gib(device)}
    args = m.Args(batch_size=opts.batch, micro_batch_size=opts.batch)
    encoded = m.load_data(
        args, "examples" if opts.algo == "kto" else "preferences", tok, toy, argparse.Namespace(rank=0)
    )
    if opts.algo == "kto":  # as the scripts
        data = [(p, c, d) for p, cs, ds in encoded for c, d in zip(cs, ds)]
    else:
        data = [(p, c, r) for p, (c, r), _ in encoded]
    if opts.algo == "grpo":  # as the script: each pair a group of two
        groups = [(p, [c, r], [1.0, 0.0]) for p, c, r in data]
        batch_of = lambda s: m.group_sequences(m.offline_batch(groups, s, opts.batch // 2, args.seed))  # noqa: E731
    else:
        batch_of = lambda s: m.offline_batch(data, s, opts.batch, args.seed)  # noqa: E731

    def load():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)

    policy, ref = load().train(), load().eval().requires_grad_(False)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times, cpu, tokens = [], [], []
    for s in range(opts.steps):
        t0, cpu0 = time.perf_counter(), time.process_time()
        n = 0
        for _, sequences in m.forward_batches(batch_of(s), args, 0, 1):
            ids, attn, mask = m.collate(sequences, tok.pad_token_id, device)
            with autocast:
                with torch.no_grad():
                    m.token_logps(ref, ids, attn, mask)
                m.token_logps(policy, ids, attn, mask).sum().backward()
            n += int(attn.sum())
        for p in policy.parameters():
            p.grad = None
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - cpu0)
        tokens.append(n)
    sync_times, sync_cpu = [], []
    for _ in range(20):
        t0, cpu0 = time.perf_counter(), time.process_time()
        m.sync_reference(ref, policy)
        sync()
        sync_times.append(time.perf_counter() - t0)
        sync_cpu.append(time.process_time() - cpu0)
    return {
        "steps": times,
        "cpu": cpu,
        "tokens": tokens,
        "params": sum(p.numel() for p in policy.parameters()),
        "sync_s": statistics.median(sync_times),
        "sync_cpu": statistics.median(sync_cpu),
        "peak_gib": peak_gib(device),
    }


# ----------------------------------------------------------------------------------------------
# TRL side by side (--trl): DPO on the same model, batches and tokens
# ----------------------------------------------------------------------------------------------

# (name, our script's flags or TRL's DPOConfig options); each repeat runs them all, in order, one fresh process each
SIDE_BY_SIDE = [
    ("ours: offline, 2 models", ["--offline", "--ref_free", "off"]),
    ("ours: offline", ["--offline"]),
    ("ours: humanline k=1", ["--offline", "--humanline"]),
    ("ours: humanline k=16", ["--offline", "--humanline", "--sync_every", "16"]),
    ("TRL: DPO defaults", {}),
    ("TRL: DPO, no checkpointing", {"gradient_checkpointing": False}),
    ("TRL: DPO, precompute_ref_log_probs", {"precompute_ref_log_probs": True}),
    (
        "TRL: DPO, precompute_ref_log_probs, no checkpointing",
        {"precompute_ref_log_probs": True, "gradient_checkpointing": False},
    ),
]
OPTIMISER = dict(  # our scripts' defaults, the same for every algorithm
    learning_rate=5e-6,
    warmup_steps=0.1,
    lr_scheduler_type="linear",
    weight_decay=0.01,
    adam_epsilon=1e-5,
    max_grad_norm=1.0,
)
TRL_SETTINGS = dict(**OPTIMISER, beta=0.1, max_length=1024, seed=0)  # our scripts' defaults


def trainer_options(opts, device):
    """The Trainer options both TRL workers share: --batch per step, --steps steps, no saving, every step logged."""
    return dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=opts.batch,
        max_steps=opts.steps,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        use_cpu=device.type == "cpu",
        bf16=device.type == "cuda",
        dataloader_num_workers=0,
    )


def step_timer(device):
    """({steps, cpu}, a TrainerCallback class that appends each optimizer step's wall and CPU seconds to them)."""
    import torch
    from transformers import TrainerCallback

    timing = {"steps": [], "cpu": []}

    class Timer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.t0, self.cpu0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *_, **__):
            if device.type == "cuda":
                torch.cuda.synchronize()
            timing["steps"].append(time.perf_counter() - self.t0)
            timing["cpu"].append(time.process_time() - self.cpu0)

    return timing, Timer


def trl_worker(opts):
    """TRL's DPOTrainer on our batches, step by step (the same rows in the same order, tokenised alike: checked),
    timed per optimizer step by a callback. Prints {steps, cpu, tokens, peak_gib, same_tokens}."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    import dpo_humanline as m
    import toy_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.steps == 0:  # the interpreter with TRL and its libraries alone
        return {"peak_gib": peak_gib(device)}
    toy = toy_task.load()
    path = toy.model if opts.model_path == "toy" else opts.model_path
    tok = AutoTokenizer.from_pretrained(path)
    with open(toy.offline["strong"]) as f:
        rows = [json.loads(line) for line in f]
    ours = [(p, c, r) for p, (c, r), _ in m.load_data(m.Args(), "preferences", tok, toy, argparse.Namespace(rank=0))]
    order = [i for s in range(opts.steps) for i in m.offline_batch(list(range(len(rows))), s, opts.batch, 0)]
    dataset = datasets.Dataset.from_list([{k: rows[i][k] for k in ("prompt", "chosen", "rejected")} for i in order])
    config = DPOConfig(**trainer_options(opts, device), **TRL_SETTINGS, **json.loads(opts.trl_options))
    timing, Timer = step_timer(device)

    class InOrder(DPOTrainer):  # our step order instead of a shuffle
        def _get_train_sampler(self, *_, **__):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = InOrder(model=model, args=config, train_dataset=dataset, processing_class=tok, callbacks=[Timer()])
    theirs = [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in trainer.train_dataset]
    trainer.train()
    tokens = [
        sum(2 * len(p) + len(c) + len(r) for p, c, r in theirs[s * opts.batch : (s + 1) * opts.batch])
        for s in range(opts.steps)
    ]
    return timing | {"tokens": tokens, "peak_gib": peak_gib(device), "same_tokens": theirs == [ours[i] for i in order]}


# GRPO side by side (--trl --algos grpo): the same prompts per step, group size, length cap, temperature, top-p and
# reward (the toy verifier), the same AdamW settings; end to end (sampling, scoring, training) per step
GRPO_SIDE_BY_SIDE = [
    ("ours: online (on-policy)", ["--online"]),
    ("ours: offline + humanline", ["--offline", "--humanline"]),
    ("ours: off-policy + humanline", ["--online", "--humanline", "--sample_every", "64", "--sync_every", "16"]),
    ("TRL: GRPO defaults", {}),
    ("TRL: GRPO, no checkpointing", {"gradient_checkpointing": False}),
]
TRL_GRPO_SETTINGS = dict(  # each one set to our scripts' online GRPO default; the rest are TRL's own
    **OPTIMISER,
    num_generations=8,
    max_completion_length=40,
    temperature=0.7,
    top_p=0.95,
    top_k=0,
    epsilon=0.15,
    beta=0.0,  # ours: 0.01 against the sampler, which on-policy is the policy itself: the KL term is 0 either way
    loss_type="dapo",  # ours: the step's completion tokens (DAPO)
    scale_rewards="group",
    steps_per_generation=1,  # on-policy: one sampling per optimizer step
    disable_dropout=True,  # ours: dropout off
    seed=0,
)


def trl_grpo_worker(opts):
    """TRL's GRPOTrainer on the toy's training prompts in our first steps' order, scored by the toy verifier, timed
    per optimizer step (sampling, scoring and training: TRL samples inside the step). Prints {steps, cpu, peak_gib}."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import toy_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.steps == 0:
        return {"peak_gib": peak_gib(device)}
    toy = toy_task.load()
    path = toy.model if opts.model_path == "toy" else opts.model_path
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    with open(toy.prompts_train) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    per_step = opts.batch // TRL_GRPO_SETTINGS["num_generations"]
    dataset = datasets.Dataset.from_list([{"prompt": p} for p in prompts[: per_step * opts.steps]])
    config = GRPOConfig(**trainer_options(opts, device), **TRL_GRPO_SETTINGS, **json.loads(opts.trl_options))
    timing, Timer = step_timer(device)

    def verify(prompts, completions, **_):
        return toy_task.verify(prompts, completions)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=verify, args=config, train_dataset=dataset, processing_class=tok, callbacks=[Timer()]
    )
    trainer.train()
    return timing | {"peak_gib": peak_gib(device)}


def grpo_side_by_side(opts, device, workdir):
    """GRPO_SIDE_BY_SIDE, --repeats times interleaved, each run a fresh process. Ours end to end per step: the
    training step plus the sampling and scoring that feed it (a sampling that feeds N steps counts 1/N to each);
    TRL's step holds its sampling. Wall time (sampling is most of it; run on a quiet machine); peak RSS."""
    model = opts.models[0]
    path = "toy" if model == "toy" else random_llama(os.path.join(ROOT, ".cache", "bench"))
    batch, runs, memory = 64, {name: [] for name, _ in GRPO_SIDE_BY_SIDE}, {name: [] for name, _ in GRPO_SIDE_BY_SIDE}
    for rep in range(opts.repeats):
        for name, flags in GRPO_SIDE_BY_SIDE:
            print(f"[{device} {model}] {name} (repeat {rep + 1}/{opts.repeats})", file=sys.stderr, flush=True)
            if isinstance(flags, dict):
                r = run_worker("trl_grpo", "grpo", path, batch, opts.steps, device, trl_options=flags)
                step = statistics.mean(r["steps"])
            else:
                r = run_script("grpo", path, flags, batch, opts.steps, device, workdir)
                every = int(flags[flags.index("--sample_every") + 1]) if "--sample_every" in flags else 1
                sampled = r["round_total_s"] / (every * r["rounds"]) if r["rounds"] else 0.0
                step = statistics.mean(r["steps"]) + sampled
            runs[name].append(step)
            memory[name].append(r["peak_gib"])
    rows = []
    for name, _ in GRPO_SIDE_BY_SIDE:
        row = {"device": device, "model": model, "config": name, "batch_size": batch, "steps": opts.steps}
        row |= {"basis": "wall", "step_s": runs[name], "peak_gib": max(memory[name])}
        for other in ("TRL: GRPO defaults", "TRL: GRPO, no checkpointing"):
            ratios = [a / b for a, b in zip(runs[name], runs[other])]
            row[f"vs {other}"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        row["memory vs TRL defaults"] = row["peak_gib"] / max(memory["TRL: GRPO defaults"])
        rows.append(row)
    return rows


def side_by_side(opts, device, workdir):
    """Every configuration of SIDE_BY_SIDE, --repeats times interleaved (A B C ... A B C ...), each run in a fresh
    process. A run's step time is its mean over all --steps steps (so the reference log-probs computed ahead, at step
    0 and at each sync, count), and each ratio to TRL is taken within one repeat: its median and range over the
    repeats are reported. Peak memory from a separate 3-step run of each (see the docstring)."""
    model = opts.models[0]
    path = "toy" if model == "toy" else random_llama(os.path.join(ROOT, ".cache", "bench"))
    batch = BATCH[model]["dpo"]
    runs = {name: [] for name, _ in SIDE_BY_SIDE}
    for rep in range(opts.repeats):
        for name, flags in SIDE_BY_SIDE:
            print(f"[{device} {model}] {name} (repeat {rep + 1}/{opts.repeats})", file=sys.stderr, flush=True)
            r = (
                run_worker("trl", "dpo", path, batch, opts.steps, device, trl_options=flags)
                if isinstance(flags, dict)
                else run_script("dpo", path, flags, batch, opts.steps, device, workdir)
            )
            runs[name].append(statistics.mean(r["cpu" if device == "cpu" else "steps"]))
            if isinstance(flags, dict) and not r["same_tokens"]:
                raise SystemExit("TRL tokenised the rows differently from our scripts: not the same tokens")
    memory = {}
    for name, flags in SIDE_BY_SIDE:
        print(f"[{device} {model}] {name} (memory)", file=sys.stderr, flush=True)
        memory[name] = (
            run_worker("trl", "dpo", path, batch, 3, device, memory=device == "cpu", trl_options=flags)
            if isinstance(flags, dict)
            else run_script("dpo", path, flags, batch, 3, device, workdir, memory=device == "cpu")
        )["peak_gib"]
    libraries = {
        "ours": run_worker("baseline", "dpo", path, 1, 1, device, memory=device == "cpu")["peak_gib"],
        "TRL": run_worker("trl", "dpo", path, batch, 0, device, memory=device == "cpu")["peak_gib"],
    }
    rows = []
    for name, _ in SIDE_BY_SIDE:
        row = {
            "device": device,
            "model": model,
            "config": name,
            "batch_size": batch,
            "steps": opts.steps,
            "basis": "cpu" if device == "cpu" else "wall",
            "step_s": runs[name],
            "peak_gib": memory[name],
            "libraries_gib": libraries[name.split(":")[0]],
        }
        for other in ("TRL: DPO defaults", "TRL: DPO, no checkpointing"):
            ratios = [a / b for a, b in zip(runs[name], runs[other])]
            row[f"vs {other}"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        row["memory vs TRL precompute"] = memory[name] / memory["TRL: DPO, precompute_ref_log_probs"]
        rows.append(row)
    return rows


def side_by_side_table(rows, algo="DPO"):
    """DPO's table also gives memory against TRL's precomputed run and each side's libraries alone; GRPO's against
    TRL's defaults."""
    dpo = algo == "DPO"
    memory = "memory vs TRL precompute" if dpo else "memory vs TRL defaults"
    last = "/ TRL precompute_ref_log_probs | python + libraries alone (GiB)" if dpo else "/ TRL defaults"
    lines = [
        "| configuration | step (s), median of repeats | / TRL defaults: median [min, max] "
        f"| / TRL no checkpointing: median [min, max] | peak memory (GiB) | {last} |",
        "|---" * (7 if dpo else 6) + "|",
    ]
    for r in rows:
        cell = lambda k: f"{r[k]['median']:.3f} [{r[k]['min']:.3f}, {r[k]['max']:.3f}]"  # noqa: E731
        libraries = f" {r['libraries_gib']:.3f} |" if dpo else ""
        lines.append(
            f"| {r['config']} | {statistics.median(r['step_s']):.3f} | {cell(f'vs TRL: {algo} defaults')} | "
            f"{cell(f'vs TRL: {algo}, no checkpointing')} | {r['peak_gib']:.3f} | {r[memory]:.3f} |{libraries}"
        )
    return "\n".join(lines)


def side_by_side_targets(rows):
    """A target is claimed met or missed only where the ratio's whole range lies on one side of it."""
    get = {r["config"]: r for r in rows}
    checks = [
        ("ours: offline, 2 models", "vs TRL: DPO defaults", 0.9),
        ("ours: offline, 2 models", "vs TRL: DPO, no checkpointing", 1.0),
        ("ours: humanline k=1", "vs TRL: DPO defaults", 1.0),
        ("ours: humanline k=16", "vs TRL: DPO defaults", 1.0),
    ]
    out = []
    for config, key, target in checks:
        x = get[config][key]
        verdict = (
            "met" if x["max"] <= target else "MISSED" if x["min"] > target else "not decided (the range straddles it)"
        )
        out.append(
            f"- {verdict}: {config} {key} <= {target}: median {x['median']:.3f}, range [{x['min']:.3f}, {x['max']:.3f}]"
        )
    pre = get["TRL: DPO, precompute_ref_log_probs"]
    for config in ("ours: offline", "ours: humanline k=1", "ours: humanline k=16"):
        ratio = get[config]["memory vs TRL precompute"]
        net = (get[config]["peak_gib"] - get[config]["libraries_gib"]) / (pre["peak_gib"] - pre["libraries_gib"])
        out.append(
            f"- {'met' if ratio <= 1 else 'MISSED'}: {config} peak memory / TRL precompute_ref_log_probs <= 1: "
            f"{ratio:.3f} "
            f"(less each side's python + libraries: {net:.3f})"
        )
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Running the configurations
# ----------------------------------------------------------------------------------------------


def env_for(device, memory=False):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if memory:  # glibc maps every allocation over 64 KiB on its own and unmaps it when freed: RSS = live memory
        env |= {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    return env


def run_worker(kind, algo, model_path, batch, steps, device, memory=False, trl_options=None):
    """One worker (ours: `baseline` or a step; `trl`, `trl_grpo`: TRL's trainers) in a fresh process: its JSON line."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--algos", algo, "--model_path", model_path]
    cmd += ["--batch", str(batch), "--steps", str(steps), "--trl_options", json.dumps(trl_options or {})]
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(device, memory), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_script(algo, model_path, flags, batch, steps, device, workdir, memory=False):
    out = tempfile.mkdtemp(dir=workdir)
    cmd = [
        sys.executable,
        SCRIPTS[algo],
        "--model_name_or_path",
        model_path,
        "--max_steps",
        str(steps),
        "--batch_size",
        str(batch),
        "--micro_batch_size",
        str(batch),
        "--eval_prompts",
        "none",
        "--save_every",
        "0",
        "--output_dir",
        out,
        *flags,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(device, memory), capture_output=True, text=True)
    try:
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    train = [r for r in records if "perf/step_seconds" in r]
    rounds = [r["online/seconds"] for r in records if "online/seconds" in r]
    return {
        "steps": [r["perf/step_seconds"] for r in train],
        "cpu": [r["perf/step_cpu_seconds"] for r in train],
        "peak_gib": max(r["perf/peak_memory_gib"] for r in train),
        "round_s": statistics.median(rounds) if rounds else None,
        "round_total_s": sum(rounds),
        "rounds": len(rounds),
        "online_tokens_per_s": statistics.median(r["tokens_per_s"] for r in train) if rounds else None,
    }


def bench(opts, device, workdir):
    rows = []
    for model in opts.models:
        model_path = "toy" if model == "toy" else random_llama(os.path.join(ROOT, ".cache", "bench"))
        base = run_worker("baseline", "dpo", model_path, 1, 1, device, memory=device == "cpu")
        rows.append(
            {
                "device": device,
                "model": model,
                "algo": "-",
                "config": "python + libraries",
                "peak_gib": base["peak_gib"],
            }
        )
        for algo in opts.algos:
            batch = BATCH[model][algo]
            configs = [("floor", None)] + OFFLINE + [("online", online_flags(algo, model, batch))]
            results = {}
            for rep in range(opts.repeats):  # repeats interleave the configurations: slow spells hit all alike
                for name, flags in configs:
                    print(
                        f"[{device} {model} {algo}] {name} (repeat {rep + 1}/{opts.repeats})",
                        file=sys.stderr,
                        flush=True,
                    )
                    r = (
                        run_worker("floor", algo, model_path, batch, opts.steps, device)
                        if flags is None
                        else run_script(algo, model_path, flags, batch, opts.steps, device, workdir)
                    )
                    results.setdefault(name, []).append(r)
            memory = {}  # on CPU a separate pass, glibc returning freed memory at once (its timings would suffer)
            for name, flags in configs if device == "cpu" else []:
                print(f"[{device} {model} {algo}] {name} (memory)", file=sys.stderr, flush=True)
                memory[name] = (
                    run_worker("floor", algo, model_path, batch, 3, device, memory=True)
                    if flags is None
                    else run_script(algo, model_path, flags, batch, 3, device, workdir, memory=True)
                )
            floor = results["floor"][0]
            tokens, params = statistics.median(floor["tokens"][1:] or floor["tokens"]), floor["params"]
            wall = {name: min(statistics.mean(r["steps"]) for r in rs) for name, rs in results.items()}
            cpu = {name: min(statistics.mean(r["cpu"]) for r in rs) for name, rs in results.items()}
            median_cpu = {
                name: statistics.median(statistics.mean(r["cpu"]) for r in rs) for name, rs in results.items()
            }
            step = cpu if device == "cpu" else wall  # the basis of the ratios (see the docstring)
            peak = {
                name: (memory[name] if memory else max(rs, key=lambda r: r["peak_gib"]))["peak_gib"]
                for name, rs in results.items()
            }
            sync_wall = min(r["sync_s"] for r in results["floor"])
            sync_cpu = min(r["sync_cpu"] for r in results["floor"])
            sync_s = sync_cpu if device == "cpu" else sync_wall
            cmd_flags = {name: flags for name, flags in configs}
            for name in [c for c, _ in configs] + ["sync"]:
                row = {
                    "device": device,
                    "model": model,
                    "algo": algo,
                    "config": name,
                    "params": params,
                    "batch_size": batch,
                    "steps": opts.steps,
                    "tokens_per_step": tokens,
                    "basis": "cpu" if device == "cpu" else "wall",
                }
                if name == "sync":
                    row |= {
                        "step_s": sync_wall,
                        "step_cpu_s": sync_cpu,
                        "vs_offline": sync_s / step["offline"],
                        "vs_floor": sync_s / step["floor"],
                    }
                else:
                    row |= {
                        "flags": cmd_flags[name],
                        "step_s": wall[name],
                        "step_cpu_s": cpu[name],
                        "vs_offline": step[name] / step["offline"],
                        "vs_floor": step[name] / step["floor"],
                        "peak_gib": peak[name],
                        "peak_vs_offline": peak[name] / peak["offline"],
                        "median_cpu_s": median_cpu[name],
                        "peak_gib_timing_runs": [r["peak_gib"] for r in results[name]],
                        "all_steps": [r["steps"] for r in results[name]],
                        "all_cpu": [r["cpu"] for r in results[name]],
                    }
                    if name == "online":
                        r = results["online"][0]
                        row |= {
                            "round_s": statistics.median(x["round_s"] for x in results["online"]),
                            "completion_tokens_per_s": r["online_tokens_per_s"],
                        }
                    else:
                        row |= {"tokens_per_s": tokens / step[name], "tflops": 8 * params * tokens / step[name] / 1e12}
                        if opts.peak_tflops:
                            row["mfu"] = row["tflops"] / opts.peak_tflops
                rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


def fmt(x, spec):
    return "" if x is None else format(x, spec)


def table(rows):
    lines = []
    for device in dict.fromkeys(r["device"] for r in rows):
        for model in dict.fromkeys(r["model"] for r in rows if r["device"] == device):
            block = [r for r in rows if r["device"] == device and r["model"] == model]
            base = next((r for r in block if r["config"] == "python + libraries"), None)
            first = next(r for r in block if "params" in r)
            mfu = any("mfu" in r for r in block)
            lines += [
                "",
                f"**{model} model on {device}** ({first['params'] / 1e6:.1f}M parameters; python + libraries alone: "
                f"{base['peak_gib']:.2f} GiB peak)"
                if base
                else f"**{model} on {device}**",
                "",
            ]
            lines += [
                "| algo | configuration | step wall (s) | step CPU (s) | / offline | / floor | peak memory (GiB) "
                "| / offline "
                "| tokens/s | TFLOP/s" + (" | MFU" if mfu else "") + " |",
                "|---|---|---|---|---|---|---|---|---|---" + ("|---" if mfu else "") + "|",
            ]
            for r in block:
                if r["config"] == "python + libraries":
                    continue
                if r["config"] == "sync":
                    lines.append(
                        f"| {r['algo']} | sync (one in-place copy) | {r['step_s'] * 1000:.1f} ms "
                        f"| {r['step_cpu_s'] * 1000:.1f} ms | "
                        f"{100 * r['vs_offline']:.2f}% | | | | | |" + (" |" if mfu else "")
                    )
                    continue
                tps = (
                    f"{r['tokens_per_s']:.0f}"
                    if "tokens_per_s" in r
                    else f"{r['completion_tokens_per_s']:.0f} (completions, wall)"
                )
                step = f"{r['step_s']:.3f}" + (f" (+ round {r['round_s']:.2f})" if r.get("round_s") else "")
                lines.append(
                    f"| {r['algo']} | {r['config']} | {step} | {r['step_cpu_s']:.3f} | {r['vs_offline']:.3f} "
                    f"| {r['vs_floor']:.3f} | "
                    f"{r['peak_gib']:.3f} | {r['peak_vs_offline']:.3f} | {tps} | {fmt(r.get('tflops'), '.3f')}"
                    + (f" | {fmt(r.get('mfu'), '.1%')}" if mfu else "")
                    + " |"
                )
    return "\n".join(lines)


def targets(rows):
    """The issue's targets, each with its measured value."""
    out = []

    def get(d, m, a, c):
        return next((r for r in rows if (r["device"], r["model"], r["algo"], r["config"]) == (d, m, a, c)), None)

    for r in rows:
        if r["config"] == "humanline k=1":
            out.append(
                (f"{r['model']} {r['algo']}: humanline k=1 / offline <= 1.05", r["vs_offline"], r["vs_offline"] <= 1.05)
            )
    for r in rows:
        if r["config"] == "sync" and r["model"] == "30m":
            out.append((f"30m {r['algo']}: sync / offline step <= 1%", r["vs_offline"], r["vs_offline"] <= 0.01))
    for r in rows:
        if r["config"] == "offline":
            out.append((f"{r['model']} {r['algo']}: offline / floor <= 1.15", r["vs_floor"], r["vs_floor"] <= 1.15))
    for r in rows:
        pre = get(r["device"], r["model"], r["algo"], "offline, ref-free")
        if r["config"] in ("humanline k=1", "humanline k=16") and r["model"] == "30m" and pre:
            ratio = r["peak_gib"] / pre["peak_gib"]
            out.append(
                (f"30m {r['algo']}: peak memory {r['config']} / offline, ref-free <= 1.05", ratio, ratio <= 1.05)
            )
    return "\n".join(f"- {'met' if ok else 'MISSED'}: {name}: {value:.3f}" for name, value, ok in out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="toy,30m", help="Comma-separated: toy, 30m.")
    p.add_argument("--algos", default="dpo,kto,grpo")
    p.add_argument("--steps", type=int, default=5, help="Optimizer steps per configuration, all timed.")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="Timed runs per configuration, interleaved; the fastest run's mean step counts.",
    )
    p.add_argument("--device", default="auto", help="auto (CPU, and CUDA too when there is a GPU) | cpu | cuda")
    p.add_argument(
        "--peak_tflops",
        type=float,
        default=None,
        help="Peak dense TFLOP/s of the device for MFU (GPU default: from its name).",
    )
    p.add_argument("--quick", action="store_true", help="Toy model, 3 steps: a smoke test.")
    p.add_argument("--out", default=os.path.join(RESULTS, "bench"), help="Writes OUT.jsonl and OUT.md.")
    p.add_argument(
        "--trl",
        action="store_true",
        help="DPO side by side with TRL's DPOTrainer (pip install trl) on the first of --models.",
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trl_options", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--model_path", default=None, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    opts = p.parse_args()
    sys.path.insert(0, ROOT)
    if opts.worker:
        opts.algo = opts.algos
        workers = {"trl": trl_worker, "trl_grpo": trl_grpo_worker}
        print(json.dumps(workers.get(opts.worker, worker)(opts)))
        return
    opts.models, opts.algos = opts.models.split(","), opts.algos.split(",")
    if opts.trl and opts.out == os.path.join(RESULTS, "bench"):
        opts.out = os.path.join(RESULTS, "bench_trl_grpo" if opts.algos == ["grpo"] else "bench_trl")
    if opts.quick:
        opts.models, opts.steps = ["toy"], 3
    import torch

    devices = ["cpu"] if opts.device in ("auto", "cpu") else []
    if opts.device in ("auto", "cuda"):
        if torch.cuda.is_available():
            devices.append("cuda")
            name = torch.cuda.get_device_name()
            opts.peak_tflops = opts.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        else:
            print("no CUDA device found: the GPU rows (bf16, tokens/s, MFU) are skipped", file=sys.stderr)
    command = "python experiments/bench.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for device in devices:
            peak = opts.peak_tflops if device == "cuda" else None
            grpo = opts.trl and opts.algos == ["grpo"]
            run = grpo_side_by_side if grpo else side_by_side if opts.trl else bench
            rows += run(argparse.Namespace(**{**vars(opts), "peak_tflops": peak}), device, workdir)
    meta = {
        "command": command.strip(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_before": load,
        "minutes": (time.time() - start) / 60,
    }
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out + ".jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row | {"meta": meta}) + "\n")
    text = (
        f"`{meta['command']}` ({meta['minutes']:.1f} min; torch {meta['torch']}, {meta['cpus']} CPUs, one thread per "
        f"process, load average {load:.1f} before the run)\n"
    )
    if opts.trl and opts.algos == ["grpo"]:
        text += side_by_side_table(rows, "GRPO") + "\n"
    elif opts.trl:
        text += side_by_side_table(rows) + "\n\nTargets:\n\n" + side_by_side_targets(rows) + "\n"
    else:
        text += table(rows) + "\n\nTargets:\n\n" + targets(rows) + "\n"
    with open(opts.out + ".md", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
