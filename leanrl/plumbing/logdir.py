"""The log dir and what goes into it.

- `check_log_dir`, `claim`, `new_folder`: a run writes into a folder of its own, held (flock) for its life; a folder
  holding another run is refused unless `--resume` continues it.
- `check_track`: `--track`'s wandb is installed, logged in and reachable (else offline, said in one line).
- `check_compile_cache`: `--compile`'s TORCHINDUCTOR_CACHE_DIR can be written.
- `write_atomically`: a file is replaced whole or not at all (a full disk leaves no partial file; `UNWRITTEN` records
  it, and the run exits 1); `keep_rows_until`: a resumed run's metrics.jsonl without the rows past its checkpoint.
- `non_finite`: a row's numbers that are not finite (`Run` stops a diverged run on them); `strict_json` writes them
  as null.
- `git_commit`, `machine_info`, `cores`: what summary.json records of the code and the machine.
"""

import contextlib
import fcntl
import importlib.util
import io
import itertools
import json
import math
import netrc
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Optional

import numpy as np
import torch

from .flags import fail

# the files that make a folder a run's: a run never writes into a folder holding another run's
RUN_FILES = ("metrics.jsonl", "summary.json", "agent.pt")


def check_compile_cache():
    """TORCHINDUCTOR_CACHE_DIR, where set, is a folder Inductor can create and write into: else --compile dies at its
    first compile, with a traceback, after the run has started."""
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not path:
        return
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        fail(
            f"TORCHINDUCTOR_CACHE_DIR={path}: Inductor cannot keep its compiled code there ({e.strerror or e}); point "
            "it at a folder or unset it"
        )


def default_log_dir(args, script: str) -> str:
    return f"runs/{args.env_id.replace('/', '-')}__{script}__{args.seed}__{int(time.time())}"


def new_folder(path: str) -> str:
    """`path`, or `path-2`, `path-3`, ...: the first that this call creates. Default names have a one-second
    resolution; two runs started in the same second get a folder each (mkdir either creates or fails: no race)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    for n in itertools.count(1):
        name = path if n == 1 else f"{path}-{n}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(name)
            return name


# the log dirs this process holds: their open fd, locked until the process exits
CLAIMED = {}


def claim(log_dir: str):
    """The run's hold on its log dir: an exclusive flock on the folder itself (no file left behind), held until the
    process exits, however it exits (the kernel drops it). Of two runs started into one folder at once, which both
    found it free of run files, the second is refused."""
    key = os.path.realpath(log_dir)
    if key in CLAIMED:  # this process's own run: a check made twice
        return
    fd = os.open(log_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        fail(f"--log-dir {log_dir} is being written by another run that is still going; pick a new folder")
    CLAIMED[key] = fd


def check_log_dir(args):
    """A `--log-dir` that holds another run's files is refused (the runs' rows, checkpoints and summaries would mix),
    unless `--resume` continues the run that is there."""
    # an empty metrics.jsonl (left by an older run stopped before its first row) holds no run
    held = [name for name in RUN_FILES if os.path.exists(os.path.join(args.log_dir, name))]
    held = [name for name in held if name != "metrics.jsonl" or os.path.getsize(os.path.join(args.log_dir, name))]
    if not held:
        return
    resume = getattr(args, "resume", None)  # a measuring tool (bench_env.py) has none
    if resume and os.path.samefile(os.path.dirname(os.path.abspath(resume)), args.log_dir):
        return
    go_on = f", or continue it with --resume {os.path.join(args.log_dir, 'agent.pt')}" if "agent.pt" in held else ""
    fail(f"--log-dir {args.log_dir} holds another run ({', '.join(held)}); pick a new folder{go_on}")


# seconds --track waits for wandb's server to answer before it logs offline (wandb.init itself would wait 90 s, then
# fail after the envs are built)
WANDB_PROBE_S = 10.0


def check_track(args) -> Optional[str]:
    """`--track`: wandb installed and, unless WANDB_MODE is offline or disabled, logged in (WANDB_API_KEY, or a key
    in the netrc file that `wandb login` writes) and its server reachable within WANDB_PROBE_S; a server that does not
    answer switches wandb to offline mode. Returns the line that says so, if it did."""
    if importlib.util.find_spec("wandb") is None:
        fail("--track needs wandb: pip install wandb")
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return None
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    if not wandb_login(host):
        fail(
            "--track needs a wandb login: run `wandb login` or set WANDB_API_KEY (or set WANDB_MODE=offline to log "
            "into the log dir and `wandb sync` it later)"
        )
    if reachable(host, WANDB_PROBE_S):
        return None
    os.environ["WANDB_MODE"] = "offline"
    return (
        f"warning: --track: {urllib.parse.urlsplit(host).hostname} did not answer within {WANDB_PROBE_S:.0f} s: wandb "
        "logs offline into the log dir's wandb/ folder; upload it later with `wandb sync`"
    )


def wandb_login(host: str) -> bool:
    """Whether wandb has a key for `host` where it looks first: the environment, then the netrc file."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        entry = netrc.netrc(path).authenticators(urllib.parse.urlsplit(host).netloc)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def reachable(url: str, timeout: float) -> bool:
    """Whether a TCP connection to `url`'s host opens within `timeout` seconds. It runs in a thread that is given up at
    the deadline: a name lookup takes no timeout and can hang on its own."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    opened = []

    def connect():
        with contextlib.suppress(OSError):
            socket.create_connection((parts.hostname, port), timeout=timeout).close()
            opened.append(True)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(opened)


# the files a run could not write (a full disk): its exit code is 1 (Run.finish)
UNWRITTEN = []


class WriteErrors(io.RawIOBase):
    """A file for torch.save that keeps the OSError of a failed write: torch's writer turns it into a RuntimeError
    that does not say why (a full disk)."""

    def __init__(self, f):
        super().__init__()
        self.f = f
        self.error = None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise


def write_atomically(path: str, data) -> bool:
    """`data` (bytes, or a function that writes into a file) written to `path` through `path.tmp` and a rename: a
    reader sees the file before or the new one, never part of one (a 0-byte summary.json read as a finished run). A
    failed write (a full disk) removes the temporary file, says so in one line and returns False; the file before it is
    kept."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            out = WriteErrors(f)
            try:
                if callable(data):
                    data(out)
                else:
                    f.write(data)
            except RuntimeError:
                if out.error is None:
                    raise
                raise out.error from None
            f.flush()
            os.fsync(f.fileno())  # a full disk may only show here, and a rename of unwritten data is no safer
        os.replace(tmp, path)
        return True
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        kept = "the one before it is kept" if os.path.exists(path) else "there is none"
        print(f"error: could not write {path} ({e.strerror or e}); {kept}", file=sys.stderr)
        UNWRITTEN.append(path)
        return False


def git_commit() -> Optional[str]:
    """The commit of the code that runs (git's short hash, "-dirty" if a tracked file differs from it), or None where
    git or the repository is not at hand (a script copied out): summary.json records it, so that a report never mixes
    commits unawares."""
    git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode or status.returncode:
        return None
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def cores() -> int:
    """The cores this process may run on: the affinity mask where the OS has one (taskset, a container's cpuset), which
    os.cpu_count() ignores: a thread per machine core on fewer cores than that stalls the matrix products."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_model() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return cpu


def machine_info(device: torch.device) -> dict:
    cpu = cpu_model()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    n = os.cpu_count() or 1
    usable = "" if cores() == n else f", this process on {cores()}"  # pinned (taskset, a cpuset)
    return dict(device=str(device), torch=torch.__version__, cpu=f"{cpu} ({n} cores{usable})", gpu=gpu)


def keep_rows_until(path: str, step: int):
    """metrics.jsonl of a run resumed from a checkpoint at `step`, rewritten without the rows past it, which a run that
    went on after the checkpoint and was then stopped uncleanly (SIGKILL, a second Ctrl-C) logged, nor a line such a
    stop cut short: the resumed run logs those steps again, and global_step never goes back."""
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    kept = []
    past = 0
    for line in lines:
        try:
            row_step = json.loads(line)["global_step"] if line.endswith("\n") else None
        except (ValueError, KeyError, TypeError):
            row_step = None
        if row_step is not None and row_step > step:
            past += 1
        elif row_step is not None:
            kept.append(line)
    if len(kept) == len(lines) or not write_atomically(path, "".join(kept).encode()):
        return
    cut = len(lines) - len(kept) - past
    print(
        f"{path}: dropped {past} rows logged past the checkpoint's step {step:,}"
        + (f" and {cut} lines cut short" if cut else ""),
        file=sys.stderr,
    )


def non_finite(row: dict, prefix: str = "") -> dict:
    """{name: value} of the row's numbers that are not finite, the members' rows of the seeds scripts included."""
    found = {}
    for key, value in row.items():
        if isinstance(value, (float, np.floating)) and not math.isfinite(value):
            found[prefix + key] = value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    found.update(non_finite(item, f"{prefix}{key}[{i}]."))
    return found


def strict_json(value):
    """`value` with null for every number that is not finite: json.dumps writes a bare NaN, which is no JSON (a strict
    reader, jq or a browser, refuses the whole file)."""
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [strict_json(item) for item in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    return value
