"""Launch the training scripts from a process that has already imported torch and transformers.

A script launched with `python` spends about 5 s importing torch, transformers and FSDP before it computes anything
(`torchrun` adds its own import and two at once), and the suite launches the scripts about a hundred times.
`run(cmd, ...)` takes such a command and forks the script from one warm server instead: the child is a new process
(its own globals, signal handlers, exit code, stdout and stderr; at its end what the interpreter's exit does that a
script can see, without the second it takes to tear the libraries down); only the third-party imports are already
done. `torchrun --standalone --nproc_per_node N script ...` becomes N children with the
variables torchrun gives its workers; when one fails the others are stopped, as torchrun does.

It answers like `subprocess.run(cmd, capture_output=True, text=True)`. Commands it cannot take exactly go to
`subprocess.run`: other programs and other torchrun options. A server is started for each environment of the
variables a library reads at import (thread counts, CPU code path, the hub's settings). Tests of signals and of
torchrun itself launch for real. A server also encodes the toy's training rows once (encode_the_toy), so the project
modules that takes are imported in its children too: a test of what a file imports on its own runs it cold
(test_docs.py does).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# read when a library is imported: commands that differ in one of these go to different servers
IMPORT_TIME = ("OMP_", "MKL_", "ATEN_", "HF_", "TRANSFORMERS_", "TORCH_", "CUDA", "PYTHON", "LD_", "MALLOC_")


def script_and_workers(cmd):
    """(script argv, number of processes) for a command the server can take, else None."""
    if not cmd or cmd[0] != sys.executable:
        return None
    rest = list(cmd[1:])
    nproc = 1
    if rest[:2] == ["-m", "torch.distributed.run"]:
        rest = rest[2:]
        if rest[:1] == ["--standalone"]:
            rest = rest[1:]
        if rest[:1] != ["--nproc_per_node"]:
            return None
        nproc, rest = int(rest[1]), rest[2:]
    if not rest or not rest[0].endswith(".py") or rest[0].startswith("-"):
        return None
    return rest, nproc


class Servers:
    """Warm servers, one per environment of import-time variables, and one more whenever all of those are busy."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle = {}  # environment -> servers not running a command

    def take(self, env):
        key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME)))
        with self.lock:
            idle = [p for p in self.idle.get(key, []) if p.poll() is None]
            proc = idle.pop() if idle else None
            self.idle[key] = idle
        if proc is None:
            serve = [sys.executable, os.path.abspath(__file__), "--serve"]
            proc = subprocess.Popen(serve, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        return key, proc

    def give_back(self, key, proc):
        with self.lock:
            self.idle[key].append(proc)

    def launch(self, argv, nproc, cwd, env, stdout, stderr, timeout=None):
        """Run `python argv...` (on nproc processes) from a warm server, its output appended to the files stdout and
        stderr (they may be one file): {"returncode", "timed_out", "cpu_seconds" (user + system, its workers')}."""
        env = dict(os.environ if env is None else env)
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it for several workers
        key, proc = self.take(env)
        request = {"argv": argv, "nproc": nproc, "cwd": os.path.abspath(cwd or os.getcwd()), "env": env}
        proc.stdin.write(json.dumps(request | {"stdout": stdout, "stderr": stderr, "timeout": timeout}) + "\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline() or '{"returncode": null}')
        if reply["returncode"] is None:
            raise RuntimeError("the warm launch server died")
        self.give_back(key, proc)
        return reply

    def run(self, cmd, cwd=None, env=None, timeout=None):
        parsed = script_and_workers([str(c) for c in cmd])
        if parsed is None:
            return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            reply = self.launch(*parsed, cwd=cwd, env=env, stdout=out, stderr=err, timeout=timeout)
            out, err = open(out).read(), open(err).read()
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(cmd, timeout, out, err)
        return subprocess.CompletedProcess(cmd, reply["returncode"], out, err)


SERVERS = Servers()


def run(cmd, cwd=None, env=None, timeout=None, capture_output=True, text=True):
    """`subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, capture_output=True, text=True)`, the script forked
    from a warm server."""
    assert capture_output and text, "the warm server captures stdout and stderr as text"
    return SERVERS.run(cmd, cwd=cwd, env=env, timeout=timeout)


# ---- the server (its own process) -------------------------------------------------------------------------------


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fork_worker(request, extra_env):
    """Fork one worker; in the child, return the script's argv (the caller runs it), in the server its pid."""
    pid = os.fork()
    if pid:
        return pid
    os.setpgid(0, 0)  # its own group: the server stops a worker's children with it
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"], **extra_env)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    for target, name in ((1, "stdout"), (2, "stderr")):
        fd = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, target)
    return None


def encode_the_toy():
    """The toy's training rows as the scripts read them by default (pairs, KTO's examples, prompts), encoded once here
    (data_formats keeps them per process): each child inherits them instead of spending a second on them."""
    from types import SimpleNamespace

    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    import data_formats
    import dpo_humanline
    import plumbing

    args = dpo_humanline.Args()
    tokenizer = plumbing.load_tokenizer(args)
    for kind in ("preferences", "examples", "prompts"):
        data_formats.load_data(args, kind, tokenizer, SimpleNamespace(rank=0))
    sys.path.pop(0)


def serve():
    import gc
    import runpy

    import datasets  # noqa: F401
    import numpy  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import tqdm  # noqa: F401
    import transformers
    from transformers.models.llama import modeling_llama  # noqa: F401

    transformers.AutoModelForCausalLM  # noqa: B018  (resolves the lazy module)
    encode_the_toy()
    gc.freeze()  # what is imported stays out of the children's collections (and out of exit_now's file search)
    for line in sys.stdin:
        request = json.loads(line)
        nproc = request["nproc"]
        port = str(free_port())
        pids = {}
        for rank in range(nproc):
            extra = {}
            if nproc > 1:  # what torchrun --standalone gives each worker
                extra = {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "GROUP_RANK": "0",
                    "ROLE_RANK": str(rank),
                    "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc),
                    "ROLE_WORLD_SIZE": str(nproc),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0",
                    "TORCHELASTIC_RUN_ID": "warm",
                }
            pid = fork_worker(request, extra)
            if pid is None:  # the child: run the script as `python script.py ...` would, then exit as it would
                sys.argv = request["argv"]
                sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
                try:
                    runpy.run_path(sys.argv[0], run_name="__main__")
                    code = 0
                except SystemExit as e:
                    code = interpreter_exit_code(e)
                except BaseException:  # noqa: BLE001  (as the interpreter: the traceback, exit code 1)
                    traceback.print_exc()
                    code = 1
                exit_now(code)
            pids[pid] = rank
        codes, timed_out, kill_at, cpu = {}, False, None, 0.0
        deadline = time.time() + request["timeout"] if request["timeout"] else None
        while len(codes) < nproc:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid:
                codes[pid] = os.waitstatus_to_exitcode(status)
                cpu += usage.ru_utime + usage.ru_stime
            running = set(pids) - set(codes)
            if deadline and time.time() > deadline and not timed_out:
                timed_out = True
            if running and kill_at is None and (timed_out or any(codes.values())):
                signal_all(running, signal.SIGTERM)  # as torchrun: one worker failed, stop the others
                kill_at = time.time() + 5
            if running and kill_at and time.time() > kill_at:
                signal_all(running, signal.SIGKILL)
            if not pid:
                time.sleep(0.01)
        failed = [c for c in codes.values() if c != 0]
        returncode = 0 if not failed else (failed[0] if nproc == 1 else 1)
        print(json.dumps({"returncode": returncode, "timed_out": timed_out, "cpu_seconds": cpu}), flush=True)


def interpreter_exit_code(e):
    """The exit code of an uncaught SystemExit, its message printed as the interpreter prints it."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def exit_now(code):
    """What the interpreter's exit does that a script can see (non-daemon threads joined, atexit handlers run, every
    open file flushed), without tearing down every module: with torch loaded that takes about 1 s per process, most
    of it copying the pages a fork shares with the server."""
    import atexit
    import gc
    import io
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for f in gc.get_objects():
        if issubclass(type(f), io.IOBase) and not f.closed:
            try:
                f.flush()
            except (OSError, ValueError):
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.killpg(pid, sig)  # the worker and anything it started
        except ProcessLookupError:
            pass


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
