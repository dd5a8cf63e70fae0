"""Every command the README, docs/ and the docstrings show runs as a user types it, and every page a docstring sends
the reader to holds what it promises.

Each command (tests/documented.py collects them) runs from the repository's root in a new process whose environment
has no PYTHONPATH, in the cheapest form that still executes the file's imports and its argument parsing:
- a training script with `--plan_only` added: its imports, the parser, every flag check and the memory plan, read
  from the model's config.json (the paper's models' configs, tests/configs, in a hub cache, as a user who has
  downloaded them has); torchrun's processes are given as WORLD_SIZE, which is all a run reads of them before the
  plan. The run length and the paper's settings of these commands are checked by test_formats.py, with the data
  (the hub is not reachable here);
- a file of experiments/ with `--help` after the documented flags (each flag is parsed, a bad choice stops it, and
  every flag must be one its --help lists), plus an import check of every module its functions import later
  (TRL, the scripts); test_experiments.py runs `run.py --quick` for real; bench.py's shortest real run (one
  algorithm and model, 1 step, 1 repeat) takes about 90 s, so it stays out of the suite: these two checks stand
  for it;
- toy_task.py as typed (`--rebuild`, 100 s, with `--help`), and `python -m pytest tests/test_cuda.py` as typed.
The user's own files that a command names (`my_pairs.jsonl`, `my_rewards:score`) are written beside a copy of the
root made of links to its files.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import warm
from documented import ROOT, commands, docstring, python_files
from paths import SCRIPTS

USER_FILES = {  # what the README's "your own model" command names, as a user would have them
    "my_pairs.jsonl": json.dumps({"prompt": "Q?", "chosen": " A.", "rejected": " B."}) + "\n",
    "my_prompts.jsonl": json.dumps({"prompt": "Q?"}) + "\n",
    "my_rewards.py": "def score(prompts, completions, **columns):\n    return [1.0 for c in completions]\n",
}


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(root, env): the repository's root as a user has it (links to its files, plus the user's own files), and a
    clean environment in which the paper's models' configs are in the hub cache and the hub is offline."""
    root = tmp_path_factory.mktemp("clone")
    for name in os.listdir(ROOT):
        if name not in (".git", ".venv", "runs"):
            os.symlink(os.path.join(ROOT, name), root / name)
    for name, text in USER_FILES.items():
        (root / name).write_text(text)
    cache = tmp_path_factory.mktemp("hub")
    for path in glob.glob(os.path.join(ROOT, "tests", "configs", "*.json")):
        repo = cache / ("models--" + os.path.basename(path)[: -len(".json")])
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        shutil.copy(path, snapshot / "config.json")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), OMP_NUM_THREADS="1")
    return str(root), env


def cheapest_form(c):
    """(argv after `python`, environment variables to add) of the cheapest form of a documented command."""
    env = dict(c.env, WORLD_SIZE=str(c.nproc)) if c.launcher == "torchrun" else dict(c.env)
    if c.launcher == "pytest":
        return ["-m", "pytest", c.file, *c.argv], env
    if c.file in SCRIPTS:
        return [c.file, *c.argv, *(["--plan_only"] if "--plan_only" not in c.argv else [])], env
    if c.file.startswith("experiments/") or "--rebuild" in c.argv:
        return [c.file, *c.argv, "--help"], env
    return [c.file, *c.argv], env


def test_every_documented_command_runs_as_a_user_types_it(user):
    root, base = user
    found = commands()
    files = {c.file for c in found}
    assert set(SCRIPTS) | {"experiments/run.py", "experiments/bench.py", "toy_task.py"} <= files, files
    assert {c.launcher for c in found} == {"python", "torchrun", "pytest"} and len(found) >= 60
    forms = {}  # one run of each distinct form, every place that shows it named if it fails
    for c in found:
        argv, env = cheapest_form(c)
        forms.setdefault((tuple(argv), tuple(sorted(env.items()))), []).append(c)
    failed = []
    with ThreadPoolExecutor(2) as pool:  # two at a time, as on the machine's two cores
        ran = pool.map(
            lambda form: warm.run([sys.executable, *form[0]], cwd=root, env=base | dict(form[1]), timeout=300), forms
        )
    for ((argv, env), shown), proc in zip(forms.items(), ran):
        out = proc.stdout + proc.stderr
        bad = proc.returncode != 0 or "Traceback" in out or "unknown arguments" in out
        if shown[0].file.startswith("experiments/") and not bad:  # --help lists every flag the command gives
            unknown = [w for w in argv if w.startswith("--") and w != "--help" and w not in proc.stdout]
            bad, out = bool(unknown), f"flags its --help does not list: {unknown}"
        if bad:
            where = ", ".join(c.where for c in shown)
            failed.append(f"{where}: {shown[0].line}\n    exit {proc.returncode}: {out.strip()[-600:]}")
    assert not failed, "\n".join(failed)


def test_the_files_of_experiments_import_the_root_inside_their_functions():  # what the test below checks
    late = [p for p in glob.glob(os.path.join(ROOT, "experiments", "*.py")) if "\n    import " in open(p).read()]
    assert len(late) >= 3


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py"))))
def test_each_file_of_experiments_imports_what_its_functions_need_from_the_root(path):
    """A module a function imports when it runs (TRL for --trl, the scripts, toy_task) is found when the file runs
    from the root with no PYTHONPATH and requirements.txt installed: the file's own top is run first, as `python
    experiments/X.py` runs it, then each of those imports (but those the file does without: matplotlib)."""
    import ast

    with open(path) as f:
        tree = ast.parse(f.read())
    optional = {  # imports under `except ImportError:`, which the file does without (matplotlib: no plots)
        id(node)
        for t in ast.walk(tree)
        if isinstance(t, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("")) for h in t.handlers)
        for node in ast.walk(t)
    }
    late = sorted(
        {
            alias.name if isinstance(node, ast.Import) else node.module
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef)
            for node in ast.walk(fn)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in optional
            for alias in node.names
        }
    )
    rel = os.path.relpath(path, ROOT)  # (with no import inside its functions, its top is still run as a user's)
    code = (
        "import importlib, runpy, sys; sys.argv = [sys.argv[1]]; sys.path[0] = 'experiments'; "
        "runpy.run_path(sys.argv[0], run_name='imported'); [importlib.import_module(m) for m in sys.argv_late]"
    ).replace("sys.argv_late", repr(late))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, rel], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{rel}: {proc.stderr.strip().splitlines()[-1:]}"


def test_every_page_a_docstring_sends_the_reader_to_holds_what_it_promises():
    """`docs/X.md` in a docstring names a page that exists; where it promises commands or runs ("the math runs:
    docs/paper-runs.md", "docs/paper-runs.md's command"), the page shows a command of that file's script, and for
    the math runs, GRPO with the math rewards."""
    shown = commands()
    promises = 0
    for path in python_files():
        doc = docstring(path)
        for match in re.finditer(r"docs/[\w-]+\.md", doc[1] if doc else ""):
            page = match.group(0)
            assert os.path.exists(os.path.join(ROOT, page)), f"{path}: {page} does not exist"
            sentence = doc[1][max(0, match.start() - 80) : match.end() + 20].replace("\n", " ")
            if not re.search(r"command|\bruns\b", sentence):
                continue
            promises += 1
            script = path if path in SCRIPTS else None
            there = [c for c in shown if c.where.startswith(page + ":") and (script is None or c.file == script)]
            assert there, f"{path}: '{sentence.strip()}': {page} shows no command of {script or 'a script'}"
            if "math" in sentence:
                math_runs = [c for c in there if "accuracy" in " ".join(c.argv)]
                assert math_runs, f"{path}: '{sentence.strip()}': {page} shows no math run"
    assert promises >= 2
