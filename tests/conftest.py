"""Shared fixtures: the built-in toy task (the canonical instance committed in toy/), its model and tokenizer. The
helpers the test modules share (running a script, tiny models) and the helper programs are in tests/support/."""

import os
import signal
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))  # import runs, warm, ...

import plumbing  # noqa: E402
import toy_task  # noqa: E402

# the cores shared among pytest-xdist's workers (pytest.ini): 2 threads beside another busy process run slower
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))))


@pytest.fixture(autouse=True)
def signal_handlers():
    """The scripts install SIGTERM and SIGINT handlers (a checkpoint, then a clean exit); after each test pytest's own
    are back, so that Ctrl-C still stops the suite."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture(scope="session")
def toy() -> toy_task.ToyPaths:
    return toy_task.load()


@pytest.fixture(scope="module")
def tok(toy):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(toy.model)


@pytest.fixture(scope="module")
def toy_model(toy):
    """The toy's starting policy, fp32, in eval mode (a test that trains it makes its own)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(toy.model, dtype=torch.float32).eval()


def make_session(module, out, policy, ref, opt, sched, tok, resume=False, step=0):
    """A script's run bookkeeping (plumbing.Session: checkpoints, resume) on one process, for models built in a test;
    `ref` a reference model (the script's ReferenceModel holds it) or None."""
    args = module.Args(output_dir=str(out), resume=resume, save_total_limit=0)  # (parse_args fills unset ones)
    rt = SimpleNamespace(rank=0, world=1, device=torch.device("cpu"), distributed=False)
    state = SimpleNamespace(step=step, round_index=0, round=[], round_start=0)
    reference = module.ReferenceModel(ref, rt) if ref is not None else None
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return plumbing.Session(args, rt, tok, policy, opt, sched, torch.Generator(), state, reference)
    finally:
        signal.signal(signal.SIGTERM, handler)  # the Session's own, for the scripts' loops
