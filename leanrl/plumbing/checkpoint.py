"""What a checkpoint holds, and how a run goes back to it.

`agent.pt`, written by `Run.save` with `--save-model` (`save_checkpoint`, through `write_atomically`), read with
`torch.load(weights_only=True)` by `--resume` (`load_checkpoint`), is one dict:

- `script`: the writing script's name; another script's file is refused.
- `format`: CHECKPOINT_FORMAT (4). A format-3 file is read as format 4; an older one is refused in one line.
- `args`: the writing run's flags. `--resume` refuses another `--seed`, `--env-id` or a flag that sizes a stored part
  (the script's `same`), takes any other changed flag and says so (`check_changed`; HOW_IT_RUNS change nothing).
- `global_step` (and PPO's `iteration`): where the loop goes on.
- every other key, one part of the run under the name the script gives it in `run.save(...)` and
  `plumbing.resume(...)`, as `state_of` holds it:

  | part                                          | held as                                                |
  |-----------------------------------------------|--------------------------------------------------------|
  | module, optimizer                             | its `state_dict()`                                     |
  | torch.Generator (`rng`, `torch_rng`, ...)     | `{state, device}`: re-seeded on another device kind    |
  | numpy Generator (`np_rng`)                    | its bit generator's state                              |
  | tensor, numpy array (`next_obs`, `log_alpha`) | a CPU tensor, copied back in place (same shape, dtype) |
  | gymnasium env (`env`)                         | `env_state` of each env; None where it cannot be saved |
  | episode record (`episodes`)                   | its `state()`                                          |
  | replay buffer, normalizer (`buffer`, ...)     | its `state_dict()` or `state()`                        |
  | dict, list                                    | part by part                                           |
  | a function                                    | its result, computed only when the file is written     |

  A DDP run adds `world_size` and `ranks` (each rank's generator and episodes); a seeds run holds its per-member
  parts stacked along their first dimension, with `diverged` (members.py).

`resume` puts each part back in place, by the same names (`load_part`): modules, optimizers under this run's settings
(`load_optimizer`), generators (`restore_rngs`), envs, episodes, buffers, tensors.
"""

import os
import sys
from dataclasses import asdict
from typing import Optional

import numpy as np
import torch

from .envs import (
    env_state,
    is_env,
    set_env_state,
    set_vector_env_state,
    vector_env_state,
)
from .episodes import Episodes, MemberAtariEpisodes, MemberEpisodes
from .flags import fail, flag
from .logdir import write_atomically

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
