"""The second study (docs/results.md, "The second study: the plan", committed before its runs in d6a9b86), on the
addition task: A, GRPO's anchor and DPO's pair offline (`anchor_sweep`, `anchor`: 10 seeds), and C, off-policy GRPO
sampling every 16 steps with and without humanline (`offpolicy_addition_sweep`, `offpolicy_addition`: 5 seeds). Its
rate rule: each arm's grid, 2 seeds a rate on the validation prompts, grows by one rate 4x past an edge that wins
(suites.grown). Its rates' keys: "addition second study: <arm>".
"""

from suites import real_suites

STUDY, SWEEP_SEEDS = "second study: ", (100, 101)
TEN, FIVE, GRID = tuple(range(10)), tuple(range(5)), (1, 4, 16, 64)
NO_ANCHOR = ["--beta", "0", "--eps", "1e9"]  # no KL term and a ratio clip that never binds
ANCHOR_ARMS = {
    "grpo offline": ("grpo", "offline", [], GRID, TEN),
    "grpo offline+humanline": ("grpo", "offline+humanline", [], GRID, TEN),
    # the control: no anchor, the reference frozen at the start
    "grpo offline, no anchor": ("grpo", "offline", NO_ANCHOR, GRID, TEN),
    "dpo offline": ("dpo", "offline", [], (1, 4, 16), TEN),
    "dpo offline+humanline": ("dpo", "offline+humanline", [], (1, 4, 16), TEN),
}
ANCHOR_PAIRS = [("grpo offline+humanline", "grpo offline"), ("grpo offline+humanline", "grpo offline, no anchor")]
ANCHOR_PAIRS += [("grpo offline, no anchor", "grpo offline"), ("dpo offline+humanline", "dpo offline")]
# off-policy GRPO: 64 steps of 2 prompts x 8 samples; N = 16 samples 16 steps' groups every 16 steps
OFF = ["--num_generations", "8", "--batch_size", "16", "--max_steps", "64"]
N16, HL = OFF + ["--sample_every", "16"], ["--humanline"]
OFFPOLICY_ARMS = {
    "grpo online, N = 1": ("grpo", "online", OFF, (4, 16), FIVE),
    "grpo off-policy, N = 16": ("grpo", "online", N16, (4, 16), FIVE),
    "grpo off-policy+humanline, N = 16, k = 1": ("grpo", "online", N16 + HL, (4, 16), FIVE),
    "grpo off-policy+humanline, N = 16, k = 4": ("grpo", "online", N16 + HL + ["--sync_every", "4"], (4, 16), FIVE),
    # the control (the plan's amendment): no anchor, as A's
    "grpo off-policy, N = 16, no anchor": ("grpo", "online", N16 + NO_ANCHOR, (4, 16), FIVE),
}
ON, PLAIN, K1, K4, CONTROL = OFFPOLICY_ARMS
OFFPOLICY_PAIRS = [(PLAIN, ON), (K1, PLAIN), (K4, PLAIN), (K1, ON), (K4, ON), (K1, CONTROL), (K4, CONTROL)]

PLAN = 'The plan of these runs: docs/results.md, "The second study", committed before them in d6a9b86.'
AMENDED = PLAN + " Its amendment, the off-policy control without an anchor: 2508d99, before that arm's runs."
SUITES = real_suites("addition", "anchor", ANCHOR_ARMS, ANCHOR_PAIRS, SWEEP_SEEDS, STUDY, True, ["phrasing"], PLAN)
OFFPOLICY = (OFFPOLICY_ARMS, OFFPOLICY_PAIRS, SWEEP_SEEDS, STUDY)
SUITES |= real_suites(
    "addition", "offpolicy_addition", *OFFPOLICY, grow=True, more=["signal", "phrasing"], note=AMENDED
)
