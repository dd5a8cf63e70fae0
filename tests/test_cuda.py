"""The scripts on CUDA GPUs: skipped without one. No GPU has run this project's code yet; the first machine with
one checks the GPU path with `python -m pytest tests/test_cuda.py` (tests/test_gpu_path.py shows the same code paths
on a CPU)."""

import json
import math
import subprocess

import gpu_path_helper
import pytest
import runs
import torch
from paths import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
FEW = runs.short(3, 16) + ["--eval_every", "3", "--precision", "bf16"]  # evaluated at the start and step 3
RUNS = {
    "dpo offline + humanline": ("dpo_humanline.py", ["--humanline"]),
    "dpo online + humanline": ("dpo_humanline.py", ["--online", "--humanline", "--round_size", "32"]),
    "kto offline + humanline": ("kto_humanline.py", ["--humanline"]),
    "grpo offline + humanline": ("grpo_humanline.py", ["--humanline", "--gradient_checkpointing"]),
    "grpo online, off-policy + humanline": ("grpo_humanline.py", ["--online", "--humanline", "--sample_every", "2"]),
}


def run(script, flags, out, nproc=1):  # on the GPU for real, as a user runs it (no warm server: CUDA forks badly)
    proc = subprocess.run(
        runs.command(script, [*FEW, *flags], out, nproc), cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in steps)
    assert all(0 < r["perf/peak_memory_gib"] < torch.cuda.get_device_properties(0).total_memory / 2**30 for r in steps)
    assert any("eval/reward" in r for r in records) and (out / "model.safetensors").exists()
    return steps


@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_mode_trains_in_bf16_on_one_gpu(name, tmp_path):
    run(*RUNS[name], tmp_path / "out")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_mode_trains_with_fsdp2_on_two_gpus_like_one(name, tmp_path):
    """NCCL, bf16 mixed precision: the first step (reference = policy, nothing sampled differently) matches one GPU's
    to bf16's tolerance."""
    one = run(*RUNS[name], tmp_path / "one")
    two = run(*RUNS[name], tmp_path / "two", nproc=2)
    assert two[0]["loss"] == pytest.approx(one[0]["loss"], rel=0.05, abs=1e-3)


@pytest.mark.parametrize("reference_free", [True, False], ids=["reference-free", "two models"])
def test_at_step_0_the_training_forward_and_the_reference_agree_in_bf16(reference_free):
    """Where humanline is fragile: at k = 1 it trains on token log-ratios of about 1e-3, and on a GPU the policy's
    training forward and the reference's no-grad eval forward may take different attention kernels. At step 0 the
    reference is the policy: the largest |log-ratio| over the completion tokens, bf16 with the fp32 head, is at
    most 1e-4 for both references (test_first_run.py runs the same check on a CPU)."""
    assert gpu_path_helper.step0_log_ratio(reference_free) <= 1e-4
