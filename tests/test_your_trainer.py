"""docs/your-trainer.md: every code block of the page, read out of it and run as it stands, on the toy model.

- the clamp equals the scripts' (dpo_loss with its bounds) and a clamped token's gradient is exactly 0;
- the plain loop trains the toy and syncs after clipping, before each k-th update; the loop without a reference
  model gives its losses step by step;
- the callback, on TRL's DPOTrainer and GRPOTrainer with k = 1 and 2: after each k-th update the reference holds
  the policy's weights from before that update (compared exactly), and between syncs it is untouched; each step of
  TRL's DPO loss equals dpo_loss on the same batch, policy and reference;
- the page's clamp for TRL's DPO, put in place of the two lines the page names in the installed TRL's source, makes
  each step's loss dpo_loss with the clamp, while tokens are clamped.
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
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

import dpo_humanline
import plumbing
import toy_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "your-trainer.md")
BETA = 0.1  # DPOConfig's and the page's default


def block(marker):
    """The one ```python block of the page that contains `marker`."""
    with open(PAGE) as f:
        found = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if marker in b]
    assert len(found) == 1, f"{len(found)} code blocks of docs/your-trainer.md hold {marker!r}"
    return found[0]


def run(marker, ns):
    exec(compile(block(marker), PAGE, "exec"), ns)
    return ns


def page(**names):
    """The page's definitions (the clamp, token_logps and the loss, the callback) beside the user's `names`."""
    ns = dict(names)
    for marker in ("def humanline_clamp", "def humanline_dpo_loss", "class HumanlineSync"):
        run(marker, ns)
    return ns


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def ours(policy, reference, inputs, log_eps=(None, None)):
    """This repository's dpo_loss (mean over pairs) of `policy` against `reference` (models, or (model, weights)
    to load into a copy of it) on a batch of chosen rows then rejected rows."""
    logps = []
    for model in (policy, reference):
        if isinstance(model, tuple):
            model, snapshot = copy.deepcopy(model[0]), model[1]
            with torch.no_grad():
                for p, w in zip(model.parameters(), snapshot, strict=True):
                    p.copy_(w)
        with torch.no_grad():
            ids, attention, mask = inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"]
            logps.append(dpo_humanline.token_logps(model, ids, attention, mask).chunk(2))
    masks = inputs["completion_mask"][:, 1:].float().chunk(2)
    loss, _ = dpo_humanline.dpo_loss(*logps[0], *logps[1], *masks, BETA, *log_eps)
    return loss.mean().item()


@pytest.fixture(scope="module")
def pairs(toy):
    """(tokenizer, the first 16 toy pairs as TRL's rows, the same as token ids (prompt, (chosen, rejected)))."""
    tok = AutoTokenizer.from_pretrained(toy.model)
    with open(toy.offline["strong"]) as f:
        rows = [json.loads(line) for line in f][:16]
    ids = plumbing.load_data(dpo_humanline.Args(), "preferences", tok, toy, SimpleNamespace(rank=0))[:16]
    return tok, [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows], ids


def toy_model(toy):
    return AutoModelForCausalLM.from_pretrained(toy.model, dtype=torch.float32)


# ---- the clamp ------------------------------------------------------------------------------------------------


def test_the_clamp_is_the_scripts_and_a_clamped_token_passes_no_gradient():
    ns = page()
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
    ns = page(policy=policy, batches=plain_batches(pairs), k=k)
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


def recorded(trainer_class, ns, marker):
    """Run the page's block `marker` with `trainer_class.compute_loss` recording, at each step, its inputs, its loss
    and the policy's and the reference's weights as the loss was computed."""
    records, compute_loss = [], trainer_class.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        record = dict(policy=weights(self.model), ref=weights(self.ref_model), inputs=dict(inputs))
        if "input_ids" in inputs:  # DPO (GRPO's: prompt_ids, completion_ids): ours, on the trainer's own models
            record["ours"] = ours(self.model, self.ref_model, inputs)
            record["ours clamped"] = ours(self.model, self.ref_model, inputs, (-1.5, 1.5))
        out = compute_loss(self, model, inputs, *args, **kwargs)
        records.append(record | dict(loss=(out[0] if isinstance(out, tuple) else out).item()))
        return out

    with mock.patch.object(trainer_class, "compute_loss", recording):
        run(marker, ns)
    return records, ns["trainer"]


def check_syncs(records, trainer, k):
    """Between two steps the reference takes the policy's pre-update weights on each k-th update, else keeps its
    own; the policy moves at every update."""
    after = records[1:] + [dict(ref=weights(trainer.ref_model), policy=weights(trainer.model))]
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


@pytest.mark.parametrize("k", [1, 2])
def test_the_callback_syncs_trls_dpo_and_its_loss_is_dpo_loss_on_the_same_batch_and_reference(toy, pairs, k):
    tok, rows, _ = pairs
    config = DPOConfig(**trainer_options(per_device_train_batch_size=4, beta=BETA))
    ns = page(
        model=toy_model(toy),
        ref_model=toy_model(toy),
        config=config,
        dataset=datasets.Dataset.from_list(rows),
        tokenizer=tok,
        k=k,
    )
    records = synced(DPOTrainer, ns, "trainer = DPOTrainer(", k)
    for step, r in enumerate(records):
        assert r["loss"] == pytest.approx(r["ours"], abs=1e-5), f"step {step}"


@pytest.mark.parametrize("k", [1, 2])
def test_the_callback_syncs_trls_grpo(toy, k):
    tok = AutoTokenizer.from_pretrained(toy.model)
    with open(toy.prompts_train) as f:
        prompts = [json.loads(line) for line in f][:16]
    config = GRPOConfig(
        **trainer_options(per_device_train_batch_size=8, num_generations=4, max_completion_length=32, beta=0.04)
    )
    ns = page(
        model=toy_model(toy),
        reward=toy_task.reward,  # graded: the groups' rewards differ, so every step has a gradient
        grpo_config=config,
        prompts=datasets.Dataset.from_list(prompts),
        tokenizer=tok,
        k=k,
    )
    synced(GRPOTrainer, ns, "trainer = GRPOTrainer(", k)


# ---- the clamp in TRL's DPO -------------------------------------------------------------------------------------


def test_the_pages_clamp_in_trls_dpo_makes_its_loss_humanline_dpo(toy, pairs):
    """The page's three lines in place of the two that set chosen_logratios and rejected_logratios in the installed
    DPOTrainer._compute_loss; the reference starts far from the policy (its weights scaled), so that tokens are
    clamped, and k = 100 keeps it there for the 4 steps."""
    import trl.trainer.dpo_trainer as module

    with open(module.__file__) as f:
        source = f.read()
    two_lines = r"(?m)^( +)chosen_logratios = .*\n\1rejected_logratios = .*\n"
    assert len(re.findall(two_lines, source)) == 1, "TRL's DPOTrainer._compute_loss changed: the page needs updating"
    replace = lambda m: "".join(m.group(1) + line.strip() + "\n" for line in block("token_logratios").splitlines())  # noqa: E731
    patched = importlib.util.module_from_spec(importlib.util.spec_from_loader(module.__name__ + "_humanline", None))
    patched.__package__ = module.__package__
    changed, count = re.subn(two_lines, replace, source)
    assert count == 1 and "token_logratios" in changed
    exec(compile(changed, module.__file__, "exec"), patched.__dict__)

    tok, rows, _ = pairs
    ref_model = toy_model(toy)
    with torch.no_grad():
        for name, p in ref_model.named_parameters():
            if "norm" not in name:
                p.mul_(1.3)
    config = DPOConfig(**trainer_options(per_device_train_batch_size=4, beta=BETA))
    ns = page(model=toy_model(toy), ref_model=ref_model, config=config, dataset=datasets.Dataset.from_list(rows))
    ns.update(tokenizer=tok, k=100)
    with mock.patch.object(trl, "DPOTrainer", patched.DPOTrainer):
        records, trainer = recorded(patched.DPOTrainer, ns, "trainer = DPOTrainer(")
    assert len(records) == 4
    for step, r in enumerate(records):
        assert r["loss"] == pytest.approx(r["ours clamped"], abs=1e-5), f"step {step}"
        assert abs(r["ours clamped"] - r["ours"]) > 1e-3, f"step {step}: no token clamped, the test shows nothing"
