"""What humanline costs per training step: side by side with offline training and with the floor, on the same tokens.

    python experiments/bench.py                       # toy model, a random 30M Llama; DPO, KTO, GRPO (~30 min, 2 cores)
    python experiments/bench.py --models 30m --algos dpo --repeats 2
    python experiments/bench.py --quick               # toy model, 3 steps: a smoke test (~5 min)
    python experiments/bench.py --lora --algos dpo --steps 20 --out experiments/results/bench_lora  # LoRA beside full
    python experiments/bench.py --trl --models 30m --repeats 5 --steps 16            # DPO beside TRL's DPOTrainer
    python experiments/bench.py --trl --algos grpo --models toy --steps 5 --repeats 5 # GRPO beside TRL's GRPOTrainer

(--trl uses TRL, which requirements.txt installs.) Without --trl:

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
    sync             one ReferenceModel.sync (an in-place copy of every parameter into the reference), timed alone

With --lora, LoRA adapters (rank 16 on every linear layer) beside full fine-tuning (offline, humanline k=1), offline
and under humanline at k = 1 and 16, each with the reference held both ways: reference-free (the default) and as a
second set of adapters (`--ref_free off`; never synced, the adapters disabled). The reference log-probs a
reference-free run computes before its first step count in that step (run_in_process times them); the "run CPU"
column is the whole process's CPU time (start-up and load, the same for every row, included).

Measured: each configuration runs in a fresh process (one thread on CPU) for --steps optimizer steps, timed by the
scripts' own perf/ metrics (the step's wall time and CPU time: data, forwards, backward, update; not logging or
checkpoints). A run's step time is its mean over all its steps, so that the reference log-probs a
reference-free run computes ahead count: at each sync, and before its first step (timed by run_in_process, added to
that step); a configuration's step time is the fastest such mean over --repeats runs interleaved with the other
configurations (the median is in the jsonl): other processes on a shared machine only ever add time. On CPU the
ratios are of CPU times (a one-thread process's CPU time is close to its wall time on a quiet core, while its wall
time on a shared one mostly measures the neighbours; both are in the table), on a GPU of wall times. Peak memory is
the scripts' perf/peak_memory_gib: on CPU the process's peak resident set size, from a separate 3-step run with glibc
told to map each allocation over 64 KiB on its own and to unmap it when freed (MALLOC_MMAP_THRESHOLD_; otherwise the
allocator's fragmentation moves the peak by 0.1 GiB from run to run, and the page faults would slow the timed
runs), so it is the peak of live memory: weights, gradients, optimizer state, activations, plus the interpreter
and its libraries (the "python + libraries" figure is that part alone); on a GPU the most CUDA memory
allocated at once. The floor and sync rows run this file's worker on the scripts' own
functions (offline_batch, forward_batches, collate, token_logps, ReferenceModel.sync). tokens/s counts every
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
sys.path.insert(0, ROOT)  # `python experiments/bench.py` from anywhere: the scripts and plumbing are in the root
import plumbing  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")
SCRIPTS = {"dpo": "dpo_humanline.py", "kto": "kto_humanline.py", "grpo": "grpo_humanline.py"}
# --batch_size per model and algorithm (one micro-batch per step): 64 sequences a step on the toy model (DPO: 32 pairs,
# KTO: 32 examples + 32 KL pairs, GRPO: 32 groups of two), 16 on the 30M model
BATCH = {"toy": {"dpo": 32, "kto": 32, "grpo": 64}, "30m": {"dpo": 8, "kto": 8, "grpo": 16}}
# the real model (`python experiments/smollm2.py model`) trains on its task's offline pairs, 4 a step (8 sequences of
# at most 98 tokens, as experiments/run.py's smollm2 suites do); the toy's data is for the toy's tokenizer
SMOLLM2 = ".cache/SmolLM2-135M-Instruct"
SMOLLM2_DATA = ["--dataset", "experiments/smollm2/pairs.jsonl", "--max_length", "128", "--max_prompt_length", "64"]
BATCH["smollm2"] = {"dpo": 4, "kto": 8, "grpo": 16}  # GRPO: two groups of 8


def smollm2_flags(flags):
    """The real model's data for a run with these flags: its pairs offline; online its training prompts, its reward
    (experiments/smollm2.py) and completions of at most 48 tokens."""
    if "--online" not in flags:
        return SMOLLM2_DATA
    online = ["--dataset", "experiments/smollm2/train.jsonl", "--reward_funcs", "experiments.smollm2:reward"]
    return SMOLLM2_DATA[2:] + online + ["--max_new_tokens", "48"]


def model_path(model):
    """--models' name -> the folder the runs load."""
    if model == "smollm2" and not os.path.exists(os.path.join(ROOT, SMOLLM2)):
        raise SystemExit("the real model is not made yet: python experiments/smollm2.py model")
    return {"toy": "toy", "smollm2": SMOLLM2}.get(model) or random_llama(os.path.join(ROOT, ".cache", "bench"))


OFFLINE = [
    ("offline", ["--offline", "--ref_free", "off"]),
    ("offline, ref-free", ["--offline"]),
    ("humanline k=1", ["--offline", "--humanline"]),
    ("k=1, 2 models", ["--offline", "--humanline", "--ref_free", "off"]),
    ("humanline k=16", ["--offline", "--humanline", "--sync_every", "16"]),
]
# --lora: LoRA adapters (rank 16 on every linear layer) beside full fine-tuning, and the two ways to hold a synced
# reference with adapters: computed by the policy at the sync (reference-free, the default) or a second set of adapters
LORA = ["--lora_r", "16"]
LORA_ROWS = [
    ("offline", ["--offline", "--ref_free", "off"]),
    ("humanline k=1", ["--offline", "--humanline"]),
    ("LoRA offline", ["--offline", *LORA]),
    ("LoRA offline, adapters disabled", ["--offline", "--ref_free", "off", *LORA]),
    ("LoRA humanline k=1", ["--offline", "--humanline", *LORA]),
    ("LoRA k=1, adapter reference", ["--offline", "--humanline", "--ref_free", "off", *LORA]),
    ("LoRA humanline k=16", ["--offline", "--humanline", "--sync_every", "16", *LORA]),
    ("LoRA k=16, adapter reference", ["--offline", "--humanline", "--sync_every", "16", "--ref_free", "off", *LORA]),
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
    encoded = plumbing.load_data(
        args, "examples" if opts.algo == "kto" else "preferences", tok, argparse.Namespace(rank=0)
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
    sync_times, sync_cpu, reference = [], [], m.ReferenceModel(ref, rt=None)
    for _ in range(20):
        t0, cpu0 = time.perf_counter(), time.process_time()
        reference.sync(policy, step=0)
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
    ("ours: offline, checkpointing", ["--offline", "--gradient_checkpointing"]),
    ("ours: humanline k=1", ["--offline", "--humanline"]),
    ("ours: humanline k=1, checkpointing", ["--offline", "--humanline", "--gradient_checkpointing"]),
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
    timed per optimizer step by a callback; with precompute_ref_log_probs, the reference pass before the first step
    too. Prints {steps, cpu, ahead: [wall, cpu] of that pass, tokens, peak_gib, same_tokens}."""
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
    args = m.Args(dataset=SMOLLM2_DATA[1], max_length=128, max_prompt_length=64) if path == SMOLLM2 else m.Args()
    with open(toy.offline["strong"] if path != SMOLLM2 else args.dataset) as f:
        rows = [json.loads(line) for line in f]
    ours = [(p, c, r) for p, (c, r), _ in plumbing.load_data(args, "preferences", tok, argparse.Namespace(rank=0))]
    order = [i for s in range(opts.steps) for i in m.offline_batch(list(range(len(rows))), s, opts.batch, 0)]
    dataset = datasets.Dataset.from_list([{k: rows[i][k] for k in ("prompt", "chosen", "rejected")} for i in order])
    config = DPOConfig(**trainer_options(opts, device), **TRL_SETTINGS, **json.loads(opts.trl_options))
    timing, Timer = step_timer(device)

    class InOrder(DPOTrainer):  # our step order instead of a shuffle
        def _get_train_sampler(self, *_, **__):
            return torch.utils.data.SequentialSampler(self.train_dataset)

        def _precompute_ref_logps(self, *a, **kw):  # before the first step: timed, to be shared out among the steps
            t0, cpu0 = time.perf_counter(), time.process_time()
            out = super()._precompute_ref_logps(*a, **kw)
            timing["ahead"] = [time.perf_counter() - t0, time.process_time() - cpu0]
            return out

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
# reward (the toy verifier), the same AdamW settings. End to end (sampling, scoring, training) per step, and the
# training step alone on the completions ours sampled on-policy in the same repeat (TRL gets them from a rollout_func)
GRPO_SIDE_BY_SIDE = [
    ("ours: online (on-policy)", ["--online"]),
    ("ours: online (on-policy), checkpointing", ["--online", "--gradient_checkpointing"]),
    ("ours: offline + humanline", ["--offline", "--humanline"]),
    ("ours: off-policy + humanline", ["--online", "--humanline", "--sample_every", "64", "--sync_every", "16"]),
    ("TRL: GRPO defaults", {}),
    ("TRL: GRPO, no checkpointing", {"gradient_checkpointing": False}),
]
GRPO_TRAINING_ALONE = [  # ours: the on-policy runs above without their sampling
    ("ours: on-policy training step", "ours: online (on-policy)"),
    ("ours: on-policy training step, checkpointing", "ours: online (on-policy), checkpointing"),
    ("TRL: GRPO defaults, our completions", {"our_completions": True}),
    ("TRL: GRPO, no checkpointing, our completions", {"our_completions": True, "gradient_checkpointing": False}),
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
    shuffle_dataset=False,  # the prompts in our run's order: the same prompts at each step
    seed=0,
)


def trl_grpo_worker(opts):
    """TRL's GRPOTrainer on the prompts our on-policy run sampled (opts.samples), step for step, scored by the toy
    verifier, timed per optimizer step. TRL samples inside the step; with {"our_completions": true} a rollout_func
    hands it our run's completions instead (the training step alone), after checking that the prompts it asks for
    are ours in our order and that its tokenisation of them is ours. Prints {steps, cpu, peak_gib, same_tokens}."""
    import datasets
    import smollm2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import toy_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.steps == 0:
        return {"peak_gib": peak_gib(device)}
    path = toy_task.load().model if opts.model_path == "toy" else opts.model_path
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    with open(opts.samples) as f:
        groups = [json.loads(line) for line in f]
    n = TRL_GRPO_SETTINGS["num_generations"]
    columns = ("prompt", "constraint")  # the real model's reward reads each prompt's constraint
    rows = [{k: g[k] for k in columns if k in g} for g in groups[: opts.batch // n * opts.steps]]
    dataset = datasets.Dataset.from_list(rows)
    options = json.loads(opts.trl_options)
    ours = options.pop("our_completions", False)
    if opts.model_path == SMOLLM2:
        options["max_completion_length"] = 48
    config = GRPOConfig(**trainer_options(opts, device), **(TRL_GRPO_SETTINGS | options))
    timing, Timer = step_timer(device)
    fed, same = [], []

    def our_completions(prompts, trainer):  # TRL passes each prompt once per completion, group after group
        mine = groups[len(fed) : len(fed) + len(prompts) // n]
        theirs = trainer._tokenize_prompts(prompts)[0]
        same.append(prompts == [g["prompt"] for g in mine for _ in range(n)])
        same.append(theirs == [g["prompt_ids"] for g in mine for _ in range(n)])
        fed.extend(mine)
        completions = [c for g in mine for c in g["completions"]]
        return {"prompt_ids": theirs, "completion_ids": completions, "logprobs": None}

    def verify(prompts, completions, **kw):
        if opts.model_path == SMOLLM2:
            return smollm2.reward(prompts, completions, **kw)
        return toy_task.verify(prompts, completions)

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func is marked experimental
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=verify,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Timer()],
        rollout_func=our_completions if ours else None,
    )
    same.append(
        trainer._tokenize_prompts(list(dataset["prompt"]))[0] == [g["prompt_ids"] for g in groups[: len(dataset)]]
    )
    trainer.train()
    return timing | {"peak_gib": peak_gib(device), "same_tokens": all(same) and len(fed) == len(dataset) * ours}


def run_in_process(timing, samples, argv):
    """A script's own main() on argv in this process, timing (wall and CPU seconds, written to `timing`) the reference
    log-probs a reference-free run computes before its first step: its step times leave them out (TRL's
    precompute_ref_log_probs pass is timed too). With `samples` (not "-"), GRPO's samples are kept (record_samples)."""
    import ref_free

    reset, ahead = ref_free.PolicyAsReference.reset, []

    def timed_reset(self, policy, step):  # the first reset is the one before the loop (a run here never resumes)
        t0, cpu0 = time.perf_counter(), time.process_time()
        reset(self, policy, step)
        ahead.extend([] if ahead else [time.perf_counter() - t0, time.process_time() - cpu0])

    ref_free.PolicyAsReference.reset = timed_reset
    try:
        if samples != "-":
            return record_samples(samples, argv)
        sys.argv = argv
        __import__(os.path.basename(argv[0]).removesuffix(".py")).main()
    finally:
        with open(timing, "w") as f:
            json.dump(ahead or [0.0, 0.0], f)


def record_samples(path, argv):
    """grpo_humanline.py's own main() on argv, keeping each sampling's groups {prompt, prompt_ids, completions} in
    the order it trains on them (a group with a bad reward is left out, as the script does); written to path."""
    import grpo_humanline as m

    kept, sample_and_score = [], plumbing.sample_and_score

    def recording(*a, **kw):
        groups, record = sample_and_score(*a, **kw)
        if kw.get("prefix", "online") == "online":
            kept.extend(
                {"prompt": g.row["prompt"], "prompt_ids": g.prompt_ids, "completions": g.completions}
                | {k: v for k, v in g.row.items() if k != "prompt"}  # the columns its reward reads
                for g in groups
                if None not in g.scores
            )
        return groups, record

    plumbing.sample_and_score, sys.argv = recording, argv
    try:
        m.main()
    finally:
        with open(path, "w") as f:
            f.writelines(json.dumps(g) + "\n" for g in kept)


def grpo_side_by_side(opts, device, workdir):
    """GRPO_SIDE_BY_SIDE and GRPO_TRAINING_ALONE, --repeats times interleaved, each run a fresh process. Ours end to
    end per step: the training step plus the sampling and scoring that feed it (a sampling that feeds N steps counts
    1/N to each); TRL's step holds its sampling. Wall time (sampling is a large part of it); peak RSS. Each repeat's
    on-policy runs record their completions: TRL's runs take their prompts (and, training alone, the completions)
    from the one without checkpointing."""
    model = opts.models[0]
    path = model_path(model)
    batch, configs = BATCH.get(model, {}).get("grpo", 64), GRPO_SIDE_BY_SIDE + GRPO_TRAINING_ALONE
    if model == "smollm2":  # sampling 64 steps ahead would be 1,024 of its completions: the off-policy row is left out
        configs = [(name, flags) for name, flags in configs if "--sample_every" not in flags]
    runs, memory = {name: [] for name, _ in configs}, {name: [] for name, _ in configs}
    same_completions = []
    for rep in range(opts.repeats):
        recorded = {}
        for name, flags in configs:
            if isinstance(flags, str):  # a training-alone row of ours: the on-policy run without its sampling
                runs[name].append(statistics.mean(recorded[flags]["steps"]))
                memory[name].append(recorded[flags]["peak_gib"])
                continue
            print(f"[{device} {model}] {name} (repeat {rep + 1}/{opts.repeats})", file=sys.stderr, flush=True)
            if isinstance(flags, dict):  # TRL: the prompts (and completions) of our first on-policy run
                samples = os.path.join(workdir, "samples-0.jsonl")
                r = run_worker("trl_grpo", "grpo", path, batch, opts.steps, device, trl_options=flags, samples=samples)
                if not r["same_tokens"]:
                    raise SystemExit(f"{name}: TRL's prompts or their tokens differ from our run's")
                step = statistics.mean(r["steps"])
            else:
                on_policy = flags[0] == "--online" and "--sample_every" not in flags
                samples = on_policy and os.path.join(workdir, f"samples-{len(recorded)}.jsonl")
                r = run_script("grpo", path, flags, batch, opts.steps, device, workdir, record=samples)
                recorded |= {name: r} if on_policy else {}
                every = int(flags[flags.index("--sample_every") + 1]) if "--sample_every" in flags else 1
                sampled = r["round_total_s"] / (every * r["rounds"]) if r["rounds"] else 0.0
                step = statistics.mean(r["steps"]) + sampled
            runs[name].append(step)
            memory[name].append(r["peak_gib"])
        with open(os.path.join(workdir, "samples-0.jsonl")) as a, open(os.path.join(workdir, "samples-1.jsonl")) as b:
            same_completions.append(a.read() == b.read())
    memory = {name: max(m) for name, m in memory.items()}
    rows = compare(
        {name: runs[name] for name, _ in GRPO_SIDE_BY_SIDE if name in runs},
        memory,
        "TRL: GRPO defaults",
        "TRL: GRPO, no checkpointing",
        "TRL: GRPO defaults",
    )
    alone = [name for name, _ in GRPO_TRAINING_ALONE]
    rows += compare({name: runs[name] for name in alone}, memory, alone[2], alone[3], alone[2])
    for row in rows:
        row |= {"device": device, "model": model, "batch_size": batch, "steps": opts.steps, "basis": "wall"}
        row |= {"training_alone": row["config"] in alone, "same_completions_with_checkpointing": same_completions}
    return rows


def side_by_side(opts, device, workdir):
    """Every configuration of SIDE_BY_SIDE, --repeats times interleaved (A B C ... A B C ...), each run in a fresh
    process. A run's step time is its mean over all --steps steps (so the reference log-probs computed ahead, before
    the first step and at each sync, count), and each ratio to TRL is taken within one repeat: its median and range
    over the repeats are reported. Peak memory from a separate 3-step run of each (see the docstring)."""
    model = opts.models[0]
    path = model_path(model)
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
            ahead = r.get("ahead", [0.0, 0.0])[device == "cpu"] / opts.steps  # TRL's precomputed log-probs
            runs[name].append(statistics.mean(r["cpu" if device == "cpu" else "steps"]) + ahead)
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
    precompute = "TRL: DPO, precompute_ref_log_probs"  # the memory target: TRL's DPO without a reference model
    rows = compare(runs, memory, "TRL: DPO defaults", "TRL: DPO, no checkpointing", precompute)
    for row in rows:
        row |= {"device": device, "model": model, "batch_size": batch, "steps": opts.steps}
        row |= {"basis": "cpu" if device == "cpu" else "wall", "libraries_gib": libraries[row["config"].split(":")[0]]}
    return rows


def checkpoints(name):
    """Whether a side-by-side configuration recomputes activations in the backward: ours with
    --gradient_checkpointing, TRL's trainers by default."""
    if name.startswith("ours"):
        return "checkpointing" in name
    return "no checkpointing" not in name


def ratio_stats(a, b):
    """Median and range of a / b, repeat by repeat."""
    ratios = [x / y for x, y in zip(a, b)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def compare(runs, memory, defaults, plain, equal):
    """Each configuration's step against TRL's `defaults`, TRL without checkpointing (`plain`) and TRL's fastest
    configuration that peaks at no more memory than it; its peak memory against `equal` (TRL's memory baseline) run
    with the same checkpointing as it."""
    trl = [n for n in runs if n.startswith("TRL")]
    rows = []
    for name in runs:
        fits = [n for n in trl if memory[n] <= memory[name]]
        fastest = min(fits, key=lambda n: statistics.median(runs[n]), default=None)
        same = equal if checkpoints(name) else f"{equal}, no checkpointing"
        same = same if same in memory else plain  # GRPO: TRL's defaults, or without checkpointing
        row = {"config": name, "step_s": runs[name], "peak_gib": memory[name], "checkpointing": checkpoints(name)}
        row |= {"vs TRL defaults": ratio_stats(runs[name], runs[defaults])}
        row |= {"vs TRL no checkpointing": ratio_stats(runs[name], runs[plain])}
        row |= {"fastest TRL within memory": fastest, "vs fastest TRL within memory": None}
        if fastest:
            row["vs fastest TRL within memory"] = ratio_stats(runs[name], runs[fastest])
        row |= {"memory baseline": same, "memory vs baseline": memory[name] / memory[same]}
        rows.append(row)
    return rows


def side_by_side_table(rows):
    """One line per configuration: its step, the ratios of compare(), its peak memory and its ratio; DPO's rows also
    each side's libraries alone."""
    libraries = "libraries_gib" in rows[0]
    short = lambda name: name.split(": ", 1)[1] if name else "none fits"  # noqa: E731
    lines = [
        "| configuration | step (s), median of repeats | / TRL defaults: median [min, max] "
        "| / TRL no checkpointing: median [min, max] | / TRL's fastest within our memory: median [min, max] "
        "| peak memory (GiB) | / TRL at equal checkpointing |"
        + (" python + libraries alone (GiB) |" if libraries else ""),
        "|---" * (8 if libraries else 7) + "|",
    ]
    for r in rows:
        cell = lambda x: f"{x['median']:.3f} [{x['min']:.3f}, {x['max']:.3f}]" if x else "-"  # noqa: E731
        fastest = r["fastest TRL within memory"]
        lines.append(
            f"| {r['config']} | {statistics.median(r['step_s']):.3f} | {cell(r['vs TRL defaults'])} | "
            f"{cell(r['vs TRL no checkpointing'])} | {cell(r['vs fastest TRL within memory'])} ({short(fastest)}) | "
            f"{r['peak_gib']:.3f} | {r['memory vs baseline']:.3f} ({short(r['memory baseline'])}) |"
            + (f" {r['libraries_gib']:.3f} |" if libraries else "")
        )
    return "\n".join(lines)


def side_by_side_targets(rows):
    """Each of our rows against the targets: step <= 0.9x TRL's default step and <= 1.0x TRL's fastest configuration
    within our memory, claimed only where the ratio's whole range lies on one side; peak memory <= TRL's at equal
    checkpointing."""
    out = []
    for r in rows:
        if not r["config"].startswith("ours"):
            continue
        for key, target in (("vs TRL defaults", 0.9), ("vs fastest TRL within memory", 1.0)):
            x = r[key]
            if x is None:
                out.append(f"- no TRL configuration peaks at or below {r['config']}'s memory ({r['peak_gib']:.3f} GiB)")
                continue
            verdict = "met" if x["max"] <= target else "MISSED" if x["min"] > target else "not decided (straddles it)"
            which = f" ({r['fastest TRL within memory']})" if key.startswith("vs fastest") else ""
            out.append(
                f"- {verdict}: {r['config']} {key}{which} <= {target}: "
                f"median {x['median']:.3f}, range [{x['min']:.3f}, {x['max']:.3f}]"
            )
        ratio = r["memory vs baseline"]
        verdict = "met" if ratio <= 1 else "MISSED"
        out.append(f"- {verdict}: {r['config']} peak memory / {r['memory baseline']} <= 1: {ratio:.3f}")
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


def run_worker(kind, algo, model_path, batch, steps, device, memory=False, trl_options=None, samples=""):
    """One worker (ours: `baseline` or a step; `trl`, `trl_grpo`: TRL's trainers) in a fresh process: its JSON line."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--algos", algo, "--model_path", model_path]
    cmd += ["--batch", str(batch), "--steps", str(steps), "--trl_options", json.dumps(trl_options or {})]
    cmd += ["--samples", samples]
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(device, memory), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_script(algo, model_path, flags, batch, steps, device, workdir, memory=False, record=None):
    """The script in a fresh process, its per-step metrics: timed runs under run_in_process, whose reference pass
    before the first step is added to that step (samples kept when `record` names a file); memory runs alone."""
    out = tempfile.mkdtemp(dir=workdir)
    timing = out + ".ahead.json"
    cmd = (
        [sys.executable]
        + ([] if memory else [os.path.abspath(__file__), "--in_process", timing, record or "-"])
        + [
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
        + (smollm2_flags(flags) if model_path == SMOLLM2 else [])
    )
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(device, memory), capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        ahead = [0.0, 0.0]  # (wall, CPU) of the reference pass before the first step: that step's share
        if not memory:
            with open(timing) as f:
                ahead = json.load(f)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if os.path.exists(timing):
            os.remove(timing)
    train = [r for r in records if "perf/step_seconds" in r]
    rounds = [r["online/seconds"] for r in records if "online/seconds" in r]
    return {
        "steps": [r["perf/step_seconds"] + (i == 0) * ahead[0] for i, r in enumerate(train)],
        # the whole process's CPU time: start-up and load, the steps, the final save
        "run_cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "cpu": [r["perf/step_cpu_seconds"] + (i == 0) * ahead[1] for i, r in enumerate(train)],
        "before_first_step": ahead,  # (wall, CPU), already in the first step
        "peak_gib": max(r["perf/peak_memory_gib"] for r in train),
        "round_s": statistics.median(rounds) if rounds else None,
        "round_total_s": sum(rounds),
        "rounds": len(rounds),
        "online_tokens_per_s": statistics.median(r["tokens_per_s"] for r in train) if rounds else None,
    }


def bench(opts, device, workdir):
    rows = []
    for model in opts.models:
        path = model_path(model)
        base = run_worker("baseline", "dpo", path, 1, 1, device, memory=device == "cpu")
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
            configs = [("floor", None)] + LORA_ROWS if opts.lora else configs
            results = {}
            for rep in range(opts.repeats):  # repeats interleave the configurations: slow spells hit all alike
                for name, flags in configs:
                    print(
                        f"[{device} {model} {algo}] {name} (repeat {rep + 1}/{opts.repeats})",
                        file=sys.stderr,
                        flush=True,
                    )
                    r = (
                        run_worker("floor", algo, path, batch, opts.steps, device)
                        if flags is None
                        else run_script(algo, path, flags, batch, opts.steps, device, workdir)
                    )
                    results.setdefault(name, []).append(r)
            memory = {}  # on CPU a separate pass, glibc returning freed memory at once (its timings would suffer)
            for name, flags in configs if device == "cpu" else []:
                print(f"[{device} {model} {algo}] {name} (memory)", file=sys.stderr, flush=True)
                memory[name] = (
                    run_worker("floor", algo, path, batch, 3, device, memory=True)
                    if flags is None
                    else run_script(algo, path, flags, batch, 3, device, workdir, memory=True)
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
                        "run_cpu_s": min(r.get("run_cpu", 0.0) for r in results[name]),
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
            whole = any(r.get("run_cpu_s") for r in block)  # the whole process's CPU time, where measured
            lines += [
                "| algo | configuration | step wall (s) | step CPU (s) | / offline | / floor | peak memory (GiB) "
                "| / offline "
                "| tokens/s | TFLOP/s" + (" | MFU" if mfu else "") + (" | run CPU (s)" if whole else "") + " |",
                "|---|---|---|---|---|---|---|---|---|---" + ("|---" if mfu else "") + ("|---" if whole else "") + "|",
            ]
            for r in block:
                if r["config"] == "python + libraries":
                    continue
                if r["config"] == "sync":
                    lines.append(
                        f"| {r['algo']} | sync (one in-place copy) | {r['step_s'] * 1000:.1f} ms "
                        f"| {r['step_cpu_s'] * 1000:.1f} ms | "
                        f"{100 * r['vs_offline']:.2f}% | | | | | |" + (" |" if mfu else "") + (" |" if whole else "")
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
                    + (f" | {fmt(r.get('run_cpu_s'), '.2f')}" if whole else "")
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
    p.add_argument("--models", default="toy,30m", help="Comma-separated: toy, 30m, smollm2 (the real model).")
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
    p.add_argument("--lora", action="store_true", help="LoRA adapters beside full fine-tuning, offline.")
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
    p.add_argument("--samples", default="", help=argparse.SUPPRESS)
    if sys.argv[1:2] == ["--in_process"]:  # a timed run: the script in this process
        return run_in_process(sys.argv[2], sys.argv[3], sys.argv[4:])
    opts = p.parse_args()
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
        end_to_end, alone = [r for r in rows if not r["training_alone"]], [r for r in rows if r["training_alone"]]
        same = rows[0]["same_completions_with_checkpointing"]
        text += "\nEnd to end (sampling, scoring, training) per step:\n\n" + side_by_side_table(end_to_end) + "\n"
        text += "\nThe training step alone, on the completions our on-policy run sampled (TRL: through a rollout_func; "
        text += f"our on-policy run with checkpointing sampled the same completions in {sum(same)} of {len(same)} "
        text += "repeats):\n\n" + side_by_side_table(alone) + "\n\nTargets:\n\n" + side_by_side_targets(rows) + "\n"
    elif opts.trl:
        text += side_by_side_table(rows) + "\n\nTargets:\n\n" + side_by_side_targets(rows) + "\n"
    else:
        text += table(rows) + "\n\nTargets:\n\n" + targets(rows) + "\n"
    with open(opts.out + ".md", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
