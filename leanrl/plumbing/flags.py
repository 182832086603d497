"""A run's command line: its flags parsed and checked before any work, a mistake refused in one line.

- `parse_args`, `fail`: a user mistake ends the run with one line on stderr and exit code 2, never a traceback.
- `keep_streams` (from `parse_args`): a closed or broken stdout or stderr never ends a run (`Unbroken`).
- `positive`, `positive_finite`, `non_negative_finite`, `unit_interval`, `probability`, `require`: range rules;
  `one_per_member`: a seeds script's per-member flags.
- `check_minibatches`: the PPO scripts' minibatch count divides the batch and leaves no one-row minibatch.
- `pick_device`: the learner's device; `--cudagraphs` without CUDA is dropped with one line.
"""

import contextlib
import io
import math
import os
import sys
import time
from typing import NoReturn

import torch
import tyro


def fail(message: str) -> NoReturn:
    """A user mistake: one line on stderr, exit code 2, no traceback. Under torchrun every rank checks the same flags
    and only rank 0 says what is wrong; the others wait for torchrun to stop them once rank 0 has exited (an early exit
    of theirs would have torchrun kill rank 0 before its line), and exit 2 silently if it does not within a minute."""
    if os.environ.get("RANK", "0") != "0":
        time.sleep(60)
        sys.exit(2)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def script_name(file: str) -> str:
    """The script's name as logs and checkpoints carry it: `ppo_torchcompile` for leanrl/ppo_torchcompile.py."""
    return os.path.splitext(os.path.basename(file))[0]


class Unbroken:
    """sys.stdout or sys.stderr for a run that must outlive them: a closed terminal, or a reader gone (`| head -1`),
    makes writes fail (EIO, EPIPE), which would end the run from inside the progress bar. The first failed write sends
    the stream's fd to /dev/null; the run goes on and keeps its files."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            self.to_null()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except OSError:
            self.to_null()

    def to_null(self):
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError):  # a stream with no fd of its own: replaced
            self.stream = open(os.devnull, "w")
            return
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
        with contextlib.suppress(OSError):  # what the stream held back goes there too, not to a failed exit flush
            self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def keep_streams():
    """stdout and stderr made `Unbroken`. One closed when the process started (`2>&-`) is None in sys: it becomes
    /dev/null, and its fd, if still free, is taken by /dev/null, so that no file opened later gets it and the
    messages written to it."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if isinstance(stream, Unbroken):
            continue
        if stream is None:
            try:
                os.fstat(fd)
            except OSError:
                null = os.open(os.devnull, os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            stream = open(os.devnull, "w")
        setattr(sys, name, Unbroken(stream))


def parse_args(cls):
    """tyro's parse of `cls`, its multi-line error box folded into the one line a user mistake gets. First, so that
    every message of the run has them, the streams are made `Unbroken`."""
    keep_streams()
    try:
        with contextlib.redirect_stderr(err := io.StringIO()):
            return tyro.cli(cls)
    except SystemExit as e:
        if e.code:
            lines = [line.strip(" │╭╮╰╯─") for line in err.getvalue().splitlines()]
            fail(" ".join(line for line in lines[1:] if line and not line.startswith("For full helptext")))
        print(err.getvalue(), end="")  # --help
        raise


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require(args, ok, what: str, *names: str):
    """Each field in `names` (each value of a tuple or list field) must pass `ok`, else the run ends with "--name must
    be <what>, got <value>"."""
    for name in names:
        value = getattr(args, name)
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if v is not None and not ok(v):
                fail(f"{flag(name)} must be {what}, got {v}")


def one_per_member(args, *names: str):
    """The seeds scripts' per-member flags: empty (the single flag's value for every member) or one value per member."""
    for name in names:
        values = getattr(args, name)
        if values and len(values) != args.num_seeds:
            fail(f"{flag(name)} takes one value per member: {len(values)} given for --num-seeds {args.num_seeds}")


def positive(args, *names: str):
    require(args, lambda v: v > 0, "positive", *names)


def positive_finite(args, *names: str):
    require(args, lambda v: 0 < v < math.inf, "positive and finite", *names)


def non_negative_finite(args, *names: str):
    require(args, lambda v: 0 <= v < math.inf, "non-negative and finite", *names)


def unit_interval(args, *names: str):
    require(args, lambda v: 0 < v <= 1, "in (0, 1]", *names)


def probability(args, *names: str):
    require(args, lambda v: 0 <= v <= 1, "in [0, 1]", *names)


def check_minibatches(args, batch_size: int):
    """The PPO scripts' `--num-minibatches`: it divides the batch, and under `--norm-adv` leaves two rows or more in a
    minibatch (the advantages' std of one row is NaN: every loss and weight would be)."""
    if batch_size % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} "
            f"(num_envs x num_steps); pick a divisor of {batch_size}"
        )
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        fail(
            f"--num-minibatches {args.num_minibatches} makes minibatches of one row (the batch is {batch_size}): "
            "--norm-adv's advantage std of one row is NaN; pick fewer minibatches or pass --no-norm-adv"
        )


def pick_device(args) -> torch.device:
    """CUDA if there is one and `--cuda` (the default); `--cudagraphs` without CUDA is dropped with one line."""
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False
    return device
