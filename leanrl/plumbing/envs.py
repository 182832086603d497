"""The envs: which script takes an env id, an env's sizes and seeds, and what a checkpoint holds of one.

- `check_env_id`: an env id of the wrong family names the script that takes it (`env_family`, `envpool_name`).
- `spaces`: the numbers in an observation and the actions, read from envpool's spec without building the env.
- `envpool_seed`: a derived env seed within envpool's int32.
- `env_state`, `set_env_state` (and their vector forms): everything that moves in a gymnasium classic-control env,
  so that a resumed run goes on bit for bit.
"""

import math
import sys
from typing import Optional

import numpy as np
import torch

from .flags import fail

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


def spaces(env_id: str) -> tuple:
    """(numbers in one observation, actions: their count if discrete, else their dimensions), from envpool's spec of
    the env without building it (it ships every env id `env_family` takes)."""
    import envpool

    spec = envpool.make_spec(env_id)
    obs, act = spec.observation_space, spec.action_space
    return math.prod(obs.shape), int(act.n) if hasattr(act, "n") else math.prod(act.shape)


def envpool_seed(seed: int) -> int:
    """A derived env seed (seed + an env's index, a member's, a resumed run's step) as envpool takes it: an int32,
    which envpool.make asserts. Wrapped in 32 bits as envpool itself wraps the seed of env i of a pool (seed + i), so
    that a pool of its own gives an env the seed it has in one big pool."""
    return (seed + 2**31) % 2**32 - 2**31


def is_env(part, vector: bool) -> bool:
    """A gymnasium env (`vector`: a vector env of them), whose state `env_state` takes."""
    if "gymnasium" not in sys.modules:
        return False
    import gymnasium as gym

    return isinstance(part, gym.vector.VectorEnv if vector else gym.Env)


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
