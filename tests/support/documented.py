"""The commands the README, docs/ and the docstrings show, read as a user would type them.

`commands()` collects every command line that runs a file of this repository: in the code blocks and the inline
code of README.md and docs/*.md, and in the docstrings of the Python files of the top folder, experiments/ and its
studies/. A line continued with a backslash is one command; `a && b` is two; a `# comment` is dropped, and so is a `...`
that stands for more flags, and a redirect or a pipe after the command. Each is a `Command`: where it is shown (page
or file, and line), the environment variables it sets (`WORLD_SIZE=8 python ...`), how it is launched (`python`,
`torchrun`, `pytest`), the file it runs, its arguments, and the number of processes it starts (torchrun's
`--nproc_per_node` x `--nnodes`).
"""

import ast
import glob
import os
import re
import shlex
from typing import NamedTuple

from paths import ROOT


class Command(NamedTuple):
    where: str  # "docs/paper-runs.md:14"
    line: str  # the command as written (continuations joined)
    env: dict
    launcher: str  # python | torchrun | pytest
    file: str  # relative to the repository's root
    argv: list
    nproc: int


def pages():
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def python_files():
    return sorted(
        os.path.relpath(p, ROOT)
        for folder in ("", "experiments", os.path.join("experiments", "studies"))
        for p in glob.glob(os.path.join(ROOT, folder, "*.py"))
    )


def docstring(path):
    """(first line number, text) of a Python file's module docstring, or None."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.lineno, first.value.value
    return None


def snippets():
    """(where, line number, text) of every place a command may be shown."""
    found = []
    for page in pages():
        with open(os.path.join(ROOT, page)) as f:
            lines = f.read().splitlines()
        block = None
        for n, text in enumerate(lines, 1):
            if text.lstrip().startswith("```"):
                block = None if block is not None else n
                continue
            if block is not None:
                found.append((page, n, text))
            else:  # inline code, which may wrap onto the next line
                joined = text + (" " + lines[n] if text.count("`") % 2 and n < len(lines) else "")
                found += [(page, n, span) for span in re.findall(r"`([^`]+)`", joined)]
    for path in python_files():
        doc = docstring(path)
        if doc:
            found += [(f"{path} docstring", doc[0] + i, text) for i, text in enumerate(doc[1].splitlines())]
    return found


def parse(words):
    """(env, launcher, file, argv, nproc) of one command's words, or None if it runs no file of this repository."""
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    words = words[: next((i for i, w in enumerate(words) if w in (">", ">>", "<", "|")), len(words))]  # the command
    if not words:
        return None
    nproc, launcher = 1, None
    if words[0] in ("python", "python3"):
        launcher, rest = "python", words[1:]
        if rest[:2] == ["-m", "pytest"]:
            launcher, rest = "pytest", [w for w in rest[2:] if not w.startswith("-")]
    elif words[0] == "torchrun":
        launcher, rest = "torchrun", words[1:]
        options = {}
        while rest and rest[0].startswith("--"):
            flag = rest.pop(0)
            if flag != "--standalone":
                options[flag] = rest.pop(0)
        nproc = int(options.get("--nproc_per_node", 1)) * int(options.get("--nnodes", 1))
    if not launcher or not rest or not rest[0].endswith(".py") or not os.path.isfile(os.path.join(ROOT, rest[0])):
        return None
    return env, launcher, rest[0], [w for w in rest[1:] if w != "..."], nproc


def commands():
    """Every documented command that runs a file of this repository, in the order the pages show them."""
    found, pending = [], None
    for where, n, text in snippets():
        if pending and pending[0] == where:  # a line continued with a backslash
            start, text = pending[1], pending[2] + " " + text.strip()
        else:
            start = n
        pending = (where, start, text.rstrip()[:-1]) if text.rstrip().endswith("\\") else None
        if pending:
            continue
        text = re.split(r"(?:^|\s)#", text)[0].strip()
        for part in text.split("&&"):
            try:
                words = shlex.split(part)
            except ValueError:  # prose in backticks, not a command
                continue
            got = parse(words)
            if got:
                found.append(Command(f"{where}:{start}", part.strip(), *got))
    return found
