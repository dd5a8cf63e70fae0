"""What humanline costs per training step: side by side with offline training and with the floor, on the same tokens.

    python experiments/bench.py                       # toy model, a random 30M Llama; DPO, KTO, GRPO (~30 min, 2 cores)
    python experiments/bench.py --models 30m --algos dpo --repeats 2
    python experiments/bench.py --quick               # toy model, 3 steps: a smoke test (~5 min)
    python experiments/bench.py --lora --algos dpo --steps 20 --out experiments/results/bench_lora  # LoRA beside full

Each configuration runs the script in a fresh one-thread process for --steps steps on the same offline batches, timed
by the scripts' own perf/ metrics (a reference-free run's reference pass before its first step counted in that step);
repeats interleave the configurations and the fastest mean counts; on a CPU the ratios are of CPU seconds, peak memory
from a separate 3-step run with glibc returning freed memory at once. The rows, the floor and what each number means:
docs/benchmarks.md. Beside TRL's trainers: bench_trl.py. Writes OUT.jsonl and OUT.md (experiments/results/bench).
"""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import smollm2
from smollm2 import ROOT  # and the root on the path: the scripts and plumbing

import data_formats  # noqa: E402
import plumbing  # noqa: E402

RESULTS = os.path.join(ROOT, "experiments", "results")
SCRIPTS = {"dpo": "dpo_humanline.py", "kto": "kto_humanline.py", "grpo": "grpo_humanline.py"}
# --batch_size per model and algorithm (one micro-batch per step): 64 sequences a step on the toy model (DPO: 32 pairs,
# KTO: 32 examples + 32 KL pairs, GRPO: 32 groups of two), 16 on the 30M model; the real model's as its runs take
BATCH = {"toy": {"dpo": 32, "kto": 32, "grpo": 64}, "30m": {"dpo": 8, "kto": 8, "grpo": 16}}
BATCH["smollm2"] = {"dpo": 4, "kto": 8, "grpo": 16}  # GRPO: two groups of 8
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
K16 = ["--sync_every", "16"]
LORA_ROWS = [OFFLINE[0], OFFLINE[2], ("LoRA offline", ["--offline", *LORA])]
LORA_ROWS += [("LoRA offline, adapters disabled", ["--offline", "--ref_free", "off", *LORA])]
LORA_ROWS += [("LoRA humanline k=1", ["--offline", "--humanline", *LORA])]
LORA_ROWS += [("LoRA k=1, adapter reference", ["--offline", "--humanline", "--ref_free", "off", *LORA])]
LORA_ROWS += [("LoRA humanline k=16", ["--offline", "--humanline", *K16, *LORA])]
LORA_ROWS += [("LoRA k=16, adapter reference", ["--offline", "--humanline", *K16, "--ref_free", "off", *LORA])]
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}  # dense bf16


def online_flags(algo, model, batch):
    """A round covers about two steps: DPO/KTO sample 2 x (pairs a step) prompts x 4; GRPO samples groups of 4 for
    two steps (--sample_every 2). The random 30M model's samples all score 0: --reward_threshold 0 keeps its pairs."""
    if algo == "grpo":
        return ["--online", "--num_generations", "4", "--sample_every", "2"]
    pairs = batch if algo == "dpo" else batch // 2
    flags = ["--online", "--round_size", str(2 * pairs if algo == "dpo" else 4 * pairs), "--num_samples", "4"]
    return flags + (["--reward_threshold", "0"] if model != "toy" else [])


def smollm2_flags(flags):
    """The real model's constraints task for a run with these flags, as experiments/smollm2.py sets its runs: its pairs
    offline; online its training prompts, reward and completion length."""
    online, (reward, longest) = "--online" in flags, smollm2.TASKS["constraints"]
    out = smollm2.LENGTHS + ["--dataset", smollm2.data("constraints", "train" if online else "pairs")]
    return out + (["--reward_funcs", reward, "--max_new_tokens", str(longest)] if online else [])


def model_path(model):
    """--models' name -> the folder the runs load."""
    if model == "smollm2" and not os.path.exists(os.path.join(ROOT, smollm2.MODEL)):
        raise SystemExit("the real model is not made yet: python experiments/smollm2.py model")
    return {"toy": "toy", "smollm2": smollm2.MODEL}.get(model) or random_llama(os.path.join(ROOT, ".cache", "bench"))


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
    sizes = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=9, num_attention_heads=8)
    special = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    config = LlamaConfig(vocab_size=len(tok), **sizes, max_position_embeddings=64, tie_word_embeddings=True, **special)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path + ".tmp")
    tok.save_pretrained(path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


# ---- the floor (a fresh process): a bare forward + backward of the policy, a no-grad forward of the reference -----
def peak_gib(device):
    import torch

    import memory_plan

    return memory_plan.peak_memory_gib(torch.device(device))


def worker(opts):
    """`floor`: --steps bare steps on the script's own batching and log-probs (no loss, optimizer or logging), then
    20 in-place syncs (ReferenceModel.sync); `baseline`: the interpreter with its libraries alone. Prints JSON."""
    import importlib

    import torch
    from transformers import AutoModelForCausalLM

    m = importlib.import_module(SCRIPTS[opts.algos][:-3])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args = m.Args(model_name_or_path=opts.model_path, batch_size=opts.batch, micro_batch_size=opts.batch)
    tok = plumbing.load_tokenizer(args)
    if opts.worker == "baseline":
        importlib.import_module("datasets")  # the scripts import it to read data
        return {"peak_gib": peak_gib(device)}
    kind = "examples" if opts.algos == "kto" else "preferences"
    encoded = data_formats.load_data(args, kind, tok, argparse.Namespace(rank=0))
    if opts.algos == "kto":  # as the scripts read their data
        data = [(row.prompt_ids, c, d) for row in encoded for c, d in zip(row.completions, row.labels)]
    else:
        data = [(row.prompt_ids, *row.completions) for row in encoded]
    groups = [(p, [c, r], [1.0, 0.0]) for p, c, r in data]  # GRPO, as the script: each pair a group of two

    def batch_of(s):
        if opts.algos == "grpo":
            return m.group_sequences(m.offline_batch(groups, s, opts.batch // 2, args.seed))
        return m.offline_batch(data, s, opts.batch, args.seed)

    def load():
        return AutoModelForCausalLM.from_pretrained(plumbing.model_name(args), dtype=torch.float32).to(device)

    policy, ref = load().train(), load().eval().requires_grad_(False)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = {"steps": [], "cpu": [], "tokens": [], "params": sum(p.numel() for p in policy.parameters())}
    for s in range(opts.steps):
        t0, cpu0, n = time.perf_counter(), time.process_time(), 0
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
        out["steps"].append(time.perf_counter() - t0)
        out["cpu"].append(time.process_time() - cpu0)
        out["tokens"].append(n)
    walls, cpus, reference = [], [], m.ReferenceModel(ref, rt=None)
    for _ in range(20):
        t0, cpu0 = time.perf_counter(), time.process_time()
        reference.sync(policy, step=0)
        sync()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - cpu0)
    return out | {"sync_s": statistics.median(walls), "sync_cpu": statistics.median(cpus), "peak_gib": peak_gib(device)}


# ---- running a configuration -----------------------------------------------------------------------------------------
def fresh(cmd, device, memory=False):
    """cmd in a fresh one-thread process on `device` (with `memory`, for its peak memory): its output, or SystemExit
    with the end of its errors."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # a process of its own, not a rank
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if memory:  # glibc maps every allocation over 64 KiB on its own and unmaps it when freed: RSS = live memory
        env |= {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def run_worker(file, kind, algo, model_path, batch, steps, device, memory=False, **options):
    """A worker of `file` (this one's `floor`, `baseline`; bench_trl.py's) in a fresh process: its JSON line."""
    cmd = [sys.executable, file, "--worker", kind, "--algos", algo, "--model_path", model_path, "--batch", str(batch)]
    cmd += ["--steps", str(steps)]
    cmd += [x for k, v in options.items() for x in (f"--{k}", v if isinstance(v, str) else json.dumps(v))]
    return json.loads(fresh(cmd, device, memory).strip().splitlines()[-1])


def timed_run(algo, model_path, flags, batch, steps, device, workdir, memory=False, record=None):
    """The script in a fresh process, its per-step metrics: timed runs under run_in_process, whose reference pass
    before the first step is added to that step (samples kept when `record` names a file); memory runs alone."""
    out = tempfile.mkdtemp(dir=workdir)
    timing = out + ".ahead.json"
    cmd = [sys.executable] + ([] if memory else [os.path.abspath(__file__), "--in_process", timing, record or "-"])
    cmd += [SCRIPTS[algo], "--model_name_or_path", model_path, "--max_steps", str(steps), "--batch_size", str(batch)]
    cmd += ["--micro_batch_size", str(batch), "--eval_prompts", "none", "--save_every", "0", "--output_dir", out]
    cmd += flags + (smollm2_flags(flags) if model_path == smollm2.MODEL else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    fresh(cmd, device, memory)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        ahead = json.load(open(timing)) if not memory else [0.0, 0.0]  # (wall, CPU) before the first step
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if os.path.exists(timing):
            os.remove(timing)
    train = [r for r in records if "perf/step_seconds" in r]
    rounds = [r["online/seconds"] for r in records if "online/seconds" in r]
    return {
        "steps": [r["perf/step_seconds"] + (i == 0) * ahead[0] for i, r in enumerate(train)],
        "cpu": [r["perf/step_cpu_seconds"] + (i == 0) * ahead[1] for i, r in enumerate(train)],
        # the whole process's CPU time: start-up and load, the steps, the final save
        "run_cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "before_first_step": ahead,  # (wall, CPU), already in the first step
        "peak_gib": max(r["perf/peak_memory_gib"] for r in train),
        "round_s": statistics.median(rounds) if rounds else None,
        "round_total_s": sum(rounds),
        "rounds": len(rounds),
        "online_tokens_per_s": statistics.median(r["tokens_per_s"] for r in train) if rounds else None,
    }


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
    """grpo_humanline.py's own main() on argv, keeping each round's groups {prompt, prompt_ids, completions, the
    prompt's columns} in the order it trains on them (a group a reward failed on is left out); written to path."""
    import grpo_humanline

    kept, sample_and_score = [], plumbing.sample_and_score

    def recording(*a, **kw):
        groups, record = sample_and_score(*a, **kw)
        if kw.get("prefix", "online") == "online":
            scored = [g for g in groups if None not in g.scores]
            kept.extend(g.row | {"prompt_ids": g.prompt_ids, "completions": g.completions} for g in scored)
        return groups, record

    plumbing.sample_and_score, sys.argv = recording, argv
    try:
        grpo_humanline.main()
    finally:
        with open(path, "w") as f:
            f.writelines(json.dumps(g) + "\n" for g in kept)


# ---- the matrix ------------------------------------------------------------------------------------------------------
def bench(opts, device, workdir):
    rows = []
    for model in opts.models:
        path = model_path(model)
        base = run_worker(__file__, "baseline", "dpo", path, 1, 1, device, memory=device == "cpu")
        rows.append({"device": device, "model": model, "algo": "-", "config": "python + libraries", **base})
        for algo in opts.algos:
            batch = BATCH[model][algo]
            configs = LORA_ROWS if opts.lora else OFFLINE + [("online", online_flags(algo, model, batch))]
            configs = [("floor", None)] + configs

            def run(flags, steps, memory=False):  # the floor's worker, or the script
                if flags is None:
                    return run_worker(__file__, "floor", algo, path, batch, steps, device, memory=memory)
                return timed_run(algo, path, flags, batch, steps, device, workdir, memory=memory)

            results, memory, tag = {}, {}, f"[{device} {model} {algo}]"
            for rep, (name, flags) in [(rep, c) for rep in range(opts.repeats) for c in configs]:  # interleaved
                print(f"{tag} {name} (repeat {rep + 1}/{opts.repeats})", file=sys.stderr, flush=True)
                results.setdefault(name, []).append(run(flags, opts.steps))
            # memory in a separate pass: glibc told to free at once, which slows the timings
            for name, flags in configs if device == "cpu" else []:
                print(f"{tag} {name} (memory)", file=sys.stderr, flush=True)
                memory[name] = run(flags, 3, memory=True)["peak_gib"]
            rows += matrix_rows(opts, device, model, algo, batch, configs, results, memory)
    return rows


def matrix_rows(opts, device, model, algo, batch, configs, results, memory):
    """One row per configuration (and the sync): its fastest mean step, ratios to offline and to the floor, memory."""
    floor = results["floor"][0]
    tokens, params = statistics.median(floor["tokens"][1:] or floor["tokens"]), floor["params"]
    wall = {name: min(statistics.mean(r["steps"]) for r in rs) for name, rs in results.items()}
    cpu = {name: min(statistics.mean(r["cpu"]) for r in rs) for name, rs in results.items()}
    step = cpu if device == "cpu" else wall  # the basis of the ratios: on a CPU its CPU seconds
    peak = {name: memory.get(name) or max(r["peak_gib"] for r in rs) for name, rs in results.items()}
    sync = {"step_s": min(r["sync_s"] for r in results["floor"])}
    sync["step_cpu_s"] = min(r["sync_cpu"] for r in results["floor"])
    head = dict(device=device, model=model, algo=algo, params=params, batch_size=batch, steps=opts.steps)
    head |= dict(tokens_per_step=tokens, basis="cpu" if device == "cpu" else "wall")
    rows = []
    for name, flags in configs:
        runs = results[name]
        row = head | dict(config=name, flags=flags, step_s=wall[name], step_cpu_s=cpu[name], peak_gib=peak[name])
        row |= dict(vs_offline=step[name] / step["offline"], vs_floor=step[name] / step["floor"])
        row |= dict(peak_vs_offline=peak[name] / peak["offline"], run_cpu_s=min(r.get("run_cpu", 0.0) for r in runs))
        row |= dict(median_cpu_s=statistics.median(statistics.mean(r["cpu"]) for r in runs))
        row |= dict(all_steps=[r["steps"] for r in runs], all_cpu=[r["cpu"] for r in runs])
        if name == "online":
            row |= {"round_s": statistics.median(r["round_s"] for r in runs)}
            row |= {"completion_tokens_per_s": runs[0]["online_tokens_per_s"]}
        else:
            row |= {"tokens_per_s": tokens / step[name], "tflops": 8 * params * tokens / step[name] / 1e12}
            row |= {"mfu": row["tflops"] / opts.peak_tflops} if opts.peak_tflops else {}
        rows.append(row)
    basis = sync["step_cpu_s" if device == "cpu" else "step_s"]
    sync |= dict(config="sync", vs_offline=basis / step["offline"], vs_floor=basis / step["floor"])
    return rows + [head | sync]


def table(rows):
    """Per device and model: python + libraries alone, then a line per configuration and the sync."""
    from report import table  # the one markdown table of experiments/ (imported late: a worker's memory is measured)

    lines = []
    for device, model in dict.fromkeys((r["device"], r["model"]) for r in rows):
        block = [r for r in rows if (r["device"], r["model"]) == (device, model)]
        base, first = block[0], next(r for r in block if "params" in r)
        mfu, whole = any("mfu" in r for r in block), any(r.get("run_cpu_s") for r in block)
        alone = f"python + libraries alone: {base['peak_gib']:.2f} GiB peak"
        lines += ["", f"**{model} model on {device}** ({first['params'] / 1e6:.1f}M parameters; {alone})", ""]
        columns = "algo | configuration | step wall (s) | step CPU (s) | / offline | / floor | peak memory (GiB) "
        columns += "| / offline | tokens/s | TFLOP/s" + " | MFU" * mfu + " | run CPU (s)" * whole
        found = []
        for r in block[1:]:
            if r["config"] == "sync":
                copy = [
                    f"{r['step_s'] * 1000:.1f} ms",
                    f"{r['step_cpu_s'] * 1000:.1f} ms",
                    f"{100 * r['vs_offline']:.2f}%",
                ]
                found.append([r["algo"], "sync (one in-place copy)", *copy] + [""] * (5 + mfu + whole))
                continue
            online = f"{r.get('completion_tokens_per_s', 0):.0f} (completions, wall)"
            step = f"{r['step_s']:.3f}" + (f" (+ round {r['round_s']:.2f})" if r.get("round_s") else "")
            cells = [r["algo"], r["config"], step, f"{r['step_cpu_s']:.3f}", f"{r['vs_offline']:.3f}"]
            cells += [f"{r['vs_floor']:.3f}", f"{r['peak_gib']:.3f}", f"{r['peak_vs_offline']:.3f}"]
            cells += [f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else online]
            cells += [f"{r['tflops']:.3f}" if "tflops" in r else ""] + [f"{r['mfu']:.1%}" if "mfu" in r else ""] * mfu
            found.append(cells + [f"{r['run_cpu_s']:.2f}"] * whole)
        lines += table(columns, found)
    return "\n".join(lines)


def targets(rows):
    """The targets, each with its measured value: humanline k = 1 within 5% of offline, a sync under 1% of a step on
    the 30M model, offline within 15% of the floor, humanline's peak memory within 5% of reference-free offline's."""
    out = []
    for r in rows:
        where, free = f"{r['model']} {r['algo']}", {(x["device"], x["model"], x["algo"], x["config"]): x for x in rows}
        free = free.get((r["device"], r["model"], r["algo"], "offline, ref-free"))
        if r["config"] == "humanline k=1":
            out.append((f"{where}: humanline k=1 / offline <= 1.05", r["vs_offline"], 1.05))
        if r["config"] == "sync" and r["model"] == "30m":
            out.append((f"{where}: sync / offline step <= 1%", r["vs_offline"], 0.01))
        if r["config"] == "offline":
            out.append((f"{where}: offline / floor <= 1.15", r["vs_floor"], 1.15))
        if r["config"] in ("humanline k=1", "humanline k=16") and r["model"] == "30m" and free:
            name = f"{where}: peak memory {r['config']} / offline, ref-free <= 1.05"
            out.append((name, r["peak_gib"] / free["peak_gib"], 1.05))
    return "\n".join(f"- {'met' if value <= limit else 'MISSED'}: {name}: {value:.3f}" for name, value, limit in out)


def devices(opts):
    """cpu, and cuda where there is a GPU (its peak TFLOP/s for MFU from its name)."""
    import torch

    found = ["cpu"] if opts.device in ("auto", "cpu") else []
    if opts.device in ("auto", "cuda") and torch.cuda.is_available():
        found.append("cuda")
        name = torch.cuda.get_device_name()
        named = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        opts.peak_tflops = getattr(opts, "peak_tflops", None) or named
    elif opts.device in ("auto", "cuda"):
        print("no CUDA device found: the GPU rows (bf16, tokens/s, MFU) are skipped", file=sys.stderr)
    return found


def write(opts, rows, text, start, load):
    """OUT.jsonl (each row with the command and machine) and OUT.md (the command, then `text`)."""
    import torch

    meta = {"command": "python experiments/" + os.path.basename(sys.argv[0]) + " " + " ".join(sys.argv[1:])}
    meta |= {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    meta |= {"load_before": load, "minutes": (time.time() - start) / 60}
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out + ".jsonl", "w") as f:
        f.writelines(json.dumps(row | {"meta": meta}) + "\n" for row in rows)
    machine = f"torch {meta['torch']}, {meta['cpus']} CPUs, one thread per process"
    machine += f", load average {load:.1f} before the run"
    text = f"`{meta['command'].strip()}` ({meta['minutes']:.1f} min; {machine})\n" + text
    with open(opts.out + ".md", "w") as f:
        f.write(text)
    print(text)


def parser(description, out):
    p = argparse.ArgumentParser(description=description, allow_abbrev=False)  # --trl is not --trl_options
    p.add_argument("--models", default="toy,30m", help="Comma-separated: toy, 30m, smollm2 (the real model).")
    p.add_argument("--algos", default="dpo,kto,grpo")
    p.add_argument("--steps", type=int, default=5, help="Optimizer steps per configuration, all timed.")
    p.add_argument("--repeats", type=int, default=1, help="Timed runs per configuration, interleaved.")
    p.add_argument("--device", default="auto", help="auto (CPU, and CUDA too when there is a GPU) | cpu | cuda")
    p.add_argument("--out", default=os.path.join(RESULTS, out), help="Writes OUT.jsonl and OUT.md.")
    for hidden in ("--worker", "--model_path", "--batch", "--trl_options", "--samples"):  # a worker's own
        p.add_argument(hidden, default=None, type=int if hidden == "--batch" else str, help=argparse.SUPPRESS)
    return p


def main():
    if sys.argv[1:2] == ["--in_process"]:  # a timed run: the script in this process
        return run_in_process(sys.argv[2], sys.argv[3], sys.argv[4:])
    p = parser(__doc__.split("\n")[0], "bench")
    p.add_argument("--peak_tflops", type=float, default=None, help="Peak dense TFLOP/s for MFU (GPU: from its name).")
    p.add_argument("--quick", action="store_true", help="Toy model, 3 steps: a smoke test.")
    p.add_argument("--lora", action="store_true", help="LoRA adapters beside full fine-tuning, offline.")
    opts = p.parse_args()
    if opts.worker:
        return print(json.dumps(worker(opts)))
    opts.models, opts.algos = opts.models.split(","), opts.algos.split(",")
    if opts.quick:
        opts.models, opts.steps = ["toy"], 3
    start, load, rows = time.time(), os.getloadavg()[0], []
    with tempfile.TemporaryDirectory() as workdir:
        for device in devices(opts):
            on = argparse.Namespace(**vars(opts) | {"peak_tflops": opts.peak_tflops if device == "cuda" else None})
            rows += bench(on, device, workdir)
    write(opts, rows, table(rows) + "\n\nTargets:\n\n" + targets(rows) + "\n", start, load)


if __name__ == "__main__":
    main()
