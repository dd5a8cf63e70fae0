"""What the test modules share: the environment a script runs in, running a script (as a process, forked from a warm
server as `warm.run` does, or in this process), the records it writes, and the tiny models the tests build."""

import contextlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
from dataclasses import dataclass
from unittest import mock

import warm
from paths import ROOT

# a script run by a test: one thread (two run at a time on 2 cores), no process group of the test's own
DIST = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
ENV = {k: v for k, v in os.environ.items() if k not in DIST}
ENV |= {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def command(script, flags, out, nproc=1):
    """`python script flags --output_dir out`, or torchrun's on `nproc` processes of this machine."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1 else []
    return [sys.executable, *torchrun, script, *flags, "--output_dir", str(out)]


def short(steps, eval_prompts=8, batch=8):
    """A short toy run's flags: `steps` steps of `batch` sequences (DPO: pairs), evaluated on `eval_prompts` test
    prompts at the start and at the end, no checkpoint but the last."""
    evaluated = ["--eval_every", "0", "--num_eval_prompts", str(eval_prompts)]
    return ["--max_steps", str(steps), "--batch_size", str(batch), *evaluated, "--save_every", "0"]


def records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@dataclass
class Run:
    cmd: list
    out: str
    proc: subprocess.CompletedProcess

    def check(self):
        assert self.proc.returncode == 0, (
            f"{' '.join(self.cmd)}\n--- stdout\n{self.proc.stdout[-3000:]}\n--- stderr\n{self.proc.stderr[-5000:]}"
        )
        return self

    @property
    def records(self):
        return records(self.out)

    @property
    def steps(self):
        return [r for r in self.records if "loss" in r]

    @property
    def rounds(self):
        return [r for r in self.records if "online/reward" in r]


def run(script, flags, out, nproc=1, env=None, timeout=600):
    """The script as a user runs it (forked from a warm server: tests/support/warm.py), in a process of its own."""
    cmd = command(script, flags, out, nproc)
    return Run(cmd, str(out), warm.run(cmd, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout))


def run_here(script, flags, out, env=None):
    """The script's own main in this process (no start-up cost), for runs that take no signal and need no process of
    their own: (its records, what it printed, the models from_pretrained loaded)."""
    from transformers import AutoModelForCausalLM

    loads, printed = [], io.StringIO()
    original = AutoModelForCausalLM.from_pretrained  # bound to the class (or a test's stand-in for it)

    def counting(*a, **kw):
        loads.append(a[0] if a else kw.get("pretrained_model_name_or_path"))
        return original(*a, **kw)

    handler = signal.getsignal(signal.SIGTERM)
    try:
        with (
            mock.patch.object(sys, "argv", [script, *flags, "--output_dir", str(out)]),
            mock.patch.object(AutoModelForCausalLM, "from_pretrained", counting),
            mock.patch.dict(os.environ, env or {}),
            contextlib.redirect_stdout(printed),
        ):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        signal.signal(signal.SIGTERM, handler)  # the scripts catch SIGTERM to stop cleanly
    return records(out), printed.getvalue(), len(loads)


def help_text(script):
    """What `python script --help` prints (argparse at 80 columns, as in a pipe), from the script's own parser in this
    process: test_dpo.py's help test launches the script itself for the same text."""
    printed = io.StringIO()
    with (
        mock.patch.object(sys, "argv", [script, "--help"]),
        mock.patch.dict(os.environ, {"COLUMNS": "80"}),
        contextlib.redirect_stdout(printed),
        contextlib.suppress(SystemExit),
    ):
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    return printed.getvalue()


def llama_sizes(vocab=4096, hidden=64, layers=2, heads=4, kv_heads=None, mlp=None, tied=False):
    """A small Llama's config keys: `hidden` wide, an MLP of `mlp` (2 hidden), `kv_heads` key-value heads (all)."""
    sizes = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp or 2 * hidden, num_hidden_layers=layers)
    return sizes | dict(num_attention_heads=heads, num_key_value_heads=kv_heads or heads, tie_word_embeddings=tied)


def llama(**kw):  # the config itself: llama_sizes' keywords, and any other config keys
    from transformers import LlamaConfig

    sizes = {k: kw.pop(k) for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "mlp", "tied") if k in kw}
    return LlamaConfig(**llama_sizes(**sizes), **kw)
