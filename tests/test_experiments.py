"""The reproduction runner: Holm-Bonferroni, the summary statistics, and --quick over every configuration."""

import json
import math
import os
import subprocess
import sys

import pytest
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import run  # noqa: E402


def test_holm_by_hand():
    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> monotone 0.06
    assert list(run.holm([0.01, 0.04, 0.03])) == pytest.approx([0.03, 0.06, 0.06])
    assert list(run.holm([0.5, 0.9])) == pytest.approx([1.0, 1.0])  # capped at 1


def fake_run(out, rewards_by_step, wall=10.0, clamped=0.0, cpu=None):
    os.makedirs(out)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for step, reward in rewards_by_step:
            f.write(json.dumps({"step": step, "loss": 0.5, "perf/step_seconds": wall / 100, "humanline/clamped_frac": clamped, "rewards/margins": 1.0,
                                "eval/reward": reward, "eval/accuracy": reward / 2}) + "\n")
    with open(os.path.join(out, "wall_seconds"), "w") as f:
        f.write(f"{wall}\n")
    if cpu is not None:
        with open(os.path.join(out, "cpu_seconds"), "w") as f:
            f.write(f"{cpu}\n")


def test_summary_and_significance_on_known_runs(tmp_path):
    results = str(tmp_path)
    configs = [c for c in run.suites(results)["main"] if c[0].startswith("dpo")]
    finals = {"dpo offline": [0.50, 0.52, 0.48, 0.51, 0.49], "dpo offline+humanline": [0.60, 0.62, 0.58, 0.61, 0.64],
              "dpo online": [0.70, 0.69, 0.72, 0.71, 0.66], "dpo online+humanline": [0.7] * 5}
    for name, _, flags, seeds in configs:
        for seed in range(seeds):
            fake_run(run.run_dir(results, "main", name, seed), [(60, 0.4), (120, finals[name][seed])],
                     wall=100.0 if "online" in name else 20.0)
    rows = {r["config"]: r for r in run.summarize(results, "main", configs)}
    off = rows["dpo offline"]
    assert off["seeds"] == 5
    assert off["reward"][0] == pytest.approx(0.5)
    assert off["reward"][1] == pytest.approx(stats.sem(finals["dpo offline"]))
    tests = {t["comparison"]: t for t in run.significance(list(rows.values()), run.comparisons("main"))}
    assert len(tests) == 2  # KTO and GRPO have no runs here
    p_off = stats.ttest_ind(finals["dpo offline+humanline"], finals["dpo offline"], equal_var=False).pvalue
    p_on = stats.ttest_ind(finals["dpo offline+humanline"], finals["dpo online"], equal_var=False).pvalue
    assert tests["dpo offline+humanline vs dpo offline"]["p"] == pytest.approx(p_off)
    assert tests["dpo offline+humanline vs dpo online"]["p"] == pytest.approx(p_on)
    low, high = sorted([p_off, p_on])  # Holm with two tests: the smaller p doubled, the larger kept (monotone)
    holm_low, holm_high = min(1.0, 2 * low), max(min(1.0, 2 * low), high)
    assert sorted(t["p_holm"] for t in tests.values()) == pytest.approx([holm_low, holm_high])
    run.report(results, "main", configs)
    table = open(os.path.join(results, "main.md")).read()
    assert "| dpo offline+humanline | 5 | 0.610 ± 0.010 |" in table
    assert "| dpo online / dpo offline+humanline | 5.00 | – | 5.00 |" in table  # no CPU times were recorded
    assert "| dpo offline | 5 | 0.500 ± 0.007 | 0.250 ± 0.004 | 20 ± 0 | – | 0 ± 0 | 0.0000 ± 0.0000 | no clamp |" in table
    assert "| dpo offline+humanline | 5 | 0.610 ± 0.010 | 0.305 ± 0.005 | 20 ± 0 | – | 0 ± 0 | 0.0000 ± 0.0000 | clamp idle |" in table


def test_time_ratios_use_medians_and_cpu_time(tmp_path):
    results = str(tmp_path)
    configs = [c for c in run.suites(results)["main"] if c[0] in ("kto offline", "kto offline+humanline", "kto online")]
    walls = {"kto offline": [10, 10, 12, 10, 10], "kto offline+humanline": [20, 30, 20, 20, 90], "kto online": [60, 60, 60, 200, 61]}
    for name, _, flags, seeds in configs:
        for seed in range(seeds):
            fake_run(run.run_dir(results, "main", name, seed), [(120, 0.5 + 0.01 * seed)], wall=walls[name][seed],
                     cpu=walls[name][seed] / 2 if seed else None)  # seed 0 ran before CPU times were kept
    run.report(results, "main", configs)
    table = open(os.path.join(results, "main.md")).read()
    # medians: online 60 / 20 = 3.0 wall; CPU from seeds 1-4 only: median(30, 30, 100, 30.5) = 30.25 / median(15, 10, 10, 45) = 12.5
    assert "| kto online / kto offline+humanline | 3.00 | 2.42 |" in table
    assert "| kto offline+humanline / kto offline | 2.00 | 2.50 |" in table  # 20 / 10; 12.5 / median(5, 6, 5, 5) = 2.5


def test_regime():
    assert run.regime(["--offline"], 0.05) == "no clamp"  # no clamp in the loss, whatever a clamp would cut
    assert run.regime(["--humanline"], 0.0) == "clamp idle"
    assert run.regime(["--clip", "clamp"], 0.005) == "clamp rare"
    assert run.regime(["--sync", "humanline", "--clip", "sampling"], 0.02) == "clamp active"
    assert run.regime(["--sync", "humanline"], 0.02) == "no clamp"


def test_an_unfinished_run_is_redone(tmp_path):
    out = run.run_dir(str(tmp_path), "main", "dpo offline", 0)
    fake_run(out, [(60, 0.4)])  # stopped before its last evaluation
    assert not run.finished(out, 120)
    assert run.finished(out, 60)


def test_quick_exercises_every_configuration(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "run.py"), "--quick", "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    quick = os.path.join(str(tmp_path), "quick")
    suites = run.suites(quick)
    assert [c[:3] for c in suites["timing"]] == [c[:3] for c in suites["main"] + suites["offpolicy"]]
    for suite, configs in suites.items():
        if suite in ("timing", "lr"):  # main's configurations again (one at a time; at other rates): not in --quick
            continue
        table = open(os.path.join(quick, f"{suite}.md")).read()
        for name, _, _, _ in configs:
            out = run.run_dir(quick, suite, name, 0)
            assert run.finished(out, 2), out
            assert f"| {name} | 1 |" in table
            assert sorted(os.listdir(out)) == ["args.json", "cpu_seconds", "metrics.jsonl", "wall_seconds"]  # weights removed
    first = json.loads(open(os.path.join(quick, "main.jsonl")).readline())
    assert not math.isnan(first["reward"][0])
    assert 0 < first["cpu"][0] < 10 * first["wall"][0]  # one thread, but torch may start a helper thread or two
