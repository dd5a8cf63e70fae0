"""Measurements of the GPU code paths on a CPU, each in a fresh process (tests/test_gpu_path.py runs them):

    # FSDP2 on gloo: loading, gradients, all-gathers per generate call, dtypes
    torchrun --nproc_per_node 2 tests/gpu_path_helper.py fsdp MODEL_DIR OUT.json
    # two DPO steps' peak memory against the plan
    python tests/gpu_path_helper.py peak SHAPE_JSON OUT.json

Both use the training scripts' own functions (dpo_humanline.py: load_model, token_logps, generate, the loss)."""

import json
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dpo_humanline as dpo  # noqa: E402
import memory_plan  # noqa: E402

torch.set_num_threads(1)


def rss():
    """The resident set size now and its peak since the last reset_peak(), in bytes (Linux)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the kernel's "reset the peak RSS"


def batch(vocab, n_pairs, prompt, completion, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    return [(ids(prompt), ids(completion), ids(completion)) for _ in range(n_pairs)]


def train_step(policy, optimizer, scheduler, pairs, args, rt):
    """One DPO step as the script runs it (reference log-probs by the policy ahead, in eval mode, as ref-free)."""
    for pairs_mb, sequences in dpo.forward_batches(pairs, args, rt.rank, rt.world):
        ids, attn, mask = dpo.collate(sequences, 0, rt.device)
        with torch.no_grad(), rt.autocast:
            ref_logps = dpo.token_logps(policy.eval(), ids, attn, mask, rt.head_dtype)
        policy.train()
        with rt.autocast:
            logps = dpo.token_logps(policy, ids, attn, mask, rt.head_dtype)
        n, m = len(pairs_mb), mask[:, 1:]
        losses, _ = dpo.dpo_loss(logps[:n], logps[n:], ref_logps[:n], ref_logps[n:], m[:n], m[n:], 0.1, -1.5, 1.5)
        (losses.sum() * rt.world / args.batch_size).backward()
    grads = sorted({str(p.grad.dtype) for p in policy.parameters()})
    dpo.optimizer_step(policy, None, optimizer, scheduler, 1.0, "none", 1, 0)
    return logps, ref_logps, losses, grads


def fsdp(model_dir, out):
    """Two gloo processes: per-rank load memory, the loaded shards, gradient shards, all-gathers per generate call,
    and the dtypes along the bf16 path."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = dpo.Args(
        model_name_or_path=model_dir,
        max_steps=120,
        batch_size=4,
        micro_batch_size=1,
        precision="fp32",
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
    )
    rt = dpo.setup(args)
    import torch.distributed as dist

    result = {"rank": rt.rank}
    import torch.distributed.fsdp  # noqa: F401 (imported before the measurement, as is the model's code:)
    from transformers import AutoConfig

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    reset_peak()
    before, _ = rss()
    policy = dpo.load_model(args, None, rt)
    result["load_rss_growth"] = rss()[1] - before
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rt.rank == 0:  # the loaded shards, gathered, are the file's weights
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
        result["loaded_equal"] = ref.keys() == full.keys() and all(torch.equal(ref[k], full[k]) for k in ref)
    result["model_bytes"] = sum(p.numel() * 4 for p in policy.parameters())  # DTensors: the full size
    result["largest_bytes"] = max(p.numel() * 4 for p in policy.parameters())
    del full

    optimizer, scheduler = dpo.make_optimizer(policy, args)
    pairs = batch(policy.config.vocab_size, 4, 8, 24)
    train_step(policy, optimizer, scheduler, pairs, args, rt)  # 2 micro-batches per process
    for p in policy.parameters():  # a second accumulation, kept: gradient bytes held on this process
        p.grad = None
    for pairs_mb, sequences in dpo.forward_batches(pairs, args, rt.rank, rt.world):
        ids, attn, mask = dpo.collate(sequences, 0, rt.device)
        dpo.token_logps(policy, ids, attn, mask, rt.head_dtype).sum().backward()
    result["grad_bytes"] = sum(dpo.local(p.grad).numel() * p.grad.element_size() for p in policy.parameters())
    result["shard_bytes"] = sum(dpo.local(p).numel() * 4 for p in policy.parameters())
    optimizer.zero_grad(set_to_none=True)

    calls = []
    real = dist.all_gather_single

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [[5, 6, 7, 8], [9, 10, 11]] * 2
    dist.all_gather_single = counting
    try:
        for new_tokens in (4, 16):
            calls.clear()
            args.max_new_tokens = new_tokens
            dpo.generate(policy, tokenizer, prompts, 2, args, greedy=False, seed=0)
            result[f"all_gathers_{new_tokens}"] = len(calls)
    finally:
        dist.all_gather_single = real
    result["units"] = sum(hasattr(m, "reshard") for m in policy.modules())
    calls.clear()
    dist.all_gather_single = counting
    train_step(policy, optimizer, scheduler, pairs, args, rt)  # training after generation: resharded, still right
    dist.all_gather_single = real
    result["all_gathers_train_step"] = len(calls)

    # the bf16 path (FSDP2 mixed precision): what humanline reads stays fp32
    args.precision = "bf16"
    rt = SimpleNamespace(
        **{
            **vars(rt),
            "dtype": torch.bfloat16,
            "head_dtype": torch.float32,
            "autocast": torch.autocast("cpu", dtype=torch.bfloat16),
        }
    )
    policy16 = dpo.load_model(args, None, rt)
    optimizer, scheduler = dpo.make_optimizer(policy16, args)
    logps, ref_logps, losses, grads = train_step(policy16, optimizer, scheduler, pairs, args, rt)
    result["bf16_dtypes"] = {
        "logps": str(logps.dtype),
        "ref_logps": str(ref_logps.dtype),
        "loss": str(losses.dtype),
        "params": sorted({str(p.dtype) for p in policy16.parameters()}),
        "grads": grads,
        "adam": sorted(
            {str(v.dtype) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.numel() > 1}
        ),
    }
    with open(f"{out}.rank{rt.rank}", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def peak(shape_json, out):
    """One process, one DPO step (the second, so that the gradients and AdamW's moments exist): the peak RSS above
    the RSS before the model was built, against the memory plan's training phase."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = json.loads(shape_json)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = LlamaConfig(**shape["config"])
    flags = shape["flags"]
    args = dpo.Args(
        max_steps=120,
        batch_size=flags["batch_size"],
        micro_batch_size=flags["micro_batch_size"],
        max_length=flags["max_length"],
        gradient_checkpointing=flags["gradient_checkpointing"],
        precision=flags["precision"],
        eval_prompts="none",
    )
    rt = SimpleNamespace(
        rank=0,
        world=1,
        device=torch.device("cpu"),
        dtype=torch.float32,
        head_dtype=torch.float32,
        autocast=torch.autocast("cpu", dtype=torch.bfloat16, enabled=flags["precision"] == "bf16"),
    )
    pairs = batch(config.vocab_size, flags["batch_size"], 16, flags["max_length"] - 16)
    reset_peak()
    before, _ = rss()
    policy = LlamaForCausalLM(config)
    if args.gradient_checkpointing:
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    optimizer, scheduler = dpo.make_optimizer(policy, args)
    for _ in range(2):
        train_step(policy, optimizer, scheduler, pairs, args, rt)
    measured = rss()[1] - before
    rows = memory_plan.plan(args, "dpo", 1, config=config, gpu=False)
    train = sum(v for _, v, p in rows if p in ("train", "both"))
    with open(out, "w") as f:
        json.dump({"measured": measured, "planned": train, "rows": rows}, f)


if __name__ == "__main__":
    {"fsdp": fsdp, "peak": peak}[sys.argv[1]](*sys.argv[2:])
