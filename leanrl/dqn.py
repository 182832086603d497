"""DQN on discrete classic control (CartPole-v1): the eager baseline.

CleanRL's `dqn.py` algorithm, Q-network and defaults, written plainly: one env, epsilon-greedy acting decided on
the host, a replay buffer written one transition at a time, one autograd step per update. It is the yardstick
dqn_torchcompile.py is measured against.

    python leanrl/dqn.py                      # 500k steps of CartPole-v1
    python leanrl/dqn.py --compile            # the same code under a naive torch.compile of the Q-network
"""

import time
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict

import plumbing

SCRIPT = plumbing.script_name(__file__)


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment, recorded with the flags (summary.json, wandb's config); the log dir is
    --log-dir's, by default named after the script"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "leanrl"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (into `<log_dir>/videos`; needs pygame and moviepy)"""

    env_id: str = "CartPole-v1"
    """the id of the environment (discrete-action classic control or Box2D: CartPole-v1, LunarLander-v3, ...)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (DQN here steps one, as CleanRL's does)"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 500
    """the timesteps it takes to update the target network"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 10000
    """timestep to start learning"""
    train_frequency: int = 10
    """the frequency of training"""

    compile: bool = False
    """if toggled, wrap the Q-network and the target network in torch.compile (the naive one-liner; see
    dqn_torchcompile.py)"""
    cudagraphs: bool = False
    """not in this eager baseline: CUDA graphs need the act/update/target units of dqn_torchcompile.py (refused
    on CUDA, ignored without)"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per line of metrics.jsonl"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the networks, optimizer and replay buffer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped (the env's state too: with
    the same flags the resumed run goes on as if never stopped)"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: torch's own, as in CleanRL: the baseline is measured as its users run it)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "classic", "dqn")
    plumbing.positive(
        args, "total_timesteps", "buffer_size", "target_network_frequency", "batch_size", "train_frequency", "log_every"
    )
    plumbing.positive_finite(args, "learning_rate")
    plumbing.require(args, lambda v: v >= 0, "non-negative", "learning_starts")
    plumbing.unit_interval(args, "gamma", "tau", "exploration_fraction")
    plumbing.probability(args, "start_e", "end_e")
    plumbing.require(args, lambda v: v == 1, "1 (this DQN steps one env, as CleanRL's does)", "num_envs")
    if args.batch_size > args.buffer_size:
        plumbing.fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.end_e > args.start_e:
        plumbing.fail(f"--end-e {args.end_e} must not exceed --start-e {args.start_e}: epsilon anneals down")
    if args.learning_starts >= args.total_timesteps:
        plumbing.fail(
            f"--learning-starts {args.learning_starts} must be less than --total-timesteps {args.total_timesteps}"
        )
    if args.cudagraphs and args.cuda and torch.cuda.is_available():
        plumbing.fail("--cudagraphs: dqn.py is the eager baseline; CUDA graphs need the units of dqn_torchcompile.py")
    # the replay buffer: float32 observation and next observation, an int64 action, reward and done per transition
    n_obs = plumbing.spaces(args.env_id)[0]
    plumbing.check_memory(args, "classic", replay_buffer=args.buffer_size * (2 * n_obs * 4 + 16))
    return plumbing.check_run(args, SCRIPT, same=("env_id", "buffer_size"), video=True)


def make_env(args: Args, video_dir: str):
    # One plain env, reset by hand: 112k steps/s here, against 71k for gymnasium's SyncVectorEnv of one and 23k for
    # envpool (its per-call overhead dominates at one CartPole).
    if args.capture_video:
        return gym.wrappers.RecordVideo(gym.make(args.env_id, render_mode="rgb_array"), video_dir)
    return gym.make(args.env_id)


class QNetwork(nn.Sequential):
    """CleanRL's Q-network: a 120-84 MLP with one output per action."""

    def __init__(self, n_obs: int, n_actions: int):
        super().__init__(nn.Linear(n_obs, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions))


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e) if end_e <= start_e else min(slope * t + start_e, end_e)


class ReplayBuffer:
    """A preallocated ring buffer on the learner's device: the oldest transition is overwritten when it is full."""

    def __init__(self, size: int, n_obs: int, device):
        self.data = TensorDict(
            obs=torch.zeros(size, n_obs),
            next_obs=torch.zeros(size, n_obs),
            actions=torch.zeros(size, dtype=torch.long),
            rewards=torch.zeros(size),
            dones=torch.zeros(size),
            batch_size=[size],
            device=device,
        )
        self.size = size
        self.pos = 0
        self.full = False

    def __len__(self):
        return self.size if self.full else self.pos

    def add(self, transition: TensorDict):
        self.data[self.pos] = transition
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch_size: int, generator=None) -> TensorDict:
        return self.data[torch.randint(len(self), (batch_size,), device=self.data.device, generator=generator)]

    def state(self) -> dict:
        """The rows and where the next one goes: the checkpoint's share."""
        return dict(data=self.data.to_dict(), pos=self.pos, full=self.full)

    def load(self, state: dict):
        self.data.update(TensorDict(state["data"], batch_size=[self.size]).to(self.data.device))
        self.pos = state["pos"]
        self.full = state["full"]


def main(args: Args):
    ckpt = check_args(args)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    rng = np.random.default_rng(args.seed)
    device = plumbing.pick_device(args)

    env = make_env(args, f"{args.log_dir}/videos")
    n_obs = env.observation_space.shape[0]
    n_actions = env.action_space.n
    q_network = QNetwork(n_obs, n_actions).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(n_obs, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    q_forward = q_network
    target_forward = target_network
    if args.compile:
        q_forward = torch.compile(q_network)
        target_forward = torch.compile(target_network)
    rb = ReplayBuffer(args.buffer_size, n_obs, device)
    episodes = plumbing.Episodes(1)
    global_step = ckpt["global_step"] if ckpt else 0
    obs, _ = env.reset(seed=args.seed + global_step)
    if ckpt:
        # the envs go on where the checkpoint left them; where it could not hold them (Box2D), new episodes
        restart = not plumbing.env_saved(ckpt)
        plumbing.resume(
            ckpt,
            args.seed,
            restart=restart,
            q_network=q_network,
            target_network=target_network,
            optimizer=optimizer,
            buffer=rb,
            torch_rng=torch.default_generator,
            device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
            np_rng=rng,
            episodes=episodes,
            **({} if restart else dict(env=env, obs=obs)),
        )
        del ckpt  # its copy of the replay buffer, now in the run's own, is not held for the whole run

    run = plumbing.Run(args, SCRIPT, device, args.total_timesteps, global_step)
    first_update = None  # the first update's time: with --compile, the compilation
    compiling = args.compile
    losses = []
    q_values = []
    t_env = 0.0
    t_policy = 0.0
    t_update = 0.0
    with run:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            epsilon = linear_schedule(
                args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
            )
            if rng.random() < epsilon:
                action = int(rng.integers(n_actions))
            else:
                with torch.no_grad():
                    action = int(q_forward(torch.as_tensor(obs, device=device)).argmax().item())
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            t_env += time.perf_counter() - t1
            t_policy += t1 - t0
            episodes.record_one(reward, terminated or truncated)
            # the transition keeps the true last obs: a truncated episode still bootstraps from it (CleanRL's rule)
            transition = TensorDict(
                obs=torch.as_tensor(obs),
                next_obs=torch.as_tensor(next_obs),
                actions=torch.tensor(action),
                rewards=torch.tensor(reward, dtype=torch.float32),
                dones=torch.tensor(float(terminated)),
                device=device,
            )
            rb.add(transition)
            obs = env.reset()[0] if terminated or truncated else next_obs

            t0 = time.perf_counter()
            if global_step > args.learning_starts:
                if global_step % args.train_frequency == 0:
                    data = rb.sample(args.batch_size)
                    with torch.no_grad():
                        target_max, _ = target_forward(data["next_obs"]).max(dim=1)
                        td_target = data["rewards"] + args.gamma * target_max * (1 - data["dones"])
                    old_val = q_forward(data["obs"]).gather(1, data["actions"].unsqueeze(1)).squeeze(1)
                    loss = F.mse_loss(td_target, old_val)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.item())
                    q_values.append(old_val.mean().item())
                    if first_update is None:
                        first_update = time.perf_counter() - t0
                if global_step % args.target_network_frequency == 0:
                    for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)
            t_update += time.perf_counter() - t0
            global_step += 1

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            run.log(
                global_step,
                steady=global_step >= args.learning_starts + args.measure_burnin,
                iteration=global_step // args.log_every,
                episodic_return=episodes.mean(),
                epsilon=epsilon,
                t_env=t_env,
                t_policy=t_policy,
                t_update=t_update,
                td_loss=float(np.mean(losses)) if losses else None,
                q_values=float(np.mean(q_values)) if q_values else None,
            )
            if compiling and first_update is not None:
                run.compiled()
                compiling = False
            t_env = 0.0
            t_policy = 0.0
            t_update = 0.0
            losses = []
            q_values = []
            if run.stopping:
                break
    env.close()
    run.save(
        q_network=q_network,
        target_network=target_network,
        optimizer=optimizer,
        buffer=rb,
        global_step=global_step,
        torch_rng=torch.default_generator,
        device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
        np_rng=rng,
        episodes=episodes,
        env=env,
        obs=obs,
    )
    run.finish(global_step, episodes.mean(), compile_time=first_update if args.compile else None)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
