"""The clamp study's own report sections, on rows made by hand: the clamp's and the ratio clip's shares (averaged and
on the largest step), where in a sync window the clamp acts, and the plan's collapse rule."""

import os
import sys
from types import SimpleNamespace

from paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import studies  # noqa: E402
from studies import clamp_study as cs  # noqa: E402

CTX = SimpleNamespace(entry=studies.SUITES["clamp"])


def row(config, flags, clamped, clip=(), curves=(), no_signal=()):
    """A report row of one seed per training series: clamped[i], clip[i], no_signal[i]: seed i's per-step values."""
    train = [
        {
            "humanline/clamped_frac": list(enumerate(c, start=1)),
            "clip_frac": list(enumerate(clip[i] if clip else [0.0] * len(c), start=1)),
            "grpo/no_signal": list(enumerate(no_signal[i] if no_signal else [0.0] * len(c), start=1)),
        }
        for i, c in enumerate(clamped)
    ]
    means = [sum(c) / len(c) for c in clamped]
    clips = [sum(c) / len(c) for c in clip] if clip else [0.0] * len(clamped)
    return dict(
        config=config,
        flags=flags,
        seeds=len(clamped),
        train=train,
        args=[{"seed": i} for i in range(len(clamped))],
        clamped_frac=(sum(means) / len(means), float("nan")),
        clip_frac=(sum(clips) / len(clips), float("nan")),
        curves=list(curves),
    )


def test_the_shares_of_the_clamp_and_the_clip_averaged_and_on_their_largest_step():
    import report

    clamped, clip = [[0.0, 0.02, 0.0, 0.02], [0.0, 0.08]], [[0.1, 0.1, 0.1, 0.1], [0.3, 0.1]]
    r = row("a", [], clamped, clip, no_signal=[[1.0, 0.5, 1.0, 0.0], [1.0, 1.0]])
    # the clip: seeds average 0.1 and 0.2, largest step 0.3
    assert "| a | 2 | 0.1500 | 0.3000 |" in "\n".join(cs.clip([r], CTX))
    # the clamp (the shared section): seeds average 0.01 and 0.04, largest step 0.08; steps whose every group scored
    # alike (no_signal 1.0): 2 of 4 and 2 of 2; sequences without signal: 0.625 and 1.0
    assert "| a | 2 | 0.750 ± 0.250 | 0.812 ± 0.187 | 0.0250 | 0.0800 |" in "\n".join(report.signal([r], CTX))


def test_where_the_clamp_acts_in_a_sync_window_and_each_sampling_round():
    k4 = row("k4", ["--sync_every", "4", "--sample_every", "4"], clamped=[[0.0, 0.0, 0.4, 0.8, 0.0, 0.0, 0.2, 0.2]])
    online = row("online", [], clamped=[[0.0] * 8])  # no sync window: no row
    table = "\n".join(cs.clamp_when([k4, online], CTX))
    # steps 1-2 and 5-6 are a window's first half (0.0), steps 3-4 and 7-8 its second (0.4); round 1: steps 1-4
    assert "| k4 | 4 | 0.0000 | 0.4000 | 0.3000 | 0.1000 |" in table and "| online |" not in table


def test_the_plans_collapse_rule():
    start = CTX.entry.start()
    assert start == 0.0625  # the starting model's test success
    assert cs.collapsed([(32, 0.6, None), (64, 0.4, None)], start)  # 0.20 below its best
    assert not cs.collapsed([(32, 0.6, None), (64, 0.41, None)], start)
    assert cs.collapsed([(32, 0.1, None), (64, 0.05, None)], start)  # below the start
    curves = [[(32, 0.6, None), (64, 0.3, None)], [(32, 0.5, None), (64, 0.5, None)]]
    table = "\n".join(cs.collapse([row("k1", [], clamped=[[0.0], [0.0]], curves=curves)], CTX))
    assert "| k1 | 2 | 0 | collapses |" in table  # one of two seeds: half
    curves.append([(32, 0.5, None), (64, 0.6, None)])
    table = "\n".join(cs.collapse([row("k1", [], clamped=[[0.0]] * 3, curves=curves)], CTX))
    assert "| k1 | 3 | 0 | does not collapse |" in table


def report_on_fake_runs(results):
    """The whole report on finished runs made by hand (every arm, 3 seeds, test success every 32 steps, the first two
    arms clamping 1% of tokens): its table's text; its plot written where matplotlib is installed."""
    import json

    import report
    import runner
    from test_experiments import fake_run

    configs = [c._replace(seeds=(0, 1, 2)) for c in studies.SUITES["clamp"].runs(results, {})]
    test = [json.loads(line) for line in open(os.path.join(runner.ROOT, "experiments/smollm2/addition/test.jsonl"))]
    answers = [dict(prompt=r["prompt"], completion=f"{r['answer']}", reward=1, finished=True) for r in test[:4]]
    for i, c in enumerate(configs):
        for seed in c.seeds:
            curve = [(step, 0.5 + 0.01 * (i + seed) * (step == 192)) for step in range(32, 193, 32)]
            fake_run(results, "clamp", c.name, seed, curve, quality=True, answers=answers, clamped=0.01 * (i < 2))
    report.report(results, "clamp", configs)
    return open(os.path.join(results, "clamp.md")).read()


def test_the_clamp_studys_report_holds_its_tests_and_sections(tmp_path):
    """The four planned comparisons paired in the plan's order, the curves on the test prompts, the collapse rule, the
    clamp's and the clip's shares (the clamp's by sync window for the arms synced every 24 steps), success by phrasing
    (the test prompts hold the held-out one), every run's answers."""
    table = report_on_fake_runs(str(tmp_path))
    tests = table.split("p (paired, Holm)")[1].split("\n\n")[0]
    order = [line.split(" | ")[0] for line in tests.splitlines()[2:]]
    assert order == [f"| {a} vs {b}" for a, b in cs.PAIRS]
    assert "Test success at each evaluation" in table and "| configuration | 32 | 64 | 96 | 128 | 160 | 192 |" in table
    assert f"| {cs.K1} | 3 | none | does not collapse |" in table
    assert f"| {cs.HUMANLINE} | 24 | 0.0100 | 0.0100 | 0.0100 | 0.0100 | 0.0100 |" in table
    assert "| configuration | seeds | clipped tokens | largest step's |" in table and "steps without signal" in table
    windows = table.split("| first half | second half |")[1].split("\n\n")[0]  # only the arms synced every 24 steps
    assert f"| {cs.HUMANLINE} | 24 |" in windows and cs.ONLINE not in windows and cs.K1 not in windows
    assert "held-out" in table.split("By phrasing")[1] and table.count(f"**{cs.PLAIN}, seed") == 3


def test_the_clamp_studys_plot(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    report_on_fake_runs(str(tmp_path))
    assert open(os.path.join(tmp_path, "clamp.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def read_rows(tmp_path, not_counted):
    """Two arms of 3 seeds (success 0.5 + 0.1 x seed, the second arm 0.1 lower) and their read: 2 successes and 1
    failure of each run; `not_counted`: (arm, seed) -> how many of its 2 successes the reader does not count."""
    import json

    arms = [cs.HUMANLINE, cs.SYNC]
    rows = [
        dict(config=a, args=[{"seed": s} for s in range(3)], rewards=[0.5 + 0.1 * s - 0.1 * i for s in range(3)])
        for i, a in enumerate(arms)
    ]
    for r in rows:
        r["answers"] = [[] for _ in r["args"]]
    key, labels = [], []
    for a in arms:
        for s in range(3):
            for j, reward in enumerate([1, 1, 0]):
                key.append(dict(id=len(key), arm=a, seed=s, reward=reward))
                countable = reward == 1 and j >= not_counted.get((a, s), 0)  # the failures: not counted either
                labels.append(dict(id=len(labels), countable=countable, reason=""))
    (tmp_path / "key.jsonl").write_text("".join(json.dumps(k) + "\n" for k in key))
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(x) + "\n" for x in labels))
    return rows, SimpleNamespace(entry=CTX.entry, names=arms)


def test_the_blind_read_against_the_reward_and_the_tests_it_reruns_where_an_arm_reaches_ten_percent(tmp_path):
    assert cs.read([], CTX, out=str(tmp_path)) == [
        "",
        "The blind read: drawn and read after the study's last run (`clamp_study.py read`).",
    ]
    rows, ctx = read_rows(tmp_path, {})
    table = "\n".join(cs.read(rows, ctx, out=str(tmp_path)))
    assert f"| {cs.HUMANLINE} | 6 | 0.00 (0.00, 0.39) | 3 | 0.00 (0.00, 0.56) |" in table
    assert "the tests above stand alone" in table and "times the share" not in table
    # humanline's seed 2: one of its two successes not counted: 1 of 6 (>= 10%), its success 0.7 -> 0.35
    rows, ctx = read_rows(tmp_path, {(cs.HUMANLINE, 2): 1})
    table = "\n".join(cs.read(rows, ctx, out=str(tmp_path)))
    assert f"| {cs.HUMANLINE} | 6 | 0.17 (0.03, 0.56) | 3 |" in table
    # the paired differences: 0.1, 0.1 and 0.35 - 0.6 = -0.25: their mean -0.017
    assert f"| {cs.HUMANLINE} vs {cs.SYNC} | 3 | -0.017 (" in table


def test_every_arm_passes_the_scripts_flag_checks():
    """Each arm's flags as the script reads them at start-up (its parser and checks, stopped before the model loads):
    an arm the script would refuse (a --beta it calls idle on-policy, say) fails here, not an hour into a study."""
    from test_formats import parsed

    def here(flag):  # the prompt files from any folder; a model whose config.json the tests keep for the real one's
        local = os.path.join(ROOT, flag)
        return "Qwen/Qwen2.5-0.5B-Instruct" if "SmolLM2" in flag else local if os.path.isfile(local) else flag

    for c in studies.SUITES["clamp"].runs("no-results", {}) + studies.SUITES["clamp_pilot"].runs("no-results", {}):
        args = parsed("grpo", [here(flag) for flag in c.flags])
        assert args.max_steps == 192 and args.logps_temperature in (0.7, 1.0), c.name
