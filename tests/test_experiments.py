"""The reproduction runner: its statistics against independent formulas, the choice of learning rates, the archives,
the refusal to mix code versions, and --quick over every configuration."""

import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import numpy as np
import pytest
import warm
from paths import ROOT
from scipy import stats

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import report  # noqa: E402
import run  # noqa: E402
import runner  # noqa: E402
import stat_tests  # noqa: E402
import studies  # noqa: E402
import suites  # noqa: E402
from studies import first_study, instruction_study, second_study, third_study, toy  # noqa: E402


def test_holm_by_hand():
    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> monotone 0.06
    assert list(stat_tests.holm([0.01, 0.04, 0.03])) == pytest.approx([0.03, 0.06, 0.06])
    assert list(stat_tests.holm([0.5, 0.9])) == pytest.approx([1.0, 1.0])  # capped at 1


@pytest.mark.parametrize(
    "a, b",
    [
        ([0.851, 0.853, 0.849], [0.850, 0.852, 0.848, 0.851, 0.850]),  # equivalent
        ([0.80, 0.83, 0.78], [0.85, 0.86, 0.84]),  # different
        ([0.845, 0.86, 0.83, 0.85, 0.84], [0.843, 0.87, 0.82, 0.85, 0.845]),
    ],
)  # noisy
def test_tost_is_two_shifted_one_sided_welch_tests(a, b):
    # independently: mean(a) - mean(b) > -m is Welch's one-sided test of a + m against b, and < m of a - m against b
    m = 0.01
    lower = stats.ttest_ind(np.add(a, m), b, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(np.subtract(a, m), b, equal_var=False, alternative="less").pvalue
    assert stat_tests.tost(a, b, m) == pytest.approx(max(lower, upper), rel=1e-9)


def test_tost_decides_both_ways():
    assert stat_tests.tost([0.851, 0.853, 0.849], [0.850, 0.852, 0.848], 0.01) < 0.01  # tight and close: equivalent
    assert stat_tests.tost([0.80, 0.83, 0.78], [0.85, 0.86, 0.84], 0.01) > 0.5  # far apart: not equivalent
    assert (
        stat_tests.tost([0.5] * 3, [0.5] * 3, 0.01) == 0.0 and stat_tests.tost([0.5] * 3, [0.6] * 3, 0.01) == 1.0
    )  # no spread


def fake_run(results, suite, name, seed, rewards_by_step, wall=10.0, cpu=None, code="abc", clamped=0.0, **more):
    """A finished run's folder as the runner leaves it; `quality`: a real model's (its answers' quality.json, 10% cut);
    `margin`, `lr`: its reward margin and learning rate; `answers`: its last evaluation's (eval_samples.jsonl)."""
    margin, lr, quality = more.get("margin", 1.0), more.get("lr"), more.get("quality", False)
    out = os.path.join(results, "runs", suite, runner.run_key(name, seed))
    os.makedirs(out)
    evaluated = {"eval/truncated_frac": 0.1} if quality else {}
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for step, reward in rewards_by_step:
            record = {"step": step, "loss": 0.5, "perf/step_seconds": wall / 100, "humanline/clamped_frac": clamped}
            record |= {"rewards/margins": margin, "eval/reward": reward, "eval/accuracy": reward / 2} | evaluated
            f.write(json.dumps(record) + "\n")
    provenance = {"code": code, "commit": "0123456789ab", "dirty": False, "torch": "2.13.0", "transformers": "5.23.0"}
    args = dict(seed=seed, learning_rate=lr, batch_size=32, beta=0.1, max_grad_norm=1.0, online="online" in name)
    args |= dict(sync="humanline" if "humanline" in name else "none", sync_every=1, log_eps_P=-1.5, log_eps_R=1.5)
    args |= dict(clip="clamp" if "humanline" in name else "none", round_size=256, num_samples=8, temperature=0.7)
    args |= dict(max_steps=120, adam_eps=1e-5, weight_decay=0.01, warmup_ratio=0.1, ref_free="on", max_new_tokens=40)
    with open(os.path.join(out, "args.json"), "w") as f:
        json.dump(args | {"provenance": provenance}, f)
    if quality:
        with open(os.path.join(out, "quality.json"), "w") as f:
            json.dump({"perplexity": 12.0, "repeated_words": 0.2}, f)
    if "answers" in more:
        with open(os.path.join(out, "eval_samples.jsonl"), "w") as f:
            f.writelines(json.dumps(a) + "\n" for a in more["answers"])
    with open(os.path.join(out, "wall_seconds"), "w") as f:
        f.write(f"{wall}\n")
    with open(os.path.join(out, "cpu_seconds"), "w") as f:
        f.write(f"{wall if cpu is None else cpu}\n")


def dpo_main(results):
    chosen = {cell: suites.paper_lr(cell) for cell, _, _ in toy.CELLS}
    return [c for c in studies.SUITES["main"].runs(results, chosen) if c[0].startswith("dpo")]


def test_summary_and_significance_on_known_runs(tmp_path):
    results = str(tmp_path)
    configs = dpo_main(results)
    finals = {
        "dpo offline": [0.50, 0.52, 0.48, 0.51, 0.49],
        "dpo offline+humanline": [0.60, 0.62, 0.58, 0.61, 0.64],
        "dpo online": [0.70, 0.69, 0.72, 0.71, 0.66],
        "dpo online+humanline": [0.701, 0.699, 0.7, 0.7, 0.7],
    }
    for name, _, flags, seeds, *_ in configs:
        for seed in seeds:
            wall = 100.0 if "online" in name else 20.0
            fake_run(results, "main", name, seed, [(0, 0.4), (120, finals[name][seed])], wall=wall)
    rows = {r["config"]: r for r in report.summarize(runner.load_runs(results, "main"), configs)}
    off = rows["dpo offline"]
    assert off["seeds"] == 5 and off["reward"][0] == pytest.approx(0.5)
    assert off["reward"][1] == pytest.approx(stats.sem(finals["dpo offline"]))
    tests = {t["comparison"]: t for t in stat_tests.significance(list(rows.values()), toy.main_pairs([]), 0.01)}
    assert len(tests) == 3  # KTO and GRPO have no runs here
    p = {
        k: stats.ttest_ind(finals[a], finals[b], equal_var=False).pvalue
        for k, (a, b) in {
            "off": ("dpo offline+humanline", "dpo offline"),
            "on": ("dpo offline+humanline", "dpo online"),
            "hl": ("dpo online+humanline", "dpo online"),
        }.items()
    }
    assert tests["dpo offline+humanline vs dpo offline"]["p"] == pytest.approx(p["off"])
    ordered = sorted(p.values())  # Holm with three tests: x3, x2, x1, made monotone
    holm = np.maximum.accumulate([min(1, 3 * ordered[0]), min(1, 2 * ordered[1]), ordered[2]])
    assert sorted(t["p_holm"] for t in tests.values()) == pytest.approx(list(holm))
    assert tests["dpo offline+humanline vs dpo offline"]["verdict"] == "higher"
    assert tests["dpo offline+humanline vs dpo online"]["verdict"] == "lower"
    hl = tests["dpo online+humanline vs dpo online"]
    assert (
        hl["verdict"] == ("equivalent (within ±0.01)" if hl["p_tost_holm"] < 0.05 else "not decided")
        and hl["p_holm"] > 0.05
    )
    report.report(results, "main", configs)
    table = open(os.path.join(results, "main.md")).read()
    assert (
        "| dpo offline+humanline | 5 | 0.610 ± 0.010 | 0.542 to 0.678 | 0.305 ± 0.005 | 5e-06 | clamp idle |" in table
    )
    assert (
        "| dpo offline+humanline | 20 ± 0 | 20 ± 0 | 0 ± 0 | 0.0000 ± 0.0000 | 1.000 ± 0.000 | – | – | – |" in table
    )  # time, diagnostics
    assert "| dpo online / dpo offline+humanline | 5.00 | 5.00 | 5.00 |" in table
    assert "5 runs of code abc" not in table and "20 runs of code abc (commit 0123456789)" in table
    assert "| dpo offline | 32 | 0.1 | 1.0 | none | none | – | – | – |" in table  # the settings, from args.json
    assert (
        "| dpo online+humanline | 32 | 0.1 | 1.0 | humanline, every 1 step(s) | clamp [-1.5, 1.5] | – "
        "| rounds of 256 prompts x 8, best vs worst | 0.7 |" in table
    )
    assert "All variants: 120 steps, AdamW (eps 1e-05, weight decay 0.01), warmup 0.1 of the steps" in table


def test_time_ratios_use_medians_of_cpu_time(tmp_path):
    results = str(tmp_path)
    configs = [c for c in dpo_main(results) if c[0] in ("dpo offline", "dpo offline+humanline", "dpo online")]
    walls = {
        "dpo offline": [10, 10, 12, 10, 10],
        "dpo offline+humanline": [20, 30, 20, 20, 90],
        "dpo online": [60, 60, 60, 200, 61],
    }
    for name, _, flags, seeds, *_ in configs:
        for seed in seeds:
            wall = walls[name][seed]
            fake_run(results, "main", name, seed, [(120, 0.5 + 0.01 * seed)], wall=wall, cpu=wall / 2)
    report.report(results, "main", configs)
    table = open(os.path.join(results, "main.md")).read()
    assert "| dpo online / dpo offline+humanline | 3.00 | 3.00 |" in table  # median 60 / median 20
    assert "| dpo offline+humanline / dpo offline | 2.00 | 2.00 |" in table


def test_a_run_resumed_on_changed_code_counts_both_versions(tmp_path):
    """Every attempt of a resumed run is read: one begun on old code and resumed on new code is two versions, though
    its last attempt (and its provenance) name only the new one."""
    results = str(tmp_path)
    configs = dpo_main(results)[:1]
    for seed in configs[0].seeds:
        fake_run(results, "main", configs[0].name, seed, [(120, 0.5)], code="new")
    path = os.path.join(results, "runs", "main", runner.run_key(configs[0].name, configs[0].seeds[0]), "args.json")
    args = json.load(open(path))
    args["attempts"] = [args["provenance"] | {"code": "old", "from_step": 0}, args["provenance"] | {"from_step": 60}]
    json.dump(args, open(path, "w"))
    with pytest.raises(SystemExit, match="2 versions of the code \\(new, old\\)"):
        report.report(results, "main", configs)


def test_a_table_refuses_runs_of_two_code_versions(tmp_path):
    results = str(tmp_path)
    configs = dpo_main(results)[:1]
    for seed in configs[0][3]:
        fake_run(results, "main", configs[0][0], seed, [(120, 0.5)], code="new" if seed else "old")
    with pytest.raises(SystemExit, match="2 versions of the code \\(new, old\\)"):
        report.report(results, "main", configs)
    report.report(results, "main", configs, mix_code=True)
    assert "5 runs of code new, old" in open(os.path.join(results, "main.md")).read()
    checked = dataclasses.replace(studies.SUITES["main"], same_numbers="the two compute alike")
    with mock.patch.dict(studies.SUITES, {"main": checked}):  # a suite that names its check may hold both
        report.report(results, "main", configs)
    assert "5 runs of code new, old" in open(os.path.join(results, "main.md")).read()
    (name, _, _, seeds, *_), (other, *_) = configs[0], dpo_main(results)[1]
    for seed in seeds:  # a second row, all of the old code: the table says which rows ran which version
        fake_run(results, "main", other, seed, [(120, 0.5)], code="old")
    report.report(results, "main", dpo_main(results)[:2], mix_code=True)
    assert f"Code new: {name}. Code old: {name}; {other}." in open(os.path.join(results, "main.md")).read()


def test_the_rate_with_the_best_mean_validation_reward_is_chosen_once_the_sweep_is_complete(tmp_path):
    results = str(tmp_path)
    sweep = [c for c in studies.SUITES["sweep"].runs(results, {}) if c[0].startswith("dpo offline lr")]
    assert [suites.rate_of(c[2]) for c in sweep] == pytest.approx(
        [1.25e-6, 2.5e-6, 5e-6, 1e-5, 2e-5]
    )  # 0.25x-4x of 5e-6
    assert all("toy:valid" in c[2] for c in sweep) and all(c[3] == toy.SWEEP_SEEDS for c in sweep)
    means = [0.80, 0.84, 0.85, 0.86, 0.70]  # 1e-5 is best on average, though one seed of 5e-6 is the best single run
    for (name, _, flags, seeds, *_), mean in zip(sweep, means):
        for i, seed in enumerate(seeds):
            fake_run(
                results,
                "sweep",
                name,
                seed,
                [(120, mean + (0.02 if mean == 0.85 and i == 0 else 0.0) - (0.01 * (i == 2) if mean == 0.85 else 0))],
            )
    assert report.choose_rates(results) == {"dpo offline": 1e-5}
    report.report(results, "sweep", sweep)
    table = open(os.path.join(results, "sweep.md")).read()
    assert (
        "| dpo offline | 5e-06 | 0.800 ± 0.000 | 0.840 ± 0.000 | 0.853 ± 0.009 | **0.860 ± 0.000** | 0.700 ± 0.000 "
        "| 1e-05 |" in table
    )
    assert "| dpo offline+humanline | 5e-06 |  |  |  |  |  | not yet |" in table
    assert open(os.path.join(results, "setup.md")).read().startswith("| variant | batch |")
    os.remove(
        os.path.join(results, "runs", "sweep", runner.run_key(sweep[0][0], sweep[0][3][0]), "cpu_seconds")
    )  # unfinished
    assert report.choose_rates(results) == {}
    main = {c[0]: c for c in studies.SUITES["main"].runs(results, {"dpo offline": 1e-5})}
    assert (
        list(main) == ["dpo offline"]
        and suites.rate_of(main["dpo offline"][2]) == 1e-5
        and "toy:valid" not in main["dpo offline"][2]
    )


def test_the_archive_holds_every_finished_run_byte_stably(tmp_path):
    results = str(tmp_path)
    configs = dpo_main(results)[:2]
    for name, _, _, seeds, *_ in configs:
        for seed in seeds[:3]:
            fake_run(results, "main", name, seed, [(0, 0.4), (120, 0.5 + seed / 100)])
    before = runner.load_runs(results, "main")
    runner.pack(results, "main")
    assert not os.listdir(os.path.join(results, "runs", "main"))  # folders removed once packed
    first = open(os.path.join(results, "main.tar.gz"), "rb").read()
    assert runner.load_runs(results, "main") == before
    fake_run(results, "main", configs[0][0], 3, [(120, 0.9)])  # a later run joins the archive
    runner.pack(results, "main")
    after = runner.load_runs(results, "main")
    assert len(after) == 7 and runner.finished(after[runner.run_key(configs[0][0], 3)], 120)
    os.remove(os.path.join(results, "main.tar.gz"))
    for key, files in after.items():  # the same runs packed again give the same bytes
        if key != runner.run_key(configs[0][0], 3):
            os.makedirs(os.path.join(results, "runs", "main", key))
            for name, text in files.items():
                open(os.path.join(results, "runs", "main", key, name), "w").write(text)
    runner.pack(results, "main")
    assert open(os.path.join(results, "main.tar.gz"), "rb").read() == first


def test_a_run_that_ended_early_evaluated_counts_as_finished(tmp_path):
    # an online run whose whole pass of prompts gave no batch ends before --max_steps with a last evaluation
    results = str(tmp_path)
    fake_run(results, "main", "dpo online", 0, [(0, 0.3), (26, 0.9)])
    key = runner.run_key("dpo online", 0)
    metrics = os.path.join(results, "runs", "main", key, "metrics.jsonl")
    lines = open(metrics).read().splitlines()
    open(metrics, "w").write("\n".join([lines[0], json.dumps(json.loads(lines[1]) | {"ended_early": 1})]) + "\n")
    assert runner.finished(runner.load_runs(results, "main")[key], 120)
    report.report(results, "main", [suites.Config("dpo online", "dpo_humanline.py", ["--online"], [0])])
    table = open(os.path.join(results, "main.md")).read()
    assert (
        "Ended before their last step, a whole pass of prompts giving no batch: dpo online seed 0 at step 26." in table
    )
    open(metrics, "w").write(lines[0] + "\n" + json.dumps({"step": 26, "ended_early": 1}) + "\n")  # no evaluation
    assert not runner.finished(runner.load_runs(results, "main")[key], 120)


def test_an_unfinished_run_is_redone(tmp_path):
    results = str(tmp_path)
    fake_run(results, "main", "dpo offline", 0, [(0, 0.3), (60, 0.4)])  # stopped before its last evaluation
    run_ = runner.load_runs(results, "main")[runner.run_key("dpo offline", 0)]
    assert not runner.finished(run_, 120) and runner.finished(run_, 60)
    killed = os.path.join(
        results, "runs", "main", runner.run_key("dpo online", 0)
    )  # stopped mid-run: a checkpoint, no times
    os.makedirs(os.path.join(killed, "checkpoint-84"))
    open(os.path.join(killed, "metrics.jsonl"), "w").write('{"step": 1, "loss": 0.7}\n')
    assert runner.run_key("dpo online", 0) not in runner.load_runs(results, "main")
    runner.pack(results, "main")
    assert os.path.isdir(killed) and list(runner.load_runs(results, "main")) == [runner.run_key("dpo offline", 0)]


def test_a_real_models_run_that_was_stopped_continues_from_its_checkpoint(tmp_path, monkeypatch):
    """A real model's run (up to an hour) saves every 4 steps; stopped (a signal: exit 0 before its last step), the
    runner keeps the checkpoint, and the suite's rerun resumes it instead of starting over. Its wall and CPU seconds
    add up over every attempt, however many times it was stopped, and where the runner itself ended mid-attempt (its
    machine stopped), up to the attempt's last report of progress; the quality of its answers is measured once it
    finishes. A run whose last evaluation had rewards that failed is not finished."""
    results, flags, calls = str(tmp_path), ["--max_steps", "12"], []
    monkeypatch.setattr(runner.time, "time", lambda: 100.0 * len(calls))  # 100 s of wall time a call

    class MachineStopped(BaseException):  # the runner itself ends with its machine: no line of it runs after
        pass

    def fake_script(cmd, env, log_path, progress=None):  # the script: attempts stop at steps 4 and 8, then finish
        calls.append(cmd)
        if "quality" in cmd:
            open(os.path.join(os.path.dirname(cmd[-1]), "quality.json"), "w").write("{}")
            return 0, 1.0
        out = cmd[cmd.index("--output_dir") + 1]
        last = 4 * sum("--output_dir" in c for c in calls)
        os.makedirs(os.path.join(out, f"checkpoint-{last}"), exist_ok=True)
        open(os.path.join(out, f"checkpoint-{last}", "state-rank0.pt"), "w").close()
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps({"step": s, "eval/reward": 0.5, "eval/bad_rewards": 0}) + "\n" for s in (0, last))
        open(log_path, "a").close()
        if progress and len(calls) == 2:  # the second attempt: its last report of progress, then the machine stops
            progress(20.0)
            raise MachineStopped
        return 0, 10.0 * len(calls)  # 10, then 30 CPU seconds

    monkeypatch.setattr(runner, "run_script", fake_script)
    out = runner.folder(results, "addition", "dpo offline", 0)
    for attempt, ends, says in ((1, SystemExit, "stopped"), (2, MachineStopped, None)):
        with pytest.raises(ends, match=says):
            runner.launch(out, "addition", "dpo offline", "dpo_humanline.py", flags, 0, task="addition")
        assert ("--resume" in calls[-1]) == (attempt == 2)
    assert calls[0][calls[0].index("--save_every") + 1] == "4" and not os.path.exists(os.path.join(out, "cpu_seconds"))
    runner.launch(out, "addition", "dpo offline", "dpo_humanline.py", flags, 0, task="addition")
    assert "--resume" in calls[2] and "quality" in calls[3] and not os.path.exists(os.path.join(out, "checkpoint-12"))
    assert open(os.path.join(out, "cpu_seconds")).read() == "60.0\n"  # 10 + 20 + 30: every attempt's
    assert open(os.path.join(out, "wall_seconds")).read() == "300.0\n"  # 100 s each
    run_ = runner.load_runs(results, "addition")[runner.run_key("dpo offline", 0)]
    assert runner.finished(run_, 12) and sorted(run_) == [
        "cpu_seconds",
        "metrics.jsonl",
        "quality.json",
        "wall_seconds",
    ]
    failed = dict(
        run_, **{"metrics.jsonl": run_["metrics.jsonl"].replace('"eval/bad_rewards": 0', '"eval/bad_rewards": 3')}
    )
    assert not runner.finished(failed, 12)
    calls.clear()
    for _ in range(2):  # the toy's runs (seconds each) keep no checkpoint: a stopped one starts over
        with pytest.raises(SystemExit, match="stopped"):
            runner.launch(
                runner.folder(results, "main", "dpo offline", 1), "main", "dpo offline", "dpo_humanline.py", flags, 1
            )
    assert [c[c.index("--save_every") + 1] for c in calls] == ["0", "0"] and not any("--resume" in c for c in calls)


def test_a_running_attempt_reports_its_cpu_seconds_as_it_goes(tmp_path, monkeypatch):
    """While a script runs, the runner hears its CPU seconds so far: what a rerun adds if the machine stops both."""
    monkeypatch.setattr(runner, "PROGRESS_EVERY", 1)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 2: pass"
    heard = []
    code, cpu = runner.run_script([sys.executable, "-c", burn], dict(os.environ), str(tmp_path / "log"), heard.append)
    assert code == 0 and len(heard) >= 2 and heard == sorted(heard) and 0.5 < heard[-1] <= cpu, (heard, cpu)


def test_a_stopped_run_stops_the_suite_and_its_finished_runs_are_packed(tmp_path, monkeypatch):
    """A run of a suite fails or is stopped while an earlier one is still going: the runs still queued do not start (a
    real model's take an hour each), and what finished is packed."""
    launched, packed, cancelled = [], [], threading.Event()

    class Pool(runner.ThreadPoolExecutor):  # says when the suite has cancelled its queued runs
        def shutdown(self, *a, **kw):
            cancelled.set()
            super().shutdown(*a, **kw)

    def fake_launch(results, suite, name, script, flags, seed, task=None):
        launched.append(name)
        if len(launched) == 1:  # the first run goes on until the suite has stopped
            cancelled.wait(timeout=30)
        elif len(launched) == 2:
            raise SystemExit(f"{name}: stopped")

    monkeypatch.setattr(runner, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(runner, "launch", fake_launch)
    monkeypatch.setattr(runner, "pack", lambda results, suite: packed.append(suite))
    monkeypatch.setattr(
        sys, "argv", ["run.py", "--quick", "--suite", "main", "--jobs", "2", "--results", str(tmp_path)]
    )
    with pytest.raises(SystemExit, match="stopped"):
        run.main()
    queued = len(run.configurations(os.path.join(str(tmp_path), "quick"), quick=True)[0]["main"])
    assert queued >= 6 and len(launched) <= 3  # the two, and at most one the freed thread had already taken
    assert packed == ["main"]


def test_regime():
    assert report.regime(["--offline"], 0.05) == "no clamp"  # no clamp in the loss, whatever a clamp would cut
    assert report.regime(["--humanline"], 0.0) == "clamp idle"
    assert report.regime(["--clip", "clamp"], 0.005) == "clamp rare"
    assert report.regime(["--sync", "humanline", "--clip", "sampling"], 0.02) == "clamp active"
    assert report.regime(["--sync", "humanline"], 0.02) == "no clamp"


def test_shapes_tell_code_paths_apart():
    assert runner.shape("dpo_humanline.py", ["--humanline", "--sync_every", "2"]) == runner.shape(
        "dpo_humanline.py", ["--humanline", "--sync_every", "16"]
    )
    assert runner.shape("dpo_humanline.py", ["--sync", "humanline"]) != runner.shape(
        "dpo_humanline.py", ["--sync", "trust_region"]
    )
    assert runner.shape("dpo_humanline.py", ["--beta", "0"]) == runner.shape("dpo_humanline.py", ["--beta", "0.1"])
    assert runner.shape("dpo_humanline.py", ["--offline"]) != runner.shape("kto_humanline.py", ["--offline"])
    assert runner.shape("dpo_humanline.py", ["--offline", "--eval_prompts", "toy:valid"]) == runner.shape(
        "dpo_humanline.py", ["--offline"]
    )
    assert runner.shape("dpo_humanline.py", ["--online"]) != runner.shape("dpo_humanline.py", ["--offline"])


def test_quick_exercises_every_configuration(tmp_path, monkeypatch):
    """`experiments/run.py --quick`: the runner's own main, its runs forked from warm servers (tests/warm.py)."""

    def run_script(cmd, env, log_path, progress=None):
        assert cmd[0] == sys.executable
        reply = warm.SERVERS.launch(cmd[1:], 1, cwd=ROOT, env=env, stdout=log_path, stderr=log_path)
        return reply["returncode"], reply["cpu_seconds"]

    monkeypatch.setattr(runner, "run_script", run_script)
    monkeypatch.setattr(sys, "argv", ["run.py", "--quick", "--results", str(tmp_path)])
    run.main()
    quick = os.path.join(str(tmp_path), "quick")
    toy = lambda configs: {s: c for s, c in configs.items() if not studies.SUITES[s].task}  # noqa: E731
    chosen = run.configurations(quick, quick=True)[1]
    full = {  # the real model's suites run only when named (and made): the toy's are every suite's code path
        (suite, name): runner.shape(script, flags)
        for suite, configs in toy({s: e.runs(quick, chosen) for s, e in studies.SUITES.items()}).items()
        for name, script, flags, *_ in configs
    }
    assert not any(os.path.exists(os.path.join(quick, f"{task}.md")) for task in suites.smollm2.TASKS)
    ran = set()
    for suite, configs in toy(run.configurations(quick, quick=True)[0]).items():
        table = open(os.path.join(quick, f"{suite}.md")).read()
        runs = runner.load_runs(quick, suite)
        for name, script, flags, seeds, *_ in configs:
            assert runner.finished(runs[runner.run_key(name, seeds[0])], 2), name
            assert f"| {name} | 1 |" in table or (suite == "sweep" and f"| {name.rsplit(' lr ', 1)[0]} |" in table)
            kept = ["args.json", "cpu_seconds", "metrics.jsonl", "wall_seconds"]  # and the last evaluation's answers
            assert sorted(runs[runner.run_key(name, seeds[0])]) == sorted(kept + ["eval_samples.jsonl"])
            ran.add(full[(suite, name)])
    assert set(full.values()) <= ran  # every code path of every suite ran
    first = json.loads(open(os.path.join(quick, "main.jsonl")).readline())
    assert not math.isnan(first["reward"][0]) and 0 < first["cpu"][0] < 10 * first["wall"][0]
    assert not os.listdir(os.path.join(quick, "runs", "main"))  # all packed into main.tar.gz


def test_the_stated_starting_reward_is_the_scripts_step_0_evaluation(tmp_path):
    import runpy
    import signal
    from unittest import mock

    handler = signal.getsignal(signal.SIGTERM)
    argv = [
        "dpo_humanline.py",
        "--max_steps",
        "1",
        "--batch_size",
        "8",
        "--micro_batch_size",
        "8",
        "--eval_every",
        "1",
        "--eval_prompts",
        "toy:valid",
        "--save_every",
        "0",
        "--output_dir",
        str(tmp_path),
    ]
    try:
        with mock.patch.object(sys, "argv", argv):
            runpy.run_path(os.path.join(ROOT, "dpo_humanline.py"), run_name="__main__")
    finally:
        signal.signal(signal.SIGTERM, handler)
    step0 = json.loads(open(tmp_path / "metrics.jsonl").readline())
    assert step0["step"] == 0 and step0["eval/reward"] == pytest.approx(toy.toy_start("valid"), abs=1e-9)
    assert toy.toy_start("test") == pytest.approx(0.6883, abs=1e-4) != pytest.approx(step0["eval/reward"], abs=1e-4)


def test_the_verdicts_read_the_holm_corrected_p_values_at_5_percent():
    """Three comparisons: Holm over p (0.01, 0.04, 0.5) gives 0.03, 0.08, 0.5 and over the TOST's (0.5, 0.01, 0.3)
    0.6, 0.03, 0.6: a difference where the first is under 5% (its sign the difference's), else equivalence where the
    second is, else not decided; the margin is the one the test was given."""
    tests = [dict(p=0.01, p_tost=0.5, diff=-0.1), dict(p=0.04, p_tost=0.01, diff=0.02), dict(p=0.5, p_tost=0.3, diff=0)]
    found = stat_tests.verdicts(tests, margin=0.05)
    assert [t["p_holm"] for t in found] == pytest.approx([0.03, 0.08, 0.5])
    assert [t["p_tost_holm"] for t in found] == pytest.approx([0.6, 0.03, 0.6])
    assert [t["verdict"] for t in found] == ["lower", "equivalent (within ±0.05)", "not decided"]
    assert stat_tests.verdicts([dict(p=0.049, p_tost=0.001, diff=0.2)], 0.01)[0]["verdict"] == "higher"


def test_the_detectable_difference_is_at_the_level_holm_holds_each_paired_test_to():
    """Paired comparisons ranked by p: the smallest p's detectable difference at 5% / 3, the next at 5% / 2, the last
    at 5% (Holm's step-down levels), each from its own seeds' spread; the TOST's p Holm-corrected like the test's."""
    diffs = {"a": [0.30, 0.32, 0.31, 0.29], "b": [0.10, 0.20, 0.05, 0.15], "c": [0.0, 0.1, -0.1, 0.05]}
    rows = [dict(config="base", args=[{"seed": s} for s in range(4)], rewards=[0.0] * 4, answers=[[]] * 4)]
    rows += [
        dict(config=n, args=[{"seed": s} for s in range(4)], rewards=d, answers=[[]] * 4) for n, d in diffs.items()
    ]
    tests = stat_tests.paired(rows, [(n, "base") for n in diffs], margin=0.05, resamples=0)
    assert [t["comparison"] for t in sorted(tests, key=lambda t: t["p"])] == ["a vs base", "b vs base", "c vs base"]
    for t, level in zip(tests, (0.05 / 3, 0.05 / 2, 0.05)):
        se = stats.sem(diffs[t["a"]])
        assert t["detectable"] == pytest.approx((stats.t.ppf(1 - level / 2, 3) + stats.t.ppf(0.8, 3)) * se)
    assert [t["p_tost_holm"] for t in tests] == pytest.approx(list(stat_tests.holm([t["p_tost"] for t in tests])))


def test_new_seed_range_by_hand():
    # [0, 1, 2, 3, 4]: mean 2, sd sqrt(2.5) = 1.581139, t(0.975, 4) = 2.776445, sqrt(1 + 1/5) = 1.095445 -> +-4.80894
    assert stat_tests.new_seed_range([0, 1, 2, 3, 4]) == pytest.approx((2 - 4.80894, 2 + 4.80894), abs=1e-4)
    lo, hi = stat_tests.new_seed_range([0.834, 0.839, 0.834])
    assert lo < 0.834 and hi > 0.839  # wider than the seeds' own range
    assert all(math.isnan(v) for v in stat_tests.new_seed_range([0.8]))


def test_report_remakes_the_committed_tables_from_the_committed_archives(tmp_path):
    """The documented `--report` (the toy's suites; each real-model suite by name), on a copy of the committed results
    only (no run folders, no built instances), writes every committed table and summary again, byte for byte."""
    tracked = subprocess.run(
        ["git", "ls-files", "experiments/results"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    files = [f for f in tracked.stdout.split() if not re.search("/(previous|superseded|partial)/", f)]
    if not any(f.endswith(".tar.gz") for f in files):
        pytest.skip("not a git checkout with committed results")
    names = {"setup.md"} | {f"{s}{x}" for s in studies.SUITES for x in (".md", ".jsonl")}
    tables = [f for f in files if os.path.basename(f) in names]
    real = [s for s, e in studies.SUITES.items() if e.task and f"experiments/results/{e.reads or s}.tar.gz" in files]
    assert len(tables) == 5 + 2 * len(real)  # the toy's 2 suites and setup.md, and each real-model suite run
    for f in set(files) - set(tables):  # the tables are left out: the report has to write them
        dest = tmp_path / os.path.relpath(f, "experiments/results")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(open(os.path.join(ROOT, f), "rb").read())

    def rebuild(command):  # as documented, each a process of its own (forked from a warm server), two at a time
        report_cmd = [sys.executable, os.path.join(ROOT, "experiments", "run.py"), "--report", *command]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        return warm.run(report_cmd + ["--results", str(tmp_path)], cwd=ROOT, env=env, timeout=600)

    with ThreadPoolExecutor(2) as pool:
        for out in pool.map(rebuild, [[]] + [["--suite", s] for s in real]):
            assert out.returncode == 0, out.stderr[-2000:]
    for f in tables:
        assert (tmp_path / os.path.relpath(f, "experiments/results")).read_text() == open(
            os.path.join(ROOT, f)
        ).read(), f


def test_the_real_models_suites_choose_a_rate_on_validation_and_compare_on_the_test_prompts(tmp_path):
    """<task>_sweep: each variant at 1x, 4x and 16x the paper's rate, one seed, on the task's 128 validation prompts;
    <task>: each at its chosen rate, 5 seeds (KTO 3), on the 256 test prompts; the report's tests use the ±0.05 margin
    and give each row's success after, the share of its answers cut off, and their quality beyond the reward."""
    results = str(tmp_path)
    sweep = studies.SUITES["addition_sweep"].runs(results, {})
    valid = "experiments/smollm2/addition/valid.jsonl"
    assert len(sweep) == 27 and all(c.seeds == (100,) and valid in c.flags for c in sweep)
    dpo = [c for c in sweep if c.name.startswith("addition dpo offline lr")]
    assert [suites.rate_of(c.flags) for c in dpo] == pytest.approx([5e-6, 2e-5, 8e-5])
    for c, reward in zip(dpo, (0.30, 0.45, 0.20)):
        fake_run(results, "addition_sweep", c.name, c.seeds[0], [(32, reward)], quality=True)
    assert report.choose_rates(results) == {"addition dpo offline": 2e-5}
    chosen = {f"addition {cell}": 1e-5 for cell in first_study.ARMS}
    main = {c.name: c for c in studies.SUITES["addition"].runs(results, chosen)}
    test = "experiments/smollm2/addition/test.jsonl"
    assert all(c.seeds == ((0, 1, 2) if c.script.startswith("kto") else (0, 1, 2, 3, 4)) for c in main.values())
    assert all(test in c.flags and "--no_eval_at_start" in c.flags for c in main.values())
    online = {a: main[f"{a} online"].flags for a in ("dpo", "kto", "grpo")}  # each objective's own sampling
    assert all(
        f[f.index("--round_size") + 1] == "32" and f[f.index("--num_samples") + 1] == "4"
        for f in (online["dpo"], online["kto"])
    )
    assert online["grpo"][online["grpo"].index("--num_generations") + 1] == "4" and "--reward_funcs" in online["grpo"]
    finals = {
        "dpo offline": (0.30, 0.31, 0.29, 0.30, 0.30),
        "dpo offline+humanline": (0.40, 0.42, 0.41, 0.40, 0.42),
        "dpo online": (0.41, 0.40, 0.42, 0.41, 0.41),
    }
    for name, rewards in finals.items():
        for seed, reward in zip(main[name].seeds, rewards):
            fake_run(results, "addition", name, seed, [(32, reward)], quality=True)
    report.report(results, "addition", list(main.values()))
    table = open(os.path.join(results, "addition.md")).read()
    p = stat_tests.holm(
        [
            stats.ttest_ind(finals["dpo offline+humanline"], finals[b], equal_var=False).pvalue
            for b in ("dpo offline", "dpo online")
        ]
    )
    p_tost = stat_tests.holm(
        [stat_tests.tost(finals["dpo offline+humanline"], finals[b], 0.05) for b in ("dpo offline", "dpo online")]
    )
    assert "| dpo offline+humanline vs dpo offline | +0.110 | " in table and f"| {p[0]:.3g} |" in table
    assert f"| {p_tost[1]:.3g} | equivalent (within ±0.05) |" in table  # ±0.01 could not be decided with 5 seeds
    start = suites.smollm2.starting("addition", "test")
    gain = f"{0.300 - start:.3f}"
    assert (
        f"| dpo offline | 5 | 0.300 ± 0.003 | {gain} ± 0.003 | 0.100 ± 0.000 | 12.00 ± 0.00 | 0.200 ± 0.000 |" in table
    )


@pytest.mark.parametrize(
    "suite, arm, split",
    [
        ("instructions", "dpo offline", "test_heldout"),
        ("addition", "dpo offline", "test"),
        ("horizon", "grpo online, N = 1", "valid"),
    ],
)
def test_the_answers_section_shows_each_runs_first_answer_of_each_kind(tmp_path, suite, arm, split):
    """The real model's answers, as the scripts write them (prompt, completion, reward, finished; no constraint
    column): each run's first answer to a prompt of each kind (constraint or phrasing, read from the split the suite
    is scored on: the horizon's validation prompts), its reward and `cut` where it did not finish."""
    task = studies.SUITES[suite].task
    results = str(tmp_path)
    chosen = {
        f"{task} {prefix}{arm}": 2e-5 for prefix in ("", second_study.STUDY, instruction_study.INSTRUCTION)
    }  # each study's key
    rows = [json.loads(line) for line in open(os.path.join(runner.ROOT, suites.smollm2.data(task, split)))]
    firsts = {}
    for row in rows:
        firsts.setdefault(suites.smollm2.kind(task, row), row)
    answers = [
        dict(prompt=r["prompt"], completion=f"answer {i}", reward=i % 2, finished=i > 0) for i, r in enumerate(rows)
    ]
    configs = [c for c in studies.SUITES[suite].runs(results, chosen) if c.name == arm]
    for seed in configs[0].seeds:
        last = runner.max_steps_of(configs[0].flags)
        fake_run(results, suite, arm, seed, [(last, 0.3)], quality=True, answers=answers)
    report.report(results, suite, configs)
    table = open(os.path.join(results, f"{suite}.md")).read()
    prompts = "validation" if split == "valid" else "test"  # the tables name the prompts they were scored on
    assert f"the first {prompts} prompt of each kind" in table and f"{prompts.capitalize()} success after" in table
    shown = [line for line in table.splitlines() if line.startswith("- ")]
    assert len(firsts) > 1 and len(shown) == len(firsts) * len(configs[0].seeds)
    for row in firsts.values():
        i = rows.index(row)
        said = f"- {row['prompt'][-1]['content']} → 'answer {i}' ({i % 2}{', cut' * (i == 0)})"
        assert table.count(said + "\n") == len(configs[0].seeds)


def test_a_suite_queues_its_runs_seed_by_seed(tmp_path, monkeypatch):
    """Every configuration's seed 0, then every configuration's seed 1: a suite stopped part-way holds paired arms."""
    launched = []
    monkeypatch.setattr(runner, "launch", lambda results, suite, name, script, flags, seed, task: launched.append(seed))
    monkeypatch.setattr(runner, "pack", lambda results, suite: None)
    configs = [suites.Config(name, "dpo_humanline.py", ["--max_steps", "2"], (0, 1, 2)) for name in "abc"]
    runner.run_suite(str(tmp_path), "main", studies.SUITES["main"], configs, jobs=1)
    assert launched == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("best", ["highest", "lowest"])
def test_a_grid_grows_no_further_than_256x_and_a_quarter_of_the_papers_rate(tmp_path, best):
    """Where the edge rate wins at every size of the grid, it grows 4x at a time to 256x the paper's rate (1.28e-3 for
    GRPO's 5e-6) or down to 0.25x (1.25e-6), and stops there: the plans' limits."""
    results, key = str(tmp_path), f"addition {second_study.STUDY}grpo offline, no anchor"
    sweep = lambda: [c for c in studies.SUITES["anchor_sweep"].runs(results, {}) if c.variant == key]  # noqa: E731
    ran = set()
    for _ in range(8):  # each round runs the grid's new rates, the edge one best
        for c in [c for c in sweep() if c.name not in ran]:
            reward = c.rate * 1e3 if best == "highest" else 1 - c.rate * 1e3
            for seed in c.seeds:
                fake_run(results, "anchor_sweep", c.name, seed, [(32, reward)], quality=True)
            ran.add(c.name)
    rates = [c.rate for c in sweep()]
    edge = 1.28e-3 if best == "highest" else 1.25e-6
    assert (max(rates) if best == "highest" else min(rates)) == pytest.approx(edge) and len(rates) == 5
    assert report.choose_rates(results)[key] == pytest.approx(edge)


def test_the_second_studys_sweep_grows_its_grid_past_an_edge_that_wins(tmp_path):
    """The plan's rule (docs/results.md): each arm's rates on the validation prompts with 2 seeds each; where the top
    rate wins, the grid grows by one rate 4x above it, and nothing is chosen until that rate has run every seed."""
    results, arm = str(tmp_path), "grpo offline, no anchor"
    key = f"addition {second_study.STUDY}{arm}"
    mine = [c for c in studies.SUITES["anchor_sweep"].runs(results, {}) if c.variant == key]
    assert [c.rate for c in mine] == pytest.approx([5e-6, 2e-5, 8e-5, 3.2e-4])
    assert all(c.seeds == (100, 101) and "--beta 0 --eps 1e9" in " ".join(c.flags) for c in mine)
    assert all(suites.smollm2.data("addition", "valid") in c.flags and runner.max_steps_of(c.flags) == 32 for c in mine)
    for c, reward in zip(mine, (0.1, 0.2, 0.3, 0.4)):  # the top of the grid wins
        for seed in c.seeds:
            fake_run(results, "anchor_sweep", c.name, seed, [(32, reward)], quality=True)
    grown = [c for c in studies.SUITES["anchor_sweep"].runs(results, {}) if c.variant == key]
    assert [c.rate for c in grown] == pytest.approx([5e-6, 2e-5, 8e-5, 3.2e-4, 1.28e-3])
    assert key not in report.choose_rates(results)  # 1.28e-3 has not run yet
    for seed in grown[-1].seeds:  # it runs, and the rate inside wins: the grid stops growing
        fake_run(results, "anchor_sweep", grown[-1].name, seed, [(32, 0.35)], quality=True)
    chosen = report.choose_rates(results)
    assert chosen[key] == pytest.approx(3.2e-4) and len(studies.SUITES["anchor_sweep"].runs(results, {})) == 19
    compared = {c.name: c for c in studies.SUITES["anchor"].runs(results, chosen)}
    assert list(compared) == [arm] and compared[arm].seeds == tuple(range(10))
    assert suites.smollm2.data("addition", "test") in compared[arm].flags
    assert suites.rate_of(compared[arm].flags) == pytest.approx(3.2e-4)


def test_the_second_studys_off_policy_arms_sample_every_16_steps_for_64(tmp_path):
    chosen = {f"addition {second_study.STUDY}{arm}": 2e-5 for arm in second_study.OFFPOLICY_ARMS}
    arms = {c.name: c for c in studies.SUITES["offpolicy_addition"].runs(str(tmp_path), chosen)}
    assert list(arms) == list(second_study.OFFPOLICY_ARMS) and all(c.seeds == (0, 1, 2, 3, 4) for c in arms.values())
    for name, c in arms.items():
        shape = " ".join(c.flags)
        assert runner.max_steps_of(c.flags) == 64 and "--num_generations 8 --batch_size 16" in shape
        assert shape.count("--max_steps") == shape.count("--batch_size") == 1
        assert ("--sample_every 16" in shape) == ("N = 16" in name) and ("--humanline" in shape) == ("k = " in name)
        assert ("--sync_every 4" in shape) == name.endswith("k = 4")
        assert ("--beta 0 --eps 1e9" in shape) == name.endswith("no anchor")  # the control


def test_the_paired_test_is_the_t_distributions_closed_form_with_two_degrees_of_freedom():
    """Per-seed differences 0.1, 0.2, 0.3 (3 seeds, 2 degrees of freedom, whose t distribution has the closed form
    F(t) = 1/2 + t / (2 sqrt(t^2 + 2))): mean 0.2, standard error 0.1 / sqrt 3."""
    se = 0.1 / math.sqrt(3)
    sf = lambda t: 0.5 - t / (2 * math.sqrt(t * t + 2))  # noqa: E731
    quantile = lambda f: (2 * f - 1) * math.sqrt(2 / (1 - (2 * f - 1) ** 2))  # noqa: E731 (F's inverse)
    got = stat_tests.paired_test([0.1, 0.2, 0.3], margin=0.05)
    assert got["diff"] == pytest.approx(0.2) and got["p"] == pytest.approx(2 * sf(0.2 / se))
    assert got["ci"] == pytest.approx((0.2 - quantile(0.975) * se, 0.2 + quantile(0.975) * se))
    assert got["p_tost"] == pytest.approx(1 - sf((0.2 - 0.05) / se))  # the lower test is the larger p
    assert got["detectable"] == pytest.approx((quantile(0.975) + quantile(0.8)) * se)
    assert stat_tests.paired_test([0.1, 0.1], margin=0.05) | {"ci": None} == dict(
        diff=pytest.approx(0.1), ci=None, p=0.0, p_tost=1.0, detectable=0.0
    )


def test_paired_comparisons_match_runs_by_seed_and_bootstrap_over_prompts():
    """Two configurations whose runs are listed in different seed orders: the differences are taken seed by seed; the
    bootstrap averages each prompt over seeds first (b scores 0.5 on prompt p1, 0 on p2; a scores 1 on both)."""

    def answers(*rewards):
        return [{"prompt": f"p{i + 1}", "reward": r} for i, r in enumerate(rewards)]

    a = dict(config="a", args=[{"seed": 0}, {"seed": 1}, {"seed": 2}], rewards=[0.5, 0.6, 0.9])
    a["answers"] = [answers(1.0, 1.0)] * 3
    b = dict(config="b", args=[{"seed": 2}, {"seed": 0}, {"seed": 1}], rewards=[0.6, 0.3, 0.5])
    b["answers"] = [answers(1.0, 0.0), answers(0.0, 0.0), answers(0.5, 0.0)]
    (t,) = stat_tests.paired([a, b], [("a", "b")], margin=0.05, resamples=2000)
    assert t["seeds"] == 3 and t["diff"] == pytest.approx(0.2)  # differences 0.2, 0.1, 0.3
    assert t["p"] == pytest.approx(stat_tests.paired_test([0.2, 0.1, 0.3], 0.05)["p"]) and t["p_holm"] == t["p"]
    low, high = t["prompts_ci"]  # per prompt: 1 - 0.5 and 1 - 0, so the mean difference is 0.5 or 0.75 or 1
    assert 0.5 <= low <= 0.75 <= high <= 1.0 and low < high


def test_the_instruction_study_sweeps_ten_arms_and_scores_them_on_the_test_and_held_out_prompts():
    """Its sweep: each arm at 1x, 4x and 16x the paper's rate, 2 seeds, on the 128 validation prompts; its comparison:
    the 384 test and held-out prompts, 8 seeds for DPO's and GRPO's offline + humanline and online arms, 5 for the
    rest, seven paired comparisons with the hacks and by-topic sections; KTO online at the amendment's 1.6e-4, whatever
    its sweep chose."""
    sweep = studies.SUITES["instructions_sweep"].runs("no-results", {})
    assert len(sweep) == 30 and all(c.seeds == (100, 101) for c in sweep)
    assert all(c.flags[c.flags.index("--eval_prompts") + 1].endswith("constraints/valid.jsonl") for c in sweep)
    chosen = {f"constraints {instruction_study.INSTRUCTION}{arm}": 1e-5 for arm in instruction_study.ARMS}
    configs = {c.name: c for c in studies.SUITES["instructions"].runs("no-results", chosen)}
    assert len(configs) == 10 and sum(len(c.seeds) for c in configs.values()) == 62
    assert all(c.flags[c.flags.index("--num_eval_prompts") + 1] == "384" for c in configs.values())
    assert [n for n, c in configs.items() if len(c.seeds) == 8] == [
        f"{a} {m}" for a in ("dpo", "grpo") for m in ("offline+humanline", "online")
    ]
    assert configs["grpo offline, no anchor"].flags[-4:-2] == ["--eps", "1e9"]
    rates = {n: suites.rate_of(c.flags) for n, c in configs.items()}
    assert rates.pop("kto online") == 1.6e-4 and set(rates.values()) == {1e-5}
    assert configs["kto online"].flags.count("--learning_rate") == 1
    entry = studies.SUITES["instructions"]
    assert len(entry.pairs([])) == 7 and {instruction_study.hacks, "phrasing", "paired"} <= set(entry.sections)


def test_the_hacks_section_counts_each_way_to_score_in_the_successes():
    """Constraints: of a row's successes over its seeds (answers online policies wrote), the shares that talk about the
    task, say the asked word twice, double a word, and hold the commonest four words with the topic and asked word put
    aside, and the seed most held by its own; a failed answer is not counted."""
    test = [json.loads(line) for line in open(os.path.join(runner.ROOT, suites.smollm2.data("constraints", "test")))]
    ask = {(r["constraint"], r["topic"]): r["prompt"] for r in test}
    said = [
        ("start:blue", "trains", "Blue trains are a type of train that is blue.", 1.0),
        ("start:old", "mountains", "Old mountains are a type of mountains that are older than the ones you know.", 1.0),
        ("end:soft", "a dog", "A dog is soft and soft.", 1.0),
        ("include:cold", "a dog", "The dog is cold due to the cold weather.", 1.0),
        ("include:cold", "a dog", "This sentence is about a dog and is cold.", 0.0),  # failed: not counted
    ]
    assert all(key in ask for key, *_ in [((c, t),) for c, t, *_ in said])
    answers = [dict(prompt=ask[c, t], completion=text, reward=r, finished=True) for c, t, text, r in said]
    rows = [dict(config="dpo online", seeds=2, args=[{"seed": 0}, {"seed": 1}], answers=[answers[2:], answers[:2]])]
    ctx = types.SimpleNamespace(entry=studies.SUITES["instructions"])
    lines = instruction_study.hacks(rows, ctx)
    # 4 successes: none talks, three say the word twice (not "Old ... older"), one doubles it, two share "_ _ are a":
    # both of seed 1's, where seed 0's two share no four words (half of them hold their commonest)
    assert "| dpo online | 2 | 4 | 0.000 | 0.750 | 0.250 | 0.500 (_ _ are a) | seed 1: 1.000 (_ _ are a) |" in lines
    assert instruction_study.hacks in ctx.entry.sections
    tied = [dict(rows[0], args=[{"seed": 0}, {"seed": 1}], answers=[answers[:2], answers[:2]])]  # 1.000 each
    assert instruction_study.hacks(tied, ctx)[-1].endswith("| seed 0: 1.000 (_ _ are a) |")  # the first among equals


def test_the_signal_section_counts_steps_whose_every_group_tied_and_the_clamps_largest_step():
    """Per seed: the share of logged steps with grpo/no_signal 1.0 and the mean share of sequences; the clamp's mean
    (the row's) and its largest step over every seed."""
    train = [
        {"grpo/no_signal": [(1, 1.0), (2, 1.0), (3, 0.5), (4, 0.5)], "humanline/clamped_frac": [(1, 0.0), (2, 0.004)]},
        {"grpo/no_signal": [(1, 0.0), (2, 0.0)], "humanline/clamped_frac": [(1, 0.002), (2, 0.0)]},
    ]
    rows = [dict(config="grpo off-policy+humanline", seeds=2, clamped_frac=(0.0015, 0.0005), train=train)]
    lines = report.signal(rows, None)
    assert "| grpo off-policy+humanline | 2 | 0.250 ± 0.250 | 0.375 ± 0.375 | 0.0015 ± 0.0005 | 0.0040 |" in lines
    assert "signal" in studies.SUITES["offpolicy_addition"].sections


def test_a_suite_copies_anothers_runs_of_the_same_configuration_seed_and_rate_and_runs_only_the_rest(
    tmp_path, monkeypatch
):
    """The third study's D holds A's humanline and control runs: copied from `anchor` where the configuration, seed and
    learning rate agree (file for file), the rest launched; a run of another rate is not copied."""
    results = str(tmp_path)
    chosen = {f"addition {second_study.STUDY}{arm}": 2e-5 for arm in (third_study.HUMANLINE, third_study.NO_ANCHOR_ARM)}
    chosen |= {f"addition {third_study.THIRD}{arm}": 2e-5 for arm in list(third_study.DISSECTION_ARMS)[2:]}
    configs = studies.SUITES["dissection"].runs(results, chosen)
    assert [c.name for c in configs] == [
        *third_study.DISSECTION_ARMS,
        third_study.CLIP_AT_2E5,
    ]  # the amendment's row last
    assert all(c.seeds == tuple(range(10)) for c in configs) and suites.rate_of(configs[-1].flags) == 2e-5
    for seed in range(10):
        fake_run(results, "anchor", third_study.HUMANLINE, seed, [(32, 0.4 + seed / 100)], quality=True, lr=2e-5)
        fake_run(results, "anchor", third_study.NO_ANCHOR_ARM, seed, [(32, 0.5)], quality=True, lr=8e-5)
    runner.pack(results, "anchor")
    launched = []
    monkeypatch.setattr(runner, "launch", lambda results, suite, name, *_, task: launched.append(name))
    runner.run_suite(results, "dissection", studies.SUITES["dissection"], configs, jobs=1)
    theirs, mine = runner.load_runs(results, "anchor"), runner.load_runs(results, "dissection")
    copied = [runner.run_key(third_study.HUMANLINE, seed) for seed in range(10)]
    assert sorted(mine) == sorted(copied) and all(mine[key] == theirs[key] for key in copied)
    assert (
        len(launched) == 60
        and third_study.HUMANLINE not in launched
        and launched.count(third_study.NO_ANCHOR_ARM) == 10
    )
    rows = report.summarize(mine, configs)
    assert [r["rewards"] for r in rows] == [pytest.approx([0.4 + seed / 100 for seed in range(10)])]
    fake_run(results, "dissection", third_study.NO_ANCHOR_ARM, 0, [(32, 0.5)], quality=True, lr=2e-5, code="new")
    report.report(results, "dissection", configs)  # two code versions, no --mix_code: the copies are its own
    table = open(os.path.join(results, "dissection.md")).read()
    assert "Code abc: grpo offline+humanline." in table and "Code new: grpo offline, no anchor." in table  # said


def test_the_phrasing_section_splits_success_by_phrasing_by_hand(tmp_path):
    """Two arms, two seeds, four test answers a run (three training phrasings, one held out): each phrasing's success
    averaged over seeds, the finished equations' share, and the paired difference on the held-out phrasing."""
    results = str(tmp_path)
    chosen = {f"addition {second_study.STUDY}{arm}": 2e-5 for arm in (third_study.HUMANLINE, third_study.NO_ANCHOR_ARM)}
    configs = [c._replace(seeds=(0, 1)) for c in studies.SUITES["dissection"].runs(results, chosen)]
    asks = [*suites.smollm2.PHRASINGS, suites.smollm2.HELD_OUT]
    prompts = [[{"role": "user", "content": ask.format(a=12, b=30)}] for ask in asks]
    said = {  # per arm and seed: each answer's (reward, finished, completion)
        (third_study.HUMANLINE, 0): [
            (1, True, "12 + 30 = 42"),
            (1, True, "42"),
            (0, True, "12 + 30 = 41"),
            (0, False, "It"),
        ],
        (third_study.HUMANLINE, 1): [(1, True, "42"), (1, True, "42"), (1, True, "42"), (0, True, "12 + 30 = 40")],
        (third_study.NO_ANCHOR_ARM, 0): [(1, True, "12 + 30 = 42")] * 3 + [(1, True, "12 + 30 = 42")],
        (third_study.NO_ANCHOR_ARM, 1): [(0, True, "12 + 30 = 43")] * 3 + [(1, True, "12 + 30 = 42")],
    }
    for (arm, seed), answers in said.items():
        answers = [dict(prompt=p, reward=r, finished=f, completion=c) for p, (r, f, c) in zip(prompts, answers)]
        fake_run(results, "dissection", arm, seed, [(32, 0.5)], quality=True, answers=answers, lr=2e-5)
    rows = report.summarize(runner.load_runs(results, "dissection"), configs)
    ctx = types.SimpleNamespace(entry=studies.SUITES["anchor"], names=[r["config"] for r in rows])  # A's pairs
    table = "\n".join(report.phrasing(rows, ctx))
    # humanline: training 2/3 and 3/3 (mean 0.833, s.e. 0.167), held out 0 and 0; finished equations on the training
    # phrasings 2/3 and 0/3, held out 0 (cut) and 1
    assert (
        f"| {third_study.HUMANLINE} | 2 | 0.833 ± 0.167 | 0.000 ± 0.000 | 0.333 ± 0.333 | 0.500 ± 0.500 | 0.0000"
        in table
    )
    # the control: training 1 and 0, held out 1 and 1; every answer a finished equation
    assert (
        f"| {third_study.NO_ANCHOR_ARM} | 2 | 0.500 ± 0.500 | 1.000 ± 0.000 | 1.000 ± 0.000 | 1.000 ± 0.000 |" in table
    )
    # humanline - control, paired: training -1/3 and +1 (mean +0.333), held out -1 and -1 (no spread, p 0)
    line = next(
        x for x in table.splitlines() if x.startswith(f"| {third_study.HUMANLINE} vs {third_study.NO_ANCHOR_ARM} |")
    )
    assert "| +0.333 (" in line and line.endswith("| -1.000 (-1.000, -1.000), p 0 |")


def test_the_constraints_by_topic_section_splits_success_into_training_and_held_out_topics():
    """The constraints' test prompts, then its held-out ones (topics and words no training prompt uses): each row's
    success on each kind, by hand, and each comparison on each kind, paired by seed."""
    rows_of = [
        json.loads(line) for line in open(os.path.join(runner.ROOT, suites.smollm2.data("constraints", "test_heldout")))
    ]
    seen, held = rows_of[0]["prompt"], rows_of[256]["prompt"]
    assert not suites.smollm2.held_out("constraints", rows_of[0]) and suites.smollm2.held_out(
        "constraints", rows_of[256]
    )

    def row(name, rewards):  # per seed: (reward on the seen prompt, reward on the held-out one)
        answers = [
            [dict(prompt=p, reward=x, finished=True, completion="") for p, x in zip((seen, held), r)] for r in rewards
        ]
        done = dict(config=name, seeds=len(rewards), args=[{"seed": s} for s in range(len(rewards))], answers=answers)
        return done | dict(rewards=[sum(r) / 2 for r in rewards], clamped_frac=(0.0, 0.0), clip_frac=(0.0, 0.0))

    rows = [row("a", [(1, 1), (1, 0)]), row("b", [(0, 0), (1, 0)])]
    entry = types.SimpleNamespace(task="constraints", pairs=lambda names: [("a", "b")], margin=0.05)
    table = "\n".join(report.phrasing(rows, types.SimpleNamespace(entry=entry, names=["a", "b"])))
    assert "| configuration | seeds | success: training topics | held-out | clamped | clipped |" in table
    assert "| a | 2 | 1.000 ± 0.000 | 0.500 ± 0.500 |" in table and "| b | 2 | 0.500 ± 0.500 | 0.000 ± 0.000 |" in table
    assert "| a vs b | +0.500 (-5.853, +6.853), p 0.5 | +0.500 (-5.853, +6.853), p 0.5 |" in table  # 1, 0 and 1, 0


def test_the_horizon_keeps_each_evaluations_answers_and_their_drift_and_draws_them_as_a_table(tmp_path, monkeypatch):
    """A horizon run (--keep_every_eval): the runner measures the quality of each evaluation's answers as of the last,
    keeps them (and drops the weights), and the horizon section gives success and perplexity at each evaluation and
    each seed's fall from its best."""
    results, perplexity = str(tmp_path), {"eval_samples.jsonl": 2.5, "eval_samples-step1.jsonl": 1.5}
    perplexity["eval_samples-step2.jsonl"] = 2.5

    def fake_script(cmd, env, log_path, progress=None):
        if "quality" in cmd:  # smollm2.py quality --samples X writes quality[-step<N>].json beside X
            name = os.path.basename(cmd[-1]).replace("eval_samples", "quality").replace(".jsonl", ".json")
            found = {"perplexity": perplexity[os.path.basename(cmd[-1])], "repeated_words": 0.0}
            json.dump(found, open(os.path.join(os.path.dirname(cmd[-1]), name), "w"))
            return 0, 1.0
        out, seed = cmd[cmd.index("--output_dir") + 1], int(cmd[cmd.index("--seed") + 1])
        success = {1: 0.5, 2: 0.5 - 0.25 * seed}  # seed 1 falls by 0.25 from its best
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            for step, reward in success.items():
                f.write(json.dumps({"step": step, "loss": 0.1, "eval/reward": reward, "eval/bad_rewards": 0}) + "\n")
        for name in perplexity:
            open(os.path.join(out, name), "w").write(json.dumps({"prompt": "p", "completion": "1 + 1 = 2"}) + "\n")
        open(os.path.join(out, "args.json"), "w").write(json.dumps({"seed": seed, "provenance": {"code": "a"}}))
        os.makedirs(os.path.join(out, "checkpoint-2"))
        return 0, 10.0

    monkeypatch.setattr(runner, "run_script", fake_script)
    config = suites.Config("grpo online", "grpo_humanline.py", ["--max_steps", "2", "--keep_every_eval"], (0, 1))
    for seed in config.seeds:
        out = runner.folder(results, "horizon", config.name, seed)
        runner.launch(out, "horizon", config.name, config.script, config.flags, seed, task="addition")
    runs = runner.load_runs(results, "horizon")
    assert sorted(runs[runner.run_key(config.name, 0)]) == sorted(
        ["args.json", "cpu_seconds", "metrics.jsonl", "wall_seconds", "quality.json"]
        + [*perplexity, "quality-step1.json", "quality-step2.json"]
    )
    rows = report.summarize(runs, [config])
    assert rows[0]["drifts"] == [[(1, 1.5), (2, 2.5)]] * 2
    recorded = [json.loads(runs[runner.run_key(config.name, seed)]["args.json"]) for seed in config.seeds]
    assert [r["provenance"] for r in recorded] == [{"code": "a"}] * 2  # the script's record kept
    definitions = [runner.definition("horizon", config.name, config.script, config.flags, s) for s in config.seeds]
    assert [r["suite"] for r in recorded] == [dict(name="horizon", definition=d) for d in definitions]
    assert definitions[0] != definitions[1]  # the digest names the run's own configuration, its seed included
    ctx = types.SimpleNamespace(entry=studies.SUITES["horizon"])
    table = "\n".join(third_study.horizon(rows, ctx))
    assert "| configuration | 1 | 2 |" in table
    assert "| grpo online | 0.500 ± 0.000 (1.50 ± 0.00) | 0.375 ± 0.125 (2.50 ± 0.00) |" in table
    assert (
        "| grpo online | 1 | 0.250 | 0.500 | 0.250 |" in table
        and "| grpo online | 0 | 0.500 | 0.500 | 0.000 |" in table
    )


def test_the_horizons_report_holds_its_sections_and_its_plot(tmp_path):
    """The horizon's report (validation prompts, no tests): its success and drift at each evaluation and each seed's
    fall, GRPO's groups and the clamp, success on the training phrasings alone (the validation prompts hold no other),
    every run's answers; and its plot, where matplotlib is installed."""
    results, entry = str(tmp_path), studies.SUITES["horizon"]
    chosen = {f"addition {second_study.STUDY}{arm}": 2e-5 for arm in third_study.HORIZON_ARMS}
    configs = entry.runs(results, chosen)
    assert [c.name for c in configs] == list(third_study.HORIZON_ARMS) and all(c.seeds == (0, 1, 2) for c in configs)
    valid = [json.loads(line) for line in open(os.path.join(runner.ROOT, suites.smollm2.data("addition", "valid")))]
    answers = [dict(prompt=r["prompt"], completion=f"{r['answer']}", reward=1, finished=True) for r in valid[:4]]
    for c in configs:
        for seed in c.seeds:
            fake_run(
                results, "horizon", c.name, seed, [(96, 0.5), (192, 0.4 + seed / 10)], quality=True, answers=answers
            )
    report.report(results, "horizon", configs)
    table = open(os.path.join(results, "horizon.md")).read()
    assert "| configuration | 96 | 192 |" in table and "| grpo online, N = 1 | 1 | 0.500 | 0.500 | 0.000 |" in table
    assert "| grpo online, N = 1 | 0 | 0.400 | 0.500 | 0.100 |" in table  # the fall from its best
    assert "| configuration | seeds | steps without signal |" in table
    assert "| configuration | seeds | success: training phrasings | finished equations: training | clamped |" in table
    assert "held-out" not in table.split("By phrasing")[1].split("\n\n")[1] and "Each comparison" not in table
    assert table.count("**grpo online, N = 1, seed") == 3 and "p (paired, Holm)" not in table  # no tests
    pytest.importorskip("matplotlib")
    assert open(os.path.join(results, "horizon.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_printed_commands_run_anywhere_through_xargs_as_the_local_runner_runs_them(tmp_path):
    """`--commands` prints each pending run as one line (one thread, its script, flags, seed and output folder); run
    by `xargs -P 2` from another folder and packed by `--report`, they leave the archive and the table a local run
    leaves, in all that does not depend on the machine's time (every file but the seconds, the tables but the time
    columns)."""
    quick, env = tmp_path / "quick", dict(os.environ, OMP_NUM_THREADS="1")
    run_py = [sys.executable, os.path.join(ROOT, "experiments", "run.py"), "--quick", "--suite", "main"]
    run_py += ["--only", "dpo offline", "--results", str(tmp_path)]

    def run_(*more, **kw):
        proc = subprocess.run(run_py + list(more), cwd=ROOT, env=env, capture_output=True, text=True, **kw)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    def timeless(runs):  # each run's files, the seconds and the timings left out
        drop = lambda k: "seconds" in k or k.endswith("per_s") or "peak_memory" in k  # noqa: E731
        out = {}
        for key, files in runs.items():
            out[key] = {n: t for n, t in files.items() if n not in ("wall_seconds", "cpu_seconds", "metrics.jsonl")}
            out[key]["metrics"] = [{k: v for k, v in r.items() if not drop(k)} for r in runner.records(files)]
        return out

    def untimed(md):  # the table's paragraphs but those of time
        return [b for b in md.split("\n\n") if "| wall s |" not in b and "time ratio" not in b]

    run_()
    local, table = runner.load_runs(str(quick), "main"), (quick / "main.md").read_text()
    assert len(local) == 2 and not os.listdir(quick / "runs" / "main")
    for path in (quick / "main.tar.gz", quick / "main.md", quick / "main.jsonl"):
        path.unlink()
    lines = run_("--commands").splitlines()
    assert len(lines) == 2 and all(line.startswith("OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ") for line in lines)
    for line, key in zip(lines, sorted(local)):
        words = shlex.split(line)
        assert words[words.index("--output_dir") + 1] == str(quick / "runs" / "main" / key)
        assert words[words.index("--seed") + 1] == "0" and "dpo_humanline.py" in words and "--offline" in words
    xargs = ["xargs", "-d", "\n", "-P", "2", "-I", "{}", "sh", "-c", "{}"]
    proc = subprocess.run(xargs, input="\n".join(lines) + "\n", cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (quick / "main.tar.gz").exists() and run_("--commands") == ""  # finished, not packed yet
    run_("--report")
    assert not os.listdir(quick / "runs" / "main")  # packed as the local runner packs
    assert timeless(runner.load_runs(str(quick), "main")) == timeless(local)
    assert untimed((quick / "main.md").read_text()) == untimed(table)
    recorded = json.loads(runner.load_runs(str(quick), "main")[sorted(local)[0]]["args.json"])
    assert (
        recorded["suite"]["name"] == "main"
        and recorded["suite"] == json.loads(local[sorted(local)[0]]["args.json"])["suite"]
    )


def test_the_clamp_study_runs_its_six_arms_at_the_authors_settings_each_changing_only_what_it_names():
    configs = {c.name: c for c in studies.SUITES["clamp"].runs("no-results", {})}
    assert len(configs) == 6
    assert all(c.seeds == tuple(range(6)) and suites.rate_of(c.flags) == 2e-5 for c in configs.values())
    given = lambda c, f: c.flags[c.flags.index(f) + 1] if f in c.flags else None  # noqa: E731
    for name, c in configs.items():
        assert all(c.flags.count(f) <= 1 for f in c.flags if f.startswith("--"))  # each flag given once
        assert [given(c, f) for f in ("--max_steps", "--eval_every", "--logps_temperature")] == ["192", "32", "0.7"]
        assert "test.jsonl" in given(c, "--eval_prompts") and given(c, "--num_eval_prompts") == "256"
        assert given(c, "--sample_every") == (None if "online" in name else "64")
        assert given(c, "--sync_every") == ("24" if "k = 24" in name else None)
        assert ("--humanline" in c.flags) == ("+humanline" in name) and ("--clip" in c.flags) == ("sync only" in name)
        assert (given(c, "--beta"), given(c, "--eps")) == (("0", "1e9") if "no anchor" in name else ("1e-4", "0.2"))
        # the KL to the start where nothing syncs and there is a KL (the plan's amendment): online, plain off-policy
        assert given(c, "--kl_baseline") == (
            "initial" if name in ("grpo online, N = 1", "grpo off-policy, N = 64") else None
        )
    study = studies.SUITES["clamp"]
    assert [tuple(configs[a].name for a in pair) for pair in study.pairs(list(configs))] == [
        ("grpo off-policy+humanline, N = 64, k = 24", "grpo off-policy, sync only, N = 64, k = 24"),
        ("grpo off-policy+humanline, N = 64, k = 24", "grpo online, N = 1"),
        ("grpo off-policy+humanline, N = 64, k = 24", "grpo off-policy, N = 64, no anchor"),
        ("grpo off-policy+humanline, N = 64, k = 1", "grpo off-policy+humanline, N = 64, k = 24"),
    ]


def test_the_clamp_pilot_samples_every_64_steps_and_syncs_every_16_or_24_with_either_setting():
    configs = {c.name: c for c in studies.SUITES["clamp_pilot"].runs("no-results", {})}
    assert len(configs) == 4 and all(c.seeds == (100,) and suites.rate_of(c.flags) == 2e-5 for c in configs.values())
    for name, c in configs.items():
        flag = lambda f: c.flags[c.flags.index(f) + 1]  # noqa: E731 (each flag given once)
        assert flag("--sample_every") == "64" and flag("--max_steps") == "192" and flag("--eval_every") == "32"
        assert "--humanline" in c.flags and flag("--sync_every") == name.split("k = ")[1][:2]
        assert "valid.jsonl" in flag("--eval_prompts") and len([f for f in c.flags if f == "--beta"]) <= 1
        authors = "authors' math settings" in name
        assert flag("--logps_temperature") == "0.7" if authors else "--logps_temperature" not in c.flags
        assert (flag("--beta"), flag("--eps")) == ("1e-4", "0.2") if authors else "--beta" not in c.flags
