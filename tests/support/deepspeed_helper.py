"""DeepSpeed on a CPU under transformers' Trainer (tests/test_your_trainer.py runs it):

    torchrun --nproc_per_node 1 tests/support/deepspeed_helper.py OUT.json

Trains the toy for 3 steps with ZeRO stage 2 and records one weight's sum at on_step_begin, on_pre_optimizer_step
and on_step_end: accelerate runs DeepSpeed's optimizer step inside backward(), so the update is already in the
weights when on_pre_optimizer_step runs. Then docs/your-trainer.md's HumanlineSync is made for that trainer: the
line it stops with."""

import importlib
import json
import os
import re
import sys

import datasets
import torch
from paths import ROOT
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, ROOT)

import toy_task  # noqa: E402


class Watch(TrainerCallback):
    def __init__(self):
        self.seen = []

    def at(self, hook, model):
        self.seen.append((hook, float(next(model.parameters()).detach().double().sum())))

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.at("begin", model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.at("pre_optimizer_step", model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.at("end", model)


def main(out):
    # DeepSpeed compiles its shared-memory all-reduce for CPU ranks at start-up (a minute, again in each new venv):
    # one process never uses it (the module by its name: deepspeed.comm.torch is torch itself)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    g = torch.Generator().manual_seed(0)
    rows = [dict(input_ids=ids, labels=ids) for ids in torch.randint(3, 17, (8, 12), generator=g).tolist()]
    # Trainer's own torch AdamW (DeepSpeed's would compile its CPU Adam first, two minutes)
    zero2 = dict(zero_optimization=dict(stage=2), zero_allow_untested_optimizer=True, gradient_clipping="auto")
    zero2 |= dict(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto")
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(out), "run"),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        deepspeed=zero2,
    )
    watch = Watch()
    model = AutoModelForCausalLM.from_pretrained(toy_task.load().model, dtype=torch.float32)
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), callbacks=[watch])
    trainer.train()
    with open(os.path.join(ROOT, "docs", "your-trainer.md")) as f:
        (code,) = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "class HumanlineSync" in b]
    ns = {}
    exec(compile(code, "docs/your-trainer.md", "exec"), ns)
    try:
        ns["HumanlineSync"](trainer, sync_every=1)
        stop = None
    except ValueError as e:
        stop = str(e)
    with open(out, "w") as f:
        json.dump(dict(deepspeed=trainer.is_deepspeed_enabled, seen=watch.seen, stop=stop), f)


if __name__ == "__main__":
    main(sys.argv[1])
