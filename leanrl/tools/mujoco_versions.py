"""HalfCheetah-v4 on two simulators: envpool's (MuJoCo 3.6, what leanrl trains on) against gymnasium's on the MuJoCo
that is installed (CleanRL's published runs used gymnasium on MuJoCo 2.x). Both start from envpool's first state and
take the same actions; the tool prints how far their observations and rewards drift apart, beside a control: the
second simulator against itself, started `--nudge` apart. Drifts alike mean the two versions differ by rounding, which
HalfCheetah's chaos grows as it grows any other rounding, and not by their dynamics.

gymnasium's MuJoCo envs need the `mujoco` package, which leanrl's requirements leave out; in a separate environment:

    python -m venv /tmp/mj && . /tmp/mj/bin/activate
    pip install mujoco==2.3.7 imageio tyro -r requirements/requirements.txt
    python leanrl/tools/mujoco_versions.py
"""

import sys
from dataclasses import dataclass

import envpool
import gymnasium as gym
import numpy as np
import tyro


@dataclass
class Args:
    """HalfCheetah-v4: envpool's simulator against gymnasium's, from one state, under the same actions."""

    steps: int = 1000
    """steps to compare (an episode is 1000)"""
    seed: int = 1
    """seed of envpool's first state and of the random actions"""
    nudge: float = 1e-15
    """how far apart the control starts (added to the first position the observation holds)"""
    env_id: str = "HalfCheetah-v4"
    """the MuJoCo task (its envpool and gymnasium ids are the same)"""


def envpool_sim(env_id: str, seed: int):
    """envpool's simulator, reset: (its first observation, a step function of one action, the action's size)."""
    env = envpool.make(env_id, env_type="gymnasium", num_envs=1, seed=seed)
    obs, _ = env.reset()

    def step(action):
        obs, reward, *_ = env.step(action[None])
        return obs[0], float(reward[0])

    return obs[0], step, env.action_space.shape[-1]


def gymnasium_sim(env_id: str, first_obs: np.ndarray, nudge: float = 0.0):
    """gymnasium's simulator put in the state that `first_obs` shows (x position 0, which the observation leaves out
    and the dynamics do not depend on), the first observed position moved by `nudge`: a step function of one action."""
    env = gym.make(env_id)
    env.reset(seed=0)
    sim = env.unwrapped
    n_pos = sim.model.nq - 1  # the observation leaves out the x position
    qpos = np.concatenate([[0.0], first_obs[:n_pos]]).astype(np.float64)
    qpos[1] += nudge
    sim.set_state(qpos, first_obs[n_pos:].astype(np.float64))

    def step(action):
        obs, reward, *_ = env.step(action)
        return obs, float(reward)

    return step


def drift(step_a, step_b, steps: int, action_dim: int, seed: int) -> list:
    """(max |obs difference|, |reward difference|) at each step of the two step functions under the same actions."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(steps):
        action = rng.uniform(-1, 1, size=action_dim).astype(np.float32)
        obs_a, reward_a = step_a(action)
        obs_b, reward_b = step_b(action)
        rows.append((float(np.abs(obs_a - obs_b).max()), abs(reward_a - reward_b)))
    return rows


def main():
    args = tyro.cli(Args)
    try:
        import mujoco
    except ImportError:
        print(
            "error: gymnasium's MuJoCo envs need the mujoco package: see this tool's docstring (--help)",
            file=sys.stderr,
        )
        sys.exit(2)
    first_obs, envpool_step, action_dim = envpool_sim(args.env_id, args.seed)
    versus = drift(envpool_step, gymnasium_sim(args.env_id, first_obs), args.steps, action_dim, args.seed)
    control = drift(
        gymnasium_sim(args.env_id, first_obs),
        gymnasium_sim(args.env_id, first_obs, args.nudge),
        args.steps,
        action_dim,
        args.seed,
    )
    print(f"{args.env_id}: envpool {envpool.__version__} against gymnasium on MuJoCo {mujoco.__version__}")
    print(f"| step | obs, envpool vs gymnasium | reward | obs, gymnasium vs itself {args.nudge:g} apart | reward |")
    print("|---:|---:|---:|---:|---:|")
    for t in sorted({1, 10, 32, 100, 300, args.steps} & set(range(1, args.steps + 1))):
        (obs_v, reward_v), (obs_c, reward_c) = versus[t - 1], control[t - 1]
        print(f"| {t} | {obs_v:.2g} | {reward_v:.2g} | {obs_c:.2g} | {reward_c:.2g} |")


if __name__ == "__main__":
    main()
