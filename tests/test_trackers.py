"""--report_to: a run watched in TensorBoard and W&B holds the same values as its metrics.jsonl.

Each tracker is read back through its own files: TensorBoard's event files with TensorBoard's reader, W&B's
offline run file (a log of protobuf records, read here without the network) with W&B's own record schema."""

import glob
import json
import struct
import subprocess
import sys

import pytest
import runs

FLAGS = ["--max_steps", "3", "--batch_size", "8", "--num_eval_prompts", "8", "--eval_every", "2", "--save_every", "0"]


def run(script, flags, out):  # in this process: for the runs that stop before their first step
    return runs.run_here(script, [*FLAGS, *flags], out)[0]


def wandb_records(path):
    """The records of a .wandb file: a 7-byte header, then 32 KiB blocks of chunks (CRC32, length, type: 1 whole,
    2 first, 3 middle, 4 last), each record a serialized wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2

    data, pos, part, out = open(path, "rb").read(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


@pytest.mark.parametrize(
    "script, flags",
    [("dpo_humanline.py", ["--humanline"]), ("grpo_humanline.py", ["--online", "--num_generations", "4"])],
)
def test_tensorboard_and_wandb_hold_every_value_of_metrics_jsonl(script, flags, tmp_path, toy):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # as a user runs it, a process of its own: at its end W&B's service has written the whole .wandb file
    env = runs.ENV | {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "humanline-test"}
    cmd = runs.command(script, [*FLAGS, *flags, "--report_to", "tensorboard,wandb"], tmp_path)
    proc = subprocess.run(cmd, cwd=runs.ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = runs.records(tmp_path)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3] and records[0]["step"] == 0  # the step-0 evaluation
    expected = {
        (r["step"], k): v for r in records for k, v in r.items() if k != "step"
    }  # a round's line: its first step
    assert "eval/reward" in records[0] and any("eval/reward" in r and r["step"] == 2 for r in records)

    board = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    board.Reload()
    seen = {(e.step, k): e.value for k in board.Tags()["scalars"] for e in board.Scalars(k)}
    assert seen.keys() == expected.keys()
    assert all(seen[key] == pytest.approx(v, rel=1e-6, abs=1e-12) for key, v in expected.items())  # float32 in events

    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    written = wandb_records(path)
    assert written[-1].WhichOneof("record_type") == "exit"  # W&B's last record: the file is whole
    rows, config = {}, {}
    for record in written:
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            rows[items.pop("_step")] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif record.WhichOneof("record_type") == "run":
            config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
            assert record.run.project == "humanline-test"
    assert {(s, k): v for s, row in rows.items() for k, v in row.items()} == expected  # exactly: JSON both ways
    args = json.load(open(tmp_path / "args.json"))
    ours = {k: v for k, v in args.items() if k not in ("provenance", "attempts")}  # the arguments, not what ran them
    assert {k: config[k] for k in ours} == ours


def test_a_tracker_that_is_not_installed_or_unknown_stops_with_one_line(tmp_path, toy, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # (patch.dict would also unload what the run imports)
    with pytest.raises(SystemExit) as stopped:
        run("dpo_humanline.py", ["--report_to", "wandb", "--eval_prompts", "none"], tmp_path / "a")
    assert stopped.value.code == "--report_to wandb: the package is not installed (pip install wandb)"
    monkeypatch.delitem(sys.modules, "wandb")
    with pytest.raises(SystemExit) as stopped:
        run("kto_humanline.py", ["--report_to", "mlflow"], tmp_path / "b")
    assert stopped.value.code == "--report_to mlflow: none, tensorboard, wandb or tensorboard,wandb"


def test_eval_every_0_evaluates_the_starting_policy_and_the_last(tmp_path, toy):
    records = run("kto_humanline.py", ["--eval_every", "0"], tmp_path)
    assert [r["step"] for r in records if "eval/reward" in r] == [0, 3] and [r["step"] for r in records] == [0, 1, 2, 3]
