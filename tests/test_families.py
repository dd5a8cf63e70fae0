"""Model families other than Llama, as a user with their own model brings them: tiny random models built from each
family's config class and saved to disk. Every one trains on log-probs equal to the model's own log-softmax (the
head's bias, Cohere's and Granite's logit scale and Gemma 2's softcap applied), the memory plan counts its
parameters, and a family whose logits the scripts' head cannot reproduce stops at load with one line."""

import contextlib
import json
import math
import os
import sys
from unittest import mock

import pytest
import torch
import transformers
import warm
from paths import ROOT

import dpo_humanline as dpo
import memory_plan

# the toy tokenizer's 17 tokens fit every vocabulary below; pad 0 and eos 1 as the toy model's
IDS = dict(vocab_size=32, pad_token_id=0, eos_token_id=1, bos_token_id=None)
LLAMA_LIKE = dict(
    IDS,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
FAMILIES = {
    "llama": ("LlamaConfig", LLAMA_LIKE),
    "qwen2": ("Qwen2Config", LLAMA_LIKE),
    "mistral": ("MistralConfig", LLAMA_LIKE),
    "olmo2": ("Olmo2Config", LLAMA_LIKE),
    "starcoder2": ("Starcoder2Config", LLAMA_LIKE),
    "gemma2": ("Gemma2Config", dict(LLAMA_LIKE, head_dim=8, final_logit_softcapping=0.5)),  # a softcapped head
    "cohere": ("CohereConfig", dict(LLAMA_LIKE, logit_scale=0.3)),  # logits times a scale
    "granite": ("GraniteConfig", dict(LLAMA_LIKE, logits_scaling=3.0)),  # logits over a scale
    "phi": ("PhiConfig", LLAMA_LIKE),  # a bias on the head
    "gpt_neox": ("GPTNeoXConfig", LLAMA_LIKE),
    # no intermediate_size in their configs: GPT-2's n_inner (None: 4 x n_embd), OPT's ffn_dim
    "gpt2": ("GPT2Config", dict(IDS, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "gptj": ("GPTJConfig", dict(IDS, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4)),
    "opt": ("OPTConfig", dict(IDS, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4)),
    "bloom": ("BloomConfig", dict(IDS, hidden_size=32, n_layer=2, n_head=4)),
    "falcon": ("FalconConfig", dict(IDS, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)),
}


def build(family):
    cls, kwargs = FAMILIES[family]
    config = getattr(transformers, cls)(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:  # zero when initialised: a trained model's is not
        with torch.no_grad():
            head.bias.normal_(0, 1)
    return model, config


def own_logps(model, ids, mask, temperature=1.0):
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, :-1].float() / temperature
    return (logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)) * mask[:, 1:]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_log_probs_training_reads_are_the_models_own_log_softmax(family):
    model, config = build(family)
    ids = torch.randint(2, 32, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(3, 12)
    mask[:, 5:] = 1
    own = own_logps(model, ids, mask)
    for temperature in (1.0, 0.7):  # GRPO's --logps_temperature divides the logits the model makes
        want = own_logps(model, ids, mask, temperature)
        with torch.no_grad():
            got = dpo.token_logps(model, ids, torch.ones_like(ids), mask, temperature=temperature)
        assert (got - want).abs().max() <= 1e-5, (family, temperature)
    if family in ("gemma2", "cohere", "granite", "phi"):  # the head's extra is not a no-op on this model
        neutral = dict(gemma2=dict(final_logit_softcapping=None), cohere=dict(logit_scale=1.0))
        model.config.update(dict(neutral, granite=dict(logits_scaling=1.0)).get(family, {}))
        head = model.get_output_embeddings()
        with mock.patch.object(head, "bias", None) if head.bias is not None else contextlib.nullcontext():
            with torch.no_grad():
                plain = dpo.token_logps(model, ids, torch.ones_like(ids), mask)
        assert (plain - own).abs().max() > 1e-2, family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_memory_plan_counts_each_familys_parameters(family):
    model, config = build(family)
    shapes = memory_plan.shapes(config)
    assert shapes.params == sum(p.numel() for p in model.parameters())
    layers = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
    assert len(layers) == 2 and shapes.layer == sum(p.numel() for p in layers[0].parameters())
    args = dpo.Args(online=True, offline=False, micro_batch_size=2, max_length=64, max_new_tokens=16, precision="bf16")
    assert memory_plan.peak(memory_plan.plan(args, "dpo", 2, config=config)) > shapes.params * 16  # weights, Adam


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def save(family):
        out = tmp_path_factory.mktemp(family)
        model, _ = build(family)
        model.save_pretrained(out)
        transformers.AutoTokenizer.from_pretrained(os.path.join(ROOT, "toy", "model")).save_pretrained(out)
        return out

    return save


@pytest.mark.parametrize(
    "script, family, nproc",
    [("dpo_humanline.py", "gpt2", 1), ("kto_humanline.py", "phi", 1), ("grpo_humanline.py", "gemma2", 2)],
)
def test_each_script_trains_a_model_of_another_family(script, family, nproc, saved, tmp_path):
    """A few humanline steps on the toy data with the family's model (GRPO's on two processes: FSDP2 shards its
    layers by the family's own decoder-layer class)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    flags = ["--humanline", "--max_steps", "2", "--batch_size", "8", "--micro_batch_size", "2"]
    flags += ["--eval_prompts", "none", "--save_every", "0", "--max_length", "64", "--max_prompt_length", "24"]
    flags += ["--dataset", "toy/offline_strong.jsonl"]  # the toy's pairs as a file: another model's data is named
    proc = warm.run(
        [*(launch if nproc > 1 else [sys.executable]), script, "--model_name_or_path", str(saved(family)), *flags]
        + ["--output_dir", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_a_family_whose_logits_the_head_cannot_reproduce_stops_at_load_with_one_line(saved):
    """A family that transforms its logits in a way token_logps does not know: here a Llama whose forward doubles
    them."""
    path = str(saved("llama"))
    forward = transformers.LlamaForCausalLM.forward

    def doubled(self, *a, **kw):
        out = forward(self, *a, **kw)
        out.logits = out.logits * 2
        return out

    args = dpo.Args(model_name_or_path=path)
    rt = dpo.setup(args)  # one process, fp32
    assert dpo.load_model(args, rt) is not None  # as the family is, it loads
    with mock.patch.object(transformers.LlamaForCausalLM, "forward", doubled), pytest.raises(SystemExit) as stop:
        dpo.load_model(args, rt)
    assert stop.value.code.startswith(f"{path}: the log-probs token_logps computes differ from the model's own by ")
    assert "\n" not in stop.value.code

    def older(self, *a, logits_to_keep=None, **kw):  # a model class from before logits_to_keep
        if logits_to_keep is not None:
            raise TypeError("forward() got an unexpected keyword argument 'logits_to_keep'")
        return forward(self, *a, **kw)

    with mock.patch.object(transformers.LlamaForCausalLM, "forward", older), pytest.raises(SystemExit) as stop:
        dpo.load_model(args, rt)
    assert stop.value.code == f"{path}: token_logps cannot read this model: TypeError: forward() got an unexpected " + (
        "keyword argument 'logits_to_keep'"
    )
