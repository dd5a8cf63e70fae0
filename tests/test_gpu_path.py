"""The GPU code paths, shown on a CPU (no GPU has run this code): log-probs without (batch, seq, vocab) logits,
activation checkpointing, sharded gradients, loading on one process, one all-gather per shard group per generate
call, the bf16 dtype chain and humanline's log-ratio under it, reward-model batches, checkpoints in the model's
dtype, and the memory plan against measured peaks. tests/test_cuda.py runs the scripts on a GPU when there is one."""

import json
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from unittest import mock

import gpu_path_helper
import pytest
import runs
import torch
import warm
from paths import ROOT
from safetensors import safe_open
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
)

import dpo_humanline as dpo
import memory_plan
import plumbing

HELPER = os.path.join(ROOT, "tests", "support", "gpu_path_helper.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def page_token_logps(model, input_ids, attention_mask, loss_mask):
    """docs/your-trainer.md's token_logps, read out of the page: the plain computation token_logps's docstring names,
    the whole (batch, seq, vocab) logits in fp32, log-softmax, gather, mask."""
    with open(os.path.join(ROOT, "docs", "your-trainer.md")) as f:
        (code,) = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "def token_logps" in b]
    namespace = {}
    exec(code, namespace)  # (the block's loss needs the page's clamp only when called)
    return namespace["token_logps"](model, input_ids, attention_mask, loss_mask)


def toy_batch(toy, n=8):
    tok = AutoTokenizer.from_pretrained(toy.model)
    with open(toy.offline["strong"]) as f:
        rows = [json.loads(line) for line in f][:n]
    seqs = [
        (tok(r["prompt"])["input_ids"], tok(r[c] + tok.eos_token, add_special_tokens=False)["input_ids"])
        for r in rows
        for c in ("chosen", "rejected")
    ]
    return dpo.collate(seqs, tok.pad_token_id, torch.device("cpu"))


@pytest.mark.parametrize("chunk", [1024, 7])
def test_token_logps_equal_the_full_vocabulary_log_softmax_and_its_gradient(toy, chunk):
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    ids, attn, mask = toy_batch(toy)
    new = dpo.token_logps(model, ids, attn, mask, chunk=chunk)
    (new * torch.arange(new.shape[1])).sum().backward()  # a weighted sum: every position's gradient counts
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    old = page_token_logps(model, ids, attn, mask)
    (old * torch.arange(old.shape[1])).sum().backward()
    assert new.dtype == torch.float32 and new.shape == old.shape
    assert torch.equal(new == 0, old == 0)  # zero exactly off the completions
    assert (new - old).abs().max() <= 1e-6 * old.abs().max()  # within 1e-6 of today's, relative to the log-probs
    # the gradients: the same sums in another order (chunks of rows), so equal to fp32 rounding of their scale
    assert all((g - p.grad).abs().max() <= 5e-6 * p.grad.abs().max() for g, p in zip(grads, model.parameters()))


def test_token_logps_at_a_temperature_are_the_log_softmax_of_the_logits_over_it(toy):
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    ids, attn, mask = toy_batch(toy)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / 0.7
        want = (logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)) * mask[:, 1:]
        got = dpo.token_logps(model, ids, attn, mask, temperature=0.7)
        plain = dpo.token_logps(model, ids, attn, mask)
    assert (got - want).abs().max() <= 1e-6 * want.abs().max() and (got - plain).abs().max() > 0.01


@pytest.mark.parametrize("scheduler", ["linear", "constant"])
def test_the_learning_rate_warms_up_then_decays_or_holds(scheduler):
    args = SimpleNamespace(
        learning_rate=1.0, adam_eps=1e-8, weight_decay=0.0, warmup_ratio=0.2, max_steps=10, lr_scheduler=scheduler
    )
    optimizer, schedule = dpo.make_optimizer(torch.nn.Linear(1, 1), args)
    rates = []
    for _ in range(10):
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    # warmup: int(0.2 x 10) = 2 steps, s + 1 over 2; then (10 - s) / 8 or 1
    assert rates == (
        [0.5] + [1.0] * 9 if scheduler == "constant" else [0.5, 1.0, 1.0] + [(10 - s) / 8 for s in range(3, 10)]
    )


def saved_tensors(fn):
    """The tensors autograd keeps for the backward of fn(), parameters left out: [(shape, dtype)]."""
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        fn()
    return seen


def small_llama(vocab=4096, layers=2, tied=False, **kw):
    torch.manual_seed(0)
    config = runs.llama(vocab=vocab, layers=layers, kv_heads=2, tied=tied, **kw)
    return LlamaForCausalLM(config).train(), config


def test_the_log_prob_step_keeps_no_fp32_tensor_with_a_vocabulary_axis_per_position():
    model, config = small_llama()
    B, S = 4, 96
    ids = torch.randint(0, config.vocab_size, (B, S))
    mask = torch.zeros(B, S)
    mask[:, 32:] = 1  # the completions
    params = {p.data_ptr() for p in model.parameters()}

    def big(fn):  # saved tensors of at least one position x the vocabulary, the weights left out
        big = 32 * config.vocab_size
        return [t.shape for t in saved_tensors(fn) if t.data_ptr() not in params and t.numel() >= big]

    assert big(lambda: dpo.token_logps(model, ids, torch.ones_like(ids), mask, chunk=16)) == []
    assert (B, S - 1, config.vocab_size) in big(lambda: page_token_logps(model, ids, torch.ones_like(ids), mask))


def bytes_per_token(model, tokens=512):
    ids = torch.randint(0, model.config.vocab_size, (2, tokens // 2))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in saved_tensors(
            lambda: model(input_ids=ids, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        )
    }
    return sum(n for ptr, n in storages.items() if ptr not in params) / tokens


def test_activation_checkpointing_keeps_each_layers_input_not_its_activations_as_the_plan_counts():
    """Saved bytes per token, measured on 2 and 6 layers (the difference is 4 layers' worth), against the memory
    plan's per-layer figure: all of a layer's saved tensors without checkpointing, its input (d fp32) with it."""
    shape = dict(hidden_size=256, intermediate_size=768, num_attention_heads=8, num_key_value_heads=2, vocab_size=512)
    per_layer = {}
    for checkpointing in (False, True):
        measured = []
        for layers in (2, 6):
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **shape)).train()
            if checkpointing:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            measured.append(bytes_per_token(model))
        per_layer[checkpointing] = (measured[1] - measured[0]) / 4
    s = memory_plan.shapes(LlamaConfig(num_hidden_layers=1, **shape))
    assert per_layer[False] == pytest.approx(memory_plan.act_bytes(s, bf16=False), rel=0.05)
    assert per_layer[True] == pytest.approx(s.d * 4, rel=0.05)  # the layer's input, fp32
    assert per_layer[False] > 10 * per_layer[True]


@pytest.fixture(scope="module")
def fsdp_model(tmp_path_factory):
    """A 63M-parameter untied Llama with the toy tokenizer."""
    tmp = tmp_path_factory.mktemp("fsdp")
    torch.manual_seed(0)
    config = runs.llama(vocab=8000, hidden=512, mlp=1536, layers=16, heads=8, pad_token_id=0, eos_token_id=1)
    config.max_position_embeddings = 256
    LlamaForCausalLM(config).save_pretrained(tmp / "model")
    AutoTokenizer.from_pretrained(os.path.join(ROOT, "toy", "model")).save_pretrained(tmp / "model")
    return tmp / "model"


@pytest.fixture(scope="module")
def fsdp_results(fsdp_model, tmp_path_factory):
    """One 2-process FSDP2 run (gloo) of tests/support/gpu_path_helper.py: loading and generation."""
    tmp = tmp_path_factory.mktemp("fsdp_results")
    proc = warm.run(
        [*TORCHRUN, HELPER, "fsdp", str(fsdp_model), str(tmp / "out.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp / f"out.json.rank{r}").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two steps of dpo_humanline.py's own loop on two processes (gloo), on a 0.9M-parameter untied Llama, in fp32
    and in bf16 (FSDP2's mixed precision, forced on the CPU)."""
    tmp = tmp_path_factory.mktemp("train")
    model, _ = small_llama(vocab=1000, layers=4)
    model.config.update(dict(pad_token_id=0, eos_token_id=1))
    model.save_pretrained(tmp / "model")
    AutoTokenizer.from_pretrained(os.path.join(ROOT, "toy", "model")).save_pretrained(tmp / "model")
    model = str(tmp / "model")
    gpu_path_helper.pairs_file(tmp / "pairs.jsonl", 16, 8, 24)
    out = {}
    for precision in ("fp32", "bf16"):
        proc = warm.run(
            [*TORCHRUN, HELPER, "train", model, str(tmp / "pairs.jsonl"), str(tmp / precision), precision],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[precision] = [json.loads((tmp / f"{precision}.rank{r}").read_text()) for r in (0, 1)]
    return out


def test_one_process_reads_the_weights_and_the_others_receive_only_their_shards(fsdp_results):
    rank0, rank1 = fsdp_results
    assert rank0["model_bytes"] > 240e6 and rank0["loaded_equal"]  # 63M fp32 parameters, equal to from_pretrained's
    shard = rank1["shard_bytes"]
    assert rank0["load_rss_growth"] > rank0["model_bytes"]  # it read the file and held the whole model once
    # the other process: its shard and one tensor in flight at a time, never the model (measured 0.17-0.19 GB of
    # growth against 0.25 GB for the model; 0.39 GB on process 0)
    assert rank1["load_rss_growth"] < shard + rank1["largest_bytes"] + 80 * 2**20
    assert rank1["load_rss_growth"] < 0.8 * rank1["model_bytes"]
    assert rank0["load_rss_growth"] - rank1["load_rss_growth"] > 0.5 * rank0["model_bytes"]


def test_gradients_accumulate_sharded_across_micro_batches(trained):
    """After every micro-batch's backward in the script's loop, each process holds its shard of the gradient (the
    reduce-scatter ran), never the whole gradient until the last micro-batch."""
    for r in trained["fp32"] + trained["bf16"]:
        assert len(r["grad_bytes"]) == 2 * 2  # two steps of two micro-batches on each process
        assert r["grad_bytes"] == [r["shard_bytes"]] * 4 and r["shard_bytes"] == r["model_bytes"] / 2


def test_generate_gathers_each_shard_group_once_per_call_whatever_the_length(fsdp_results):
    for r in fsdp_results:
        assert r["all_gathers_4"] == r["all_gathers_16"] <= r["units"] + 1
        assert r["resharded_after_generate"]  # training after it gathers layer by layer again


def test_the_bf16_path_keeps_what_humanline_reads_in_fp32(trained):
    for r in trained["bf16"] + trained["fp32"]:
        assert r["loss_dtypes"] == ["torch.float32"]  # the policy's and reference's log-probs, the loss
        assert r["params"] == r["grad_dtypes"] == r["adam"] == ["torch.float32"]


@pytest.fixture(scope="module")
def untied_toy(tmp_path_factory, toy):
    """The toy policy with its head untied from the embeddings (the paper's Llama-3-8B has an untied head)."""
    out = tmp_path_factory.mktemp("untied")
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(toy.model).save_pretrained(out)
    return out


def test_under_bf16_the_log_ratio_humanline_trains_on_stays_near_the_fp32_one_and_the_fp32_head_matters(
    untied_toy, tmp_path
):
    """Two processes, offline + humanline GRPO (k = 1): the step-2 mean |token log-ratio| (policy after one update
    against the reference before it, ~1.7e-3) in bf16 against fp32. Measured: 1.20x fp32 with AVX-512 and 1.34x on
    torch's plain code path (ATEN_CPU_CAPABILITY=default), the rest being bf16's rounding of the weights; with the
    head in bf16 too, 1.8x and 2.2x."""

    def abs_log_ratio(*flags):
        run = ["--offline", "--humanline", "--model_name_or_path", str(untied_toy), "--max_steps", "2", "--batch_size"]
        run += ["16", "--eval_prompts", "none", "--save_every", "0", *flags]
        return (
            runs.run("grpo_humanline.py", run, tmp_path / "-".join(flags), nproc=2).check().records[1]["ratio/abs_log"]
        )

    fp32, bf16, bf16_head = (abs_log_ratio("--precision", *p) for p in (["fp32"], ["bf16"], ["bf16", "--no_fp32_head"]))
    assert 1e-3 < fp32 < 3e-3
    assert fp32 < bf16 < 1.5 * fp32
    assert bf16_head > 1.25 * bf16


def test_reward_models_score_in_batches_and_running_out_of_memory_names_the_flag(tmp_path, toy):
    torch.manual_seed(0)
    rm = LlamaForSequenceClassification(
        runs.llama(vocab=32, hidden=32, layers=1, heads=2, num_labels=1, pad_token_id=0)
    )
    rm.save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(toy.model).save_pretrained(tmp_path / "rm")
    args = dpo.Args(reward_batch_size=3)
    rt = SimpleNamespace(
        device=torch.device("cpu"), dtype=torch.float32, autocast=lambda: torch.autocast("cpu", enabled=False)
    )
    score = plumbing.make_scorer(str(tmp_path / "rm"), args, rt)
    real, sizes = LlamaForSequenceClassification.forward, []

    def counting(self, input_ids=None, **kw):
        sizes.append(len(input_ids))
        return real(self, input_ids=input_ids, **kw)

    with mock.patch.object(LlamaForSequenceClassification, "forward", counting):
        scores = score(["1+1="] * 7, ["2"] * 7)
    assert sizes == [3, 3, 1] and len(scores) == 7 and all(math.isfinite(s) for s in scores)
    with mock.patch.object(LlamaForSequenceClassification, "forward", side_effect=torch.OutOfMemoryError("CUDA")):
        with pytest.raises(SystemExit) as stopped:  # not a bad sample to retry one at a time: a one-line stop
            plumbing.score_samples("rm", score, ["1+1="] * 7, ["2"] * 7, {})
    assert stopped.value.code == (
        f"{tmp_path / 'rm'}: out of memory scoring 3 sequences at once; lower --reward_batch_size"
    )


def test_generate_calls_hold_at_most_generation_batch_size_sequences(toy):
    model = AutoModelForCausalLM.from_pretrained(toy.model)
    tok = AutoTokenizer.from_pretrained(toy.model)
    args = dpo.Args(generation_batch_size=8, max_new_tokens=4)
    real, sizes = LlamaForCausalLM.generate, []

    def counting(self, input_ids=None, num_return_sequences=1, **kw):
        sizes.append(len(input_ids) * num_return_sequences)
        return real(self, input_ids=input_ids, num_return_sequences=num_return_sequences, **kw)

    with mock.patch.object(LlamaForCausalLM, "generate", counting):
        out, _ = plumbing.generate(model, tok, [tok("12+34=")["input_ids"]] * 10, 4, args, greedy=False, seed=0)
    assert len(out) == 40 and sizes == [8] * 5


def test_checkpoints_are_written_in_the_models_dtype_rotated_and_the_final_model_written_once(tmp_path, toy):
    bf16 = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(toy.model, dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(toy.model).save_pretrained(bf16)
    out, flags = tmp_path / "run", ["--model_name_or_path", str(bf16), "--max_steps", "3", "--batch_size", "8"]
    runs.run(
        "dpo_humanline.py", [*flags, "--eval_prompts", "none", "--save_every", "1", "--save_total_limit", "2"], out
    ).check()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert os.path.samefile(out / "model.safetensors", out / "checkpoint-3" / "model.safetensors")  # one write
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # as written, not training's fp32
    trained = AutoModelForCausalLM.from_pretrained(out)
    assert trained.dtype == torch.bfloat16  # loads in the dtype it was written in: half fp32's memory
    assert any(
        not torch.equal(a, b)
        for a, b in zip(trained.parameters(), AutoModelForCausalLM.from_pretrained(bf16).parameters())
    )


PEAK_SHAPES = {  # Llama shapes and the flags of a DPO step: 10-13M parameters, 512-768 tokens per forward (a real
    # model's shape adds no term to the plan; on a CPU without bf16 instructions a bf16 step takes up to 5x fp32's)
    "untied, 8 layers": (
        runs.llama_sizes(vocab=8000, hidden=256, mlp=768, layers=8, heads=4),
        dict(batch_size=2, micro_batch_size=2, max_length=128, gradient_checkpointing=False),
    ),
    "GQA, checkpointed": (
        runs.llama_sizes(vocab=4000, hidden=384, mlp=1024, layers=6, heads=6, kv_heads=2),
        dict(batch_size=2, micro_batch_size=2, max_length=128, gradient_checkpointing=True),
    ),
    "tied, wide MLP": (
        runs.llama_sizes(vocab=4000, hidden=512, mlp=2048, layers=2, heads=8, tied=True),
        dict(batch_size=2, micro_batch_size=2, max_length=192, gradient_checkpointing=False),
    ),
}
# two of them with LoRA adapters: the frozen base, the adapters' states and the activations, no copy of the base
PEAK_SHAPES |= {
    f"{name}, LoRA r = {r}": (config, flags | {"lora_r": r})
    for name, r in (("tied, wide MLP", 64), ("GQA, checkpointed", 16))
    for config, flags in [PEAK_SHAPES[name]]
}


@pytest.fixture(scope="module")
def peaks(tmp_path_factory):
    """Each shape's two DPO steps in each precision, each in a fresh process (two at a time, one thread each: a
    process's peak is its own): the helper's measurement and the plan's figures."""
    tmp = tmp_path_factory.mktemp("peaks")

    def measure(case):
        name, precision = case
        out = tmp / f"{name}-{precision}.json".replace(" ", "_")
        config, flags = PEAK_SHAPES[name]
        shape = json.dumps({"config": config, "flags": {**flags, "precision": precision}})
        # oneDNN capped at AVX2: on a CPU with AVX-512 bf16 instructions its bf16 kernels keep reordered weights and
        # scratch buffers that no GPU holds (a third of the LoRA bf16 peak; 1.50x the plan there, 1.17x when capped)
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1", ONEDNN_MAX_CPU_ISA="AVX2")
        proc = warm.run([sys.executable, HELPER, "peak", shape, str(out)], cwd=ROOT, env=env, timeout=600)
        return case, (proc.stderr[-3000:] if proc.returncode else json.loads(out.read_text()))

    cases = [(name, precision) for name in PEAK_SHAPES for precision in ("fp32", "bf16")]
    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(measure, cases))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(PEAK_SHAPES))
def test_the_memory_plan_is_within_20_percent_of_the_measured_peak(name, precision, peaks):
    """Two DPO steps on a CPU, in a fresh process: the peak resident memory above what the process held before
    the model was built, against the plan's training phase (weights, gradients, AdamW, activations, head). glibc's
    malloc keeps a fixed mmap threshold, so that freed tensors leave the resident set as they would leave a GPU.
    bf16 is the GPU's dtype chain: autocast over fp32 weights, or with LoRA a bf16 base (and its head's fp32 copy)."""
    got = peaks[(name, precision)]
    assert isinstance(got, dict), got  # else what the measurement printed when it failed
    assert got["planned"] == pytest.approx(got["measured"], rel=0.2), got
    if PEAK_SHAPES[name][1].get("lora_r"):  # the merged export casts a weight at a time: merged in fp32 all at once,
        assert got["export"] <= 2 * got["saving"], got  # then cast, it took 2.5x the plan's figure (the base's dtype)


@pytest.mark.parametrize(
    "script, flags",
    [
        ("dpo_humanline.py", ["--online", "--round_size", "16", "--num_samples", "4"]),
        ("grpo_humanline.py", ["--online", "--num_generations", "4", "--humanline"]),
    ],
)
def test_one_process_samples_trains_and_evaluates_under_bf16_autocast(script, flags, tmp_path):
    """The single-GPU path (autocast, no FSDP2) taken on a CPU: sampling, scoring, training and evaluation in bf16
    run, and the log-probs and losses they give are finite."""
    records = runs.run(script, [*flags, "--precision", "bf16", *runs.short(2, 16)], tmp_path).check().records
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)
    assert "eval/reward" in records[0] and "online/reward" in records[1] and "eval/reward" in records[-1]
