"""Tests of grpo_humanline.py: group advantages and the loss against hand-computed values (clamp, eps
clip, KL, zero gradients), DAPO token normalisation across micro-batches and processes, the reward
functions, the order of syncing, the sample buffer (the sampler's log-probs as denominator), and
end-to-end runs on the toy task (every mode, two processes = one)."""

import itertools
import json
import math
import os
import shutil
import signal
import sys
from types import SimpleNamespace

import pytest
import runs
import torch
from test_formats import parsed
from transformers import AutoModelForCausalLM

import grpo_humanline
import lora
import ref_free
import toy_task
from grpo_humanline import (
    Args,
    ReferenceModel,
    best_worst_pairs,
    collate,
    group_advantages,
    group_sequences,
    grpo_loss,
    micro_batches,
    optimizer_step,
    token_logps,
)
from math_rewards import accuracy_reward, format_reward, tag_count_reward
from math_rewards import default_weights as default_reward_weights
from plumbing import sample_and_score

torch.set_num_threads(1)
LO, HI = -1.5, 1.5


# ----------------------------------------------------------------------------------------------
# group_advantages
# ----------------------------------------------------------------------------------------------


def test_group_of_two_distinct_rewards_is_exactly_minus_one_plus_one():
    adv = group_advantages(torch.tensor([0.2, 0.9, 3.0, -1.0, 0.1, 0.7], dtype=torch.float64), 2)
    assert adv.tolist() == [-1.0, 1.0, 1.0, -1.0, -1.0, 1.0]
    assert group_advantages(torch.tensor([0.0, 1.0, 1.0, 0.0]), 4).tolist() == [-1.0, 1.0, 1.0, -1.0]


def test_equal_rewards_give_zero_advantage():
    assert group_advantages(torch.tensor([0.7, 0.7]), 2).tolist() == [0.0, 0.0]
    # 0.1 * 3 / 3 rounds: a naive (R - mean) / std would give +-1 from a std of ~1e-17
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1, 1.0, 2.0, 3.0], dtype=torch.float64), 3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(adv).all()


def test_group_of_four_by_hand_with_population_std():
    rewards = [1.0, 2.0, 3.0, 4.0, 1.0, 0.0, 0.0, 0.0]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), 4).tolist()
    # group 1: mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    s = math.sqrt(1.25)
    assert adv[:4] == pytest.approx([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], rel=1e-12)
    # group 2: mean 0.25, variance (0.5625 + 3 * 0.0625) / 4 = 0.1875 (the unbiased std would differ)
    s = math.sqrt(0.1875)
    assert adv[4:] == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], rel=1e-12)
    assert adv[4] == pytest.approx(math.sqrt(3), rel=1e-12)


def test_the_sample_std_with_its_epsilon_by_hand():
    """--advantage_std sample (the authors' math code): (R - mean) / (std with n - 1 + 1e-4)."""
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0], dtype=torch.float64), 4, "sample")
    s = math.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3) + 1e-4  # unbiased variance 5 / 3
    assert adv.tolist()[:4] == pytest.approx([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], rel=1e-12)
    assert adv.tolist()[4:] == [0.0] * 4
    pair = group_advantages(torch.tensor([0.0, 1.0], dtype=torch.float64), 2, "sample").tolist()
    assert pair == pytest.approx([-0.5 / (math.sqrt(0.5) + 1e-4), 0.5 / (math.sqrt(0.5) + 1e-4)], rel=1e-12)  # not +-1


# ----------------------------------------------------------------------------------------------
# grpo_loss: hand-computed values and gradients
# ----------------------------------------------------------------------------------------------

# (batch 3, seq 3); token log-ratios policy - ref, written out:
#   row 0, A = +1:   [ 2.0, -0.1,  0.05 (masked)]
#   row 1, A = -1:   [-0.2,  2.0, -2.0]
#   row 2, A = +0.5: [-2.0,  0.1,  1.0 (masked)]
POL = [[-1.0, -2.0, -0.5], [-0.3, -1.0, -2.5], [-2.5, -0.4, -1.0]]
REF = [[-3.0, -1.9, -0.55], [-0.1, -3.0, -0.5], [-0.5, -0.5, -2.0]]
BASE = [[-1.2, -2.1, -0.4], [-0.5, -0.8, -2.2], [-2.0, -0.6, -0.9]]
MASK = [[1, 1, 0], [1, 1, 1], [1, 1, 0]]
ADV = [1.0, -1.0, 0.5]
EPS, BETA = 0.2, 0.1


def hand_token(p, r, q, a, eps, beta, lo=None, hi=None):
    """One token's -min(r A, clip(r) A) + beta KL_t, and its KL_t, in plain Python."""
    x = p - r
    if lo is not None:
        x = min(max(x, lo), hi)
    ratio = math.exp(x)
    clipped = min(max(ratio, 1 - eps), 1 + eps)
    kl = math.exp(q - p) - (q - p) - 1
    return -min(ratio * a, clipped * a) + beta * kl, kl


def hand_loss(eps=EPS, beta=BETA, lo=None, hi=None, mask=MASK):
    total, kl_total, n = 0.0, 0.0, 0
    for i in range(len(POL)):
        for j in range(len(POL[0])):
            if mask[i][j]:
                v, kl = hand_token(POL[i][j], REF[i][j], BASE[i][j], ADV[i], eps, beta, lo, hi)
                total, kl_total, n = total + v, kl_total + kl, n + 1
    return total / n, kl_total / n


def inputs(requires_grad=False):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return t(POL).requires_grad_(requires_grad), t(REF), t(BASE), t(MASK), t(ADV)


@pytest.mark.parametrize("clamp", [False, True], ids=["unclamped", "clamped"])
def test_grpo_loss_matches_hand_computed_value(clamp):
    bounds = (LO, HI) if clamp else (None, None)
    loss, metrics = grpo_loss(*inputs(), EPS, BETA, *bounds)
    expected, kl = hand_loss(lo=bounds[0], hi=bounds[1])
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["kl"].mean().item() == pytest.approx(kl, rel=1e-12)
    assert metrics["loss"].mean().item() == pytest.approx(expected, rel=1e-12)  # per token: its mean is the loss


def test_clamp_changes_the_loss_by_hand():
    unclamped, _ = grpo_loss(*inputs(), EPS, BETA)
    clamped, _ = grpo_loss(*inputs(), EPS, BETA, LO, HI)
    # only row 1 token 1 (log-ratio 2.0, A = -1) differs: e^2 unclamped, e^1.5 clamped (A < 0: not eps-clipped)
    # row 2 token 0 (log-ratio -2.0, A = 0.5): e^-2 * 0.5 vs e^-1.5 * 0.5 (the min picks the unclipped side)
    n = 7
    diff = (math.exp(2.0) - math.exp(1.5)) + 0.5 * (-math.exp(-2.0) + math.exp(-1.5))
    assert (unclamped - clamped).item() == pytest.approx(diff / n, rel=1e-12)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_log_ratio_two_under_humanline_is_clamped_then_eps_clipped(advantage):
    p = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-2.0]], dtype=torch.float64)  # log-ratio 2.0
    mask, a = torch.ones(1, 1, dtype=torch.float64), torch.tensor([advantage], dtype=torch.float64)
    loss, metrics = grpo_loss(p, ref, p.detach(), mask, a, EPS, BETA, LO, HI)  # baseline = policy: KL 0
    loss.backward()
    if advantage > 0:  # clamped to e^1.5 > 1 + eps: the eps clip gives (1 + eps) A
        assert loss.item() == pytest.approx(-(1 + EPS) * advantage, rel=1e-12)
        assert metrics["clip_frac"].tolist() == [1.0]
    else:  # A < 0: the min keeps the clamped ratio e^1.5, not e^2
        assert loss.item() == pytest.approx(math.exp(1.5), rel=1e-12)
    assert p.grad.item() == 0.0
    # without humanline the same token: e^2 for A < 0 with a live gradient
    p.grad = None
    loss, _ = grpo_loss(p, ref, p.detach(), mask, a, EPS, BETA)
    loss.backward()
    if advantage < 0:
        assert loss.item() == pytest.approx(math.exp(2.0), rel=1e-12)
        assert p.grad.item() == pytest.approx(math.exp(2.0), rel=1e-12)


def test_kl_term_is_not_clamped():
    for bounds in ((None, None), (LO, HI)):
        l0, m0 = grpo_loss(*inputs(), EPS, 0.0, *bounds)
        l1, m1 = grpo_loss(*inputs(), EPS, 0.3, *bounds)
        assert (l1 - l0).item() == pytest.approx(0.3 * hand_loss()[1], rel=1e-12)
        assert m1["kl"].mean().item() == pytest.approx(hand_loss()[1], rel=1e-12)


@pytest.mark.parametrize("beta", [0.0, BETA])
def test_clamped_tokens_get_no_ratio_gradient(beta):
    p, ref, base, mask, adv = inputs(requires_grad=True)
    loss, _ = grpo_loss(p, ref, base, mask, adv, EPS, beta, LO, HI)
    loss.backward()
    n = 7
    for i in range(3):
        for j in range(3):
            x = POL[i][j] - REF[i][j]
            kl_grad = beta * (1 - math.exp(BASE[i][j] - POL[i][j])) / n  # d KL_t / dp
            if not MASK[i][j]:
                assert p.grad[i, j].item() == 0.0
            elif not LO <= x <= HI:  # clamped: only the (unclamped) KL term's gradient remains
                assert p.grad[i, j].item() == pytest.approx(kl_grad, rel=1e-12, abs=1e-300)
                if beta == 0:
                    assert p.grad[i, j].item() == 0.0
    # row 0 token 1 (log-ratio -0.1, A = +1, inside every range) has a live ratio gradient: -r A / n + KL
    r = math.exp(-0.1)
    assert p.grad[0, 1].item() == pytest.approx(-r / n + beta * (1 - math.exp(BASE[0][1] - POL[0][1])) / n, rel=1e-12)


def test_rejected_tokens_pass_no_ratio_gradient():
    p, ref, base, mask, adv = inputs(requires_grad=True)
    rejected = torch.zeros(3, 3, dtype=torch.bool)
    rejected[0, 1] = True
    loss, _ = grpo_loss(p, ref, base, mask, adv, EPS, 0.0, rejected=rejected)
    loss.backward()
    assert p.grad[0, 1].item() == 0.0 and p.grad[1, 0].item() != 0.0
    assert loss.item() == pytest.approx(hand_loss(beta=0.0)[0], rel=1e-12)  # same value


# ----------------------------------------------------------------------------------------------
# DAPO normalisation: micro-batches and processes = one big batch
# ----------------------------------------------------------------------------------------------


def random_batch(n=6, seq=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    pol = -torch.rand(n, seq, generator=g, dtype=torch.float64) * 3
    ref = pol + torch.randn(n, seq, generator=g, dtype=torch.float64)
    base = pol + 0.5 * torch.randn(n, seq, generator=g, dtype=torch.float64)
    lengths = [1, 5, 3, 2, 4, 5]
    mask = torch.tensor([[1.0] * k + [0.0] * (seq - k) for k in lengths], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.5, 0.0], dtype=torch.float64)
    return pol, ref, base, mask, adv


def test_token_normalisation_across_micro_batches_and_ranks_equals_one_batch():
    pol, ref, base, mask, adv = random_batch()
    big_p = pol.clone().requires_grad_(True)
    big, _ = grpo_loss(big_p, ref, base, mask, adv, EPS, BETA, LO, HI)
    big.backward()

    world = 2
    parts = {0: [[0, 1], [2]], 1: [[3], [4, 5]]}  # two ranks, two micro-batches each, uneven token counts
    n_tokens = mask.sum()  # all micro-batches of all ranks, counted before any backward
    p = pol.clone().requires_grad_(True)
    total, grads = 0.0, []
    for rank, micros in parts.items():
        p.grad = None
        for rows in micros:
            loss, _ = grpo_loss(
                p[rows], ref[rows], base[rows], mask[rows], adv[rows], EPS, BETA, LO, HI, num_tokens=n_tokens
            )
            (loss * world).backward()  # the script's scaling: FSDP2 then averages over ranks
            total += loss.item()
        grads.append(p.grad.clone())
    assert total == pytest.approx(big.item(), rel=1e-12)
    torch.testing.assert_close(sum(grads) / world, big_p.grad, rtol=1e-12, atol=1e-15)

    # a per-micro-batch mean would weigh tokens differently: the test can tell
    naive = (
        sum(
            grpo_loss(pol[r], ref[r], base[r], mask[r], adv[r], EPS, BETA, LO, HI)[0].item()
            for micros in parts.values()
            for r in micros
        )
        / 4
    )
    assert naive != pytest.approx(big.item(), rel=1e-3)


# ----------------------------------------------------------------------------------------------
# Reward functions
# ----------------------------------------------------------------------------------------------

GOOD = "<think>\nadd them\n</think>\n<answer>\n42\n</answer>"


def test_tag_count_reward():
    completions = [
        GOOD,
        "<think>\nabc\n</think>\n42",
        "<think>\n<think>\nx\n</think>\n<answer>\n1\n</answer>",
        "42",
        "",
    ]
    assert tag_count_reward(None, completions) == [1.0, 0.5, 0.75, 0.0, 0.0]
    assert tag_count_reward(None, [[{"role": "assistant", "content": GOOD}]]) == [1.0]


def test_format_reward():
    completions = [
        GOOD,
        GOOD + "\n",
        "<think>add</think><answer>42</answer>",
        "so " + GOOD,
        GOOD + " and more",
        "<think>\na\nb\n</think>\n<answer>\n\\boxed{1}\n</answer>",
    ]
    assert format_reward(None, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


ACCURACY_CASES = [  # (completion, solution, reward)
    ("<answer>\n\\boxed{\\frac{1}{2}}\n</answer>", "so $\\boxed{0.5}$.", 1.0),  # fraction = decimal
    ("\\boxed{1/2}", "\\boxed{\\frac12}", 1.0),
    ("<answer>0.5</answer>", "\\boxed{\\dfrac{1}{2}}", 1.0),  # answer tags, \dfrac
    ("\\boxed{\\frac{2}{4}}", "\\boxed{\\frac{1}{2}}", 1.0),
    ("\\boxed{-\\frac{3}{4}}", "\\boxed{-0.75}", 1.0),
    ("The answer is $\\boxed{ 42. }$", "The answer is $\\boxed{42}$.", 1.0),  # spaces, $, trailing .
    ("\\boxed{+7}", "7", 1.0),  # leading +, a bare solution
    ("\\boxed{x = 3}", "\\boxed{3}", 1.0),
    ("\\boxed{\\text{(B)}}", "\\boxed{(B)}", 1.0),
    ("\\boxed{\\left( 3, 4 \\right)}", "\\boxed{(3,4)}", 1.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\boxed{\\frac{\\sqrt{3}}{2}}", 1.0),  # nested braces
    ("first \\boxed{1}, finally \\boxed{2}", "\\boxed{2}", 1.0),  # the last box
    ("\\boxed{5} <answer>6</answer>", "6", 1.0),  # the answer tags win
    ("\\boxed{43}", "\\boxed{42}", 0.0),  # wrong
    ("<answer>0.333</answer>", "\\boxed{\\frac{1}{3}}", 0.0),  # not exactly 1/3
    ("the answer is 42", "\\boxed{42}", 0.0),  # no tags, no box
    ("\\boxed{\\sqrt{8}}", "\\boxed{2\\sqrt{2}}", 0.0),  # symbolic equivalence: beyond this verifier
    ("\\boxed{1/0}", "\\boxed{0}", 0.0),
    ("\\boxed{", "\\boxed{1}", 0.0),  # unbalanced
]


@pytest.mark.parametrize("completion, solution, reward", ACCURACY_CASES)
def test_accuracy_reward(completion, solution, reward):
    assert accuracy_reward(None, [completion], solution=[solution]) == [reward]


def test_accuracy_needs_a_solution_column():
    with pytest.raises(ValueError, match="solution"):
        accuracy_reward(None, ["\\boxed{1}"])


def test_default_reward_weights():
    assert default_reward_weights(["tag_count", "format", "accuracy"]) == "1,1,8"
    assert default_reward_weights(["accuracy", "format", "tag_count"]) == "8,1,1"
    assert default_reward_weights(["toy_verify"]) == "1"
    assert default_reward_weights(["format", "accuracy"]) == "1,1"


# ----------------------------------------------------------------------------------------------
# Syncing around the optimizer step
# ----------------------------------------------------------------------------------------------


def linear_setup():
    torch.manual_seed(0)
    policy, ref = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    ref.load_state_dict(policy.state_dict())
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    return policy, ref.requires_grad_(False), opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def weights(m):
    return [p.detach().clone() for p in m.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("sync", ["humanline", "trust_region", "none"])
def test_sync_every_3_copies_pre_or_post_update(sync):
    policy, ref, opt, sched = linear_setup()
    initial, changed = weights(ref), []
    for t in range(7):
        policy(torch.full((1, 3), float(t + 1))).pow(2).sum().backward()
        before, ref_before = weights(policy), weights(ref)
        optimizer_step(policy, ReferenceModel(ref, None), opt, sched, 1e9, sync, 3, t)
        after = weights(policy)
        assert not same(before, after)
        if not same(weights(ref), ref_before):
            changed.append(t)
            # humanline: the reference holds the pre-update weights; trust region: the updated ones
            assert same(weights(ref), before if sync == "humanline" else after)
            assert not same(weights(ref), after if sync == "humanline" else before)
    assert changed == ([] if sync == "none" else [2, 5])
    if sync == "none":
        assert same(weights(ref), initial)


MODES = {  # offline; online on-policy; off-policy (sampled every 2 steps); Algorithm 1's pairs as groups of two
    "offline": [],
    "on-policy": ["--online", "--num_generations", "4"],
    "off-policy": ["--online", "--num_generations", "4", "--sample_every", "2"],
    "pairs": ["--online", "--pairs_from_samples", "--round_size", "32", "--num_generations", "4"],
}


@pytest.mark.parametrize("mode", MODES)
def test_make_reference_gives_every_flag_combination_its_reference_and_kl_baseline(mode, monkeypatch):
    """Each --sync, --ref_free, --lora_r and --kl_baseline in each mode, as main parses them. The ratio's denominator:
    none on-policy (the policy's own log-probs); with --ref_free off the base with adapters (--lora_r; with none where
    it never moves) or a second model; else the policy, synced on sync_due's steps under either --sync. The KL's
    baseline is the initial model wherever the reference moves (online, or synced offline), and none where the
    reference stays the initial model. Each reads log-probs at --logps_temperature."""
    loaded = []

    def load_model(args, rt):  # the reference's or the start's own model
        loaded.append(torch.nn.Linear(1, 1))
        return loaded[-1]

    monkeypatch.setattr(grpo_humanline, "load_model", load_model)
    rt, policy = SimpleNamespace(rank=0, head_dtype=torch.float32), torch.nn.Linear(1, 1)
    for sync, ref_free_flag, lora_r, kl_baseline in itertools.product(
        ["none", "humanline", "trust_region"], ["on", "off"], [0, 4], ["reference", "initial"]
    ):
        argv = [*MODES[mode], "--max_steps", "6", "--sync", sync, "--ref_free", ref_free_flag, "--lora_r", str(lora_r)]
        argv += ["--kl_baseline", kl_baseline, "--logps_temperature", "0.7"]
        on_policy, moves = mode == "on-policy" and sync == "none", mode != "offline" or sync != "none"
        if on_policy and ref_free_flag == "off":
            with pytest.raises(SystemExit, match="--ref_free: on-policy GRPO has no reference"):
                parsed("grpo", argv)
            continue
        loaded.clear()
        reference, base = grpo_humanline.make_reference(parsed("grpo", argv), policy, rt, lambda s: None, wait=False)
        flags = " ".join(argv)
        if on_policy:
            assert reference is None, flags
        elif ref_free_flag == "off" and lora_r:
            assert type(reference) is lora.AdapterReference and reference.frozen == (not moves), flags
            assert reference.logps_args[1] == 0.7
        elif ref_free_flag == "off":
            assert type(reference) is ReferenceModel and reference.model is loaded[0], flags
            assert reference.temperature == 0.7
        else:
            assert type(reference) is ref_free.PolicyAsReference and reference.policy is policy, flags
            assert [s for s in range(6) if reference.due and reference.due(s)] == (
                [] if sync == "none" else [*range(6)]
            )
            assert reference.logps_args[1] == 0.7
        if kl_baseline == "reference" or not moves:
            assert base is None, flags
        elif lora_r:  # the base with its adapters disabled, never synced
            assert type(base) is lora.AdapterReference and base.frozen and base is not reference, flags
            assert base.logps_args[1] == 0.7
        else:  # a model of its own, loaded after the reference's
            assert type(base) is ReferenceModel and base.model is loaded[-1] and base is not reference, flags
            assert base.temperature == 0.7


# ----------------------------------------------------------------------------------------------
# The sample buffer: groups -> sequences, the sampler's log-probs (computed ahead), online rounds
# ----------------------------------------------------------------------------------------------


def test_group_sequences_lays_out_groups_with_their_advantages():
    groups = [([1], [[2], [3], [4]], [1.0, 0.0, 0.0]), ([5], [[6], [7], [8]], [2.0, 2.0, 2.0])]
    seqs = group_sequences(groups)
    assert [(p, c, r) for p, c, _, r in seqs] == [
        ([1], [2], 1.0),
        ([1], [3], 0.0),
        ([1], [4], 0.0),
        ([5], [6], 2.0),
        ([5], [7], 2.0),
        ([5], [8], 2.0),
    ]
    assert [a for _, _, a, _ in seqs] == pytest.approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0, 0])
    pairs = group_sequences([([1], [[2], [3]], [1.0, 0.0])])
    assert [s[2] for s in pairs] == [1.0, -1.0]


def test_micro_batches_split_a_step_by_rank_then_micro_batch():
    args = Args(micro_batch_size=2)
    batch = list(range(8))
    assert micro_batches(batch, args, 0, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert micro_batches(batch, args, 0, 2) == [[0, 1], [2, 3]]
    assert micro_batches(batch, args, 1, 2) == [[4, 5], [6, 7]]


@pytest.mark.parametrize("rank, world", [(0, 1), (1, 2)])
def test_sampler_logps_computed_ahead_equal_the_training_forward_exactly(toy_model, tok, rank, world):
    """Online without --sync the reference is the sampler: at a sampling the policy computes the buffer's log-probs
    in the micro-batches training uses (this process's share), so that the first ratio after sampling is exactly 1."""
    model = toy_model
    args = Args(batch_size=4, micro_batch_size=2, max_steps=10, sync="none")
    texts = [
        ("123+789=", "3+9+0=12;2+8+1=11;1+7+1=09>0912"),
        ("100+200=", "0+0+0=00;0+0+0=00;1+2+0=03>0300"),
        ("555+555=", "5+5+0=10"),
        ("999+1=", "9+1+0=10;9+0+1=10>1000"),
        ("1+1=", "2"),
        ("2+2=", "4"),
    ] * 2
    seqs = [(tok(p)["input_ids"], tok(c + tok.eos_token)["input_ids"], 1.0, 1.0) for p, c in texts][
        :8
    ]  # two steps of 4
    rt = SimpleNamespace(
        rank=rank,
        world=world,
        device=torch.device("cpu"),
        autocast=lambda: torch.autocast("cpu", enabled=False),
        head_dtype=torch.float32,
        logps_temperature=1.0,
    )
    step_batch = lambda s: seqs[(s - 3) * 4 : (s - 2) * 4] if s - 3 < 2 else None  # noqa: E731 (the buffer: steps 3, 4)

    def forwards(batch, args, rank, world):
        return [(m, [x[:2] for x in m]) for m in micro_batches(batch, args, rank, world)]

    def step_inputs(s):
        batch = step_batch(s)
        return batch and [collate(q, tok.pad_token_id, "cpu") for _, q in forwards(batch, args, rank, world)]

    reference = ref_free.PolicyAsReference(model.train(), step_inputs, token_logps, rt, None, args.max_steps)
    reference.reset(model, step=3)
    ahead = reference.held["ahead"]
    assert sorted(ahead) == [3, 4] and model.training
    for s in (3, 4):
        micro = forwards(step_batch(s), args, rank, world)
        assert len(ahead[s]) == len(micro) == 2 // world
        for (_, sequences), got in zip(micro, ahead[s]):
            with torch.no_grad():
                expected = token_logps(model, *collate(sequences, tok.pad_token_id, "cpu"))
            assert torch.equal(got, expected)


def test_sample_and_score_weights_rewards_and_pairs_keep_raw_scores(toy_model, tok):
    model = toy_model
    args = Args(num_generations=3)
    rows = [{"prompt": "123+789=", "solution": "912"}, {"prompt": "100+200=", "solution": "300"}]
    seen = {}

    def count(prompts, completions, solution=None, **_):
        seen["solution"] = solution
        return [float(k) for k in range(len(completions))]

    reward_fns = [("ones", 1.0, lambda p, c, **_: [1.0] * len(c)), ("count", 8.0, count)]
    rt = SimpleNamespace(
        rank=0, world=1, device=torch.device("cpu"), autocast=lambda: torch.autocast("cpu", enabled=False)
    )
    groups, record = sample_and_score(model, tok, reward_fns, rows, 3, args, 1, rt)
    assert seen["solution"] == ["912"] * 3 + ["300"] * 3  # the other columns reach the reward functions
    scores = [1.0 + 8.0 * k for k in range(6)]
    assert [(g.row, g.prompt_ids, g.scores, len(g.completions)) for g in groups] == [
        (rows[0], tok("123+789=")["input_ids"], scores[:3], 3),
        (rows[1], tok("100+200=")["input_ids"], scores[3:], 3),
    ]
    assert record == {
        "online/reward": sum(scores) / 6,
        "online/bad_rewards": 0,
        "online/truncated_completions": 0,
        "online/truncated_frac": 0.0,
        "online/ones": 1.0,
        "online/count": 15 / 6,
    }
    pairs = best_worst_pairs(groups, 0.5)  # best and worst of each prompt's 3 samples (unless identical), raw scores
    assert len(pairs) <= 2
    for p, (best, worst), pair_scores in pairs:
        i = [g.prompt_ids for g in groups].index(p)
        assert pair_scores == [scores[3 * i + 2], scores[3 * i]] and best != worst
        assert [best, worst] == [groups[i].completions[2], groups[i].completions[0]]


# ----------------------------------------------------------------------------------------------
# End to end on the toy task: each run a subprocess, shared between the tests that need it
# ----------------------------------------------------------------------------------------------

STEPS = 3
BASE_ARGS = runs.short(STEPS, 16) + ["--num_generations", "4"]


@pytest.fixture(scope="module")
def grpo_run(toy, tmp_path_factory):
    """run(extra_args, nproc, micro_batch_size) -> Run, each distinct command run once per module."""
    cache = {}

    def run(extra, nproc=1, micro=4):
        key = (tuple(extra), nproc, micro)
        if key not in cache:
            flags = [*BASE_ARGS, "--micro_batch_size", str(micro), *extra]
            cache[key] = runs.run("grpo_humanline.py", flags, tmp_path_factory.mktemp("grpo"), nproc)
        return cache[key]

    return run


E2E = {
    "offline": [],
    "offline-humanline": ["--offline", "--humanline"],
    "online": ["--online", "--sample_every", "1"],
    "online-sample_every_2": ["--online", "--sample_every", "2"],
    "online-humanline-sync_every_2": ["--online", "--humanline", "--sync_every", "2"],
    "online-pairs": ["--online", "--pairs_from_samples", "--round_size", "16"],
    "sync_trust_region": ["--sync", "trust_region"],
    "clip_sampling": ["--clip", "sampling"],
}


@pytest.mark.parametrize("name", list(E2E))
def test_end_to_end(name, grpo_run):
    run = grpo_run(E2E[name]).check()
    steps = run.steps
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        for k in ("loss", "kl", "clip_frac", "ratio/abs_log", "logps", "grad_norm", "lr", "humanline/clamped_frac"):
            assert math.isfinite(r[k]), (k, r)
        assert 0 <= r["clip_frac"] <= 1 and 0 <= r["humanline/clamped_frac"] <= 1 and r["kl"] >= 0
        # offline, each pair is a group of two rewards that differ: every sequence carries signal
        assert r["grpo/no_signal"] == 0 if not name.startswith("online") else 0 <= r["grpo/no_signal"] <= 1
    # at the first step the policy is its reference (or its own sampler) and the KL baseline
    assert steps[0]["ratio/abs_log"] == 0 and steps[0]["kl"] == 0
    assert "eval/reward" in steps[-1] and 0 <= steps[-1]["eval/accuracy"] <= 1
    args = json.load(open(os.path.join(run.out, "args.json")))
    if name == "sync_trust_region":  # synced after every update: the ratio is always 1
        assert all(r["ratio/abs_log"] == 0 for r in steps)
    if name.startswith("offline"):
        assert all(r["ratio/abs_log"] > 0 for r in steps[1:])  # the policy moved off its (frozen or synced) reference
        assert args["eps"] == (0.15 if "humanline" in name else 0.5)
        assert (args["sync"], args["clip"]) == (("humanline", "clamp") if "humanline" in name else ("none", "none"))
    if name.startswith("online"):
        assert run.rounds and run.rounds[0]["step"] == 0 and args["eps"] == 0.15
        assert all(r["online/truncated_completions"] == 0 for r in run.rounds)  # toy completions fit --max_length
        assert all(math.isfinite(r["reward"]) for r in steps)
    if name == "online":  # on-policy: the sampler is the policy itself, its log-probs reused (no second forward)
        assert all(r["ratio/abs_log"] == 0 and r["perf/sync_seconds"] == 0 for r in steps)
    if name == "online-pairs":
        assert args["reward_funcs"] == "toy" and all(0 < r["online/kept_frac"] <= 1 for r in run.rounds)
    elif name.startswith("online"):
        assert args["reward_funcs"] == "toy_verify" and all(
            r["online/groups"] == 2 * int(args["sample_every"]) for r in run.rounds
        )
    if name == "online-humanline-sync_every_2":
        # the denominator is the synced reference, not the sampler: step 2 (fresh samples, reference still the
        # starting policy) sees a ratio != 1
        assert steps[1]["online/staleness"] == 0 and steps[1]["ratio/abs_log"] > 0
    final, last = (AutoModelForCausalLM.from_pretrained(d) for d in (run.out, os.path.join(run.out, "checkpoint-3")))
    start = AutoModelForCausalLM.from_pretrained(toy_task.load().model)
    assert all(torch.equal(a, b) for a, b in zip(final.parameters(), last.parameters()))  # the last step's weights
    assert any(not torch.equal(a, b) for a, b in zip(final.parameters(), start.parameters()))  # trained


def test_a_step_whose_groups_all_tie_is_logged_as_without_signal(grpo_run):
    """Every sample scoring the same gives every sequence advantage 0: each step's grpo/no_signal is 1.0."""
    run = grpo_run(["--online", "--reward_funcs", "tests.support.faulty_rewards:ties"]).check()
    assert [r["grpo/no_signal"] for r in run.steps] == [1.0] * STEPS


def test_without_signal_is_the_share_of_a_steps_sequences_whose_group_ties(grpo_run):
    """Each step samples its own round (groups of 4, 2 a step, one micro-batch), some prompts tying every sample: the
    step's grpo/no_signal is the share of its sequences with advantage 0, its round's share of tied groups."""
    run = grpo_run(["--online", "--reward_funcs", "tests.support.faulty_rewards:some_ties"], micro=8).check()
    tied = [r["online/zero_std_frac"] for r in run.rounds]
    assert [r["grpo/no_signal"] for r in run.steps] == pytest.approx(tied) and len(tied) == STEPS
    assert any(0 < share < 1 for share in tied)  # a step of groups with and without signal


EVERY_4 = ["--online", "--sample_every", "4", "--max_steps", "5", "--save_every", "2"]


def test_sample_every_4_reuses_samples_with_the_sampler_as_denominator(grpo_run):
    run = grpo_run(EVERY_4).check()
    steps, rounds = run.steps, run.rounds
    assert [r["step"] for r in rounds] == [0, 4]  # sampled before steps 1 and 5
    assert all(r["online/steps"] == 4 and r["online/groups"] == 8 for r in rounds)  # 4 steps x 8 / G prompts
    assert [r["online/round"] for r in steps] == [1, 1, 1, 1, 2]
    assert [r["online/staleness"] for r in steps] == [0, 1, 2, 3, 0]
    for r in steps:
        if r["online/staleness"] == 0:  # the policy is the sampler: ratio exactly 1, KL to it 0
            assert r["ratio/abs_log"] == 0 and r["kl"] == 0
        else:  # the same samples, the policy has moved: the sampler's log-probs are the denominator
            assert r["ratio/abs_log"] > 0 and r["kl"] > 0


def test_resume_restores_the_sample_buffer_and_the_learning_rate(grpo_run, tmp_path):
    full = grpo_run(EVERY_4).check()
    out = tmp_path / "resumed"
    shutil.copytree(full.out, out)
    for step in (4, 5):
        shutil.rmtree(out / f"checkpoint-{step}")
    resumed = runs.run("grpo_humanline.py", [*BASE_ARGS, "--micro_batch_size", "4", *EVERY_4, "--resume"], out).check()
    assert "resumed from" in resumed.proc.stdout and "checkpoint-2" in resumed.proc.stdout
    assert resumed.records[: len(resumed.records) - 4] == [
        r for r in full.records if r["step"] <= 2
    ]  # kept as they were
    new = [r for r in resumed.records if r["step"] > 2]
    # steps 3 and 4 train on the restored buffer (with its sampler log-probs), then a new round is sampled
    assert [r["step"] for r in new] == [3, 4, 4, 5] and "online/reward" in new[2]
    for a, b in zip(full.records[-4:], new):
        for k in ("loss", "grad_norm", "lr", "kl", "ratio/abs_log", "online/reward", "eval/reward"):
            assert (k in a) == (k in b)
            if k in a:  # step 4 also checks that step 3 updated with the scheduled lr, not the initial one
                assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), (a["step"], k, a[k], b[k])


def test_two_processes_equal_one(grpo_run):
    extra = ["--offline", "--humanline"]
    one = grpo_run(extra, nproc=1, micro=4).check()  # two micro-batches of 4
    two = grpo_run(extra, nproc=2, micro=2).check()  # two processes x two micro-batches of 2
    s1, s2 = one.steps, two.steps
    assert [r["step"] for r in s2] == list(range(1, STEPS + 1))
    for a, b in zip(s1, s2):
        for k in ("loss", "grad_norm", "kl", "ratio/abs_log", "clip_frac"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-7), (a["step"], k, a[k], b[k])
    assert all(a["loss"] != 0 for a in s1[1:])


@pytest.mark.parametrize("flags, beta, eps", [([], 0.01, 0.15), (["--beta", "0.03", "--eps", "0.2"], 0.03, 0.2)])
def test_the_loop_gives_the_loss_its_kl_coefficient_and_clip(flags, beta, eps, tmp_path, monkeypatch):
    """At the paper's rate the KL term is ~1e-11 of a loss near 1e-5 (the toy's step KL is ~1e-9): no logged value
    could tell beta = 0 from 0.01, so the call itself is checked: every micro-batch's loss gets --beta and --eps."""
    import inspect

    import grpo_humanline

    seen, real = [], grpo_humanline.grpo_loss
    signature = inspect.signature(real)

    def spy(*a, **kw):
        bound = signature.bind(*a, **kw).arguments
        seen.append((bound["beta"], bound["eps"]))
        return real(*a, **kw)

    monkeypatch.setattr(grpo_humanline, "grpo_loss", spy)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "grpo_humanline.py",
            "--humanline",
            "--max_steps",
            "2",
            "--batch_size",
            "8",
            "--micro_batch_size",
            "4",
            "--eval_prompts",
            "none",
            "--save_every",
            "0",
            *flags,
            "--output_dir",
            str(tmp_path),
        ],
    )
    handler = signal.getsignal(signal.SIGTERM)
    try:
        grpo_humanline.main()
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert seen == [(beta, eps)] * 4
