"""docs/your-trainer.md: every code block of the page, read out of it and run as it stands, alone (a namespace with
only the user's objects and the page's functions it says it uses), on the toy model.

- the clamp equals the scripts' (dpo_loss with its bounds) and a clamped token's gradient is exactly 0;
- the plain loop trains the toy and syncs after clipping, before each k-th update, with dropout off in both models;
  the loop without a reference model gives its losses step by step;
- the callback, on TRL's DPOTrainer, KTOTrainer and GRPOTrainer with k = 1 and 2, with a second model and (DPO, GRPO)
  with LoRA (TRL's "ref" adapter): after each k-th update the reference holds the policy's weights from before that
  update (compared exactly), and between syncs it is untouched; each step of TRL's DPO loss equals dpo_loss on the
  same batch, policy and reference; where a sync cannot work (a peft_config, no reference, precomputed log-probs,
  DeepSpeed, run on a CPU: there the update precedes the hook) it stops; under FSDP2 on two processes it syncs each
  process's shards;
- the page's clamp for TRL's DPO, put in place of the two lines the page names in the installed TRL's source, makes
  each step's loss dpo_loss with the clamp, while tokens are clamped; for GRPO, in place of the line that sets
  log_ratio, grpo_loss with the clamp, and a clamped token's gradient is the KL term's alone;
- every block imports what it uses;
- the authors' own sync (their math code's two hooks), executed: the reference gets the weights after the update.
"""

import copy
import importlib.util
import json
import os
import re
import tempfile
from types import SimpleNamespace
from unittest import mock

import datasets
import pytest
import torch
import trl
from paths import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

import data_formats
import dpo_humanline
import grpo_humanline
import toy_task

PAGE = os.path.join(ROOT, "docs", "your-trainer.md")
BETA = 0.1  # DPOConfig's and the page's default


def block(marker):
    """The one ```python block of the page that contains `marker`."""
    with open(PAGE) as f:
        found = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if marker in b]
    assert len(found) == 1, f"{len(found)} code blocks of docs/your-trainer.md hold {marker!r}"
    return found[0]


def uses(marker):
    """The page's functions and classes that a block says it uses (its first line, `# uses a and b (above)`), each
    made by its own block run alone."""
    found = re.match(r"# uses (.+) \(above\)\n", block(marker))
    names = [n for n in re.findall(r"\w+", found.group(1)) if n != "and"] if found else []
    return {n: alone(f"{'class' if n[0].isupper() else 'def'} {n}")[n] for n in names}


def namespace(marker, **names):
    """A fresh namespace for the block `marker`: the user's `names` and what the block says it uses, nothing else
    (not the page's earlier blocks): a block copied alone runs as it does here."""
    return dict(names) | uses(marker)


def run(marker, ns):
    exec(compile(block(marker), PAGE, "exec"), ns)
    return ns


def alone(marker, **names):
    return run(marker, namespace(marker, **names))


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def logps_of(model, inputs):
    """(chosen, rejected) per-token log-probs of `model`, or of (model, weights) loaded into a copy of it."""
    if isinstance(model, tuple):
        model, snapshot = copy.deepcopy(model[0]), model[1]
        with torch.no_grad():
            for p, w in zip(model.parameters(), snapshot, strict=True):
                p.copy_(w)
    with torch.no_grad():
        ids, attention, mask = inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"]
        return dpo_humanline.token_logps(model, ids, attention, mask).chunk(2)


def ours(policy, reference, inputs, log_eps=(None, None), ref_logps=None):
    """This repository's dpo_loss (mean over pairs) of `policy` against `reference` (models, or (model, weights)
    to load into a copy of it; or its log-probs, `ref_logps`) on a batch of chosen rows then rejected rows."""
    ref_logps = ref_logps or logps_of(reference, inputs)
    masks = inputs["completion_mask"][:, 1:].float().chunk(2)
    loss, _ = dpo_humanline.dpo_loss(*logps_of(policy, inputs), *ref_logps, *masks, BETA, *log_eps)
    return loss.mean().item()


@pytest.fixture(scope="module")
def pairs(toy):
    """(tokenizer, the first 16 toy pairs as TRL's rows, the same as token ids (prompt, (chosen, rejected)))."""
    tok = AutoTokenizer.from_pretrained(toy.model)
    with open(toy.offline["strong"]) as f:
        rows = [json.loads(line) for line in f][:16]
    ids = data_formats.load_data(dpo_humanline.Args(), "preferences", tok, SimpleNamespace(rank=0))[:16]
    return tok, [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows], ids


def toy_model(toy):
    return AutoModelForCausalLM.from_pretrained(toy.model, dtype=torch.float32)


# ---- the clamp ------------------------------------------------------------------------------------------------


def test_the_clamp_is_the_scripts_and_a_clamped_token_passes_no_gradient():
    ns = alone("def humanline_clamp") | alone("def humanline_dpo_loss")
    g = torch.Generator().manual_seed(0)
    policy = (3 * torch.randn(8, 12, generator=g)).requires_grad_()
    ref = torch.randn(8, 12, generator=g)
    mask = (torch.rand(8, 13, generator=g) > 0.2).float()
    clamped = ((policy - ref).detach().abs() > 1.5) & (mask[:, 1:] > 0)
    assert 0.2 < clamped.float().mean() < 0.8  # both kinds of token

    (grad,) = torch.autograd.grad(ns["humanline_clamp"](policy, ref).sum(), policy)
    assert torch.equal(grad, (~((policy - ref).detach().abs() > 1.5)).float())  # 0 clamped, 1 inside, exactly

    page_loss = ns["humanline_dpo_loss"](policy, ref, mask)
    (page_grad,) = torch.autograd.grad(page_loss, policy)
    masks = mask[:, 1:].chunk(2)
    script_loss = dpo_humanline.dpo_loss(*policy.chunk(2), *ref.chunk(2), *masks, BETA, -1.5, 1.5)[0].mean()
    (script_grad,) = torch.autograd.grad(script_loss, policy)
    assert page_loss.item() == pytest.approx(script_loss.item(), abs=1e-6)
    assert torch.allclose(page_grad, script_grad, atol=1e-7)
    assert page_grad[clamped].abs().max() == 0 and page_grad[~clamped & (mask[:, 1:] > 0)].abs().min() > 0


# ---- the plain loop ---------------------------------------------------------------------------------------------


def plain_batches(pairs, steps=4, size=4):
    _, _, ids = pairs
    out = []
    for s in range(steps):
        rows = ids[s * size : (s + 1) * size]
        seqs = [(p, c) for p, (c, _), _ in rows] + [(p, r) for p, (_, r), _ in rows]
        input_ids, attention_mask, loss_mask = dpo_humanline.collate(seqs, 0, torch.device("cpu"))
        out.append(dict(input_ids=input_ids, attention_mask=attention_mask, completion_mask=loss_mask))
    return out


class Recording(torch.optim.AdamW):
    """AdamW that records, at each step() (after the loop's clipping and sync), the loop's loss and batch, the
    policy's weights (the ones the loss was computed with) and the reference's, if the loop has one."""

    def __init__(self, params, ns, policy):
        super().__init__(params, lr=1e-3)
        self.ns, self.policy, self.records = ns, policy, []

    def step(self, closure=None):
        ref = self.ns.get("reference")
        record = dict(loss=self.ns["loss"].item(), batch=self.ns["batch"], policy=weights(self.policy))
        self.records.append(record | dict(ref=weights(ref) if ref is not None else None))
        return super().step(closure)


def plain_loop(toy, pairs, marker, k):
    policy = toy_model(toy)
    ns = namespace(marker, policy=policy, batches=plain_batches(pairs), k=k)
    ns["optimizer"] = Recording(policy.parameters(), ns, policy)
    run(marker, ns)
    return policy, ns["optimizer"].records


@pytest.mark.parametrize("k", [1, 2])
def test_the_plain_loop_trains_the_toy_and_syncs_after_clipping_before_each_kth_update(toy, pairs, k):
    policy, records = plain_loop(toy, pairs, "def sync_reference", k)
    initial = weights(toy_model(toy))
    assert len(records) == 4 and not same(weights(policy), initial)  # it trained
    reference = initial  # the reference each step's loss was computed against
    for step, r in enumerate(records):
        loss = ours((policy, r["policy"]), (policy, reference), r["batch"], (-1.5, 1.5))
        assert r["loss"] == pytest.approx(loss, abs=1e-6), f"step {step}"
        if (step + 1) % k == 0:  # synced before this update: the weights the loss was computed with
            assert same(r["ref"], r["policy"]), f"step {step}: not synced"
        else:
            assert same(r["ref"], reference), f"step {step}: the reference moved between syncs"
        reference = r["ref"]
    assert not same(records[-1]["policy"], records[0]["policy"])


def test_the_loop_without_a_reference_model_gives_the_two_model_loops_losses(toy, pairs):
    _, two_models = plain_loop(toy, pairs, "def sync_reference", 2)
    _, one_model = plain_loop(toy, pairs, "def reference_logps_ahead", 2)
    assert [r["loss"] for r in one_model] == pytest.approx([r["loss"] for r in two_models], abs=1e-6)
    assert all(r["ref"] is None for r in one_model)


# ---- the callback in TRL's trainers -----------------------------------------------------------------------------


def trainer_options(**more):
    return dict(
        output_dir=tempfile.mkdtemp(),
        max_steps=4,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        use_cpu=True,
        bf16=False,  # TRL's configs default to bf16 autocast, on a CPU too; this repository's losses are fp32 here
        seed=0,
        disable_tqdm=True,
        **more,
    )


def held(trainer):
    """(the policy's trained weights, the reference's): every weight of the two models, or with a PEFT model and no
    ref_model the weights of its adapter ("default") and of TRL's "ref" adapter, in the same order."""
    if trainer.ref_model is not None:
        return weights(trainer.model), weights(trainer.ref_model)
    named = dict(trainer.model.named_parameters())
    adapter = [n for n in named if ".default." in n]
    assert adapter and all(n.replace(".default.", ".ref.") in named for n in adapter)
    return [named[n].detach().clone() for n in adapter], [
        named[n.replace(".default.", ".ref.")].detach().clone() for n in adapter
    ]


def ours_on(trainer, inputs, log_eps=(None, None)):
    """dpo_loss of the trainer's policy against its reference: its ref_model, or TRL's "ref" adapter switched on."""
    if trainer.ref_model is not None:
        return ours(trainer.model, trainer.ref_model, inputs, log_eps)
    from trl.trainer.utils import use_adapter

    with use_adapter(trainer.model, adapter_name="ref"):
        ref_logps = logps_of(trainer.model, inputs)
    return ours(trainer.model, None, inputs, log_eps, ref_logps)


def recorded(trainer_class, ns, marker):
    """Run the page's block `marker` with `trainer_class.compute_loss` recording, at each step, its inputs, its loss
    and the policy's and the reference's weights as the loss was computed."""
    records, compute_loss = [], trainer_class.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        policy, ref = held(self)
        record = dict(policy=policy, ref=ref, inputs=dict(inputs))
        if "input_ids" in inputs:  # DPO (GRPO's: prompt_ids, completion_ids): ours, on the trainer's own models
            record["ours"] = ours_on(self, inputs)
            record["ours clamped"] = ours_on(self, inputs, (-1.5, 1.5))
        out = compute_loss(self, model, inputs, *args, **kwargs)
        records.append(record | dict(loss=(out[0] if isinstance(out, tuple) else out).item()))
        return out

    with mock.patch.object(trainer_class, "compute_loss", recording):
        run(marker, ns)
    return records, ns["trainer"]


def check_syncs(records, trainer, k):
    """Between two steps the reference takes the policy's pre-update weights on each k-th update, else keeps its
    own; the policy moves at every update."""
    policy, ref = held(trainer)
    after = records[1:] + [dict(ref=ref, policy=policy)]
    for step, (now, then) in enumerate(zip(records, after)):
        assert not same(now["policy"], then["policy"]), f"step {step}: the policy did not train"
        if (step + 1) % k == 0:
            assert same(then["ref"], now["policy"]), f"step {step}: not the policy before the update"
        else:
            assert same(then["ref"], now["ref"]), f"step {step}: the reference moved between syncs"


def synced(trainer_class, ns, marker, k):
    """The page's block `marker` trains 4 steps with the callback syncing every k: its records, syncs checked."""
    records, trainer = recorded(trainer_class, ns, marker)
    assert len(records) == 4
    check_syncs(records, trainer, k)
    return records


def dpo_setup(toy, pairs, marker, k, **more):
    tok, rows, _ = pairs
    config = DPOConfig(**trainer_options(per_device_train_batch_size=4, beta=BETA))
    names = dict(model=toy_model(toy), config=config, dataset=datasets.Dataset.from_list(rows), tokenizer=tok, k=k)
    return namespace(marker, **names, **more)


@pytest.mark.parametrize("k", [1, 2])
def test_the_callback_syncs_trls_dpo_and_its_loss_is_dpo_loss_on_the_same_batch_and_reference(toy, pairs, k):
    ns = dpo_setup(toy, pairs, "trainer = DPOTrainer(model=model, ref_model", k, ref_model=toy_model(toy))
    records = synced(DPOTrainer, ns, "trainer = DPOTrainer(model=model, ref_model", k)
    for step, r in enumerate(records):
        assert r["loss"] == pytest.approx(r["ours"], abs=1e-5), f"step {step}"


@pytest.mark.parametrize("k", [1, 2])
def test_with_lora_the_callback_syncs_trls_ref_adapter_and_the_loss_is_dpo_loss_against_it(toy, pairs, k):
    """The page's LoRA route: the model wrapped by the user, no ref_model, no peft_config; TRL's "ref" adapter holds
    the user's adapter from before each k-th update (compared exactly), and TRL's loss is dpo_loss against it."""
    ns = dpo_setup(toy, pairs, "get_peft_model(model", k)
    records = synced(DPOTrainer, ns, "get_peft_model(model", k)
    assert "ref" in ns["trainer"].model.peft_config
    for step, r in enumerate(records):
        assert r["loss"] == pytest.approx(r["ours"], abs=1e-5), f"step {step}"


def grpo_setup(toy, k, wrap=False, beta=0.04, **more):
    tok = AutoTokenizer.from_pretrained(toy.model)
    with open(toy.prompts_train) as f:
        prompts = [json.loads(line) for line in f][:16]
    config = GRPOConfig(
        **trainer_options(per_device_train_batch_size=8, num_generations=4, max_completion_length=32, beta=beta, **more)
    )
    model = toy_model(toy)
    if wrap:  # as the page's LoRA block wraps it
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    return namespace(
        "trainer = GRPOTrainer(",
        model=model,
        reward=toy_task.reward,  # graded: the groups' rewards differ, so every step has a gradient
        grpo_config=config,
        prompts=datasets.Dataset.from_list(prompts),
        tokenizer=tok,
        k=k,
    )


@pytest.mark.parametrize("wrap, k", [(False, 1), (False, 2), (True, 2)], ids=["ref_model-1", "ref_model-2", "lora-2"])
def test_the_callback_syncs_trls_grpo(toy, k, wrap):  # LoRA at k = 1: DPO's test
    synced(GRPOTrainer, grpo_setup(toy, k, wrap), "trainer = GRPOTrainer(", k)


def test_the_callback_stops_in_one_line_where_a_sync_cannot_work(toy, pairs):
    """When it is made, before training: a peft_config (TRL's reference is then the base model), no reference at all
    (GRPO with beta 0), precomputed reference log-probs (DeepSpeed: the test below)."""
    from peft import LoraConfig

    ns = alone("class HumanlineSync")
    tok, rows, _ = pairs

    def stops(trainer, words):
        with pytest.raises(ValueError, match=f"^HumanlineSync: {words}") as e:
            ns["HumanlineSync"](trainer, sync_every=1)
        assert "\n" not in str(e.value)

    data = datasets.Dataset.from_list(rows)

    def dpo(ref_model=None, peft_config=None, **config):
        args = DPOConfig(**trainer_options(per_device_train_batch_size=4, beta=BETA, **config))
        return DPOTrainer(
            model=toy_model(toy),
            ref_model=ref_model,
            args=args,
            train_dataset=data,
            processing_class=tok,
            peft_config=peft_config,
        )

    stops(dpo(peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")), "no reference to copy into")
    g = grpo_setup(toy, 1, beta=0.0)  # GRPO keeps no reference at beta 0
    names = dict(reward_funcs=g["reward"], args=g["grpo_config"], train_dataset=g["prompts"], processing_class=tok)
    stops(GRPOTrainer(model=g["model"], **names), "no reference to copy into")
    stops(dpo(toy_model(toy), precompute_ref_log_probs=True), "precompute_ref_log_probs=True")


# ---- the clamp in TRL's DPO -------------------------------------------------------------------------------------


def patched_module(module, lines, marker):
    """A copy of `module` whose source has the lines matching `lines` (a regex that matches once, its first group the
    indentation) replaced by the page's block `marker`, indented alike."""
    with open(module.__file__) as f:
        source = f.read()
    assert len(re.findall(lines, source)) == 1, f"TRL's {module.__name__} changed: the page needs updating"
    replace = lambda m: "".join(m.group(1) + line.strip() + "\n" for line in block(marker).splitlines())  # noqa: E731
    patched = importlib.util.module_from_spec(importlib.util.spec_from_loader(module.__name__ + "_humanline", None))
    patched.__package__ = module.__package__
    exec(compile(re.sub(lines, replace, source), module.__file__, "exec"), patched.__dict__)
    return patched


def test_the_pages_clamp_in_trls_dpo_makes_its_loss_humanline_dpo(toy, pairs):
    """The page's three lines in place of the two that set chosen_logratios and rejected_logratios in the installed
    DPOTrainer._compute_loss; the reference starts far from the policy (its weights scaled), so that tokens are
    clamped, and k = 100 keeps it there for the 4 steps."""
    import trl.trainer.dpo_trainer as module

    patched = patched_module(module, r"(?m)^( +)chosen_logratios = .*\n\1rejected_logratios = .*\n", "token_logratios")

    tok, rows, _ = pairs
    ref_model = toy_model(toy)
    with torch.no_grad():
        for name, p in ref_model.named_parameters():
            if "norm" not in name:
                p.mul_(1.3)
    config = DPOConfig(**trainer_options(per_device_train_batch_size=4, beta=BETA))
    data = datasets.Dataset.from_list(rows)
    ns = namespace("trainer = DPOTrainer(model=model, ref_model", model=toy_model(toy), ref_model=ref_model)
    ns.update(config=config, dataset=data, tokenizer=tok, k=100)
    with mock.patch.object(trl, "DPOTrainer", patched.DPOTrainer):
        records, trainer = recorded(patched.DPOTrainer, ns, "trainer = DPOTrainer(model=model, ref_model")
    assert len(records) == 4
    for step, r in enumerate(records):
        assert r["loss"] == pytest.approx(r["ours clamped"], abs=1e-5), f"step {step}"
        assert abs(r["ours clamped"] - r["ours"]) > 1e-3, f"step {step}: no token clamped, the test shows nothing"


# ---- every block alone ------------------------------------------------------------------------------------------

USER_NAMES = {"policy", "batches", "optimizer", "k", "model", "ref_model", "config", "dataset", "tokenizer"}
USER_NAMES |= {"reward", "grpo_config", "prompts", "kto_config", "unpaired"}
TRL_LOCALS = {"per_token_logps", "ref_per_token_logps", "inputs"}  # what the lines put into TRL's method read there


def free_names(code):
    """The names a block reads but neither binds nor imports (nor Python provides)."""
    import ast
    import builtins
    import textwrap

    bound, loaded = set(), set()
    for node in ast.walk(ast.parse(textwrap.dedent(code))):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return loaded - bound - set(dir(builtins))


def test_every_block_imports_what_it_uses_and_names_the_pages_functions_it_needs():
    """Copied alone, a block needs only the user's objects the page names and the functions its first line says it
    uses (the tests above run each block in a namespace holding just those)."""
    with open(PAGE) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 11
    for code in blocks:
        declared = re.match(r"# uses (.+) \(above\)\n", code)
        declared = set(re.findall(r"\w+", declared.group(1))) - {"and"} if declared else set()
        assert free_names(code) <= USER_NAMES | TRL_LOCALS | declared, code
    assert free_names("@torch.no_grad()\ndef f(x):\n    return x\n") == {"torch"}  # what it catches


def test_the_plain_loop_turns_dropout_off_in_both_models():
    """A GPT-2 with dropout 0.1: after the page's set-up the policy (in training mode, as it trains) and its reference
    agree exactly at equal weights; a reference merely put in eval mode does not (mean per-token |log-ratio| 0.055)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, bos_token_id=0, eos_token_id=0)
    policy = GPT2LMHeadModel(config).train()  # dropout 0.1 on embeddings, attention and residuals (GPT-2's)
    with_dropout, eval_only = copy.deepcopy(policy), copy.deepcopy(policy).eval()  # the old page's pair
    ns = alone("def sync_reference", policy=policy, batches=[], k=1, optimizer=None)
    ids = torch.randint(0, 100, (4, 12))
    inputs = (ids, torch.ones_like(ids), torch.ones_like(ids))
    with torch.no_grad():
        logps = [dpo_humanline.token_logps(m, *inputs) for m in (ns["policy"], ns["reference"])]
        old = [dpo_humanline.token_logps(m, *inputs) for m in (with_dropout, eval_only)]
    assert ns["policy"].training and torch.equal(logps[0], logps[1])
    assert (old[0] - old[1]).abs().mean() > 0.01


def test_the_pages_clamp_in_trls_grpo_makes_its_loss_grpo_loss_with_humanline(toy):
    """The page's line in place of the one that sets log_ratio in the installed GRPOTrainer._compute_loss; the reference
    starts far from the policy (its weights scaled, after TRL made it) and k = 100 keeps it there. Each step's loss is
    grpo_loss with the clamp (our log-probs of TRL's completions, its advantages, the step's token count), and a
    clamped token's gradient is the KL term's alone."""
    import trl.trainer.grpo_trainer as module

    patched = patched_module(
        module, r"(?m)^( +)log_ratio = per_token_logps - old_per_token_logps\n", "log_ratio = (per_token"
    )
    ns = grpo_setup(toy, 100, use_bias_correction_kl=False)  # as the page says
    beta, records = ns["grpo_config"].beta, []
    real_train, real_loss = patched.GRPOTrainer.train, patched.GRPOTrainer._compute_loss

    def train(self, *a, **kw):
        with torch.no_grad():
            for name, p in self.ref_model.named_parameters():
                if "norm" not in name:
                    p.mul_(1.3)
        return real_train(self, *a, **kw)

    def completion_logps(model, inputs):
        prompt, completion = inputs["prompt_mask"], inputs["completion_mask"]
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([torch.zeros_like(prompt), completion], 1)
        with torch.no_grad():
            return dpo_humanline.token_logps(model, ids, torch.cat([prompt, completion], 1), mask)[
                :, -completion.size(1) :
            ]

    def ours(policy, ref, inputs):
        mask, n = inputs["completion_mask"].float(), inputs["num_items_in_batch"]
        return grpo_humanline.grpo_loss(policy, ref, ref, mask, inputs["advantages"], 0.2, beta, -1.5, 1.5, n)[0]

    def recording(self, model, inputs):
        policy, ref = completion_logps(self.model, inputs), completion_logps(self.ref_model, inputs)
        out = real_loss(self, model, inputs)
        records.append(
            dict(loss=out.item(), ours=ours(policy, ref, inputs).item(), policy=policy, ref=ref, inputs=inputs)
        )
        return out

    with (
        mock.patch.object(trl, "GRPOTrainer", patched.GRPOTrainer),
        mock.patch.object(patched.GRPOTrainer, "train", train),
        mock.patch.object(patched.GRPOTrainer, "_compute_loss", recording),
    ):
        run("trainer = GRPOTrainer(", ns)
    assert len(records) == 4
    for step, r in enumerate(records):
        assert r["loss"] == pytest.approx(r["ours"], abs=1e-5), f"step {step}"
    r, trainer = records[-1], ns["trainer"]
    mask = r["inputs"]["completion_mask"].bool()
    clamped = ((r["policy"] - r["ref"]).abs() > 1.5) & mask
    assert 0 < clamped.sum() < mask.sum()  # both kinds of token
    leaf = r["policy"].clone().requires_grad_()
    with mock.patch.object(
        trainer, "_get_per_token_logps_and_entropies", return_value=(leaf, torch.zeros_like(leaf), None)
    ):
        (theirs,) = torch.autograd.grad(real_loss(trainer, trainer.model, r["inputs"]), leaf)
    mine = leaf.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(ours(mine, r["ref"], r["inputs"]), mine)
    kl_only = beta * (1 - (r["ref"] - leaf.detach()).exp()) / r["inputs"]["num_items_in_batch"]
    assert torch.allclose(theirs, expected, atol=1e-7)
    assert torch.allclose(theirs[clamped], kl_only[clamped], atol=1e-8)
    assert not torch.allclose(theirs[mask & ~clamped], kl_only[mask & ~clamped], atol=1e-6)  # the ratio acts inside


@pytest.mark.parametrize("k", [1, 2])
def test_the_callback_syncs_trls_kto(toy, pairs, k):
    from trl import KTOConfig, KTOTrainer

    tok, rows, _ = pairs
    unpaired = [
        dict(prompt=r["prompt"], completion=r[c], label=c == "chosen") for r in rows for c in ("chosen", "rejected")
    ]
    ns = namespace(
        "trainer = KTOTrainer(",
        model=toy_model(toy),
        ref_model=toy_model(toy),
        kto_config=KTOConfig(**trainer_options(per_device_train_batch_size=4, beta=BETA)),
        unpaired=datasets.Dataset.from_list(unpaired),
        tokenizer=tok,
        k=k,
    )
    synced(KTOTrainer, ns, "trainer = KTOTrainer(", k)


# ---- the authors' sync, as it executes -------------------------------------------------------------------------


def test_the_authors_sync_as_executed_gives_the_reference_the_weights_after_the_update(toy):
    """docs/paper-runs.md: the authors' math code (open-r1-humanline) keeps `accelerator.get_state_dict(model)` in
    on_pre_optimizer_step of each k-th update and loads it into the reference in on_step_end (re-typed here from that
    description). On one process (and under DDP) get_state_dict hands back the live tensors, not a copy, so the
    optimizer's in-place update reaches them: the reference gets the policy as it is after the update (TR-DPO's rule),
    not as it was before it (humanline's)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class AuthorsSync(TrainerCallback):  # the description's two hooks
        def __init__(self, trainer, reference, k):
            self.trainer, self.reference, self.k, self.kept = trainer, reference, k, None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if (state.global_step + 1) % self.k == 0:
                self.kept = self.trainer.accelerator.get_state_dict(model)

        def on_step_end(self, args, state, control, **kwargs):
            if self.kept is not None:
                self.reference.load_state_dict(self.kept)
                self.kept = None

    class Watch(TrainerCallback):  # after the authors' hooks: the weights before each update, and after its step
        def __init__(self, policy, reference):
            self.policy, self.reference, self.seen = policy, reference, []

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.seen.append(dict(before=weights(self.policy)))

        def on_step_end(self, args, state, control, **kwargs):
            self.seen[-1] |= dict(after=weights(self.policy), ref=weights(self.reference))

    g = torch.Generator().manual_seed(0)
    rows = [dict(input_ids=ids, labels=ids) for ids in torch.randint(3, 17, (16, 12), generator=g).tolist()]
    policy, reference = toy_model(toy), toy_model(toy).eval()
    args = TrainingArguments(**trainer_options(per_device_train_batch_size=4))
    trainer = Trainer(model=policy, args=args, train_dataset=datasets.Dataset.from_list(rows))
    watch = Watch(policy, reference)
    trainer.add_callback(AuthorsSync(trainer, reference, k=2))
    trainer.add_callback(watch)
    trainer.train()
    assert len(watch.seen) == 4
    initial = weights(toy_model(toy))
    for step, s in enumerate(watch.seen):
        assert not same(s["before"], s["after"]), f"step {step}: no update"
        if (step + 1) % 2 == 0:  # the authors' sync steps
            assert same(s["ref"], s["after"]) and not same(s["ref"], s["before"]), f"step {step}"
        else:
            assert same(s["ref"], initial if step == 0 else watch.seen[step - 1]["ref"]), f"step {step}"


def torchrun(helper, nproc, out):
    """tests/support/<helper> on `nproc` processes of one machine, writing to `out`."""
    import subprocess
    import sys

    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = launch + [os.path.join(ROOT, "tests", "support", helper), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---- FSDP2 ------------------------------------------------------------------------------------------------------


def test_under_fsdp2_the_callback_syncs_each_processs_shards_before_each_kth_update(tmp_path):
    """Two gloo processes, the toy's policy and reference each sharded with fully_shard, in Trainer's order of calls
    (tests/support/fsdp_callback_helper.py: Trainer itself does not shard on a CPU). As written, after each k-th
    update the reference holds the policy's weights from before it, and between syncs its own; without the reshard
    line the reference's forward leaves its root gathered and the sync silently misses: the line is what makes it
    work."""
    torchrun("fsdp_callback_helper.py", 2, tmp_path / "out")
    for rank in (0, 1):
        result = json.loads((tmp_path / f"out.{rank}").read_text())
        assert result["page"] == dict(steps=[True] * 4, moved=True), result
        assert result["without_reshard"]["moved"] and not all(result["without_reshard"]["steps"]), result


# ---- DeepSpeed --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_under_deepspeed_the_update_comes_before_the_hook_and_the_callback_stops(tmp_path):
    """DeepSpeed (ZeRO-2) on a CPU under Trainer, one process (tests/support/deepspeed_helper.py): at each step a
    weight already holds the step's update at on_pre_optimizer_step (accelerate runs the engine's step inside
    backward), so a copy there would be TR-DPO's sync; the page's callback, made for that trainer, stops in one line
    saying so."""
    torchrun("deepspeed_helper.py", 1, tmp_path / "out.json")
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["deepspeed"]
    seen = result["seen"]
    assert [hook for hook, _ in seen] == ["begin", "pre_optimizer_step", "end"] * 3
    for step in range(3):
        (_, begin), (_, pre), (_, end) = seen[3 * step : 3 * step + 3]
        assert pre != begin and pre == end, f"step {step}: {seen}"  # updated before the hook, nothing after it
    assert result["stop"] == (
        "HumanlineSync: under DeepSpeed the update happens before on_pre_optimizer_step: the copy would come after it"
    )
