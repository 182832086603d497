"""TD3 for continuous control (MuJoCo through envpool, HalfCheetah-v4), cut into units that torch.compile and CUDA
graphs wrap.

The algorithm, networks and defaults of td3_continuous_action.py (CleanRL's). An update per env step costs mostly
Python and dispatch on a CPU, so the tricks remove machinery, each in the function that holds it:

- `QNetwork.twin_q`: the two Q-networks' parameters stacked on a leading dim and called once under torch.vmap.
- `update_critic`, `update_actor`: torch.func.grad and torch.optim's functional Adam (`adam_step`), so that compiled,
  each update is one graph (loss.backward() and optimizer.step() would each break it).
- `update_targets`: the Polyak average of the target actor and Q-parameters in one fused foreach lerp.
- `ReplayBuffer`: a transition is one row of one preallocated tensor: one copy per env step, a batch gathers rows.
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs);
  the loop draws the noise in batches from its own generator (a chunk's acting noise at once).

    python leanrl/td3_continuous_action_torchcompile.py --compile               # CPU or GPU
    python leanrl/td3_continuous_action_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the units
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
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.func import functional_call
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

    env_id: str = "HalfCheetah-v4"
    """the id of the environment (any continuous-action envpool task: MuJoCo's, Pendulum-v1, ...)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    num_envs: int = 1
    """the number of parallel game environments (TD3 here steps one env, as CleanRL's does)"""
    buffer_size: int = int(1e6)
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer (actor and critics)"""
    exploration_noise: float = 0.1
    """the scale of exploration noise (a fraction of the action range's half-width)"""
    learning_starts: int = int(25e3)
    """timestep to start learning (random actions until then)"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed): one actor and target update every this many critic updates"""
    noise_clip: float = 0.5
    """noise clip parameter of the Target Policy Smoothing Regularization"""
    policy_noise: float = 0.2
    """the scale of policy noise"""

    compile: bool = False
    """if toggled, wrap the critic and actor units in torch.compile, and on CUDA the policy and target-update units
    too (on a CPU, acting on one observation and a soft copy are not worth their compile)"""
    cudagraphs: bool = False
    """if toggled, wrap the units in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per metrics.jsonl row"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save networks and optimizers to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the checkpoint holds the replay buffer: the
    updates go on from the same transitions; the env starts a fresh episode)"""
    bf16: bool = False
    """if toggled, the updates run the networks' matrix products in bf16 (autocast; the losses and Adam stay fp32)"""
    num_threads: int = plumbing.cores()
    """torch intra-op threads (default: every core the process may use: the batch-256 updates are matrix products,
    which use them all; on a 2-core EPYC, --compile stepped at 208 (SAC) and 366 (TD3) steps/s on two threads, 126 and
    180 on one)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "mujoco", "td3")
    plumbing.positive(args, "total_timesteps", "buffer_size", "batch_size", "policy_frequency", "log_every")
    plumbing.positive_finite(args, "learning_rate")
    plumbing.non_negative_finite(args, "learning_starts", "exploration_noise", "noise_clip", "policy_noise")
    plumbing.unit_interval(args, "gamma", "tau")
    plumbing.require(args, lambda v: v == 1, "1 (one env, one update per step, as CleanRL's TD3)", "num_envs")
    if args.batch_size > args.buffer_size:
        plumbing.fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts >= args.total_timesteps:
        plumbing.fail(
            f"--learning-starts {args.learning_starts} leaves no update in --total-timesteps {args.total_timesteps}"
        )
    # the replay buffer: float32 observation and next observation, action, reward and done per transition
    n_obs, n_actions = plumbing.spaces(args.env_id)
    plumbing.check_memory(args, "mujoco", replay_buffer=args.buffer_size * (2 * n_obs + n_actions + 2) * 4)
    # the checkpoint's ring buffer goes back into one of its size: a smaller one cannot hold its rows or position
    return plumbing.check_run(args, SCRIPT, same=("env_id", "buffer_size"))


class ReplayBuffer:
    """A ring buffer preallocated on the learner's device: one tensor of whole transitions (obs, next_obs, actions,
    reward, termination) per row, seen as a TensorDict of columns. A step writes a row, a batch gathers rows."""

    def __init__(self, size: int, n_obs: int, n_actions: int, device):
        self.widths = dict(obs=n_obs, next_obs=n_obs, actions=n_actions, rewards=1, terminations=1)
        self.rows = torch.zeros(size, sum(self.widths.values()), device=device)
        self.data = self.split(self.rows)
        self.size = size
        self.pos = 0
        self.filled = 0

    def split(self, rows):
        cols = rows.split(list(self.widths.values()), dim=1)
        return TensorDict(
            {k: c.squeeze(1) if k in ("rewards", "terminations") else c for k, c in zip(self.widths, cols)},
            batch_size=rows.shape[:1],
        )

    def add(self, row: np.ndarray):
        self.rows[self.pos].copy_(torch.from_numpy(row), non_blocking=True)
        self.pos = (self.pos + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def sample(self, batch_size: int, rng: torch.Generator):
        inds = torch.randint(self.filled, (batch_size,), device=self.rows.device, generator=rng)
        return self.split(self.rows[inds])

    def state(self) -> dict:
        """The transitions written (every row once the ring has wrapped) and where the next one goes: the checkpoint's
        share, so that a resumed run's updates draw from the same transitions."""
        return dict(rows=self.rows[: self.filled].cpu(), pos=self.pos, filled=self.filled)

    def load(self, state: dict):
        """A checkpoint's transitions, copied into this buffer's own tensor (`data` views it)."""
        self.rows[: len(state["rows"])].copy_(state["rows"])
        self.pos = state["pos"]
        self.filled = state["filled"]


# CleanRL's networks: 256-unit MLPs with PyTorch's default init
class QNetwork(nn.Sequential):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__(
            nn.Linear(n_obs + n_actions, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
        )

    def forward(self, x, a):
        return super().forward(torch.cat([x, a], 1))

    def twin_q(self, q_params, obs, actions):
        """Both Q-networks in one call: their parameters are stacked on a leading dim of 2 (`stack_twins`), this
        network's architecture called on each under torch.vmap. Returns [2, batch]."""
        return torch.vmap(lambda p: functional_call(self, p, (obs, actions)))(q_params).squeeze(-1)


LOSSES = ("qf1_loss", "qf2_loss", "qf1_values", "actor_loss")  # logged, once there are any


class Actor(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, n_actions)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))
        self.register_buffer("low", torch.tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(high, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias


def stack_twins(qf1: nn.Module, qf2: nn.Module) -> dict:
    """The two Q-networks' parameters, each pair stacked on a leading dim of 2 (what `twin_q` calls)."""
    return {
        name: nn.Parameter(torch.stack([p1.detach(), p2.detach()]))
        for (name, p1), p2 in zip(qf1.named_parameters(), qf2.parameters())
    }


def make_optimizer(params: list, lr, capturable: bool):
    """torch.optim.Adam owns the state (its state_dict is checkpointed), created here: `adam_step` steps it. The lr
    is a tensor on the parameters' device: compiled code reads it, CUDA graphs need it there. `capturable` where the
    learner is on CUDA: the step counters live on the device, so a step reads nothing on the host and CUDA graphs can
    replay it."""
    optimizer = torch.optim.Adam(params, lr=torch.as_tensor(lr, device=params[0].device), capturable=capturable)
    for p in params:
        step = torch.zeros((), device=p.device if capturable else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def adam_step(optimizer, params: list, grads: list):
    """torch.optim.Adam's step in its functional form, on the optimizer's own state (see make_optimizer): with the
    gradients from torch.func.grad, a compiled update is one graph, which beats LeanRL's loss.backward() and
    optimizer.step() compiled (doc/compile.md)."""
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


def act(actor, exploration_noise: float, obs, noise):
    """One acting step (with the inference copy of the actor: the learner's storage, no autograd): the deterministic
    action plus N(0, 1) noise scaled by exploration_noise x the action range's half-width, clipped to the bounds."""
    return (actor(obs) + noise * actor.action_scale * exploration_noise).clamp(actor.low, actor.high)


def update_critic(
    target_actor, qnet, q_params, q_target, optimizer, args, obs, actions, rewards, next_obs, terminations, noise
):
    """One gradient step of both Q-networks; `noise` is N(0, 1) for the target policy smoothing.
    Returns [qf1_loss, qf2_loss, qf1_values]."""
    q_data = {name: p.detach() for name, p in q_params.items()}
    bf16 = torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16)
    with torch.no_grad():
        clipped_noise = (noise * args.policy_noise).clamp(-args.noise_clip, args.noise_clip) * target_actor.action_scale
        with bf16:
            next_actions = target_actor(next_obs).float()
        next_state_actions = (next_actions + clipped_noise).clamp(target_actor.low, target_actor.high)
        with bf16:
            min_qf_next_target = qnet.twin_q(q_target, next_obs, next_state_actions).float().min(0).values
        next_q_value = rewards + (1 - terminations) * args.gamma * min_qf_next_target

    def qf_loss(params):
        with bf16:
            q_a_values = qnet.twin_q(params, obs, actions).float()
        qf_losses = ((q_a_values - next_q_value) ** 2).mean(1)  # the two MSEs
        return qf_losses.sum(), torch.cat([qf_losses, q_a_values[0].mean().view(1)]).detach()

    grads, stats = torch.func.grad(qf_loss, has_aux=True)(q_data)
    adam_step(optimizer, list(q_params.values()), list(grads.values()))
    return stats


def update_actor(actor, qnet, q_params, optimizer, args, obs):
    """One gradient step of the actor on -Q1(s, actor(s)) (only the first Q-network, as in TD3). Returns [loss]."""
    q1_data = {name: p.detach()[0] for name, p in q_params.items()}

    def actor_loss(params):
        with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            pi = functional_call(actor, params, (obs,))
            q1 = functional_call(qnet, q1_data, (obs, pi))
        return -q1.float().mean()

    params = {name: p.detach() for name, p in actor.named_parameters()}
    grads, loss = torch.func.grad_and_value(actor_loss)(params)
    adam_step(optimizer, list(actor.parameters()), list(grads.values()))
    return loss.detach().view(1)


def update_targets(target_actor, q_target, actor, q_params, tau: float):
    """Polyak averaging of the target actor and Q-parameters in place, target += tau * (online - target): one call."""
    targets = list(target_actor.parameters()) + list(q_target.values())
    onlines = [p.detach() for p in actor.parameters()] + [p.detach() for p in q_params.values()]
    torch._foreach_lerp_(targets, onlines, tau)


def main(args: Args):
    ckpt = check_args(args)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)

    global_step = ckpt["global_step"] if ckpt else 0
    env = envpool.make(args.env_id, env_type="gymnasium", seed=plumbing.envpool_seed(args.seed + global_step))
    # the loop draws from its own generator: torch.compile's restore of the global one would replay its numbers
    rng = torch.Generator(device).manual_seed(args.seed)
    np_rng = np.random.default_rng(args.seed)  # the random actions before learning_starts
    n_obs = env.observation_space.shape[0]
    n_actions = env.action_space.shape[0]
    low = env.action_space.low
    high = env.action_space.high
    actor = Actor(n_obs, n_actions, low, high).to(device)
    qf1 = QNetwork(n_obs, n_actions).to(device)
    q_params = stack_twins(qf1, QNetwork(n_obs, n_actions).to(device))
    q_target = {name: p.data.clone() for name, p in q_params.items()}
    qnet = qf1.to("meta")  # the architecture alone: its twin_q calls it with the stacked parameters
    # the inference copy: the learner's storage as plain tensors without requires_grad
    actor_inference = Actor(n_obs, n_actions, low, high).to(device)
    target_actor = Actor(n_obs, n_actions, low, high).to(device)
    from_module(actor).data.to_module(actor_inference, preserve_module_state=False)
    target_actor.load_state_dict(actor.state_dict())  # the target starts as the actor
    target_actor.requires_grad_(False)
    q_optimizer = make_optimizer(list(q_params.values()), args.learning_rate, device.type == "cuda")
    actor_optimizer = make_optimizer(list(actor.parameters()), args.learning_rate, device.type == "cuda")

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs.
    policy = functools.partial(act, actor_inference, args.exploration_noise)
    critic_step = functools.partial(update_critic, target_actor, qnet, q_params, q_target, q_optimizer, args)
    actor_step = functools.partial(update_actor, actor, qnet, q_params, actor_optimizer, args)
    targets_step = functools.partial(update_targets, target_actor, q_target, actor, q_params, args.tau)
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        critic_step = torch.compile(critic_step)
        actor_step = torch.compile(actor_step)
        # acting on one obs and the soft target copy: on a CPU their compile costs seconds, buys no fps (doc/compile.md)
        if device.type == "cuda":
            policy = torch.compile(policy)
            targets_step = torch.compile(targets_step)
    if args.cudagraphs:
        policy = CudaGraphModule(policy)
        critic_step = CudaGraphModule(critic_step)
        actor_step = CudaGraphModule(actor_step)
        targets_step = CudaGraphModule(targets_step)

    episodes = plumbing.Episodes(1)
    rb = ReplayBuffer(args.buffer_size, n_obs, n_actions, device)
    # what a checkpoint holds, by these names: --resume loads them in place, --save-model writes them
    parts = dict(
        actor=actor,
        target_actor=target_actor,
        q_params=q_params,
        q_target=q_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        rng=rng,
        np_rng=np_rng,
        # the finished episodes' returns; the env starts a fresh episode, so the unfinished one's return is dropped
        episodes=episodes,
        buffer=rb,
    )
    if ckpt:
        plumbing.resume(ckpt, args.seed, restart=True, **parts)  # envpool cannot save its envs: new episodes
        del ckpt  # its copy of the replay buffer, now in the run's own, is not held for the whole run

    run = plumbing.Run(args, SCRIPT, device, args.total_timesteps, global_step)
    first_update = None
    act_noise = None
    compile_time = 0.0 if args.compile else None  # the seconds of the steps that ran a unit for the first time
    pending = {"policy", "critic", "actor", "targets"}  # the units not called yet
    losses = torch.zeros(len(LOSSES), device=device)
    obs, _ = env.reset()
    with run:
        while global_step < args.total_timesteps:
            if global_step % args.log_every == 0 or act_noise is None:  # a chunk begins: its acting noise at once
                act_noise = torch.randn(args.log_every, 1, n_actions, device=device, generator=rng)
                t_env = 0.0
                t_policy = 0.0
                t_update = 0.0
            t0 = time.perf_counter()
            n_pending = len(pending)
            if global_step < args.learning_starts:  # a fresh run explores uniformly first; a resumed one acts
                actions = np_rng.uniform(low, high, size=(1, n_actions)).astype(np.float32)
            else:
                obs_device = torch.from_numpy(obs).to(device, torch.float32)
                actions = policy(obs_device, act_noise[global_step % args.log_every]).cpu().numpy()
                pending.discard("policy")
            t1 = time.perf_counter()
            real_next_obs, rewards, terminations, truncations, _ = env.step(actions)
            dones = terminations | truncations
            episodes.record_one(float(rewards[0]), bool(dones[0]))
            next_obs = env.reset()[0] if dones[0] else real_next_obs  # reset now: envpool would spend a step on it
            t2 = time.perf_counter()
            rb.add(np.concatenate([obs[0], real_next_obs[0], actions[0], rewards, terminations], dtype=np.float32))
            obs = next_obs
            global_step += 1
            t_env += t2 - t1
            t_policy += t1 - t0

            if rb.filled > args.learning_starts:
                first_update = first_update or global_step
                data = rb.sample(args.batch_size, rng)
                noise = torch.randn(args.batch_size, n_actions, device=device, generator=rng)
                losses[:3] = critic_step(**data, noise=noise)
                if global_step % args.policy_frequency == 0:  # delayed: the actor and the targets move less often
                    losses[3:] = actor_step(data["obs"])
                    targets_step()
                    pending -= {"actor", "targets"}
                pending.discard("critic")
                t_update += time.perf_counter() - t2
            if args.compile and len(pending) < n_pending:  # a unit ran for the first time: it compiled in this step
                compile_time += time.perf_counter() - t0
                if not pending:
                    run.compiled()

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            run.log(
                global_step,
                # steady-state fps: env steps after learning_starts plus the burn-in
                steady=first_update is not None and global_step - first_update >= args.measure_burnin,
                episodic_return=episodes.mean(),
                t_env=t_env,
                t_policy=t_policy,
                t_update=t_update,
                buffer=rb.filled,
                **dict(zip(LOSSES, losses.tolist() if first_update else [None] * len(LOSSES))),  # one host sync
            )
            if run.stopping:
                break
    env.close()
    run.save(global_step=global_step, **parts)
    run.finish(global_step, episodes.mean(), compile_time)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
