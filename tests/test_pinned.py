"""Pinned training: a few steps of every mode of the three scripts give the losses and gradient norms recorded in
tests/pinned.json (written by `PYTHONPATH=. python tests/test_pinned.py --record`; last when each run seed got its own
random streams), so a rewrite that changes what any mode computes fails here.

Two runs per script have bounds tight enough that the humanline clamp (and, in the other, the Beta token
rejection of `--clip sampling`) acts on more than 1% of the tokens. Their step-3 loss and clamped fraction are
also recomputed here, independently of the scripts' code: each sequence scored alone by the checkpoints of
steps 1 and 2 (reference and policy under syncing every step), the loss written out from its formula."""

import contextlib
import io
import json
import math
import os
import runpy
import signal
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

import toy_task

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED = os.path.join(ROOT, "tests", "pinned.json")
BASE = ["--max_steps", "3", "--batch_size", "16", "--micro_batch_size", "8", "--eval_prompts", "none", "--save_every", "0"]
ONLINE = {"dpo": ["--online", "--round_size", "32", "--num_samples", "4"],
          "kto": ["--online", "--round_size", "32", "--num_samples", "4"],
          "grpo": ["--online", "--num_generations", "4"]}
ROUNDS = ["--online", "--round_size", "128", "--num_samples", "4", "--max_steps", "5"]
TIGHT = ["--log_eps_P", "-0.01", "--log_eps_R", "0.01", "--learning_rate", "1e-3", "--micro_batch_size", "16", "--save_every", "1"]


def modes(algo):
    out = {
        "offline": [],
        "humanline": ["--humanline"],
        "humanline-two-models": ["--humanline", "--ref_free", "off"],
        "humanline-k2": ["--humanline", "--sync_every", "2"],
        "trust-region-k2": ["--sync", "trust_region", "--sync_every", "2"],
        "offline-two-models": ["--ref_free", "off"],
        "online-humanline": [*ONLINE[algo], "--humanline"],
        "clamp-acts": ["--humanline", *TIGHT],
        "sampling-acts": ["--sync", "humanline", "--clip", "sampling", *TIGHT],
        "sync-only-tight": ["--sync", "humanline", *TIGHT],
        # five steps at 1e-4, so that k = 2 and k = 1 differ (from step 4) beyond the tolerance; rounds of three or
        # more steps, so that online + humanline (a sync inside the round) and online differ
        "humanline-5-steps": ["--humanline", "--max_steps", "5", "--learning_rate", "1e-4"],
        "humanline-k2-5-steps": ["--humanline", "--sync_every", "2", "--max_steps", "5", "--learning_rate", "1e-4"],
    }
    if algo != "grpo":
        out |= {"online-rounds": [*ROUNDS], "online-humanline-rounds": [*ROUNDS, "--humanline"]}
    if algo == "grpo":
        out |= {"online": ONLINE["grpo"],
                "off-policy-humanline": [*ONLINE["grpo"], "--sample_every", "2", "--humanline", "--sync_every", "2"],
                "pairs-from-samples": ["--online", "--pairs_from_samples", "--round_size", "32", "--num_generations", "4"],
                "kl-initial": ["--kl_baseline", "initial", "--humanline", "--ref_free", "off"]}
    else:
        out["online"] = ONLINE[algo]
    return out


RUNS = {f"{algo}-{name}": (f"{algo}_humanline.py", [*BASE, *flags]) for algo in ("dpo", "kto", "grpo")
        for name, flags in modes(algo).items()}
PINNED_KEYS = ("loss", "grad_norm", "online/reward", "humanline/clamped_frac")
# Every value is held to 1e-3 of its pinned one, but three that move with the CPU's float order by more: step 3 of
# syncing every step at 1e-3 with nothing clamped. Adam's first update moves each weight by about the learning rate
# whatever the size of its gradient, so gradients that differ in rounding move the weights apart, and the next log-
# ratios, against bounds of +-0.01, amplify it. Their relative spread across torch's code paths (plain, AVX2, and
# AVX-512 where known: DPO's grad_norm 14.0668 / 14.0229 / 14.0577) is below; they are held to four times it. Every
# other value's spread is at most 2e-4. Step 3's loss (spread 5e-5 and 6e-7) keeps 1e-3, and tells syncing from
# none (without it 1.0789 for DPO, 0.5500 for KTO).
SPREAD = {("dpo-sync-only-tight", 3, "grad_norm"): 3.1e-3, ("dpo-sync-only-tight", 3, "humanline/clamped_frac"): 4.4e-3,
          ("kto-sync-only-tight", 3, "grad_norm"): 8.8e-4}


def run_in_process(script, flags, out):
    argv, handler = sys.argv, signal.getsignal(signal.SIGTERM)
    sys.argv = [script, *flags, "--output_dir", str(out)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        sys.argv = argv
        signal.signal(signal.SIGTERM, handler)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{k: r[k] for k in ("step", *PINNED_KEYS) if k in r} for r in map(json.loads, f)]


@pytest.fixture(scope="module")
def pinned():
    with open(PINNED) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            cache[name] = (run_in_process(*RUNS[name], out), out)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_mode_trains_as_pinned(name, outputs, pinned):
    got, _ = outputs(name)
    want = pinned["runs"][name]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (g["step"], sorted(g), sorted(w))
        for k in w:  # float32 differs between CPUs
            rel = max(1e-3, 4 * SPREAD.get((name, g["step"], k), 0.0))
            assert g[k] == pytest.approx(w[k], rel=rel, abs=1e-6), (name, g["step"], k)


@pytest.mark.parametrize("algo", ["dpo", "kto", "grpo"])
def test_the_pinned_runs_tell_the_variants_apart(algo, pinned):
    """k = 2 against k = 1, online + humanline against online: each pair's pinned values differ by more than the
    tolerance above, so a bug that made one behave as the other would fail its pinned run."""
    def apart(a, b):
        a, b = ([(r[k], k) for r in pinned["runs"][f"{algo}-{name}"] for k in ("loss", "grad_norm") if k in r] for name in (a, b))
        return any(x != pytest.approx(y, rel=1e-3, abs=1e-6) for (x, _), (y, _) in zip(a, b))

    assert apart("humanline-5-steps", "humanline-k2-5-steps")
    if algo != "grpo":
        assert apart("online-rounds", "online-humanline-rounds")


# ----------------------------------------------------------------------------------------------
# The runs where the clamp or the token rejection acts, recomputed independently
# ----------------------------------------------------------------------------------------------


def seq_logps(model, prompt, completion):
    """Log-probs of each completion token, the sequence scored alone (no padding), in float64."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].double()
    return logits.log_softmax(-1)[len(prompt) - 1:].gather(-1, ids[0, len(prompt):, None]).squeeze(-1)


def step_batch(items, step, size, seed=0):
    """The offline batch of a step: each epoch a fixed permutation, consecutive slices of it. The permutation's seed is
    the data stream's (stream 1) of the run seed's SeedSequence, for this epoch."""
    epoch, pos = divmod(step, len(items) // size)
    epoch_seed = int(np.random.SeedSequence(seed).spawn(2)[1].spawn(epoch + 1)[epoch].generate_state(1)[0])
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(epoch_seed)).tolist()
    return [items[i] for i in order[pos * size: (pos + 1) * size]]


@pytest.fixture(scope="module")
def toy_pairs():
    paths = toy_task.load()
    tok = AutoTokenizer.from_pretrained(paths.model)
    with open(paths.offline["strong"]) as f:
        rows = [json.loads(line) for line in f]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [(tok(r["prompt"])["input_ids"], enc(r["chosen"] + tok.eos_token), enc(r["rejected"] + tok.eos_token))
            for r in rows]


def independent(algo, pairs, out, clamp):
    """Step 3 of a TIGHT run (bounds +-0.01, syncing before every update): the reference is the policy after
    step 1, the policy the one after step 2. Returns (loss, fraction of tokens outside the bounds) from the
    formulas, the token log-ratios clamped to the bounds if `clamp`."""
    ref, pol = (AutoModelForCausalLM.from_pretrained(os.path.join(out, f"checkpoint-{s}")).eval() for s in (1, 2))
    P, R = (-0.01, 0.01) if clamp else (-math.inf, math.inf)

    def ratios(p, c):
        return seq_logps(pol, p, c) - seq_logps(ref, p, c)

    def frac(x):
        return ((x < -0.01) | (x > 0.01)).double().mean().item()

    if algo == "dpo":
        batch, beta = step_batch(pairs, 2, 16), 0.1
        losses, fracs = [], []
        for p, c, r in batch:
            rc, rr = ratios(p, c), ratios(p, r)
            margin = beta * (rc.clamp(P, R).sum() - rr.clamp(P, R).sum())
            losses.append(-F.logsigmoid(margin).item())
            fracs += [frac(rc), frac(rr)]
        return sum(losses) / len(losses), sum(fracs) / len(fracs)
    if algo == "kto":
        examples = [(p, c, d) for p, c, r in pairs for c, d in ((c, True), (r, False))]
        batch, beta = step_batch(examples, 2, 16), 0.25
        kl_pairs = [(p, batch[(i + 1) % len(batch)][1]) for i, (p, _, _) in enumerate(batch)]
        z0 = max(0.0, sum(ratios(p, c).clamp(P, R).sum().item() for p, c in kl_pairs) / len(kl_pairs))
        losses, fracs = [], []
        for p, c, desirable in batch:
            x = ratios(p, c)
            r = x.clamp(P, R).sum().item()
            losses.append(1.1 * (1 - 1 / (1 + math.exp(-beta * (r - z0)))) if desirable
                          else 1.0 * (1 - 1 / (1 + math.exp(-beta * (z0 - r)))))
            fracs.append(frac(x))
        fracs += [frac(ratios(p, c)) for p, c in kl_pairs]
        return sum(losses) / len(losses), sum(fracs) / len(fracs)
    # grpo, offline: each pair a group of two, advantages +1 / -1; eps 0.15, beta 0.01, KL against the reference
    batch, eps, beta = step_batch(pairs, 2, 8), 0.15, 0.01
    total, n_tokens, fracs = 0.0, 0, []
    for p, c, r in batch:
        for completion, a in ((c, 1.0), (r, -1.0)):
            x = ratios(p, completion)
            ratio = x.clamp(P, R).exp()
            surrogate = torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
            kl = (-x).exp() + x - 1
            total += (-surrogate + beta * kl).sum().item()
            n_tokens += len(completion)
            fracs.append(frac(x))
    return total / n_tokens, sum(fracs) / len(fracs)


@pytest.mark.parametrize("algo", ["dpo", "kto", "grpo"])
@pytest.mark.parametrize("mode", ["clamp-acts", "sampling-acts"])
def test_where_the_clamp_acts_the_loss_is_the_formula(algo, mode, outputs, toy_pairs):
    """The clamp changes the loss's value: it must equal the clamped formula, not the unclamped one. The Beta
    rejection detaches tokens but keeps their value: its loss is the unclamped formula's, and its gradient is
    not the one of the same run without it (step 2, the first with a reference other than the policy)."""
    recs, out = outputs(f"{algo}-{mode}")
    step3 = next(r for r in recs if r["step"] == 3)
    loss, frac = independent(algo, toy_pairs, out, clamp=mode == "clamp-acts")
    other, _ = independent(algo, toy_pairs, out, clamp=mode != "clamp-acts")
    assert frac > 0.01 and step3["humanline/clamped_frac"] == pytest.approx(frac, rel=1e-3, abs=1e-4)
    assert step3["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)
    assert step3["loss"] != pytest.approx(other, rel=1e-3)
    if mode == "sampling-acts":
        plain = outputs(f"{algo}-sync-only-tight")[0]
        assert recs[0]["grad_norm"] == pytest.approx(plain[0]["grad_norm"], rel=1e-5)  # step 1: ratio 1, nothing rejected
        assert recs[1]["grad_norm"] != pytest.approx(plain[1]["grad_norm"], rel=1e-3)


def test_kto_reference_point_is_clamped_as_the_loss_is(toy_pairs, tmp_path):
    """An asymmetric clamp, [-0.001, 1.5], at 1e-3 with syncing every step: at step 3 the KL pairs' summed clamped
    log-ratios are positive on average while the unclamped ones are not, so the logged z0 tells whether the clamp
    reaches the reference point (both would floor to 0 under the symmetric TIGHT bounds)."""
    flags = [*BASE, "--humanline", "--log_eps_P", "-0.001", "--learning_rate", "1e-3", "--micro_batch_size", "16",
             "--save_every", "1"]
    step3 = run_in_process("kto_humanline.py", flags, tmp_path)[2]
    with open(tmp_path / "metrics.jsonl") as f:
        z0 = [json.loads(line) for line in f][2]["kl"]
    ref, pol = (AutoModelForCausalLM.from_pretrained(tmp_path / f"checkpoint-{s}").eval() for s in (1, 2))
    examples = [(p, c, d) for p, c, r in toy_pairs for c, d in ((c, True), (r, False))]
    batch = step_batch(examples, 2, 16)
    ratios = [seq_logps(pol, p, batch[(i + 1) % len(batch)][1]) - seq_logps(ref, p, batch[(i + 1) % len(batch)][1])
              for i, (p, _, _) in enumerate(batch)]
    clamped = max(0.0, sum(x.clamp(-0.001, 1.5).sum().item() for x in ratios) / len(ratios))
    plain = max(0.0, sum(x.sum().item() for x in ratios) / len(ratios))
    assert step3["step"] == 3 and clamped > 0.1 and plain < clamped / 2
    assert z0 == pytest.approx(clamped, rel=1e-3)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import subprocess
    import tempfile

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    runs = {}
    for name in sorted(RUNS):
        with tempfile.TemporaryDirectory() as out:
            runs[name] = run_in_process(*RUNS[name], out)
            print(name, runs[name][-1])
    with open(PINNED, "w") as f:
        json.dump({"recorded_at": commit, "runs": runs}, f, indent=1)
