"""Reproduce the paper's comparisons on the toy task and on a real model: rates chosen per variant, seeds, p-values.

    python experiments/run.py                      # the toy's suites, in order (543 runs, ~7 h on 2 cores; resumable)
    python experiments/run.py --suite sweep        # or main, instances, offpolicy, ablations, quality, lora_sweep, lora
    python experiments/run.py --suite lora_sweep && python experiments/run.py --suite lora   # LoRA against full
    python experiments/run.py --report             # only rebuild the toy's tables and plots from finished runs
    python experiments/run.py --quick              # each code path of every toy suite, 2 steps (about 2.5 minutes)
    python experiments/run.py --suite main --only "dpo offline" --new_seed 7   # rerun rows with an unused seed
    python experiments/run.py --suite smollm2_sweep && python experiments/run.py --suite smollm2   # a real model
    python experiments/run.py --report --suite smollm2 --mix_code   # its table (three versions of the code: see it)

The order matters: `sweep` trains each of the 12 variants (DPO, KTO, GRPO x offline, offline+humanline, online,
online+humanline) at five learning rates (0.25x-4x the paper's, its Table 3), 3 seeds each, scored on the toy's
*validation* prompts; each variant's rate is the one with the highest mean there. Every other suite trains at the
chosen rates with other seeds and is scored on the *test* prompts: `main` (5 seeds, evaluated every 10 steps),
`instances` (the main comparisons on two more toy instances built from seeds 1 and 2), `offpolicy` (off-policy GRPO),
`ablations` (DPO's, the regime probes of all three objectives, GRPO's clip probe) and `quality` (DPO). A suite whose
rates are not chosen yet leaves those configurations out. `lora_sweep` does for LoRA adapters (rank 8 on every linear
layer) what `sweep` does, at 2.5x-40x the paper's rates, for DPO and GRPO offline, offline + humanline and online; then
`lora` trains each of those six with adapters and with every weight, each at its own chosen rate, 3 seeds.

The real model's suites run only when named, once `python experiments/smollm2.py model` has made its folder:
`smollm2_sweep` trains SmolLM2-135M-Instruct with DPO and GRPO offline, offline + humanline and online at 1x, 4x and
16x the paper's rate (one seed each: the budget's choice), scored on the task's 128 validation prompts; `smollm2`
trains each at its chosen rate with 3 seeds, and KTO, off-policy GRPO and LoRA adapters with one, scored on the 256
test prompts (about 7 CPU-hours for the two; `--quick --suite smollm2` runs its code paths for 2 steps).

Each run is one training script in a subprocess with one CPU thread (`--jobs` at a time). A run is finished when its
`metrics.jsonl` has an evaluation at the final step; finished runs are skipped, so an interrupted invocation continues
where it stopped; a real model's run also saves a checkpoint every 4 steps, and one stopped midway (Ctrl-C, a SIGTERM, a
crash) continues from it, its CPU seconds counted across attempts. Runs are written to `results/runs/<suite>/` and
packed, every few runs, into `results/<suite>.tar.gz` (`metrics.jsonl`, `args.json`, wall and CPU seconds; weights are
deleted), which is what `--report` reads. Results: `results/<suite>.md` (tables), `<suite>.jsonl` (one line per
configuration) and PNG plots when matplotlib is installed (`pip install -r experiments/requirements.txt`). A table holds
runs of one version of the code (`provenance.code` in their `args.json`) unless `--mix_code` says otherwise.
"""

import argparse
import contextlib
import glob
import gzip
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "results")
sys.path.insert(0, ROOT)
import toy_task  # noqa: E402

# the paper's learning rates (its Table 3) per objective and mode; a humanline variant starts from its mode's rate
PAPER_LR = {
    "dpo offline": 5e-6,
    "dpo online": 2.5e-6,
    "kto offline": 5e-6,
    "kto online": 2.5e-6,
    "grpo offline": 5e-6,
    "grpo online": 5e-6,
}
MULTIPLES = (0.25, 0.5, 1, 2, 4)  # the sweep, x the paper's rate (humanline variants may need 0.1x-4x, the paper says)
SHARED_LR = 5e-6  # one rate in every variant's sweep (the scripts' default): the shared-rate table
SWEEP_SEEDS, SEEDS, FEW_SEEDS = (100, 101, 102), (0, 1, 2, 3, 4), (0, 1, 2)  # the sweep's seeds are used nowhere else
INSTANCES = (1, 2)  # toy instances built from these seeds (the committed one is seed 0)
EQUIVALENCE_MARGIN = 0.01  # held-out reward: two variants "match" when TOST puts their difference within +-0.01
CURVE = ["--eval_every", "10"]  # test prompts, at step 0 and every 10 steps
VALIDATION = ["--eval_prompts", "toy:valid", "--eval_every", "0"]  # validation prompts, at the end
MODES = {
    "offline": ["--offline"],
    "offline+humanline": ["--offline", "--humanline"],
    "online": ["--online"],
    "online+humanline": ["--online", "--humanline"],
}
CELLS = [
    (f"{algo} {mode}", f"{algo}_humanline.py", flags)
    for algo in ("dpo", "kto", "grpo")
    for mode, flags in MODES.items()
]
# does humanline survive LoRA? DPO and GRPO offline, offline+humanline and online, adapters of rank 8 on every linear
# layer against full fine-tuning; adapters train at larger rates (the grid: 2.5x-40x the paper's rate)
LORA = ["--lora_r", "8"]
LORA_MULTIPLES = (2.5, 5, 10, 20, 40)
LORA_CELLS = [c for c in CELLS if c[0].split()[0] in ("dpo", "grpo") and c[0].split()[1] != "online+humanline"]

# a real model: SmolLM2-135M-Instruct on instructions with checkable constraints (experiments/smollm2.py). Two cores
# make it costly, so runs are short: 32 steps of 8 sequences (DPO: 4 pairs), completions of at most 48 tokens (the
# longest prompt + completion is 98 tokens), each of DPO's online rounds 32 prompts x 4 samples, the offline recipe
SMOL_DATA = "experiments/smollm2"
SMOL_REWARD = "experiments.smollm2:reward"
SMOL = ["--model_name_or_path", ".cache/SmolLM2-135M-Instruct", "--reward_model", SMOL_REWARD, "--max_new_tokens", "48"]
SMOL += ["--max_length", "128", "--max_prompt_length", "64", "--micro_batch_size", "4", "--max_steps", "32"]
SMOL_ALGOS = {  # objective: (its batch, its online sampling)
    "dpo": (["--batch_size", "4"], ["--round_size", "32", "--num_samples", "4"]),
    "kto": (["--batch_size", "8"], ["--round_size", "32", "--num_samples", "4"]),
    "grpo": (["--batch_size", "8"], ["--num_generations", "4", "--reward_funcs", SMOL_REWARD]),
}


SMOL_MODES = ("offline", "offline+humanline", "online")


def smol_flags(algo, mode):
    data = "pairs" if "offline" in mode else "train"
    online = SMOL_ALGOS[algo][1] if "online" in mode else []
    return MODES[mode] + ["--dataset", f"{SMOL_DATA}/{data}.jsonl"] + SMOL + SMOL_ALGOS[algo][0] + online


SMOL_CELLS = [
    (f"{algo} {mode}", f"{algo}_humanline.py", smol_flags(algo, mode))
    for algo in ("dpo", "grpo")
    for mode in SMOL_MODES
]
SMOL_MULTIPLES, SMOL_SWEEP_SEEDS = (1, 4, 16), (100,)  # x the paper's rate; one seed per rate (the budget's choice)
SMOL_VALID = ["--eval_prompts", f"{SMOL_DATA}/valid.jsonl", "--num_eval_prompts", "128", "--eval_every", "0"]
SMOL_TEST = ["--eval_prompts", f"{SMOL_DATA}/test.jsonl", "--num_eval_prompts", "256", "--eval_every", "0"]
SMOL_MARGIN = 0.05  # success rate: 256 test prompts of 0/1 give a run a standard error near 0.03, so +-0.01 is out


def paper_lr(cell):
    return PAPER_LR[cell.split("+")[0]]


def paper_rates():
    """--quick's rates: every variant's at the paper's, LoRA's too."""
    rates = {cell: paper_lr(cell) for cell, _, _ in CELLS} | {f"{c} lora": paper_lr(c) for c, _, _ in LORA_CELLS}
    return rates | {f"smollm2 {c}": paper_lr(c) for c, _, _ in SMOL_CELLS}


def lr_flags(rate):
    return ["--learning_rate", f"{rate:g}"]


def suites(results, chosen):
    """suite -> [(configuration, script, flags, seeds)], the later suites at the `chosen` rate of each variant."""
    sweep = [
        (f"{cell} lr {m * paper_lr(cell):g}", script, flags + lr_flags(m * paper_lr(cell)) + VALIDATION, SWEEP_SEEDS)
        for cell, script, flags in CELLS
        for m in MULTIPLES
    ]
    main = [
        (cell, script, flags + lr_flags(chosen[cell]) + CURVE, SEEDS) for cell, script, flags in CELLS if cell in chosen
    ]
    instances = []
    for inst in INSTANCES:
        paths = instance_paths(results, inst)
        data = {"--offline": ["--dataset", paths.offline["strong"]], "--online": ["--dataset", paths.prompts_train]}
        instances += [
            (
                f"instance {inst}: {cell}",
                script,
                flags
                + data[flags[0]]
                + lr_flags(chosen[cell])
                + CURVE
                + ["--model_name_or_path", paths.model, "--eval_prompts", paths.prompts_test],
                FEW_SEEDS,
            )
            for cell, script, flags in CELLS
            if cell in chosen and not cell.endswith("online+humanline")
        ]
    offpolicy = []
    if "grpo online" in chosen:  # one rate for the whole suite: online GRPO's
        off = ["--online", "--sample_every", "64"] + lr_flags(chosen["grpo online"]) + CURVE
        offpolicy = [
            ("grpo online (sample every step)", ["--online", "--sample_every", "1"] + off[3:], SEEDS),
            ("grpo off-policy (sample 64x every 64 steps)", off, SEEDS),
            ("grpo off-policy+humanline k=16", off + ["--humanline", "--sync_every", "16"], SEEDS),
            # which half of humanline does the work off-policy: the ratio's denominator is then the reference synced
            # every 16 steps instead of the sampler, which can be 64 steps old
            ("grpo off-policy+sync only k=16", off + ["--sync", "humanline", "--sync_every", "16"], FEW_SEEDS),
            ("grpo off-policy+clamp only", off + ["--clip", "clamp"], FEW_SEEDS),
            # syncing changes two terms: the ratio's denominator and the KL baseline (both the reference). Without
            # the KL term (beta 0) only the denominator differs between these two rows
            ("grpo off-policy, beta 0", off + ["--beta", "0"], FEW_SEEDS),
            (
                "grpo off-policy+humanline k=16, beta 0",
                off + ["--humanline", "--sync_every", "16", "--beta", "0"],
                FEW_SEEDS,
            ),
            # ... with the PPO clip [1 - eps, 1 + eps] opened wide: does the clip around a stale sampler hold it back?
            ("grpo off-policy, beta 0, eps 100", off + ["--beta", "0", "--eps", "100"], FEW_SEEDS),
        ]
        offpolicy = [(name, "grpo_humanline.py", flags, seeds) for name, flags, seeds in offpolicy]
    ablations, quality = [], []
    if "dpo offline+humanline" in chosen:  # one rate for the whole suite: offline+humanline DPO's
        lr = lr_flags(chosen["dpo offline+humanline"]) + CURVE
        dpo = [
            ("dpo offline", []),
            ("dpo sync only", ["--sync", "humanline"]),
            ("dpo clamp only", ["--clip", "clamp"]),
            ("dpo sync+clamp (humanline)", ["--humanline"]),
            ("dpo sync+sampling", ["--sync", "humanline", "--clip", "sampling"]),
            ("dpo trust-region sync+clamp", ["--sync", "trust_region", "--clip", "clamp"]),
        ]
        dpo += [(f"dpo humanline k={k}", ["--humanline", "--sync_every", str(k)]) for k in (2, 4, 8, 16)]
        dpo += [
            (f"dpo humanline clip [{lo}, {hi}]", ["--humanline", "--log_eps_P", str(lo), "--log_eps_R", str(hi)])
            for lo, hi in ((-2.0, 1.5), (-1.0, 1.5), (-1.0, 2.0), (-1.0, 3.0))
        ]  # the paper's Table 6
        dpo = [(name, ["--offline"] + flags) for name, flags in dpo]
        # regime probes: with k = 1 a token's log-ratio is one step's change, far inside every Table 6 range, so those
        # rows cannot differ; ranges this tight make the clamp act on a few percent of tokens
        dpo += [
            (
                f"dpo humanline clip [{-eps:g}, {eps:g}] (regime probe)",
                ["--humanline", "--log_eps_P", str(-eps), "--log_eps_R", str(eps)],
            )
            for eps in (0.01, 0.003)
        ]
        # data probe: on-policy data sampled once from the starting policy (one round over all 4096 training prompts
        # keeps ~3200 pairs, so 80 steps of 32: compare with the other rows' step-80 evaluation), without and with
        # humanline. Does the gap to online come from the offline data being another model's, or from its being stale?
        dpo += [
            (
                f"dpo {name}on-policy data sampled once, 80 steps (data probe)",
                ["--online", "--round_size", "4096", "--max_steps", "80"] + f,
            )
            for name, f in (("", []), ("humanline, ", ["--humanline"]))
        ]
        ablations = [(name, "dpo_humanline.py", flags + lr, FEW_SEEDS) for name, flags in dpo]
        quality = [
            (
                f"dpo offline+humanline, quartile {q} of the data",
                "dpo_humanline.py",
                ["--humanline", "--dataset", quartile_file(results, q), "--max_steps", "30"] + lr,
                FEW_SEEDS,
            )
            for q in (1, 2, 3, 4)
        ]
        # the other source: the weak model's 755 pairs (proxy -0.60) against as many of the strong's (-0.11), one epoch
        quality += [
            (
                f"dpo offline+humanline, the {source} source's data, 23 steps",
                "dpo_humanline.py",
                ["--humanline", "--dataset", f"toy:{source}", "--max_steps", "23"] + lr,
                FEW_SEEDS,
            )
            for source in ("weak", "strong")
        ]
    ablations += [
        (
            f"{algo} humanline clip [{-eps:g}, {eps:g}] (regime probe)",
            f"{algo}_humanline.py",
            ["--offline", "--humanline", "--log_eps_P", str(-eps), "--log_eps_R", str(eps)]
            + lr_flags(chosen[f"{algo} offline+humanline"])
            + CURVE,
            FEW_SEEDS,
        )
        for algo in ("kto", "grpo")
        for eps in (0.01, 0.003)
        if f"{algo} offline+humanline" in chosen
    ]
    if (
        "grpo offline+humanline" in chosen
    ):  # what holds plain offline GRPO back, at offline + humanline GRPO's rate: the KL
        # term to the starting policy, or the PPO clip around it (which the synced reference resets every step)?
        ablations += [
            (
                f"grpo offline{name} (clip probe)",
                "grpo_humanline.py",
                ["--offline"] + flags + lr_flags(chosen["grpo offline+humanline"]) + CURVE,
                FEW_SEEDS,
            )
            for name, flags in (
                ("", []),
                (", beta 0", ["--beta", "0"]),
                (", beta 0, eps 100", ["--beta", "0", "--eps", "100"]),
            )
        ]
    lora_sweep = [
        (
            f"{cell} lora lr {m * paper_lr(cell):g}",
            script,
            flags + LORA + lr_flags(m * paper_lr(cell)) + VALIDATION,
            SWEEP_SEEDS,
        )
        for cell, script, flags in LORA_CELLS
        for m in LORA_MULTIPLES
    ]
    lora = [  # each at its own rate: full fine-tuning's from the sweep, LoRA's from lora_sweep
        (f"{cell}{kind}", script, flags + more + lr_flags(chosen[cell + kind]) + CURVE, FEW_SEEDS)
        for cell, script, flags in LORA_CELLS
        for kind, more in (("", []), (" lora", LORA))
        if cell + kind in chosen
    ]
    smollm2_sweep = [
        (
            f"smollm2 {cell} lr {m * paper_lr(cell):g}",
            script,
            flags + lr_flags(m * paper_lr(cell)) + SMOL_VALID,
            SMOL_SWEEP_SEEDS,
        )
        for cell, script, flags in SMOL_CELLS
        for m in SMOL_MULTIPLES
    ]
    smollm2 = [  # the central comparison, each variant at its rate chosen on the validation prompts, 3 seeds
        (cell, script, flags + lr_flags(chosen[f"smollm2 {cell}"]) + SMOL_TEST, FEW_SEEDS)
        for cell, script, flags in SMOL_CELLS
        if f"smollm2 {cell}" in chosen
    ]
    # every other script and mode, one seed each, at a rate chosen above, x a factor (not swept): KTO at DPO's (the
    # paper gives the two the same rates), off-policy GRPO at online GRPO's, LoRA adapters (rank 16) at 10x their
    # variant's (what the toy's LoRA sweep chose for every variant)
    off = smol_flags("grpo", "online") + ["--sample_every", "8"]  # the last of 8 steps' groups trains 7 steps stale
    more = [(f"kto {m}", "kto_humanline.py", smol_flags("kto", m), f"dpo {m}", 1) for m in SMOL_MODES]
    more += [
        ("grpo off-policy (sample every 8 steps)", "grpo_humanline.py", off, "grpo online", 1),
        ("grpo off-policy+humanline", "grpo_humanline.py", off + ["--humanline"], "grpo online", 1),
    ]
    adapters = ["--lora_r", "16"]
    more += [  # KTO at DPO's rate, as above
        (f"{a} {m}, LoRA", f"{a}_humanline.py", smol_flags(a, m) + adapters, f"{rate} {m}", 10)
        for a, m, rate in (("dpo", "offline+humanline", "dpo"), ("grpo", "offline+humanline", "grpo"))
        + (("kto", "offline+humanline", "dpo"),)
    ]
    smollm2 += [
        (name, script, flags + lr_flags(factor * chosen[f"smollm2 {rate}"]) + SMOL_TEST, (0,))
        for name, script, flags, rate, factor in more
        if f"smollm2 {rate}" in chosen
    ]
    return dict(
        sweep=sweep,
        main=main,
        instances=instances,
        offpolicy=offpolicy,
        ablations=ablations,
        quality=quality,
        lora_sweep=lora_sweep,
        lora=lora,
        smollm2_sweep=smollm2_sweep,
        smollm2=smollm2,
    )


def instance_paths(results, seed):
    """A toy instance built on this machine from `seed` by the recipe of the committed one (seed 0), cached beside the
    results (`ensure_instances` builds it); --quick uses tiny ones."""
    return toy_task.cached(os.path.join(results, "instances"), instance_config(results, seed))


def instance_config(results, seed):
    return toy_task.ToyConfig(seed=seed, **(TINY if os.path.basename(results) == "quick" else {}))


TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    sft_steps=20,
    strong_steps=5,
    weak_step=10,
    n_train_prompts=256,
    n_test_prompts=32,
    n_valid_prompts=32,
    offline_prompts=(("strong", 256), ("weak", 64)),
)


def quartile_file(results, q):
    return os.path.join(results, "quality_data", f"quartile{q}.jsonl")


def make_quartiles(results):
    """Split the toy `strong` offline data into quartiles of the data-quality proxy: the mean token
    log-prob of the pair (chosen and rejected) under the starting policy, lowest first."""
    rows = [json.loads(line) for line in open(toy_task.load().offline["strong"])]
    rows.sort(key=lambda r: (r["chosen_ref_logp"] + r["rejected_ref_logp"]) / 2)
    os.makedirs(os.path.dirname(quartile_file(results, 1)), exist_ok=True)
    ranges = []
    for q in range(4):
        part = rows[q * len(rows) // 4 : (q + 1) * len(rows) // 4]
        with open(quartile_file(results, q + 1), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
        proxy = [(r["chosen_ref_logp"] + r["rejected_ref_logp"]) / 2 for r in part]
        ranges.append((min(proxy), max(proxy), len(part)))
    return ranges


# ---- runs: a folder per run while it runs, one archive per suite once finished ---------------------------------------


def slug(name):
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def run_key(name, seed):
    return f"{slug(name)}/seed{seed}"


def load_runs(results, suite):
    """key -> {file name: text} for every run of a suite: those in its archive, then those in runs/<suite>/ (newer)."""
    runs = {}
    archive = os.path.join(results, f"{suite}.tar.gz")
    if os.path.exists(archive):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    key, _, name = member.name.rpartition("/")
                    runs.setdefault(key, {})[name] = tar.extractfile(member).read().decode()
    live = os.path.join(results, "runs", suite)
    for config in sorted(os.listdir(live)) if os.path.isdir(live) else []:
        for seed in sorted(os.listdir(os.path.join(live, config))):
            folder = os.path.join(live, config, seed)
            if os.path.exists(os.path.join(folder, "cpu_seconds")):  # the runner writes it last: the run is complete
                runs[f"{config}/{seed}"] = {
                    n: open(os.path.join(folder, n)).read()
                    for n in os.listdir(folder)
                    if os.path.isfile(os.path.join(folder, n)) and n != "log.txt"
                }
    return runs


def pack(results, suite):
    """Write every finished run of a suite into `<suite>.tar.gz` (byte-stable: sorted, no times), remove the folders."""
    runs = load_runs(results, suite)
    if not runs:
        return
    archive = os.path.join(results, f"{suite}.tar.gz")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for key in sorted(runs):
            for name in sorted(runs[key]):
                data = runs[key][name].encode()
                info = tarfile.TarInfo(f"{key}/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    with open(archive + ".tmp", "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())
    os.replace(archive + ".tmp", archive)
    for key in runs:
        shutil.rmtree(os.path.join(results, "runs", suite, key), ignore_errors=True)
        with contextlib.suppress(OSError):  # the configuration's folder, once empty
            os.rmdir(os.path.join(results, "runs", suite, key.split("/")[0]))


def records(run):
    return [json.loads(line) for line in run.get("metrics.jsonl", "").splitlines() if line.strip()]


def finished(run, max_steps):
    return (
        run is not None
        and "cpu_seconds" in run
        # at --max_steps, or earlier where a whole pass of online prompts gave no batch (the script says so)
        and any((r.get("step") == max_steps or r.get("ended_early")) and "eval/reward" in r for r in records(run))
    )


def max_steps_of(flags):
    return int(flags[flags.index("--max_steps") + 1]) if "--max_steps" in flags else 120


def run_script(cmd, env, log_path):
    """Run one command, its output in log_path: its exit code and its own CPU seconds (user + system), which a busy
    machine does not inflate as it does wall time."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def launch(results, suite, name, script, flags, seed):
    out = os.path.join(results, "runs", suite, run_key(name, seed))
    # a real model's run (up to an hour) keeps a checkpoint every 4 steps and continues from it when the suite is rerun
    save_every = 4 if suite.startswith("smollm2") else 0
    cmd = [sys.executable, os.path.join(ROOT, script), *flags, "--seed", str(seed), "--output_dir", out]
    cmd += ["--save_every", str(save_every)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    spent = os.path.join(out, "cpu_seconds_before_resume")  # the interrupted attempts' CPU seconds
    resume = save_every and glob.glob(os.path.join(out, "checkpoint-*", "state-rank0.pt"))
    if resume:
        cmd.append("--resume")
    else:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
    before = float(open(spent).read()) if resume and os.path.exists(spent) else 0.0
    t0 = time.time()
    code, cpu_seconds = run_script(cmd, env, os.path.join(out, "log.txt"))
    cpu_seconds += before
    metrics = os.path.join(out, "metrics.jsonl")
    run = {"cpu_seconds": "", "metrics.jsonl": open(metrics).read() if os.path.exists(metrics) else ""}
    stopped = code == 0 and not finished(run, max_steps_of(flags))
    if code != 0 or stopped:  # failed, or stopped by a signal after saving: a rerun continues it
        with open(spent, "w") as f:
            f.write(f"{cpu_seconds:.1f}\n")
        raise SystemExit(f"{' '.join(cmd)} {'stopped' if stopped else f'failed ({code})'}; see {out}/log.txt")
    for file in os.listdir(out):  # keep the metrics, drop the weights
        if file not in ("metrics.jsonl", "args.json", "log.txt"):
            p = os.path.join(out, file)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    with open(os.path.join(out, "wall_seconds"), "w") as f:
        f.write(f"{time.time() - t0:.1f}\n")
    with open(os.path.join(out, "cpu_seconds"), "w") as f:  # last: its presence marks a complete folder
        f.write(f"{cpu_seconds:.1f}\n")
    os.remove(os.path.join(out, "log.txt"))


def check_new_seed(results, suite, configs, seed, jobs):
    """Run each finished configuration of a suite once more, with a seed it has not used (in `new_seed/`, apart from the
    suite), and say whether the new run lands in its row's range for a new seed."""
    rows = {r["config"]: r for r in summarize(load_runs(results, suite), configs)}
    configs = [
        (name, script, flags, [seed]) for name, script, flags, seeds in configs if name in rows and seed not in seeds
    ]
    if not configs:
        raise SystemExit(f"{suite}: no finished configuration to compare with that has not already run seed {seed}")
    check = os.path.join(results, "new_seed")
    runs = load_runs(check, suite)
    todo = [c for c in configs if not finished(runs.get(run_key(c[0], seed)), max_steps_of(c[2]))]
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda c: launch(check, suite, c[0], c[1], c[2], seed), todo))
    record = os.path.join(results, f"{suite}_new_seed.md")  # every check made, one line per configuration and seed
    old = open(record).read().splitlines() if os.path.exists(record) else []
    lines = {line.split(" ends at")[0]: line for line in old if " ends at" in line}
    for new in summarize(load_runs(check, suite), configs):
        row, reward = rows[new["config"]], new["reward"][0]
        lo, hi = row["new_seed"]
        key = f"- {new['config']}: seed {seed}"
        lines[key] = (
            f"{key} ends at {reward:.3f}; its {row['seeds']} seeds {fmt(row['reward'])}, a new seed expected in "
            f"{lo:.3f}-{hi:.3f}: {'inside' if lo <= reward <= hi else 'OUTSIDE'}"
        )
        print(lines[key][2:])
    with open(record, "w") as f:
        f.write(
            f"# {suite}: runs with a seed the table did not use (`--new_seed`)\n\n"
            + "\n".join(sorted(lines.values()))
            + "\n"
        )


def ensure_instances(results, configs):
    for seed in [s for s in INSTANCES if any(name.startswith(f"instance {s}:") for name, *_ in configs)]:
        print(
            f"toy instance {seed}: "
            + toy_task.build(os.path.join(results, "instances"), instance_config(results, seed), verbose=False).root,
            flush=True,
        )


# ---- statistics ------------------------------------------------------------------------------------------------------


def mean_se(values):
    """Mean and standard error over seeds, leaving out seeds without the value (NaN); NaN where no seed has it, and a
    NaN error for one seed."""
    v = np.array(values, dtype=float)
    v = v[~np.isnan(v)] if not np.isnan(v).all() else v
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan


def new_seed_range(values, level=0.95):
    """Where one more seed's result should land, if seeds' results are normal: a prediction interval,
    mean +- t(n - 1) * sd * sqrt(1 + 1/n). With 5 seeds it is about +-3 sd: wider than their range, which a sixth seed
    leaves one time in three."""
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    half = stats.t.ppf((1 + level) / 2, n - 1) * np.std(values, ddof=1) * math.sqrt(1 + 1 / n)
    return float(np.mean(values) - half), float(np.mean(values) + half)


def holm(pvalues):
    """Holm-Bonferroni adjusted p-values (step-down, monotone)."""
    order = np.argsort(pvalues)
    adjusted, running = np.empty(len(pvalues)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def tost(a, b, margin):
    """Two one-sided Welch t-tests of |mean(a) - mean(b)| < margin: a small p shows the two equivalent within it."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    d = a.mean() - b.mean()
    if va + vb == 0:
        return 0.0 if abs(d) < margin else 1.0
    se, df = math.sqrt(va + vb), (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return float(max(stats.t.sf((d + margin) / se, df), stats.t.cdf((d - margin) / se, df)))


def significance(rows, pairs, margin=EQUIVALENCE_MARGIN):
    """For each pair (a, b): the difference of final rewards, a Welch t-test of a difference and a TOST of equivalence
    within +-margin, each Holm-Bonferroni corrected over the pairs, and what they allow one to say at the 5% level."""
    by = {r["config"]: r for r in rows}
    tests = [
        dict(
            a=a,
            b=b,
            comparison=f"{a} vs {b}",
            diff=float(np.mean(by[a]["rewards"]) - np.mean(by[b]["rewards"])),
            p=float(stats.ttest_ind(by[a]["rewards"], by[b]["rewards"], equal_var=False).pvalue),
            p_tost=tost(by[a]["rewards"], by[b]["rewards"], margin),
        )
        for a, b in pairs
        if a in by and b in by and by[a]["seeds"] > 1 and by[b]["seeds"] > 1
    ]
    for key in ("p", "p_tost"):
        for t, adjusted in zip(tests, holm([t[key] for t in tests]) if tests else []):
            t[key + "_holm"] = float(adjusted)
    for t in tests:
        t["verdict"] = (
            ("higher" if t["diff"] > 0 else "lower")
            if t["p_holm"] < 0.05
            else f"equivalent (within ±{margin:g})"
            if t["p_tost_holm"] < 0.05
            else "not decided"
        )
    return tests


def comparisons(suite, names=()):
    """The pairs of configurations tested against each other in a suite: (a, b) asks how a differs from b."""
    if suite == "main":
        return [
            (f"{algo} {a}", f"{algo} {b}")
            for algo in ("dpo", "kto", "grpo")
            for a, b in (
                ("offline+humanline", "offline"),
                ("offline+humanline", "online"),
                ("online+humanline", "online"),
            )
        ]
    if suite == "instances":
        return [
            (f"{prefix}{algo} {a}", f"{prefix}{algo} {b}")
            for prefix in sorted({n.split(": ")[0] + ": " for n in names})
            for algo in ("dpo", "kto", "grpo")
            for a, b in (("offline+humanline", "offline"), ("offline+humanline", "online"))
        ]
    if suite == "offpolicy":
        return [
            ("grpo off-policy+humanline k=16", "grpo online (sample every step)"),
            ("grpo off-policy+humanline k=16", "grpo off-policy (sample 64x every 64 steps)"),
            ("grpo off-policy+sync only k=16", "grpo off-policy+humanline k=16"),
            ("grpo off-policy+clamp only", "grpo off-policy+humanline k=16"),
            ("grpo off-policy+humanline k=16, beta 0", "grpo off-policy, beta 0"),
            ("grpo off-policy, beta 0, eps 100", "grpo off-policy, beta 0"),
        ]
    if suite == "ablations":
        both = "dpo sync+clamp (humanline)"
        return [
            ("dpo sync only", both),
            ("dpo clamp only", both),
            (both, "dpo offline"),
            ("dpo sync+sampling", both),
            ("dpo trust-region sync+clamp", both),
            ("grpo offline, beta 0 (clip probe)", "grpo offline (clip probe)"),
            ("grpo offline, beta 0, eps 100 (clip probe)", "grpo offline, beta 0 (clip probe)"),
        ]
    if suite == "lora":  # humanline's two comparisons with adapters, and each adapter row against full fine-tuning
        pairs = [
            (f"{a} {m} lora", f"{a} {m}") for a in ("dpo", "grpo") for m in ("offline", "offline+humanline", "online")
        ]
        return [
            (f"{a} offline+humanline lora", f"{a} {b} lora") for a in ("dpo", "grpo") for b in ("offline", "online")
        ] + pairs
    if suite == "smollm2":
        return [(f"{algo} offline+humanline", f"{algo} {b}") for algo in ("dpo", "grpo") for b in ("offline", "online")]
    if suite == "quality":
        return [
            ("dpo offline+humanline, quartile 4 of the data", "dpo offline+humanline, quartile 1 of the data"),
            (
                "dpo offline+humanline, the weak source's data, 23 steps",
                "dpo offline+humanline, the strong source's data, 23 steps",
            ),
        ]
    return []


# ---- summaries -------------------------------------------------------------------------------------------------------

# training diagnostics: metrics.jsonl key -> column name (GRPO logs `logps` and `ratio/abs_log`, DPO/KTO the others)
DIAGNOSTICS = {
    "humanline/clamped_frac": "clamped frac",
    "rewards/margins": "margin",
    "ratio/abs_log": "mean |log-ratio|",
    "logps/chosen": "logp chosen",
    "logps/rejected": "logp rejected",
    "logps": "logp completions",
}


# the diagnostics panels beside each reward curve: the first metric of each that a run logs
PANELS = [
    ("clamped", ["humanline/clamped_frac"]),
    ("spread", ["rewards/margins", "ratio/abs_log"]),
    ("chosen", ["logps/chosen", "logps"]),
    ("rejected", ["logps/rejected"]),
]


def clamps(flags):
    return "--humanline" in flags or any(
        flags[i : i + 2] in (["--clip", "clamp"], ["--clip", "sampling"]) for i in range(len(flags))
    )


def regime(flags, clamped_frac):
    """Which regime a run is in: does the humanline clamp act on its tokens (the paper's regime) or not?"""
    if not clamps(flags):
        return "no clamp"
    return "clamp active" if clamped_frac >= 0.01 else "clamp rare" if clamped_frac >= 0.001 else "clamp idle"


def summarize(runs, configs):
    """Per configuration with finished runs: final held-out reward and accuracy (mean, standard error over seeds), wall
    and CPU time, the humanline diagnostics (clamped fraction and margin or |log-ratio| averaged over training,
    log-probs at the last step), their per-step curves and each run's args.json."""
    rows = []
    for name, script, flags, seeds in configs:
        per_seed = []
        for seed in seeds:
            run = runs.get(run_key(name, seed))
            if not finished(run, max_steps_of(flags)):
                continue
            recs = records(run)
            steps = [r for r in recs if "loss" in r]
            evals = [r for r in recs if "eval/reward" in r]
            per_seed.append(
                dict(
                    reward=evals[-1]["eval/reward"],
                    accuracy=evals[-1].get("eval/accuracy", math.nan),
                    curve=[(r["step"], r["eval/reward"], r.get("eval/accuracy")) for r in evals],
                    train={k: [(r["step"], r[k]) for r in steps if k in r] for k in DIAGNOSTICS},
                    clamped=np.mean([r.get("humanline/clamped_frac", 0) for r in steps]),
                    margin=np.mean([r.get("rewards/margins", math.nan) for r in steps]),
                    abs_log_ratio=np.mean([r.get("ratio/abs_log", math.nan) for r in steps]),
                    logp_chosen=steps[-1].get("logps/chosen", steps[-1].get("logps", math.nan)),
                    logp_rejected=steps[-1].get("logps/rejected", math.nan),
                    wall=float(run["wall_seconds"]),
                    cpu=float(run["cpu_seconds"]),
                    # the training loop alone: optimizer steps, online sampling and scoring (no start-up, no evaluation)
                    loop=sum(r.get("perf/step_seconds", 0) + r.get("online/seconds", 0) for r in recs),
                    args=json.loads(run.get("args.json", "{}")),
                )
            )
        if not per_seed:
            continue

        def ms(key):
            return mean_se([s[key] for s in per_seed])

        clamped = ms("clamped")
        rows.append(
            dict(
                config=name,
                script=script,
                flags=flags,
                seeds=len(per_seed),
                reward=ms("reward"),
                accuracy=ms("accuracy"),
                rewards=[s["reward"] for s in per_seed],
                new_seed=new_seed_range([s["reward"] for s in per_seed]),
                accuracies=[s["accuracy"] for s in per_seed],
                walls=[s["wall"] for s in per_seed],
                cpus=[s["cpu"] for s in per_seed],
                loops=[s["loop"] for s in per_seed],
                wall=ms("wall"),
                cpu=ms("cpu"),
                loop=ms("loop"),
                clamped_frac=clamped,
                regime=regime(flags, clamped[0]),
                margin=ms("margin"),
                abs_log_ratio=ms("abs_log_ratio"),
                logp_chosen=ms("logp_chosen"),
                logp_rejected=ms("logp_rejected"),
                curves=[s["curve"] for s in per_seed],
                train=[s["train"] for s in per_seed],
                args=[s["args"] for s in per_seed],
            )
        )
    return rows


def code_versions(rows):
    """The versions of the code (provenance.code in args.json; None: not recorded) that a table's runs ran."""
    return sorted({str(a.get("provenance", {}).get("code")) for r in rows for a in r["args"]})


def choose_rates(results):
    """variant -> the sweep's learning rate with the highest mean validation reward, for variants whose sweep is
    complete (every rate, every seed). Keys: the toy's variants, "<variant> lora", "smollm2 <variant>"."""
    chosen = {}
    for suite, cells, multiples, key, seeds in (
        ("sweep", CELLS, MULTIPLES, "{}", SWEEP_SEEDS),
        ("lora_sweep", LORA_CELLS, LORA_MULTIPLES, "{} lora", SWEEP_SEEDS),
        ("smollm2_sweep", SMOL_CELLS, SMOL_MULTIPLES, "smollm2 {}", SMOL_SWEEP_SEEDS),
    ):
        rows = {r["config"]: r for r in summarize(load_runs(results, suite), suites(results, {})[suite])}
        for cell, _, _ in cells:
            rates = [m * paper_lr(cell) for m in multiples]
            found = [rows.get(f"{key.format(cell)} lr {rate:g}") for rate in rates]
            if all(c and c["seeds"] == len(seeds) for c in found):
                chosen[key.format(cell)] = rates[int(np.argmax([c["reward"][0] for c in found]))]
    return chosen


def fmt(pair, digits=3):
    mean, se = pair
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" + ("" if math.isnan(se) else f" ± {se:.{digits}f}")


def smollm2_start(split):
    """The real model's greedy success on the task's prompts before training (experiments/smollm2/baseline.json)."""
    with open(os.path.join(ROOT, SMOL_DATA, "baseline.json")) as f:
        return json.load(f)[split]["success"]


def starting_reward(split="test"):
    """The starting policy's greedy reward on the toy's test prompts (measured when the task was built) or validation
    prompts (measured here, the way the scripts evaluate: greedy, the same scorer)."""
    toy = toy_task.load()
    if split == "test":
        with open(toy.stats) as f:
            return json.load(f)["policy/test_reward"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = [json.loads(line)["prompt"] for line in open(toy.prompts_valid)]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(toy.model).eval(), AutoTokenizer.from_pretrained(toy.model)
    return toy_task.accuracy(model, tokenizer, prompts)[1]


# ---- tables ----------------------------------------------------------------------------------------------------------


def provenance_line(rows):
    runs = [a.get("provenance", {}) for r in rows for a in r["args"]]
    commits = sorted({str(p.get("commit"))[:10] for p in runs})
    dirty = sum(bool(p.get("dirty")) for p in runs)
    versions = {k: sorted({str(p.get(k)) for p in runs}) for k in ("code", "torch", "transformers")}
    return (
        f"{len(runs)} runs of code {', '.join(versions['code'])} (commit {', '.join(commits)}"
        + (f"; {dirty} with uncommitted changes to it" if dirty else "")
        + f"), torch {', '.join(versions['torch'])}, "
        f"transformers {', '.join(versions['transformers'])}."
        + "".join(  # a table of mixed code (--mix_code): which rows ran which
            f" Code {v}: {'; '.join(r['config'] for r in rows if v in code_versions([r]))}."  # names hold commas
            for v in (versions["code"] if len(versions["code"]) > 1 else [])
        )
    )


def rate_of(flags):
    return float(flags[flags.index("--learning_rate") + 1]) if "--learning_rate" in flags else math.nan


def long_table(rows, held_out="the toy test problems"):
    """Two tables: the held-out results, then time and the humanline diagnostics."""
    lines = [
        f"Final held-out greedy reward and exact accuracy on {held_out} (mean ± standard error over seeds); "
        "`new seed`: where one more seed's reward should land (a 95% prediction interval from these seeds); the "
        "learning rate; the regime of the humanline diagnostics below (clamp active: >= 1% of tokens outside the "
        "clamp's range, rare: 0.1-1%, idle: < 0.1%).",
        "",
        "| configuration | seeds | reward | new seed | accuracy | lr | regime |",
        "|---" * 7 + "|",
    ]
    for r in rows:
        lo, hi = r["new_seed"]
        lines.append(
            f"| {r['config']} | {r['seeds']} | {fmt(r['reward'])} | {'–' if math.isnan(lo) else f'{lo:.3f}-{hi:.3f}'} "
            f"| {fmt(r['accuracy'])} | {rate_of(r['flags']):g} | {r['regime']} |"
        )
    lines += [
        "",
        "Wall and CPU time per run (1 CPU thread, two runs at a time) and the wall time of its training loop alone "
        "(optimizer steps plus online sampling and scoring). Humanline diagnostics: the fraction of tokens whose "
        "log-ratio to the reference lies outside the clamp's range (clamped by the runs that clamp; for the others, "
        "what [-1.5, 1.5] would have cut) and the DPO/KTO reward margin (GRPO: the mean |token log-ratio| to the "
        "reference), both averaged over training; mean token log-probs of chosen and rejected (GRPO: of the trained "
        "completions) at the last step.",
        "",
        "| configuration | wall s | CPU s | loop s | clamped frac | margin | mean abs log-ratio | logp chosen "
        "| logp rejected |",
        "|---" * 9 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {fmt(r['wall'], 0)} | {fmt(r['cpu'], 0)} | {fmt(r['loop'], 0)} "
            f"| {fmt(r['clamped_frac'], 4)} | {fmt(r['margin'])} | {fmt(r['abs_log_ratio'], 4)} "
            f"| {fmt(r['logp_chosen'])} | {fmt(r['logp_rejected'])} |"
        )
    return lines


def tests_table(tests, title="the comparisons of this table", margin=EQUIVALENCE_MARGIN):
    if not tests:
        return []
    return [
        "",
        f"Welch t-tests of a difference in final reward and two one-sided tests (TOST) of equivalence within "
        f"±{margin:g} reward (the margin fixed before the runs), each Holm-Bonferroni corrected over "
        f"{title}; the verdict at the 5% level:",
        "",
        "| comparison | reward difference | p (Welch) | p (Holm) | p (TOST) | p (TOST, Holm) | verdict |",
        "|---" * 7 + "|",
    ] + [
        f"| {t['comparison']} | {t['diff']:+.3f} | {t['p']:.3g} | {t['p_holm']:.3g} | {t['p_tost']:.3g} "
        f"| {t['p_tost_holm']:.3g} | {t['verdict']} |"
        for t in tests
    ]


def time_ratios(rows):
    by = {r["config"]: r for r in rows}
    pairs = [
        (f"{algo} {slow}", f"{algo} {fast}")
        for algo in ("dpo", "kto", "grpo")
        for slow, fast in (("online", "offline+humanline"), ("offline+humanline", "offline"))
    ]
    pairs += [("grpo online (sample every step)", "grpo off-policy+humanline k=16")]
    pairs = [(by[a], by[b]) for a, b in pairs if a in by and b in by]
    if not pairs:
        return []
    return ["", "| time ratio (medians over seeds) | wall | CPU | training loop |", "|---|---|---|---|"] + [
        f"| {a['config']} / {b['config']} | {np.median(a['walls']) / np.median(b['walls']):.2f} "
        f"| {np.median(a['cpus']) / np.median(b['cpus']):.2f} | {np.median(a['loops']) / np.median(b['loops']):.2f} |"
        for a, b in pairs
    ]  # medians: a seed run on a busier machine moves a mean


def setup_table(rows):
    """What each variant ran with, read from its runs' args.json (the README's setup table): every setting but the
    learning rate, which the sweep varies and the other tables give per row, then the settings all variants share."""
    runs = {}
    for r in rows:
        runs.setdefault(r["config"].rsplit(" lr ", 1)[0], []).extend(r["args"])

    def value(args, key):  # one value, or all that occur
        return ", ".join(sorted({json.dumps(a.get(key)).strip('"') for a in args}))

    lines = [
        "| variant | batch | beta | max grad norm | sync | clamp (log bounds) | GRPO PPO eps | online samples "
        "| temperature |",
        "|---" * 9 + "|",
    ]
    for cell, args in runs.items():
        v = lambda key: value(args, key)  # noqa: E731
        online = v("online") == "true"
        samples = (
            f"{v('num_generations')} per prompt, every step"
            if cell.startswith("grpo")
            else f"rounds of {v('round_size')} prompts x {v('num_samples')}, best vs worst"
        )
        lines.append(
            f"| {cell} | {v('batch_size')} | {v('beta')} | {v('max_grad_norm')} "
            f"| {v('sync') + (', every ' + v('sync_every') + ' step(s)' if v('sync') != 'none' else '')} "
            f"| {v('clip') + (' [' + v('log_eps_P') + ', ' + v('log_eps_R') + ']' if v('clip') != 'none' else '')} "
            f"| {v('eps') if cell.startswith('grpo') else '–'} | {samples if online else '–'} "
            f"| {v('temperature') if online else '–'} |"
        )
    every = [a for args in runs.values() for a in args]
    lines += [
        "",
        f"All variants: {value(every, 'max_steps')} steps, AdamW (eps {value(every, 'adam_eps')}, weight decay "
        f"{value(every, 'weight_decay')}), warmup {value(every, 'warmup_ratio')} of the steps, reference-free "
        f"{value(every, 'ref_free')}, at most {value(every, 'max_new_tokens')} new tokens per sample.",
    ]
    return lines


def sweep_tables(rows, start):
    by = {r["config"]: r for r in rows}
    chosen = {}
    lines = [
        "Mean reward on the 256 validation prompts (3 seeds, ± standard error) at each learning rate, as a multiple of "
        f"the paper's rate for that variant (its Table 3); the chosen rate has the highest mean. The starting policy "
        f"scores {start:.3f} on these prompts.",
        "",
        "| variant | paper's rate | " + " | ".join(f"{m:g}x" for m in MULTIPLES) + " | chosen |",
        "|---" * (len(MULTIPLES) + 3) + "|",
    ]
    for cell, _, _ in CELLS:
        cells = [by.get(f"{cell} lr {m * paper_lr(cell):g}") for m in MULTIPLES]
        done = all(c and c["seeds"] == len(SWEEP_SEEDS) for c in cells)
        if done:
            best = int(np.argmax([c["reward"][0] for c in cells]))
            chosen[cell] = MULTIPLES[best] * paper_lr(cell)
        lines.append(
            f"| {cell} | {paper_lr(cell):g} | "
            + " | ".join(
                (
                    "**" + fmt(c["reward"]) + "**"
                    if done and i == best
                    else fmt(c["reward"]) + ("" if c["seeds"] == len(SWEEP_SEEDS) else f" (n={c['seeds']})")
                )
                if c
                else ""
                for i, c in enumerate(cells)
            )
            + (f" | {chosen[cell]:g} |" if done else " | not yet |")
        )
    lines += [
        "",
        f"The same runs at one rate shared by every variant, {SHARED_LR:g} (the scripts' default), next to each "
        "variant's chosen rate (validation reward):",
        "",
        "| variant | at the shared rate | at its chosen rate |",
        "|---|---|---|",
    ]
    for cell, _, _ in CELLS:
        shared = by.get(f"{cell} lr {SHARED_LR:g}")
        best = by.get(f"{cell} lr {chosen[cell]:g}") if cell in chosen else None
        lines.append(
            f"| {cell} | {fmt(shared['reward']) if shared else ''} "
            f"| {fmt(best['reward']) + f' ({chosen[cell]:g})' if best else ''} |"
        )
    lines += [
        "",
        "The mechanism, offline: at each rate the validation reward, the DPO/KTO reward margin (GRPO: mean |token "
        "log-ratio| to the reference) and the fraction of tokens outside [-1.5, 1.5], both averaged over training:",
        "",
        "| variant | lr | reward | margin | mean abs log-ratio | clamped frac |",
        "|---|---|---|---|---|---|",
    ]
    for cell, _, _ in CELLS:
        if "offline" in cell:
            for m in MULTIPLES:
                r = by.get(f"{cell} lr {m * paper_lr(cell):g}")
                if r:
                    lines.append(
                        f"| {cell} | {m * paper_lr(cell):g} | {fmt(r['reward'])} | {fmt(r['margin'])} "
                        f"| {fmt(r['abs_log_ratio'], 4)} | {fmt(r['clamped_frac'], 4)} |"
                    )
    return lines


def evidence(test):
    """The Holm-corrected p-value behind a verdict: Welch's for a difference, the TOST's for equivalence, else both."""
    if test["verdict"] in ("higher", "lower"):
        return f"p {test['p_holm']:.2g}"
    return (
        f"TOST p {test['p_tost_holm']:.2g}"
        if test["verdict"].startswith("equivalent")
        else f"p {test['p_holm']:.2g}, TOST p {test['p_tost_holm']:.2g}"
    )


def lora_tables(rows):
    """LoRA against full fine-tuning: each variant's two rows side by side, then humanline's comparisons with each."""
    by, tests = {r["config"]: r for r in rows}, significance(rows, comparisons("lora"))
    verdict = {(t["a"], t["b"]): t for t in tests}
    lines = [
        "",
        "Each variant with every weight trained and with LoRA adapters (final test reward, mean ± standard error; the "
        "difference's verdict and Holm-corrected p as in the table above) and the two learning rates chosen:",
        "",
        "| variant | full fine-tuning | LoRA | LoRA - full | LoRA's rate / full's |",
        "|---|---|---|---|---|",
    ]
    for cell, _, _ in LORA_CELLS:
        t, full, lora = verdict.get((f"{cell} lora", cell)), by.get(cell), by.get(f"{cell} lora")
        if t:
            rate = rate_of(lora["flags"])
            lines.append(
                f"| {cell} | {fmt(full['reward'])} | {fmt(lora['reward'])} | {t['diff']:+.3f} ({t['verdict']}, "
                f"{evidence(t)}) | {rate / rate_of(full['flags']):g}x ({rate:g}) |"
            )
    lines += [
        "",
        "Humanline's comparisons with every weight trained (the difference of the means above) and with LoRA (its "
        "verdict and Holm-corrected p as in the table above):",
        "",
        "| comparison | full fine-tuning | LoRA |",
        "|---|---|---|",
    ]
    for algo, other in [(a, b) for a in ("dpo", "grpo") for b in ("offline", "online")]:
        a, b = f"{algo} offline+humanline", f"{algo} {other}"
        t = verdict.get((f"{a} lora", f"{b} lora"))
        if t and a in by and b in by:
            full = np.mean(by[a]["rewards"]) - np.mean(by[b]["rewards"])
            lines.append(f"| {a} vs {b} | {full:+.3f} | {t['diff']:+.3f} ({t['verdict']}, {evidence(t)}) |")
    return lines


def smollm2_tables(rows, suite):
    """The real model's suites: its sweep's rates per variant (one seed each), or the comparison's tests and each
    run's success before (its step-0 evaluation) and after."""
    if suite == "smollm2_sweep":
        by = {r["config"]: r for r in rows}
        lines = [
            "",
            "Validation success at each learning rate (x the paper's rate for that variant) and the one chosen:",
            "",
            "| variant | " + " | ".join(f"{m:g}x" for m in SMOL_MULTIPLES) + " | chosen |",
            "|---" * (len(SMOL_MULTIPLES) + 2) + "|",
        ]
        for cell, _, _ in SMOL_CELLS:
            found = [by.get(f"smollm2 {cell} lr {m * paper_lr(cell):g}") for m in SMOL_MULTIPLES]
            best = int(np.argmax([c["reward"][0] for c in found])) if all(found) else None
            lines.append(
                f"| {cell} | "
                + " | ".join(f"{c['reward'][0]:.3f} ({rate_of(c['flags']):g})" if c else "" for c in found)
                + (f" | {rate_of(found[best]['flags']):g} |" if best is not None else " | not yet |")
            )
        return lines
    tests = significance(rows, comparisons(suite), SMOL_MARGIN)
    lines = tests_table(tests, "these four comparisons", SMOL_MARGIN) + [
        "",
        "Each configuration's success on the test prompts before training (its run's step-0 evaluation) and after:",
        "",
        "| configuration | seeds | before | after | after - before |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        before = [v for c in r["curves"] for s, v, _ in c if s == 0]
        gain = [after - b for after, b in zip(r["rewards"], before)]
        lines.append(
            f"| {r['config']} | {r['seeds']} | {fmt(mean_se(before))} | {fmt(r['reward'])} | {fmt(mean_se(gain))} |"
        )
    return lines


def instance_tables(rows, main_rows):
    """The main comparisons on each toy instance: instance 0 is the committed one (the main suite's runs)."""
    rows = [
        dict(r, config=f"instance 0: {r['config']}") for r in main_rows if not r["config"].endswith("online+humanline")
    ] + rows
    by = {r["config"]: r for r in rows}
    names = sorted({r["config"].split(": ")[0] for r in rows})
    cells = list(dict.fromkeys(r["config"].split(": ")[1] for r in rows))
    lines = [
        "Final test reward (mean ± standard error over seeds; instance 0: the main suite's 5 seeds, others 3) on each "
        "toy instance, at the variant's learning rate chosen on instance 0:",
        "",
        "| variant | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    lines += [
        f"| {c} | " + " | ".join(fmt(by[f"{n}: {c}"]["reward"]) if f"{n}: {c}" in by else "" for n in names) + " |"
        for c in cells
    ]
    # the starting policy: the runs' own evaluation at step 0, so that no instance needs building for the report
    start = {
        n: [v for r in rows if r["config"].startswith(n + ":") for c in r["curves"] for s, v, _ in c if s == 0]
        for n in names
    }
    lines.append(
        "| starting policy | " + " | ".join(f"{np.mean(start[n]):.3f}" if start[n] else "" for n in names) + " |"
    )
    verdicts = {}
    for n in names:  # Holm over each instance's comparisons
        for t in significance(
            rows, [p for p in comparisons("instances", [r["config"] for r in rows]) if p[0].startswith(n + ":")]
        ):
            verdicts[(n, t["comparison"].split(": ", 1)[1].replace(f" vs {n}: ", " vs "))] = t
    pairs = list(dict.fromkeys(k[1] for k in verdicts))
    lines += [
        "",
        "Each comparison on each instance (difference, verdict of Welch and TOST at 5%, Holm over the instance's "
        "comparisons, and the p-values behind it) and whether the verdict is the same on all of them:",
        "",
        "| comparison | " + " | ".join(names) + " | same on all |",
        "|---" * (len(names) + 2) + "|",
    ]
    for p in pairs:
        ts = [verdicts.get((n, p)) for n in names]
        same = all(ts) and len({t["verdict"] for t in ts}) == 1
        lines.append(
            f"| {p} | "
            + " | ".join(f"{t['diff']:+.3f} ({t['verdict']}, {evidence(t)})" if t else "" for t in ts)
            + f" | {'yes' if same else 'no' if all(ts) else 'incomplete'} |"
        )
    return lines, rows


def report(results, suite, configs, main_rows=(), mix_code=False, extra=""):
    """Write `<suite>.md`, `<suite>.jsonl` and the plot from the suite's finished runs (instances and ablations also
    read the main suite's `main_rows`)."""
    runs = load_runs(results, suite)
    rows = summarize(runs, configs)
    if not rows:
        print(f"{suite}: no finished runs yet")
        return rows
    versions = code_versions(rows + (list(main_rows) if suite == "instances" else []))
    if len(versions) > 1 and not mix_code:
        raise SystemExit(
            f"{suite}: its runs ran {len(versions)} versions of the code ({', '.join(versions)}); rerun the old "
            f"ones (remove them from {suite}.tar.gz) or pass --mix_code"
        )
    start = starting_reward()
    if suite.startswith("smollm2"):
        start = smollm2_start("valid" if suite == "smollm2_sweep" else "test")
    with open(os.path.join(results, f"{suite}.jsonl"), "w") as f:
        for r in rows:
            r = dict(
                r, flags=[x.replace(results + os.sep, "<results>/") for x in r["flags"]]
            )  # the same on every machine
            f.write(json.dumps({k: v for k, v in r.items() if k not in ("curves", "train", "args")}) + "\n")
    lines = [f"# {suite}", "", provenance_line(rows), "", *([extra, ""] if extra else [])]
    early = [  # online runs whose whole pass of prompts gave no batch end early, evaluated
        f"{name} seed {seed} at step {r['step']}"
        for name, _, flags, seeds in configs
        for seed in seeds
        if finished(runs.get(run_key(name, seed)), max_steps_of(flags))
        for r in records(runs[run_key(name, seed)])
        if r.get("ended_early")
    ]
    if early:
        lines += [f"Ended before their last step, a whole pass of prompts giving no batch: {', '.join(early)}.", ""]
    if suite == "sweep":
        lines += sweep_tables(rows, starting_reward("valid"))
    elif suite == "instances":
        more, plotted = instance_tables(rows, list(main_rows))
        lines += more + [""] + long_table(rows)
    elif suite.startswith("smollm2"):
        held_out = f"the task's {'128 validation' if suite == 'smollm2_sweep' else '256 test'} prompts (success rate)"
        lines += long_table(rows, held_out) + smollm2_tables(rows, suite) + time_ratios(rows)
    else:
        held_out = "the toy's 256 validation prompts" if suite == "lora_sweep" else "the toy test problems"
        lines += long_table(rows, held_out) + tests_table(significance(rows, comparisons(suite))) + time_ratios(rows)
        lines += lora_tables(rows) if suite == "lora" else []
    if suite in ("sweep", "main"):
        lines += ["", "The settings of each variant, from its runs' args.json:", ""] + setup_table(rows)
    if suite == "sweep":  # the README's setup table (the other suites change only the learning rate and evaluation)
        with open(os.path.join(results, "setup.md"), "w") as f:
            f.write("\n".join(setup_table(rows)) + "\n")
    if suite == "ablations":  # the data probe trains for 80 steps: every row (and the main DPO rows) at step 80
        lines += [
            "",
            "Held-out reward at step 80 (the data probe's last step), mean ± standard error:",
            "",
            "| configuration | seeds | reward at step 80 |",
            "|---|---|---|",
        ]
        for r in [r for r in list(main_rows) if r["config"].startswith("dpo")] + rows:
            at = [v for c in r["curves"] for s, v, _ in c if s == 80]
            if at:
                lines.append(
                    f"| {r['config']}{' (main, its own rate)' if r in main_rows else ''} | {len(at)} "
                    f"| {fmt(mean_se(at))} |"
                )
    with open(os.path.join(results, f"{suite}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(results, suite, plotted if suite == "instances" else rows, start)
    return rows


# ---- plots -----------------------------------------------------------------------------------------------------------


def mean_curve(series):
    """Mean and standard error over seeds of per-step (step, value) series; seeds of unequal length are left out."""
    steps = [s for s, _ in series[0]]
    values = np.array([[v for _, v in c] for c in series if [s for s, _ in c] == steps], dtype=float)
    se = values.std(0, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else np.zeros(len(steps))
    return np.array(steps), values.mean(0), se


def smooth(values, width=9):
    """A centred running mean (the per-step training metrics are noisy)."""
    if len(values) < width:
        return values
    padded = np.pad(values, width // 2, mode="edge")
    return np.convolve(padded, np.ones(width) / width, mode="valid")


def plot(results, suite, rows, start=None):
    """`<suite>.png`. sweep: reward, margin and clamped fraction against the learning rate (the mechanism); main,
    instances, offpolicy: one row of panels per group sharing the step axis, the held-out reward (evaluated every 10
    steps) and then the training diagnostics; ablations, quality: the final reward per configuration as bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plots; `pip install -r experiments/requirements.txt` for them)")
        return
    if suite == "sweep":  # the mechanism: the offline pair against the learning rate, online for reference
        algos = [a for a in ("dpo", "kto", "grpo") if any(r["config"].startswith(f"{a} offline") for r in rows)]
        fig, axes = plt.subplots(len(algos), 3, figsize=(13, 3.4 * len(algos)), squeeze=False)
        ticks = {}
        for row_axes, algo in zip(axes, algos):
            spread = (
                ("margin", "mean margin") if algo != "grpo" else ("abs_log_ratio", "mean |log-ratio| to the reference")
            )
            for cell in (f"{algo} offline", f"{algo} offline+humanline", f"{algo} online", f"{algo} online+humanline"):
                members = [r for r in rows if r["config"].rsplit(" lr ", 1)[0] == cell]
                if not members:
                    continue
                x = [rate_of(r["flags"]) for r in members]
                panels = zip(
                    row_axes,
                    ("reward", spread[0], "clamped_frac"),
                    ("validation reward", spread[1], "clamped fraction"),
                )
                for ax, key, label in panels if "offline" in cell else list(panels)[:1]:
                    ax.errorbar(
                        x,
                        [r[key][0] for r in members],
                        yerr=[0 if math.isnan(r[key][1]) else r[key][1] for r in members],
                        marker="o",
                        capsize=3,
                        label=cell,
                        ls="-" if "offline" in cell else ":",
                    )
                    ax.set_xscale("log")
                    ax.set_title(f"{algo}: {label}", fontsize=9)
                    ax.set_xlabel("learning rate", fontsize=8)
                    ticks.setdefault(ax, set()).update(x)
            row_axes[0].legend(fontsize=7)
        for ax, x in ticks.items():
            ax.set_xticks(sorted(x), [f"{v:.3g}" for v in sorted(x)], fontsize=7)
            ax.minorticks_off()
        fig.suptitle(
            "offline vs offline+humanline against the learning rate (3 seeds each; margin, |log-ratio| and clamped "
            "fraction averaged over training; online dotted, for reference)",
            fontsize=10,
        )
    elif suite in ("main", "instances", "offpolicy"):
        groups = {}
        for r in rows:
            key = {"main": r["config"].split()[0], "offpolicy": "off-policy GRPO"}.get(suite) or r["config"].split(
                ": "
            )[0] + ": " + r["config"].split(": ")[1].split()[0]
            groups.setdefault(key, []).append(r)
        fig, axes = plt.subplots(
            len(groups),
            1 + len(PANELS),
            figsize=(3.8 * (1 + len(PANELS)), 3.0 * max(len(groups), 1.3)),
            squeeze=False,
            sharex=True,
        )
        for row_axes, (group, members) in zip(axes, groups.items()):
            # each panel shows the first of its metrics that this group logs (DPO/KTO a margin, GRPO a |log-ratio|)
            keys = [
                next((k for k in options if any(t[k] for r in members for t in r["train"])), None)
                for _, options in PANELS
            ]
            for r in members:
                steps, mean, se = mean_curve([[(s, v) for s, v, _ in c] for c in r["curves"]])
                (line,) = row_axes[0].plot(
                    steps, mean, marker="o", ms=2.5, label=f"{r['config'].split(': ')[-1]} (n={r['seeds']})"
                )
                row_axes[0].fill_between(steps, mean - se, mean + se, alpha=0.2, color=line.get_color())
                for ax, key in zip(row_axes[1:], keys):
                    series = [t[key] for t in r["train"] if key and t[key]]
                    if series:
                        s, m, _ = mean_curve(series)
                        ax.plot(s, smooth(m), lw=1.2, color=line.get_color())
            if start is not None and suite != "instances":
                row_axes[0].axhline(start, color="gray", ls="--", lw=1, label="starting policy")
            row_axes[0].set_title(f"{group}: held-out reward", fontsize=9)
            if len(members) > 5:  # too many lines for the reward panel: the legend goes in (or beside) the last panel
                row_axes[-1].legend(
                    *row_axes[0].get_legend_handles_labels(),
                    fontsize=7,
                    loc="center left",
                    bbox_to_anchor=(0, 0.5) if keys[-1] is None else (1.02, 0.5),
                )
            else:
                row_axes[0].legend(fontsize=6)
            for ax, key in zip(row_axes[1:], keys):
                ax.set_title(f"{group}: {DIAGNOSTICS[key]}", fontsize=9) if key else ax.axis("off")
        for ax in axes[-1]:
            ax.set_xlabel("optimizer step", fontsize=8)
        fig.suptitle(
            "held-out reward (mean ± s.e. over seeds) and training diagnostics (mean over seeds, running mean of 9 "
            "steps) on one step axis",
            fontsize=10,
        )
    else:
        fig, ax = plt.subplots(figsize=(10, 0.38 * len(rows) + 1.2))
        ax.barh(
            range(len(rows)),
            [r["reward"][0] for r in rows],
            xerr=[0 if math.isnan(r["reward"][1]) else r["reward"][1] for r in rows],
            color="tab:blue",
            alpha=0.7,
        )
        ax.set_yticks(range(len(rows)), [f"{r['config']} (n={r['seeds']})" for r in rows], fontsize=7)
        ax.invert_yaxis()
        lo = min([r["reward"][0] for r in rows] + ([start] if start is not None else []))
        if start is not None:
            ax.axvline(start, color="gray", ls="--", lw=1, label="starting policy")
            ax.legend(fontsize=7)
        ax.set_xlim(max(0.0, lo - 0.1), 1.0)
        ax.set_xlabel("final held-out reward (greedy), mean ± s.e.")
        ax.set_title(f"{'SmolLM2-135M-Instruct' if suite.startswith('smollm2') else 'toy task'}: {suite}")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_size_inches()[1]))  # leave the suptitle its own strip
    fig.savefig(os.path.join(results, f"{suite}.png"), dpi=100, bbox_inches="tight")
    plt.close(fig)


# ---- the runner ------------------------------------------------------------------------------------------------------


def quick_suites(results):
    """--quick: for 2 steps on a tiny batch, one run of each configuration that takes another code path (`shape`), and
    at least one in each suite, so that every table is made. Rates are the paper's."""
    quick = [
        "--max_steps",
        "2",
        "--batch_size",
        "4",
        "--micro_batch_size",
        "4",
        "--num_eval_prompts",
        "8",
        "--eval_every",
        "0",
    ]
    full, seen = suites(results, paper_rates()), set()
    out = {}
    for suite in (
        "main",
        "sweep",
        "instances",
        "offpolicy",
        "ablations",
        "quality",
        "lora_sweep",
        "lora",
        "smollm2",
        "smollm2_sweep",
    ):  # main first: the sweep adds no new path
        out[suite] = []
        for name, script, flags, seeds in full[suite]:
            if shape(script, flags) not in seen or not out[suite]:
                seen.add(shape(script, flags))
                grpo, rounds = script.startswith("grpo"), "--online" in flags and "--sample_every" not in flags
                small = (["--num_generations", "4"] if grpo else []) + (
                    ["--round_size", "8"]
                    if rounds and (not grpo or "--pairs_from_samples" in flags) and not suite.startswith("smollm2")
                    else []
                )  # online rounds: 8 prompts (the real model's 32: 8 would keep fewer pairs than a batch)
                out[suite].append((name, script, strip(flags, "--max_steps") + quick + small, seeds[:1]))
    return {suite: out[suite] for suite in full}


DATA_FLAGS = ("--model_name_or_path", "--dataset", "--eval_prompts")  # which files: the same code reads them all


def shape(script, flags):
    """What decides a run's code path: the script, its flags and their values, but not numbers or the files it reads."""

    def kind(value):
        try:
            return float(value) is not None and "number"
        except ValueError:
            return value

    return script, tuple(
        sorted(
            (f, kind(v) if not v.startswith("--") else None)
            for f, v in zip(flags, flags[1:] + ["--"])
            if f.startswith("--") and f not in DATA_FLAGS
        )
    )


def strip(flags, name):
    if name in flags:
        i = flags.index(name)
        return flags[:i] + flags[i + 2 :]
    return flags


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    toy = ["sweep", "main", "instances", "offpolicy", "ablations", "quality", "lora_sweep", "lora"]
    names = toy + ["smollm2_sweep", "smollm2"]
    parser.add_argument("--suite", default="all", choices=["all"] + names, help="all: the toy's suites")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each uses one CPU thread)")
    parser.add_argument("--quick", action="store_true", help="each code path of every suite once, 2 steps")
    parser.add_argument("--report", action="store_true", help="only summarise finished runs")
    parser.add_argument("--only", default="", help="only configurations whose name contains this text")
    parser.add_argument(
        "--mix_code", action="store_true", help="allow a table to hold runs of different versions of the code"
    )
    parser.add_argument(
        "--new_seed",
        type=int,
        help="with --suite: rerun its finished configurations (those --only picks) "
        "with this seed, apart from the suite, and say whether each lands in its row's range for a new seed",
    )
    parser.add_argument("--results", default=RESULTS, help="results directory (--quick: a `quick` folder in it)")
    args = parser.parse_args()
    results = os.path.join(args.results, "quick") if args.quick else args.results
    os.makedirs(results, exist_ok=True)
    if args.new_seed is not None:
        if args.suite == "all":
            parser.error("--new_seed needs --suite")
        configs = [c for c in suites(results, choose_rates(results))[args.suite] if args.only in c[0]]
        return check_new_seed(results, args.suite, configs, args.new_seed, args.jobs)
    chosen = {}
    real = os.path.exists(os.path.join(ROOT, ".cache", "SmolLM2-135M-Instruct"))
    if args.suite.startswith("smollm2") and not (real or args.report):
        parser.error("the model is not made yet: python experiments/smollm2.py model")
    for suite in names if args.suite == "all" else [args.suite]:
        if suite.startswith("smollm2") and args.suite == "all":  # the real model's suites run only when named
            continue
        if not args.report:
            chosen = choose_rates(results) if not args.quick else chosen
            configs = (quick_suites(results) if args.quick else suites(results, chosen))[suite]
            if suite == "quality":
                make_quartiles(results)
            if suite == "instances" and configs:
                ensure_instances(results, configs)
            runs = load_runs(results, suite)
            jobs = [
                (name, script, flags, seed)
                for name, script, flags, seeds in configs
                if args.only in name
                for seed in seeds
                if not finished(runs.get(run_key(name, seed)), max_steps_of(flags))
            ]
            key, cells = ("smollm2 {}", SMOL_CELLS) if suite == "smollm2" else ("{}", CELLS)
            missing = sum(key.format(cell) not in chosen for cell, _, _ in cells)
            print(
                f"{suite}: {len(jobs)} runs to do"
                + (f" ({missing} variants have no chosen learning rate yet)" if missing and not args.quick else ""),
                flush=True,
            )
            pool = ThreadPoolExecutor(args.jobs)
            try:  # as each run ends, not in order: a run that fails or is stopped ends the suite at once
                for i, ended in enumerate(as_completed([pool.submit(launch, results, suite, *j) for j in jobs])):
                    ended.result()
                    print(f"  {suite}: {i + 1}/{len(jobs)} done", flush=True)
                    if (i + 1) % 10 == 0:  # nothing finished is lost for long; the archive is what gets committed
                        pack(results, suite)
            finally:  # a run failed or was stopped: the queued runs do not start, the finished ones are packed
                pool.shutdown(cancel_futures=True)
                pack(results, suite)
    chosen = choose_rates(results) if not args.quick else paper_rates()
    all_configs = quick_suites(results) if args.quick else suites(results, chosen)
    main_rows = summarize(load_runs(results, "main"), all_configs["main"])
    for suite in names if args.suite == "all" else [args.suite]:
        if suite.startswith("smollm2") and args.suite == "all" and not args.quick:  # as for running: when named
            continue
        extra = ""
        if suite == "quality" and all_configs["quality"]:
            extra = (
                "Data-quality proxy ranges (mean token log-prob under the starting policy), quartiles 1-4: "
                + ", ".join(f"[{lo:.3f}, {hi:.3f}] ({n} pairs)" for lo, hi, n in make_quartiles(results))
            )
        if suite in ("main", "instances", "offpolicy", "ablations", "quality", "lora") and not args.quick:
            lora = suite == "lora"  # its rows' rates: full fine-tuning's from the sweep, LoRA's from lora_sweep
            cells = {cell for cell, _, _ in LORA_CELLS} if lora else {cell for cell, _, _ in CELLS}
            rates = [(c, r) for c, r in chosen.items() if c.removesuffix(" lora") in cells and (lora or c in cells)]
            extra = (
                (extra + "\n\n" if extra else "")
                + f"Learning rates chosen on the validation prompts (the sweep{' and lora_sweep' * lora}): "
                + (", ".join(f"{c} {r:g}" for c, r in rates) or "none yet")
                + "."
            )
        report(results, suite, all_configs[suite], main_rows, args.mix_code, extra)


if __name__ == "__main__":
    main()
