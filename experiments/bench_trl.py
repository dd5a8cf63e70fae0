"""Our scripts beside TRL's trainers: the same model, rows in the same order, token ids (checked), optimiser settings.

    python experiments/bench_trl.py --models 30m --repeats 5 --steps 16            # DPO beside TRL's DPOTrainer
    python experiments/bench_trl.py --algos grpo --models toy --steps 5 --repeats 5  # GRPO beside TRL's GRPOTrainer

Each configuration runs in a fresh one-thread process, --repeats times interleaved; each ratio to TRL is taken within
one repeat, its median and range reported. DPO: CPU seconds per step (TRL's precompute_ref_log_probs pass and our
reference-free pass before the first step counted in it), peak memory from separate 3-step runs. GRPO end to end
(sampling, scoring, training) in wall seconds, and the training step alone on the completions our on-policy run sampled
(TRL takes them through a rollout_func). How each of TRL's settings was chosen: docs/benchmarks.md. Writes OUT.jsonl
and OUT.md (experiments/results/bench_trl, or bench_trl_grpo).
"""

import json
import os
import statistics
import sys
import tempfile
import time

import bench
from bench import ROOT, peak_gib, run_worker, timed_run

PLAIN, PRECOMPUTE = {"gradient_checkpointing": False}, {"precompute_ref_log_probs": True}  # TRL's DPOConfig options
# (name, our script's flags or TRL's DPOConfig options); each repeat runs them all, in order, one fresh process each
SIDE_BY_SIDE = [
    ("ours: offline, 2 models", ["--offline", "--ref_free", "off"]),
    ("ours: offline", ["--offline"]),
    ("ours: offline, checkpointing", ["--offline", "--gradient_checkpointing"]),
    ("ours: humanline k=1", ["--offline", "--humanline"]),
    ("ours: humanline k=1, checkpointing", ["--offline", "--humanline", "--gradient_checkpointing"]),
    ("ours: humanline k=16", ["--offline", "--humanline", "--sync_every", "16"]),
    ("TRL: DPO defaults", {}),
    ("TRL: DPO, no checkpointing", PLAIN),
    ("TRL: DPO, precompute_ref_log_probs", PRECOMPUTE),
    ("TRL: DPO, precompute_ref_log_probs, no checkpointing", PRECOMPUTE | PLAIN),
]
# our scripts' defaults, the same for every algorithm
OPTIMISER = dict(learning_rate=5e-6, warmup_steps=0.1, lr_scheduler_type="linear", weight_decay=0.01, adam_epsilon=1e-5)
OPTIMISER |= dict(max_grad_norm=1.0)
TRL_SETTINGS = dict(**OPTIMISER, beta=0.1, max_length=1024, seed=0)
# GRPO: the same prompts per step, group size, length cap, temperature, top-p and reward, the same AdamW settings
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
# each one set to our scripts' online GRPO default; the rest are TRL's own
TRL_GRPO_SETTINGS = dict(**OPTIMISER, num_generations=8, max_completion_length=40, temperature=0.7, top_p=0.95)
TRL_GRPO_SETTINGS |= dict(
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


# ---- TRL's runs (a fresh process each) -------------------------------------------------------------------------------
def trainer_options(opts, device):
    """The Trainer options both TRL workers share: --batch per step, --steps steps, no saving, every step logged."""
    options = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=opts.batch, max_steps=opts.steps)
    options |= dict(save_strategy="no", report_to=[], logging_steps=1, dataloader_num_workers=0)
    return options | dict(use_cpu=device.type == "cpu", bf16=device.type == "cuda")


def step_timer(device):
    """({steps, cpu}, a TrainerCallback class that appends each optimizer step's wall and CPU seconds to them)."""
    import torch
    from transformers import TrainerCallback

    timing, sync = {"steps": [], "cpu": []}, torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    class Timer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            sync()
            self.t0, self.cpu0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *_, **__):
            sync()
            timing["steps"].append(time.perf_counter() - self.t0)
            timing["cpu"].append(time.process_time() - self.cpu0)

    return timing, Timer


def trl_worker(opts):
    """TRL's DPOTrainer on our batches, step by step (the same rows in the same order, tokenised alike: checked),
    timed per optimizer step by a callback; with precompute_ref_log_probs, the reference pass before the first step
    too. Prints {steps, cpu, ahead: [wall, cpu] of that pass, tokens, peak_gib, same_tokens}."""
    import argparse

    import datasets
    import torch
    from trl import DPOConfig, DPOTrainer

    import data_formats
    import dpo_humanline as m
    import plumbing

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.steps == 0:  # the interpreter with TRL and its libraries alone
        return {"peak_gib": peak_gib(device)}
    real = opts.model_path == bench.smollm2.MODEL  # the real model: its constraints task's pairs
    args = m.Args(model_name_or_path=opts.model_path)
    if real:
        args.dataset, args.max_length, args.max_prompt_length = bench.smollm2.data("constraints", "pairs"), 128, 64
    tok = plumbing.load_tokenizer(args)
    rows = [json.loads(line) for line in open(args.toy.offline["strong"] if not real else args.dataset)]
    ours = [(p, c, r) for p, (c, r), _ in data_formats.load_data(args, "preferences", tok, argparse.Namespace(rank=0))]
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

    auto = plumbing.transformers.AutoModelForCausalLM
    model = plumbing.pretrained(auto, plumbing.model_name(args), args, dtype=torch.float32)
    trainer = InOrder(model=model, args=config, train_dataset=dataset, processing_class=tok, callbacks=[Timer()])
    theirs = [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in trainer.train_dataset]
    trainer.train()
    b = opts.batch
    tokens = [sum(2 * len(p) + len(c) + len(r) for p, c, r in theirs[s * b : (s + 1) * b]) for s in range(opts.steps)]
    return timing | {"tokens": tokens, "peak_gib": peak_gib(device), "same_tokens": theirs == [ours[i] for i in order]}


def trl_grpo_worker(opts):
    """TRL's GRPOTrainer on the prompts our on-policy run sampled (opts.samples), step for step, scored by our reward,
    timed per optimizer step. TRL samples inside the step; with {"our_completions": true} a rollout_func hands it our
    run's completions instead (the training step alone), after checking that the prompts it asks for are ours in our
    order and that its tokenisation of them is ours. Prints {steps, cpu, peak_gib, same_tokens}."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import toy_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if opts.steps == 0:
        return {"peak_gib": peak_gib(device)}
    real = opts.model_path == bench.smollm2.MODEL
    path = toy_task.load().model if opts.model_path == "toy" else opts.model_path
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    groups, n = [json.loads(line) for line in open(opts.samples)], TRL_GRPO_SETTINGS["num_generations"]
    columns = [k for k in groups[0] if k not in ("prompt_ids", "completions")]  # the prompt, what the reward reads
    dataset = datasets.Dataset.from_list([{k: g[k] for k in columns} for g in groups[: opts.batch // n * opts.steps]])
    options = json.loads(opts.trl_options)
    ours = options.pop("our_completions", False)
    options |= {"max_completion_length": bench.smollm2.TASKS["constraints"][1]} if real else {}
    config = GRPOConfig(**trainer_options(opts, device), **(TRL_GRPO_SETTINGS | options))
    timing, Timer = step_timer(device)
    fed, same = [], []

    def our_completions(prompts, trainer):  # TRL passes each prompt once per completion, group after group
        mine = groups[len(fed) : len(fed) + len(prompts) // n]
        theirs = trainer._tokenize_prompts(prompts)[0]
        same.append(prompts == [g["prompt"] for g in mine for _ in range(n)])
        same.append(theirs == [g["prompt_ids"] for g in mine for _ in range(n)])
        fed.extend(mine)
        return {"prompt_ids": theirs, "completion_ids": [c for g in mine for c in g["completions"]], "logprobs": None}

    def reward(prompts, completions, **kw):  # TRL gives the completions' ids, ours give `finished`: both mark a cut
        return bench.smollm2.reward(prompts, completions, **kw) if real else toy_task.verify(prompts, completions)

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func is marked experimental
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hooks = dict(processing_class=tok, callbacks=[Timer()], rollout_func=our_completions if ours else None)
    trainer = GRPOTrainer(model, reward, config, dataset, **hooks)
    theirs = trainer._tokenize_prompts(list(dataset["prompt"]))[0]
    same.append(theirs == [g["prompt_ids"] for g in groups[: len(dataset)]])
    trainer.train()
    return timing | {"peak_gib": peak_gib(device), "same_tokens": all(same) and len(fed) == len(dataset) * ours}


# ---- the comparison --------------------------------------------------------------------------------------------------
def side_by_side(opts, device, workdir):
    """Every configuration of SIDE_BY_SIDE, --repeats times interleaved (A B C ... A B C ...), each run in a fresh
    process. A run's step time is its mean over all --steps steps (so the reference log-probs computed ahead, before
    the first step and at each sync, count), and each ratio to TRL is taken within one repeat: its median and range
    over the repeats are reported. Peak memory from a separate 3-step run of each."""
    model, cpu = opts.models[0], device == "cpu"
    path, batch = bench.model_path(model), bench.BATCH[model]["dpo"]
    runs, memory = {name: [] for name, _ in SIDE_BY_SIDE}, {}

    def run(name, flags, steps, memory=False):
        print(f"[{device} {model}] {name}", file=sys.stderr, flush=True)
        if isinstance(flags, dict):
            return run_worker(__file__, "trl", "dpo", path, batch, steps, device, memory, trl_options=flags)
        return timed_run("dpo", path, flags, batch, steps, device, workdir, memory=memory)

    for _, (name, flags) in [(rep, c) for rep in range(opts.repeats) for c in SIDE_BY_SIDE]:
        r = run(name, flags, opts.steps)
        if isinstance(flags, dict) and not r["same_tokens"]:
            raise SystemExit("TRL tokenised the rows differently from our scripts: not the same tokens")
        ahead = r.get("ahead", [0.0, 0.0])[cpu] / opts.steps  # TRL's precomputed log-probs
        runs[name].append(statistics.mean(r["cpu" if cpu else "steps"]) + ahead)
    for name, flags in SIDE_BY_SIDE:
        memory[name] = run(f"{name} (memory)", flags, 3, memory=cpu)["peak_gib"]
    libraries = {  # each side's interpreter with its libraries alone
        "ours": run_worker(bench.__file__, "baseline", "dpo", path, 1, 1, device, memory=cpu)["peak_gib"],
        "TRL": run_worker(__file__, "trl", "dpo", path, batch, 0, device, memory=cpu)["peak_gib"],
    }
    trl = ("TRL: DPO defaults", "TRL: DPO, no checkpointing", "TRL: DPO, precompute_ref_log_probs")
    rows = compare(runs, memory, *trl)
    for row in rows:
        row |= dict(device=device, model=model, batch_size=batch, steps=opts.steps, basis="cpu" if cpu else "wall")
        row |= {"libraries_gib": libraries[row["config"].split(":")[0]]}
    return rows


def grpo_side_by_side(opts, device, workdir):
    """GRPO_SIDE_BY_SIDE and GRPO_TRAINING_ALONE, --repeats times interleaved, each run a fresh process. Ours end to
    end per step: the training step plus the sampling and scoring that feed it (a sampling that feeds N steps counts
    1/N to each); TRL's step holds its sampling. Wall time (sampling is a large part of it); peak RSS. Each repeat's
    on-policy runs record their completions: TRL's runs take their prompts (and, training alone, the completions)
    from the one without checkpointing."""
    model = opts.models[0]
    path, batch, configs = bench.model_path(model), bench.BATCH[model]["grpo"], GRPO_SIDE_BY_SIDE + GRPO_TRAINING_ALONE
    if model == "smollm2":  # sampling 64 steps ahead would be 1,024 of its completions: the off-policy row is left out
        configs = [(name, flags) for name, flags in configs if "--sample_every" not in flags]
    runs, memory, same_completions = {name: [] for name, _ in configs}, {name: [] for name, _ in configs}, []
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
                trl = dict(trl_options=flags, samples=samples)
                r = run_worker(__file__, "trl_grpo", "grpo", path, batch, opts.steps, device, **trl)
                if not r["same_tokens"]:
                    raise SystemExit(f"{name}: TRL's prompts or their tokens differ from our run's")
                step = statistics.mean(r["steps"])
            else:
                on_policy = flags[0] == "--online" and "--sample_every" not in flags
                samples = on_policy and os.path.join(workdir, f"samples-{len(recorded)}.jsonl")
                r = timed_run("grpo", path, flags, batch, opts.steps, device, workdir, record=samples)
                recorded |= {name: r} if on_policy else {}
                every = int(flags[flags.index("--sample_every") + 1]) if "--sample_every" in flags else 1
                sampling = r["round_total_s"] / (every * r["rounds"]) if r["rounds"] else 0.0  # a round's share
                step = statistics.mean(r["steps"]) + sampling
            runs[name].append(step)
            memory[name].append(r["peak_gib"])
        with open(os.path.join(workdir, "samples-0.jsonl")) as a, open(os.path.join(workdir, "samples-1.jsonl")) as b:
            same_completions.append(a.read() == b.read())
    memory = {name: max(m) for name, m in memory.items()}
    end_to_end = {name: runs[name] for name, _ in GRPO_SIDE_BY_SIDE if name in runs}
    rows = compare(end_to_end, memory, "TRL: GRPO defaults", "TRL: GRPO, no checkpointing", "TRL: GRPO defaults")
    alone = [name for name, _ in GRPO_TRAINING_ALONE]
    rows += compare({name: runs[name] for name in alone}, memory, alone[2], alone[3], alone[2])
    for row in rows:
        row |= {"device": device, "model": model, "batch_size": batch, "steps": opts.steps, "basis": "wall"}
        row |= {"training_alone": row["config"] in alone, "same_completions_with_checkpointing": same_completions}
    return rows


def checkpoints(name):
    """Whether a configuration recomputes activations in the backward: ours with --gradient_checkpointing, TRL's
    trainers by default."""
    return "checkpointing" in name if name.startswith("ours") else "no checkpointing" not in name


def ratio_stats(a, b):
    """Median and range of a / b, repeat by repeat."""
    ratios = [x / y for x, y in zip(a, b)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def compare(runs, memory, defaults, plain, equal):
    """Each configuration's step against TRL's `defaults`, TRL without checkpointing (`plain`) and TRL's fastest
    configuration that peaks at no more memory than it; its peak memory against `equal` (TRL's memory baseline) run
    with the same checkpointing as it."""
    trl, rows = [n for n in runs if n.startswith("TRL")], []
    for name in runs:
        fits = [n for n in trl if memory[n] <= memory[name]]
        fastest = min(fits, key=lambda n: statistics.median(runs[n]), default=None)
        same = equal if checkpoints(name) else f"{equal}, no checkpointing"
        same = same if same in memory else plain  # GRPO: TRL's defaults, or without checkpointing
        row = {"config": name, "step_s": runs[name], "peak_gib": memory[name], "checkpointing": checkpoints(name)}
        row |= {"vs TRL defaults": ratio_stats(runs[name], runs[defaults])}
        row |= {"vs TRL no checkpointing": ratio_stats(runs[name], runs[plain])}
        row |= {
            "fastest TRL within memory": fastest,
            "vs fastest TRL within memory": fastest and ratio_stats(runs[name], runs[fastest]),
        }
        rows.append(row | {"memory baseline": same, "memory vs baseline": memory[name] / memory[same]})
    return rows


def side_by_side_table(rows):
    """One line per configuration: its step, the ratios of compare(), its peak memory and its ratio; DPO's rows also
    each side's libraries alone."""
    from report import table  # the one markdown table of experiments/ (imported late: a worker's memory is measured)

    libraries, spread = "libraries_gib" in rows[0], "median [min, max]"
    columns = f"configuration | step (s), median of repeats | / TRL defaults: {spread}"
    columns += f" | / TRL no checkpointing: {spread} | / TRL's fastest within our memory: {spread}"
    columns += " | peak memory (GiB) | / TRL at equal checkpointing" + " | python + libraries alone (GiB)" * libraries

    def cell(x):
        return f"{x['median']:.3f} [{x['min']:.3f}, {x['max']:.3f}]" if x else "-"

    found = []
    for r in rows:
        fastest, baseline = r["fastest TRL within memory"], r["memory baseline"]
        fastest, baseline = fastest.split(": ", 1)[1] if fastest else "none fits", baseline.split(": ", 1)[1]
        cells = [r["config"], f"{statistics.median(r['step_s']):.3f}", cell(r["vs TRL defaults"])]
        cells += [cell(r["vs TRL no checkpointing"]), f"{cell(r['vs fastest TRL within memory'])} ({fastest})"]
        cells += [f"{r['peak_gib']:.3f}", f"{r['memory vs baseline']:.3f} ({baseline})"]
        found.append(cells + [f"{r.get('libraries_gib', 0):.3f}"] * libraries)
    return "\n".join(table(columns, found))


def side_by_side_targets(rows):
    """Each of our rows against the targets: step <= 0.9x TRL's default step and <= 1.0x TRL's fastest configuration
    within our memory, claimed only where the ratio's whole range lies on one side; peak memory <= TRL's at equal
    checkpointing."""
    out = []
    for r in [r for r in rows if r["config"].startswith("ours")]:
        for key, target in (("vs TRL defaults", 0.9), ("vs fastest TRL within memory", 1.0)):
            x = r[key]
            if x is None:
                out.append(f"- no TRL configuration peaks at or below {r['config']}'s memory ({r['peak_gib']:.3f} GiB)")
                continue
            verdict = "met" if x["max"] <= target else "MISSED" if x["min"] > target else "not decided (straddles it)"
            which = f" ({r['fastest TRL within memory']})" if key.startswith("vs fastest") else ""
            spread = f"median {x['median']:.3f}, range [{x['min']:.3f}, {x['max']:.3f}]"
            out.append(f"- {verdict}: {r['config']} {key}{which} <= {target}: {spread}")
        ratio, verdict = r["memory vs baseline"], "met" if r["memory vs baseline"] <= 1 else "MISSED"
        out.append(f"- {verdict}: {r['config']} peak memory / {r['memory baseline']} <= 1: {ratio:.3f}")
    return "\n".join(out)


def main():
    p = bench.parser(__doc__.split("\n")[0], "bench_trl")
    p.set_defaults(models="30m", algos="dpo")
    opts = p.parse_args()
    if opts.worker:
        return print(json.dumps({"trl": trl_worker, "trl_grpo": trl_grpo_worker}[opts.worker](opts)))
    opts.models, grpo = opts.models.split(","), opts.algos == "grpo"
    if grpo and opts.out.endswith("bench_trl"):
        opts.out += "_grpo"
    start, load, rows = time.time(), os.getloadavg()[0], []
    with tempfile.TemporaryDirectory() as workdir:
        for device in bench.devices(opts):
            rows += (grpo_side_by_side if grpo else side_by_side)(opts, device, workdir)
    text = side_by_side_table(rows)
    if grpo:
        same, alone = rows[0]["same_completions_with_checkpointing"], [r for r in rows if r["training_alone"]]
        end_to_end = [r for r in rows if not r["training_alone"]]
        text = "\nEnd to end (sampling, scoring, training) per step:\n\n" + side_by_side_table(end_to_end)
        text += "\n\nThe training step alone, on the completions our on-policy run sampled (TRL: through a"
        text += " rollout_func; our on-policy run with checkpointing sampled the same completions in"
        text += f" {sum(same)} of {len(same)} repeats):\n\n" + side_by_side_table(alone)
    bench.write(opts, rows, text + "\n\nTargets:\n\n" + side_by_side_targets(rows) + "\n", start, load)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
