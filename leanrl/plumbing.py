"""The run plumbing every training script imports; no part of any algorithm or speed trick lives here.

- `parse_args`, `fail`: a user mistake ends the run with one line on stderr and exit code 2, never a traceback.
- `keep_streams` (from `parse_args`): a closed or broken stdout or stderr never ends a run.
- `positive`, `positive_finite`, `non_negative_finite`, `unit_interval`, `probability`, `require`: range rules.
- `check_env_id`: an env id of the wrong family names the script that takes it.
- `check_minibatches`: the PPO scripts' minibatch count divides the batch and leaves no one-row minibatch.
- `check_memory`: a run whose stores (rollout, replay buffer, env pools) will not fit in memory is refused.
- `check_run`: the flags every script shares (seed, threads, burn-in, video, `--resume`, `--compile`'s cache folder,
  `--track`, `--log-dir`), checked last; the log dir claimed (`claim`) for the run's life.
- `pick_device`: the learner's device; `--cudagraphs` without CUDA is dropped with one line.
- `envpool_seed`: a derived env seed within envpool's int32.
- `Run.save` and `resume`: a run's parts (modules, optimizers, generators, envs, episodes, buffers, tensors) into its
  checkpoint and back, one call each (`state_of`); `save_checkpoint` and `write_atomically` (a full disk leaves no
  partial file), `load_checkpoint` (`weights_only`, refuses another script's file), `restore_rngs` (a checkpoint
  written on another device re-seeds the loop's generators).
- `Episodes`: the returns of finished episodes, from the raw rewards.
- `Run`: metrics.jsonl, summary.json, wandb (`--track`), the progress bar, steady-state fps, Ctrl-C and SIGTERM, a
  diverged run (non-finite losses) stopped before it saves; in a seeds run a diverged member is reported, the others
  train on, and its checkpoint keeps the member's last finite state (`finite_members`; `check_diverged` on resume).

A script copied out of leanrl needs none of this: its algorithm and its tricks are all in the script.
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
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import asdict
from typing import NoReturn, Optional

import numpy as np
import torch
import tqdm
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


# where each family's envs come from, and which script takes them, per algorithm
FAMILIES = {
    "classic": dict(name="a discrete-action classic-control or Box2D task", ppo="ppo.py", dqn="dqn.py"),
    "atari": dict(name="an Atari game", ppo="ppo_atari_envpool.py", dqn="dqn_atari_envpool.py"),
    "mujoco": dict(
        name="a continuous-action task",
        ppo="ppo_continuous_action.py",
        sac="sac_continuous_action.py",
        td3="td3_continuous_action.py",
    ),
}
TAKES = {
    "classic": "discrete-action classic-control and Box2D tasks such as CartPole-v1 or LunarLander-v3",
    "atari": "Atari games such as Breakout-v5 or Pong-v5",
    "mujoco": "continuous-action tasks such as HalfCheetah-v4, Hopper-v4 or Pendulum-v1",
}
# envpool's families of flat-observation tasks with gymnasium's interface: a Box action space makes one a task of the
# continuous scripts (MuJoCo's, Pendulum-v1, LunarLanderContinuous-v3), a Discrete one of the classic scripts, which
# build gymnasium's own (CartPole-v1, LunarLander-v3)
FLAT = ("envpool.mujoco.gym", "envpool.classic_control", "envpool.box2d")
GYM_TASKS = ("classic_control", "box2d")


def env_family(env_id: str) -> Optional[str]:
    """ "classic" (a discrete-action classic-control or Box2D task, which the classic scripts build with gymnasium),
    "atari", "mujoco" (any continuous-action task envpool ships with a flat observation: MuJoCo's, Pendulum-v1,
    LunarLanderContinuous-v3), or None if unknown. Read from envpool's spec, without building the env."""
    import envpool
    import envpool.registration
    import gymnasium as gym

    family = envpool.registration.registry.specs.get(env_id, ("",))[0]
    if "atari" in family:
        return "atari"
    if family not in FLAT:
        return None
    spec = envpool.make_spec(env_id)
    if len(spec.observation_space.shape) != 1:
        return None
    if not hasattr(spec.action_space, "n"):
        return "mujoco"
    gym_spec = gym.registry.get(env_id)
    entry = str(gym_spec.entry_point) if gym_spec is not None else ""
    return "classic" if any(f"gymnasium.envs.{task}." in entry for task in GYM_TASKS) else None


def envpool_name(env_id: str) -> Optional[str]:
    """The id envpool gives an env that CleanRL names otherwise, or None: an Atari game's ALE names
    (`BreakoutNoFrameskip-v4`, `Breakout-v4`, `ALE/Breakout-v5`) are envpool's `Breakout-v5` (CleanRL's wrappers'
    84x84 grey frames, frame skip 4, are envpool's options); a MuJoCo task of an older version (`Hopper-v2`, for
    mujoco-py) is its `-v4`, CleanRL's version now, or the newest envpool ships."""
    import envpool.registration

    specs = envpool.registration.registry.specs
    name, _, version = env_id.removeprefix("ALE/").rpartition("-v")
    game = name.removesuffix("NoFrameskip").removesuffix("Deterministic")
    if f"{game}-v5" in specs and "atari" in specs[f"{game}-v5"][0]:
        return f"{game}-v5"
    versions = sorted(
        int(k.rpartition("-v")[2]) for k, v in specs.items() if k.rpartition("-v")[0] == name and v[0] in FLAT
    )
    if not versions or not version.isdigit():
        return None
    return f"{name}-v4" if 4 in versions else f"{name}-v{versions[-1]}"


def check_env_id(env_id: str, family: str, algo: str):
    """`env_id` belongs to `family` ("classic", "atari" or "mujoco"), else one line naming the script of `algo` that
    takes it, or saying that none does. A classic script's env that gymnasium cannot build for want of a package (a
    Box2D task without Box2D or pygame) says what to install."""
    found = env_family(env_id)
    if found == family == "classic":
        import gymnasium as gym

        try:
            gym.envs.registration.load_env_creator(gym.registry[env_id].entry_point)
        except (gym.error.DependencyNotInstalled, ImportError) as e:
            missing = str(e).split(",")[0].split(".")[0]
            fail(f'--env-id {env_id} needs gymnasium\'s Box2D extra ({missing}): pip install "gymnasium[box2d]"')
    if found == family:
        return
    takes = f"this script takes {TAKES[family]}"
    if found is None and envpool_name(env_id):  # CleanRL's name for it: the id to use instead
        name = envpool_name(env_id)
        other = env_family(name)
        said = f"--env-id {env_id}: unknown env id here; envpool names it {name}"
        if other == family:
            fail(f"{said}: pass --env-id {name}")
        script = FAMILIES[other].get(algo)
        if script:
            fail(f"{said}, {FAMILIES[other]['name']}: pass --env-id {name} to leanrl/{script}")
        fail(f"{said}, {FAMILIES[other]['name']}; leanrl has no {algo.upper()} script for it ({takes})")
    if found is None:
        fail(f"--env-id {env_id}: unknown env id; {takes}")
    other = FAMILIES[found].get(algo)
    where = f"use leanrl/{other}" if other else f"leanrl has no {algo.upper()} script for it"
    fail(f"--env-id {env_id} is {FAMILIES[found]['name']}; {where} ({takes})")


# the files that make a folder a run's: a run never writes into a folder holding another run's
RUN_FILES = ("metrics.jsonl", "summary.json", "agent.pt")


def check_run(
    args, script: str, same: tuple = ("env_id",), video: bool = False, lead: bool = True, step: int = 1
) -> Optional[dict]:
    """The flags every script shares, after its own: seed, threads and burn-in ranges, `--capture-video` (`video`:
    whether the script can record), `--resume` (a checkpoint of this script, trained with the same seed and `same`
    flags, with at least `step` steps, the steps of one iteration, left to train), `--track` and, last so that a bad
    flag never leaves a folder behind, `--log-dir` (default resolved into args and created under a name no other run
    has; a given one must hold no other run unless `--resume` points into it; only by the process that writes there:
    `lead`). Returns the checkpoint to resume from, if any. A warning (more threads than cores, wandb offline) comes
    last, once every check has passed, so that a refused run says one line."""
    require(args, lambda v: 0 <= v < 2**31, "in [0, 2**31)", "seed")
    positive(args, "num_threads")
    require(args, lambda v: v >= 0, "non-negative", "measure_burnin")
    if args.capture_video and not video:
        fail("--capture-video is not supported here: envpool renders no frames")
    if args.capture_video and not all(importlib.util.find_spec(m) for m in ("moviepy", "pygame")):
        fail("--capture-video needs pygame and moviepy: pip install pygame moviepy")
    # a checkpoint goes on with its own random state: another --seed would only relabel the run
    ckpt = load_checkpoint(args, script, ("seed", *same)) if args.resume else None
    if ckpt is not None and args.total_timesteps - ckpt["global_step"] < step:
        fail(
            f"--resume {args.resume} is already at step {ckpt['global_step']:,} of --total-timesteps "
            f"{args.total_timesteps:,}: nothing left to train; pass a larger --total-timesteps to go on (its schedules "
            "are then planned over the new total: said in one line)"
        )
    if getattr(args, "compile", False):
        check_compile_cache()
    warnings = [check_diverged(args, ckpt), check_changed(args, ckpt)] if ckpt is not None else []
    warnings += [check_track(args)] if args.track and lead else []
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's ranks on this machine share its cores
    if args.num_threads and args.num_threads * ranks > cores():
        threads = f"--num-threads {args.num_threads}" + (f" x {ranks} ranks" if ranks > 1 else "")
        warnings.append(
            f"warning: {threads} is more than the {cores()} cores this process may use: the threads will wait on each "
            f"other, often many times slower; use at most {max(1, cores() // ranks)}"
        )
    if not lead:  # a rank that writes nothing: rank 0 names and creates the folder
        args.log_dir = args.log_dir or default_log_dir(args, script)
        return ckpt
    try:
        args.log_dir = args.log_dir or new_folder(default_log_dir(args, script))
        os.makedirs(args.log_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.log_dir).close()
    except OSError as e:
        fail(f"--log-dir {args.log_dir or default_log_dir(args, script)}: cannot write there ({e.strerror or e})")
    claim(args.log_dir)
    check_log_dir(args)  # after the claim: a run that claimed the folder first and has since written there counts
    for line in filter(None, warnings):
        print(line, file=sys.stderr)
    return ckpt


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


# bytes one env of a family holds in its pool (emulator or physics state, frame stack, queues), measured with envpool
# 1.2.5 and gymnasium 1.4 (Breakout-v5, HalfCheetah-v4, CartPole-v1) and rounded down: the estimate is a lower bound,
# so a refused run is one that cannot fit
ENV_BYTES = {"classic": 5_000, "atari": 1_200_000, "mujoco": 700_000}
# the flags that size each store check_memory knows
SIZED_BY = {"rollout": ("num_envs", "num_steps"), "replay_buffer": ("buffer_size",), "envs": ("num_envs",)}
GIB = 2**30


def spaces(env_id: str) -> tuple:
    """(numbers in one observation, actions: their count if discrete, else their dimensions), from envpool's spec of
    the env without building it (it ships every env id `env_family` takes)."""
    import envpool

    spec = envpool.make_spec(env_id)
    obs, act = spec.observation_space, spec.action_space
    return math.prod(obs.shape), int(act.n) if hasattr(act, "n") else math.prod(act.shape)


def available_memory() -> Optional[int]:
    """Bytes this process can still take: the kernel's MemAvailable plus free swap, capped by a container's limit
    (cgroup v2); None where /proc/meminfo cannot be read (not Linux): no check there."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
    except (OSError, ValueError):
        return None
    free = info.get("MemAvailable", 0) + info.get("SwapFree", 0)
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                free = min(free, int(limit) - int(g.read()))
    return free


def check_memory(args, family: str, members: int = 1, **stores: int):
    """Refuse, before any work, a run that cannot fit in memory: `stores` are the bytes of its big stores on the
    learner's device (`rollout`, `replay_buffer`: SIZED_BY names their flags), the env pools (`--num-envs` x
    ENV_BYTES[family], for each of a seeds run's `members`) are on the host. Without this a run the machine cannot hold
    is killed by the kernel without a word, or fails hours in, when its replay buffer fills. torchrun's ranks on one
    machine share its memory."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    host = dict(envs=members * args.num_envs * ENV_BYTES[family])
    if args.cuda and torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        fits(args, stores, torch.cuda.mem_get_info(index)[0], "free on the GPU", 1)
    else:
        host.update(stores)
    fits(args, host, available_memory(), "available", ranks)


def fits(args, stores: dict, free: Optional[int], where: str, ranks: int):
    """`stores` (name: bytes) x `ranks` within `free` bytes, else one line naming the flags of the big stores."""
    need = sum(stores.values()) * ranks
    if free is None or need <= free:
        return
    big = sorted((store for store in stores if stores[store] * ranks >= need / 20), key=stores.get, reverse=True)
    flags = list(dict.fromkeys(name for store in big for name in SIZED_BY[store]))  # largest store's first, once each
    if getattr(args, "num_seeds", 1) > 1:  # a seeds run: every member has its own envs and rollout
        flags.append("num_seeds")
    parts = ", ".join(f"{store.replace('_', ' ')} {stores[store] / GIB:.1f} GiB" for store in big)
    each = f" per rank, {ranks} ranks on this machine" if ranks > 1 else ""
    sizes = " ".join(f"{flag(name)} {getattr(args, name)}" for name in flags)
    fail(
        f"{sizes}: this run needs about {need / GIB:.1f} GiB ({parts}{each}) and {free / GIB:.1f} GiB is {where}; "
        f"lower {' or '.join(flag(name) for name in flags)}"
    )


def pick_device(args) -> torch.device:
    """CUDA if there is one and `--cuda` (the default); `--cudagraphs` without CUDA is dropped with one line."""
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False
    return device


def envpool_seed(seed: int) -> int:
    """A derived env seed (seed + an env's index, a member's, a resumed run's step) as envpool takes it: an int32,
    which envpool.make asserts. Wrapped in 32 bits as envpool itself wraps the seed of env i of a pool (seed + i), so
    that a pool of its own gives an env the seed it has in one big pool."""
    return (seed + 2**31) % 2**32 - 2**31


# torch's CUDA generator state: its seed and offset (a CPU generator's is its 5,056-byte Mersenne Twister)
CUDA_RNG_STATE_BYTES = 16

# the layout of the checkpoints written through save_checkpoint (4: every part of a run under its own name, for
# `resume`); format 3 is read as format 4 (`load_checkpoint`), older files are refused in one line, not a KeyError
CHECKPOINT_FORMAT = 4
# format 3 held an Atari run's episode record at the checkpoint's top level ("returns" and "lengths", or a seeds run's
# "members") and DQN's buffer position beside its rows ("buffer_pos", "buffer_full"); format 4 holds them under
# "episodes" and "buffer", each a part of `resume`
PARTS_AT_TOP = 3


def save_checkpoint(path: str, script: str, args, **parts):
    """Each of `parts` as `state_of` holds it, with the writing script's name and flags, written atomically
    (`write_atomically`) and streamed into the file: a checkpoint that holds a replay buffer (gigabytes for Atari) is
    not copied in memory first."""
    checkpoint = dict(script=script, format=CHECKPOINT_FORMAT, args=asdict(args), **state_of(parts))
    write_atomically(path, lambda f: torch.save(checkpoint, f))


def is_env(part, vector: bool) -> bool:
    """A gymnasium env (`vector`: a vector env of them), whose state `env_state` takes."""
    if "gymnasium" not in sys.modules:
        return False
    import gymnasium as gym

    return isinstance(part, gym.vector.VectorEnv if vector else gym.Env)


def state_of(part):
    """What a checkpoint holds of one part of a run: a module's or an optimizer's `state_dict`, a generator's state
    (torch's or numpy's), a gymnasium env's (`env_state`, each env of a vector env), a script's own object's
    `state_dict()` or `state()` (a normalizer, episode returns, a replay buffer), a tensor or an array as a CPU tensor,
    a dict or list part by part, a function's result (called only when the checkpoint is written); numbers as they
    are."""
    if isinstance(part, (torch.nn.Module, torch.optim.Optimizer)):
        return part.state_dict()
    if isinstance(part, torch.Generator):  # its device beside its state: a resume on another one says where it was
        return dict(state=part.get_state(), device=part.device.type)
    if isinstance(part, np.random.Generator):
        return part.bit_generator.state
    if isinstance(part, torch.Tensor):
        return part.detach().cpu()
    if isinstance(part, np.ndarray):
        return torch.from_numpy(part)
    if is_env(part, vector=True):
        return vector_env_state(part)
    if is_env(part, vector=False):
        return env_state(part)
    if isinstance(part, dict) or hasattr(part, "items"):  # a dict, or a TensorDict of parameters
        return {name: state_of(value) for name, value in part.items()}
    if hasattr(part, "state_dict"):  # a script's own stateful object (an observation normalizer)
        return part.state_dict()
    if hasattr(part, "state") and callable(part.state):
        return part.state()
    if isinstance(part, (list, tuple)):
        return [state_of(value) for value in part]
    if callable(part):  # a state built only when a checkpoint is written (a replay buffer's copy, gigabytes on a GPU)
        return state_of(part())
    return part


def resume(ckpt: dict, seed: int, restart: bool, **parts):
    """`state_of`'s states in `ckpt` back into `parts`, each in place, by the same names: a module's and an
    optimizer's (`load_optimizer`), the loop's generators (`restore_rngs`, re-seeded from `seed`; a list of them, a
    seeds run's, one per member from `seed` on), numpy's, gymnasium envs (which have been reset once), episode
    returns, replay buffers (`load`), tensors and arrays (copied into). `restart`, the caller's to say: the envs start
    new episodes (envpool's, which no checkpoint holds, or a gymnasium env the checkpoint could not hold: `env_saved`),
    so the returns of the episodes in flight are dropped; without it they go on, the envs restored among the parts. The
    loop's counters are the script's to read (`ckpt["global_step"]`)."""
    for name, part in parts.items():
        if name not in ckpt and isinstance(part, torch.Generator):  # a checkpoint written before it was saved
            unsaved_generator(part, name, seed, ckpt["global_step"])
            continue
        load_part(part, ckpt[name], seed, ckpt["global_step"], restart, name)


def device_generator(device: torch.device) -> torch.Generator:
    """The default generator of the learner's device, which torch's samplers draw from when given none (a Categorical's
    or a Normal's sample, torch.randint): the GPU's own CUDA generator, the CPU's on the host. The eager baselines save
    it beside the CPU's (`torch_rng`): a resumed GPU run would otherwise replay the first segment's noise."""
    if device.type != "cuda":
        return torch.default_generator
    if not torch.cuda.default_generators:  # made as CUDA initializes
        torch.cuda.init()
    return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]


def unsaved_generator(rng: torch.Generator, name: str, seed: int, step: int):
    """A generator the checkpoint holds no state of (written before it was saved: the CUDA default one, `device_rng`).
    A CPU one is the CPU's default generator, which `torch_rng` restores: left as it is. A CUDA one is re-seeded from
    the seed and the step (as it was, it would replay the first run's noise), said in one line."""
    if rng.device.type == "cpu":
        return
    reseed(
        [rng],
        [seed],
        step,
        f"the checkpoint holds no {name} (written before it was saved): the {rng.device.type} generator",
    )


def reseed(rngs: list, seeds: list, step: int, what: str):
    """Re-seeds each generator from its seed and the step, and says so in one line (rank 0): the run goes on, but its
    random numbers are no longer those of the run uninterrupted."""
    for rng, seed in zip(rngs, seeds):
        rng.manual_seed(int(np.random.SeedSequence([seed, step]).generate_state(1)[0]))
    if os.environ.get("RANK", "0") == "0":
        print(
            f"--resume: {what} re-seeded from --seed and step {step}, the run goes on, its random numbers no longer "
            "those of the run uninterrupted",
            file=sys.stderr,
        )


def env_saved(ckpt: dict) -> bool:
    """Whether `ckpt` holds its run's envs (`env`): gymnasium's classic control, yes; envpool's, or a gymnasium env
    whose state `env_state` cannot take (a Box2D world), no: a run resumed from it starts new episodes."""
    return ckpt.get("env") is not None


def same_layout(name: str, saved, shape: tuple, dtype):
    """A tensor or array of the checkpoint goes back only into one of its own shape and dtype (copy_ and [...] = would
    broadcast and cast it without a word): else one line, naming the part."""
    theirs = f"{tuple(saved.shape)} {str(saved.dtype).removeprefix('torch.')}"
    ours = f"{tuple(shape)} {str(dtype).removeprefix('torch.')}"
    if theirs != ours:
        fail(
            f"--resume: the checkpoint's {name} is {theirs}, this run's {ours}: it was written with other flags; "
            "resume with the flags it was trained with (its summary.json's)"
        )


def load_part(part, saved, seed: int, step: int, restart: bool, name: str):
    """One part of `resume` (`name`: where it is, for a message)."""
    if isinstance(part, torch.optim.Optimizer):
        load_optimizer(part, saved)
    elif isinstance(part, torch.nn.Module):
        part.load_state_dict(saved)
    elif isinstance(part, torch.Generator):
        restore_rngs([part], [saved], [seed], step)
    elif isinstance(part, list) and part and isinstance(part[0], torch.Generator):
        restore_rngs(part, saved, [seed + k for k in range(len(part))], step)
    elif isinstance(part, np.random.Generator):
        part.bit_generator.state = saved
    elif isinstance(part, torch.Tensor):
        same_layout(name, saved, part.shape, part.dtype)
        with torch.no_grad():
            part.copy_(saved)
    elif isinstance(part, np.ndarray):
        same_layout(name, saved.numpy(), part.shape, part.dtype)
        part[...] = saved.numpy()
    elif is_env(part, vector=True):
        set_vector_env_state(part, saved)
    elif is_env(part, vector=False):
        set_env_state(part, saved)
    elif isinstance(part, (Episodes, MemberEpisodes, MemberAtariEpisodes)):
        part.load(saved, restart=restart)
    elif isinstance(part, dict) or hasattr(part, "items"):  # before `load`: a TensorDict's own loads from disk
        for key, value in part.items():
            load_part(value, saved[key], seed, step, restart, f"{name}.{key}")
    elif hasattr(part, "load_state_dict"):
        part.load_state_dict(saved)
    elif hasattr(part, "load") and callable(part.load):
        part.load(saved)
    elif isinstance(part, (list, tuple)):
        for i, (value, state) in enumerate(zip(part, saved)):
            load_part(value, state, seed, step, restart, f"{name}[{i}]")
    else:
        raise TypeError(f"resume: cannot restore a {type(part).__name__} in place")


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


def load_checkpoint(args, script: str, same: tuple = ("env_id",)) -> dict:
    """The checkpoint at `args.resume`, loaded onto the CPU with `weights_only`. A missing, corrupt or foreign file,
    another script's, or one trained with other values of the flags in `same` is a user mistake."""
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        written_by = ckpt["script"]
        saved = ckpt["args"]
    except FileNotFoundError:
        fail(f"--resume {args.resume}: no such file")
    except Exception as e:
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if written_by != script:
        fail(f"--resume {args.resume} was written by {written_by}.py; resume it with that script")
    if ckpt.get("format") == PARTS_AT_TOP:
        for part in [ckpt, *ckpt.get("ranks", [])]:  # a DDP run's ranks held theirs each
            keys = [key for key in ("returns", "lengths", "members") if key in part]
            if keys:
                part["episodes"] = {key: part.pop(key) for key in keys}
        if "buffer_pos" in ckpt:
            ckpt["buffer"] = dict(data=ckpt["buffer"], pos=ckpt.pop("buffer_pos"), full=ckpt.pop("buffer_full"))
        ckpt["format"] = CHECKPOINT_FORMAT
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        fail(f"--resume {args.resume} was written by an older version of {script}.py; start a new run")
    for name in same:
        if saved.get(name, getattr(args, name)) != getattr(args, name):
            fail(f"--resume {args.resume} was trained with {flag(name)} {saved[name]}; pass the same")
    return ckpt


# flags of how a run runs, not of what it trains: another value on --resume leaves the run the one it would have been
# (up to float drift under --compile or where the policy acts, or a device change, which restore_rngs says)
HOW_IT_RUNS = {
    "exp_name",
    "cuda",
    "compile",
    "compile_async",
    "cudagraphs",
    "host_actor",
    "numpy_act",
    "split_envs",
    "dist_timeout",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "measure_burnin",
    "log_every",
    "log_dir",
    "save_model",
    "resume",
    "num_threads",
}


def check_changed(args, ckpt: dict) -> Optional[str]:
    """The flags that shape training (all but HOW_IT_RUNS) whose values differ from the checkpoint's run's: taken, and
    said in one line with the checkpoint's value beside each (None if none differs). A larger --total-timesteps, which
    the refusal of a finished run asks for, re-plans the schedules that run to it (the lr's annealing, the
    exploration's) from the resumed step: said too."""
    saved = ckpt["args"]

    def differs(name, value) -> bool:
        if name in HOW_IT_RUNS or name not in saved or value in (None, "auto"):  # None, "auto": resolved as it runs
            return False
        old = saved[name]
        return (list(old) if isinstance(old, (list, tuple)) else old) != (
            list(value) if isinstance(value, (list, tuple)) else value
        )

    changed = [name for name, value in asdict(args).items() if differs(name, value)]
    if not changed:
        return None
    said = ", ".join(f"{flag(name)} {getattr(args, name)} (its run's: {saved[name]})" for name in changed)
    plan = (
        "; the schedules that run to --total-timesteps (lr annealing, exploration) are planned again from this step"
        if "total_timesteps" in changed
        else ""
    )
    return (
        f"warning: --resume {args.resume} goes on with other flags than its run's: {said}{plan}; the run is no longer "
        "the one it would have been uninterrupted"
    )


def check_diverged(args, ckpt: dict) -> Optional[str]:
    """The members of a seeds run's checkpoint that diverged (`Run.finite_members`). A member the file holds no finite
    state of is refused: it would resume as NaN. A member whose last finite state the file kept goes on from it, said
    in the line returned (None if no member diverged)."""
    records = ckpt.get("diverged", [])
    lost = [r for r in records if r["kept"] is None]
    if lost:
        who = ", ".join(f"seed {r['seed']} (at step {r['global_step']:,})" for r in lost)
        fail(
            f"--resume {args.resume}: member {who} diverged before any checkpoint held a finite state of it, so its "
            "weights here are not finite; start a new run, with a lower learning rate for it"
        )
    if not records:
        return None
    who = "; ".join(
        f"seed {r['seed']} diverged at step {r['global_step']:,}, goes on from step {r['kept']:,}" for r in records
    )
    return (
        f"--resume: member {who}: the checkpoint kept its last finite weights and optimizer state (the other "
        f"members' are of step {ckpt['global_step']:,})"
    )


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict):
    """A checkpoint's optimizer state under this run's settings. `load_state_dict` alone restores the writing run's
    param groups: its `capturable` (a CUDA-graph run's, resumed on a CPU, fails Adam's device check; a host run's,
    resumed under CUDA graphs, keeps the step counters on the host) and its lr (a copy that the loop, annealing its own
    lr tensor in place, no longer reaches). Here the groups keep this run's settings, and torch places each step
    counter as this run's `capturable` asks. The state is copied in: torch would step the checkpoint's own tensors
    (on the same device and dtype it keeps them), and a seeds run reads those at its end (`Run.finite_members`)."""
    own = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    groups = [dict(s, **settings) for s, settings in zip(saved["param_groups"], own)]
    state = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for i, s in saved["state"].items()}
    optimizer.load_state_dict(dict(saved, state=state, param_groups=groups))
    for group, settings in zip(optimizer.param_groups, own):
        group.update(settings)  # load_state_dict copies the groups: the lr tensor the loop anneals, itself again


def restore_rngs(rngs: list, states: list, seeds: list, step: int):
    """A checkpoint's generator states (`state_of`'s: the state and the device it was on; a bare state in checkpoints
    written before the device was recorded) into the loop's generators (one per seed). A CUDA generator's state is 16
    bytes and a CPU one's 5,056: a run moved between a GPU node and a CPU goes on, each generator re-seeded from its
    seed and the checkpoint's step (the same numbers at every such resume, not the stream the writing run would have
    drawn: from here the run differs from the uninterrupted one), said in one line, by rank 0 of a torchrun job."""
    written = [(s["state"], s["device"]) if isinstance(s, dict) else (s, None) for s in states]
    same = [
        len(state) == len(rng.get_state()) and device in (None, rng.device.type)
        for rng, (state, device) in zip(rngs, written)
    ]
    if all(same):
        for rng, (state, _) in zip(rngs, written):
            rng.set_state(state)
        return
    state, device = written[same.index(False)]
    if device is None:  # a checkpoint that records no device: its state's size tells CUDA's from a CPU's
        device = "cuda" if len(state) == CUDA_RNG_STATE_BYTES else "cpu"
    written_on = dict(cuda="CUDA", cpu="a CPU").get(device, device)
    reseed(
        rngs,
        seeds,
        step,
        f"a checkpoint written on {written_on}, resumed on {rngs[0].device.type}: the loop's random generator",
    )


def env_state(env) -> Optional[dict]:
    """Everything that moves in one gymnasium classic-control env (its physics state, its random generator, its time
    limit's count): a checkpoint holding it, with the obs the loop holds, resumes bit for bit. None for another env (a
    Box2D world cannot be saved): a run resumed from the checkpoint starts new episodes (`env_saved`)."""
    import gymnasium as gym

    if not type(env.unwrapped).__module__.startswith("gymnasium.envs.classic_control."):
        return None
    limit = env
    while not isinstance(limit, gym.wrappers.TimeLimit):
        limit = limit.env
    u = env.unwrapped
    return dict(
        state=torch.as_tensor(np.array(u.state, dtype=np.float64)),
        rng=u.np_random.bit_generator.state,
        elapsed=limit._elapsed_steps,
        beyond=getattr(u, "steps_beyond_terminated", None),
    )


def set_env_state(env, state: dict):
    """`env_state`'s state back into `env`, which has been reset once (gymnasium steps no env before that)."""
    import gymnasium as gym

    limit = env
    while not isinstance(limit, gym.wrappers.TimeLimit):
        limit = limit.env
    u = env.unwrapped
    u.state = state["state"].numpy()
    u.np_random.bit_generator.state = state["rng"]
    limit._elapsed_steps = state["elapsed"]
    if hasattr(u, "steps_beyond_terminated"):
        u.steps_beyond_terminated = state["beyond"]


def vector_env_state(envs) -> Optional[list]:
    """`env_state` of each env of a gymnasium vector env; None if one of them cannot be saved."""
    states = [env_state(env) for env in envs.envs]
    return None if None in states else states


def set_vector_env_state(envs, states: list):
    """`vector_env_state`'s states back into each env of `envs`."""
    for env, state in zip(envs.envs, states):
        set_env_state(env, state)


class Episodes:
    """Returns of the last `window` finished episodes, summed from the rewards given (the raw, unclipped ones)."""

    def __init__(self, num_envs: int, window: int = 20):
        self.ret = np.zeros(num_envs)
        self.finished = deque(maxlen=window)

    def record(self, reward, done, ids=None):
        """One step of every env (or of the envs `ids`, a pool's share): add the rewards, close the done episodes."""
        if ids is None:
            self.ret += reward
            if done.any():  # rare: most steps cost one numpy add
                self.finished.extend(self.ret[done].tolist())
                self.ret[done] = 0
            return
        self.ret[ids] += reward
        if done.any():
            self.finished.extend(self.ret[ids[done]].tolist())
            self.ret[ids[done]] = 0

    def record_steps(self, rewards, dones):
        """`record` for each step of a rollout: rows of the rewards and of the dones after each step."""
        for reward, done in zip(rewards, dones):
            self.record(reward, done)

    def record_one(self, reward: float, done: bool):
        """`record` for one env stepped alone (the off-policy loops): plain numbers, none of numpy's per-call cost."""
        self.ret[0] += reward
        if done:
            self.finished.append(float(self.ret[0]))
            self.ret[0] = 0

    def mean(self) -> Optional[float]:
        return float(np.mean(self.finished)) if self.finished else None

    def state(self) -> dict:
        return dict(ret=torch.as_tensor(self.ret), finished=torch.tensor(list(self.finished), dtype=torch.float64))

    def load(self, state: dict, restart: bool):
        """The state of `state()`; `restart`: the envs could not be saved and start new episodes, so the returns of the
        episodes in flight are dropped."""
        self.ret = np.zeros_like(self.ret) if restart else state["ret"].numpy().copy()
        self.finished.extend(state["finished"].tolist())


class AtariEpisodes(Episodes):
    """The full game's unclipped score, and its length: info["reward"] summed until info["terminated"] (all lives
    lost) or the time limit. The 5-tuple's `terminated` is per life under episodic_life and its reward is clipped, so
    neither is used."""

    def __init__(self, num_envs: int, window: int = 20):
        super().__init__(num_envs, window)
        self.lengths = deque(maxlen=window)

    def step(self, info: dict, truncated: np.ndarray, offset: int = 0):
        """One step of a pool, as its `recv` returned it; `offset` is the index of its first env (a pool numbers its
        envs from 0)."""
        over = np.logical_or(info["terminated"], truncated)
        self.record(info["reward"], over, info["env_id"] + offset)
        self.lengths.extend(info["elapsed_step"][over].tolist())

    def record_steps(self, steps: list):
        """`step` for each of a rollout's steps: (info, truncated, offset) of each pool's `recv` in turn."""
        for info, truncated, offset in steps:
            self.step(info, truncated, offset)

    def mean_length(self) -> Optional[float]:
        return float(np.mean(self.lengths)) if self.lengths else None

    def state(self) -> dict:
        # the finished games only: a resumed run restarts its games, so the scores in flight are lost
        return dict(
            returns=torch.tensor(list(self.finished), dtype=torch.float64),
            lengths=torch.tensor(list(self.lengths), dtype=torch.float64),
        )

    def load(self, state: dict, restart: bool):
        """The finished games of `state()`; `restart` must be said: envpool cannot save a game, the games restart."""
        if not restart:
            raise ValueError("AtariEpisodes: envpool cannot save a game in flight; resume with restart=True")
        self.finished.extend(state["returns"].tolist())
        self.lengths.extend(state["lengths"].tolist())


class MemberAtariEpisodes:
    """Each member's own AtariEpisodes (its games' scores and lengths); the top-level fields are the means of the
    members still training (`Run.live_mean`)."""

    def __init__(self, members: int, num_envs: int):
        self.members = [AtariEpisodes(num_envs) for _ in range(members)]

    def record_steps(self, steps: list):
        """Each member's steps of a rollout: (member, info, truncated, offset) of each `recv` in turn."""
        for k, info, truncated, offset in steps:
            self.members[k].step(info, truncated, offset)

    def means(self) -> list:
        return [member.mean() for member in self.members]

    def mean_lengths(self) -> list:
        return [member.mean_length() for member in self.members]

    def state(self) -> dict:
        return dict(members=[member.state() for member in self.members])

    def load(self, state: dict, restart: bool):
        for member, saved in zip(self.members, state["members"]):
            member.load(saved, restart)


class MemberEpisodes:
    """`Episodes` of `members` runs side by side (the seeds scripts), `num_envs` envs each, in a row: one window of
    finished returns per member; the top-level return is the mean of the members still training (`Run.live_mean`)."""

    def __init__(self, members: int, num_envs: int, window: int = 20):
        self.ret = np.zeros(members * num_envs)
        self.num_envs = num_envs
        self.members = [deque(maxlen=window) for _ in range(members)]

    def record(self, reward, done):
        """One step of every member's envs: add the rewards, close the done episodes into their member's window."""
        self.ret += reward
        if done.any():  # rare: most steps cost one numpy add
            for i in np.flatnonzero(done):
                self.members[i // self.num_envs].append(float(self.ret[i]))
            self.ret[done] = 0

    def record_steps(self, rewards, dones):
        """`record` for each step of a rollout: rows of the rewards and of the dones after each step."""
        for reward, done in zip(rewards, dones):
            self.record(reward, done)

    def means(self) -> list:
        """Each member's mean return over its window (None for a member with no finished episode yet)."""
        return [float(np.mean(finished)) if finished else None for finished in self.members]

    def state(self) -> dict:
        members = [torch.tensor(list(finished), dtype=torch.float64) for finished in self.members]
        return dict(ret=torch.as_tensor(self.ret), members=members)

    def load(self, state: dict, restart: bool):
        self.ret = np.zeros_like(self.ret) if restart else state["ret"].numpy().copy()
        for finished, saved in zip(self.members, state["members"]):
            finished.extend(saved.tolist())


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


class StopFlag:
    """Ctrl-C, SIGTERM or SIGHUP asks the loop to stop at its next log line, where the state is consistent and a
    checkpoint can be saved. A second one stops at once (no checkpoint), and so does the first before anything was
    logged. Once the loop is over (`finishing`), signals wait for the final writes: a checkpoint cut in half is a
    traceback, a stale temporary file and no summary; exit code 130 after them."""

    def __init__(self):
        self.set = False
        self.logged = False
        self.finishing = False
        self.deferred = False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGHUP, self.handle)  # the terminal closed: a stop like any other, the files kept

    def handle(self, signum, frame):
        if self.finishing:
            if not self.deferred:
                print(
                    "\nwriting the checkpoint and summary first; the run stops after them", file=sys.stderr, flush=True
                )
            self.deferred = True
            return
        if not self.logged:
            print("\nstopped before the first log line: nothing to save", file=sys.stderr, flush=True)
            os._exit(130)
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        print("\nstopping at the next log line (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr, flush=True)


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


class Run:
    """A run's outputs: a metrics.jsonl row per `log`, wandb with `--track`, the progress bar, the steady-state fps,
    and summary.json from `finish`. Used as a context: Ctrl-C (or SIGTERM) sets `stopping`, a second one ends the
    block at once and clears `consistent`, so no checkpoint of a half-done step is saved. A logged loss that is not
    finite (or a policy torch.distributions refuses) stops the run as diverged, `consistent` cleared too. In a seeds
    run (a row with `members`) a member whose numbers are not finite is reported and left out of the top-level means,
    the others train on; the run stops so once no member is left.

        run = Run(args, SCRIPT, device, total_steps=args.total_timesteps, start_step=global_step)
        with run:
            for ...:
                ...
                run.log(global_step, steady=..., **row)
                if run.stopping:
                    break
        run.save(global_step=global_step, agent=agent, ...)  # with --save-model, a consistent state only
        run.finish(global_step, final_return=episodes.mean())

    `lead=False` (a DDP rank other than 0) writes nothing and shows no bar; Ctrl-C still stops it. `compiling`
    (default: `--compile`) says that the first calls compile, on stderr and in the bar, until `compiled()`."""

    def __init__(
        self,
        args,
        script: str,
        device: torch.device,
        total_steps: int,
        start_step: int = 0,
        lead: bool = True,
        compiling: Optional[bool] = None,
    ):
        self.args = args
        self.script = script
        self.device = device
        self.lead = lead
        self.start_step = start_step
        self.stop = StopFlag()
        self.consistent = True
        self.diverged = None  # the step and the losses that were not finite, once they were not (and which members)
        self.members_diverged = {}  # a seeds run: member index -> the step and the losses that were not finite
        self.seeds = []  # a seeds run: each member's seed, as its rows give it
        self.fps = None
        self.mark = None  # (time, step) where steady state began
        self.untimed = 0.0  # seconds since the mark that were not training (`log(untimed=...)`)
        self.first_interval = None
        self.steady_intervals = []
        self.wandb = None
        self.metrics = None  # opened at the first row: a run stopped before it leaves no empty file in its folder
        self.metrics_path = os.path.join(args.log_dir, "metrics.jsonl") if lead else None
        self.logged_step = start_step  # the step of the last row: what a run stopped mid-iteration has done
        self.commit = git_commit()
        self.start = self.last = time.perf_counter()
        if lead:
            if start_step and os.path.exists(self.metrics_path):
                keep_rows_until(self.metrics_path, start_step)
            if args.track:
                import wandb

                self.wandb = wandb.init(
                    project=args.wandb_project_name,
                    entity=args.wandb_entity,
                    config=vars(args),
                    name=os.path.basename(args.log_dir),
                    dir=args.log_dir,
                    save_code=True,
                )
        self.bar = tqdm.tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, disable=not lead)
        if args.compile if compiling is None else compiling:  # the first calls compile: say so, or a run looks stuck
            self.say(
                "compiling the units on their first call (a minute or more on a cold cache; later runs load "
                "them from Inductor's on-disk cache)"
            )
            self.compiling()

    def say(self, line: str):
        """One line on stderr that does not break the progress bar."""
        if self.lead:
            self.bar.write(line, file=sys.stderr)

    def compiling(self):
        """The units compile again (new shapes): the bar says so until `compiled()`."""
        self.bar.set_description("compiling")

    def compiled(self):
        """Every unit has compiled: the bar drops its "compiling" label."""
        self.bar.set_description("")

    @property
    def stopping(self) -> bool:
        return self.stop.set or not self.consistent

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        self.stop.finishing = True
        self.bar.close()
        if self.metrics:
            self.metrics.close()
        if kind is KeyboardInterrupt:  # the second Ctrl-C: stopped mid-step, with no consistent state to save
            self.stop.set = True
            self.consistent = False
            return True
        # torch.distributions refuses non-finite parameters (the eager scripts' policies): the weights diverged within
        # an iteration, before its log line could see the losses
        if kind is ValueError and "found invalid values" in str(exc):
            name = str(exc).split()[2]  # "Expected parameter logits (...)"
            self.diverge(self.bar.n, [name], f"after step {self.bar.n:,}", f"the policy's {name}")
            return True
        return False

    def diverge(self, global_step: int, names: list, when: str, what: str):
        """Training went non-finite: one line, the run stops, and nothing of it is saved over the last checkpoint."""
        if self.diverged is None:  # a seeds run's members have recorded theirs
            self.diverged = dict(global_step=global_step, losses=names)
        self.consistent = False
        self.say(
            f"error: training diverged {when}: {what} not finite; the run stops without saving a checkpoint (the last "
            "one is kept): resume from it with a lower learning rate"
        )

    def log(self, global_step: int, steady: bool, untimed: float = 0.0, **row) -> dict:
        """One metrics.jsonl row (and a wandb point), with the time so far and the steady-state fps: env steps per
        second since the first log at which `steady` held (compiling and warming up come before). `untimed`: seconds
        of this interval spent on something other than training (an evaluation), left out of the fps."""
        now = time.perf_counter()
        interval = now - self.last - untimed
        if self.first_interval is None:
            self.first_interval = interval
        elif self.mark is not None:
            self.steady_intervals.append(interval)
            self.untimed += untimed
        self.last = now
        if steady and self.mark is None:
            self.mark = (now, global_step)
        if self.mark is not None and global_step > self.mark[1]:
            self.fps = (global_step - self.mark[1]) / (now - self.mark[0] - self.untimed)
        members = row.pop("members", None)
        row = dict(global_step=global_step, time=now - self.start, fps=self.fps, **row)
        # the loop's host sync has already brought the losses here: checking them costs no other
        if members is not None:
            self.check_members(global_step, members)
            row.update({key: self.live_mean([m[key] for m in members]) for key in members[0] if key != "seed"})
        broken = non_finite(row)
        if broken and self.consistent:
            said = ", ".join(f"{name} {value}" for name, value in broken.items())
            self.diverge(global_step, list(broken), f"at step {global_step:,}", said)
        if members is not None:
            row["members"] = members
        if self.metrics_path:
            try:
                self.metrics = self.metrics or open(self.metrics_path, "a", buffering=1)
                self.metrics.write(json.dumps(strict_json(row)) + "\n")
            except OSError as e:
                self.cannot_log(e)
        self.logged_step = global_step
        if self.wandb:
            self.wandb.log(row, step=global_step)
        self.bar.update(global_step - self.bar.n)
        # what the row says: "-" where it has no number yet (no steady state, no finished episode), not a 0
        ret = row.get("episodic_return")
        fps = "-" if self.fps is None else f"{self.fps:.0f}"
        self.bar.set_postfix(fps=fps, ret="-" if ret is None else f"{ret:.1f}", refresh=False)
        self.stop.logged = True
        return row

    def check_members(self, global_step: int, members: list):
        """A seeds run's row: a member whose numbers are not finite for the first time is recorded (in `diverged` too)
        and said in one line, and the others train on; once no member is left training, the run stops as diverged. A
        member's NaN reaches no other: each has its own parameters, Adam moments, generator, envs, advantage
        normalization and gradient clip, and the top-level fields leave it out (`live_mean`)."""
        self.seeds = [m.get("seed", k) for k, m in enumerate(members)]
        fresh = {k: non_finite(m) for k, m in enumerate(members) if k not in self.members_diverged}
        fresh = {k: broken for k, broken in fresh.items() if broken}
        if not fresh:
            return
        record = self.diverged or dict(global_step=global_step, losses=[])
        record.setdefault("members", [])
        for k, broken in fresh.items():
            self.members_diverged[k] = dict(global_step=global_step, losses=list(broken))
            record["losses"] += [f"members[{k}].{name}" for name in broken]
            record["members"].append(self.seeds[k])
        self.diverged = record
        if len(self.members_diverged) == len(members):
            said = ", ".join(f"members[{k}].{n} {v}" for k, broken in fresh.items() for n, v in broken.items())
            self.diverge(global_step, record["losses"], f"at step {global_step:,}", said)
            return
        saved = ""
        if getattr(self.args, "save_model", False):
            saved = (
                ", and agent.pt will keep this member's state from --resume's checkpoint"
                if getattr(self.args, "resume", None)
                else "; agent.pt will hold no finite state of this member (no earlier checkpoint): --resume refuses it"
            )
        for k, broken in fresh.items():
            said = ", ".join(f"{name} {value}" for name, value in broken.items())
            self.say(
                f"error: training diverged for member seed {self.seeds[k]} at step {global_step:,}: {said} not finite; "
                f"the other members train on{saved}"
            )

    def live_mean(self, values: list) -> Optional[float]:
        """The mean of a seeds run's per-member `values` over the members still training, None values left out (None
        if none is left)."""
        kept = [v for k, v in enumerate(values) if k not in self.members_diverged and v is not None]
        return float(np.mean(kept)) if kept else None

    def finite_members(self, earlier: Optional[dict], **state) -> dict:
        """A seeds run's per-member state for its checkpoint (`state`: the stacked parameters, the optimizer's state
        dict, a normalizer's; every tensor of one or more dimensions holds the members along its first), with
        `diverged`, the record `check_diverged` reads on resume. A member that diverged has its slices taken from
        `earlier`, the checkpoint this run resumed from (the only one its log dir can hold): the file keeps the
        member's last finite state, never NaNs over it; its envs, generator, step and Adam's step count (a scalar, the
        members') are the run's. With no earlier checkpoint there is no finite state to keep: its slices are saved as
        they are, recorded `kept` None, and --resume refuses the file."""
        before = {r["seed"]: r["kept"] for r in earlier.get("diverged", [])} if earlier else {}
        records = []
        for k, record in self.members_diverged.items():
            seed = self.seeds[k]
            kept = before.get(seed, earlier["global_step"]) if earlier else None
            records.append(dict(seed=seed, **record, kept=kept))
        if earlier is None or not records:
            return dict(state, diverged=records)

        def splice(value, old):
            if isinstance(value, torch.Tensor) and value.dim():
                value = value.clone()
                for k in self.members_diverged:
                    value[k] = old[k]
                return value
            if isinstance(value, dict):
                return {key: splice(item, old[key]) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(splice(item, o) for item, o in zip(value, old))
            return value

        return dict(splice(state, {name: earlier[name] for name in state}), diverged=records)

    def cannot_log(self, error: OSError):
        """metrics.jsonl can take no more rows (a full disk): the run stops here as Ctrl-C stops it, its checkpoint and
        summary still tried, and exits 1."""
        path = self.metrics_path
        with contextlib.suppress(OSError, AttributeError):  # the row it holds back fails again (None: the open failed)
            self.metrics.close()
        self.metrics = None
        self.metrics_path = None
        UNWRITTEN.append(path)
        self.stop.set = True
        self.say(f"error: could not write {path} ({error.strerror or error}); the run stops at this step")

    def save(self, earlier: Optional[dict] = None, members: Optional[dict] = None, **parts):
        """The run's checkpoint with --save-model, `{log_dir}/agent.pt`: `parts` as `save_checkpoint` holds them,
        written once the run has trained past the step it began at (`parts["global_step"]`) and holds a consistent
        state (not after a second Ctrl-C or a divergence), by the lead process only. A seeds run gives its per-member
        parts as `members` and the checkpoint it resumed from as `earlier` (`finite_members`)."""
        if not (self.lead and self.args.save_model and self.consistent and parts["global_step"] > self.start_step):
            return
        if members is not None:
            parts.update(self.finite_members(earlier, **state_of(members)))
        save_checkpoint(os.path.join(self.args.log_dir, "agent.pt"), self.script, self.args, **parts)

    def compile_time(self) -> Optional[float]:
        """What compiling added to the first interval between log lines (the one that compiled), against a steady
        one (the median); None before steady state."""
        if not self.steady_intervals:
            return None
        return self.first_interval - statistics.median(self.steady_intervals)

    def finish(self, global_step: int, final_return: Optional[float], compile_time: Optional[float] = None, **extra):
        """summary.json (and wandb's summary), one closing line on stderr; exit code 1 if a final write failed, 130 if
        the run was stopped. A run stopped mid-iteration (a second Ctrl-C, a divergence) counts the steps of its last
        row, which its metrics and checkpoint hold, not those of the half-done iteration."""
        if not self.consistent:
            global_step = self.logged_step
        if self.lead:
            summary = dict(
                script=self.script,
                commit=self.commit,
                env_id=self.args.env_id,
                seed=self.args.seed,
                flags=asdict(self.args),
                **machine_info(self.device),
                num_threads=torch.get_num_threads(),
                total_timesteps=self.args.total_timesteps,
                global_step=global_step,
                wall_time=time.perf_counter() - self.start,
                fps=self.fps,
                final_return=final_return,
                compile_time=compile_time,
                interrupted=self.stop.set,
                diverged=self.diverged,
                **extra,
            )
            if self.members_diverged and "members" in summary:  # a seeds run's: each diverged member's record
                summary["members"] = [
                    dict(member, diverged=self.members_diverged[k]) if k in self.members_diverged else member
                    for k, member in enumerate(summary["members"])
                ]
            summary = strict_json(summary)  # a diverged member's final return may be NaN
            write_atomically(os.path.join(self.args.log_dir, "summary.json"), json.dumps(summary, indent=2).encode())
            if self.wandb:
                self.wandb.summary.update(summary)
                self.wandb.finish()
            print(
                f"{global_step} steps, {summary['wall_time']:.1f}s, fps {self.fps or 0:.0f}, return {final_return}, "
                f"logs in {self.args.log_dir}",
                file=sys.stderr,
            )
        if self.exit_code:
            sys.exit(self.exit_code)

    @property
    def exit_code(self) -> int:
        """1 if the run diverged or a final write failed, 130 if a signal stopped the run or came during its final
        writes, else 0."""
        if UNWRITTEN or self.diverged is not None:
            return 1
        return 130 if self.stop.set or self.stop.deferred else 0
