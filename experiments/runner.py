"""Running a suite: each run one training script in a subprocess with one CPU thread, a few at a time; a finished run
(`finished`) skipped, a stopped one continued (a real model's, from its checkpoint: `launch`); a run that fails or is
stopped ends the suite (`run_suite`). Runs are written to results/runs/<suite>/ and packed, every few runs, into
results/<suite>.tar.gz: what `launch` keeps of each (its metrics, args.json, answers and their quality, wall and CPU
seconds; not the weights). The archive is what the report reads and what is committed.
"""

import argparse
import contextlib
import glob
import gzip
import hashlib
import io
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from smollm2 import ROOT  # defined there once: the scripts load smollm2.py on its own, as experiments.smollm2

KEPT = ("metrics.jsonl", "args.json", "eval_samples.jsonl", "quality.json")  # of a run's folder, once finished
PROGRESS_EVERY = 60  # seconds between two writes of a running attempt's time


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
            files = [n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)) and n != "log.txt"]
            if "cpu_seconds" in files:  # the runner writes it last: the run is complete
                runs[f"{config}/{seed}"] = {n: open(os.path.join(folder, n)).read() for n in files}
    return runs


def pack(results, suite):
    """Write every finished run of a suite into `<suite>.tar.gz` (byte-stable: sorted, no times), remove the folders
    (with none finished since the last pack, the archive is left as it is)."""
    live = os.path.join(results, "runs", suite)
    if not any(os.path.exists(p) for p in glob.glob(os.path.join(glob.escape(live), "*", "*", "cpu_seconds"))):
        return
    runs = load_runs(results, suite)
    archive = os.path.join(results, f"{suite}.tar.gz")
    with open(archive + ".tmp", "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for key in sorted(runs):
                for name in sorted(runs[key]):
                    data = runs[key][name].encode()
                    info = tarfile.TarInfo(f"{key}/{name}")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
    os.replace(archive + ".tmp", archive)
    for key in runs:
        shutil.rmtree(os.path.join(results, "runs", suite, key), ignore_errors=True)
        with contextlib.suppress(OSError):  # the configuration's folder, once empty
            os.rmdir(os.path.join(results, "runs", suite, key.split("/")[0]))


def records(run):
    return [json.loads(line) for line in run.get("metrics.jsonl", "").splitlines() if line.strip()]


def finished(run, max_steps):
    """At --max_steps, or earlier where a whole pass of online prompts gave no batch (the script says so), with an
    evaluation whose every reward scored: a run whose reward failed is not a trained model."""
    at_end = [r for r in records(run or {}) if r.get("step") == max_steps or r.get("ended_early")]
    evaluated = [r for r in at_end if "eval/reward" in r]
    return run is not None and "cpu_seconds" in run and any(r.get("eval/bad_rewards", 0) == 0 for r in evaluated)


def max_steps_of(flags):
    return int(flags[flags.index("--max_steps") + 1]) if "--max_steps" in flags else 120


def run_script(cmd, env, log_path, progress=None):
    """Run one command, its output in log_path: its exit code and its own CPU seconds (user + system), which a busy
    machine does not inflate as it does wall time. While it runs, `progress(CPU seconds so far)` every PROGRESS_EVERY
    seconds, so that a runner stopped with its machine loses no attempt's time."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        for tick in itertools.count(1):
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
            if progress and tick % PROGRESS_EVERY == 0:
                with contextlib.suppress(OSError):  # no /proc (not Linux): the time is kept at the end only
                    stat = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
                    progress((int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"))  # utime + stime
            time.sleep(1)


def definition(suite, name, script, flags, seed):
    """The digest of a run's definition: the files that define the suites (suites.py, studies/) and the run's own
    configuration. A run's args.json records it beside the code and library versions the script records."""
    files = [os.path.join(ROOT, "experiments", "suites.py")]
    files += sorted(glob.glob(os.path.join(ROOT, "experiments", "studies", "*.py")))
    digest = hashlib.sha256()
    for file in files:
        with open(file, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    digest.update(json.dumps([suite, name, script, flags, seed]).encode())
    return digest.hexdigest()[:16]


def folder(results, suite, name, seed):
    return os.path.join(results, "runs", suite, run_key(name, seed))


def launch(out, suite, name, script, flags, seed, task=None):
    """One run in its folder `out`, continued from its checkpoint where a real model's (`task`) was stopped; its
    seconds over attempts; then what the archive keeps of it."""
    save_every = 4 if task else 0  # a real model's run (up to an hour) keeps a checkpoint every 4 steps
    cmd = [sys.executable, os.path.join(ROOT, script), *flags, "--seed", str(seed), "--output_dir", out]
    cmd += ["--save_every", str(save_every)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    spent = os.path.join(out, "seconds_before_resume")  # the earlier attempts' wall and CPU seconds
    resume = save_every and glob.glob(os.path.join(out, "checkpoint-*", "state-rank0.pt"))
    if resume:
        cmd.append("--resume")
    else:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
    before = json.load(open(spent)) if resume and os.path.exists(spent) else {"wall": 0.0, "cpu": 0.0}
    t0 = time.time()

    def spend(cpu_seconds):  # this attempt's seconds so far added to the earlier ones', kept where a rerun reads them
        seconds = {"wall": before["wall"] + time.time() - t0, "cpu": before["cpu"] + cpu_seconds}
        with open(spent + ".tmp", "w") as f:
            json.dump(seconds, f)
        os.replace(spent + ".tmp", spent)
        return seconds

    code, cpu_seconds = run_script(cmd, env, os.path.join(out, "log.txt"), progress=spend if save_every else None)
    seconds = spend(cpu_seconds)
    metrics = os.path.join(out, "metrics.jsonl")
    run = {"cpu_seconds": "", "metrics.jsonl": open(metrics).read() if os.path.exists(metrics) else ""}
    stopped = code == 0 and not finished(run, max_steps_of(flags))
    if code != 0 or stopped:  # failed, or stopped by a signal after saving: a rerun continues it
        raise SystemExit(f"{' '.join(cmd)} {'stopped' if stopped else f'failed ({code})'}; see {out}/log.txt")
    kept = sorted(glob.glob(os.path.join(out, "eval_samples-step*.jsonl")))  # --keep_every_eval's
    for samples in [os.path.join(out, "eval_samples.jsonl"), *kept] if task else []:  # what the reward leaves out
        quality = [sys.executable, os.path.join(ROOT, "experiments", "smollm2.py"), "quality", "--task", task]
        if run_script(quality + ["--samples", samples], env, os.path.join(out, "quality.log"))[0]:
            raise SystemExit(f"{' '.join(quality)} --samples {samples} failed; see {out}/quality.log")
    for file in os.listdir(out):  # keep the metrics and the answers, drop the weights
        if file not in KEPT + ("log.txt", "quality.log") and not file.startswith(("eval_samples-step", "quality-step")):
            p = os.path.join(out, file)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    recorded = os.path.join(out, "args.json")  # the suite's definition beside what the script recorded there
    if os.path.exists(recorded):
        of_suite = dict(name=suite, definition=definition(suite, name, script, flags, seed))
        args = json.load(open(recorded)) | {"suite": of_suite}
        with open(recorded, "w") as f:
            json.dump(args, f, indent=2)
    for kind in ("wall", "cpu"):  # cpu_seconds last: its presence marks a complete folder
        with open(os.path.join(out, f"{kind}_seconds"), "w") as f:
            f.write(f"{seconds[kind]:.1f}\n")
    for log in ("log.txt", "quality.log"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, log))


def copy_runs(results, source, suite, configs):
    """The runs of `source` (a suite) of the same configuration, seed and rate as some of `suite`'s, copied into its
    folder (each file as it was; cpu_seconds last, as a run writes it): its runner skips them, its tables read them."""
    theirs, mine = load_runs(results, source), load_runs(results, suite)
    for c in configs:
        for key in [run_key(c.name, seed) for seed in c.seeds if run_key(c.name, seed) not in mine]:
            run, rate = theirs.get(key, {}), float(c.flags[c.flags.index("--learning_rate") + 1])
            if run and json.loads(run["args.json"])["learning_rate"] == rate:
                os.makedirs(os.path.join(results, "runs", suite, key), exist_ok=True)
                for name in sorted(run, key=lambda n: n == "cpu_seconds"):
                    with open(os.path.join(results, "runs", suite, key, name), "w") as f:
                        f.write(run[name])


def pending(results, suite, entry, configs, only=""):
    """(name, script, flags, seed) of every unfinished run of a suite's configurations (those whose name contains
    `only`), seed by seed (a suite stopped part-way is paired); first, those another suite ran already
    (`entry.copies`) copied from it."""
    if entry.copies:
        copy_runs(results, entry.copies, suite, configs)
    runs = load_runs(results, suite)
    seeds = sorted({seed for c in configs for seed in c.seeds})
    todo = [(c.name, c.script, c.flags, s) for s in seeds for c in configs if only in c.name and s in c.seeds]
    return [run for run in todo if not finished(runs.get(run_key(run[0], run[3])), max_steps_of(run[2]))]


def run_suite(results, suite, entry, configs, jobs, only=""):
    """Every pending run of a suite, `jobs` at a time, packed into its archive as they finish."""
    todo = pending(results, suite, entry, configs, only)
    print(f"{suite}: {len(todo)} runs to do", flush=True)
    pool = ThreadPoolExecutor(jobs)
    try:  # as each run ends, not in order: a run that fails or is stopped ends the suite at once
        out = [folder(results, suite, name, seed) for name, _, _, seed in todo]
        ended = as_completed([pool.submit(launch, o, suite, *run, task=entry.task) for o, run in zip(out, todo)])
        for i, run in enumerate(ended):
            run.result()
            print(f"  {suite}: {i + 1}/{len(todo)} done", flush=True)
            if (i + 1) % 10 == 0:  # nothing finished is lost for long; the archive is what gets committed
                pack(results, suite)
    finally:  # a run failed or was stopped: the queued runs do not start, the finished ones are packed
        pool.shutdown(cancel_futures=True)
        pack(results, suite)


def command(results, suite, name, script, flags, seed, task=None):
    """One pending run as a line any scheduler runs (a Slurm array, GNU parallel, `xargs -P`), from any folder, with
    one CPU thread: main() below, which runs it as run_suite would (launch)."""
    python = "python" if shutil.which("python") == sys.executable else sys.executable
    words = [python, os.path.join(ROOT, "experiments", "runner.py"), "--suite", suite, "--config", name]
    words += ["--task", task] * bool(task) + ["--seed", str(seed), "--output_dir", folder(results, suite, name, seed)]
    return "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 " + shlex.join([*words, script, *flags])


# ---- --quick: every code path of every suite, for 2 steps ------------------------------------------------------------
QUICK = ["--max_steps", "2", "--batch_size", "4", "--micro_batch_size", "4", "--num_eval_prompts", "8"]
QUICK += ["--eval_every", "0"]
DATA_FLAGS = ("--model_name_or_path", "--dataset", "--eval_prompts")  # which files: the same code reads them all


def quick(configs, seen, real=False):
    """One configuration of each code path (`shape`) not in `seen`, and at least one, for 2 steps on a tiny batch."""
    out = []
    for c in configs:
        if shape(c.script, c.flags) in seen and out:
            continue
        seen.add(shape(c.script, c.flags))
        grpo, rounds = c.script.startswith("grpo"), "--online" in c.flags and "--sample_every" not in c.flags
        small = ["--num_generations", "4"] * grpo  # online rounds: 8 prompts (the real model's 32: fewer keep a batch)
        small += ["--round_size", "8"] * (rounds and (not grpo or "--pairs_from_samples" in c.flags) and not real)
        out.append(c._replace(flags=strip(c.flags, "--max_steps") + QUICK + small, seeds=c.seeds[:1]))
    return out


def shape(script, flags):
    """What decides a run's code path: the script, its flags and their values, but not numbers or the files it reads."""

    def kind(value):  # a flag's value: None for a switch (the next is a flag), "number" for any number
        if value.startswith("--"):
            return None
        try:
            return float(value) is not None and "number"
        except ValueError:
            return value

    named = [(f, kind(v)) for f, v in zip(flags, flags[1:] + ["--"]) if f.startswith("--") and f not in DATA_FLAGS]
    return script, tuple(sorted(named))


def strip(flags, name):  # the flags without `name` and its value
    i = flags.index(name) if name in flags else len(flags)
    return flags[:i] + flags[i + 2 :]


def main():
    parser = argparse.ArgumentParser(description="One run of a suite, as `experiments/run.py --commands` prints it.")
    parser.add_argument("--suite", required=True, help="the suite the run belongs to (its archive packs it)")
    parser.add_argument("--config", required=True, help="the configuration's name")
    parser.add_argument("--task", default=None, help="a real model's task: a checkpoint every 4 steps, quality.json")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--output_dir", required=True, help="the run's folder: <results>/runs/<suite>/<config>/seed<N>")
    parser.add_argument("script", help="the training script, then its flags")
    parser.add_argument("flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    launch(args.output_dir, args.suite, args.config, args.script, args.flags, args.seed, args.task)


if __name__ == "__main__":
    main()
