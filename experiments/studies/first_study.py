"""The first real-model study: DPO, KTO and GRPO, each offline, offline + humanline and online, on the addition task;
each variant's rate chosen at 1x, 4x or 16x the paper's on the validation prompts (`addition_sweep`, one seed a rate),
then compared on the test prompts (`addition`, 5 seeds; KTO 3). Its tables keep the Welch tests each comparison was
first read by beside the paired ones. Its constraints half, measured under an earlier reward, is retired
(experiments/results/previous/retired/). docs/results.md, "A real model".
"""

from dataclasses import replace

from suites import paper_lr, real_suites

MODES, MULTIPLES, SWEEP_SEEDS = ("offline", "offline+humanline", "online"), (1, 4, 16), (100,)
SEEDS = {"dpo": (0, 1, 2, 3, 4), "kto": (0, 1, 2), "grpo": (0, 1, 2, 3, 4)}  # KTO's cut first, as the budget allows
# an arm of a real-model study: (objective, mode, its flags beyond smollm2.flags' for the mode, the multiples of the
# paper's rate its sweep tries, its seeds in the comparison)
ARMS = {f"{a} {m}": (a, m, [], MULTIPLES, SEEDS[a]) for a in ("dpo", "kto", "grpo") for m in MODES}
PAIRS = [(f"{a} offline+humanline", f"{a} {b}") for a in ("dpo", "kto", "grpo") for b in ("offline", "online")]

SUITES = real_suites("addition", "addition", ARMS, PAIRS, SWEEP_SEEDS, welch=True)
SUITES["addition_sweep"] = replace(
    SUITES["addition_sweep"], paper_rates={f"addition {arm}": paper_lr(arm) for arm in ARMS}
)
