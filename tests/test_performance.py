"""Reference-free training (`--ref_free`, on by default) trains exactly like two models synced in place
(`--ref_free off`), to float tolerance, on the toy task. The reference is set to the policy at step 0 (and at each
online round) and synced every k steps; at each of those moments the policy computes the reference log-probs of
every known batch the reference will serve, and no reference model is loaded (online GRPO under --sync keeps the
weights it needs on the CPU until its samples exist). Checked for k = 1, 4 and 16 and never synced, trust-region
syncing, gradient accumulation, online rounds and GRPO's sampling buffers (periods that straddle them), two
processes (FSDP2), and a resume in the middle of a sync period.

Single-process runs execute the real scripts in this process (`runpy`, exactly what `python script.py` runs):
each is then ~1 s instead of ~10 s of imports and start-up. Two-process runs go through torchrun."""

import math
import shutil
from types import SimpleNamespace

import pytest
import runs
import torch
from paths import SCRIPTS
from transformers import AutoModelForCausalLM

import dpo_humanline
import ref_free

torch.set_num_threads(1)
BASE = ["--max_steps", "4", "--batch_size", "8", "--eval_prompts", "none", "--save_every", "0"]
ACCUM = ["--micro_batch_size", "4"]  # two micro-batches per step on one process
NOT_COMPARED = ("tokens_per_s", "online/seconds")  # and perf/*: timings and memory


@pytest.fixture(scope="module")
def run(toy, tmp_path_factory):
    """run(script, flags) -> (records, models loaded, output dir), each distinct run once per module."""
    cache = {}

    def go(script, flags):
        key = (script, tuple(flags))
        if key not in cache:
            out = tmp_path_factory.mktemp(script.split("_")[0])
            recs, _, loads = runs.run_here(script, flags, out)
            cache[key] = (recs, loads, out)
        return cache[key]

    return go


def launch_two_processes(script, flags, out):
    return runs.run(script, flags, out, nproc=2).check().records


def steps(recs):
    return [r for r in recs if "loss" in r]


def assert_same_training(a, b, n, rel=1e-5, abs_=1e-6):
    a, b = steps(a), steps(b)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, n + 1))
    for x, y in zip(a, b):
        keys = {k for k in x.keys() & y.keys() if k not in NOT_COMPARED and not k.startswith("perf/")}
        assert "loss" in keys and "grad_norm" in keys
        for k in keys:
            assert y[k] == pytest.approx(x[k], rel=rel, abs=abs_), (x["step"], k, x[k], y[k])


# ----------------------------------------------------------------------------------------------
# Reference-free, any k
# ----------------------------------------------------------------------------------------------


def steps_flags(n):
    return ["--max_steps", str(n), "--batch_size", "8", "--eval_prompts", "none", "--save_every", "0", *ACCUM]


def compare(run, script, flags, n):
    """Runs script with flags reference-free and with two models; asserts they train alike; returns both."""
    two, loads_two, _ = run(script, [*steps_flags(n), *flags, "--ref_free", "off"])
    free, loads_free, _ = run(script, [*steps_flags(n), *flags])  # the default
    assert (loads_two, loads_free) == (2, 1)  # no reference model at all
    assert_same_training(two, free, n)
    return two, free


# k = 16 for DPO only: the schedule of syncs and the log-probs computed ahead are ref_free.py's, one code for the three
# scripts, and each script's own wiring of it is the same at k = 4 (these cases) as at 16
@pytest.mark.parametrize(
    "script, k", [(s, k) for s in SCRIPTS for k in (1, 4)] + [("dpo_humanline.py", 16)], ids=lambda v: str(v)
)
def test_ref_free_equals_two_models_for_any_k(script, k, run):
    """Humanline syncing every k steps, with gradient accumulation, for more than one sync period."""
    n = k + 2  # the sync at step k - 1 serves steps k and k + 1
    _, free = compare(run, script, ["--humanline", "--sync_every", str(k)], n)
    losses = [r["loss"] for r in steps(free)]
    assert len(set(losses[1:])) > 1  # the reference moved: not simply the policy itself
    computes = [
        i == 0 or (i % k == k - 1 and i + 1 < n) for i in range(n)
    ]  # step 0 and each sync step with steps after it
    assert [r["perf/sync_seconds"] > 0 for r in steps(free)] == computes


@pytest.mark.parametrize(
    "script,flags",
    [
        ("dpo_humanline.py", []),  # never synced: every step's reference log-probs are computed at step 0
        ("kto_humanline.py", []),
        ("grpo_humanline.py", []),
        ("dpo_humanline.py", ["--sync", "trust_region", "--sync_every", "2"]),
        (
            "grpo_humanline.py",
            ["--online", "--sample_every", "2", "--num_generations", "4"],
        ),  # the sampler: each buffer
        ("grpo_humanline.py", ["--online", "--pairs_from_samples", "--round_size", "16", "--num_generations", "4"]),
    ],
    ids=["dpo-offline", "kto-offline", "grpo-offline", "dpo-trust-region-k2", "grpo-sample-every-2", "grpo-pairs"],
)
def test_ref_free_equals_two_models_without_humanline_syncing(script, flags, run):
    compare(run, script, flags, 5)


def test_ref_free_across_online_rounds_with_periods_that_straddle_them(run):
    """Rounds of 24 prompts keep about 16 pairs (2 steps); k = 3: a round's start sets the reference, a sync inside a
    round sets it again for the rest of the round."""
    flags = ["--online", "--humanline", "--sync_every", "3", "--round_size", "24", "--num_samples", "4"]
    _, free = compare(run, "dpo_humanline.py", flags, 7)
    assert len([r for r in free if "online/round" in r]) >= 3
    first_of_round = {r["step"] + 1 for r in free if "online/round" in r}
    for r in steps(free):  # the first step of a round has policy = reference: loss log 2
        assert (r["loss"] == pytest.approx(math.log(2), abs=1e-6)) == (r["step"] in first_of_round), r


def test_grpo_pairs_from_samples_under_sync_start_each_round_from_the_policy(run):
    """Algorithm 1 with groups of two: as online DPO and KTO, every round's reference starts as the policy (ratio
    1 at its first step) and humanline syncing (k = 3) goes on within it; reference-free equals two models."""
    flags = [
        "--online",
        "--pairs_from_samples",
        "--humanline",
        "--sync_every",
        "3",
        "--round_size",
        "24",
        "--num_generations",
        "4",
    ]
    _, free = compare(run, "grpo_humanline.py", flags, 7)
    first_of_round = {r["step"] + 1 for r in free if "online/groups" in r}  # a sampling's record
    assert len(first_of_round) >= 2
    for r in steps(free):
        assert (r["ratio/abs_log"] == 0) == (r["step"] in first_of_round), r


def test_ref_free_resumes_exactly_in_the_middle_of_a_sync_period(run, tmp_path):
    """k = 4: the checkpoint after step 6 holds the log-probs of steps 7 and 8 (computed at the sync step 4)."""
    flags = [*steps_flags(9), "--humanline", "--sync_every", "4", "--save_every", "3"]
    full, _, out = run("dpo_humanline.py", flags)
    resumed = tmp_path / "run"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoint-9")
    with pytest.raises(SystemExit, match="--ref_free on"):  # the checkpoint holds no reference model
        runs.run_here("dpo_humanline.py", [*flags, "--ref_free", "off", "--resume"], resumed)
    held = torch.load(resumed / "checkpoint-6" / "state-rank0.pt", weights_only=True)["ref"]
    assert sorted(held["ahead"]) == [6, 7]  # 0-based steps 6 and 7 are the 7th and 8th
    new = steps(runs.run_here("dpo_humanline.py", [*flags, "--resume"], resumed)[0])
    assert [r["step"] for r in new] == list(range(1, 10))
    assert_same_training(steps(full), new, 9, rel=1e-6, abs_=1e-9)


def test_the_old_flag_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown arguments: --precompute_ref"):
        runs.run_here("dpo_humanline.py", [*BASE, "--precompute_ref"], tmp_path)


GROUPS = ["--online", "--num_generations", "4"]


@pytest.mark.parametrize(
    "flags",
    [
        [
            "--humanline"
        ],  # on-policy, k = 1: every step samples after the update whose pre-update policy is its reference
        [
            "--humanline",
            "--sample_every",
            "4",
            "--sync_every",
            "2",
        ],  # the paper's off-policy shape (64 and 16), aligned
        ["--humanline", "--sample_every", "3", "--sync_every", "2"],  # not aligned
        ["--humanline", "--sample_every", "2", "--sync_every", "4"],  # a sync period over two samplings
        ["--sync", "trust_region", "--sample_every", "3", "--sync_every", "2"],
    ],
    ids=["on-policy-k1", "every4-k2", "every3-k2", "every2-k4", "trust-region"],
)
def test_online_grpo_under_sync_keeps_the_weights_it_needs_on_the_cpu(flags, run):
    """The reference of the steps after a sampling is the policy before an earlier update: its weights wait on the CPU
    and are swapped into the policy when the samples exist. Equal to two models, still one model loaded."""
    compare(run, "grpo_humanline.py", [*GROUPS, *flags], 7)


def test_kept_weights_survive_a_resume(run, tmp_path):
    """--sample_every 4 --sync_every 2: the sync at step 3 (0-based) serves steps 4 and 5, sampled at step 4; the
    checkpoint after step 3 holds the weights of step 3, and the resumed run equals the uninterrupted one."""
    flags = [*steps_flags(6), *GROUPS, "--humanline", "--sample_every", "4", "--sync_every", "2", "--save_every", "4"]
    full, _, out = run("grpo_humanline.py", flags)
    resumed = tmp_path / "run"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoint-6")
    held = torch.load(resumed / "checkpoint-4" / "state-rank0.pt", weights_only=True)["ref"]
    assert held["weights"] is not None and held["steps"] == [4, 5] and not held["ahead"]
    new = steps(runs.run_here("grpo_humanline.py", [*flags, "--resume"], resumed)[0])
    assert_same_training(steps(full), new, 6, rel=1e-6, abs_=1e-9)


@pytest.mark.parametrize(
    "sync,k,reset,expected",
    [
        ("humanline", 4, 0, {0: [0, 1, 2, 3], 3: [4, 5, 6, 7], 7: [8, 9, 10, 11]}),
        ("humanline", 1, 0, {0: [0, 1], **{t: [t + 1] for t in range(1, 11)}}),
        ("trust_region", 4, 0, {0: [0, 1, 2, 3], 3: [4, 5, 6, 7], 7: [8, 9, 10, 11]}),  # after the update
        ("none", 1, 0, {0: list(range(12))}),
        ("humanline", 4, 5, {5: [5, 6, 7], 7: [8, 9, 10, 11]}),  # a round started at step 5
    ],
)
def test_the_policy_computes_each_batch_once_where_the_reference_would_take_its_weights(sync, k, reset, expected, toy):
    """Which steps' log-probs the policy computes during each step (0 to 11 of 12): at the reset, the steps up to the
    first sync; at each sync (in optimizer_step, before or after the update), the k steps it serves."""
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    rt = SimpleNamespace(
        rank=0,
        world=1,
        device=torch.device("cpu"),
        autocast=lambda: torch.autocast("cpu", enabled=False),
        head_dtype=torch.float32,
        logps_temperature=1.0,
    )
    batches = lambda s: [dpo_humanline.collate([([1, 2], [3, 4 + s % 5])], 0, "cpu")]  # noqa: E731
    due = None if sync == "none" else lambda s: dpo_humanline.sync_due(s, k)  # as the script passes its schedule
    reference = ref_free.PolicyAsReference(model, batches, dpo_humanline.token_logps, rt, due, max_steps=12)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    got, ahead = {}, reference.held["ahead"]
    for step in range(reset, 12):
        before = set(ahead)
        if step == reset:
            reference.reset(model, step=step)
        dpo_humanline.optimizer_step(model, reference, opt, sched, 1e9, sync, k, step)
        if set(ahead) - before:
            got[step] = sorted(set(ahead) - before)
    assert got == expected


# ----------------------------------------------------------------------------------------------
# Two processes (FSDP2, gloo): each is one process's run with half the micro-batch
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script,flags",
    [
        ("dpo_humanline.py", ["--humanline", "--sync_every", "2"]),
        ("grpo_humanline.py", []),  # never synced: every step computed at step 0
    ],
    ids=["dpo-k2", "grpo-offline"],
)
def test_two_processes_equal_one_two_model_process(script, flags, run, tmp_path):
    one, _, _ = run(script, [*steps_flags(5), *flags, "--ref_free", "off"])
    two = launch_two_processes(script, [*steps_flags(5), *flags, "--micro_batch_size", "2"], tmp_path / "two")
    assert_same_training(one, two, 5, rel=1e-4, abs_=1e-6)


def test_two_processes_keep_and_swap_their_own_shards(tmp_path):
    """Online GRPO under --sync with two processes (each samples its share, so the one-process run differs): the
    kept weights are each process's shards, and reference-free equals two models."""
    flags = [
        *steps_flags(5),
        *GROUPS,
        "--humanline",
        "--sample_every",
        "3",
        "--sync_every",
        "2",
        "--micro_batch_size",
        "2",
    ]
    two_models = launch_two_processes("grpo_humanline.py", [*flags, "--ref_free", "off"], tmp_path / "off")
    free = launch_two_processes("grpo_humanline.py", flags, tmp_path / "on")
    assert_same_training(two_models, free, 5)
