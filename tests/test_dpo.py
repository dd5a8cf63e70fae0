"""Tests of dpo_humanline.py: the loss against hand-computed values, gradients of clamped tokens,
the order of syncing around the optimizer step, online pairing, data validation, collation, and
end-to-end runs on the toy task (every mode and ablation, two processes = one, resume)."""

import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import sys
from types import SimpleNamespace

import pytest
import runs
import torch
import torch.nn.functional as F
import warm
from conftest import make_session
from paths import ROOT
from runs import ENV
from test_formats import parsed
from transformers import AutoModelForCausalLM, AutoTokenizer

import data_formats
import dpo_humanline
import grpo_humanline
import kto_humanline
import plumbing
import ref_free
import toy_task
from data_formats import encode_rows
from dpo_humanline import Args, ReferenceModel, collate, dpo_loss, optimizer_step, token_logps


def encode_pairs(rows, tok, args):
    """Preference rows as DPO trains on them: [(prompt_ids, chosen_ids, rejected_ids)], and what was cut."""
    encoded, cut = encode_rows(rows, tok, args, "data.jsonl")
    return [(p, c, r) for p, (c, r), _ in encoded], {f"truncated_{k}": v for k, v in cut.items()}


def as_text(value, row, column, tok, prompt=None):
    return data_formats.as_text(value, f"data.jsonl: row {row}, column '{column}'", tok, prompt)


def best_worst_pairs(prompts, completions, scores, n, threshold):
    """Algorithm 1's pairing of n samples per prompt, as (prompt, chosen, rejected) rows."""
    groups = [(p, completions[i * n : (i + 1) * n], scores[i * n : (i + 1) * n]) for i, p in enumerate(prompts)]
    return [
        {"prompt": p, "chosen": c, "rejected": r} for p, (c, r), _ in dpo_humanline.best_worst_pairs(groups, threshold)
    ]


def session(out, policy, ref, opt, sched, tok, resume=False, step=0):
    return make_session(dpo_humanline, out, policy, ref, opt, sched, tok, resume, step)


torch.set_num_threads(1)
LOG2 = math.log(2.0)


def neg_log_sigmoid(x: float) -> float:
    return math.log1p(math.exp(-x))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------------------------
# dpo_loss: hand-computed values and gradients
# ----------------------------------------------------------------------------------------------

# (batch 2, seq 3); token log-ratios policy - ref, written out:
#   chosen   [[0.5, -1.8, 5.0 (masked)], [-0.2, -3.0, 2.0]]
#   rejected [[-1.0 (masked), 2.0, -2.0], [-0.1, 0.1, -2.0]]
POL_C = [[-1.0, -2.0, 4.3], [-0.3, -4.0, -1.0]]
REF_C = [[-1.5, -0.2, -0.7], [-0.1, -1.0, -3.0]]
POL_R = [[-2.0, -1.0, -3.0], [-0.5, -0.5, -2.5]]
REF_R = [[-1.0, -3.0, -1.0], [-0.4, -0.6, -0.5]]
MASK_C = [[1, 1, 0], [1, 1, 1]]
MASK_R = [[0, 1, 1], [1, 1, 1]]
BETA = 0.5
LO, HI = -1.5, 1.5


def hand_sums(pol, ref, mask, lo=None, hi=None):
    """Summed (optionally clamped) token log-ratios, in plain Python."""
    out = []
    for p_row, r_row, m_row in zip(pol, ref, mask):
        total = 0.0
        for p, r, m in zip(p_row, r_row, m_row):
            x = p - r
            if lo is not None:
                x = min(max(x, lo), hi)
            total += x * m
        out.append(total)
    return out


def loss_inputs(requires_grad=False):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    pc, pr = t(POL_C).requires_grad_(requires_grad), t(POL_R).requires_grad_(requires_grad)
    return pc, pr, t(REF_C), t(REF_R), t(MASK_C), t(MASK_R)


def test_hand_sums_are_what_the_comments_say():
    assert hand_sums(POL_C, REF_C, MASK_C) == pytest.approx([-1.3, -1.2])
    assert hand_sums(POL_R, REF_R, MASK_R) == pytest.approx([0.0, -2.0])
    assert hand_sums(POL_C, REF_C, MASK_C, LO, HI) == pytest.approx([-1.0, -0.2])
    assert hand_sums(POL_R, REF_R, MASK_R, LO, HI) == pytest.approx([0.0, -1.5])


@pytest.mark.parametrize("clamp", [False, True], ids=["unclamped", "clamped"])
def test_dpo_loss_matches_hand_computed_values(clamp):
    bounds = (LO, HI) if clamp else (None, None)
    r_w = hand_sums(POL_C, REF_C, MASK_C, *bounds)
    r_l = hand_sums(POL_R, REF_R, MASK_R, *bounds)
    expected = [neg_log_sigmoid(BETA * (w - lo)) for w, lo in zip(r_w, r_l)]

    losses, metrics = dpo_loss(*loss_inputs(), BETA, *bounds)
    assert losses.shape == (2,)
    assert losses.tolist() == pytest.approx(expected, rel=1e-12)
    assert metrics["rewards/chosen"].tolist() == pytest.approx([BETA * w for w in r_w], rel=1e-12)
    assert metrics["rewards/rejected"].tolist() == pytest.approx([BETA * lo for lo in r_l], rel=1e-12, abs=1e-15)
    assert metrics["rewards/margins"].tolist() == pytest.approx([BETA * (w - lo) for w, lo in zip(r_w, r_l)], rel=1e-12)
    assert metrics["rewards/accuracies"].tolist() == [float(w > lo) for w, lo in zip(r_w, r_l)]


def test_clamping_changes_the_loss_and_one_bound_alone_does_not_clamp():
    unclamped, _ = dpo_loss(*loss_inputs(), BETA)
    clamped, _ = dpo_loss(*loss_inputs(), BETA, LO, HI)
    assert not torch.allclose(unclamped, clamped)
    # the hand values: row 0 margin -1.3 -> -1.0; row 1 margin 0.8 -> 1.3
    assert clamped.tolist() == pytest.approx([neg_log_sigmoid(-0.5), neg_log_sigmoid(0.65)])
    assert unclamped.tolist() == pytest.approx([neg_log_sigmoid(-0.65), neg_log_sigmoid(0.4)])
    only_lower, _ = dpo_loss(*loss_inputs(), BETA, LO, None)
    assert torch.equal(only_lower, unclamped)


def test_clamped_tokens_pass_no_gradient():
    pc, pr, rc, rr, mc, mr = loss_inputs(requires_grad=True)
    losses, _ = dpo_loss(pc, pr, rc, rr, mc, mr, BETA, LO, HI)
    losses.sum().backward()
    r_w = hand_sums(POL_C, REF_C, MASK_C, LO, HI)
    r_l = hand_sums(POL_R, REF_R, MASK_R, LO, HI)
    for grad, pol, ref, mask, sign in ((pc.grad, POL_C, REF_C, MASK_C, -1.0), (pr.grad, POL_R, REF_R, MASK_R, 1.0)):
        for i in range(2):
            # d/dr_w of -log sigmoid(beta (r_w - r_l)) = -beta sigmoid(-margin); +beta sigmoid(-margin) for r_l
            inside = sign * BETA * sigmoid(-BETA * (r_w[i] - r_l[i]))
            for j in range(3):
                x = pol[i][j] - ref[i][j]
                if mask[i][j] and LO < x < HI:
                    assert grad[i, j].item() == pytest.approx(inside, rel=1e-12), (i, j)
                    assert grad[i, j].item() != 0.0
                else:  # masked or clamped: exactly zero
                    assert grad[i, j].item() == 0.0, (i, j, x, mask[i][j])
    # the data has both kinds of zero-gradient tokens and some live ones
    assert (pc.grad != 0).sum().item() == 2 and (pr.grad != 0).sum().item() == 2


def test_without_bounds_every_unmasked_token_gets_gradient():
    pc, pr, rc, rr, mc, mr = loss_inputs(requires_grad=True)
    losses, _ = dpo_loss(pc, pr, rc, rr, mc, mr, BETA)
    losses.sum().backward()
    assert torch.equal(pc.grad != 0, mc.bool())
    assert torch.equal(pr.grad != 0, mr.bool())


def test_clamped_fraction_counts_completion_tokens_outside_the_range():
    pc, pr, rc, rr, mc, mr = loss_inputs()
    frac = plumbing.clamped_fraction(pc, rc, mc, LO, HI)
    # chosen row 0: of (0.5, -1.8) one is outside; row 1: (-0.2, -3.0, 2.0) two are outside
    assert frac.tolist() == pytest.approx([1 / 2, 2 / 3])


# ----------------------------------------------------------------------------------------------
# optimizer_step and the reference's sync: what the reference holds, and when
# ----------------------------------------------------------------------------------------------


def linear_setup(lr=0.1):
    torch.manual_seed(0)
    policy = torch.nn.Linear(3, 2)
    ref = ReferenceModel(copy.deepcopy(policy), rt=None)
    opt = torch.optim.SGD(policy.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return policy, ref, opt, sched


def weights(model):  # a model's, or a reference model's
    return [p.detach().clone() for p in getattr(model, "model", model).parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def backward(policy, t):
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(t))
    (policy(x) ** 2).sum().backward()


def test_the_reference_models_sync_copies_weights_in_place():
    policy, ref, *_ = linear_setup()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    ref_storage = [p.data_ptr() for p in ref.model.parameters()]
    ref.sync(policy, step=0)
    assert same(weights(ref), weights(policy))
    assert [p.data_ptr() for p in ref.model.parameters()] == ref_storage
    with torch.no_grad():  # a copy, not shared storage
        next(policy.parameters()).add_(1.0)
    assert not same(weights(ref), weights(policy))


@pytest.mark.parametrize("sync", ["humanline", "trust_region"])
def test_sync_every_step_holds_the_weights_before_or_after_the_update(sync):
    policy, ref, opt, sched = linear_setup()
    for t in range(3):
        backward(policy, t)
        before = weights(policy)
        optimizer_step(policy, ref, opt, sched, 1e9, sync, 1, t)
        after = weights(policy)
        assert not same(before, after)
        if sync == "humanline":  # the reference is the policy before update t
            assert same(weights(ref), before) and not same(weights(ref), after)
        else:  # trust region: the reference equals the updated policy
            assert same(weights(ref), after) and not same(weights(ref), before)


@pytest.mark.parametrize("sync", ["humanline", "trust_region", "none"])
def test_sync_every_k_copies_at_the_right_steps(sync):
    policy, ref, opt, sched = linear_setup()
    changed = []
    for t in range(7):
        backward(policy, t)
        before, ref_before = weights(policy), weights(ref)
        optimizer_step(policy, ref, opt, sched, 1e9, sync, 3, t)
        after = weights(policy)
        if not same(weights(ref), ref_before):
            changed.append(t)
            assert same(weights(ref), before if sync == "humanline" else after)
    assert changed == ([] if sync == "none" else [2, 5])


@pytest.mark.parametrize("module", [dpo_humanline, kto_humanline, grpo_humanline], ids=["dpo", "kto", "grpo"])
@pytest.mark.parametrize("sync", ["humanline", "trust_region"])
@pytest.mark.parametrize("why", ["loss", "grad"])
def test_a_skipped_step_leaves_out_the_update_not_the_sync(module, sync, why):
    """A non-finite loss (skip=True) or gradient skips the update, never the sync: the reference's schedule depends on
    the step alone, so a skipped step k - 1 still makes the reference the policy as it is."""
    policy, ref, opt, sched = linear_setup()
    with torch.no_grad():  # a reference that differs from the policy
        for p in ref.model.parameters():
            p.add_(1.0)
    backward(policy, 0)
    if why == "grad":
        next(policy.parameters()).grad[0, 0] = float("nan")
    before = weights(policy)
    module.optimizer_step(policy, ref, opt, sched, 1e9, sync, 1, 0, skip=why == "loss")
    assert same(weights(policy), before)  # no update
    assert same(weights(ref), before)  # the sync happened


@pytest.mark.parametrize("module", [dpo_humanline, kto_humanline, grpo_humanline], ids=["dpo", "kto", "grpo"])
@pytest.mark.parametrize(
    "sync,reset,expected",
    [
        ("humanline", 0, [0, 0, 0, 2, 2, 2, 5, 5, 5]),
        ("trust_region", 0, [0, 0, 0, 3, 3, 3, 6, 6, 6]),
        ("none", 0, [0] * 9),
        ("humanline", 4, [4, 4, 5, 5, 5]),  # an online round started at step 4
    ],
)
def test_the_reference_free_reference_is_the_policy_optimizer_step_syncs_it_to(module, sync, reset, expected):
    """k = 3, each update adding 1 to a one-weight policy, so that the weight as step t began is t. The log-probs that
    ref_free.PolicyAsReference serves at step t are those of the policy as step reference(t) began: humanline syncs
    before updates 2 and 5 (steps 3-5 see the policy as step 2 began), trust region after them; a reset starts it."""
    policy = torch.nn.Linear(1, 1, bias=False)
    policy.weight.data.fill_(float(reset))
    rt = SimpleNamespace(rank=0, device=torch.device("cpu"), autocast=contextlib.nullcontext)
    rt.head_dtype = torch.float32
    read = lambda model, *inputs: model.weight.detach().clone()  # noqa: E731 (the "log-probs": the weight)
    due = None if sync == "none" else lambda s: module.sync_due(s, 3)  # the script's schedule, as main passes it
    reference = ref_free.PolicyAsReference(policy, lambda s: [()], read, rt, due, max_steps=9)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    reference.reset(policy, step=reset)
    got = []
    for t in range(reset, 9):
        got.append(reference.logps(t, 0, (torch.zeros(1, 2),)).item())  # input_ids (1, 2): "log-probs" (1, 1)
        policy.weight.grad = torch.full_like(policy.weight, -1.0)
        module.optimizer_step(policy, reference, opt, sched, 1e9, sync, 3, t)
    assert got == expected


@pytest.mark.parametrize("module", [dpo_humanline, kto_humanline, grpo_humanline], ids=["dpo", "kto", "grpo"])
def test_each_script_hands_the_reference_free_reference_the_sync_schedule_of_its_flags(module):
    """The default reference computes the log-probs of the steps a snapshot serves, up to the next sync: each script
    hands it sync_due's steps under either --sync (humanline before the update, trust_region after it) and none
    without, so that a snapshot at step 0 computes the steps up to the first sync and no more (without a schedule it
    would compute every remaining step at each sync: the same values, max_steps / k times the forwards)."""
    name = module.__name__.split("_")[0]
    rt, policy = SimpleNamespace(rank=0, head_dtype=torch.float32), torch.nn.Linear(1, 1)
    for sync, k, due in [
        ("none", 1, []),
        ("humanline", 1, [*range(12)]),
        ("humanline", 3, [2, 5, 8, 11]),
        ("trust_region", 1, [*range(12)]),
        ("trust_region", 4, [3, 7, 11]),
    ]:
        args = parsed(name, ["--max_steps", "12", "--sync", sync, "--sync_every", str(k)])
        made = module.make_reference(args, policy, rt, lambda s: None, *([False] if module is grpo_humanline else []))
        reference = made[0] if module is grpo_humanline else made  # GRPO's: (reference, the KL's baseline)
        assert type(reference) is ref_free.PolicyAsReference
        assert [s for s in range(12) if reference.due and reference.due(s)] == due, (sync, k)
        assert list(reference.served_from(0)) == [*range((due or [11])[0] + 1)], (sync, k)


def test_sync_none_every_step_never_touches_the_reference():
    policy, ref, opt, sched = linear_setup()
    initial = weights(ref)
    for t in range(4):
        backward(policy, t)
        optimizer_step(policy, ref, opt, sched, 1e9, "none", 1, t)
    assert same(weights(ref), initial)
    assert not same(weights(policy), initial)


@pytest.mark.parametrize("sync", ["humanline", "trust_region"])
def test_gradients_are_clipped_before_the_sync_and_the_update(sync, monkeypatch):
    lr, max_norm = 0.1, 0.01
    policy, ref, opt, sched = linear_setup(lr)
    backward(policy, 0)
    grads = [p.grad.clone() for p in policy.parameters()]
    pre_norm = math.sqrt(sum((g.double() ** 2).sum().item() for g in grads))
    assert pre_norm > 10 * max_norm
    before = weights(policy)
    seen = []
    real_sync = ref.sync

    def spy(p, step):
        gs = [q.grad for q in p.parameters()]
        norm = None if any(g is None for g in gs) else math.sqrt(sum((g.double() ** 2).sum().item() for g in gs))
        seen.append((norm, weights(p)))
        return real_sync(p, step)

    monkeypatch.setattr(ref, "sync", spy)
    norm = optimizer_step(policy, ref, opt, sched, max_norm, sync, 1, 0)
    assert ref.seconds > 0
    after = weights(policy)
    assert float(norm) == pytest.approx(pre_norm, rel=1e-6)  # the returned norm is the pre-clip norm
    assert len(seen) == 1
    grad_norm_at_sync, weights_at_sync = seen[0]
    if sync == "humanline":  # after clipping, before the step
        assert grad_norm_at_sync == pytest.approx(max_norm, rel=1e-4)
        assert same(weights_at_sync, before)
    else:  # after the step (and after zero_grad)
        assert grad_norm_at_sync is None
        assert same(weights_at_sync, after)
    # the update used the clipped gradient
    scale = max_norm / (pre_norm + 1e-6)
    for b, a, g in zip(before, after, grads):
        torch.testing.assert_close(a, b - lr * scale * g, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in policy.parameters())


# ----------------------------------------------------------------------------------------------
# Online pairing
# ----------------------------------------------------------------------------------------------


def test_best_worst_pairs_keeps_gaps_at_least_the_threshold():
    prompts = ["a", "b", "c", "d"]
    completions = ["a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1", "c2", "d0", "d1", "d2"]
    scores = [
        0.5,
        0.9,
        0.1,  # a: best a1, worst a2, gap 0.8
        0.75,
        0.5,
        0.25,  # b: gap exactly 0.5 -> kept
        0.25,
        0.7,
        0.74,  # c: gap 0.49 -> dropped
        1.0,
        0.0,
        0.6,
    ]  # d: best d0, worst d1
    rows = best_worst_pairs(prompts, completions, scores, 3, 0.5)
    assert rows == [
        {"prompt": "a", "chosen": "a1", "rejected": "a2"},
        {"prompt": "b", "chosen": "b0", "rejected": "b2"},
        {"prompt": "d", "chosen": "d0", "rejected": "d1"},
    ]
    just_above = math.nextafter(0.5, 1.0)
    assert [r["prompt"] for r in best_worst_pairs(prompts, completions, scores, 3, just_above)] == ["a", "d"]


def test_best_worst_pairs_groups_n_samples_per_prompt():
    completions = ["x0", "x1", "y0", "y1", "z0", "z1"]
    scores = [0.0, 1.0, 0.9, 0.2, 0.3, 0.8]
    assert best_worst_pairs(["x", "y", "z"], completions, scores, 2, 0.5) == [
        {"prompt": "x", "chosen": "x1", "rejected": "x0"},
        {"prompt": "y", "chosen": "y0", "rejected": "y1"},
        {"prompt": "z", "chosen": "z1", "rejected": "z0"},
    ]
    # the same flat list read as 2 prompts x 3 samples: [x0 x1 y0] and [y1 z0 z1]
    assert best_worst_pairs(["p", "q"], completions, scores, 3, 0.5) == [
        {"prompt": "p", "chosen": "x1", "rejected": "x0"},
        {"prompt": "q", "chosen": "z1", "rejected": "y1"},
    ]
    # identical best and worst text is never a pair
    assert best_worst_pairs(["w"], ["same", "same"], [0.0, 1.0], 2, 0.5) == []


# ----------------------------------------------------------------------------------------------
# Data: validation, chat templates, truncation
# ----------------------------------------------------------------------------------------------

PROMPT = "123+789="
RIGHT = "3+9+0=12;2+8+1=11;1+7+1=09>0912"
DROPPED = "3+9+0=02;2+8+0=10;1+7+1=09>0902"


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def good_row():
    return {"prompt": PROMPT, "chosen": RIGHT, "rejected": DROPPED}


def test_plain_rows_tokenise_to_prompt_and_completion_with_eos(tok):
    pairs, counts = encode_pairs([good_row()], tok, Args())
    ((p, c, r),) = pairs
    assert p == ids(tok, PROMPT) and len(p) == len(PROMPT)  # one token per character, no BOS
    assert c == ids(tok, RIGHT) + [tok.eos_token_id]
    assert r == ids(tok, DROPPED) + [tok.eos_token_id]
    assert counts == {"truncated_prompts": 0, "truncated_completions": 0, "truncated_unknown tokens": 0}


@pytest.mark.parametrize("column", ["prompt", "chosen", "rejected"])
@pytest.mark.parametrize("how", ["absent", "None"])
def test_missing_column_names_row_and_column(tok, column, how):
    bad = good_row()
    if how == "absent":
        del bad[column]
    else:
        bad[column] = None
    with pytest.raises(SystemExit, match=rf"row 1\b.*'{column}'"):
        encode_pairs([good_row(), bad], tok, Args())


@pytest.mark.parametrize("column", ["prompt", "chosen", "rejected"])
@pytest.mark.parametrize("text", ["", "  "])
def test_empty_text_is_rejected(tok, column, text):
    bad = good_row() | {column: text}
    with pytest.raises(SystemExit, match=rf"row 0, column '{column}': empty"):
        encode_pairs([bad], tok, Args())


def test_identical_completions_are_rejected(tok):
    with pytest.raises(SystemExit, match=r"row 2, columns 'chosen'/'rejected': identical"):
        encode_pairs([good_row(), good_row(), good_row() | {"rejected": RIGHT}], tok, Args())


def conversational(row, history=()):
    return {
        "prompt": [*history, {"role": "user", "content": row["prompt"]}],
        "chosen": [{"role": "assistant", "content": row["chosen"]}],
        "rejected": [{"role": "assistant", "content": row["rejected"]}],
    }


def test_conversational_rows_equal_plain_strings_on_the_toy_template(tok):
    plain = [good_row(), {"prompt": "1+2=", "chosen": "2+1+0=03>003", "rejected": "9"}]
    conv = [conversational(r) for r in plain]
    assert encode_pairs(conv, tok, Args()) == encode_pairs(plain, tok, Args())
    # multi-turn: the template concatenates the contents and ends assistant turns with <eos>
    history = [
        {"role": "system", "content": "0"},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
    ]
    (multi,), _ = encode_pairs([conversational(good_row(), history)], tok, Args())
    assert [multi] == encode_pairs([good_row() | {"prompt": "01+1=2<eos>" + PROMPT}], tok, Args())[0]
    assert multi[0] == ids(tok, "01+1=2") + [tok.eos_token_id] + ids(tok, PROMPT)


def test_as_text_of_a_conversational_completion_is_the_templated_suffix(tok):
    prompt = [{"role": "user", "content": PROMPT}]
    assert as_text(prompt, 0, "prompt", tok) == PROMPT
    assert as_text([{"role": "assistant", "content": RIGHT}], 0, "chosen", tok, prompt=prompt) == RIGHT + "<eos>"
    with pytest.raises(SystemExit, match="row 0, column 'chosen': a text completion needs a text prompt"):
        as_text(RIGHT, 0, "chosen", tok, prompt=prompt)


@pytest.mark.parametrize(
    "message, match",
    [
        ({"content": "12"}, "role"),
        ({"role": "robot", "content": "12"}, "role"),
        ("12", "role"),
        ({"role": "assistant", "content": 12}, "content"),
        ({"role": "assistant"}, "content"),
    ],
)
def test_malformed_messages_name_row_and_column(tok, message, match):
    bad = conversational(good_row()) | {"rejected": [message]}
    with pytest.raises(SystemExit, match=rf"row 1, column 'rejected'.*{match}"):
        encode_pairs([conversational(good_row()), bad], tok, Args())


@pytest.mark.parametrize("value", [[], 12, {"role": "user", "content": "1"}])
def test_non_text_values_name_row_and_column(tok, value):
    with pytest.raises(SystemExit, match="row 0, column 'chosen'"):
        encode_pairs([good_row() | {"chosen": value}], tok, Args())


def test_conversational_completion_needs_conversational_prompt(tok):
    bad = good_row() | {"chosen": [{"role": "assistant", "content": RIGHT}]}
    with pytest.raises(SystemExit, match="row 0, column 'chosen'.*conversational prompt"):
        encode_pairs([bad], tok, Args())


def truncation_rows():
    return [
        {"prompt": PROMPT, "chosen": "3+9+0=12", "rejected": "1+1"},  # prompt 8 > 4; chosen 4 + 9 > 10
        {"prompt": "1+2=", "chosen": "3", "rejected": "4"},  # nothing to cut
    ]


def test_truncation_keeps_the_prompt_end_and_the_completion_start(tok):
    args = Args(max_prompt_length=4, max_length=10)
    pairs, counts = encode_pairs(truncation_rows(), tok, args)
    (p, c, r), (p2, c2, r2) = pairs
    assert p == ids(tok, "789=")
    assert c == ids(tok, "3+9+0=")  # 4 + 6 = max_length; the <eos> is cut too
    assert r == ids(tok, "1+1") + [tok.eos_token_id]
    assert (p2, c2, r2) == (ids(tok, "1+2="), ids(tok, "3<eos>"), ids(tok, "4<eos>"))
    assert all(len(a) + len(b) <= args.max_length for a, b, d in pairs for b in (b, d))
    assert counts["truncated_completions"] == 1
    assert counts["truncated_prompts"] >= 1


def test_truncated_prompts_are_counted_once_per_row(tok):
    _, counts = encode_pairs(truncation_rows(), tok, Args(max_prompt_length=4, max_length=10))
    assert counts == {"truncated_prompts": 1, "truncated_completions": 1, "truncated_unknown tokens": 0}


def test_prompt_longer_than_max_length_never_yields_an_overlong_sequence(tok):
    args = Args(max_prompt_length=512, max_length=6)  # prompt (8 tokens) fits max_prompt_length, not max_length
    pairs, counts = encode_pairs([good_row()], tok, args)
    ((p, c, r),) = pairs
    # the prompt keeps its last 5 tokens, leaving room for one completion token each
    assert p == ids(tok, PROMPT)[-5:] and len(c) == len(r) == 1
    assert counts == {"truncated_prompts": 1, "truncated_completions": 2, "truncated_unknown tokens": 0}


# ----------------------------------------------------------------------------------------------
# collate and token_logps
# ----------------------------------------------------------------------------------------------


def test_collate_pads_to_the_longest_sequence_and_masks_the_completion():
    seqs = [([5, 6], [7, 8, 9]), ([5], [7]), ([5, 6, 7], [8])]
    input_ids, attn, mask = collate(seqs, 0, torch.device("cpu"))
    assert input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 7, 0, 0, 0], [5, 6, 7, 8, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0], [0, 0, 0, 1, 0]]
    assert collate(seqs[1:2], 3, torch.device("cpu"))[0].shape == (1, 2)  # no padding at all


def test_token_logps_equals_an_independent_log_softmax(tok, toy_model):
    rows = [good_row(), {"prompt": "1+2=", "chosen": "2+1+0=03>003", "rejected": "9"}]
    pairs, _ = encode_pairs(rows, tok, Args())
    seqs = [(p, c) for p, c, _ in pairs] + [(p, r) for p, _, r in pairs]
    input_ids, attn, mask = collate(seqs, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        got = token_logps(toy_model, input_ids, attn, mask)
        logits = toy_model(input_ids=input_ids, attention_mask=attn).logits
    assert got.shape == (4, input_ids.shape[1] - 1)
    ref = F.log_softmax(logits.double(), -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(got.double(), ref * mask[:, 1:].double(), rtol=1e-5, atol=1e-5)
    assert ((got != 0) == mask[:, 1:].bool()).all()  # completion tokens only (logps are never exactly 0 here)
    # each sequence alone, without padding, gives the same values: padding does not leak
    for j, (p, c) in enumerate(seqs):
        alone = torch.tensor([p + c])
        with torch.no_grad():
            lp = (
                F.log_softmax(toy_model(input_ids=alone).logits.double(), -1)[0, :-1]
                .gather(-1, alone[0, 1:, None])
                .squeeze(-1)
            )
        n = len(p) + len(c) - 1
        torch.testing.assert_close(got[j, len(p) - 1 : n].double(), lp[len(p) - 1 :], rtol=1e-4, atol=1e-4)
        assert got[j, n:].abs().sum() == 0 and got[j, : len(p) - 1].abs().sum() == 0


# ----------------------------------------------------------------------------------------------
# End to end on the toy task: each run a subprocess, shared between the tests that need it
# ----------------------------------------------------------------------------------------------

STEPS = 4
BASE = runs.short(STEPS)
ROUNDS = ["--round_size", "32", "--num_samples", "4"]  # online sampling's (offline they stop the run)


def launch(extra, out, nproc=1):
    flags = [*BASE, *ROUNDS * ("--online" in extra), "--micro_batch_size", str(4 // nproc), *extra]
    return runs.run("dpo_humanline.py", flags, out, nproc)


@pytest.fixture(scope="module")
def dpo_run(toy, tmp_path_factory):
    """run(extra_args, nproc) -> Run, each distinct command run once per module."""
    cache = {}

    def run(extra, nproc=1):
        key = (tuple(extra), nproc)
        if key not in cache:
            cache[key] = launch(extra, tmp_path_factory.mktemp("dpo"), nproc)
        return cache[key]

    return run


HUMANLINE = ["--humanline", "--save_every", "2"]  # shared by the e2e, two-process and resume tests
SYNC_ONLY_K2 = ["--sync", "humanline", "--clip", "none", "--sync_every", "2"]  # shared by the e2e and two-process tests
E2E = {
    "offline": [],
    "offline-humanline": HUMANLINE,
    "online": ["--online"],
    "online-humanline": ["--online", "--humanline"],
    "sync_trust_region": ["--sync", "trust_region"],
    "sync_humanline-clip_none": SYNC_ONLY_K2,
    "clip_clamp": ["--clip", "clamp"],
    "clip_sampling": ["--clip", "sampling"],
}

MODES = {  # (online, sync, clip) as recorded in args.json
    "offline": (False, "none", "none"),
    "offline-humanline": (False, "humanline", "clamp"),
    "online": (True, "none", "none"),
    "online-humanline": (True, "humanline", "clamp"),
    "sync_trust_region": (False, "trust_region", "none"),
    "sync_humanline-clip_none": (False, "humanline", "none"),
    "clip_clamp": (False, "none", "clamp"),
    "clip_sampling": (False, "none", "sampling"),
}


@pytest.mark.parametrize("name", list(E2E))
def test_end_to_end(name, dpo_run, toy_model):
    run = dpo_run(E2E[name]).check()
    steps = run.steps
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        for k in (
            "loss",
            "grad_norm",
            "lr",
            "rewards/margins",
            "rewards/chosen",
            "rewards/rejected",
            "logps/chosen",
            "logps/rejected",
            "humanline/clamped_frac",
        ):
            assert math.isfinite(r[k]), (k, r)
        assert 0 <= r["humanline/clamped_frac"] <= 1 and 0 <= r["rewards/accuracies"] <= 1
        assert r["grad_norm"] > 0
    assert steps[0]["loss"] == pytest.approx(LOG2, abs=1e-6)  # the reference starts equal to the policy
    assert steps[0]["rewards/margins"] == 0
    assert "eval/reward" in steps[-1] and 0 <= steps[-1]["eval/reward"] <= 1
    margins = [r["rewards/margins"] for r in steps]
    if name == "sync_trust_region":  # synced after every step: the loss always sees policy == reference
        assert all(r["loss"] == pytest.approx(LOG2, abs=1e-6) for r in steps) and all(m == 0 for m in margins)
    elif name != "online" and name != "online-humanline":
        assert all(m != 0 for m in margins[1:])  # the policy has moved away from its reference
    if name.startswith("online"):
        rounds = [r for r in run.records if "online/pairs" in r]
        assert rounds and rounds[0]["step"] == 0 and all(r["online/pairs"] >= 8 for r in rounds)
        assert all(0 < r["online/kept_frac"] <= 1 for r in rounds)
        assert all(r["online/truncated_completions"] == 0 for r in rounds)  # toy completions fit --max_length
    with open(os.path.join(run.out, "args.json")) as f:
        args = json.load(f)
    assert (args["online"], args["sync"], args["clip"]) == MODES[name]
    # the final model directory loads and differs from the starting policy
    assert os.path.isdir(os.path.join(run.out, f"checkpoint-{STEPS}"))
    model = AutoModelForCausalLM.from_pretrained(run.out)
    AutoTokenizer.from_pretrained(run.out)
    trained, initial = model.state_dict(), toy_model.state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)


CUT = ["--online", "--max_new_tokens", "24", "--max_steps", "1"]  # 24 tokens cut every toy answer


def test_online_rounds_count_the_completions_cut_by_max_new_tokens(dpo_run):
    # a toy completion is 32 tokens with <eos>: --max_new_tokens 24 cuts every sample before its end, and every
    # sample is counted (the round's 32 x 4), not only those that make a pair
    run = dpo_run(CUT).check()
    rounds = [r for r in run.records if "online/pairs" in r]
    assert rounds and all(r["online/truncated_completions"] == 128 for r in rounds), rounds
    assert all(r["online/truncated_frac"] == 1.0 for r in rounds)


@pytest.mark.parametrize(
    "extra", [[], ["--online", "--max_new_tokens", "24", "--max_steps", "1"]], ids=["whole", "cut"]
)
def test_an_evaluation_writes_its_answers_and_whether_each_finished(dpo_run, extra):
    """eval_samples.jsonl holds the last evaluation's answers, one per prompt in the prompts' order: its rewards are
    the record's mean, its unfinished ones the record's count of cut answers (24 tokens cut every toy answer)."""
    run = dpo_run(extra).check()
    last = [r for r in run.records if "eval/reward" in r][-1]
    with open(os.path.join(run.out, "eval_samples.jsonl")) as f:
        answers = [json.loads(line) for line in f]
    prompts = [json.loads(line)["prompt"] for line in open(toy_task.load().prompts_test)][: len(answers)]
    assert len(answers) == 8 and [a["prompt"] for a in answers] == prompts
    assert sum(a["reward"] for a in answers) / 8 == pytest.approx(last["eval/reward"], abs=1e-12)
    cut = sum(not a["finished"] for a in answers)
    assert cut == last["eval/truncated_completions"] == (8 if extra else 0) and last["eval/truncated_frac"] == cut / 8


def test_keep_every_eval_keeps_each_evaluations_answers_by_step(dpo_run):
    """--keep_every_eval: beside the latest, eval_samples-step<N>.jsonl for each evaluation, whose rewards are that
    evaluation's record; the last one is eval_samples.jsonl. Without the flag, the latest only."""
    run = dpo_run(["--eval_every", "2", "--keep_every_eval"]).check()
    evaluations = [r for r in run.records if "eval/reward" in r]
    kept = sorted(f for f in os.listdir(run.out) if f.startswith("eval_samples-step"))
    assert len(evaluations) >= 3 and kept == sorted(f"eval_samples-step{r['step']}.jsonl" for r in evaluations)
    for r in evaluations:
        answers = [json.loads(line) for line in open(os.path.join(run.out, f"eval_samples-step{r['step']}.jsonl"))]
        assert sum(a["reward"] for a in answers) / len(answers) == pytest.approx(r["eval/reward"], abs=1e-12)
    last = os.path.join(run.out, f"eval_samples-step{evaluations[-1]['step']}.jsonl")
    assert open(last).read() == open(os.path.join(run.out, "eval_samples.jsonl")).read()
    assert not [f for f in os.listdir(dpo_run([]).check().out) if f.startswith("eval_samples-step")]


def test_an_online_run_whose_samples_would_be_cut_before_training_is_refused(tmp_path):
    # prompt 16 + completion 40 > 24: the tail a reward scored (a math answer) would be cut before the loss sees it
    proc = warm.run(
        [
            sys.executable,
            "dpo_humanline.py",
            "--online",
            "--max_prompt_length",
            "16",
            "--max_length",
            "24",
            "--output_dir",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "--max_prompt_length + --max_new_tokens = 56 is above --max_length 24: samples would be cut before training"
    ]
    assert not (tmp_path / "out").exists()


def test_sync_timing_end_to_end(dpo_run):
    """Across runs: the step-t loss (1-based) under humanline syncing with k = 1 uses the reference
    policy_{t-2}, so step 2 still sees the initial reference (= no syncing) and step 3 does not; with
    k = 2 the first copy happens before update 2, so steps 1-2 match no syncing and step 3 does not."""
    loss = lambda extra: [r["loss"] for r in dpo_run(extra).check().steps]  # noqa: E731
    humanline, clamp_only = loss(HUMANLINE), loss(E2E["clip_clamp"])
    assert humanline[:2] == clamp_only[:2] and humanline[2] != clamp_only[2]
    sync_k2, plain = loss(SYNC_ONLY_K2), loss(E2E["offline"])
    assert sync_k2[:2] == plain[:2] and sync_k2[2] != plain[2]


def test_help_lists_every_argument_the_methods_first():
    proc = warm.run(
        [sys.executable, "dpo_humanline.py", "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert runs.help_text("dpo_humanline.py") == proc.stdout  # what the other tests of --help read, in their process
    listed = [line.split()[0].rstrip(",") for line in proc.stdout.splitlines() if line.startswith("  --")]
    names = [f.name for f in dataclasses.fields(Args)]
    assert sorted(listed) == sorted(f"--{n}" for n in names + ["no_fp32_head", "no_eval_at_start"])
    run = {f.name for f in dataclasses.fields(plumbing.RunArgs)}
    assert listed[0] == "--offline" and listed.index("--reward_threshold") < min(listed.index(f"--{n}") for n in run)


@pytest.mark.parametrize("extra", [HUMANLINE, SYNC_ONLY_K2], ids=["humanline", "sync_humanline_every_2"])
def test_two_processes_equal_one(extra, dpo_run):
    one = dpo_run(extra, nproc=1).check()
    two = dpo_run(extra, nproc=2).check()
    s1, s2 = one.steps, two.steps
    assert [r["step"] for r in s2] == list(range(1, STEPS + 1))
    for a, b in zip(s1, s2):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (a["step"], a["loss"], b["loss"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4), (a["step"], a["grad_norm"], b["grad_norm"])
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-9)
    assert all(a["loss"] != pytest.approx(LOG2, abs=1e-6) for a in s1[1:])
    assert os.path.exists(os.path.join(two.out, f"checkpoint-{STEPS}", "state-rank1.pt"))
    AutoModelForCausalLM.from_pretrained(two.out)


@pytest.fixture(scope="module")
def resumed(dpo_run, tmp_path_factory):
    """The offline --humanline run's checkpoint-2 resumed to step 4 (checkpoint-4 deleted first)."""
    full = dpo_run(HUMANLINE).check()
    assert sorted(d for d in os.listdir(full.out) if d.startswith("checkpoint")) == ["checkpoint-2", "checkpoint-4"]
    out = tmp_path_factory.mktemp("resume") / "run"
    shutil.copytree(full.out, out)
    shutil.rmtree(out / "checkpoint-4")
    run = launch([*HUMANLINE, "--max_steps", str(STEPS), "--resume"], out).check()
    # metrics.jsonl keeps the records up to the checkpoint, then the resumed steps: each step once
    assert [r["step"] for r in run.records if "loss" in r] == list(range(1, STEPS + 1))
    return full, run, [r for r in run.records if r["step"] > 2]


RESUME_KEYS = ("loss", "grad_norm", "lr", "rewards/margins", "humanline/clamped_frac")


def test_resume_from_checkpoint_2_repeats_step_3(resumed):
    full, run, new = resumed
    assert "resumed from" in run.proc.stdout and "checkpoint-2" in run.proc.stdout
    assert [r["step"] for r in new] == [3, 4]
    a, b = full.steps[2], new[0]
    for k in RESUME_KEYS:  # policy, reference (synced under humanline) and data position restored
        assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), (k, a[k], b[k])


def test_resume_from_checkpoint_2_repeats_step_4_and_the_final_model(resumed):
    full, run, new = resumed
    a, b = full.steps[3], new[1]
    for k in RESUME_KEYS + ("eval/reward",):
        assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), (k, a[k], b[k])
    m_full = AutoModelForCausalLM.from_pretrained(full.out).state_dict()
    m_res = AutoModelForCausalLM.from_pretrained(run.out).state_dict()
    for k in m_full:
        torch.testing.assert_close(m_res[k], m_full[k], rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------
# Checkpoints in process (one process, the toy model)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint_round_trip(toy, tok, tmp_path_factory):
    def setup():
        policy = AutoModelForCausalLM.from_pretrained(toy.model)
        ref = AutoModelForCausalLM.from_pretrained(toy.model).requires_grad_(False)
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
        return policy, ref, opt, sched

    rng = torch.get_rng_state()
    policy, ref, opt, sched = setup()
    for t in range(3):
        policy(input_ids=torch.tensor([[3, 4, 13, 5, 14]])).logits.pow(2).mean().backward()
        optimizer_step(policy, ReferenceModel(ref, None), opt, sched, 1.0, "humanline", 1, t)
    out = tmp_path_factory.mktemp("ckpt")
    session(out, policy, ref, opt, sched, tok, step=3).save()
    fresh = setup()
    state = session(out, *fresh, tok, resume=True).state
    torch.set_rng_state(rng)
    return (policy, ref, opt, sched), fresh, state


def test_load_checkpoint_restores_weights_and_optimizer_state(checkpoint_round_trip):
    (policy, ref, opt, sched), (p2, r2, o2, s2), state = checkpoint_round_trip
    assert state.step == 3 and state.round_index == 0
    assert same(weights(p2), weights(policy)) and same(weights(r2), weights(ref))
    assert not same(weights(r2), weights(p2))  # the humanline reference lags one update
    for (k, a), b in zip(opt.state.items(), o2.state.values()):
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[name], b[name]), name
    assert s2.last_epoch == sched.last_epoch and s2.get_last_lr() == sched.get_last_lr()


def test_a_checkpoint_reaches_the_disk_before_it_is_renamed_into_place(
    checkpoint_round_trip, tok, tmp_path, monkeypatch
):
    (policy, ref, opt, sched), _, _ = checkpoint_round_trip
    events, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(a), str(b)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    session(tmp_path, policy, ref, opt, sched, tok, step=5).save()
    final = str(tmp_path / "checkpoint-5")
    rename = events.index(("replace", final + ".tmp", final))
    synced_before = {path for kind, path, *_ in events[:rename] if kind == "fsync"}
    files = {os.path.join(final + ".tmp", name) for name in os.listdir(final)}
    assert len(files) >= 3 and files <= synced_before  # every file (weights, config, state), then the directory
    assert final + ".tmp" in synced_before
    assert ("fsync", str(tmp_path)) in events[rename + 1 :]  # and the rename itself


def test_load_checkpoint_restores_the_learning_rate_in_use(checkpoint_round_trip):
    (policy, ref, opt, sched), (p2, r2, o2, s2), state = checkpoint_round_trip
    assert o2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])  # 2.5e-4, not 1e-3
