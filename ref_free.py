"""The reference without a second model (--ref_free on, the default of the three scripts).

The textbook reference is a second copy of the policy that takes the policy's weights at each sync (each script's
ReferenceModel). This holds the same reference without the copy: at the moment the reference would take the policy's
weights, the policy itself computes, with those very weights, the log-probs the reference will be asked for until the
next sync, and keeps them on the CPU. The loop's lines are the same in both ways: `reference.logps(step, micro,
inputs)` in the step, `reference.sync(policy, step)` in optimizer_step, `reference.reset(policy, step)` at step 0
and at an online round's start. The values are the same too (tests/test_performance.py compares the two step by
step); what changes is one model in memory instead of two, and the reference's forwards run at the sync point.

With LoRA adapters (--lora_r) neither way holds a second copy of the base: reference-free as above (a snapshot kept
for later steps is the adapters alone), or with --ref_free off lora.AdapterReference, a second set of adapters. The
helper `local` (a parameter's own shard) serves every reference, the scripts' ReferenceModel too.
"""

import itertools
import time

import torch
from tqdm.auto import tqdm


def local(p):
    return p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 parameter: this process's shard


def trained(policy):  # the parameters a sync moves: every one, or with --lora_r the adapters
    return [p for p in policy.parameters() if p.requires_grad]


class PolicyAsReference:
    """The reference without a second model, with the reference model's methods. Where the reference would take the
    policy's weights (a reset; a sync, before or after the update), the policy computes, then and with those weights,
    the reference log-probs of the steps that snapshot serves (up to the next sync), in eval mode, and keeps them on
    the CPU until their step asks. With `wait` (online GRPO under --sync: a snapshot may serve steps not sampled yet)
    the snapshot's shards wait on the CPU, to be swapped into the policy when those steps are sampled."""

    def __init__(self, policy, batches, token_logps, rt, due, max_steps, wait=False, temperature=1.0):
        """batches(step): the step's micro-batches (input_ids, attention_mask, loss_mask), None if not sampled yet;
        due(step): whether the reference syncs at that step (the script's sync_due; None: never); temperature: of the
        log-probs (GRPO's --logps_temperature)."""
        self.policy, self.batches, self.token_logps, self.rt = policy, batches, token_logps, rt
        self.logps_args = (rt.head_dtype, temperature)  # token_logps' last: the head's dtype, the temperature
        self.due, self.max_steps, self.wait = due, max_steps, wait
        self.held = dict(ahead={}, weights=None, steps=[])  # what a checkpoint saves
        self.seconds = 0.0  # spent on the reference since the last step's record

    def logps(self, step, micro, inputs):
        """The reference log-probs of micro-batch `micro` of step `step`, computed ahead from `batches(step)` where the
        reference took the policy's weights: `inputs` is not read, only held against their shape."""
        ahead = self.held["ahead"]
        if micro == 0 and step not in ahead and self.held["weights"] is not None:  # sampled after its snapshot
            t0 = time.time()
            swap_weights(self.policy, self.held["weights"])
            self.held["steps"] = self.compute(self.held["steps"])
            swap_weights(self.policy, self.held["weights"])
            self.held["weights"] = self.held["weights"] if self.held["steps"] else None
            self.seconds += time.time() - t0
        logps = ahead[step][micro]
        if micro == len(ahead[step]) - 1:
            del ahead[step]
        batch, width = inputs[0].shape  # (batch, seq) input_ids: the log-probs are (batch, seq - 1)
        assert logps.shape == (batch, width - 1), f"step {step}, micro-batch {micro}: {tuple(logps.shape)}, not theirs"
        return logps.to(self.rt.device)

    def reset(self, policy, step):
        """The reference <- the policy (step 0, a round's start): it serves `step` and the steps after it."""
        self.snapshot(self.served_from(step))

    def sync(self, policy, step):
        """The reference <- the policy at step `step`'s sync: it serves the steps after it."""
        self.snapshot(self.served_from(step + 1))

    def served_from(self, first):  # the steps a snapshot serves: `first` up to the next step due to sync, included
        last = next((s for s in range(first, self.max_steps) if self.due and self.due(s)), self.max_steps - 1)
        return range(first, last + 1)

    def snapshot(self, steps):  # the reference is the policy as it is now, for `steps`
        t0, steps = time.time(), list(steps)
        rest = self.compute(steps)
        keep = self.wait and bool(rest)
        self.held["weights"] = [local(p).detach().to("cpu", copy=True) for p in trained(self.policy)] if keep else None
        self.held["steps"] = rest if keep else []
        if len(rest) < len(steps) or keep:
            self.seconds += time.time() - t0

    def compute(self, steps):  # the log-probs of the sampled ones of `steps`; returns the rest
        steps = list(steps)
        known = list(itertools.takewhile(lambda s: self.batches(s) is not None, steps))
        self.policy.eval()
        with torch.no_grad(), self.rt.autocast():
            for s in tqdm(known, "reference log-probs", disable=self.rt.rank != 0 or len(known) < 2, leave=False):
                self.held["ahead"][s] = [
                    self.token_logps(self.policy, *b, *self.logps_args).cpu() for b in self.batches(s)
                ]
        self.policy.train()
        if hasattr(self.policy, "reshard"):  # FSDP2 keeps the root's parameters gathered after a no-grad forward
            self.policy.reshard()
        return steps[len(known) :]


@torch.no_grad()
def swap_weights(policy, weights):
    """Exchange the policy's trained parameters (with --lora_r its adapters) with `weights`, a tensor at a time."""
    if hasattr(policy, "reshard"):
        policy.reshard()
    for p, w in zip(trained(policy), weights):
        held = local(p).to(w.device, copy=True)
        local(p).copy_(w)
        w.copy_(held)
