"""The performance paths train exactly like the plain ones (to float tolerance), on the toy task:

- reference-free humanline, k = 1 (`--ref_free on`, the default where it applies): no reference model; the policy
  computes the next step's reference log-probs just before its update. Against two models synced in place
  (`--ref_free off`): DPO, KTO and GRPO with gradient accumulation, across online rounds, with two processes
  (FSDP2), and across a resume;
- `--precompute_ref`: the frozen reference's log-probs computed once before training, no reference model. Against
  a live reference: DPO, KTO and GRPO, and with two processes.

Single-process runs execute the real scripts in this process (`runpy`, exactly what `python script.py` runs):
each is then ~1 s instead of ~10 s of imports and start-up. Two-process runs go through torchrun."""

import contextlib
import io
import json
import math
import os
import runpy
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import dpo_humanline

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["--max_steps", "4", "--batch_size", "8", "--eval_prompts", "none", "--save_every", "0"]
ACCUM = ["--micro_batch_size", "4"]  # two micro-batches per step on one process
NOT_COMPARED = ("tokens_per_s", "online/seconds")  # and perf/*: timings and memory
ENV = {k: v for k, v in os.environ.items()
       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV |= {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def run_in_process(script, flags, out, monkeypatch=None):
    """`python script flags --output_dir out` in this process; returns (metrics records, models loaded)."""
    loads = []
    descriptor = AutoModelForCausalLM.__dict__["from_pretrained"]
    original = AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *a, **kw):
        loads.append(a[0] if a else kw.get("pretrained_model_name_or_path"))
        return original(cls, *a, **kw)

    argv, handler = sys.argv, signal.getsignal(signal.SIGTERM)
    sys.argv = [script, *flags, "--output_dir", str(out)]
    AutoModelForCausalLM.from_pretrained = classmethod(counting)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        AutoModelForCausalLM.from_pretrained = descriptor
        sys.argv = argv
        signal.signal(signal.SIGTERM, handler)  # the scripts catch SIGTERM to stop cleanly
    return records(out), len(loads)


@pytest.fixture(scope="module")
def run(toy, tmp_path_factory):
    """run(script, flags) -> (records, models loaded, output dir), each distinct run once per module."""
    cache = {}

    def go(script, flags):
        key = (script, tuple(flags))
        if key not in cache:
            out = tmp_path_factory.mktemp(script.split("_")[0])
            cache[key] = (*run_in_process(script, flags, out), out)
        return cache[key]

    return go


def launch_two_processes(script, flags, out):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script, *flags,
           "--output_dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return records(out)


def steps(recs):
    return [r for r in recs if "loss" in r]


def assert_same_training(a, b, rel=1e-5, abs_=1e-6):
    a, b = steps(a), steps(b)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        keys = {k for k in x.keys() & y.keys() if k not in NOT_COMPARED and not k.startswith("perf/")}
        assert "loss" in keys and "grad_norm" in keys
        for k in keys:
            assert y[k] == pytest.approx(x[k], rel=rel, abs=abs_), (x["step"], k, x[k], y[k])


def args_of(out):
    with open(os.path.join(out, "args.json")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------
# Reference-free humanline, k = 1
# ----------------------------------------------------------------------------------------------

SCRIPTS = ["dpo_humanline.py", "kto_humanline.py", "grpo_humanline.py"]
HUMANLINE = [*BASE, *ACCUM, "--humanline", "--save_every", "2"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_ref_free_equals_two_models_with_gradient_accumulation(script, run):
    two, loads_two, out_two = run(script, [*HUMANLINE, "--ref_free", "off"])
    free, loads_free, out_free = run(script, HUMANLINE)  # auto: on, since --humanline syncs every step
    assert args_of(out_free)["ref_free"] == "on" and args_of(out_two)["ref_free"] == "off"
    assert (loads_two, loads_free) == (2, 1)  # no reference model at all
    assert_same_training(two, free)
    losses = [r["loss"] for r in steps(free)]
    assert len(set(losses[1:])) > 1  # the reference moved: not simply the policy itself
    for r in steps(free):
        assert r["perf/step_seconds"] > 0 and r["perf/peak_memory_gib"] > 0


def test_ref_free_across_online_rounds(run):
    """Rounds of 24 prompts keep about 16 pairs (2 steps): the reference restarts from the policy at each round."""
    flags = [*BASE, *ACCUM, "--online", "--humanline", "--round_size", "24", "--num_samples", "4"]
    two, _, _ = run("dpo_humanline.py", [*flags, "--ref_free", "off"])
    free, loads, _ = run("dpo_humanline.py", flags)
    assert loads == 1
    assert len([r for r in free if "online/round" in r]) >= 2
    assert_same_training(two, free)
    first_of_round = {r["step"] + 1 for r in free if "online/round" in r}
    for r in steps(free):  # the first step of a round has policy = reference: loss log 2
        assert (r["loss"] == pytest.approx(math.log(2), abs=1e-6)) == (r["step"] in first_of_round), r


def test_ref_free_resumes_exactly(run, tmp_path):
    _, _, out = run("dpo_humanline.py", HUMANLINE)
    full = steps(records(out))
    resumed = tmp_path / "run"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoint-4")
    with pytest.raises(SystemExit, match="--ref_free on"):  # the checkpoint holds no reference model
        run_in_process("dpo_humanline.py", [*HUMANLINE, "--ref_free", "off", "--resume"], resumed)
    new = steps(run_in_process("dpo_humanline.py", [*HUMANLINE, "--resume"], resumed)[0])
    assert [r["step"] for r in new] == [1, 2, 3, 4]
    assert_same_training(full, new, rel=1e-6, abs_=1e-9)


@pytest.mark.parametrize("script,flags,match", [
    ("dpo_humanline.py", ["--humanline", "--sync_every", "2", "--ref_free", "on"], "--ref_free"),
    ("kto_humanline.py", ["--sync", "trust_region", "--ref_free", "on"], "--ref_free"),
    ("grpo_humanline.py", ["--online", "--humanline", "--ref_free", "on"], "--offline"),
    ("dpo_humanline.py", ["--humanline", "--precompute_ref"], "--precompute_ref"),
    ("dpo_humanline.py", ["--sync", "humanline", "--sync_every", "2", "--ref_free", "on"], "--ref_free on needs"),
    ("grpo_humanline.py", ["--online", "--precompute_ref"], "--precompute_ref"),
])
def test_flags_that_do_not_apply_are_refused(script, flags, match, tmp_path):
    with pytest.raises(SystemExit, match=match):
        run_in_process(script, [*BASE, *flags], tmp_path)


def test_sync_into_no_reference_is_a_no_op():
    policy = torch.nn.Linear(2, 2)
    before = [p.clone() for p in policy.parameters()]
    dpo_humanline.sync_reference(None, policy)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


# ----------------------------------------------------------------------------------------------
# --precompute_ref
# ----------------------------------------------------------------------------------------------

OFFLINE = [*BASE, *ACCUM]


@pytest.mark.parametrize("script", SCRIPTS)
def test_precompute_ref_equals_a_live_reference(script, run):
    live, loads_live, _ = run(script, OFFLINE)
    pre, loads_pre, _ = run(script, [*OFFLINE, "--precompute_ref"])
    assert (loads_live, loads_pre) == (2, 1)
    assert_same_training(live, pre)


def test_precompute_logps_dedups_and_matches_the_training_forward(toy):
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    seqs = [([3, 4, 5], [6, 7]), ([3, 4], [5, 6, 7, 8, 9]), ([3, 4, 5], [6, 7]), ([9], [8])]
    rt = SimpleNamespace(rank=0, world=1, device=torch.device("cpu"), autocast=torch.autocast("cpu", enabled=False))
    steps = [[(None, seqs[:2]), (None, seqs[2:])]]  # one step of two forwards of two sequences each
    cache = dpo_humanline.precompute_ref(model.train(), steps, SimpleNamespace(pad_token_id=0), rt)
    assert len(cache) == 3 and model.training
    like = dpo_humanline.token_logps(model, *dpo_humanline.collate(seqs, 0, torch.device("cpu"))).detach()
    got = dpo_humanline.completion_values([cache[dpo_humanline.sequence_key(s)] for s in seqs], seqs, like)
    torch.testing.assert_close(got, like, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Two processes (FSDP2, gloo): each is one process's run with half the micro-batch
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script,flags", [
    ("dpo_humanline.py", ["--humanline", "--save_every", "2"]),  # reference-free
    ("grpo_humanline.py", ["--precompute_ref"]),
], ids=["dpo-ref_free", "grpo-precompute_ref"])
def test_two_processes_equal_one_two_model_process(script, flags, run, tmp_path):
    reference_flags = [*BASE, *ACCUM, *flags] + (["--ref_free", "off"] if "--humanline" in flags else [])
    reference_flags = [f for f in reference_flags if f != "--precompute_ref"]
    one, _, _ = run(script, reference_flags)
    two = launch_two_processes(script, [*BASE, "--micro_batch_size", "2", *flags], tmp_path / "two")
    assert_same_training(one, two, rel=1e-4, abs_=1e-6)
