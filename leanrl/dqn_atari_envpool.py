"""DQN on Atari through envpool (Breakout-v5): the eager baseline.

CleanRL's `dqn_atari.py` algorithm, Nature CNN and defaults, with envpool's Atari preprocessing as in our PPO Atari
scripts, written plainly: one env, epsilon-greedy acting decided on the host, a replay buffer written one transition
at a time, one autograd step per update. It is the yardstick dqn_atari_envpool_torchcompile.py is measured against.

    python leanrl/dqn_atari_envpool.py                  # 10M steps of Breakout-v5 (the buffer takes 7.1 GB)
    python leanrl/dqn_atari_envpool.py --compile        # the same code under a naive torch.compile of the Q-network
"""

import time
from dataclasses import dataclass
from typing import Optional

import envpool
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
    """not supported with envpool (it renders no frames): refused with one line (the flag exists so that every
    script takes the same flags)"""

    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (DQN here steps one, as CleanRL's does)"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions, one 84x84 frame each: 7.1 GB at 1M)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 1000
    """the timesteps it takes to update the target network"""
    batch_size: int = 32
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 80000
    """timestep to start learning"""
    train_frequency: int = 4
    """the frequency of training"""

    compile: bool = False
    """if toggled, wrap the Q-network and the target network in torch.compile (the naive one-liner; see
    dqn_atari_envpool_torchcompile.py)"""
    cudagraphs: bool = False
    """not in this eager baseline: CUDA graphs need the act/update/target units of
    dqn_atari_envpool_torchcompile.py (refused on CUDA, ignored without)"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per line of metrics.jsonl"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the networks and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the checkpoint holds the replay buffer; envpool
    cannot snapshot the game in flight, which ends there as a time limit would end it, and a new game starts)"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: torch's own, as in CleanRL: the baseline is measured as its users run it)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "atari", "dqn")
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
        plumbing.fail(
            "--cudagraphs: dqn_atari_envpool.py is the eager baseline; CUDA graphs need the units of "
            "dqn_atari_envpool_torchcompile.py"
        )
    # the replay buffer: one uint8 84x84 frame, its age and action (int64), reward and done per transition
    plumbing.check_memory(args, "atari", replay_buffer=args.buffer_size * (84 * 84 + 24))
    return plumbing.check_run(args, SCRIPT, same=("env_id", "buffer_size"), video=False)


def make_env(args: Args, seed: int):
    # CleanRL's settings, as in our PPO Atari scripts: 84x84 grey, 4 stacked, frameskip 4, a life is an episode,
    # reward sign
    return envpool.make(
        args.env_id, env_type="gym", num_envs=1, episodic_life=True, reward_clip=True, seed=plumbing.envpool_seed(seed)
    )


class QNetwork(nn.Sequential):
    """The Nature CNN: uint8 frames in (scaled to [0, 1] here), one Q-value per action out."""

    def __init__(self, n_actions: int):
        super().__init__(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, x):
        return super().forward(x / 255.0)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e) if end_e <= start_e else min(slope * t + start_e, end_e)


class ReplayBuffer:
    """A preallocated ring buffer on the learner's device that keeps one 84x84 uint8 frame per slot: 7.1 GB for the
    default million (stacked 4-frame obs and next obs would take 56 GB). A slot holds the newest frame of an obs and
    `age`, the steps since its game's reset (0-3), and for a transition the action taken from that obs, the clipped
    reward and done. A slot's 4-frame stack is rebuilt from the slots before it; envpool fills a fresh game's stack with
    its first frame, so an offset reaching back past the reset stops at the game's first slot. Its next obs is the next
    slot's stack.

    The transitions are CleanRL's: one per step the agent took, done when it lost a life or the game (EpisodicLifeEnv);
    a truncation by the time limit is not done and bootstraps from the last obs. Envpool's step after any of these ends
    only resets (no-ops and FIRE, the action ignored, reward 0) and is no transition: its slot holds the obs it started
    from, the last obs of the life or game (the truncated step's next obs; a new life's stack goes on from it), with
    action -1, and is never sampled. Frames are allocated with torch.empty: memory is touched as the buffer fills."""

    def __init__(self, size: int, device):
        self.data = TensorDict(
            frames=torch.empty(size, 84, 84, dtype=torch.uint8),
            age=torch.zeros(size, dtype=torch.long),
            actions=torch.zeros(size, dtype=torch.long),
            rewards=torch.zeros(size),
            dones=torch.zeros(size),
            batch_size=[size],
            device=device,
        )
        self.offsets = torch.tensor([3, 2, 1, 0], device=device)
        self.size = size
        self.pos = 0
        self.full = False
        self.age = 0  # the steps since the game's reset
        self.lives = None  # the lives envpool gave out last
        self.resetting = False  # whether this step only resets the life or the game
        self.new_game = False  # whether that reset starts a new game (its stack holds only its first frame)
        self.pending = None  # after a resume: the lost game's next frame, for the reset slot that ends it

    def add(self, frame, action: int, reward: float, terminated: bool, truncated: bool, lives: int, game_over: bool):
        """One env step from an obs whose newest frame is `frame`, with envpool's outputs for it: `terminated` and
        `truncated` from the 5-tuple, `lives` and `game_over` (info["terminated"]) from its info. Done is a lost life
        or game over, also where envpool reports them as a truncation because the time limit came at the same step."""
        if self.pending is not None:  # resumed: the lost game ends first, as a truncation ends one (see `load`)
            frame_after = self.pending
            self.pending = None
            self.resetting = True
            self.new_game = True
            self.add(frame_after, -1, 0.0, False, False, lives, False)
        lost = self.lives is not None and 0 < lives < self.lives
        self.lives = lives
        if self.resetting:
            action, reward, done = -1, 0.0, True
        else:
            done = bool(game_over or lost)
        self.data[self.pos] = TensorDict(
            frames=torch.as_tensor(frame),
            age=torch.tensor(self.age),
            actions=torch.tensor(action),
            rewards=torch.tensor(float(reward)),
            dones=torch.tensor(float(done)),
            device=self.data.device,
        )
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0
        self.age = 0 if self.resetting and self.new_game else min(self.age + 1, 3)
        self.resetting = bool(terminated or truncated)
        self.new_game = bool(game_over or truncated)

    def sampleable(self):
        """(first slot, count) of the slots a batch may hold: a next slot written, a stack not overwritten."""
        return ((self.pos + 3) % self.size, self.size - 4) if self.full else (0, self.pos - 1)

    def stacks(self, inds):
        back = torch.minimum(self.offsets, self.data["age"][inds].unsqueeze(1))
        return self.data["frames"][(inds.unsqueeze(1) - back) % self.size]

    def sample(self, batch_size: int, generator=None) -> TensorDict:
        """`batch_size` transitions drawn uniformly: twice as many slots drawn, the first `batch_size` transitions among
        them kept. A reset slot comes once a life (one slot in 25 for a random agent in Breakout): fewer than 32
        transitions among 64 draws has a chance of 4e-29 (the batch would then hold a reset slot, done, reward 0)."""
        first, count = self.sampleable()
        draws = torch.randint(count, (2 * batch_size,), device=self.data.device, generator=generator)
        slots = (first + draws) % self.size
        inds = slots[torch.argsort((self.data["actions"][slots] < 0).to(torch.uint8), stable=True)[:batch_size]]
        batch = self.data[inds].exclude("frames", "age")
        return batch.update(dict(obs=self.stacks(inds), next_obs=self.stacks((inds + 1) % self.size)))

    def state(self, next_frame) -> dict:
        """The slots written (every slot once the ring has wrapped), where the next goes, the game's age and
        `next_frame`, the newest frame of the obs the loop holds: the checkpoint's share."""
        rows = slice(None) if self.full else slice(0, self.pos)
        return dict(
            data=self.data[rows].cpu().to_dict(),
            pos=self.pos,
            full=self.full,
            age=self.age,
            next_frame=torch.as_tensor(next_frame).cpu(),
        )

    def load(self, state: dict):
        """A checkpoint's slots, copied into this buffer's own tensors. envpool cannot snapshot the game in flight: it
        ends as a truncation ends a game, its next frame in the slot of the reset that follows (never sampled; its last
        transition bootstraps from it), written by the next `add`, which plays a new game."""
        for key, rows in state["data"].items():
            self.data[key][: len(rows)].copy_(rows)
        self.pos = state["pos"]
        self.full = state["full"]
        self.age = state["age"]
        self.pending = state["next_frame"].numpy()


def main(args: Args):
    ckpt = check_args(args)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    rng = np.random.default_rng(args.seed)
    device = plumbing.pick_device(args)

    env = make_env(args, seed=args.seed + (ckpt["global_step"] if ckpt else 0))
    n_actions = env.action_space.n
    q_network = QNetwork(n_actions).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    q_forward = q_network
    target_forward = target_network
    if args.compile:
        q_forward = torch.compile(q_network)
        target_forward = torch.compile(target_network)
    rb = ReplayBuffer(args.buffer_size, device)
    # the real game's score: info["reward"] (unclipped) summed until info["terminated"] (all lives lost) or the time
    # limit; the 5-tuple's `terminated` is per life under episodic_life, and its reward is clipped
    episodes = plumbing.Episodes(1)
    global_step = 0
    if ckpt:
        plumbing.resume(
            ckpt,
            args.seed,
            restart=True,  # envpool cannot save its envs: they start new episodes
            q_network=q_network,
            target_network=target_network,
            optimizer=optimizer,
            torch_rng=torch.default_generator,
            device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
            np_rng=rng,
            episodes=episodes,  # envpool cannot snapshot a game: the one in flight is lost
            buffer=rb,
        )
        global_step = ckpt["global_step"]
        del ckpt  # its copy of the replay buffer, now in the run's own, is not held for the whole run
    obs, _ = env.reset()

    run = plumbing.Run(args, SCRIPT, device, args.total_timesteps, global_step)
    start_step = global_step
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
            next_obs, reward, terminated, truncated, info = env.step(np.array([action]))
            t_env += time.perf_counter() - t1
            t_policy += t1 - t0
            game_over = np.logical_or(info["terminated"], truncated)
            episodes.record(info["reward"], game_over)
            rb.add(obs[0, -1], action, reward[0], terminated[0], truncated[0], info["lives"][0], info["terminated"][0])
            obs = next_obs

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
                steady=global_step >= max(start_step, args.learning_starts) + args.measure_burnin,
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
        global_step=global_step,
        torch_rng=torch.default_generator,
        device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
        np_rng=rng,
        episodes=episodes,
        buffer=lambda: rb.state(obs[0, -1]),  # built only if the checkpoint is written: a copy of the whole buffer
    )
    run.finish(global_step, episodes.mean(), compile_time=first_update if args.compile else None)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
