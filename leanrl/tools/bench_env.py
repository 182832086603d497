"""The environments alone: steps/s of a PPO family's vector env stepped with random actions and no policy, built
as that family's training scripts build it. This is the ceiling a training script's fps is measured against
(run.sh's `env-alone` column): a script at 85% of it loses 15% of its time to acting, staging and updating.

    python leanrl/tools/bench_env.py --family atari --total-timesteps 102400     # Breakout-v5, 8 envs
    python leanrl/tools/bench_env.py --family mujoco --num-envs 4

It writes summary.json and metrics.jsonl like a training script (no returns: a random policy's are meaningless), so
run.sh and report.py treat it as one more configuration. Actions are drawn ahead, an iteration at a time, so a step
costs the env call and nothing else.
"""

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Literal, Optional

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # plumbing/ is one folder up
import plumbing

DEFAULTS = {  # the training scripts' default env and env count per family
    "classic": ("CartPole-v1", 4),
    "atari": ("Breakout-v5", 8),
    "mujoco": ("HalfCheetah-v4", 1),
}


@dataclass
class Args:
    """The environments alone: steps/s of a PPO family's vector env stepped with random actions and no policy."""

    family: Literal["classic", "atari", "mujoco"] = "atari"
    """whose environments: classic control (gymnasium's SyncVectorEnv, as ppo.py), Atari (envpool with CleanRL's
    settings, as ppo_atari_envpool.py) or MuJoCo (envpool with the reset-at-once of ppo_continuous_action.py)"""
    env_id: Optional[str] = None
    """the env id (default: the family's, CartPole-v1, Breakout-v5 or HalfCheetah-v4)"""
    num_envs: Optional[int] = None
    """parallel envs (default: the family's training default, 4, 8 or 1)"""
    num_steps: int = 128
    """steps per env in one iteration (one metrics line), as a training script's rollout"""
    total_timesteps: int = 102400
    """env steps in all (over every env)"""
    measure_burnin: int = 2
    """iterations left out of the fps (the envs' threads and caches warm up)"""
    seed: int = 1
    """seed of the envs and of the random actions"""
    log_dir: Optional[str] = None
    """where summary.json and metrics.jsonl go (default: runs/<env_id>__bench_env__<seed>__<time>)"""


def check_args(args: Args):
    env_id, num_envs = DEFAULTS[args.family]
    args.env_id = env_id if args.env_id is None else args.env_id
    args.num_envs = num_envs if args.num_envs is None else args.num_envs
    for name in ("num_envs", "num_steps", "total_timesteps"):
        if getattr(args, name) < 1:
            plumbing.fail(f"--{name.replace('_', '-')} must be at least 1")
    if args.measure_burnin < 0:
        plumbing.fail("--measure-burnin must be 0 or more")
    if not 0 <= args.seed < 2**31:
        plumbing.fail("--seed must be in [0, 2**31) (envpool's seeds are int32)")
    if args.total_timesteps < args.num_envs * args.num_steps:
        plumbing.fail(
            f"--total-timesteps {args.total_timesteps} is less than one iteration of "
            f"{args.num_envs * args.num_steps} steps (num_envs x num_steps)"
        )
    if args.log_dir is not None:
        plumbing.check_log_dir(args)
    default = f"runs/{args.env_id}__bench_env__{args.seed}__{int(time.time())}"
    try:
        args.log_dir = args.log_dir or plumbing.new_folder(default)
        os.makedirs(args.log_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.log_dir).close()
    except OSError as e:
        plumbing.fail(f"--log-dir {args.log_dir or default}: cannot write there ({e.strerror or e})")


def make_envs(args: Args):
    """The family's vector env, and a function that steps it once with a batch of actions."""
    if args.family == "classic":
        import gymnasium as gym

        try:
            envs = gym.vector.SyncVectorEnv(
                [lambda: gym.make(args.env_id)] * args.num_envs,
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
                copy=False,
            )
        except gym.error.Error as e:
            plumbing.fail(f"--env-id {args.env_id}: not a gymnasium env ({e})")
        envs.reset(seed=args.seed)
        return envs, envs.single_action_space, envs.step
    import envpool

    family = envpool.registration.registry.specs.get(args.env_id, ("",))[0]
    if ("atari" in family) != (args.family == "atari") or ("mujoco" in family) != (args.family == "mujoco"):
        plumbing.fail(f"--env-id {args.env_id} is not an envpool {args.family} task")
    if args.family == "atari":
        envs = envpool.make(
            args.env_id, env_type="gym", num_envs=args.num_envs, episodic_life=True, reward_clip=True, seed=args.seed
        )
        envs.reset()
        return envs, envs.action_space, envs.step
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=args.seed)
    envs.reset()

    def step(action):  # the training scripts reset an ended env at once (envpool would spend a dead step on it)
        out = envs.step(action)
        done = out[2] | out[3]
        if done.any():
            envs.reset(np.flatnonzero(done))
        return out

    return envs, envs.action_space, step


def random_actions(space, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    if hasattr(space, "n"):
        return rng.integers(0, space.n, shape)
    return rng.uniform(space.low, space.high, shape + space.shape).astype(np.float32)


def main(args: Args):
    check_args(args)
    envs, action_space, step = make_envs(args)
    rng = np.random.default_rng(args.seed)
    # the machine's CPU and GPU, for the report (the envs step on the CPU)
    machine = plumbing.machine_info(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    batch = args.num_envs * args.num_steps
    iterations = args.total_timesteps // batch
    fps = None
    mark = None  # (time, step) the fps counts from
    global_step = 0
    start = time.perf_counter()
    with open(os.path.join(args.log_dir, "metrics.jsonl"), "w", buffering=1) as metrics:
        try:
            for iteration in range(1, iterations + 1):
                t0 = time.perf_counter()
                if iteration == args.measure_burnin + 1:
                    mark = (t0, global_step)
                actions = random_actions(action_space, (args.num_steps, args.num_envs), rng)
                for t in range(args.num_steps):
                    step(actions[t])
                now = time.perf_counter()
                global_step += batch
                fps = (global_step - mark[1]) / (now - mark[0]) if mark else None
                metrics.write(
                    json.dumps(
                        dict(
                            iteration=iteration,
                            global_step=global_step,
                            time=now - start,
                            fps=fps,
                            episodic_return=None,
                            t_env=now - t0,
                        )
                    )
                    + "\n"
                )
        except KeyboardInterrupt:
            print("\nstopped: the lines so far are in metrics.jsonl", file=sys.stderr)
    envs.close()
    summary = dict(
        script="bench_env",
        env_id=args.env_id,
        seed=args.seed,
        flags=asdict(args),
        device="cpu",
        torch=torch.__version__,
        cpu=machine["cpu"],
        gpu=machine["gpu"],
        num_threads=None,
        total_timesteps=args.total_timesteps,
        global_step=global_step,
        wall_time=time.perf_counter() - start,
        fps=fps,
        final_return=None,
        compile_time=None,
    )
    data = json.dumps(summary, indent=2).encode()
    if not plumbing.write_atomically(os.path.join(args.log_dir, "summary.json"), data):
        sys.exit(1)  # a full disk: it said so, and run.sh must not take the run for a finished one
    print(f"{args.env_id} x {args.num_envs}, random actions: {fps or 0:,.0f} steps/s", file=sys.stderr)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
