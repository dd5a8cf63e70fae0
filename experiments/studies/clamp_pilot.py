"""The clamp study's pilot, before its plan (`clamp_pilot`): off-policy humanline GRPO on addition sampled every 64
steps for 192 (3 sampling rounds, the horizon's batch, validation every 32 steps), the reference synced every 16 or 24
steps, with the scripts' defaults and with the authors' math settings (docs/paper-runs.md: KL 1e-4, clip 0.2, log-probs
at the sampling temperature 0.7, so the clamp acts on temperature-scaled log-ratios); one seed each, the horizon's
2e-5. It measures where the clamp acts (its share of tokens, averaged and on its largest step), with the horizon's
tables; no tests.
"""

from dataclasses import replace

import runner
from suites import Config, arm_flags, lr_flags, one_real_suite

from studies.second_study import HL, OFF
from studies.third_study import HORIZON_SECTIONS, VALID_EVERY_32, horizon_plot

N64 = runner.strip(OFF, "--max_steps") + ["--sample_every", "64"] + HL + VALID_EVERY_32
AUTHORS_MATH = ["--beta", "1e-4", "--eps", "0.2", "--logps_temperature", "0.7", "--advantage_std", "sample"]
ARMS = {
    f"grpo off-policy+humanline, N = 64, k = {k}{label}": ("grpo", "online", N64 + ["--sync_every", str(k)] + more)
    for k in (16, 24)
    for label, more in (("", []), (", authors' math settings", AUTHORS_MATH))
}


def clamp_pilot(results, chosen):
    return [
        Config(name, "grpo_humanline.py", arm_flags("addition", arm) + lr_flags(2e-5), (100,))
        for name, arm in ARMS.items()
    ]


NOTE = "The clamp study's pilot: one seed a setting, before the study's plan; no tests."
PILOT = one_real_suite("addition", clamp_pilot, HORIZON_SECTIONS, NOTE, "valid", 128)
SUITES = {"clamp_pilot": replace(PILOT, plot=horizon_plot)}  # validation success and drift every 32 steps
