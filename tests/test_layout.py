"""The shape of the three training scripts, and what a user who gets an argument or a file wrong sees.

- Each script holds the method and the whole loop; how a run is kept is in plumbing.py, the default way to hold the
  reference in ref_free.py and LoRA's adapters in lora.py; none of them imports or calls a script, and no script
  redefines one of their names. The helpers of the method that the three share (the reference, the optimizer step,
  the distributed setup, batching, log-probs, pairing) are copied, identical.
- `grep -n "HUMANLINE:"` shows the method only (at most 8 lines per script), and its lines run in a default
  humanline run. Each script stays within its budget of lines and long lines, as ruff formats it; the flags the
  scripts share are identical, as their shared helpers are.
- Every bad argument or file ends the run with one line that names the flag or the file (no traceback), before
  any model is loaded."""

import ast
import contextlib
import importlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import typing
from dataclasses import fields
from unittest import mock

import pytest
import warm
from paths import ROOT, SCRIPTS

import plumbing

# what a reader can hold in one sitting, as ruff formats each script: a screen per phase, room for the comments that say
# why; at most 10% of a script's lines over 100 characters, so that it reads without scrolling sideways
BUDGET = {"dpo_humanline.py": 450, "kto_humanline.py": 500, "grpo_humanline.py": 580}
MODULE_BUDGET = 950  # plumbing.py's lines: how every run is kept, in one module a reader can still look through
MODULES = {s: importlib.import_module(s[:-3]) for s in SCRIPTS}
SHARED_METHOD = (  # copied into the three scripts, identical
    "ReferenceModel",
    "optimizer_step",
    "offline_batch",
    "micro_batches",
    "collate",
    "token_logps",
    "head_logps",
    "best_worst_pairs",
    "sync_due",
    "setup",
    "load_model",
    "make_optimizer",
)


def source(script):
    with open(os.path.join(ROOT, script)) as f:
        return f.read()


def top_level(script):
    """{name: source} of a file's top-level functions, classes and assignments."""
    text = source(script)
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                found |= {t.id: ast.get_source_segment(text, node) for t in ast.walk(target) if isinstance(t, ast.Name)}
    return found


# every module beside the scripts: a script imports them, so one importing a script back is a circle (a GRPO run
# would import its own script a second time)
OTHER_MODULES = ("plumbing.py", "data_formats.py", "ref_free.py", "lora.py", "memory_plan.py", "math_rewards.py")
OTHER_MODULES += ("toy_task.py", "humanline_sampling.py", "prospect.py")


@pytest.mark.parametrize("module", OTHER_MODULES)
def test_the_modules_import_no_script_and_no_script_redefines_their_names(module):
    tree = ast.parse(source(module))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {s[:-3] for s in SCRIPTS}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
    }
    assert not names & {s[:-3] for s in SCRIPTS}  # it calls into no script
    module_names = set(top_level(module)) - {"main"}  # (a module's command line, as a script's)
    for script in SCRIPTS:
        assert not set(top_level(script)) & module_names, script
    assert len(source("plumbing.py").splitlines()) <= MODULE_BUDGET


# the flags whose meaning is the method's own: each script states it in its words (a DPO batch is pairs, a GRPO batch
# sequences); every other flag two scripts share is one flag, its default, type and help identical
METHOD_FLAGS = {
    "offline",
    "online",
    "dataset",
    "reward_model",
    "batch_size",
    "micro_batch_size",
    "learning_rate",
    "beta",
}
METHOD_FLAGS |= {"round_size", "reward_threshold"}  # GRPO's act only with --pairs_from_samples, and say so


def test_the_flags_the_scripts_share_are_identical():
    hints = {s: typing.get_type_hints(MODULES[s].Args) for s in SCRIPTS}  # the annotations: a parse rewrites f.type
    found = {
        s: {f.name: (hints[s][f.name], f.default, f.metadata["help"]) for f in fields(MODULES[s].Args)} for s in SCRIPTS
    }
    shared = {n for a, b in [(0, 1), (0, 2), (1, 2)] for n in set(found[SCRIPTS[a]]) & set(found[SCRIPTS[b]])}
    assert len(shared - METHOD_FLAGS) >= 45  # those of plumbing.RunArgs, and the 27 the three Args declare alike
    for name in sorted(shared - METHOD_FLAGS):
        assert len({found[s][name] for s in SCRIPTS if name in found[s]}) == 1, name


def test_the_shared_method_helpers_are_identical_in_the_three_scripts():
    found = {s: top_level(s) for s in SCRIPTS}
    for name in SHARED_METHOD:
        assert found["dpo_humanline.py"][name] == found["kto_humanline.py"][name] == found["grpo_humanline.py"][name], (
            name
        )


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_humanline_tag_marks_the_method_only_and_the_script_fits_its_budget(script):
    text = source(script)
    tagged = [line for line in text.splitlines() if "HUMANLINE:" in line]
    assert 2 <= len(tagged) <= 8, tagged
    assert any("clamp" in line for line in tagged) and any("sync" in line for line in tagged)
    assert len(text.splitlines()) <= BUDGET[script]
    assert sum(len(line) > 100 for line in text.splitlines()) <= 0.1 * len(text.splitlines())
    assert text.rstrip().endswith('if __name__ == "__main__":\n    main()')


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_whole_loop_is_in_main(script):
    """Sampling rounds, the step, the update, logging, evaluation, checkpoint and stop are lines of main's loop."""
    main = top_level(script)["main"]
    loop = main[main.index("while state.step < args.max_steps:") :]
    for line in (
        "reference.reset(policy, step=state.step)",
        "reference.logps(state.step, micro, inputs)",
        "token_logps(policy, *",
        ".backward()",
        "optimizer_step(",
        "session.log(record)",
        "evaluate()",
        "session.save()",
        "session.exit_after_signal()",
    ):
        assert line in loop, line
    assert "init_process_group" in top_level(script)["setup"] and "fully_shard" in top_level(script)["load_model"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_humanline_lines_run_in_a_default_humanline_run(script, tmp_path, toy):
    """Every `HUMANLINE:` line but the --clip sampling ablation's runs with --humanline and the default --ref_free
    on (traced line by line in this process)."""
    path = os.path.join(ROOT, script)
    tagged = {i + 1 for i, line in enumerate(source(script).splitlines()) if "HUMANLINE:" in line}
    ran = set()

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != path:
            return None
        if event == "line":
            ran.add(frame.f_lineno)
        return tracer

    flags = ["--humanline", "--max_steps", "2", "--batch_size", "8", "--eval_prompts", "none"]
    argv, handler = sys.argv, signal.getsignal(signal.SIGTERM)
    sys.argv = [script, *flags, "--save_every", "0", "--output_dir", str(tmp_path / "run")]
    sys.settrace(tracer)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(path, run_name="__main__")
    finally:
        sys.settrace(None)
        sys.argv = argv
        signal.signal(signal.SIGTERM, handler)
    ablation = {i for i in tagged if "sampling" in source(script).splitlines()[i - 1]}
    assert tagged - ablation and tagged - ablation <= ran, sorted(tagged - ablation - ran)


# ----------------------------------------------------------------------------------------------
# Bad input: one line naming the flag or the file, before any model is loaded
# ----------------------------------------------------------------------------------------------


def stop_message(script, flags):
    """Run the script in this process; return the message it stops with (SystemExit with a text: Python prints
    that one line and exits with 1). Any other exception would be a traceback and fails the test."""
    argv, handler = sys.argv, signal.getsignal(signal.SIGTERM)
    sys.argv = [script, "--eval_prompts", "none", *flags]
    try:
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as stopped:
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        sys.argv = argv
        signal.signal(signal.SIGTERM, handler)
    assert isinstance(stopped.value.code, str) and "\n" not in stopped.value.code, stopped.value.code
    return stopped.value.code


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "empty.jsonl").write_text("")
    (d / "no_rejected.jsonl").write_text(json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
    return d


BAD = [
    (["--batchsize", "8"], "unknown arguments: --batchsize 8 (--help lists them)"),
    (["--batch_size", "0"], "--batch_size must be at least 1"),
    (["--micro_batch_size", "-1"], "--micro_batch_size must be at least 1"),
    (["--sync_every", "0"], "--sync_every must be at least 1"),
    (["--log_eps_P", "1", "--log_eps_R", "-1"], "--log_eps_P < 0 < --log_eps_R"),
    (["--learning_rate", "0"], "--learning_rate must be above 0"),
    (["--humanline", "--clip", "sampling"], "--humanline means --sync humanline --clip clamp: drop --clip sampling"),
    (["--humanline", "--sync", "trust_region"], "drop --sync trust_region"),
    (["--humanline", "--sync", "none"], "drop --sync none"),  # the default's value, typed: still a contradiction
    (["--max_prompt_length", "64", "--max_length", "64"], "--max_prompt_length (64) must be below --max_length (64)"),
    (["--dataset", "missing/data.jsonl"], "--dataset missing/data.jsonl: no such file"),
    (["--reward_model", "./no_such_rm"], "--reward_model ./no_such_rm: no such file"),
    (["--dataset", "toy:nope"], "toy:nope: the toy datasets are"),
    (["--ref_free", "maybe"], "--ref_free"),
]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_a_bad_argument_stops_with_one_line_naming_it(script, flags, message, toy):
    assert message in stop_message(script, flags)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_files_stop_with_one_line_naming_file_row_and_column(script, files, toy):
    assert stop_message(script, ["--dataset", str(files / "empty.jsonl")]).endswith("empty.jsonl: no rows")
    message = stop_message(script, ["--dataset", str(files / "no_rejected.jsonl")])
    assert "no_rejected.jsonl: row 0: missing column 'rejected'" in message


# settings that would do nothing are refused (each was once accepted without effect)
IDLE = [
    (SCRIPTS, ["--sync_every", "4"], "--sync_every 4 needs --sync or --humanline"),
    (SCRIPTS, ["--system_prompt", "Be brief."], "--system_prompt needs --as_chat (it is the chat's system message)"),
    (
        SCRIPTS[2:],
        ["--sample_every", "64"],
        "--sample_every, --reward_funcs and --reward_weights act only with --online",
    ),
    (
        SCRIPTS[2:],
        ["--reward_funcs", "no_such_scorer"],
        "--sample_every, --reward_funcs and --reward_weights act only with --online",
    ),
    (
        SCRIPTS[2:],
        ["--online", "--round_size", "64"],
        "--round_size and --reward_threshold act only with --pairs_from_samples",
    ),
]


@pytest.mark.parametrize("scripts, flags, message", IDLE, ids=[" ".join(f) for _, f, _ in IDLE])
def test_a_setting_that_would_have_no_effect_stops_with_one_line(scripts, flags, message, toy):
    for script in scripts:
        assert stop_message(script, flags) == message


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_without_a_checkpoint_stops_and_leaves_the_folder_as_it_was(script, tmp_path, toy):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert stop_message(script, ["--resume", "--output_dir", str(tmp_path)]) == f"--resume: no checkpoint in {tmp_path}"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_dataset_split_selects_rows_of_a_local_file_too(files, toy):
    rows = [json.dumps({"prompt": f"{i}+1=", "chosen": f"{i + 1}", "rejected": "0"}) for i in range(1, 9)]
    (files / "eight.jsonl").write_text("\n".join(rows) + "\n")
    import dpo_humanline

    out, argv = (
        io.StringIO(),
        [
            "dpo_humanline.py",
            "--dataset",
            str(files / "eight.jsonl"),
            "--dataset_split",
            "train[:6]",
            "--batch_size",
            "2",
            "--eval_prompts",
            "none",
        ],
    )
    with (
        mock.patch.object(sys, "argv", argv),
        mock.patch.object(dpo_humanline, "load_model", lambda *a: sys.exit(0)),
        contextlib.redirect_stdout(out),
        pytest.raises(SystemExit),
    ):  # the plan is printed once the data has loaded
        dpo_humanline.main()
    assert "run: 3 steps x 2 pairs = 1.00 passes over 6 pairs" in out.getvalue()
    assert "Unknown split" in stop_message(
        "dpo_humanline.py", ["--dataset", str(files / "eight.jsonl"), "--dataset_split", "test"]
    )


def test_a_newcomers_slips_stop_with_one_line_naming_the_flag(files, tmp_path, toy):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "run").mkdir()
    for script in SCRIPTS:
        assert stop_message(script, ["--max_step", "3"]) == "unknown arguments: --max_step 3 (--help lists them)"
        assert stop_message(script, ["--seed", "-1"]) == "--seed must be at least 0, got -1"
        assert (
            stop_message(script, ["--output_dir", str(tmp_path / "a_file")])
            == f"--output_dir {tmp_path}/a_file: not a writable folder"
        )
    assert (
        stop_message("dpo_humanline.py", ["--dataset", str(files)])
        == f"--dataset {files}: a directory, not a data file"
    )
    assert stop_message("kto_humanline.py", ["--model_name_or_path", str(tmp_path / "run")]).startswith(
        f"--model_name_or_path {tmp_path}/run: no config.json, not a model folder"
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_holding_another_run_is_written_only_with_resume_or_overwrite(script, tmp_path, toy):
    out, flags = tmp_path / "run", ["--max_steps", "2", "--batch_size", "8", "--save_every", "1"]

    def run(*extra):  # None when the run finishes, else the line it stopped with
        try:
            return stop_message(script, [*flags, "--output_dir", str(out), *extra])
        except pytest.fail.Exception:
            return None

    assert run() is None
    assert (out / "checkpoint-2").exists() and (out / "checkpoint-1").exists()
    assert run() == f"--output_dir {out} holds another run: --resume continues it, --overwrite_output_dir replaces it"
    (out / "checkpoint-2").rename(out / "checkpoint-7")  # a later run's, which the overwrite must not leave behind
    assert run("--overwrite_output_dir", "--save_every", "0") is None
    assert sorted(d for d in os.listdir(out) if d.startswith("checkpoint-")) == ["checkpoint-2"]


def test_completions_the_tokenizer_cannot_tell_apart_stop_and_unknown_characters_are_counted(tmp_path, toy):
    wide = tmp_path / "wide.jsonl"  # full-width digits: the toy tokenizer knows none of them
    wide.write_text(json.dumps({"prompt": "1+1=", "chosen": "\uff12", "rejected": "\uff13"}) + "\n")
    assert stop_message("dpo_humanline.py", ["--dataset", str(wide)]) == (
        f"{wide}: row 0, columns 'chosen'/'rejected': identical completions once tokenised"
    )
    spaced = tmp_path / "spaced.jsonl"  # a space before each completion, unknown to the toy tokenizer too
    spaced.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "chosen": f" {i + 1}", "rejected": " 0"}) + "\n" for i in range(1, 9))
    )
    out = io.StringIO()
    with (
        mock.patch.object(
            sys,
            "argv",
            [
                "dpo_humanline.py",
                "--dataset",
                str(spaced),
                "--batch_size",
                "8",
                "--eval_prompts",
                "none",
                "--output_dir",
                str(tmp_path / "o"),
            ],
        ),
        mock.patch("dpo_humanline.load_model", lambda *a: sys.exit(0)),
        contextlib.redirect_stdout(out),
        pytest.raises(SystemExit),
    ):
        __import__("dpo_humanline").main()
    assert f"{spaced}: {{'prompts': 0, 'completions': 0, 'unknown tokens': 16}}" in out.getvalue()


def test_the_default_output_dir_tells_runs_of_other_settings_apart():
    import dpo_humanline

    def out(*flags):  # parse_args shows the plan (--plan_only) with the settings it derived, then exits
        seen = []
        with (
            mock.patch.object(sys, "argv", ["dpo_humanline.py", *flags, "--plan_only"]),
            pytest.raises(SystemExit),
            mock.patch.object(plumbing.memory_plan, "report", lambda args, *_, **__: seen.append(args) or ""),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            plumbing.parse_args(dpo_humanline.Args, "dpo", lambda a, g: [])
        return seen[0].output_dir

    assert out() == os.path.join("runs", "dpo-offline-seed0") and out("--seed", "3").endswith("dpo-offline-seed3")
    assert out("--humanline") == os.path.join("runs", "dpo-offline-humanline-seed0")
    assert (
        len(
            {
                out("--humanline"),
                out("--humanline", "--sync_every", "4"),
                out("--humanline", "--learning_rate", "1e-4"),
                out("--humanline", "--sync_every", "2"),
            }
        )
        == 4
    )
    assert out("--humanline", "--eval_every", "5") == out("--humanline")  # bookkeeping does not change the run


def test_the_real_command_line_prints_one_line_and_exits_1(files, toy):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = warm.run(
        [sys.executable, "grpo_humanline.py", "--dataset", str(files / "no_rejected.jsonl")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"{files / 'no_rejected.jsonl'}: row 0: missing column 'rejected' (rows need [prompt,] chosen, rejected)"
    ]


def test_every_link_of_the_readme_and_the_docs_resolves_to_a_file_and_heading():
    import glob
    import re

    def anchors(path):  # GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens
        with open(path) as f:
            return {
                re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", f.read(), re.M)
            }

    pages = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    assert len(pages) >= 7
    broken, count = [], 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", open(page).read()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            count += 1
            path, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(path) or (anchor and anchor not in anchors(path)):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert count > 40 and not broken, broken


def test_the_readme_is_a_five_minute_read():
    assert len(source("README.md").splitlines()) <= 250
    assert len(source("README.md").split()) <= 1300  # words: what a reader can lose without a result is in docs/


def test_the_readme_setup_is_the_one_the_runs_recorded():
    setup = open(os.path.join(ROOT, "experiments", "results", "setup.md")).read()
    assert setup.count("\n| ") >= 12 and setup in source(os.path.join("docs", "results.md"))


def test_every_results_table_row_in_the_docs_is_a_row_of_a_generated_table():
    import glob

    results = source(os.path.join("docs", "results.md"))
    section = results[results.index("## Results on the toy task") :]
    generated = "".join(
        open(f).read() for f in glob.glob(os.path.join(ROOT, "experiments", "results", "**", "*.md"), recursive=True)
    )
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) > 20
    assert not [row for row in rows if row not in generated]  # each figure traceable to the table it was copied from


def test_every_python_file_is_formatted_and_lint_clean_as_pyproject_toml_configures_ruff():
    for command in (["format", "--check", "."], ["check", "."]):
        proc = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, f"ruff {' '.join(command)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"


def test_the_folders_documented_commands_write_into_the_checkout_change_no_check(tmp_path):
    """The README's order: the quickstart writes runs/, `experiments/smollm2.py model` .cache/, the experiments
    experiments/results/runs/, and then the tests run. Each folder .gitignore names is made in a copy of the tracked
    files, holding what a run leaves there, and ruff still passes (a folder runs/ at the root once made ruff take
    `import runs`, a test helper, for a first-party module)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in [f for f in tracked.split("\0") if f.endswith(".py") or f in ("pyproject.toml", ".gitignore")]:
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        with open(os.path.join(ROOT, name), "rb") as src, open(tmp_path / name, "wb") as dest:
            dest.write(src.read())
    ignored = open(os.path.join(ROOT, ".gitignore")).read().split()
    folders = {line.strip("/").rstrip("*") for line in ignored if line.startswith("/") and line.endswith("/")}
    assert {"runs", ".cache", "wandb", "experiments/results/runs"} <= folders
    for folder in folders:
        os.makedirs(tmp_path / folder / "grpo-offline-humanline-seed0")
        (tmp_path / folder / "grpo-offline-humanline-seed0" / "metrics.jsonl").write_text("{}\n")
    for command in (["format", "--check", "."], ["check", "."]):
        proc = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, f"ruff {' '.join(command)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
