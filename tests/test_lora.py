"""LoRA adapters (`--lora_r`) on the toy task: the adapters train alone, in fp32, on a base frozen in --precision; the
reference is never a second copy of the base (the base with its adapters disabled, or a second set of adapters that
a sync fills, or the reference-free path) and equals the two-model reference step by step; two processes (FSDP2)
train as one; checkpoints hold the adapters and resume exactly; the run ends with the merged model and the adapter
alone, each loaded by its own library; bad flags stop with one line."""

import copy
import json
import os
import shutil
import sys

import peft
import pytest
import runs
import torch
import warm
from paths import ROOT
from runs import ENV, records
from safetensors.torch import load_file
from test_performance import assert_same_training, steps
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

import dpo_humanline
import lora
import memory_plan
import plumbing

LORA = ["--lora_r", "8", "--learning_rate", "2e-4"]  # a rate at which the adapters move the log-probs
BASE = ["--batch_size", "8", "--micro_batch_size", "4", "--eval_prompts", "none", "--save_every", "0", *LORA]
ONLINE = ["--online", "--round_size", "32"]  # about 28 pairs a round: 3 steps of 8, then a new round


def lora_args(**kw):
    args = dpo_humanline.Args(lora_r=8, **kw)
    args.precision = args.precision or "fp32"
    return args, dpo_humanline.setup(args)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_adapters_start_at_the_base_and_train_alone_in_fp32_on_a_base_frozen_in_the_precision(precision, toy):
    args, rt = lora_args(precision=precision)
    policy = plumbing.build_model(args, rt)
    base = AutoModelForCausalLM.from_pretrained(toy.model, dtype=rt.dtype)
    trained = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {p.dtype for p in trained.values()} == {torch.float32}
    assert {p.dtype for p in policy.parameters() if not p.requires_grad} == {rt.dtype}
    assert all(torch.all(p == 0) for n, p in trained.items() if ".lora_B." in n)  # B = 0: the model unchanged
    ids = torch.tensor([[3, 5, 7, 9, 11, 13, 4, 6]])
    inputs = (ids, torch.ones_like(ids), torch.ones(ids.shape))
    with torch.no_grad(), rt.autocast():
        ours = dpo_humanline.token_logps(policy, *inputs, rt.head_dtype)
        theirs = dpo_humanline.token_logps(base, *inputs, rt.head_dtype)
    assert torch.equal(ours, theirs)
    assert sum(p.numel() for p in trained.values()) < 0.1 * sum(p.numel() for p in policy.parameters())


class TwoModels:
    """The textbook reference, with adapters: a second copy of the base and the adapters, synced by copying every
    weight. What the adapter reference and the reference-free path must equal."""

    def __init__(self, policy, token_logps, rt, frozen, temperature=1.0):
        self.model, self.token_logps, self.rt, self.seconds = copy.deepcopy(policy).eval(), token_logps, rt, 0.0
        self.temperature = temperature

    @torch.no_grad()
    def logps(self, step, micro, inputs):
        return self.token_logps(self.model, *inputs, self.rt.head_dtype, self.temperature)

    @torch.no_grad()
    def sync(self, policy, step):
        for r, p in zip(self.model.parameters(), policy.parameters()):
            r.copy_(p)

    reset = sync


@pytest.mark.parametrize(
    "flags",
    [
        ["--offline"],  # never synced: the adapter reference is the base with the adapters disabled
        ["--offline", "--humanline"],
        ["--offline", "--humanline", "--sync_every", "4"],
        [*ONLINE, "--humanline"],
        [*ONLINE, "--humanline", "--sync_every", "4"],
    ],
    ids=["offline", "offline-k1", "offline-k4", "online-k1", "online-k4"],
)
def test_the_adapter_reference_equals_the_reference_free_path_and_two_models_step_by_step(flags, tmp_path, monkeypatch):
    argv = [*BASE, *flags, "--max_steps", "7"]
    free, _, loads_free = runs.run_here("dpo_humanline.py", argv, tmp_path / "free")
    adapter, _, loads_adapter = runs.run_here("dpo_humanline.py", [*argv, "--ref_free", "off"], tmp_path / "adapter")
    monkeypatch.setattr(lora, "AdapterReference", TwoModels)
    two, _, _ = runs.run_here("dpo_humanline.py", [*argv, "--ref_free", "off"], tmp_path / "two")
    assert loads_free == loads_adapter == 1  # the base is read once: no second copy of it
    assert_same_training(two, adapter, 7)
    assert_same_training(two, free, 7)
    margins = [r["rewards/margins"] for r in steps(two)]
    assert max(map(abs, margins)) > 1e-3  # the policy moved away from its reference: the comparison can fail


def test_a_sync_copies_the_adapters_and_nothing_else(toy, monkeypatch):
    args, rt = lora_args()
    policy = plumbing.build_model(args, rt)
    reference = lora.AdapterReference(policy, dpo_humanline.token_logps, rt, frozen=False)
    copied, real = [], torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda t, src, *a, **k: copied.append(t) or real(t, src, *a, **k))
    reference.sync(policy, step=0)
    adapters = sum(p.numel() * 4 for n, p in policy.named_parameters() if "lora_" in n)
    assert sum(t.numel() * t.element_size() for t in copied) == adapters == 61_440 * 4  # r = 8 on the toy's 3 layers
    everything = sum(p.numel() * p.element_size() for p in policy.parameters())
    assert adapters < 0.1 * everything


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--lora_r", "-1"], "--lora_r must be at least 0, got -1"),
        (["--lora_r", "8", "--lora_alpha", "0"], "--lora_alpha must be above 0, got 0.0"),
        (["--lora_alpha", "32"], "--lora_alpha and --lora_target_modules act only with --lora_r"),
        (["--lora_r", "8", "--lora_target_modules", "qkv_proj"], "--lora_target_modules qkv_proj: names no linear"),
        (
            ["--lora_r", "8", "--lora_target_modules", "q_proj,norm"],
            "--lora_target_modules q_proj,norm: Target module Llama",
        ),
        (
            ["--lora_r", "8", "--lora_target_modules", "q_proj,embed_tokens"],
            "--lora_target_modules q_proj,embed_tokens: model.embed_tokens: an embedding's or the head's adapter",
        ),
        (["--lora_r", "8", "--lora_target_modules", "q_proj,lm_head"], "--lora_target_modules q_proj,lm_head: lm_head"),
    ],
    ids=["negative-rank", "zero-alpha", "alpha-alone", "no-such-modules", "a-norm-among-them", "embeddings", "head"],
)
def test_bad_lora_flags_stop_with_one_line(flags, says, tmp_path):
    cmd = [sys.executable, "dpo_humanline.py", "--max_steps", "1", "--output_dir", str(tmp_path / "run"), *flags]
    proc = warm.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(says), proc.stderr


def test_names_that_match_no_linear_layer_stop_before_the_weights_load_and_peft_refusals_in_one_line(toy):
    """The plan counts the adapters from the config (a meta-device model): names that match no linear layer stop at
    start-up, before any weights load (a one-line test above); a layer peft cannot wrap stops in one line at wrap."""
    args, _ = lora_args(lora_target_modules="qkv_proj")
    with pytest.raises(
        SystemExit, match=r"^--lora_target_modules qkv_proj: names no linear layer \(they are: down_proj"
    ):
        memory_plan.adapter_params(memory_plan.read_config("toy", args), args)
    args.lora_target_modules = "q_proj,v_proj"  # r (in + out) per adapted layer: 8 (128 + 128) x 2 x 3 layers
    assert memory_plan.adapter_params(memory_plan.read_config("toy", args), args) == 8 * 256 * 2 * 3
    args.lora_target_modules = "input_layernorm"
    base = AutoModelForCausalLM.from_pretrained(toy.model)
    with pytest.raises(SystemExit) as stopped:
        lora.add_adapters(base, args, seed=0)
    assert str(stopped.value.code).startswith("--lora_target_modules input_layernorm: Target module LlamaRMSNorm")
    assert "\n" not in str(stopped.value.code)


@pytest.mark.parametrize("script", ["dpo_humanline.py", "kto_humanline.py", "grpo_humanline.py"])
def test_the_lora_flags_are_listed_with_the_methods_flags(script):
    out = runs.help_text(script)
    flags = [line.split()[0] for line in out.splitlines() if line.strip().startswith("--")]
    adapters = [flags.index(f) for f in ("--lora_r", "--lora_alpha", "--lora_target_modules")]
    assert adapters == sorted(adapters) and adapters[-1] < flags.index("--ref_free") < flags.index("--eval_prompts")
    assert flags.index("--gradient_checkpointing") < adapters[0]


def test_two_processes_with_adapters_train_as_one_and_print_no_warning(tmp_path):
    flags = [*BASE, "--humanline", "--sync_every", "2", "--max_steps", "5", "--save_every", "0"]
    one, _, _ = runs.run_here("dpo_humanline.py", [*flags, "--ref_free", "off"], tmp_path / "one")
    for ref in ("on", "off"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += ["dpo_humanline.py", *flags, "--micro_batch_size", "2", "--ref_free", ref]
        proc = warm.run([*cmd, "--output_dir", str(tmp_path / ref)], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Warning" not in proc.stderr, proc.stderr[-3000:]
        assert_same_training(one, records(tmp_path / ref), 5, rel=1e-4, abs_=1e-6)


def test_two_processes_with_adapters_evaluate_and_sample_as_one(tmp_path):
    """Generation under FSDP2 with adapters: peft's generate enters the model below the root's forward, so the root's
    shards (the embeddings) must be gathered for the call, not by its forward hook (a DTensor error at step 0 once).
    Greedy evaluations on two processes equal one process's; online sampling runs."""
    evaluated = [*BASE, "--humanline", "--max_steps", "3", "--eval_prompts", "toy", "--num_eval_prompts", "8"]
    evaluated += ["--eval_every", "0"]
    one, _, _ = runs.run_here("dpo_humanline.py", evaluated, tmp_path / "one")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    online = [*BASE, "--online", "--num_generations", "4", "--max_steps", "2", "--output_dir", str(tmp_path / "grpo")]
    for argv in (
        ["dpo_humanline.py", *evaluated, "--output_dir", str(tmp_path / "two")],
        ["grpo_humanline.py", *online],
    ):
        proc = warm.run([*cmd, *argv], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
    two = records(tmp_path / "two")
    assert [r["eval/reward"] for r in two if "eval/reward" in r] == [
        r["eval/reward"] for r in one if "eval/reward" in r
    ]
    assert_same_training(one, two, 3, rel=1e-4, abs_=1e-6)
    assert [r["step"] for r in records(tmp_path / "grpo") if "online/reward" in r] == [0, 1]


def test_two_processes_in_bf16_shard_a_bf16_base_beside_fp32_adapters(tmp_path):
    """The GPU's dtype chain, forced on the CPU: FSDP2 groups that hold the frozen bf16 base and the fp32 adapters,
    gathered in bf16; the adapters and AdamW's moments stay fp32 and the loss stays near fp32's."""
    flags = [*BASE, "--humanline", "--max_steps", "3", "--micro_batch_size", "2"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "dpo_humanline.py"]
    for precision in ("fp32", "bf16"):
        out = ["--output_dir", str(tmp_path / precision), "--precision", precision]
        proc = warm.run([*cmd, *flags, *out], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(tmp_path / "bf16" / "checkpoint-3" / "state-rank1.pt", weights_only=True)
    assert {v.dtype for v in state["policy"].values()} == {torch.float32}
    assert {m.dtype for s in state["optimizer"]["state"].values() for k, m in s.items() if k != "step"} == {
        torch.float32
    }
    fp32, bf16 = steps(records(tmp_path / "fp32")), steps(records(tmp_path / "bf16"))
    assert [r["loss"] for r in bf16] == pytest.approx([r["loss"] for r in fp32], abs=2e-3)


@pytest.mark.parametrize("ref", ["on", "off"])
def test_lora_checkpoints_hold_the_adapters_and_resume_exactly(ref, tmp_path):
    flags = [*BASE, "--humanline", "--sync_every", "4", "--max_steps", "9", "--save_every", "3", "--ref_free", ref]
    out = tmp_path / "run"
    full, _, _ = runs.run_here("dpo_humanline.py", flags, out)
    state = torch.load(out / "checkpoint-6" / "state-rank0.pt", weights_only=True)
    assert state["policy"] and all("lora_" in k for k in state["policy"])  # the adapters, not the frozen base
    assert len(state["optimizer"]["state"]) == len(state["policy"])  # AdamW's moments of the adapters
    assert not os.path.exists(out / "checkpoint-6" / "model.safetensors")  # no copy of the base in a checkpoint
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "checkpoint-9")
    new, _, _ = runs.run_here("dpo_humanline.py", [*flags, "--resume"], resumed)
    assert [r["step"] for r in steps(new)] == list(range(1, 10))
    assert_same_training(steps(full), steps(new), 9, rel=1e-6, abs_=1e-9)


def test_the_run_ends_with_the_merged_model_and_the_adapter_each_loaded_by_its_library(tmp_path, toy):
    out = tmp_path / "run"
    runs.run_here("dpo_humanline.py", [*BASE, "--humanline", "--max_steps", "3"], out)
    merged = AutoModelForCausalLM.from_pretrained(out)  # transformers alone: no peft
    base = AutoModelForCausalLM.from_pretrained(toy.model)
    ids = torch.tensor([[3, 5, 7, 9, 11, 13, 4, 6]])
    with torch.no_grad():
        untrained = base(ids).logits
        adapted = peft.PeftModel.from_pretrained(base, out / "adapter")(ids).logits
        ours = merged(ids).logits
    assert (ours - untrained).abs().max() > 1e-3  # trained
    assert torch.allclose(ours, adapted, atol=1e-5)  # W + alpha / r B A is the adapted layer
    assert {v.dtype for v in load_file(out / "model.safetensors").values()} == {torch.float32}  # the toy's own dtype
    assert not any("lora" in k or "base_layer" in k for k in load_file(out / "model.safetensors"))
    last = load_file(out / "checkpoint-3" / "adapter_model.safetensors")
    assert last.keys() == load_file(out / "adapter" / "adapter_model.safetensors").keys()


@pytest.mark.parametrize(
    "script, flags",
    [
        ("kto_humanline.py", ["--humanline"]),
        ("grpo_humanline.py", ["--humanline"]),
        ("grpo_humanline.py", ["--online", "--humanline", "--sample_every", "3", "--num_generations", "4"]),
    ],
    ids=["kto", "grpo", "grpo-off-policy"],
)
def test_kto_and_grpo_with_adapters_read_the_base_once_and_their_references_agree(script, flags, tmp_path):
    argv = [*BASE, *flags, "--max_steps", "5"]
    free, _, loads_free = runs.run_here(script, argv, tmp_path / "free")
    adapter, _, loads_adapter = runs.run_here(script, [*argv, "--ref_free", "off"], tmp_path / "adapter")
    assert loads_free == loads_adapter == 1
    assert_same_training(free, adapter, 5)


def test_grpos_kl_to_the_initial_model_reads_the_base_with_the_adapters_disabled(tmp_path):
    """On-policy GRPO with --kl_baseline initial: the KL is to the base (the adapters disabled, no second copy), so it
    grows as the adapters train; read with the live adapters it would be the policy's own, 0, and --beta idle."""
    flags = [*BASE, "--online", "--beta", "0.1", "--kl_baseline", "initial", "--num_generations", "4"]
    flags += ["--learning_rate", "2e-3", "--max_steps", "5"]
    records, _, loads = runs.run_here("grpo_humanline.py", flags, tmp_path / "run")
    kls = [r["kl"] for r in steps(records)]
    assert loads == 1 and kls[0] == pytest.approx(0, abs=1e-7)  # step 1: the adapters are still 0 (B = 0)
    assert min(kls[2:]) > 1e-4, kls


def bf16_copy(toy, where):
    """The toy model in bf16, with its tokenizer: a bf16 base, as most real models are (a copy of the toy's task)."""
    AutoModelForCausalLM.from_pretrained(toy.model, dtype=torch.bfloat16).save_pretrained(where)
    AutoTokenizer.from_pretrained(toy.model).save_pretrained(where)
    return str(where)


def test_a_bf16_base_merges_in_fp32_and_exports_in_bf16_with_a_config_that_says_so(tmp_path, toy):
    """W + alpha / r B A is summed in fp32 and rounded once to the base's bf16 (adding a bf16-rounded delta to a bf16
    weight rounds twice); the export's config names bf16, so from_pretrained loads what was written."""
    base_dir, out = bf16_copy(toy, tmp_path / "base"), tmp_path / "run"
    flags = [*BASE, "--humanline", "--max_steps", "3", "--precision", "bf16", "--learning_rate", "2e-3"]
    runs.run_here("dpo_humanline.py", ["--model_name_or_path", base_dir, *flags], out)
    merged, base = load_file(out / "model.safetensors"), load_file(os.path.join(base_dir, "model.safetensors"))
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    assert {v.dtype for v in merged.values()} == {torch.bfloat16}
    assert merged.keys() == base.keys()  # the base's names: no peft names left
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16
    layers = sorted(k.removesuffix(".lora_A.weight") for k in adapter if k.endswith(".lora_A.weight"))
    rounded_twice = 0
    for layer in layers:
        a, b = adapter[f"{layer}.lora_A.weight"], adapter[f"{layer}.lora_B.weight"]
        delta, w = 16 / 8 * b @ a, layer.removeprefix("base_model.model.") + ".weight"  # alpha / r = 16 / 8
        assert torch.equal(merged[w], (base[w].float() + delta).bfloat16()), w
        rounded_twice += not torch.equal(merged[w], base[w] + delta.bfloat16())
    assert len(layers) == 21 and rounded_twice  # 7 linears x 3 layers; the test tells the two sums apart


def test_a_fp32_model_trained_on_a_bf16_base_exports_fp32_with_its_tied_head_once(tmp_path, toy):
    """The toy's file is fp32 and its head is tied: trained with adapters on its bf16 copy (--precision bf16), the
    merged model is written in the file's fp32, the tied head once (cast separately, it was a second tensor)."""
    out = tmp_path / "run"
    runs.run_here("dpo_humanline.py", [*BASE, "--humanline", "--max_steps", "2", "--precision", "bf16"], out)
    merged, base = load_file(out / "model.safetensors"), load_file(os.path.join(toy.model, "model.safetensors"))
    assert merged.keys() == base.keys() and {v.dtype for v in merged.values()} == {torch.float32}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


@pytest.fixture
def gpt2(tmp_path, toy):
    """A random GPT-2 (Conv1D layers, learned positions) with the toy's tokenizer and vocabulary."""
    config = GPT2Config(vocab_size=17, n_positions=64, n_embd=64, n_layer=2, n_head=4, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    AutoTokenizer.from_pretrained(toy.model).save_pretrained(tmp_path / "gpt2")
    return str(tmp_path / "gpt2")


def test_lora_on_gpt2s_conv1d_layers_trains_merges_and_reloads_as_the_adapter(gpt2, tmp_path):
    args, _ = lora_args(model_name_or_path=gpt2)  # all-linear: c_attn, c_proj, c_fc, c_proj per layer (not the head)
    c = memory_plan.read_config(gpt2, args)
    assert memory_plan.adapter_params(c, args) == 8 * 2 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    out = tmp_path / "run"
    lengths = ["--max_length", "48", "--max_prompt_length", "16", "--learning_rate", "2e-3"]
    runs.run_here("dpo_humanline.py", ["--model_name_or_path", gpt2, *BASE, *lengths, "--max_steps", "3"], out)
    ids = torch.tensor([[3, 5, 7, 9, 11, 13, 4, 6]])
    with torch.no_grad():
        untrained = AutoModelForCausalLM.from_pretrained(gpt2)(ids).logits
        adapted = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(gpt2), out / "adapter")
        adapted, ours = adapted(ids).logits, AutoModelForCausalLM.from_pretrained(out)(ids).logits
    assert (ours - untrained).abs().max() > 1e-3  # trained
    assert torch.allclose(ours, adapted, atol=1e-5)  # the Conv1D merge is W + (alpha / r B A)^T


def test_max_length_above_learned_positions_stops_at_start_up(gpt2, tmp_path):
    cmd = [sys.executable, "dpo_humanline.py", "--model_name_or_path", gpt2, "--output_dir", str(tmp_path / "run")]
    proc = warm.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)  # --max_length 1024
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"--max_length 1024 is above the 64 positions of {gpt2}"
    toy = dpo_humanline.Args(max_length=1024)  # the toy's 64 positions are rotary: no table to run past
    assert memory_plan.positions(memory_plan.read_config("toy", toy)) is None
