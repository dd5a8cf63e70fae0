"""The benchmark's side-by-side arithmetic (experiments/bench_trl.py): which TRL configuration each of our rows is
held against, and when a target is called met, missed or not decided."""

import os
import sys
import types

import pytest
import warm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import bench  # noqa: E402
import bench_trl  # noqa: E402

DEFAULTS, PLAIN = "TRL: DPO defaults", "TRL: DPO, no checkpointing"
PRE = "TRL: DPO, precompute_ref_log_probs"
RUNS = {  # seconds per step in each of three repeats
    "ours: offline": [1.0, 1.2, 0.8],
    "ours: offline, checkpointing": [1.5, 1.5, 1.5],
    DEFAULTS: [2.0, 2.0, 2.0],
    PLAIN: [1.6, 1.6, 1.6],
    PRE: [1.1, 1.0, 1.0],
    PRE + ", no checkpointing": [0.5, 0.5, 0.5],
}
MEMORY = {
    "ours: offline": 1.0,
    "ours: offline, checkpointing": 0.7,
    DEFAULTS: 0.9,
    PLAIN: 1.2,
    PRE: 0.8,
    PRE + ", no checkpointing": 1.1,
}


def test_checkpointing_is_read_from_the_name():
    assert bench_trl.checkpoints("ours: offline, checkpointing") and not bench_trl.checkpoints("ours: offline")
    assert bench_trl.checkpoints(DEFAULTS) and bench_trl.checkpoints(PRE) and not bench_trl.checkpoints(PLAIN)
    assert not bench_trl.checkpoints("TRL: GRPO, no checkpointing, our completions")


def test_each_row_is_held_against_the_fastest_trl_run_within_its_memory_and_trl_at_equal_checkpointing():
    rows = {r["config"]: r for r in bench_trl.compare(RUNS, MEMORY, DEFAULTS, PLAIN, PRE)}
    ours = rows["ours: offline"]
    # TRL's runs at or below 1.0 GiB: defaults (2.0 s), precompute (1.0 s median): the faster is precompute
    assert ours["fastest TRL within memory"] == PRE
    assert ours["vs fastest TRL within memory"] == {"median": 1.0 / 1.1, "min": 0.8, "max": 1.2}  # within repeats
    assert ours["vs TRL defaults"] == {"median": 0.5, "min": 0.4, "max": 0.6}
    # no checkpointing against TRL's precomputed run without it: 1.0 / 1.1
    assert ours["memory baseline"] == PRE + ", no checkpointing"
    assert abs(ours["memory vs baseline"] - 1.0 / 1.1) < 1e-12
    tight = rows["ours: offline, checkpointing"]
    assert tight["fastest TRL within memory"] is None and tight["vs fastest TRL within memory"] is None
    assert tight["memory baseline"] == PRE and abs(tight["memory vs baseline"] - 0.7 / 0.8) < 1e-12
    # GRPO has no precomputed run: equal checkpointing is TRL's defaults, or TRL without checkpointing
    grpo = {"ours: online": [1.0], "TRL: GRPO defaults": [2.0], "TRL: GRPO, no checkpointing": [1.0]}
    memory = {"ours: online": 1.0, "TRL: GRPO defaults": 0.9, "TRL: GRPO, no checkpointing": 1.2}
    rows = bench_trl.compare(grpo, memory, "TRL: GRPO defaults", "TRL: GRPO, no checkpointing", "TRL: GRPO defaults")
    assert rows[0]["memory baseline"] == "TRL: GRPO, no checkpointing"
    assert rows[0]["fastest TRL within memory"] == "TRL: GRPO defaults"


def test_a_target_is_decided_only_where_the_whole_range_lies_on_one_side():
    rows = bench_trl.compare(RUNS, MEMORY, DEFAULTS, PLAIN, PRE)
    text = bench_trl.side_by_side_targets(rows)
    lines = text.splitlines()
    assert all("TRL:" not in line.split(" vs ")[0].split(" peak ")[0] for line in lines)  # our rows only
    # 0.4-0.6 of the default step: met; 0.8-1.2 of precompute's step: straddles 1.0
    assert "- met: ours: offline vs TRL defaults <= 0.9: median 0.500, range [0.400, 0.600]" in lines
    assert any(line.startswith("- not decided") and "ours: offline vs fastest" in line for line in lines)
    assert "- met: ours: offline peak memory / " + PRE + ", no checkpointing <= 1: 0.909" in lines
    # 0.75 of the default step (1.5 / 2.0): met; nothing of TRL's fits in 0.7 GiB
    assert "- met: ours: offline, checkpointing vs TRL defaults <= 0.9: median 0.750, range [0.750, 0.750]" in lines
    assert any(
        line.startswith("- no TRL configuration peaks at or below ours: offline, checkpointing") for line in lines
    )
    slow = bench_trl.compare({**RUNS, "ours: offline": [2.0, 2.2, 1.9]}, MEMORY, DEFAULTS, PLAIN, PRE)
    assert "- MISSED: ours: offline vs TRL defaults <= 0.9: median 1.000, range [0.950, 1.100]" in (
        bench_trl.side_by_side_targets(slow).splitlines()
    )
    table = bench_trl.side_by_side_table(rows).splitlines()
    assert len(table) == 2 + len(RUNS) and all(line.count("|") == table[0].count("|") for line in table)


def test_the_documented_side_by_side_rows_are_the_committed_runs():
    """Every row of ours or TRL's in docs/benchmarks.md is a row of a committed benchmark table, verbatim."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = os.path.join(root, "experiments", "results")
    tables = "".join(open(os.path.join(results, f)).read() for f in os.listdir(results) if f.startswith("bench"))
    doc = open(os.path.join(root, "docs", "benchmarks.md")).read().splitlines()
    rows = [line for line in doc if line.startswith(("| ours:", "| TRL:"))]
    assert len(rows) >= 20 and [r for r in rows if r not in tables] == []


def test_the_real_model_trains_on_its_own_tasks_data_and_stops_in_one_line_when_not_made(tmp_path, monkeypatch):
    """--models smollm2: its constraints task's pairs, or online its training prompts, reward and 48-token completions,
    as experiments/smollm2.py sets its runs (the toy's digit data is for the toy's tokenizer); without its folder, a
    line that says how to make it."""
    offline = bench.smollm2_flags(["--offline", "--humanline"])
    assert offline[offline.index("--dataset") + 1] == "experiments/smollm2/constraints/pairs.jsonl"
    online = bench.smollm2_flags(["--online"])
    assert online[online.index("--dataset") + 1] == "experiments/smollm2/constraints/train.jsonl"
    assert online[online.index("--reward_funcs") + 1] == "experiments.smollm2:reward"
    assert online[online.index("--max_new_tokens") + 1] == "48" and "--max_length" in online
    for flags in (offline, online):
        assert all(os.path.exists(os.path.join(bench.ROOT, v)) for v in flags if v.startswith("experiments/"))
    monkeypatch.setattr(bench, "ROOT", str(tmp_path))
    with pytest.raises(SystemExit, match=r"^the real model is not made yet: python experiments/smollm2.py model$"):
        bench.model_path("smollm2")


def test_the_reference_pass_before_the_first_step_counts_in_that_step(tmp_path, monkeypatch):
    """A reference-free run computes its reference log-probs for the steps up to its first sync before its loop,
    outside the scripts' step times; the benchmark times that pass and adds it to the first step (as TRL's
    precompute_ref_log_probs pass is counted), and a run with a reference model has none. (Its processes fork from a
    warm server: the benchmark's own, timed, start cold.)"""
    monkeypatch.setattr(bench, "subprocess", types.SimpleNamespace(run=lambda cmd, **kw: warm.run(cmd, **kw)))
    free = bench.timed_run("dpo", "toy", ["--offline"], 8, 2, "cpu", str(tmp_path))
    two = bench.timed_run("dpo", "toy", ["--offline", "--ref_free", "off"], 8, 2, "cpu", str(tmp_path))
    assert free["before_first_step"][1] > 0 and two["before_first_step"] == [0.0, 0.0]
    assert free["cpu"][0] > free["before_first_step"][1]
    samples = str(tmp_path / "samples.jsonl")  # GRPO's on-policy rows keep their samples for TRL's runs, in-process too
    on_policy = bench.timed_run("grpo", "toy", ["--online"], 8, 1, "cpu", str(tmp_path), record=samples)
    assert on_policy["before_first_step"] == [0.0, 0.0]  # nothing sampled before the loop: no reference pass
    assert len(open(samples).readlines()) == 1  # 8 sequences: one group of the default 8
