"""TRL's dataset formats, read into one shape: --dataset and --eval_prompts from the hub, a local .json, .jsonl,
.parquet or .csv file, or the built-in toy data; each row checked and tokenised, a bad one stopping the run with one
line that names the file, the row and the column (docs/data.md lists the formats).

- preference rows `[prompt,] chosen, rejected`, unpaired rows `[prompt,] completion, label` (KTO), prompt rows
  `prompt` (or `problem`) with any other columns, which go to every scorer;
- plain strings, or conversations (lists of {"role", "content"}) through the tokenizer's chat template; TRL's implicit
  prompt (chosen and rejected hold the whole conversation) and completions that repeat their prompt are split.
The scripts call `load_data`; like plumbing.py, it imports no script.
"""

import copy
import os
from typing import NamedTuple

import math_rewards
import toy_task

SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}  # local data files
ENCODED = {}  # the toy's rows, encoded once per process (a process that runs many short runs reads them once)


class Row(NamedTuple):  # an encoded row of preferences or unpaired examples
    prompt_ids: list
    completions: list  # token ids of each: [chosen, rejected], or [completion]
    labels: list  # [True, False], or [desirable?]


def fail(condition, message):  # one line, no traceback (as plumbing.fail)
    if condition:
        raise SystemExit(message)


def load_data(args, kind, tokenizer, rt, need=1):
    """kind 'preferences' or 'examples' (unpaired rows allowed): encoded rows of --dataset (encode_rows); 'prompts',
    'eval': prompt rows of --dataset or --eval_prompts (at most --num_eval_prompts). Only 'toy' and 'toy:<source>'
    name the built-in data. A bad row stops the run, naming file, row and column; so do fewer than `need` rows."""
    name = args.eval_prompts if kind == "eval" else args.dataset
    if name == "none" and kind == "eval":
        return []
    if not (name == "toy" or name.startswith("toy:")):
        return checked(*read_rows(name, kind, args, tokenizer), name, need, rt)
    name = toy_task.data_file(args.toy, name, kind)
    # the toy's files are digest-checked at start-up: encoded once per process, each run given a copy
    settings = (args.dataset_split, args.max_prompt_length, args.max_length, args.as_chat, args.system_prompt)
    key = (name, kind, tokenizer.name_or_path, *settings, kind == "eval" and args.num_eval_prompts)
    if key not in ENCODED:
        ENCODED[key] = read_rows(name, kind, args, tokenizer)
    rows, cut = ENCODED[key]
    return checked(copy.deepcopy(rows), cut, name, need, rt)


def checked(rows, cut, name, need, rt):  # the rows, unless fewer than `need`; the first process says what was cut
    fail(len(rows) < need, f"{name}: {len(rows)} rows, fewer than the {need} that one batch or round takes")
    if any(cut.values()) and rt.rank == 0:
        print(f"{name}: {cut} (cut to --max_prompt_length, --max_length; unknown: what the tokenizer cannot encode)")
    return rows


def read_rows(name, kind, args, tokenizer):
    """(encoded rows, what was cut) of a hub dataset or a local file (`kind` as load_data's)."""
    import datasets

    datasets.disable_progress_bars()
    split = "test" if kind == "eval" else args.dataset_split
    try:
        if os.path.isfile(name):  # a local file: plain data formats only, nothing is unpickled
            suffix = os.path.splitext(name)[1]
            fail(suffix not in SUFFIXES, f"{name}: a local dataset must be a .json, .jsonl, .parquet or .csv file")
            with open(name, "rb") as f:
                fail(not f.read(4096).strip(), f"{name}: no rows")
            split = "train" if kind == "eval" else split  # a file's one split
            rows = datasets.load_dataset(SUFFIXES[suffix], data_files=name, split=split).to_list()
        else:
            rows = datasets.load_dataset(name, split=split).to_list()
    except Exception as e:  # noqa: BLE001 (malformed file, unknown dataset, no network: one line)
        cause = e.__cause__ or e
        raise SystemExit(f"{name}: {type(cause).__name__}: {(str(cause).strip() or ' ').splitlines()[0]}") from None
    fail(not rows, f"{name}: no rows")
    if kind in ("preferences", "examples"):
        return encode_rows(rows, tokenizer, args, name, unpaired_ok=kind == "examples")
    encoded = [prompt_row(r, f"{name}: row {i}", args) for i, r in enumerate(rows)]
    encoded = encoded[: args.num_eval_prompts if kind == "eval" else None]  # training prompts are never cut
    texts = [as_text(r["prompt"], f"{name}: row {i}, column 'prompt'", tokenizer) for i, r in enumerate(encoded)]
    return encoded, {"prompts": sum(len(prompt_ids(tokenizer, t)) > args.max_prompt_length for t in texts)}


def prompt_row(row, where, args):
    """A prompt row: 'prompt' (or a math dataset's 'problem'), wrapped as a conversation with --as_chat, with the
    row's other columns (e.g. solution), which go to every scorer."""
    prompt = row.get("prompt", row.get("problem"))
    fail(prompt is None, f"{where}: missing column 'prompt' (or 'problem')")
    if args.as_chat and isinstance(prompt, str):
        system = math_rewards.SYSTEM_PROMPTS.get(args.system_prompt, args.system_prompt)
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return {**row, "prompt": prompt}


def split_prompt(prompt, completions, where):
    """TRL's dataset formats in one shape: (prompt, completions). Completions that hold whole conversations (with
    no prompt, a text prompt, or one they repeat) are split after their shared first turns (with one completion:
    all but its last turn); text completions without a prompt after their common prefix, cut back to a space."""
    conversations = all(isinstance(c, list) for c in completions)
    repeated = isinstance(prompt, list) and all(c[: len(prompt)] == prompt for c in completions)
    if conversations and (repeated or not isinstance(prompt, list)):
        shared = (j for j, turns in enumerate(zip(*completions)) if turns.count(turns[0]) < len(turns))
        n = len(completions[0]) - 1 if len(completions) == 1 else next(shared, min(map(len, completions)))
    elif prompt is None and all(isinstance(c, str) for c in completions) and len(completions) > 1:
        n = os.path.commonprefix(completions).rfind(" ")  # the space starts the completion, as a tokenizer splits words
    else:
        return prompt, completions
    fail(n <= 0, f"{where}: missing column 'prompt' (and the completions do not begin with a shared prompt)")
    return completions[0][:n], [c[n:] for c in completions]


def as_text(value, where, tokenizer, prompt=None):
    """A prompt (prompt=None) or a completion of `prompt` as text: strings as they are, a completion with the end
    token; lists of {"role", "content"} through the chat template, a completion cut out of the whole conversation."""
    fail(value is None, f"{where}: missing")
    if isinstance(value, str):
        fail(not value.strip(), f"{where}: empty text")
        fail(isinstance(prompt, list), f"{where}: a text completion needs a text prompt")
        return value if prompt is None else value + tokenizer.eos_token
    messages = f"{where}: expected a string or a non-empty list of messages, got {type(value).__name__}"
    fail(not isinstance(value, list) or not value, messages)
    for m in value:
        role = f"{where}: each message needs a role (system, user, assistant or tool), got {m!r}"
        fail(not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"), role)
        content = m.get("content")
        fail(not isinstance(content, str), f"{where}: message content must be a string, got {content!r}")
    chat = f"{where}: a conversational completion needs a conversational prompt"
    fail(prompt is not None and not isinstance(prompt, list), chat)
    prefix = tokenizer.apply_chat_template(prompt or value, tokenize=False, add_generation_prompt=True)
    if prompt is None:
        return prefix
    full = tokenizer.apply_chat_template(prompt + value, tokenize=False)
    differs = f"{where}: the chat template renders the prompt differently inside the whole conversation"
    fail(not full.startswith(prefix), differs + ", so the completion cannot be cut out of it")
    return full[len(prefix) :]


def prompt_ids(tokenizer, prompt_text):
    """A prompt's token ids, the same in training and generation: special tokens (BOS) unless the template has."""
    bos = tokenizer.bos_token and prompt_text.startswith(tokenizer.bos_token)
    return tokenizer(prompt_text, add_special_tokens=not bos)["input_ids"]


def encode_rows(rows, tokenizer, args, source, unpaired_ok=False):
    """Checked, tokenised rows: Row(prompt_ids, completions, labels). A preference row ([prompt,] chosen, rejected)
    gives [chosen, rejected] labelled [True, False]; an unpaired row ([prompt,] completion, label; if unpaired_ok)
    [completion], [label]. The prompt keeps its last --max_prompt_length tokens, a completion its first
    --max_length - prompt: returns (rows, {what: how many were cut, and how many unknown tokens})."""
    out, cut = [], {"prompts": 0, "completions": 0, "unknown tokens": 0}
    need = "(rows need [prompt,] chosen, rejected" + (" or [prompt,] completion, label)" if unpaired_ok else ")")
    for i, row in enumerate(rows):
        where = f"{source}: row {i}"
        unpaired = unpaired_ok and (row.get("completion") is not None or row.get("label") is not None)
        columns = ("completion", "label") if unpaired else ("chosen", "rejected")
        for column in columns:
            fail(row.get(column) is None, f"{source}: row {i}: missing column '{column}' {need}")
        label = f"{source}: row {i}, column 'label': expected a boolean (is the completion desirable?)"
        fail(unpaired and not isinstance(row["label"], bool), f"{label}, got {row.get('label')!r}")
        completions = [row[c] for c in columns[: 2 - unpaired]]
        prompt, completions = split_prompt(row.get("prompt"), completions, where)
        p = prompt_ids(tokenizer, as_text(prompt, f"{where}, column 'prompt'", tokenizer))
        texts = [as_text(c, f"{where}, column '{k}'", tokenizer, prompt) for c, k in zip(completions, columns)]
        limit = min(args.max_prompt_length, args.max_length - 1)  # room for one completion token
        cut["prompts"] += len(p) > limit
        p = p[-limit:]
        completions = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        same = f"{source}: row {i}, columns 'chosen'/'rejected': identical completions"
        fail(not unpaired and completions[0] == completions[-1], same + " once tokenised" * (texts[0] != texts[-1]))
        cut["unknown tokens"] += sum(ids.count(tokenizer.unk_token_id) for ids in [p, *completions])
        cut["completions"] += sum(len(p) + len(c) > args.max_length for c in completions)
        labels = [row["label"]] if unpaired else [True, False]
        out.append(Row(p, [c[: args.max_length - len(p)] for c in completions], labels))
    return out, cut
