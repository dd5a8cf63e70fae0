"""kto_humanline.py: the loss and the KL reference point against hand-computed values, the clamp's
zero gradients, the mismatched KL pairs, data validation, sync order, and end-to-end runs of the
script (one and two processes)."""

import copy
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import runs
import torch

import data_formats
import kto_humanline as kto
import toy_task


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# --- the loss ----------------------------------------------------------------------------------

# token log-probs of three examples (completion tokens where the mask is 1); token log-ratios:
#   example 0: 0.2, -0.1, (-1.5 masked)      r = 0.1               clamped: 0.1
#   example 1: -0.2, 0.4, 3.0                r = 3.2               clamped: -0.2 + 0.4 + 1.5 = 1.7
#   example 2: (-1.5 masked), -1.9, 0.1      r = -1.8              clamped: -1.5 + 0.1 = -1.4
POLICY = [[-1.0, -0.5, -2.0], [-0.3, -0.2, 0.0], [-2.0, -3.0, -0.1]]
REF = [[-1.2, -0.4, -0.5], [-0.1, -0.6, -3.0], [-0.5, -1.1, -0.2]]
MASK = [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
DESIRABLE = [True, False, True]


def loss_inputs(requires_grad=False):
    policy = torch.tensor(POLICY, dtype=torch.float64, requires_grad=requires_grad)
    return (
        policy,
        torch.tensor(REF, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
        torch.tensor(DESIRABLE),
    )


def expected_losses(r, kl, beta, lambda_D, lambda_U):
    return [
        lambda_D * (1 - sigmoid(beta * (ri - kl))) if d else lambda_U * (1 - sigmoid(beta * (kl - ri)))
        for ri, d in zip(r, DESIRABLE)
    ]


@pytest.mark.parametrize("clamp", [False, True])
def test_kto_loss_matches_hand_computed_values(clamp):
    policy, ref, mask, desirable = loss_inputs()
    bounds = (-1.5, 1.5) if clamp else (None, None)
    losses, metrics = kto.kto_loss(policy, ref, mask, desirable, 0.3, 0.25, 1.1, 1.0, *bounds)
    r = [0.1, 1.7, -1.4] if clamp else [0.1, 3.2, -1.8]
    assert losses.shape == (3,)
    assert losses.tolist() == pytest.approx(expected_losses(r, 0.3, 0.25, 1.1, 1.0), rel=1e-12)
    assert metrics["rewards/chosen"].mean().item() == pytest.approx(0.25 * (r[0] + r[2]) / 2)
    assert metrics["rewards/rejected"].mean().item() == pytest.approx(0.25 * r[1])
    assert metrics["rewards/margins"].tolist() == pytest.approx(
        [0.25 * (r[0] - 0.3), 0.25 * (0.3 - r[1]), 0.25 * (r[2] - 0.3)]
    )
    assert metrics["rewards/accuracies"].tolist() == [0.0, 0.0, 0.0]
    assert metrics["kl"].item() == pytest.approx(0.3)


def test_kto_loss_needs_both_bounds_to_clamp():
    policy, ref, mask, desirable = loss_inputs()
    one_bound, _ = kto.kto_loss(policy, ref, mask, desirable, 0.3, 0.25, 1.1, 1.0, -1.5, None)
    assert one_bound.tolist() == pytest.approx(expected_losses([0.1, 3.2, -1.8], 0.3, 0.25, 1.1, 1.0))


def test_weights_apply_to_their_group_only():
    policy, ref, mask, desirable = loss_inputs()
    base, _ = kto.kto_loss(policy, ref, mask, desirable, 0.3, 0.25, 1.0, 1.0)
    heavy_d, _ = kto.kto_loss(policy, ref, mask, desirable, 0.3, 0.25, 2.0, 1.0)
    light_u, _ = kto.kto_loss(policy, ref, mask, desirable, 0.3, 0.25, 1.0, 0.5)
    assert heavy_d.tolist() == pytest.approx([2 * base[0].item(), base[1].item(), 2 * base[2].item()])
    assert light_u.tolist() == pytest.approx([base[0].item(), 0.5 * base[1].item(), base[2].item()])


def test_reference_point_carries_no_gradient():
    policy, ref, mask, desirable = loss_inputs(requires_grad=True)
    kl = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    losses, _ = kto.kto_loss(policy, ref, mask, desirable, kl, 0.25, 1.1, 1.0)
    losses.sum().backward()
    assert kl.grad is None and policy.grad is not None


def test_clamped_tokens_get_no_gradient():
    outside = [(1, 2), (2, 1)]  # log-ratios 3.0 and -1.9
    inside = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 2)]
    for clamp in (False, True):
        policy, ref, mask, desirable = loss_inputs(requires_grad=True)
        losses, _ = kto.kto_loss(
            policy, ref, mask, desirable, 0.3, 0.25, 1.1, 1.0, *((-1.5, 1.5) if clamp else (None, None))
        )
        losses.sum().backward()
        assert all(policy.grad[i, j] != 0 for i, j in inside)
        assert all((policy.grad[i, j] == 0) == clamp for i, j in outside)
        assert policy.grad[0, 2] == 0 and policy.grad[2, 0] == 0  # masked tokens


# --- the KL reference point --------------------------------------------------------------------


def test_kl_estimate_hand_value():
    # log-ratios [0.5, (-1.8 masked)] and [0.5, -0.4]: sums 0.5 and 0.1, mean 0.3
    policy = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    ref = torch.tensor([[-1.5, -0.2], [-1.0, -0.1]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert kto.kto_kl_estimate(policy, ref, mask).item() == pytest.approx(0.3)


def test_kl_estimate_is_floored_at_zero():
    # log-ratios -0.4 and -0.2: a mean of -0.6, floored to exactly 0
    kl = kto.kto_kl_estimate(torch.tensor([[-1.0, -1.0]]), torch.tensor([[-0.6, -0.8]]), torch.ones(1, 2))
    assert kl.item() == 0.0


def test_kl_estimate_carries_no_gradient():
    policy = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.2], [-1.0, -0.1]], requires_grad=True)
    kl = kto.kto_kl_estimate(policy, ref, torch.ones(2, 2), -1.5, 1.5)
    assert not kl.requires_grad


def test_kl_estimate_clamps_under_humanline():
    # log-ratios 2.5 and 0.2: 2.7 plain, 1.5 + 0.2 = 1.7 clamped
    policy, ref, mask = torch.tensor([[-0.1, -1.0]]), torch.tensor([[-2.6, -1.2]]), torch.ones(1, 2)
    assert kto.kto_kl_estimate(policy, ref, mask).item() == pytest.approx(2.7)
    assert kto.kto_kl_estimate(policy, ref, mask, -1.5, 1.5).item() == pytest.approx(1.7)


def test_kl_estimate_floors_after_the_cross_process_mean():
    # this process: sums -1.0 and -1.0; the other: (sum 3.0, count 2). Mean over all four 0.25; flooring
    # each process first would give (0 + 1.5) / 2 = 0.75.
    def all_reduce(t):
        t += torch.tensor([3.0, 2.0])

    policy, ref = torch.tensor([[-1.0], [-2.0]]), torch.tensor([[0.0], [-1.0]])
    assert kto.kto_kl_estimate(policy, ref, torch.ones(2, 1), all_reduce=all_reduce).item() == pytest.approx(0.25)


def test_kl_pairs_are_mismatched():
    examples = [([10 + i] * (i + 1), [100 + i, 200 + i], i % 2 == 0) for i in range(5)]
    pairs = kto.kto_kl_pairs(examples, max_length=100)
    assert [p for p, _ in pairs] == [p for p, _, _ in examples]
    own = {tuple(p): tuple(c) for p, c, _ in examples}
    assert all(tuple(c) != own[tuple(p)] for p, c in pairs)
    assert sorted(tuple(c) for _, c in pairs) == sorted(tuple(c) for _, c, _ in examples)  # every completion once
    cut = kto.kto_kl_pairs(examples, max_length=6)  # prompts of 1..5 tokens, completions cut to fit
    assert [len(p) + len(c) for p, c in cut] == [3, 4, 5, 6, 6]
    with pytest.raises(ValueError, match="two examples"):
        kto.kto_kl_pairs(examples[:1], max_length=100)


# --- data --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return toy_task.make_tokenizer()


ARGS = SimpleNamespace(max_prompt_length=512, max_length=1024)


def encode_examples(rows, tok, args):
    """KTO's examples of unpaired or preference rows: [(prompt_ids, completion_ids, desirable)], and what was cut."""
    encoded, cut = data_formats.encode_rows(rows, tok, args, "data.jsonl", unpaired_ok=True)
    return [(p, c, d) for p, cs, ds in encoded for c, d in zip(cs, ds)], cut


def decoded(tok, examples):
    return [(tok.decode(p), tok.decode(c), d) for p, c, d in examples]


def test_unpaired_rows_give_one_example_each(tok):
    rows = [
        {"prompt": "12+34=", "completion": "46", "label": True},
        {"prompt": "1+1=", "completion": "3", "label": False},
    ]
    examples, _ = encode_examples(rows, tok, ARGS)
    assert decoded(tok, examples) == [("12+34=", "46<eos>", True), ("1+1=", "3<eos>", False)]


def test_preference_rows_split_into_desirable_and_undesirable(tok):
    rows = [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        {"prompt": "2+2=", "chosen": "4", "rejected": "5", "completion": None, "label": None},
    ]  # union of columns
    examples, _ = encode_examples(rows, tok, ARGS)
    assert decoded(tok, examples) == [
        ("1+1=", "2<eos>", True),
        ("1+1=", "3<eos>", False),
        ("2+2=", "4<eos>", True),
        ("2+2=", "5<eos>", False),
    ]


@pytest.mark.parametrize("label", [1, "yes", 0.0])
def test_non_boolean_label_names_row_and_column(tok, label):
    rows = [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "1+1=", "completion": "3", "label": label}]
    with pytest.raises(SystemExit, match=r"row 1, column 'label'"):
        encode_examples(rows, tok, ARGS)


def test_missing_label_names_row_and_column(tok):
    with pytest.raises(SystemExit, match=r"row 0: missing column 'label'"):
        encode_examples([{"prompt": "1+1=", "completion": "2"}], tok, ARGS)


# --- sync order --------------------------------------------------------------------------------


def sync_run(sync, sync_every, steps):
    """(initial reference weights, [(policy before, policy after, reference after) for each optimizer_step])."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(2, 1)
    ref = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    initial, out = ref.weight.clone(), []
    for step in range(steps):
        policy(torch.ones(1, 2)).sum().backward()
        before = policy.weight.detach().clone()
        kto.optimizer_step(policy, kto.ReferenceModel(ref, None), optimizer, scheduler, 1e9, sync, sync_every, step)
        out.append((before, policy.weight.detach().clone(), ref.weight.clone()))
    return initial, out


def test_humanline_sync_leaves_the_reference_at_pre_update_weights():
    for before, after, ref in sync_run("humanline", 1, 3)[1]:
        assert torch.equal(ref, before) and not torch.equal(ref, after)


def test_trust_region_sync_copies_post_update_weights():
    for before, after, ref in sync_run("trust_region", 1, 3)[1]:
        assert torch.equal(ref, after) and not torch.equal(ref, before)


def test_sync_every_3_syncs_at_steps_2_and_5():
    initial, history = sync_run("humanline", 3, 6)
    for step, (before, _, ref) in enumerate(history):
        if step < 2:
            assert torch.equal(ref, initial)
        elif step < 5:
            assert torch.equal(ref, history[2][0])  # the pre-update weights of step 2
        else:
            assert torch.equal(ref, before)


# --- end to end --------------------------------------------------------------------------------

SMALL = runs.short(3, 16) + ["--micro_batch_size", "4"]
ROUNDS = ["--round_size", "16", "--num_samples", "4"]  # online sampling's (offline they stop the run)
MODES = {
    "offline": [],
    "offline-humanline": ["--humanline"],
    "online": ["--online"],
    "online-humanline": ["--online", "--humanline"],
    "trust_region": ["--sync", "trust_region"],
    "clip_sampling": ["--clip", "sampling"],
}
# 1 process with micro-batches of 8 = 2 processes with 4: z0 is per forward pass over all processes
PAIR = ["--humanline", "--max_steps", "3", "--batch_size", "8", "--eval_prompts", "none", "--save_every", "0"]


def run_all(jobs, root):
    """Run the scripts two at a time: name -> Run, jobs {name: (flags, processes)}."""
    with ThreadPoolExecutor(2) as pool:
        return dict(
            zip(jobs, pool.map(lambda n: runs.run("kto_humanline.py", *jobs[n][:1], root / n, jobs[n][1]), jobs))
        )


@pytest.fixture(scope="module")
def mode_runs(toy, tmp_path_factory):
    jobs = {name: ([*SMALL, *ROUNDS * ("--online" in f), *f], 1) for name, f in MODES.items()}
    return run_all(jobs, tmp_path_factory.mktemp("kto_modes"))


@pytest.fixture(scope="module")
def pair_runs(toy, tmp_path_factory):
    jobs = {
        "two_processes": ([*PAIR, "--micro_batch_size", "4"], 2),
        "one_process": ([*PAIR, "--micro_batch_size", "8"], 1),
    }
    return run_all(jobs, tmp_path_factory.mktemp("kto_pair"))


def training_records(runs, name):
    run = runs[name].check()
    return run.records, run.steps


@pytest.mark.parametrize("name", list(MODES))
def test_end_to_end(mode_runs, name):
    records, train = training_records(mode_runs, name)
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) and r["kl"] >= 0 for r in train)
    # step 1: policy = reference, so r = 0, z0 = 0 and each loss is lambda / 2 (1.1 / 2 or 1 / 2)
    assert 0.5 <= train[0]["loss"] <= 0.55 and train[0]["kl"] == 0
    assert "eval/reward" in train[-1]
    assert any("online/round" in r for r in records) == name.startswith("online")
    assert all(r["online/truncated_completions"] == 0 for r in records if "online/round" in r)  # toy completions fit
    out = mode_runs[name].out
    args = json.load(open(os.path.join(out, "args.json")))
    # step 1 (r = z0 = 0): each loss is lambda / 2, so the mean over the 8 examples is (1.1 d + (8 - d)) / 16 for the
    # d desirable ones, with both kinds present: a weight that did not take effect gives another value
    assert any(train[0]["loss"] == pytest.approx((1.1 * d + (8 - d)) / 16, abs=1e-6) for d in range(1, 8))
    assert (args["sync"], args["clip"]) == {
        "offline-humanline": ("humanline", "clamp"),
        "online-humanline": ("humanline", "clamp"),
        "trust_region": ("trust_region", "none"),
        "clip_sampling": ("none", "sampling"),
    }.get(name, ("none", "none"))
    assert os.path.exists(os.path.join(out, "config.json")) and os.path.isdir(os.path.join(out, "checkpoint-3"))


def test_two_processes_equal_one(pair_runs):
    _, one = training_records(pair_runs, "one_process")
    _, two = training_records(pair_runs, "two_processes")
    assert [r["step"] for r in two] == [1, 2, 3]
    assert any(r["kl"] > 0 for r in one)  # the comparison covers a non-trivial z0
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        # z0 (about 1e-3 here) is a mean of log-ratios summed over ~30 tokens, each a difference of two log-probs of
        # about -2 that float32 rounds to ~2e-7, and other batch shapes round otherwise: the two runs' z0 differ by
        # ~1e-6 whatever its size (1.2e-6 on an AVX2 EPYC), so it is held to 1e-5, not to 1e-4 of itself
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-4, abs=1e-5)
        assert b["rewards/margins"] == pytest.approx(a["rewards/margins"], rel=1e-3, abs=1e-6)
