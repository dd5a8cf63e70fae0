"""Real-shaped data, end to end: every dataset format of TRL that applies to a script, on a local file in exactly
that shape, trained for two steps with a tiny randomly initialised Llama whose tokenizer has a Llama-3-style chat
template (special tokens, a BOS written by the template) built here. Also: the reward-model scorer, the end token
of sampled completions, dropout, a scorer that fails on every sample, and the commands in the docstrings and the
README, parsed by each script's own parser."""

import contextlib
import io
import json
import math
import os
import re
import runpy
import signal
import sys
import tempfile
from types import SimpleNamespace
from unittest import mock

import documented
import pytest
import runs
import torch
from paths import ROOT
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

import data_formats
import dpo_humanline
import grpo_humanline
import kto_humanline
import memory_plan
import plumbing

ALGOS = {"dpo": dpo_humanline, "kto": kto_humanline, "grpo": grpo_humanline}
BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
SPECIAL = [BOS, EOS, EOT, "<|start_header_id|>", "<|end_header_id|>", "<unk>"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def chat_tokenizer():
    """One token per character, Llama-3's special tokens, BOS added to plain text, no pad token."""
    vocab = {t: i for i, t in enumerate(SPECIAL + [chr(c) for c in range(32, 127)] + ["\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": [EOT, "<|start_header_id|>", "<|end_header_id|>"]})
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def tiny_config(tokenizer, **kw):
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return runs.llama(vocab=len(tokenizer), hidden=32, max_position_embeddings=512, **special, **kw)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A directory holding the tiny chat model and its tokenizer, as from_pretrained reads a hub model."""
    d = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = chat_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return str(d)


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


QUESTIONS = [(f"What is {a} plus {b}?", f" It is {a + b}.", f" It is {a + b + 1}.") for a in range(4) for b in range(4)]
PREFERENCE_SHAPES = {  # TRL's names for them
    "standard": [{"prompt": q, "chosen": c, "rejected": r} for q, c, r in QUESTIONS],
    "standard-implicit-prompt": [{"chosen": q + c, "rejected": q + r} for q, c, r in QUESTIONS],
    "conversational": [
        {"prompt": [user(q)], "chosen": [assistant(c)], "rejected": [assistant(r)]} for q, c, r in QUESTIONS
    ],
    "conversational-implicit-prompt": [
        {"chosen": [user(q), assistant(c)], "rejected": [user(q), assistant(r)]} for q, c, r in QUESTIONS
    ],
    "text-prompt-repeated-in-conversations": [  # princeton-nlp/llama3-ultrafeedback-armorm
        {"prompt": q, "chosen": [user(q), assistant(c)], "rejected": [user(q), assistant(r)]} for q, c, r in QUESTIONS
    ],
}
UNPAIRED_SHAPES = {
    "unpaired-standard": [{"prompt": q, "completion": x, "label": x == c} for q, c, r in QUESTIONS for x in (c, r)],
    "unpaired-conversational": [
        {"prompt": [user(q)], "completion": [assistant(x)], "label": x == c} for q, c, r in QUESTIONS for x in (c, r)
    ],
    "unpaired-text-prompt-repeated": [
        {"prompt": q, "completion": [user(q), assistant(x)], "label": x == c} for q, c, r in QUESTIONS for x in (c, r)
    ],
}
PROMPT_SHAPES = {
    "prompt-only-standard": [{"prompt": q} for q, _, _ in QUESTIONS],
    "prompt-only-conversational": [{"prompt": [user(q)]} for q, _, _ in QUESTIONS],
    "problem-and-solution": [{"problem": q, "solution": c.strip()} for q, c, _ in QUESTIONS],
}


def args_for(module, **kw):
    return module.Args(**{"max_length": 256, "max_prompt_length": 128} | kw)


@pytest.mark.parametrize("shape", PREFERENCE_SHAPES)
def test_every_preference_shape_encodes_as_its_explicit_form(llama, shape):
    """The implicit and repeated-prompt shapes give exactly the token ids of the explicit shape: one BOS (the
    template's), the prompt, and a completion ending in the template's <|eot_id|> (text: in the end token)."""
    tokenizer = plumbing.load_tokenizer(
        args_for(dpo_humanline, model_name_or_path=llama, dataset="x.jsonl", eval_prompts="none")
    )
    encoded, cut = data_formats.encode_rows(PREFERENCE_SHAPES[shape], tokenizer, args_for(dpo_humanline), "data.jsonl")
    explicit = "conversational" if "conversation" in shape else "standard"
    expected = data_formats.encode_rows(PREFERENCE_SHAPES[explicit], tokenizer, args_for(dpo_humanline), "data.jsonl")[
        0
    ]
    if shape == "standard-implicit-prompt":  # text: the prompt ends at the last space the two completions share
        assert [(p + c, p + r) for p, (c, r), _ in encoded] == [(p + c, p + r) for p, (c, r), _ in expected]
        assert tokenizer.decode(encoded[5][0], skip_special_tokens=True) == QUESTIONS[5][0] + " It is"
    else:
        assert encoded == expected
    assert cut == {"prompts": 0, "completions": 0, "unknown tokens": 0}
    (p, (c, r), labels), q = expected[5], QUESTIONS[5]
    assert labels == [True, False] and p.count(tokenizer.bos_token_id) == 1 and p[0] == tokenizer.bos_token_id
    end = tokenizer.convert_tokens_to_ids(EOT if explicit == "conversational" else EOS)
    assert c[-1] == r[-1] == end and tokenizer.decode(c, skip_special_tokens=True).strip() == q[1].strip()
    if explicit == "conversational":
        assert tokenizer.decode(p).endswith(
            f"user<|end_header_id|>\n\n{q[0]}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        )


def train(script, extra, out):
    """The real script in this process (runpy): two steps; returns the records of metrics.jsonl."""
    handler = signal.getsignal(signal.SIGTERM)
    argv = [
        script,
        "--max_steps",
        "2",
        "--batch_size",
        "4",
        "--micro_batch_size",
        "2",
        "--eval_every",
        "0",
        "--save_every",
        "0",
        "--max_length",
        "256",
        "--max_prompt_length",
        "128",
        *extra,
        "--output_dir",
        str(out),
    ]
    try:
        with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    finally:
        signal.signal(signal.SIGTERM, handler)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def small_rounds(new_tokens):  # online DPO and KTO: rounds of 8 prompts x 4 samples scored by length, all pairs kept
    flags = ["--online", "--round_size", "8", "--num_samples", "4", "--max_new_tokens", str(new_tokens)]
    return flags + ["--reward_threshold", "0", "--reward_model", "tests.support.faulty_rewards:length"]


CASES = (
    [("dpo", s, PREFERENCE_SHAPES[s], []) for s in PREFERENCE_SHAPES]
    + [("kto", s, rows, []) for s, rows in UNPAIRED_SHAPES.items()]
    + [
        ("kto", "conversational-implicit-prompt", PREFERENCE_SHAPES["conversational-implicit-prompt"], []),
        (
            "grpo",
            "text-prompt-repeated-in-conversations",
            PREFERENCE_SHAPES["text-prompt-repeated-in-conversations"],
            [],
        ),
    ]
    + [
        (
            "grpo",
            s,
            rows,
            [
                "--online",
                "--num_generations",
                "4",
                "--max_new_tokens",
                "6",
                "--reward_funcs",
                "tests.support.faulty_rewards:solution_length"
                if "solution" in s
                else "tests.support.faulty_rewards:checksum",
            ]
            + (["--as_chat"] if s == "prompt-only-standard" else []),
        )
        for s, rows in PROMPT_SHAPES.items()
    ]
    + [
        (a, "prompt-only-conversational", PROMPT_SHAPES["prompt-only-conversational"], small_rounds(6))
        for a in ("dpo", "kto")
    ]
)


@pytest.mark.parametrize(
    "algo, shape, rows, extra", CASES, ids=[f"{a}-{s}{'-online' if e else ''}" for a, s, _, e in CASES]
)
def test_each_shape_trains_end_to_end(llama, tmp_path, algo, shape, rows, extra):
    data = write(tmp_path / "data.jsonl", rows)
    records = train(
        f"{algo}_humanline.py",
        ["--model_name_or_path", llama, "--dataset", data, "--eval_prompts", "none", "--humanline", *extra],
        tmp_path / "run",
    )
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(
        math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps
    ), steps
    if extra:
        sampled = next(r for r in records if "online/round" in r and "online/reward" in r)
        assert (
            sampled["online/bad_rewards"] == 0 and sampled["online/truncated_completions"] > 0
        )  # 6 tokens: most are cut


def test_a_toy_named_file_is_a_file(tmp_path, monkeypatch):
    """Only 'toy' and 'toy:<source>' mean the built-in data: toy_mine.jsonl trains on its own two rows."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "toy_mine.jsonl", [{"prompt": "1+1=", "chosen": "1+1+0=02>002", "rejected": "3"}] * 2)
    args = args_for(dpo_humanline, dataset="toy_mine.jsonl", eval_prompts="none", batch_size=2)
    tokenizer = plumbing.load_tokenizer(args)
    rt = SimpleNamespace(rank=0, world=1)
    assert len(data_formats.load_data(args, "preferences", tokenizer, rt)) == 2
    with pytest.raises(SystemExit, match="toy_mine.jsonl: 2 rows, fewer than the 3"):
        data_formats.load_data(args, "preferences", tokenizer, rt, need=3)


def test_only_the_evaluation_prompts_are_cut_to_num_eval_prompts(tmp_path):
    """--num_eval_prompts 8: the evaluation reads the first 8 prompts; an online run samples from every training
    prompt, of the toy's and of a file's."""
    write(tmp_path / "prompts.jsonl", [{"prompt": f"{i}+1="} for i in range(20)])
    rt = SimpleNamespace(rank=0, world=1)
    for dataset, rows in (("toy", 4096), (str(tmp_path / "prompts.jsonl"), 20)):
        args = args_for(grpo_humanline, online=True, dataset=dataset, eval_prompts=dataset, num_eval_prompts=8)
        tokenizer = plumbing.load_tokenizer(args)
        assert len(data_formats.load_data(args, "prompts", tokenizer, rt)) == rows
        assert len(data_formats.load_data(args, "eval", tokenizer, SimpleNamespace(rank=0, world=1))) == 8


def test_a_second_run_in_one_process_evaluates_on_its_own_num_eval_prompts():
    """The toy's rows are encoded once per process, one entry per setting that changes them: a second run in the same
    process with another --num_eval_prompts gets its own count of the test prompts (8, then 4, then 8 again)."""
    rt, got = SimpleNamespace(rank=0, world=1), []
    for n in (8, 4, 8):
        args = args_for(dpo_humanline, num_eval_prompts=n)
        got.append([r["prompt"] for r in data_formats.load_data(args, "eval", plumbing.load_tokenizer(args), rt)])
    assert [len(prompts) for prompts in got] == [8, 4, 8]
    assert got[1] == got[0][:4] and got[2] == got[0]  # the first prompts of the test split, each time


def test_the_toys_rows_are_encoded_once_per_process_and_each_run_gets_its_own_copy():
    args = args_for(dpo_humanline)
    tokenizer, rt = plumbing.load_tokenizer(args), SimpleNamespace(rank=0, world=1)
    first = data_formats.load_data(args, "preferences", tokenizer, rt)
    first[0].completions[0].append(-1)  # a run that changed its rows in place
    again = data_formats.load_data(args, "preferences", tokenizer, rt)
    assert again[0].completions[0][-1] != -1 and again[1:] == first[1:]
    rows = [json.loads(line) for line in open(args.toy.offline["strong"])]
    assert [len(r.completions) for r in again] == [2] * len(rows) == [2] * 4003
    assert any(key[:2] == (args.toy.offline["strong"], "preferences") for key in data_formats.ENCODED)


def test_prompts_longer_than_max_prompt_length_are_counted_when_loaded(llama, tmp_path, capsys):
    rows = PROMPT_SHAPES["prompt-only-conversational"] + [{"prompt": [user("A much longer question? " * 3)]}] * 2
    data = write(tmp_path / "prompts.jsonl", rows)
    args = args_for(
        dpo_humanline, model_name_or_path=llama, dataset=data, eval_prompts="none", online=True, max_prompt_length=60
    )
    tokenizer = plumbing.load_tokenizer(args)
    lengths = [
        len(
            tokenizer(
                tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )["input_ids"]
        )
        for r in rows
    ]
    assert max(lengths[:-2]) <= 60 < min(lengths[-2:])  # the template's BOS counted once
    data_formats.load_data(args, "prompts", tokenizer, SimpleNamespace(rank=0, world=1))
    assert ": {'prompts': 2} (cut to --max_prompt_length" in capsys.readouterr().out


def test_a_chat_template_that_renders_the_prompt_differently_is_an_error_naming_the_row(llama):
    tokenizer = chat_tokenizer()
    tokenizer.chat_template = "{% if not add_generation_prompt %}#{% endif %}" + TEMPLATE
    rows = PREFERENCE_SHAPES["conversational"][:3]
    with pytest.raises(
        SystemExit, match=r"data.jsonl: row 0, column 'chosen': the chat template renders the prompt differently"
    ):
        data_formats.encode_rows(rows, tokenizer, args_for(dpo_humanline), "data.jsonl")


@pytest.mark.parametrize(
    "row, match",
    [
        ({"chosen": "same start", "rejected": "different"}, "row 0: missing column 'prompt'"),
        (
            {"chosen": [user("q"), assistant("a")], "rejected": [user("other"), assistant("b")]},
            "row 0: missing column 'prompt'",
        ),
        ({"prompt": [user("q")], "chosen": "text", "rejected": "text 2"}, "a text completion needs a text prompt"),
    ],
)
def test_rows_whose_prompt_cannot_be_found_name_the_row(row, match):
    with pytest.raises(SystemExit, match=match):
        data_formats.encode_rows([row], chat_tokenizer(), args_for(dpo_humanline), "data.jsonl")


def test_sampled_completions_end_in_the_templates_end_token_or_are_cut(llama):
    """A random model samples nearly uniformly: some completions stop at <|eot_id|> or the end token (kept), the
    rest are cut at --max_new_tokens and have no end token; the cut ones are counted."""
    tokenizer = plumbing.load_tokenizer(
        args_for(dpo_humanline, model_name_or_path=llama, eval_prompts="none", dataset="x.jsonl")
    )
    model = LlamaForCausalLM.from_pretrained(llama)
    with torch.no_grad():
        model.model.norm.weight.zero_()  # every logit 0: uniform sampling
    args = args_for(dpo_humanline, max_new_tokens=12, generation_batch_size=8, temperature=1.0, top_p=1.0)
    prompts = [
        tokenizer.apply_chat_template([user(q)], tokenize=False, add_generation_prompt=True) for q, _, _ in QUESTIONS
    ]
    ids = [data_formats.prompt_ids(tokenizer, t) for t in prompts]
    assert all(p.count(tokenizer.bos_token_id) == 1 for p in ids)
    completions, finished = plumbing.generate(model, tokenizer, ids, 8, args, greedy=False, seed=0)
    ends = {tokenizer.convert_tokens_to_ids(EOT), tokenizer.eos_token_id}
    for c, f in zip(completions, finished):
        assert not ends & set(c[:-1]) and f == (c[-1] in ends) and (f or len(c) == 12)
    stopped_by = {c[-1] for c, f in zip(completions, finished) if f}
    assert stopped_by == ends and 0 < sum(finished) < len(finished)


def test_online_dpo_counts_cut_completions_and_adds_no_end_token(llama, tmp_path):
    data = write(tmp_path / "prompts.jsonl", PROMPT_SHAPES["prompt-only-conversational"])
    records = train(
        "dpo_humanline.py",
        ["--model_name_or_path", llama, "--dataset", data, "--eval_prompts", "none", *small_rounds(3)],
        tmp_path / "run",
    )
    round_record = next(r for r in records if "online/round" in r and "online/pairs" in r)
    assert round_record["online/truncated_completions"] >= 28  # 32 samples of 3 tokens: nearly all cut


def test_the_reward_model_scores_the_template_once_with_one_bos_and_a_pad_token(tmp_path):
    tokenizer = chat_tokenizer()
    torch.manual_seed(1)
    rm = LlamaForSequenceClassification(tiny_config(tokenizer, num_labels=1))
    rm.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    args = args_for(dpo_humanline, reward_model=str(tmp_path))
    score = plumbing.make_scorer(str(tmp_path), args, SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32))
    prompts, completions = [[user("What is 1 plus 1?")], [user("Hi")]], ["It is 2.", "Hello there, how are you today?"]
    got = score(prompts, completions)
    for p, c, g in zip(prompts, completions, got):
        text = tokenizer.apply_chat_template(p + [assistant(c)], tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
        with torch.no_grad():
            direct = rm(input_ids=torch.tensor([ids])).logits[0, 0].item()
        assert g == pytest.approx(direct, rel=1e-5, abs=1e-6)
    assert got[0] != pytest.approx(got[1])


def test_dropout_is_off_by_default_and_reference_free_equals_two_models_either_way(tmp_path):
    """With dropout (here attention dropout 0.5) the k = 1 log-ratio would be mostly noise, so it is off by default;
    the reference's log-probs are computed in eval mode (as a reference model runs), with --keep_dropout too."""
    tokenizer = chat_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config(tokenizer, attention_dropout=0.5)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    data = write(tmp_path / "data.jsonl", PREFERENCE_SHAPES["conversational"])
    losses = {}
    for keep in (False, True):
        for ref_free in ("on", "off"):
            records = train(
                "dpo_humanline.py",
                [
                    "--model_name_or_path",
                    str(tmp_path / "model"),
                    "--dataset",
                    data,
                    "--eval_prompts",
                    "none",
                    "--humanline",
                    "--ref_free",
                    ref_free,
                    "--learning_rate",
                    "1e-3",
                    "--beta",
                    "1",
                ]
                + (["--keep_dropout"] if keep else []),
                tmp_path / f"{ref_free}{keep}",
            )
            losses[ref_free, keep] = [r["loss"] for r in records if "loss" in r]
        assert losses["on", keep] == pytest.approx(losses["off", keep], rel=1e-6)
    assert (
        abs(losses["on", True][0] - losses["on", False][0]) > 1e-4
    )  # the dropout noise: at step 1 the policy is its reference


@pytest.mark.parametrize("where", ["online", "eval"])
def test_a_scorer_failing_on_every_sample_stops_the_run_with_its_own_error(tmp_path, where):
    extra = (
        ["--online", "--round_size", "8", "--max_new_tokens", "8"]
        if where == "online"
        else ["--eval_every", "1", "--num_eval_prompts", "4"]
    )
    with pytest.raises(SystemExit) as stopped:
        train("dpo_humanline.py", extra + ["--reward_model", "tests.support.faulty_rewards:always_raises"], tmp_path)
    message = stopped.value.code
    assert isinstance(message, str) and "\n" not in message
    assert "failed on every sample" in message and "KeyError: 'solution'" in message and "of prompt '" in message


# the paper's per-variant settings (its Table 3): (objective, online, humanline) -> (learning rate, max grad norm)
TABLE_3 = {
    ("dpo", False, False): (5e-6, 1.0),
    ("dpo", False, True): (5e-6, 1.0),
    ("dpo", True, False): (2.5e-6, 0.5),
    ("dpo", True, True): (2.5e-6, 1.0),
    ("kto", False, False): (5e-6, 1.0),
    ("kto", False, True): (5e-6, 4.0),
    ("kto", True, False): (2.5e-6, 0.5),
    ("kto", True, True): (2.5e-6, 0.1),
    ("grpo", False, False): (5e-6, 1.0),
    ("grpo", False, True): (5e-6, 1.0),
    ("grpo", True, False): (5e-6, 1.0),
    ("grpo", True, True): (5e-6, 0.5),
}


def commands():
    """Every documented command that runs one of the scripts (tests/documented.py collects them), but those that
    stop before a run (--help, --plan_only) and those that name the user's own files (my_*, absent here):
    (page:line, algorithm, its flags, the processes torchrun gives it)."""
    return [
        (c.where, c.file.split("_")[0], c.argv, c.nproc)
        for c in documented.commands()
        if c.file in {f"{n}_humanline.py" for n in ALGOS}
        and not any(w.startswith("my_") or w in ("--help", "--plan_only") for w in c.argv)
    ]


def local_config(name, args):
    """The paper's models' config.json files, kept in tests/configs (the hub is not reachable here)."""
    path = os.path.join(ROOT, "tests", "configs", name.replace("/", "--") + ".json")
    return AutoConfig.from_pretrained(path) if os.path.exists(path) else READ_CONFIG(name, args)


READ_CONFIG = memory_plan.read_config


def parsed(algo, argv, world=1, rows=1000, printed=None):
    """The args main() would train with on `world` processes: the script's own parser and checks (the memory plan
    included, from the configs alone), then the run length it derives from `rows` rows of data (each a preference
    pair or a prompt; one pass without --max_steps), stopped before any model loads. What it prints goes to
    `printed`. A bad argument raises the script's own SystemExit."""
    module = ALGOS[algo]

    class Loaded(Exception):
        pass

    def data(args, kind, *_, **__):
        row = {"prompt": "p"} if kind == "prompts" else data_formats.Row("p", ["c", "r"], [True, False])
        return [] if kind == "eval" else [row] * rows

    def stop(args, *_):
        raise Loaded(args)

    with (
        mock.patch.object(sys, "argv", [f"{algo}_humanline.py", *argv]),
        mock.patch.dict(os.environ, {"WORLD_SIZE": str(world)}),
        mock.patch.object(module, "setup", lambda a: SimpleNamespace(rank=0, world=world)),
        mock.patch.object(plumbing, "load_tokenizer", lambda a: None),
        mock.patch.object(data_formats, "load_data", data),
        mock.patch.object(module, "load_model", stop),
        mock.patch.object(memory_plan, "read_config", local_config),
        contextlib.redirect_stdout(printed or io.StringIO()),
        tempfile.TemporaryDirectory() as here,
        contextlib.chdir(here),  # its own folder: the runs a user has in the working tree are not this test's
    ):
        with pytest.raises(Loaded) as got:
            module.main()
    return got.value.args[0]


def test_without_max_steps_a_run_takes_one_pass_over_its_data_and_prints_its_plan():
    printed = io.StringIO()
    args = parsed("dpo", ["--dataset", "me/data"], rows=1000, printed=printed)
    assert args.max_steps == 31 and "run: 31 steps x 32 pairs = 0.99 passes over 1000 pairs" in printed.getvalue()
    assert parsed("kto", ["--dataset", "me/data"]).max_steps == 31  # 2,000 examples at 64
    assert parsed("grpo", ["--dataset", "me/data", "--online"]).max_steps == 125  # 8 prompts a step
    assert parsed("grpo", ["--dataset", "me/data", "--max_steps", "7"]).max_steps == 7
    assert parsed("dpo", [], rows=4003).max_steps == 120  # the toy: the length its committed figures were run at


def test_every_documented_command_starts_on_its_process_count_fits_80gb_and_the_papers_runs_carry_table_3():
    found = commands()
    assert {a for _, a, _, _ in found} == {"dpo", "kto", "grpo"} and len(found) >= 12
    papers, maths, one_gpu = set(), [], set()
    for where, algo, argv, world in found:
        try:
            split = (
                re.fullmatch(r".*\[:(\d+)\]", argv[argv.index("--dataset_split") + 1])
                if "--dataset_split" in argv
                else None
            )
            args = parsed(algo, argv, world, rows=int(split[1]) if split else 7500)
        except SystemExit as e:
            pytest.fail(f"{where}: {algo} on {world} processes: {' '.join(argv)}: {e.code}")
        lora = 10 if args.lora_r else 1  # the one-GPU section: LoRA adapters, at ten times the paper's rate
        if "meta-llama/Meta-Llama-3-8B-Instruct" in argv:  # one of the paper's instruction-following runs
            key = (algo, args.online, args.humanline)
            lr, max_grad_norm = TABLE_3[key]
            assert (args.learning_rate, args.max_grad_norm) == (pytest.approx(lr * lora), max_grad_norm), (
                f"{where}: {' '.join(argv)}"
            )
            # one pass: 10K pairs at 32 (DPO), 20K examples at 64 (KTO, GRPO); online 12,288 prompts, a pair each
            rows = int(re.fullmatch(r"train\[:(\d+)\]", args.dataset_split)[1])
            assert (rows, args.max_steps) == ((12288, 384) if args.online else (10000, 312)), (
                f"{where}: {' '.join(argv)}"
            )
            assert not args.online or args.round_size == 1024, where
            assert not (algo == "grpo" and args.online) or args.pairs_from_samples, f"{where}: Algorithm 1's pairs"
            assert args.lr_scheduler == "constant", f"{where}: the authors hold the rate after warmup"
            (one_gpu if args.lora_r else papers).add(key)
        if "Qwen/Qwen2.5-1.5B-Instruct" in argv:  # the math run: the authors' recipe for [-1.5, 1.5] and k = 16
            assert (
                args.max_steps,
                args.beta,
                args.eps,
                args.kl_baseline,
                args.logps_temperature,
                args.advantage_std,
                args.lr_scheduler,
            ) == (1600, 1e-4, 0.2, "reference", 0.7, "sample", "constant"), where
            assert (args.learning_rate, args.batch_size // world, args.micro_batch_size) == (
                pytest.approx(1e-6 * lora),
                256 // world,
                8,
            )
            assert (args.sample_every, args.sync, args.sync_every, args.clip) == (64, "humanline", 16, "clamp"), where
            assert (args.log_eps_P, args.log_eps_R, args.temperature, args.top_p) == (-1.5, 1.5, 0.7, 1.0), where
            assert (args.adam_eps, args.weight_decay, args.num_generations, args.max_new_tokens) == (1e-8, 0, 8, 2048)
            assert (args.dataset, args.system_prompt) == ("simplescaling/openaimath", "humanline_math"), where
            weights = dict(zip(args.reward_funcs.split(","), map(float, args.reward_weights.split(","))))
            assert weights == {"accuracy": 8, "format": 1, "tag_count": 1}, where
            maths.append(bool(args.lora_r))
        if world > 1:  # a GPU run: it fits an 80 GB GPU by the plan, in bf16
            args.precision = "bf16"
            with mock.patch.object(memory_plan, "read_config", local_config):
                rows = memory_plan.plan(args, algo, world)
            assert memory_plan.peak(rows) <= 80 * 2**30, f"{where}: {' '.join(argv)}\n{memory_plan.table(rows)}"
    assert papers == set(TABLE_3), f"the paper's runs without a command: {sorted(set(TABLE_3) - papers)}"
    assert one_gpu == set(TABLE_3), f"the paper's runs without a one-GPU command: {sorted(set(TABLE_3) - one_gpu)}"
    assert sorted(maths) == [False, True], "the paper's math run needs a command on 8 GPUs and one on one GPU"


def test_a_batch_the_processes_do_not_divide_stops_at_start_up_naming_the_flags():
    with pytest.raises(SystemExit) as stopped:
        parsed("dpo", ["--batch_size", "32", "--micro_batch_size", "32"], world=8)
    assert stopped.value.code == "--batch_size 32 must be a multiple of --micro_batch_size x processes = 32 x 8"


def plan_table(lora=False):
    """docs/paper-runs.md's table of the memory plan per GPU for each of the paper's runs (8 processes, bf16), or with
    `lora` for each of its one-GPU LoRA runs, with the smallest GPU (24, 48 or 80 GB) that holds it."""
    held = "held throughout" if lora else "sharded states"
    lines = [
        f"| run (command above) | {held} | + training | + generation | + scoring | peak per GPU (GiB) |"
        + " GPU |" * lora,
        "|---|---|---|---|---|---|" + "---|" * lora,
    ]
    seen = set()
    for where, algo, argv, world in commands():
        if (world < 8 and not lora) or (lora != ("--lora_r" in argv)) or not where.startswith("docs/paper-runs.md:"):
            continue
        args = parsed(algo, argv, world)
        args.precision = "bf16"
        name = f"{algo.upper()} {'online' if args.online else 'offline'}{' + humanline' if args.humanline else ''}"
        math = "accuracy" in getattr(args, "reward_funcs", "")  # the math run
        name = name.replace("GRPO online", "GRPO math, off-policy") if math else name
        if name in seen:
            continue
        seen.add(name)
        with mock.patch.object(memory_plan, "read_config", local_config):
            rows = memory_plan.plan(args, algo, world)
        phase = {p: sum(v for _, v, q in rows if q == p) / 2**30 for p in ("both", "train", "generate", "score")}
        gpu = next(g for g in (24, 48, 80, float("inf")) if memory_plan.peak(rows) <= g * 2**30)  # (their GiB)
        lines.append(
            f"| {name} | {phase['both']:.1f} | {phase['train']:.1f} | {phase['generate']:.1f} | "
            f"{phase['score']:.1f} | {memory_plan.peak(rows) / 2**30:.1f} |" + f" {gpu} GB |" * lora
        )
    return lines


def test_the_docs_give_the_memory_plan_of_each_of_the_papers_runs():
    with open(os.path.join(ROOT, "docs", "paper-runs.md")) as f:
        readme = f.read().splitlines()
    assert all(line in readme for line in plan_table()), "\n".join(plan_table())
    assert all(line in readme for line in plan_table(lora=True)), "\n".join(plan_table(lora=True))
