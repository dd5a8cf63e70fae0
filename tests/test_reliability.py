"""Reliability of the three training scripts: bad input stops a run before training with the row and column
named; bad rewards are dropped and counted or stop the run; a non-finite step is skipped and too many stop
the run; SIGTERM writes a checkpoint and exits cleanly; SIGKILL at any moment leaves every complete
checkpoint loadable; --resume continues exactly (offline, humanline, online; one and two processes); a hung or
dead process stops a two-process run; only rank 0 writes shared files; nothing is unpickled.

Faults are real: bad files on disk, a reward function that raises or returns NaN/None/inf, a learning rate
that overflows the weights, real signals sent to real processes (SIGTERM, SIGKILL, SIGSTOP)."""

import ast
import contextlib
import importlib
import json
import math
import os
import pickle
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import runs
import torch
from conftest import make_session
from paths import ROOT, SCRIPTS
from transformers import AutoModelForCausalLM, AutoTokenizer

import data_formats
import plumbing
import toy_task

torch.set_num_threads(1)
MODULES = {s: importlib.import_module(s[:-3]) for s in SCRIPTS}
ENV = runs.ENV | {"PYTHONUNBUFFERED": "1"}  # what a stopped run printed is read as it goes
TINY = ["--batch_size", "8", "--eval_every", "0", "--num_eval_prompts", "8"]
ONLINE = {
    "dpo_humanline.py": ["--online", "--round_size", "32", "--num_samples", "4"],
    "kto_humanline.py": ["--online", "--round_size", "32", "--num_samples", "4"],
    "grpo_humanline.py": ["--online", "--num_generations", "4"],
}


def command(script, extra, out, nproc=1):  # this module's runs: TINY, micro-batches of 4 sequences in all
    return runs.command(script, [*TINY, "--micro_batch_size", str(4 // nproc), *extra], out, nproc)


def run(script, extra, out, nproc=1):
    return runs.run(script, [*TINY, "--micro_batch_size", str(4 // nproc), *extra], out, nproc, ENV, 300).proc


def run_here(script, extra, out):  # in this process: what it printed
    return runs.run_here(script, [*TINY, "--micro_batch_size", "4", *extra], out)[1]


class Started:
    """A run in the background, its output in files (no pipe to fill)."""

    def __init__(self, script, extra, out, nproc=1):
        self.out, self.log = str(out), f"{out}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                command(script, extra, out, nproc),
                cwd=ROOT,
                env=ENV,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for(self, condition, timeout=120, poll=0.02):
        end = time.time() + timeout
        while not condition():
            assert self.proc.poll() is None, f"the run ended first (rc {self.proc.returncode}):\n{self.output[-3000:]}"
            assert time.time() < end, f"timed out waiting:\n{self.output[-3000:]}"
            time.sleep(poll)

    def kill(self):
        """SIGKILL the run: the process, its process group and torchrun's workers (each in a session of its own)."""
        for pid in children(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout=300):
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()

    @property
    def output(self):
        with open(self.log) as f:
            return f.read()


def records(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]  # a line being written is not read


def steps(out):
    """The last record of each training step (after a resume, a step's record supersedes an earlier attempt's)."""
    return {r["step"]: r for r in records(out) if "loss" in r}


def rounds(out):
    return {r["step"]: r for r in records(out) if "online/reward" in r}


def checkpoints(out):
    if not os.path.isdir(out):
        return []
    return sorted((d for d in os.listdir(out) if d.startswith("checkpoint-")), key=lambda d: (len(d), d))


def assert_loadable(ckpt, world=1):
    """A complete checkpoint: every process's training state (tensors and plain data only) and the model."""
    import torch.distributed.tensor  # noqa: F401 (a sharded state holds DTensors, which load once it is imported)

    for rank in range(world):
        state = torch.load(os.path.join(ckpt, f"state-rank{rank}.pt"), weights_only=True)
        assert state["state"]["step"] == int(ckpt.rsplit("-", 1)[1]) and state["world_size"] == world
    AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)


def same_runs(a, b, from_step=1, keys=("loss", "grad_norm", "lr", "rewards/margins", "humanline/clamped_frac")):
    """Every step from `from_step` on logs exactly the same values in both runs (online: the rounds too)."""
    sa, sb = steps(a), steps(b)
    assert sorted(sa) == sorted(sb) and max(sa) >= from_step
    for s in range(from_step, max(sa) + 1):
        for k in keys + tuple(k for k in sa[s] if k.startswith("eval/")):
            assert sb[s][k] == sa[s][k], (s, k, sa[s][k], sb[s][k])
    ra, rb = rounds(a), rounds(b)
    assert sorted(ra) == sorted(rb)
    for s in ra:
        for k in ("online/reward", "online/pairs", "online/bad_rewards"):
            assert ra[s].get(k) == rb[s].get(k), (s, k)


def same_models(a, b):
    ma, mb = AutoModelForCausalLM.from_pretrained(a).state_dict(), AutoModelForCausalLM.from_pretrained(b).state_dict()
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


# ----------------------------------------------------------------------------------------------
# Bad input: every row checked before training, the row and column named
# ----------------------------------------------------------------------------------------------

GOOD = {"prompt": "12+34=", "chosen": "4+2+0=06;3+1+0=04>046", "rejected": "4+2+0=06;3+1+0=04>047"}
# (case, the bad row, the message): row 1 is bad, row 0 is good
BAD_PAIRS = {
    "missing column": ({"prompt": "1+2=", "chosen": "3"}, "row 1: missing column 'rejected'"),
    "null value": ({**GOOD, "prompt": None}, "row 1: missing column 'prompt'"),
    "empty prompt": ({**GOOD, "prompt": "  "}, "row 1, column 'prompt': empty text"),
    "empty completion": ({**GOOD, "chosen": ""}, "row 1, column 'chosen': empty text"),
    "not a string": (
        {**GOOD, "rejected": 7},
        "row 1, column 'rejected': expected a string or a non-empty list of messages, got int",
    ),
    "message without role": (
        {**GOOD, "prompt": [{"content": "1+2="}]},
        "row 1, column 'prompt': each message needs a role",
    ),
    "unknown role": (
        {**GOOD, "prompt": [{"role": "robot", "content": "1+2="}]},
        "row 1, column 'prompt': each message needs a role",
    ),
    "content not a string": (
        {**GOOD, "prompt": [{"role": "user", "content": ["1+2="]}]},
        "row 1, column 'prompt': message content must be a string",
    ),
    "not a message": ({**GOOD, "prompt": ["1+2="]}, "row 1, column 'prompt': each message needs a role"),
    "chosen equals rejected": (
        {**GOOD, "rejected": GOOD["chosen"]},
        "row 1, columns 'chosen'/'rejected': identical completions",
    ),
}
BAD_KTO = {
    "label a string": (
        {"prompt": "1+2=", "completion": "3", "label": "yes"},
        "row 1, column 'label': expected a boolean",
    ),
    "label a number": ({"prompt": "1+2=", "completion": "3", "label": 1}, "row 1, column 'label': expected a boolean"),
    "label missing": ({"prompt": "1+2=", "completion": "3"}, "row 1: missing column 'label'"),
    "completion missing": ({"prompt": "1+2=", "label": True}, "row 1: missing column 'completion'"),
}


def encode_rows(script, rows, tok):
    m = MODULES[script]
    return data_formats.encode_rows(rows, tok, m.Args(), "data.jsonl", unpaired_ok=script == "kto_humanline.py")


@pytest.mark.parametrize("case", list(BAD_PAIRS))
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_bad_preference_row_is_named(script, case, tok):
    row, message = BAD_PAIRS[case]
    with pytest.raises(SystemExit) as e:
        encode_rows(script, [GOOD, row], tok)
    assert message in str(e.value)


@pytest.mark.parametrize("case", list(BAD_KTO))
def test_a_bad_kto_row_is_named(case, tok):
    row, message = BAD_KTO[case]
    with pytest.raises(SystemExit) as e:
        encode_rows("kto_humanline.py", [{"prompt": "1+2=", "completion": "3", "label": True}, row], tok)
    assert message in str(e.value)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_prompts_for_sampling_or_evaluation_are_named(script, tok):
    m = MODULES[script]
    for prompt, message in [(None, "missing"), ("", "empty text"), ([{"role": "user"}], "content must be a string")]:
        with pytest.raises(SystemExit) as e:
            data_formats.as_text(
                data_formats.prompt_row({"prompt": prompt}, "prompts.jsonl: row 1", m.Args())["prompt"],
                "prompts.jsonl: row 1, column 'prompt'",
                tok,
            )
        assert str(e.value).startswith("prompts.jsonl: row 1") and message in str(e.value)


BAD_FILES = {  # (script, rows, extra flags, what the user is told)
    "dpo: malformed message": (
        "dpo_humanline.py",
        [GOOD, GOOD, {**GOOD, "chosen": [{"role": "robot", "content": "x"}]}],
        [],
        "row 2, column 'chosen': each message needs a role",
    ),
    "kto: label not a boolean": (
        "kto_humanline.py",
        [{"prompt": "1+2=", "completion": "3", "label": True}] * 2
        + [{"prompt": "1+2=", "completion": "3", "label": "yes"}],
        [],
        "row 2, column 'label'",
    ),
    "grpo online: empty prompt": (
        "grpo_humanline.py",
        [{"prompt": "1+2="}] * 2 + [{"prompt": ""}],
        ["--online"],
        "row 2, column 'prompt': empty text",
    ),
    "dpo: bad evaluation prompt": (
        "dpo_humanline.py",
        [{"prompt": "1+2="}, {"prompt": "2+2="}, {"text": "3+3="}],
        ["--dataset", "toy", "--eval_prompts", "{file}"],
        "row 2: missing column 'prompt'",
    ),
    "dpo: fewer pairs than a batch": ("dpo_humanline.py", [GOOD] * 5, [], "5 rows, fewer than the 8 that one batch"),
    "kto online: fewer prompts than a round": (
        "kto_humanline.py",
        [{"prompt": "1+2="}] * 5,
        ONLINE["kto_humanline.py"],
        "5 rows, fewer than the 32 that one batch or round takes",
    ),
    "grpo: malformed JSON": ("grpo_humanline.py", None, [], "Missing a comma or '}' after an object member. in row 1"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_stops_the_run_before_any_model_loads(case, tmp_path, toy, monkeypatch):
    """The real script, run in this process (runpy) so that it costs no start-up: the run stops with the
    message before a model is loaded and before anything is written."""
    script, rows, extra, message = BAD_FILES[case]
    path = str(tmp_path / "data.jsonl")
    if rows is None:
        with open(path, "w") as f:
            f.write(json.dumps(GOOD) + '\n{"prompt": "1+2=" "chosen": "3"}\n')
    else:
        write_jsonl(path, rows)
    extra = [a.replace("{file}", path) for a in extra]
    if "--dataset" not in extra:
        extra = ["--dataset", path, *extra]

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_model)
    with pytest.raises((SystemExit, ValueError)) as e:
        run_here(script, [*extra, "--max_steps", "2"], tmp_path / "out")
    assert message in str(e.value)
    assert not os.path.exists(tmp_path / "out")


def test_a_local_file_must_be_plain_data(tmp_path):
    """Nothing is unpickled from data files: a pickled DataFrame ('pandas') or any other format is refused."""
    for name in ("data.pandas", "data.pkl"):
        path = tmp_path / name
        path.write_bytes(b"not read")
        for m in MODULES.values():
            with pytest.raises(SystemExit, match="must be a .json, .jsonl, .parquet or .csv file"):
                data_formats.load_data(m.Args(dataset=str(path)), "preferences", None, None)


# ----------------------------------------------------------------------------------------------
# Bad rewards: NaN, None, inf or an exception from the scorer
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_score_samples_finds_each_bad_reward(script):
    m = MODULES[script]

    def scorer(prompts, completions, **columns):
        if "boom" in completions:
            raise RuntimeError("scorer crashed")
        return [
            {"nan": math.nan, "none": None, "inf": -math.inf, "text": "high"}.get(c, len(c) / 10) for c in completions
        ]

    scores, bad = plumbing.score_samples("mine", scorer, ["p"] * 6, ["ab", "nan", "none", "boom", "inf", "text"], {})
    assert scores == [0.2, None, None, None, None, None]
    assert list(bad) == [1, 2, 3, 4, 5]
    assert bad[3] == "reward mine of prompt 'p' raised RuntimeError: scorer crashed" and bad[1].endswith("is nan")
    scores, bad = plumbing.score_samples(
        "one", lambda p, c, **k: [1.0], ["p"] * 2, ["a", "b"], {}
    )  # wrong length: each sample alone
    assert scores == [1.0, 1.0] and not bad
    pairs = m.best_worst_pairs([([1], ["a", "b"], [None, 0.5]), ([2], ["c", "d"], [0.9, None])], 0.0)
    assert pairs == []  # a prompt with fewer than two good samples gives no pair


def test_bad_rewards_are_dropped_and_counted_dpo(tmp_path, toy):
    run_here(
        "dpo_humanline.py",
        [
            *ONLINE["dpo_humanline.py"],
            "--max_steps",
            "2",
            "--save_every",
            "0",
            "--reward_model",
            "tests.support.faulty_rewards:flaky",
        ],
        tmp_path,
    )
    r = rounds(str(tmp_path))[0]
    assert 0 < r["online/bad_rewards"] < 128 and r["online/pairs"] >= 8
    last = steps(str(tmp_path))[2]
    # the flaky scorer evaluates too: about one greedy completion in five is dropped and counted, the rest scored
    assert math.isfinite(last["loss"]) and math.isfinite(last["eval/reward"]) and 0 < last["eval/bad_rewards"] < 8


def test_the_scorers_get_finished_and_the_cut_share_counts_every_answer(tmp_path, toy):
    """Every scorer is given the `finished` column (faulty_rewards.finished_only asks for it: 1 for an answer that
    ended, 0 for one cut, and a failed reward for about one sample in four). Sampled at temperature 3 with room for
    the toy's whole answer, some answers run past 32 tokens and are cut: the cut share is over every answer of the
    round, the reward over those that scored. The greedy evaluation's answers all end: each scores 1."""
    finished_only = "tests.support.faulty_rewards:finished_only"
    flags = ["--online", "--num_generations", "4", "--sample_every", "4", "--max_new_tokens", "32"]
    flags += ["--temperature", "3", "--top_p", "1", "--reward_funcs", finished_only, "--reward_model", finished_only]
    run_here("grpo_humanline.py", [*runs.short(1, eval_prompts=32), *flags], tmp_path)
    sampled, evaluated = rounds(str(tmp_path))[0], steps(str(tmp_path))[1]
    cut, bad = sampled["online/truncated_completions"], sampled["online/bad_rewards"]
    assert 0 < cut < 32 and 0 < bad < 32, sampled  # 32 answers: 8 prompts x 4
    assert sampled["online/truncated_frac"] == pytest.approx(cut / 32)
    assert 0 < sampled["online/reward"] < 1  # among the scored: some cut (0), some finished (1)
    assert evaluated["eval/truncated_completions"] == 0 and evaluated["eval/reward"] == 1.0
    assert 0 < evaluated["eval/bad_rewards"] < 32


def test_bad_rewards_drop_their_group_grpo(tmp_path, toy):
    """GRPO's groups of 4: a group with a bad reward is left out whole; a faulty function beside a good one."""
    run_here(
        "grpo_humanline.py",
        [
            *ONLINE["grpo_humanline.py"],
            "--max_steps",
            "2",
            "--save_every",
            "0",
            "--sample_every",
            "16",
            "--reward_funcs",
            "toy_verify,tests.support.faulty_rewards:flaky",
        ],
        tmp_path,
    )
    r = rounds(str(tmp_path))[0]
    assert (
        r["online/bad_rewards"] > 0 and 2 <= r["online/groups"] < 32
    )  # 32 prompts sampled, groups with a bad reward dropped
    assert all(math.isfinite(s["loss"]) for s in steps(str(tmp_path)).values())


def test_on_bad_reward_stop_names_the_prompt(tmp_path, toy):
    with pytest.raises(SystemExit) as e:
        run_here(
            "kto_humanline.py",
            [
                *ONLINE["kto_humanline.py"],
                "--max_steps",
                "2",
                "--on_bad_reward",
                "stop",
                "--reward_model",
                "tests.support.faulty_rewards:flaky",
                "--eval_prompts",
                "none",
            ],
            tmp_path,
        )
    assert re.fullmatch(
        r"stopping: the reward tests.support.faulty_rewards:flaky of prompt '\d+\+\d+=' "
        r"(is (nan|inf|None)|raised ValueError: cannot score .*) "
        r"\(\d+ bad rewards in this batch\); --on_bad_reward drop would leave such samples out",
        str(e.value),
    ), str(e.value)
    assert not steps(str(tmp_path))  # stopped in the first round, before any update


# ----------------------------------------------------------------------------------------------
# Non-finite loss or gradient: the step is skipped; too many in a row stop the run
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_non_finite_gradient_skips_the_step(script, toy):
    m = MODULES[script]
    policy = AutoModelForCausalLM.from_pretrained(toy.model)
    ref = AutoModelForCausalLM.from_pretrained(toy.model).requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    ids = torch.tensor([[3, 4, 13, 5, 14]])
    policy(input_ids=ids).logits.pow(2).mean().backward()
    m.optimizer_step(
        policy, m.ReferenceModel(ref, None), opt, sched, 1.0, "humanline", 1, 0
    )  # a good step: optimizer state exists
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    opt_before = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state.items()}
    for skip, poison in ((False, math.nan), (False, math.inf), (True, 1.0)):
        (policy(input_ids=ids).logits.pow(2).mean() * poison).backward()
        norm = m.optimizer_step(policy, m.ReferenceModel(ref, None), opt, sched, 1.0, "humanline", 1, 1, skip=skip)
        assert skip or not torch.isfinite(norm)
        assert all(p.grad is None for p in policy.parameters())  # dropped
        assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())  # no update
        # synced all the same (the reference's schedule depends on the step alone, as reference-free runs need)
        assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items())
        assert all(torch.equal(t, opt_before[k][n]) for k, s in opt.state.items() for n, t in s.items())
        assert sched.last_epoch == 1  # no scheduler step


def test_a_nan_loss_in_dpo_skips_its_step_and_the_run_goes_on(tmp_path, toy, monkeypatch):
    """A non-finite loss at step 2 of 4 (its first micro-batch's, made NaN where the loop sums it): the step is
    skipped (no update: the learning rate holds; no checkpoint), and the run is not stopped as by a SIGTERM."""
    accumulate, calls = plumbing.accumulate, []

    def poisoned(sums, metrics):  # two micro-batches a step: the third call is step 2's first
        calls.append(len(calls) + 1)
        accumulate(sums, metrics | {"loss": metrics["loss"] * math.nan} if len(calls) == 3 else metrics)

    monkeypatch.setattr(plumbing, "accumulate", poisoned)
    try:
        run_here("dpo_humanline.py", ["--max_steps", "4", "--save_every", "1"], tmp_path)
        outcome = "finished"
    except (Exception, SystemExit) as e:  # a run that stopped at the bad step instead of skipping it
        outcome = f"stopped: {e!r}"
    logged = steps(str(tmp_path))
    assert outcome == "finished" and len(calls) == 8
    assert [(s, r["bad_steps"], math.isfinite(r["loss"])) for s, r in logged.items()] == [
        (1, 0, True),
        (2, 1, False),
        (3, 1, True),
        (4, 1, True),
    ]
    assert logged[3]["lr"] == logged[2]["lr"] != logged[4]["lr"]  # no scheduler step at the skipped step
    assert checkpoints(str(tmp_path)) == ["checkpoint-1", "checkpoint-3", "checkpoint-4"]


def test_too_many_bad_steps_stop_the_run_with_the_last_good_checkpoint_intact(tmp_path, toy):
    """A learning rate of 1e30: the first update sends the weights to ~1e30, every later gradient is NaN."""
    with pytest.raises(SystemExit) as e:
        run_here("dpo_humanline.py", ["--max_steps", "10", "--save_every", "1", "--learning_rate", "1e30"], tmp_path)
    assert "the last 3 steps (up to step 4) had a non-finite loss or gradient" in str(e.value)
    assert f"{tmp_path}/checkpoint-1, is from before them" in str(e.value)
    logged = steps(str(tmp_path))
    assert [(s, r["bad_steps"]) for s, r in logged.items()] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert all(not math.isfinite(logged[s]["grad_norm"]) for s in (2, 3, 4))
    assert [r["lr"] for r in logged.values()][1:] == [logged[2]["lr"]] * 3  # no scheduler step while skipping
    assert checkpoints(str(tmp_path)) == ["checkpoint-1"]  # no checkpoint of a skipped step
    assert_loadable(str(tmp_path / "checkpoint-1"))


# ----------------------------------------------------------------------------------------------
# Crashes: SIGTERM checkpoints and exits cleanly, SIGKILL never breaks a checkpoint, --resume is exact
# ----------------------------------------------------------------------------------------------

# offline humanline with a reference model synced every 2 steps (it must be restored too); --max_length 40 cuts
# most toy completions (truncation is counted and reported)
LONG = ["--humanline", "--sync_every", "2", "--max_steps", "12", "--max_length", "40", "--max_prompt_length", "20"]


@pytest.fixture(scope="module")
def uninterrupted(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    return str(out), run_here("dpo_humanline.py", [*LONG, "--save_every", "0"], out)


def test_truncation_is_counted_and_reported(uninterrupted, tok):
    m = MODULES["dpo_humanline.py"]
    args = m.Args(max_length=40, max_prompt_length=20)
    with open(toy_task.load().offline["strong"]) as f:
        _, counts = data_formats.encode_rows([json.loads(line) for line in f], tok, args, "toy")
    assert counts["completions"] > 0
    assert f": {counts} (cut to --max_prompt_length, --max_length" in uninterrupted[1]


@pytest.mark.slow
def test_ctrl_c_stops_like_sigterm_and_a_second_one_stops_at_once(tmp_path, toy):
    out = tmp_path / "run"
    started = Started("dpo_humanline.py", ["--max_steps", "400", "--save_every", "0"], out)
    started.wait_for(lambda: len(steps(str(out))) >= 2)
    os.kill(started.proc.pid, signal.SIGINT)  # what Ctrl-C sends
    assert started.wait() == 0 and "Traceback" not in started.output, started.output[-3000:]
    last = max(steps(str(out)))
    assert f"SIGINT: stopped after step {last} with a checkpoint" in started.output
    assert checkpoints(str(out)) == [f"checkpoint-{last}"]
    # a second Ctrl-C while the first waits for the step to end stops at once (called here directly: two signals sent
    # back to back reach a process as one)
    session = SimpleNamespace(stop=[], rt=SimpleNamespace(rank=1))
    plumbing.Session.interrupt(session, signal.SIGINT, None)
    with pytest.raises(SystemExit) as stopped:
        plumbing.Session.interrupt(session, signal.SIGINT, None)
    assert stopped.value.code == "interrupted twice: stopped without a checkpoint" and session.stop == [signal.SIGINT]


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_cleanly_then_resume_is_exact(uninterrupted, tmp_path):
    out = tmp_path / "run"
    started = Started("dpo_humanline.py", [*LONG, "--save_every", "5"], out)
    started.wait_for(lambda: len(steps(str(out))) >= 2)
    os.kill(started.proc.pid, signal.SIGTERM)
    assert started.wait() == 0, started.output[-3000:]
    last = max(steps(str(out)))
    assert 2 <= last < 12 and f"SIGTERM: stopped after step {last} with a checkpoint" in started.output
    assert checkpoints(str(out))[-1] == f"checkpoint-{last}"
    assert_loadable(str(out / f"checkpoint-{last}"))
    assert not os.path.exists(out / "model.safetensors")  # not finished: no final model
    printed = run_here("dpo_humanline.py", [*LONG, "--save_every", "5", "--resume"], out)
    assert f"resumed from {out}/checkpoint-{last} at step {last}" in printed
    same_runs(uninterrupted[0], str(out))
    same_models(uninterrupted[0], str(out))


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_complete_checkpoints_and_resume_is_exact(uninterrupted, tmp_path):
    out, rng = tmp_path / "run", random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    # 1. killed while a checkpoint is being written (its temporary directory exists)
    started = Started("dpo_humanline.py", [*LONG, "--save_every", "1"], out)
    started.wait_for(
        lambda: any(d.endswith(".tmp") for d in checkpoints(str(out))) and len(steps(str(out))) >= 2, poll=0.001
    )
    time.sleep(rng.uniform(0, 0.03))
    started.kill()
    started.wait()
    # 2. resumed, then killed at a random moment
    started = Started("dpo_humanline.py", [*LONG, "--save_every", "1", "--resume"], out)
    started.wait_for(lambda: "resumed from" in started.output)
    time.sleep(rng.uniform(0, 1.5))
    started.kill()
    started.wait()
    complete = [d for d in checkpoints(str(out)) if not d.endswith(".tmp")]
    assert complete, f"seed {seed}"
    for d in complete:
        assert_loadable(str(out / d))
    # 3. resumed to the end: the newest complete checkpoint, stale temporary directories removed
    assert f"resumed from {out}/{complete[-1]}" in run_here(
        "dpo_humanline.py", [*LONG, "--save_every", "1", "--resume"], out
    ), seed
    assert not any(d.endswith(".tmp") for d in checkpoints(str(out)))
    same_runs(uninterrupted[0], str(out))
    same_models(uninterrupted[0], str(out))


@pytest.fixture(scope="module")
def online_run(toy, tmp_path_factory):
    """Online DPO with humanline syncing and --clip sampling, a checkpoint after every step (the default bounds
    reject almost nothing: the rejection's generator is checked by the test above)."""
    out = tmp_path_factory.mktemp("online") / "run"
    extra = [
        *ONLINE["dpo_humanline.py"],
        "--sync",
        "humanline",
        "--clip",
        "sampling",
        "--max_steps",
        "5",
        "--save_every",
        "1",
    ]
    run_here("dpo_humanline.py", extra, out)
    return str(out), extra


def mid_round(out, world=1):
    """A checkpoint taken in the middle of an online round: some of the round's pairs are still to train on."""
    for d in checkpoints(out):
        state = torch.load(os.path.join(out, d, "state-rank0.pt"), weights_only=True)
        state = state["state"]
        if state["round_start"] < state["step"] < state["round_start"] + len(state["round"]) // 8:
            return d, state["step"]
    raise AssertionError("no checkpoint in the middle of a round")


def test_online_resume_in_the_middle_of_a_round_is_exact(online_run, tmp_path):
    full, extra = online_run
    out = tmp_path / "run"
    shutil.copytree(full, out)
    d, step = mid_round(full)
    for later in checkpoints(full):
        if int(later.split("-")[1]) > step:
            shutil.rmtree(out / later)
    assert f"resumed from {out}/{d}" in run_here("dpo_humanline.py", [*extra, "--resume"], out)
    same_runs(full, str(out))
    same_models(full, str(out))


# --clip sampling with bounds that reject: the Beta draws come from a generator of their own, which resume restores
REJECTING = ["--sync", "humanline", "--clip", "sampling", "--log_eps_P", "-0.01", "--log_eps_R", "0.01"]
REJECTING += ["--learning_rate", "1e-3", "--max_steps", "4", "--save_every", "1"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_with_token_rejection_draws_what_the_uninterrupted_run_drew(script, tmp_path, toy):
    full, out = tmp_path / "full", tmp_path / "resumed"
    run_here(script, REJECTING, full)
    assert steps(str(full))[3]["humanline/clamped_frac"] > 0.05  # the draws decide for many tokens
    shutil.copytree(full, out)
    for d in ("checkpoint-3", "checkpoint-4"):
        shutil.rmtree(out / d)
    assert f"resumed from {out}/checkpoint-2" in run_here(script, [*REJECTING, "--resume"], out)
    same_runs(str(full), str(out), keys=("loss", "grad_norm", "lr", "humanline/clamped_frac"))
    same_models(str(full), str(out))


# ----------------------------------------------------------------------------------------------
# Two processes: SIGTERM through torchrun, exact resume, only rank 0 writes, a hung or dead process
# ----------------------------------------------------------------------------------------------

TWO = [*ONLINE["dpo_humanline.py"], "--humanline", "--max_steps", "6"]


@pytest.fixture(scope="module")
def two_processes(toy, tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "run"
    proc = run("dpo_humanline.py", [*TWO, "--save_every", "2"], out, nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # no library warning reaches the user: loading, sampling, training, checkpoints (one silenced by its message)
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
    return str(out)


def test_only_rank_0_writes(two_processes):
    out = two_processes
    assert [r["step"] for r in records(out) if "loss" in r] == list(
        range(1, 7)
    )  # one line per step, not one per process
    files = sorted(os.listdir(out))
    assert files.count("args.json") == 1 and files.count("metrics.jsonl") == 1 and files.count("model.safetensors") == 1
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    for d in checkpoints(out):  # each process writes its own training state, rank 0 everything else
        assert sorted(f for f in os.listdir(os.path.join(out, d)) if f.startswith("state")) == [
            "state-rank0.pt",
            "state-rank1.pt",
        ]
        assert_loadable(os.path.join(out, d), world=2)


@pytest.mark.slow
def test_sigterm_to_torchrun_checkpoints_every_process_and_resume_is_exact(two_processes, tmp_path):
    out = tmp_path / "run"
    started = Started("dpo_humanline.py", [*TWO, "--save_every", "0"], out, nproc=2)
    started.wait_for(lambda: len(steps(str(out))) >= 1)
    os.kill(started.proc.pid, signal.SIGTERM)  # torchrun passes it on to both processes
    started.wait()
    last = max(steps(str(out)))
    assert last < 6 and f"SIGTERM: stopped after step {last} with a checkpoint" in started.output, started.output[
        -3000:
    ]
    assert checkpoints(str(out)) == [f"checkpoint-{last}"]
    assert_loadable(str(out / f"checkpoint-{last}"), world=2)
    proc = run("dpo_humanline.py", [*TWO, "--save_every", "0", "--resume"], out, nproc=2)
    assert proc.returncode == 0 and f"at step {last}" in proc.stdout, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # resuming warns of nothing either
    same_runs(two_processes, str(out))
    same_models(two_processes, str(out))


def two_nodes(out0, out1, cwd0, cwd1, extra=()):
    """The same command from two torchrun launchers on localhost, a node each (--nnodes 2, --node_rank, the
    rendezvous address), each started in its own working directory. Returns both (returncode, output)."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launched = []
    for node, (out, cwd) in enumerate([(out0, cwd0), (out1, cwd1)]):
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
        launcher += ["--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port)]
        flags = [*TINY, "--max_steps", "2", "--eval_prompts", "none", "--dist_timeout", "60", *extra]
        os.makedirs(cwd, exist_ok=True)
        argv = [*launcher, os.path.join(ROOT, "dpo_humanline.py"), *flags, "--output_dir", str(out)]
        launched.append(
            subprocess.Popen(argv, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    return [(p.wait(timeout=240), without_exit_barrier(p.stdout.read())) for p in launched]


def without_exit_barrier(output):
    """The output less torchrun's own log of its exit barrier: when one node's launcher, which holds the rendezvous
    store, exits first, the other's logs a traceback and still exits 0 (pytorch/pytorch#69520, under load)."""
    return "".join(line for line in output.splitlines(True) if "elastic/agent/server/api.py" not in line)


@pytest.mark.slow
def test_two_nodes_sharing_the_output_folder_train_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    for rc, output in two_nodes(out, out, tmp_path / "node0", tmp_path / "node1", ["--save_every", "1"]):
        assert rc == 0 and "Traceback" not in output, output[-3000:]
    assert [r["step"] for r in records(str(out)) if "loss" in r] == [1, 2]
    assert checkpoints(str(out)) == ["checkpoint-1", "checkpoint-2"]
    assert_loadable(str(out / "checkpoint-2"), world=2)


@pytest.mark.slow
def test_a_node_that_does_not_see_the_output_folder_stops_every_process_with_one_line(tmp_path):
    """--output_dir run, relative, from two working directories: each node has a folder of its own, as with a
    node-local disk. Both stop at start-up with the line naming the folder: no hang, no checkpoint."""
    results = two_nodes("run", "run", tmp_path / "node0", tmp_path / "node1", ["--save_every", "1"])
    line = "1 of 2 processes do not see the file process 0 wrote in --output_dir run: on several nodes --output_dir "
    for rc, output in results:
        assert rc != 0 and line + "must be a folder every node sees\n" in output, output[-3000:]
        assert "Traceback" not in output.split(line)[0], output[-3000:]  # nothing of ours before it
    for node in ("node0", "node1"):
        folder = tmp_path / node / "run"
        assert not folder.exists() or os.listdir(folder) == [], os.listdir(folder)  # not a file written, not a probe


@pytest.mark.slow
def test_a_checkpoint_whose_states_a_process_does_not_see_is_never_made(tmp_path):
    """A node that saw the folder at start-up loses sight of it (here process 1 writes its training state to a
    folder of its own): every process stops with one line and the checkpoint stays a temporary folder, never a
    checkpoint without the other process's state."""
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    wrapper = tmp_path / "wrapper.py"  # the real script, with process 1's torch.save sent to another folder
    wrapper.write_text(
        f"import os, runpy, sys, torch\nsys.path.insert(0, {ROOT!r})\n"
        "real = torch.save\n"
        "def save(obj, path, *a, **k):\n"
        f"    path = str(path).replace({str(out)!r}, {str(elsewhere)!r})\n"
        "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "    return real(obj, path, *a, **k)\n"
        "if os.environ['RANK'] == '1':\n"
        "    torch.save = save\n"
        f"sys.argv[0] = {os.path.join(ROOT, 'dpo_humanline.py')!r}\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(wrapper)]
    flags = [*TINY, "--max_steps", "2", "--eval_prompts", "none", "--save_every", "1", "--output_dir", str(out)]
    proc = subprocess.run([*launcher, *flags], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    line = f"2 of 2 processes do not see the training states of checkpoint {out}/checkpoint-1.tmp: on several nodes "
    assert proc.returncode != 0 and line + "--output_dir must be a folder every node sees" in proc.stderr, proc.stderr
    assert checkpoints(str(out)) == ["checkpoint-1.tmp"] and sorted(steps(str(out))) == [1]  # stopped at its save


def children(pid):
    """The pids of a process's children (torchrun's workers), from /proc (Linux; elsewhere none are found)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc/self") else []):
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass  # a process that ended meanwhile
    return out


def rank_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return int(env[b"RANK"])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds torchrun's workers through /proc (Linux)")
def test_a_hung_then_dead_process_stops_the_run_within_the_timeout(tmp_path, toy):
    """Rank 1 is frozen (SIGSTOP): rank 0 fails its next collective after --dist_timeout instead of waiting
    forever; rank 1 is then killed (SIGKILL) and torchrun ends the run. The newest checkpoint stays loadable."""
    out = tmp_path / "run"
    started = Started(
        "dpo_humanline.py", ["--max_steps", "500", "--save_every", "2", "--dist_timeout", "3"], out, nproc=2
    )
    started.wait_for(lambda: len(steps(str(out))) >= 3)
    workers = {rank_of(p): p for p in children(started.proc.pid)}
    os.kill(workers[1], signal.SIGSTOP)
    t0 = time.time()
    while os.path.exists(f"/proc/{workers[0]}") and time.time() - t0 < 60:
        with open(f"/proc/{workers[0]}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.1)
    waited = time.time() - t0
    os.kill(workers[1], signal.SIGKILL)
    rc = started.wait(60)
    assert rc != 0 and 2 < waited < 40, (rc, waited, started.output[-3000:])
    assert "Timed out" in started.output or "timed out" in started.output, started.output[-3000:]
    complete = [d for d in checkpoints(str(out)) if not d.endswith(".tmp")]
    assert_loadable(str(out / complete[-1]), world=2)


# ----------------------------------------------------------------------------------------------
# Safety: no remote code unless asked, no unpickling of training state or data
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_remote_code_is_off_unless_the_flag_is_given(script):
    assert MODULES[script].Args().trust_remote_code is False
    tree = ast.parse("".join(open(os.path.join(ROOT, f)).read() for f in (script, "plumbing.py", "data_formats.py")))
    calls = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "from_pretrained"
    ]
    assert len(calls) >= 1  # every model and tokenizer loads through one helper
    for call in calls:
        kw = {k.arg: ast.unparse(k.value) for k in call.keywords}
        assert kw.get("trust_remote_code") == "args.trust_remote_code", ast.unparse(call)


@pytest.mark.parametrize("script", SCRIPTS)
def test_training_state_is_loaded_with_weights_only_and_nothing_is_unpickled(script):
    tree = ast.parse("".join(open(os.path.join(ROOT, f)).read() for f in (script, "plumbing.py", "data_formats.py")))
    calls = {ast.unparse(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    loads = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.load"]
    assert loads and all(
        any(k.arg == "weights_only" and ast.unparse(k.value) == "True" for k in n.keywords) for n in loads
    )
    unsafe = {"pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}
    imported = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
    }
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & unsafe
    assert not [f for f in calls if f in ("eval", "exec", "np.load", "numpy.load") or f.endswith("read_pickle")]


class Payload:
    """Unpickling this object creates a file: proof that code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_checkpoint_holding_a_pickled_object_is_refused(script, tmp_path, toy):
    m = MODULES[script]
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "world_size": 1, "extra": Payload(str(marker))}, ckpt / "state-rank0.pt")
    policy = AutoModelForCausalLM.from_pretrained(toy.model)
    opt = torch.optim.AdamW(policy.parameters())
    with pytest.raises(pickle.UnpicklingError):
        make_session(
            m, tmp_path, policy, None, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), None, resume=True
        )
    assert not marker.exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_keeps_the_metrics_up_to_its_step_and_drops_a_line_cut_short(script, tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    with open(path, "w") as f:
        f.write('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n{"step": 3, "loss": 0.4}\n{"step": 4, "lo')
    with plumbing.open_metrics(path, 2) as f:  # resumed from checkpoint-2
        f.write('{"step": 3, "loss": 0.3}\n')
    assert [(r["step"], r["loss"]) for r in records(str(tmp_path))] == [(1, 1.0), (2, 0.5), (3, 0.3)]
    with plumbing.open_metrics(path, 0):  # a new run starts afresh
        pass
    assert records(str(tmp_path)) == [] and os.listdir(tmp_path) == ["metrics.jsonl"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_seed_has_its_own_random_streams(script):
    """Data order, prompt order, sampling and shuffling draw from numpy SeedSequence(seed) children: seed 1 replays
    none of seed 0's streams (with seed + epoch it replayed them one epoch later)."""
    m = MODULES[script]
    seeds = {
        (seed, stream, i): plumbing.stream_seed(seed, stream, i)
        for seed in range(4)
        for stream in plumbing.STREAMS
        for i in range(4)
    }
    assert len(set(seeds.values())) == len(seeds)  # all distinct
    examples = list(range(64))
    for epoch in range(3):  # seed 1's epoch e is none of seed 0's epochs
        assert all(
            m.offline_batch(examples, 8 * epoch, 64, 1) != m.offline_batch(examples, 8 * e, 64, 0) for e in range(4)
        )
    assert plumbing.round_prompts(64, 64, 0, 1) != plumbing.round_prompts(64, 64, 1, 0)
    import numpy as np  # the documented recipe: child `stream` of SeedSequence(seed), its grandchild `index`

    child = np.random.SeedSequence(3).spawn(len(plumbing.STREAMS))[plumbing.STREAMS.index("sampling")]
    assert plumbing.stream_seed(3, "sampling", 2) == int(child.spawn(3)[2].generate_state(1)[0])


def test_args_json_records_the_code_that_ran(tmp_path, toy):
    import hashlib

    import transformers

    run_here("dpo_humanline.py", ["--max_steps", "1", "--save_every", "0"], tmp_path)
    record = json.load(open(tmp_path / "args.json"))["provenance"]
    # the code is every Python file of the repository's top folder: the scripts and every module they import
    files = sorted(f for f in os.listdir(ROOT) if f.endswith(".py")) + ["toy/SHA256SUMS"]
    assert {"dpo_humanline.py", "plumbing.py", "ref_free.py", "humanline_sampling.py", "toy_task.py"} <= set(files)
    digest = hashlib.sha256(b"".join(open(os.path.join(ROOT, f), "rb").read() for f in files)).hexdigest()[:16]
    assert (
        record["code"] == digest
        and record["torch"] == torch.__version__
        and record["transformers"] == transformers.__version__
    )
    import importlib.metadata

    for name in ("datasets", "numpy", "scipy", "peft"):  # each library that decides a step, as installed
        assert record[name] == importlib.metadata.version(name)
    git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    if git("rev-parse", "HEAD"):  # a git checkout (not an unpacked archive)
        assert record["commit"] == git("rev-parse", "HEAD") and record["dirty"] == bool(
            git("status", "--porcelain", "--", *files)
        )


PAIRS_ONLINE = {  # online training from (best, worst) pairs of each round's samples
    "dpo_humanline.py": ONLINE["dpo_humanline.py"],
    "kto_humanline.py": ONLINE["kto_humanline.py"],
    "grpo_humanline.py": ["--online", "--pairs_from_samples", "--round_size", "32", "--num_generations", "4"],
}


def faulty_reward(script, name):  # the flags that make tests/support/faulty_rewards.py's `name` the run's reward
    return ["--reward_funcs" if script.startswith("grpo") else "--reward_model", f"tests.support.faulty_rewards:{name}"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_round_that_keeps_too_few_pairs_is_followed_by_the_next_one(script, tmp_path, toy):
    """A policy that passes (or fails) most prompts keeps few pairs: such a round no longer stops the run (a real
    model's online DPO did at its 8th round), the next round is sampled and training goes on."""
    import tests.support.faulty_rewards as faulty

    faulty.ties_at_first.calls = 0
    flags = [*PAIRS_ONLINE[script], "--max_steps", "2", "--save_every", "0", "--eval_prompts", "none"]
    run_here(script, flags + faulty_reward(script, "ties_at_first"), tmp_path)
    sampled = [r for r in records(str(tmp_path)) if "online/round" in r and "online/seconds" in r]
    assert sampled[0]["step"] == 0 and sampled[0].get("online/pairs", sampled[0].get("online/groups")) == 0
    assert sampled[1]["step"] == 0 and len(steps(str(tmp_path))) == 2


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_short_rounds_pairs_join_the_next_rounds(script, tmp_path, toy):
    """No step follows a round too short for a batch, so its pairs are still the policy's own: they join the next
    round's instead of being thrown away (SmolLM2's online DPO threw away 135 pairs in 67 short rounds of 87). Two
    rounds, each short of a batch of 8 pairs (KTO: 8 examples; GRPO: 8 sequences), make one together: the first step
    follows the second round, not a third."""
    import tests.support.faulty_rewards as faulty

    keep = [3, 6] if script.startswith("dpo") else [1, 3]  # pairs: 3 and 6 of 8; 2 and 6 of 8 examples (sequences)
    faulty.few_pairs_at_first.calls, faulty.few_pairs_at_first.keep = 0, keep
    flags = [*PAIRS_ONLINE[script], "--max_steps", "1", "--save_every", "0", "--eval_prompts", "none"]
    run_here(script, flags + faulty_reward(script, "few_pairs_at_first"), tmp_path)
    sampled = [r for r in records(str(tmp_path)) if "online/round" in r and "online/seconds" in r]
    assert [r.get("online/pairs", r.get("online/groups")) for r in sampled] == keep
    assert all(r["step"] == 0 for r in sampled) and len(steps(str(tmp_path))) == 1


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_whole_pass_of_prompts_without_a_batch_of_pairs_ends_the_run_saved_in_one_line(script, tmp_path, toy):
    prompts = tmp_path / "prompts.jsonl"
    with open(toy.prompts_train) as f:
        prompts.write_text("".join(f.readlines()[:64]))
    flags = [*PAIRS_ONLINE[script], "--dataset", str(prompts), "--max_steps", "2", "--num_eval_prompts", "8"]
    flags += faulty_reward(script, "ties")
    proc = run(script, flags, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(  # after the progress bar, when it shares the line
            "training ends at step 0 of 2: 2 rounds in a row (a whole pass over the prompts) gave less than a batch: "
            "each prompt's samples scored alike, the policy has converged on them"
        )
    ), proc.stderr[-2000:]
    # the run ended as at --max_steps: evaluated, its last record saying so, and the model saved in --output_dir
    last = records(str(tmp_path / "run"))[-1]
    assert last["step"] == 0 and last["ended_early"] == 1 and "eval/reward" in last
    assert os.path.exists(tmp_path / "run" / "config.json") and os.path.isdir(tmp_path / "run" / "checkpoint-0")


def few_prompts(toy, tmp_path, n=64):  # a pass of 64 prompts: two rounds of 32
    prompts = tmp_path / "prompts.jsonl"
    with open(toy.prompts_train) as f:
        prompts.write_text("".join(f.readlines()[:n]))
    return ["--dataset", str(prompts), "--eval_prompts", "none"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_short_rounds_that_are_not_in_a_row_do_not_end_the_run(script, tmp_path, toy):
    """Rounds 1, 3, ... keep no pair, 2, 4, ... do: a pass is two rounds of 16 prompts, and every pass holds a short
    round, but never two in a row: the run trains to its last step."""
    flags = [*PAIRS_ONLINE[script], *few_prompts(toy, tmp_path, 32), "--round_size", "16", "--max_steps", "5"]
    proc = run(script, flags + faulty_reward(script, "ties_every_other"), tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = records(str(tmp_path / "run"))
    assert [r["online/round"] for r in written if "online/seconds" in r][:3] == [1, 2, 3]  # the third: short again
    assert [r["step"] for r in written if "loss" in r] == [1, 2, 3, 4, 5]
    assert not any("ended_early" in r for r in written)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_pass_of_rounds_whose_rewards_failed_stops_the_run_naming_the_reward(script, tmp_path, toy):
    """All but one of each prompt's 4 rewards fail: no prompt keeps two, no batch can form in a whole pass. That is a
    broken reward, not a converged policy: the run stops (exit 1) in one line naming it and how many samples failed,
    and saves nothing a runner would take for a trained model."""
    reward = "tests.support.faulty_rewards:fails_all_but_one"
    online = ONLINE[script] if script.startswith("grpo") else PAIRS_ONLINE[script]
    flags = [*online, *few_prompts(toy, tmp_path, 16 if script.startswith("grpo") else 64), "--max_steps", "2"]
    flags += faulty_reward(script, "fails_all_but_one")
    proc = run(script, flags, tmp_path / "run")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("stopping: ") and "a whole pass over the prompts" in last, last
    assert f"rewards failed on {'48 of 64' if script.startswith('grpo') else '192 of 256'} samples" in last, last
    assert f"the first: reward {reward} of prompt '" in last and last.endswith("is None")
    assert not os.path.exists(tmp_path / "run" / "config.json") and "--round_size" not in last


def test_on_policy_grpo_trains_on_the_samples_whose_reward_scored(tmp_path, toy):
    """One reward of each group of 4 fails: the other 3 make the group (its advantages among them), as TRL trains on
    the samples that scored."""
    scorer = ["--reward_funcs", "tests.support.faulty_rewards:fails_once_per_prompt"]
    proc = run(
        "grpo_humanline.py",
        [*ONLINE["grpo_humanline.py"], "--max_steps", "3", "--eval_prompts", "none", *scorer],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = records(str(tmp_path))
    rounds = [r for r in written if "online/seconds" in r]
    assert all(r["online/bad_rewards"] == 2 and r["online/groups"] == 2 for r in rounds)  # 2 prompts of 4 samples
    assert [r["step"] for r in written if "loss" in r] == [1, 2, 3]


def test_a_resumed_online_run_writes_each_record_once_and_keeps_each_attempts_code(tmp_path, toy):
    """Rounds sampled after the checkpoint a run resumes from are sampled again: their records are written once, as
    an uninterrupted run writes them; args.json keeps the code of each attempt and the step it started from."""
    flags = [*ONLINE["dpo_humanline.py"], "--max_steps", "6", "--save_every", "2", "--eval_prompts", "none"]
    full = tmp_path / "full"
    assert run("dpo_humanline.py", flags, full).returncode == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    for step in (4, 6):
        shutil.rmtree(resumed / f"checkpoint-{step}")
    assert run("dpo_humanline.py", [*flags, "--resume"], resumed).returncode == 0
    key = lambda r: (r["step"], r.get("online/round"), "loss" in r)  # noqa: E731
    assert [key(r) for r in records(str(resumed))] == [key(r) for r in records(str(full))]
    assert len({key(r) for r in records(str(resumed))}) == len(records(str(resumed)))  # each once
    attempts = json.load(open(resumed / "args.json"))["attempts"]
    assert [a["from_step"] for a in attempts] == [0, 2] and all(len(a["code"]) == 16 for a in attempts)


def test_a_run_killed_while_linking_its_final_model_resumes(tmp_path, toy):
    """The final model is the last checkpoint's files linked into --output_dir, each through a `.tmp` name. A run
    killed there leaves those names, hard links to the checkpoint's own files; resuming it finishes the export."""
    flags = [*runs.short(2), "--save_every", "1"]
    run_here("dpo_humanline.py", flags, tmp_path)
    last = tmp_path / "checkpoint-2"
    linked = [f for f in os.listdir(last) if not f.startswith("state-rank")]
    for f in linked:  # as the kill left them: the checkpoint's file under the .tmp name, the final file not yet there
        os.remove(tmp_path / f)
        os.link(last / f, tmp_path / (f + ".tmp"))
    run_here("dpo_humanline.py", [*flags, "--resume"], tmp_path)
    assert all(open(tmp_path / f, "rb").read() == open(last / f, "rb").read() for f in linked)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
