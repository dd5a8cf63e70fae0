"""Measurements of the GPU code paths on a CPU, each in a fresh process (tests/test_gpu_path.py runs them):

    # FSDP2 on gloo: loading, all-gathers per generate call
    torchrun --nproc_per_node 2 tests/support/gpu_path_helper.py fsdp MODEL_DIR OUT.json
    # FSDP2 on gloo: two steps of the script's own loop (gradients per micro-batch, the bf16 dtype chain)
    torchrun --nproc_per_node 2 tests/support/gpu_path_helper.py train MODEL_DIR OUT.json PRECISION
    # two steps of the script's own loop on one process: the peak memory against the plan
    python tests/support/gpu_path_helper.py peak SHAPE_JSON OUT.json

Each uses dpo_humanline.py's own code: load_model and generate, or its main() with its loop as it is, watched
through the functions the loop calls (accumulate after each micro-batch's backward, dpo_loss, optimizer_step)."""

import contextlib
import json
import os
import sys
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from paths import ROOT

import data_formats  # noqa: E402
import dpo_humanline as dpo  # noqa: E402
import memory_plan  # noqa: E402
import plumbing  # noqa: E402
import ref_free  # noqa: E402

torch.set_num_threads(1)


def rss():
    """The resident set size now and its peak since the last reset_peak(), in bytes (Linux)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the kernel's "reset the peak RSS"


def pairs_file(path, n_pairs, prompt, completion, seed=0):
    """n preference pairs for the toy tokenizer (a token per digit): prompts of `prompt` tokens, completions of
    `completion` tokens with the end-of-sequence token the scripts append."""
    g = torch.Generator().manual_seed(seed)
    digits = lambda n: "".join(map(str, torch.randint(0, 10, (n,), generator=g).tolist()))  # noqa: E731
    with open(path, "w") as f:
        for _ in range(n_pairs):
            row = dict(prompt=digits(prompt), chosen=digits(completion - 1), rejected=digits(completion - 1))
            f.write(json.dumps(row) + "\n")


def run_main(argv, **watch):
    """dpo_humanline.main() on `argv`, with each of the functions named in `watch` (the script's, else plumbing's)
    wrapped by its watcher: watcher(real, *args, **kwargs) calls the real function and returns what it returns."""
    owner = {name: dpo if hasattr(dpo, name) else plumbing for name in watch}
    patches = [
        mock.patch.object(owner[n], n, (lambda real, w: lambda *a, **k: w(real, *a, **k))(getattr(owner[n], n), w))
        for n, w in watch.items()
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        stack.enter_context(mock.patch.object(sys, "argv", ["dpo_humanline.py", *argv]))
        dpo.main()


def step0_log_ratio(reference_free, precision="bf16"):
    """The largest |log pi_theta - log pi_ref| over the completion tokens of the toy's first DPO step, where the
    reference equals the policy: the policy's training forward (train mode, with gradients, under autocast) against
    the reference's no-grad eval forward, from a second model or (reference_free) from the policy itself. On the
    device setup() picks (a GPU where there is one); with k = 1 humanline trains on log-ratios of about 1e-3."""
    import ref_free

    args = dpo.Args(precision=precision, ref_free="on" if reference_free else "off", max_steps=1, micro_batch_size=8)
    args.sync, args.clip = "humanline", "clamp"
    rt = dpo.setup(args)
    tokenizer = plumbing.load_tokenizer(args)
    pairs = [(p, c, r) for p, (c, r), _ in data_formats.load_data(args, "preferences", tokenizer, rt)]
    forwards = dpo.forward_batches(dpo.offline_batch(pairs, 0, args.batch_size, args.seed), args, 0, 1)
    inputs = [dpo.collate(seqs, tokenizer.pad_token_id, rt.device) for _, seqs in forwards]
    policy = dpo.load_model(args, rt).to(rt.device).train()
    if reference_free:
        batches = lambda s: inputs if s == 0 else None  # noqa: E731
        reference = ref_free.PolicyAsReference(policy, batches, dpo.token_logps, rt, lambda s: True, 1)
    else:
        reference = dpo.ReferenceModel(dpo.load_model(args, rt).to(rt.device), rt)
    reference.reset(policy, step=0)
    worst = 0.0
    for micro, x in enumerate(inputs):
        with rt.autocast():
            ref = reference.logps(0, micro, x)
            pol = dpo.token_logps(policy, *x, rt.head_dtype)
        worst = max(worst, (pol - ref)[x[2][:, 1:].bool()].abs().max().item())
    assert not torch.is_autocast_enabled(rt.device.type)
    return worst


def fsdp(model_dir, out):
    """Two gloo processes: per-rank load memory (up to the log-prob check, whose forward is a training step's), the
    loaded shards, all-gathers per generate call, and the model resharded after it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    args = dpo.Args(model_name_or_path=model_dir, precision="fp32", max_new_tokens=4, temperature=1.0, top_p=1.0)
    rt = dpo.setup(args)
    import torch.distributed as dist

    result = {"rank": rt.rank}
    import torch.distributed.fsdp  # noqa: F401 (imported before the measurement, as is the model's code:)

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    reset_peak()
    before, _ = rss()
    loaded = {}
    check = plumbing.check_logps
    with mock.patch.object(plumbing, "check_logps", lambda *a: loaded.setdefault("peak", rss()[1]) and check(*a)):
        policy = dpo.load_model(args, rt)
    result["load_rss_growth"] = loaded["peak"] - before
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rt.rank == 0:  # the loaded shards, gathered, are the file's weights
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
        result["loaded_equal"] = ref.keys() == full.keys() and all(torch.equal(ref[k], full[k]) for k in ref)
    result["model_bytes"] = sum(p.numel() * 4 for p in policy.parameters())  # DTensors: the full size
    result["largest_bytes"] = max(p.numel() * 4 for p in policy.parameters())
    result["shard_bytes"] = sum(ref_free.local(p).numel() * 4 for p in policy.parameters())
    del full

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
            plumbing.generate(policy, tokenizer, prompts, 2, args, greedy=False, seed=0)
            result[f"all_gathers_{new_tokens}"] = len(calls)
    finally:
        dist.all_gather_single = real
    result["units"] = sum(hasattr(m, "reshard") for m in policy.modules())
    # after generation every parameter is its shard again, as training expects
    result["resharded_after_generate"] = all(isinstance(p, DTensor) for p in policy.parameters())
    with open(f"{out}.rank{rt.rank}", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def train(model_dir, data, out, precision):
    """Two gloo processes, two offline + humanline DPO steps of the script's own loop on `data`, 2 micro-batches per
    process per step: the gradient bytes this process holds after each micro-batch's backward, and the dtypes of
    what the loss reads and of the parameters, gradients and AdamW moments at the update."""
    rank = int(os.environ["RANK"])
    result = {"rank": rank, "grad_bytes": [], "grad_dtypes": set(), "loss_dtypes": set()}
    models = []

    def load(real, *a, **kw):
        models.append(real(*a, **kw))  # the first model loaded is the policy
        return models[-1]

    def after_micro_batch(real, sums, metrics):  # the loop calls it after the micro-batch's backward
        grads = [p.grad for p in models[0].parameters() if p.grad is not None]
        result["grad_bytes"].append(sum(ref_free.local(g).numel() * g.element_size() for g in grads))
        result["grad_dtypes"] |= {str(g.dtype) for g in grads}
        return real(sums, metrics)

    def loss(real, *logps, **kw):
        read = [*logps[:4], *(v for k, v in kw.items() if k.endswith("_logps"))]  # the policy's and the reference's
        result["loss_dtypes"] |= {str(t.dtype) for t in read}
        losses, metrics = real(*logps, **kw)
        result["loss_dtypes"].add(str(losses.dtype))
        return losses, metrics

    def update(real, policy, ref, optimizer, *a, **kw):
        result["params"] = {str(p.dtype) for p in policy.parameters()}
        result["shard_bytes"] = sum(ref_free.local(p).numel() * p.element_size() for p in policy.parameters())
        done = real(policy, ref, optimizer, *a, **kw)
        moments = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.numel() > 1]
        result["adam"] = {str(v.dtype) for v in moments}
        return done

    flags = ["--model_name_or_path", model_dir, "--dataset", data, "--humanline", "--precision", precision]
    flags += ["--max_steps", "2", "--batch_size", "8", "--micro_batch_size", "2", "--eval_prompts", "none"]
    flags += ["--save_every", "0", "--output_dir", f"{out}.run"]
    run_main(flags, load_model=load, accumulate=after_micro_batch, dpo_loss=loss, optimizer_step=update)
    result = {k: sorted(v) if isinstance(v, set) else v for k, v in result.items()}
    result["model_bytes"] = sum(p.numel() * 4 for p in models[0].parameters())  # DTensors: the full size
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(result, f)


def peak(shape_json, out):
    """One process, two humanline DPO steps of the script's own loop (the second, so that the gradients and AdamW's
    moments exist; reference-free, each sync computes the next step's reference log-probs while the gradients exist)
    on a Llama of the given shape: the peak RSS from the model's load to the second update, above the RSS
    before it, against the memory plan's training phase."""
    import tempfile

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    shape = json.loads(shape_json)
    torch.manual_seed(0)
    config, flags = LlamaConfig(**shape["config"], pad_token_id=0, eos_token_id=1), shape["flags"]
    with tempfile.TemporaryDirectory() as tmp:
        # saved in the dtype the run loads it in (a LoRA base in --precision), as a real model's file would be
        loads_in = torch.bfloat16 if flags.get("lora_r") and flags["precision"] == "bf16" else torch.float32
        LlamaForCausalLM(config).to(loads_in).save_pretrained(os.path.join(tmp, "model"))
        AutoTokenizer.from_pretrained(os.path.join(ROOT, "toy", "model")).save_pretrained(os.path.join(tmp, "model"))
        pairs_file(os.path.join(tmp, "pairs.jsonl"), flags["batch_size"], 16, flags["max_length"] - 16)
        seen = {}

        def load(real, args, *a, **kw):
            reset_peak()
            seen["args"], seen["before"] = args, rss()[0]
            return real(args, *a, **kw)

        def update(real, *a, **kw):
            done = real(*a, **kw)
            seen["peak"] = rss()[1]  # after each update, before the checkpoint of the last step gathers the model
            return done

        argv = ["--model_name_or_path", os.path.join(tmp, "model"), "--dataset", os.path.join(tmp, "pairs.jsonl")]
        argv += ["--batch_size", str(flags["batch_size"]), "--micro_batch_size", str(flags["micro_batch_size"])]
        argv += ["--max_length", str(flags["max_length"]), "--max_prompt_length", "16", "--max_steps", "2"]
        argv += ["--precision", flags["precision"], "--eval_prompts", "none", "--save_every", "0", "--humanline"]
        argv += ["--output_dir", os.path.join(tmp, "run")] + ["--gradient_checkpointing"] * flags[
            "gradient_checkpointing"
        ]
        argv += ["--lora_r", str(flags["lora_r"])] if flags.get("lora_r") else []
        finish = plumbing.Session.finish

        def export(session):  # the final save (with --lora_r the merged model): its peak above what the run held
            reset_peak()
            before = rss()[0]
            finish(session)
            seen["export"] = rss()[1] - before

        with mock.patch.object(plumbing.Session, "finish", export):
            run_main(argv, load_model=load, optimizer_step=update)
    rows = memory_plan.plan(seen["args"], "dpo", 1, config=config, gpu=False)
    train = sum(v for _, v, p in rows if p in ("train", "both"))
    with open(out, "w") as f:
        saving = memory_plan.saving_bytes(config, seen["args"])
        result = dict(measured=seen["peak"] - seen["before"], planned=train, rows=rows)
        json.dump(result | dict(export=seen["export"], saving=saving), f)


if __name__ == "__main__":
    {"fsdp": fsdp, "train": train, "peak": peak}[sys.argv[1]](*sys.argv[2:])
