"""docs/your-trainer.md's HumanlineSync under FSDP2, on two gloo processes (tests/test_your_trainer.py runs it):

    torchrun --nproc_per_node 2 tests/support/fsdp_callback_helper.py OUT

transformers' Trainer does not shard on a CPU (its FSDP route stops: "Using fsdp only works in distributed training";
with use_cpu=True it trains unsharded), so a loop of Trainer's order stands in for it: forward, the reference's
no-grad forward, backward, clipping, on_pre_optimizer_step, optimizer.step. The toy's policy and its reference are
each sharded with fully_shard (every decoder layer, then the root); the callback is the page's block as it stands,
then without its reshard line. Writes OUT.<rank>: for each of the two, at each update whether the reference's
weights are the policy's before it (updates k - 1, 2k - 1, ...) or, between syncs, its own."""

import json
import os
import re
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from paths import ROOT
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, ROOT)

import toy_task  # noqa: E402


def callback_class(without_reshard):
    with open(os.path.join(ROOT, "docs", "your-trainer.md")) as f:
        (code,) = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "class HumanlineSync" in b]
    if without_reshard:
        code = re.sub(
            r"(?m)^ *if hasattr\(self.trainer.ref_model, \"reshard\"\).*\n +self.trainer.ref_model.reshard\(\)\n",
            "",
            code,
        )
        assert "reshard()" not in code
    ns = {}
    exec(compile(code, "docs/your-trainer.md", "exec"), ns)
    return ns["HumanlineSync"]


def sharded(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def full(model):
    """Every weight, whole: gathered from the shards, or as it is where a forward left the root gathered."""
    from torch.distributed.tensor import DTensor

    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for p in model.parameters()]


def synced(without_reshard, rank, k=2):
    """Four steps; per step, whether the reference holds what it should after it."""
    path = toy_task.load().model
    policy, reference = sharded(path), sharded(path).eval().requires_grad_(False)
    trainer = SimpleNamespace(model=policy, ref_model=reference, args=SimpleNamespace(), is_deepspeed_enabled=False)
    callback = callback_class(without_reshard)(trainer, sync_every=k)
    state, control = SimpleNamespace(global_step=0), SimpleNamespace()
    callback.on_train_begin(trainer.args, state, control)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    g, steps = torch.Generator().manual_seed(rank), []
    for step in range(4):
        ref_before = full(reference)
        ids = torch.randint(3, 17, (2, 12), generator=g)
        loss = policy(input_ids=ids, labels=ids).loss
        with torch.no_grad():  # as a trainer computes the reference's log-probs: the root stays gathered after it
            reference(input_ids=ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        before = full(policy)
        callback.on_pre_optimizer_step(trainer.args, state, control)
        optimizer.step()
        optimizer.zero_grad()
        state.global_step += 1
        expect = before if (step + 1) % k == 0 else ref_before
        steps.append(all(torch.equal(a, b) for a, b in zip(full(reference), expect, strict=True)))
    return dict(steps=steps, moved=not all(torch.equal(a, b) for a, b in zip(full(policy), before, strict=True)))


def main(out):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    result = {"page": synced(False, rank), "without_reshard": synced(True, rank)}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)
    dist.barrier()  # both done before either leaves
    # the group's teardown is not what this checks, and under load it aborted rarely, in two CI runs, with "terminate
    # called without an active exception" (after a barrier, in destroy_process_group or the interpreter's exit): leave
    # at once, the results written
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
