"""DQN on Atari through envpool (Breakout-v5), cut into units that torch.compile and CUDA graphs wrap.

The algorithm, Nature CNN and defaults of dqn_atari_envpool.py (CleanRL's). Its tricks, each in the function that
holds it:

- `draw_choices`: the exploration of a chunk of steps drawn on the device at once, one transfer per chunk.
- `ReplayBuffer.add`, `ReplayBuffer.flush`: single frames staged in numpy, one copy per field into the device buffer
  per update.
- `update`, `adam_step`: the frame stacks rebuilt on the device (`stacks`), gradients from torch.func.grad and
  torch.optim's functional Adam, so that compiled, the whole TD step is one graph (loss.backward() and
  optimizer.step() would each break it); lr is a tensor.
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs).
  Their guards are checked at every call: skipping them saves next to nothing here (doc/compile.md).

    python leanrl/dqn_atari_envpool_torchcompile.py --compile               # CPU or GPU (the buffer takes 7.1 GB)
    python leanrl/dqn_atari_envpool_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the units
"""

import functools
import time
from dataclasses import dataclass
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from torch.optim.adam import adam

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
    """if toggled, wrap the act and update units in torch.compile, and the target unit on CUDA (on a CPU the target copy
    runs once every --target-network-frequency steps, not worth its compile)"""
    cudagraphs: bool = False
    """if toggled, wrap the act, update and target units in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
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
    num_threads: int = plumbing.cores()
    """torch intra-op threads (default: every core the process may use: the batch-32 convolution updates use them all,
    and two threads stepped faster than one on an idle 2-core CPU; on a busy machine pass 1 or pin the run, as two
    threads waiting on each other made the batch-1 acting forward many times slower; doc/offpolicy.md)"""


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


def act(q_network, obs):
    """The greedy action; the loop calls it only on the steps that do not explore (see draw_choices)."""
    with torch.no_grad():
        return q_network(obs).argmax(-1)


def stacks(fields: dict, inds):
    """The 4-frame stacks of slots `inds` (see dqn_atari_envpool.py's ReplayBuffer), gathered on the device."""
    back = torch.minimum(torch.arange(3, -1, -1, device=inds.device), fields["age"][inds].unsqueeze(1))
    return fields["frames"][(inds.unsqueeze(1) - back) % fields["frames"].shape[0]]


def update(q_network, target_network, optimizer, gamma: float, fields: dict, inds):
    """A TD step on the transitions at `inds`, returns [td_loss, mean Q]. Gradients from torch.func.grad, the step from
    torch.optim's functional Adam: compiled, one graph (loss.backward() and optimizer.step() would each break it)."""
    obs = stacks(fields, inds)
    next_obs = stacks(fields, (inds + 1) % fields["frames"].shape[0])
    actions = fields["actions"][inds]
    rewards = fields["rewards"][inds]
    dones = fields["dones"][inds]
    with torch.no_grad():
        td_target = rewards + gamma * target_network(next_obs).max(dim=1).values * (1 - dones)
    params = {name: p.detach() for name, p in q_network.named_parameters()}

    def td_loss(params):  # the loss, and [td_loss, mean Q] as torch.func.grad's aux
        q = torch.func.functional_call(q_network, params, (obs,)).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(td_target, q)
        return loss, torch.stack([loss, q.mean()]).detach()

    grads, stats = torch.func.grad(td_loss, has_aux=True)(params)
    adam_step(optimizer, list(q_network.parameters()), [grads[name] for name in params])
    return stats


def update_target(q_params: list, target_params: list, tau: float):
    with torch.no_grad():  # target <- tau * q + (1 - tau) * target, one foreach call (tau 1: a copy)
        torch._foreach_lerp_(target_params, q_params, tau)


def make_optimizer(q_network, lr, capturable: bool):
    """torch.optim.Adam owns the state (its state_dict is checkpointed), created here: `adam_step` steps it.
    `capturable` where the learner is on CUDA: the step counters live on the device, so a step reads nothing on the
    host and CUDA graphs can replay it."""
    optimizer = torch.optim.Adam(q_network.parameters(), lr=lr, capturable=capturable)
    for p in q_network.parameters():
        step = torch.zeros((), device=p.device if capturable else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def adam_step(optimizer, params: list, grads: list):
    """torch.optim.Adam's step in its functional form, on the optimizer's own state (see make_optimizer): with the
    gradients from torch.func.grad, a compiled update is one graph. On Breakout the convolutions take the time: LeanRL's
    loss.backward() and optimizer.step() measured within the runs' spread of it (doc/compile.md)."""
    state = [optimizer.state[p] for p in params]
    # the lr is the param group's, the tensor the loop anneals in place. CleanRL's float assignment works on a CPU
    # (compiled code re-traces once, at the first new value, then takes every value); on CUDA it is refused: a CUDA
    # graph would replay the float it captured
    group = optimizer.param_groups[0]
    if group["capturable"] and not torch.is_tensor(group["lr"]):
        raise TypeError("on CUDA the lr must stay the optimizer's tensor, annealed in place: lr.fill_(lrnow)")
    with torch.no_grad():
        adam(
            params,
            grads,
            [s["exp_avg"] for s in state],
            [s["exp_avg_sq"] for s in state],
            [],
            [s["step"] for s in state],
            foreach=False,
            capturable=group["capturable"],
            amsgrad=False,
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            lr=group["lr"],
            weight_decay=0.0,
            eps=group["eps"],
            maximize=False,
        )


def draw_choices(args: Args, rng: torch.Generator, start: int, n: int, n_actions: int, device):
    """Steps start..start+n-1 in one draw and one transfer: a random action where they explore, -1 where greedy."""
    explore = torch.rand(n, generator=rng, device=device) < epsilon_schedule(args, start, n, device)
    random_actions = torch.randint(n_actions, (n,), generator=rng, device=device)
    return torch.where(explore, random_actions, -1).tolist()


def epsilon_schedule(args: Args, start: int, n: int = 1, device=None) -> torch.Tensor:
    """CleanRL's linear schedule from start_e to end_e over exploration_fraction of the run, for n steps at once."""
    steps = torch.arange(start, start + n, device=device)
    frac = (steps / (args.exploration_fraction * args.total_timesteps)).clamp(max=1.0)
    return args.start_e + frac * (args.end_e - args.start_e)


class ReplayBuffer:
    """dqn_atari_envpool.py's ring buffer of single frames (7.1 GB at 1M; `stacks` rebuilds the 4-frame obs). A step is
    written once, into numpy staging rows; they reach the device in one copy per field at `flush`, before updates."""

    def __init__(self, size: int, device, stage: int):
        self.data = TensorDict(
            frames=torch.empty(size, 84, 84, dtype=torch.uint8),
            age=torch.zeros(size, dtype=torch.long),
            actions=torch.zeros(size, dtype=torch.long),
            rewards=torch.zeros(size),
            dones=torch.zeros(size),
            batch_size=[size],
            device=device,
        )
        self.fields = dict(self.data.items())  # the plain tensors: what `update` gathers from
        self.staged = {k: torch.zeros((stage,) + v.shape[1:], dtype=v.dtype).numpy() for k, v in self.fields.items()}
        self.size = size
        self.pos = 0
        self.full = False
        self.n = 0  # rows staged
        self.age = 0  # the steps since the game's reset
        self.lives = None  # the lives envpool gave out last
        self.resetting = False  # whether this step only resets the life or the game
        self.new_game = False  # whether that reset starts a new game (its stack holds only its first frame)
        self.pending = None  # after a resume: the lost game's next frame, for the reset slot that ends it

    def add(self, frame, action: int, reward: float, terminated: bool, truncated: bool, lives: int, game_over: bool):
        """One env step with envpool's outputs for it, as dqn_atari_envpool.py's: CleanRL's transitions, done at a lost
        life or game over; the step after an end only resets, its slot (the last obs) has action -1."""
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
        for staged, x in zip(self.staged.values(), (frame, self.age, action, reward, float(done))):  # fields' order
            staged[self.n] = x
        self.n += 1
        if self.n == len(self.staged["frames"]):
            self.flush()
        self.age = 0 if self.resetting and self.new_game else min(self.age + 1, 3)
        self.resetting = bool(terminated or truncated)
        self.new_game = bool(game_over or truncated)

    def flush(self):
        n = self.n
        first = min(n, self.size - self.pos)  # the staged rows may wrap around the end
        for key, x in self.staged.items():
            dst = self.fields[key]
            src = torch.from_numpy(x)
            dst[self.pos : self.pos + first].copy_(src[:first], non_blocking=True)
            dst[: n - first].copy_(src[first:n], non_blocking=True)
        self.full = self.full or self.pos + n >= self.size
        self.pos = (self.pos + n) % self.size
        self.n = 0

    def sample_indices(self, batch_size: int, generator) -> torch.Tensor:
        """`batch_size` transitions drawn uniformly from the slots a batch may hold (the next slot written, the stack
        not overwritten): twice as many drawn, the first transitions kept, on the device (dqn_atari_envpool.py's
        sample)."""
        first, count = ((self.pos + 3) % self.size, self.size - 4) if self.full else (0, self.pos - 1)
        draws = torch.randint(count, (2 * batch_size,), device=generator.device, generator=generator)
        slots = (first + draws) % self.size
        return slots[torch.argsort((self.fields["actions"][slots] < 0).to(torch.uint8), stable=True)[:batch_size]]

    def state(self, next_frame) -> dict:
        """The slots written (every slot once the ring has wrapped), where the next goes, the game's age and
        `next_frame`, the newest frame of the obs the loop holds: the checkpoint's share."""
        self.flush()
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
            self.fields[key][: len(rows)].copy_(rows)
        self.pos = state["pos"]
        self.full = state["full"]
        self.age = state["age"]
        self.pending = state["next_frame"].numpy()


def main(args: Args):
    ckpt = check_args(args)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)
    rng = torch.Generator(device).manual_seed(args.seed)  # the loop's own: torch.compile restores the global one

    global_step = ckpt["global_step"] if ckpt else 0
    env = make_env(args, seed=args.seed + global_step)
    n_actions = env.action_space.n
    q_network = QNetwork(n_actions).to(device)
    target_network = QNetwork(n_actions).to(device).requires_grad_(False)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, device, stage=args.train_frequency)
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: CUDA graphs capture it, changes need no re-trace
    optimizer = make_optimizer(q_network, lr, capturable=device.type == "cuda")

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs.
    policy = functools.partial(act, q_network)
    td_update = functools.partial(update, q_network, target_network, optimizer, args.gamma, rb.fields)
    target_update = functools.partial(
        update_target, list(q_network.parameters()), list(target_network.parameters()), args.tau
    )
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        # the convolutions dominate: no options (max_autotune would tune for minutes)
        policy = torch.compile(policy)
        td_update = torch.compile(td_update)
        # the target copy runs once every --target-network-frequency steps: on a CPU compiling it adds seconds to a
        # cold start and saves nothing a run shows (doc/compile.md)
        if device.type == "cuda":
            target_update = torch.compile(target_update)
    if args.cudagraphs:
        policy = CudaGraphModule(policy)
        td_update = CudaGraphModule(td_update)
        target_update = CudaGraphModule(target_update)

    # the real game's score: info["reward"] (unclipped) summed until info["terminated"] (all lives lost) or the time
    # limit; the 5-tuple's `terminated` is per life under episodic_life, and its reward is clipped
    episodes = plumbing.Episodes(1)
    # the run's parts, by the names the checkpoint holds them under (the buffer's part is saved its own way)
    parts = dict(q_network=q_network, target_network=target_network, optimizer=optimizer, rng=rng, episodes=episodes)
    if ckpt:
        # envpool can neither save its envs nor snapshot a game: they start new episodes, the game in flight is lost
        plumbing.resume(ckpt, args.seed, restart=True, **parts, buffer=rb)
        del ckpt  # its copy of the replay buffer, now in the run's own, is not held for the whole run
    obs, _ = env.reset()

    run = plumbing.Run(args, SCRIPT, device, args.total_timesteps, global_step)
    start_step = global_step
    clock = {}  # each unit's first call, timed: with --compile, its compilation
    compiling = args.compile
    stats = torch.zeros(args.log_every // args.train_frequency + 1, 2, device=device)
    n_updates = 0
    choices = ()
    k = 0
    t_env = 0.0
    t_policy = 0.0
    t_update = 0.0
    with run:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            if k == len(choices):  # the exploration of the next chunk of steps, up to the next log line
                n = min(args.log_every - global_step % args.log_every, args.total_timesteps - global_step)
                choices = draw_choices(args, rng, global_step, n, n_actions, device)
                k = 0
            action = choices[k]
            k += 1
            if action < 0:
                action = policy(torch.from_numpy(obs).to(device, non_blocking=True)).item()
                if "act" not in clock:
                    clock["act"] = time.perf_counter() - t0
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
                    rb.flush()
                    stats[n_updates] = td_update(rb.sample_indices(args.batch_size, rng))
                    n_updates += 1
                    if "update" not in clock:
                        clock["update"] = time.perf_counter() - t0
                if global_step % args.target_network_frequency == 0:
                    t_target = time.perf_counter()
                    target_update()
                    if "update_target" not in clock:
                        clock["update_target"] = time.perf_counter() - t_target
            t_update += time.perf_counter() - t0
            global_step += 1

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            td, qv = stats[:n_updates].mean(0).tolist() if n_updates else (None, None)  # the chunk's one host sync
            run.log(
                global_step,
                steady=global_step >= max(start_step, args.learning_starts) + args.measure_burnin,
                iteration=global_step // args.log_every,
                episodic_return=episodes.mean(),
                epsilon=epsilon_schedule(args, global_step - 1).item(),
                t_env=t_env,
                t_policy=t_policy,
                t_update=t_update,
                td_loss=td,
                q_values=qv,
                compiled=len(clock) == 3 if args.compile else None,
            )
            if compiling and len(clock) == 3:
                run.compiled()
                compiling = False
            t_env = 0.0
            t_policy = 0.0
            t_update = 0.0
            n_updates = 0
            if run.stopping:
                break
    env.close()
    # the buffer's state is built only if the checkpoint is written: a copy of the whole buffer
    run.save(**parts, global_step=global_step, buffer=lambda: rb.state(obs[0, -1]))
    run.finish(
        global_step,
        episodes.mean(),
        compile_time=sum(clock.values()) if args.compile else None,
        compile_times=clock if args.compile else None,
    )


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
