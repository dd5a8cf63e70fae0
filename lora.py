"""LoRA adapters (--lora_r): what is theirs alone. Adding them to the frozen base (add_adapters), the reference that
holds no second copy of the base (AdapterReference, with --ref_free off; the default reference-free way needs nothing
of its own), a checkpoint's share of the weights (trained_only: the adapters) and the merge of the final export
(merge_adapters). The rest of a run calls in here where it meets them (each such branch reads --lora_r):
plumbing.build_model adds them; plumbing.Session saves and loads the adapters alone and exports the merged model
beside them; memory_plan counts them; each script picks AdapterReference where it would hold a second model. The
base stays frozen in the run's precision; adapters and their optimizer state are fp32. It imports no script.
"""

import time
import warnings

import torch
import transformers

from ref_free import local, swap_weights, trained


def add_adapters(model, args, seed):
    """peft's LoRA adapters (dropout off, as for the model) on --lora_target_modules of the frozen base, in fp32, drawn
    from `seed` alone (the same on one process or several); B = 0, so the model starts unchanged."""
    import peft

    modules = args.lora_target_modules
    names = modules if modules == "all-linear" else modules.split(",")
    conv1d = any(isinstance(m, transformers.pytorch_utils.Conv1D) for m in model.modules())  # GPT-2's hold W^T
    config = peft.LoraConfig(
        r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0, target_modules=names, fan_in_fan_out=conv1d
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        warnings.simplefilter("ignore", FutureWarning)  # peft 0.21 asks for an attribute transformers 5.24 renamed
        try:
            return peft.get_peft_model(model, config)
        except (ValueError, TypeError, NotImplementedError) as e:  # no such modules, a layer type peft cannot wrap
            raise SystemExit(f"--lora_target_modules {modules}: {str(e).strip().splitlines()[0]}") from None


def trained_only(state, model):
    """A checkpoint's share of a state dict: the trained weights (with adapters, not the frozen base)."""
    frozen = {k for k, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {k: v for k, v in state.items() if k not in frozen}


def merge_adapters(full, model, dtype):
    """(state dict, model to save it with) for the final export: each adapted weight W + alpha / r B A, computed in fp32
    and cast at once (one weight in fp32 at a time, not the model), under the base model's own names."""
    for name, m in [(n, m) for n, m in model.named_modules() if "default" in getattr(m, "lora_A", {})]:
        a, b = (full.pop(f"{name}.lora_{x}.default.weight").float() for x in "AB")
        delta, w = m.scaling["default"] * b @ a, f"{name}.base_layer.weight"
        full[w] = (full[w].float() + (delta.T if m.fan_in_fan_out else delta)).to(dtype)  # (GPT-2's Conv1D: W^T)
    full = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in full.items()}
    return full, model.get_base_model()


class AdapterReference:
    """With --lora_r and --ref_free off: the reference without a second copy of the base. Where it is the initial
    model and never syncs (`frozen`), it is the policy with its adapters disabled; else the policy's base with a
    second set of adapters, those of the last sync, swapped in for its forward. A sync copies the adapters alone."""

    def __init__(self, policy, token_logps, rt, frozen, temperature=1.0):
        self.policy, self.token_logps, self.rt, self.frozen = policy, token_logps, rt, frozen
        self.logps_args = (rt.head_dtype, temperature)  # token_logps' last: the head's dtype, the temperature
        self.held = None if frozen else [local(p).detach().clone() for p in trained(policy)]  # a checkpoint saves it
        self.seconds = 0.0

    @torch.no_grad()
    def logps(self, step, micro, inputs):
        t0 = time.time()
        self.policy.eval()
        if self.frozen:
            with self.policy.disable_adapter():
                logps = self.token_logps(self.policy, *inputs, *self.logps_args)
        else:
            swap_weights(self.policy, self.held)  # the reference's adapters in, the policy's out
            logps = self.token_logps(self.policy, *inputs, *self.logps_args)
            swap_weights(self.policy, self.held)
        self.policy.train()
        self.seconds += time.time() - t0
        return logps

    @torch.no_grad()
    def sync(self, policy, step):  # the reference's adapters <- the policy's
        t0 = time.time()
        for r, p in zip(self.held or [], trained(policy)):
            r.copy_(local(p))
        self.seconds += time.time() - t0

    reset = sync  # at step 0 and at an online round's start
