"""A real model's first run: what it meets at start-up and in its first steps.

- A model other than the toy's does not evaluate or train on the toy task by default: one line names the flag;
  an unset --micro_batch_size is 4 sequences (pairs) a forward for it, the whole per-process share for the toy.
- On a GPU, a plan above the device's memory stops the run with the plan's table and the flags that lower it
  (--ignore_memory_plan starts anyway); --plan_only plans the GPU run (bf16 unless --precision says otherwise).
- A checkpoint's size is printed with the plan, and the newest 2 are kept by default.
- Autocast is off after a bf16 step in every reference mode; at step 0 the policy's training forward and the
  reference's eval forward give the same log-probs (the same check runs on a GPU in test_cuda.py).
- KTO's KL pairs go through the policy without gradients.
- Prompts sampled online keep their last tokens; a system prompt reaches what is sampled, trained on and evaluated;
  the bf16 head computes in bf16 on one process; an online round resets a two-model reference to the policy.
"""

import contextlib
import io
import math
import os
import sys
from types import SimpleNamespace
from unittest import mock

import gpu_path_helper
import pytest
import runs
import torch
from paths import ROOT
from test_formats import llama, local_config, parsed, train, write  # noqa: F401 (llama: a fixture, by name below)
from transformers import AutoConfig

import data_formats
import dpo_humanline
import math_rewards
import memory_plan
import plumbing

GIB = 2**30


@pytest.fixture
def model_dir(request):
    """test_formats.py's tiny chat Llama (its own tokenizer, not the toy's): a model other than the toy's."""
    return request.getfixturevalue("llama")


def stop(algo, argv, **kw):
    with pytest.raises(SystemExit) as stopped:
        parsed(algo, argv, **kw)
    assert isinstance(stopped.value.code, str) and "\n" not in stopped.value.code, stopped.value.code
    return stopped.value.code


# ---- defaults that fit a real model --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algo, flags, flag",
    [
        ("dpo", [], "--eval_prompts toy (the toy task's)"),
        ("dpo", ["--eval_prompts", "toy:valid"], "--eval_prompts toy:valid (the toy task's)"),
        ("kto", ["--eval_prompts", "PROMPTS"], "--reward_model toy (the toy task's)"),
        ("dpo", ["--eval_prompts", "none", "--online"], "--reward_model toy (the toy task's)"),
        ("grpo", ["--eval_prompts", "none", "--online"], "--reward_funcs toy_verify (the toy task's)"),
        ("grpo", ["--eval_prompts", "none", "--online", "--reward_funcs", "format,toy"], "--reward_funcs format,toy"),
    ],
)
def test_a_model_other_than_the_toys_stops_on_the_toy_tasks_defaults(algo, flags, flag, model_dir, tmp_path):
    prompts = write(tmp_path / "prompts.jsonl", [{"prompt": "Q?"}])
    flags = [prompts if f == "PROMPTS" else f for f in flags]
    message = stop(algo, ["--model_name_or_path", model_dir, "--dataset", "me/data", *flags])
    assert message.startswith(flag) and f"with --model_name_or_path {model_dir}: give your own" in message


@pytest.mark.parametrize("algo", ["dpo", "kto", "grpo"])
def test_a_model_other_than_the_toys_does_not_train_on_the_toys_data_unless_given_its_own(algo, model_dir):
    mine = ["--model_name_or_path", model_dir, "--eval_prompts", "none"]
    bring = f"(the toy task's) with --model_name_or_path {model_dir}: give your own data to train on"
    assert stop(algo, mine) == f"--dataset toy {bring}"  # --dataset unset: the toy's pairs, never silently
    assert stop(algo, [*mine, "--dataset", "toy:weak"]) == f"--dataset toy:weak {bring}"
    assert parsed(algo, [*mine, "--dataset", "me/data"]).dataset == "me/data"


def test_the_toy_task_with_the_toy_or_a_copy_of_it_and_a_real_model_with_its_own_scorer_start(model_dir, tmp_path, toy):
    copy = tmp_path / "toy-copy"  # an instance of the toy task (experiments/run.py trains such copies)
    AutoConfig.from_pretrained(os.path.join(ROOT, "toy", "model")).save_pretrained(copy)
    assert parsed("dpo", ["--online"]).reward_model == "toy"
    assert parsed("dpo", ["--model_name_or_path", str(copy), "--online"]).online
    mine = ["--eval_prompts", "none", "--online", "--reward_model", "my_rewards:score", "--dataset", "me/prompts"]
    assert parsed("dpo", ["--model_name_or_path", model_dir, *mine]).online


def test_an_unset_micro_batch_is_4_for_another_model_and_the_whole_share_for_the_toy(model_dir):
    real = ["--model_name_or_path", model_dir, "--eval_prompts", "none", "--dataset", "me/data"]
    assert parsed("dpo", []).micro_batch_size == 32  # the toy: one forward per step, as its figures were run
    assert parsed("dpo", [], world=2).micro_batch_size == 16
    assert parsed("dpo", real).micro_batch_size == 4
    assert parsed("kto", real, world=8).micro_batch_size == 4  # 64 / 8 = 8 per process: 4 divides it
    assert parsed("dpo", real, world=16).micro_batch_size == 2  # 2 per process
    assert parsed("dpo", [*real, "--batch_size", "30"], world=2).micro_batch_size == 3  # 15 per process: 3 divides
    assert parsed("dpo", [*real, "--micro_batch_size", "8"]).micro_batch_size == 8


def test_the_readmes_own_model_command_plans_a_few_sequences_a_forward_not_the_whole_batch():
    """The README's "your own model" DPO command on a 1.5B config and one GPU: 232 GiB at the peak when an unset
    micro-batch was the whole batch (203 GiB of it activations), 54 GiB with 4 pairs a forward."""
    printed = io.StringIO()
    flags = ["--model_name_or_path", "Qwen/Qwen2.5-1.5B-Instruct", "--eval_prompts", "none", "--humanline"]
    flags += ["--dataset", "me/data"]
    flags += ["--precision", "bf16"]  # as on the GPU
    args = parsed("dpo", flags, printed=printed)
    assert args.micro_batch_size == 4 and "micro-batches of 4" in printed.getvalue()
    with mock.patch.object(memory_plan, "read_config", local_config):
        now = memory_plan.peak(memory_plan.plan(args, "dpo", 1))
        args.micro_batch_size = 32
        before = memory_plan.peak(memory_plan.plan(args, "dpo", 1))
    assert (round(before / GIB, 1), round(now / GIB, 1)) == (232.0, 54.0)


# ---- the plan on a GPU ---------------------------------------------------------------------------------------

OFF_POLICY_8B = (  # the example: 188.9 GiB per process, 160 of it the KV cache of 512 sequences at once
    "--online --sample_every 64 --humanline --sync_every 16 --max_new_tokens 2048 --max_length 2560 "
    "--micro_batch_size 8 --gradient_checkpointing --precision bf16 --eval_prompts none --reward_funcs accuracy "
    "--model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct --dataset simplescaling/openaimath"
).split()


@contextlib.contextmanager
def gpu(gib):
    props = SimpleNamespace(total_memory=gib * GIB)
    with (
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "get_device_properties", lambda *_: props),
    ):
        yield


def test_a_gpu_run_whose_plan_does_not_fit_stops_with_the_table_and_the_flags_that_lower_it():
    printed = io.StringIO()
    with gpu(80):
        message = stop("grpo", OFF_POLICY_8B, world=8, printed=printed)
    assert message.startswith("memory plan: 18") and "GiB per process at the peak, above this GPU's 80.0 GiB" in message
    assert "(most in generate): lower --generation_batch_size, --max_new_tokens, or add processes" in message
    assert "--ignore_memory_plan starts anyway" in message
    table = printed.getvalue()
    assert "memory plan per process (8 processes, bf16, micro-batches of 8)" in table and "KV cache" in table
    with gpu(80):
        assert parsed("grpo", [*OFF_POLICY_8B, "--ignore_memory_plan"], world=8).ignore_memory_plan
        assert parsed("grpo", [*OFF_POLICY_8B, "--generation_batch_size", "64"], world=8).precision == "bf16"
    with gpu(24):  # training's share is the largest there: the flags that lower it
        eight_b = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct", "--dataset", "me/data"]
        message = stop("dpo", [*eight_b, "--eval_prompts", "none"])
    assert "(most in train): lower --micro_batch_size, --max_length, --gradient_checkpointing" in message
    assert parsed("grpo", OFF_POLICY_8B, world=8).online  # no GPU: nothing to hold the plan against, no stop


def test_the_plan_is_held_against_the_devices_own_memory_with_loras_head_copy_counted():
    """Plans between a small device's size and 80 GiB stop on the small device; a plan above 80 GiB starts on a
    larger one. The one-GPU LoRA run at the default micro-batch of 4 plans above 24 GiB: the bf16 head's fp32 copy
    (128,256 x 4,096 x 4 B) and the adapters' fp32 activations are counted."""
    lora = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct", "--dataset", "me/data"]
    lora += ["--eval_prompts", "none", "--humanline", "--lora_r", "16", "--gradient_checkpointing"]
    with gpu(24):
        message = stop("dpo", lora)  # micro-batches of 4
        assert parsed("dpo", [*lora, "--micro_batch_size", "1"]).lora_r == 16  # the documented one-GPU run
    assert message.startswith("memory plan: 2") and "above this GPU's 24.0 GiB (most in train)" in message
    between = float(message.split()[2])
    assert 24 < between < 80
    with mock.patch.object(memory_plan, "read_config", local_config):
        args = parsed("dpo", [*lora, "--precision", "bf16"])  # as on the GPU
        copy = [r for r in memory_plan.plan(args, "dpo", 1) if "head's fp32 copy" in r[0]]
    assert copy == [("log-prob head: the bf16 head's fp32 copy", 128_256 * 4_096 * 4, "train")]
    large = [*OFF_POLICY_8B, "--generation_batch_size", "256"]
    with mock.patch.object(memory_plan, "read_config", local_config):
        above_80 = memory_plan.peak(memory_plan.plan(parsed("grpo", large, world=8), "grpo", 8)) / GIB
    assert 80 < above_80 < 141
    with gpu(141):  # an H200: the plan fits it
        assert parsed("grpo", large, world=8).online
    with gpu(80):
        assert stop("grpo", large, world=8).startswith(f"memory plan: {above_80:.1f} GiB")


@pytest.mark.parametrize(
    "algo, flags, message",
    [
        ("dpo", ["--num_samples", "4"], "--num_samples: online sampling's, idle offline (add --online)"),
        ("kto", ["--round_size", "64", "--reward_threshold", "0.1"], "--reward_threshold, --round_size: online"),
        ("dpo", ["--reward_model", "toy_verify", "--eval_prompts", "none"], "--reward_model acts only with"),
        ("grpo", ["--online", "--ref_free", "off"], "--ref_free: on-policy GRPO has no reference"),
    ],
    ids=["dpo-num-samples", "kto-round", "reward-model-scores-nothing", "grpo-on-policy-ref-free"],
)
def test_flags_that_would_start_and_do_nothing_stop_with_one_line(algo, flags, message):
    assert stop(algo, flags).startswith(message)


def test_the_same_flags_where_they_act_start():
    assert parsed("dpo", ["--online", "--num_samples", "4", "--round_size", "64"]).num_samples == 4
    assert parsed("kto", ["--online", "--reward_model", "toy_verify", "--eval_prompts", "none"]).online
    assert parsed("grpo", ["--reward_model", "toy_verify"]).reward_model == "toy_verify"  # it evaluates
    assert parsed("grpo", ["--online", "--humanline", "--ref_free", "off"]).ref_free == "off"  # synced: a reference
    assert parsed("grpo", ["--online", "--sample_every", "2", "--ref_free", "off"]).ref_free == "off"


@pytest.mark.parametrize("script", ["dpo_humanline.py", "kto_humanline.py", "grpo_humanline.py"])
def test_micro_batch_sizes_help_says_what_unset_gives_a_real_model(script):
    out = runs.help_text(script)
    text = " ".join(out.split("\n  --micro_batch_size", 1)[1].split("--gradient_checkpointing")[0].split())
    assert "unset: all (toy)," in text and (text.endswith("else 4. (default: None)") or "else up to 4." in text)


def plan_only(argv, world=1):
    printed = io.StringIO()
    with (
        mock.patch.object(sys, "argv", ["dpo_humanline.py", "--plan_only", *argv]),
        mock.patch.dict(os.environ, {"WORLD_SIZE": str(world)}),
        mock.patch.object(memory_plan, "read_config", local_config),
        contextlib.redirect_stdout(printed),
        pytest.raises(SystemExit) as done,
    ):
        dpo_humanline.main()
    assert done.value.code in (None, 0)
    return printed.getvalue().splitlines()


def test_plan_only_plans_the_gpu_run_in_bf16_and_says_so_with_a_checkpoints_size():
    flags = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct", "--micro_batch_size", "4"]
    flags += ["--gradient_checkpointing"]
    lines = plan_only(flags, world=8)  # the README's example, on a machine without a GPU
    assert lines[0].startswith("memory plan per process (8 processes, bf16, micro-batches of 4)")
    assert "31.3" in lines[-2] and "a checkpoint: 104.7 GiB on disk, 2 kept" in lines[-1]
    assert lines[-1].endswith("; saving each checkpoint takes 29.9 GiB of host memory on process 0")  # fp32, gathered
    # with adapters, the final merged model is what is gathered, in the bf16 base's dtype
    lora = plan_only([*flags, "--lora_r", "16", "--micro_batch_size", "1"])
    assert lora[-1].endswith("; saving the final merged model takes 15.0 GiB of host memory on process 0")
    fp32 = plan_only([*flags, "--precision", "fp32"], world=8)
    assert fp32[0].startswith("memory plan per process (8 processes, fp32") and "46.49" in fp32[-2]


def test_a_checkpoint_is_the_model_in_its_dtype_and_12_bytes_a_parameter_of_training_state():
    config = local_config("meta-llama/Meta-Llama-3-8B-Instruct", None)
    c = config
    params = c.vocab_size * c.hidden_size * 2 + c.num_hidden_layers * (
        2 * c.hidden_size * c.hidden_size  # q, o
        + 2 * c.hidden_size * (c.num_key_value_heads * c.hidden_size // c.num_attention_heads)  # k, v
        + 3 * c.hidden_size * c.intermediate_size
        + 2 * c.hidden_size
    )
    params += c.hidden_size  # the final norm
    full = SimpleNamespace(lora_r=0)
    assert memory_plan.checkpoint_bytes(config, full) == params * (2 + 12)  # bf16 model files; fp32 weights + AdamW
    real = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B-Instruct", "--eval_prompts", "none", "--dataset", "d"]
    assert (parsed("dpo", real).save_total_limit, parsed("dpo", []).save_total_limit) == (2, 0)  # the toy's: all


# ---- flags without effect ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--online", "--beta", "0.04"], "--beta: on-policy the KL is to the sampler, the policy itself, so 0"),
        (["--kl_baseline", "initial", "--beta", "0"], "--kl_baseline initial acts only with --beta above 0"),
    ],
)
def test_grpos_beta_without_a_kl_it_could_weigh_stops(flags, message):
    assert stop("grpo", flags).startswith(message)
    assert parsed("grpo", ["--online", "--beta", "0.04", "--kl_baseline", "initial"]).beta == 0.04
    assert parsed("grpo", ["--online", "--beta", "0.04", "--humanline"]).beta == 0.04  # synced: a real KL
    assert parsed("grpo", ["--online", "--beta", "0.04", "--sample_every", "4"]).beta == 0.04  # off-policy


@pytest.mark.parametrize("algo", ["dpo", "kto", "grpo"])
def test_sampling_flags_without_sampling_stop(algo):
    assert stop(algo, ["--sampling_c", "50"]) == "--sampling_c acts only with --clip sampling"
    assert stop(algo, ["--temperature", "0.9"]) == "--temperature and --top_p act only with --online"
    assert parsed(algo, ["--clip", "sampling", "--sampling_c", "50"]).sampling_c == 50


# ---- autocast, and the log-ratio at step 0 ------------------------------------------------------------------

AUTOCAST_RUNS = [
    ("dpo_humanline.py", ["--humanline", "--ref_free", "off"]),
    ("dpo_humanline.py", ["--humanline"]),
    ("kto_humanline.py", ["--online", "--humanline", "--round_size", "32", "--max_new_tokens", "8"]),
    ("grpo_humanline.py", ["--online", "--sync", "humanline", "--sample_every", "2", "--max_new_tokens", "8"]),
]


@pytest.mark.parametrize("script, flags", AUTOCAST_RUNS, ids=[f"{s} {' '.join(f)}" for s, f in AUTOCAST_RUNS])
def test_autocast_is_off_after_a_bf16_run_in_every_reference_mode(script, flags, tmp_path, toy):
    """Online GRPO under --sync computes a late snapshot's log-probs inside the step's own autocast: one autocast
    object entered inside itself would leave autocast on for the rest of the process."""
    records = train(script, [*flags, "--precision", "bf16", "--batch_size", "8", "--micro_batch_size", "4"], tmp_path)
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("reference_free", [True, False], ids=["reference-free", "two models"])
def test_at_step_0_the_training_forward_and_the_reference_agree_in_bf16(reference_free, toy):
    """The reference equals the policy at step 0: their log-probs, one from the training forward and one from the
    reference's eval forward, agree to 1e-4 (10 x below the signal at k = 1) in bf16 with the fp32 head."""
    assert gpu_path_helper.step0_log_ratio(reference_free) <= 1e-4


# ---- KTO's KL pairs ------------------------------------------------------------------------------------------


def test_ktos_kl_pairs_go_through_the_policy_without_gradients(tmp_path, toy):
    """Per micro-batch: the examples with gradients, their KL pairs (as many) without; never both in one forward."""
    forwards, build = [], plumbing.build_model

    def watched(*a, **kw):
        model = build(*a, **kw)
        if not forwards:  # the policy (built first)
            hook = lambda m, args, kwargs: forwards.append((kwargs["input_ids"].shape[0], torch.is_grad_enabled()))  # noqa: E731
            model.register_forward_pre_hook(hook, with_kwargs=True)
            forwards.append(None)
        return model

    with mock.patch.object(plumbing, "build_model", watched):
        train("kto_humanline.py", ["--humanline", "--ref_free", "off"], tmp_path)
    training = [f for f in forwards[1:] if f and f[0] == 2]  # micro-batches of 2 examples (and 2 KL pairs)
    assert training.count((2, True)) == 4 and training.count((2, False)) == 4  # 2 steps x 2 micro-batches
    assert all(n <= 2 for n, grad in forwards[1:] if grad)


# ---- four mistakes the suite once let pass --------------------------------------------------------------------


def test_a_long_prompt_sampled_online_keeps_its_last_tokens(toy):
    tokenizer = plumbing.load_tokenizer(dpo_humanline.Args())
    long = "123+456=" * 10 + "585+445="
    args = dpo_humanline.Args(max_prompt_length=8, max_new_tokens=4, eval_prompts="none")
    rt = SimpleNamespace(rank=0, world=1, autocast=lambda: torch.autocast("cpu", enabled=False))
    seen = []

    def generate(model, tok, prompts, n, *_):
        seen.extend(prompts)
        return [[1]] * (len(prompts) * n), [True] * (len(prompts) * n)

    with mock.patch.object(plumbing, "generate", generate):
        groups, _ = plumbing.sample_and_score(
            None,
            tokenizer,
            [("r", 1.0, lambda prompts, completions, **_: [0.0] * len(completions))],
            [{"prompt": long}],
            2,
            args,
            0,
            rt,
        )
    ids = data_formats.prompt_ids(tokenizer, long)
    assert len(ids) > 8 and seen == [ids[-8:]] and groups[0].prompt_ids == ids[-8:]
    assert tokenizer.decode(seen[0]).replace(" ", "").endswith("585+445=")


@pytest.mark.parametrize("system", ["Answer in one word, always.", "r1", "humanline_math"])
def test_a_system_prompt_reaches_what_is_sampled_trained_on_and_evaluated(model_dir, tmp_path, system):
    prompts = write(tmp_path / "prompts.jsonl", [{"prompt": "What is 2+2?", "solution": "4"}] * 4)
    args = dpo_humanline.Args(model_name_or_path=model_dir, dataset=prompts, eval_prompts=prompts, online=True)
    args.as_chat, args.system_prompt, args.max_new_tokens = True, system, 4
    tokenizer = plumbing.load_tokenizer(args)
    rt = SimpleNamespace(rank=0, world=1, autocast=lambda: torch.autocast("cpu", enabled=False))
    text = math_rewards.SYSTEM_PROMPTS.get(system, system)
    seen = []

    def generate(model, tok, prompt_ids, n, *_):
        seen.extend(tok.decode(p) for p in prompt_ids)
        return [[tok.eos_token_id]] * (len(prompt_ids) * n), [True] * (len(prompt_ids) * n)

    scorer = [("r", 1.0, lambda prompts, completions, **_: [0.0] * len(completions))]
    with mock.patch.object(plumbing, "generate", generate):
        for kind in ("prompts", "eval"):
            rows = data_formats.load_data(args, kind, tokenizer, rt)
            groups, _ = plumbing.sample_and_score(None, tokenizer, scorer, rows, 2, args, 0, rt)
            trained = [tokenizer.decode(g.prompt_ids) for g in groups]  # what the pairs are built on
            assert all(f"system<|end_header_id|>\n\n{text}<|eot_id|>" in t for t in trained), trained[0]
    assert len(seen) == 8 and all(f"system<|end_header_id|>\n\n{text}<|eot_id|>" in s for s in seen)


def test_the_bf16_head_computes_in_bf16_on_one_process(toy):
    args = dpo_humanline.Args(precision="bf16", fp32_head=False)
    rt = dpo_humanline.setup(args)
    assert rt.head_dtype == torch.bfloat16
    tokenizer = plumbing.load_tokenizer(args)
    model = dpo_humanline.load_model(args, rt)
    seqs = [(p, c) for p, (c, _), _ in data_formats.load_data(args, "preferences", tokenizer, rt)[:4]]
    ids, attention, mask = dpo_humanline.collate(seqs, tokenizer.pad_token_id, rt.device)
    with torch.no_grad():
        got = dpo_humanline.token_logps(model, ids, attention, mask, rt.head_dtype)
        fp32 = dpo_humanline.token_logps(model, ids, attention, mask, torch.float32)
        h = model(input_ids=ids, attention_mask=attention, output_hidden_states=True).hidden_states[-1][:, :-1]
        w = model.get_output_embeddings().weight
        logits = torch.nn.functional.linear(h.bfloat16(), w.bfloat16()).float()  # independently: the head in bf16
        want = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    where = mask[:, 1:].bool()
    assert torch.allclose(got[where], want[where], atol=1e-6)
    assert (got - fp32)[where].abs().max() > 1e-4  # bf16's rounding shows: the head did not run in fp32


@pytest.mark.parametrize("ref_free", ["off", "on"])
def test_each_online_round_starts_with_the_reference_equal_to_the_policy(ref_free, tmp_path, toy):
    """Algorithm 1: at a round's first step the reference is the policy, so every log-ratio is 0 and the DPO loss is
    exactly log 2; the steps after it train against that reference."""
    flags = ["--online", "--round_size", "16", "--num_samples", "4", "--max_new_tokens", "8", "--ref_free", ref_free]
    flags += ["--max_steps", "8", "--batch_size", "2", "--micro_batch_size", "2", "--reward_threshold", "0"]
    records = train("dpo_humanline.py", flags, tmp_path)
    rounds = [r["step"] for r in records if "online/round" in r]
    steps = {r["step"]: r for r in records if "loss" in r}
    assert len(rounds) >= 2, rounds
    for start in rounds:  # the round's first step is start + 1
        assert steps[start + 1]["loss"] == pytest.approx(math.log(2), abs=1e-6), (start, steps[start + 1])
        assert steps[start + 1]["rewards/margins"] == 0
    assert any(steps[s]["loss"] != pytest.approx(math.log(2), abs=1e-6) for s in steps if s - 1 not in rounds)
