"""SAC for continuous control (MuJoCo through envpool, HalfCheetah-v4): the eager baseline.

CleanRL's `sac_continuous_action.py` algorithm, networks and defaults, written plainly: twin soft Q-networks and
their targets, a tanh-squashed Gaussian actor, automatic entropy tuning, one env, one update per env step after
`learning_starts`, autograd and torch.optim step by step. The replay buffer is a preallocated TensorDict on the
learner's device, sampled there with the loop's own generator. No observation or reward normalization (CleanRL's
SAC has none). It is the yardstick `sac_continuous_action_torchcompile.py` is measured against.

    python leanrl/sac_continuous_action.py              # 1M steps of HalfCheetah-v4
    python leanrl/sac_continuous_action.py --compile    # the same code with nn.Module.compile() on the networks
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

    env_id: str = "HalfCheetah-v4"
    """the id of the environment (any continuous-action envpool task: MuJoCo's, Pendulum-v1, ...)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    num_envs: int = 1
    """the number of parallel game environments (SAC here steps one env, as CleanRL's does)"""
    buffer_size: int = int(1e6)
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = int(5e3)
    """timestep to start learning (random actions until then)"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q network optimizer (and of the entropy coefficient's)"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed): this many actor updates every this many steps"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks"""
    alpha: float = 0.2
    """entropy regularization coefficient, fixed, without --autotune (--autotune starts at 1, as CleanRL's)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""

    compile: bool = False
    """if toggled, nn.Module.compile() the actor, both Q-networks and their targets (the naive one-liner; see the
    _torchcompile script)"""
    cudagraphs: bool = False
    """not in this eager baseline: CUDA graphs need the units of sac_continuous_action_torchcompile.py (refused on CUDA,
    ignored without)"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per metrics.jsonl row"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save networks, optimizers and the entropy coefficient to `<log_dir>/agent.pt` at the end (and
    on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the checkpoint holds the replay buffer: the
    updates go on from the same transitions; the env starts a fresh episode)"""
    num_threads: Optional[int] = None
    """torch intra-op threads (default: torch's own, as in CleanRL: the baseline is measured as its users run it)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "mujoco", "sac")
    plumbing.positive(
        args,
        "total_timesteps",
        "buffer_size",
        "batch_size",
        "policy_frequency",
        "target_network_frequency",
        "log_every",
    )
    plumbing.positive_finite(args, "policy_lr", "q_lr", "alpha")
    plumbing.non_negative_finite(args, "learning_starts")
    plumbing.unit_interval(args, "gamma", "tau")
    plumbing.require(args, lambda v: v == 1, "1 (one env, one update per step, as CleanRL's SAC)", "num_envs")
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
    """A ring buffer of transitions, preallocated on the learner's device as one TensorDict: one write per env step,
    batches drawn on the device from the transitions written so far, with the caller's torch.Generator."""

    def __init__(self, size: int, n_obs: int, n_actions: int, device):
        self.data = TensorDict(
            obs=torch.zeros(size, n_obs),
            next_obs=torch.zeros(size, n_obs),
            actions=torch.zeros(size, n_actions),
            rewards=torch.zeros(size),
            terminations=torch.zeros(size),
            batch_size=[size],
            device=device,
        )
        self.size = size
        self.pos = 0
        self.filled = 0

    def add(self, obs, next_obs, actions, rewards, terminations):
        self.data[self.pos] = TensorDict(
            obs=obs, next_obs=next_obs, actions=actions, rewards=rewards, terminations=terminations
        ).to(self.data.device)
        self.pos = (self.pos + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def sample(self, batch_size: int, rng: torch.Generator):
        return self.data[torch.randint(self.filled, (batch_size,), device=self.data.device, generator=rng)]

    def state(self) -> dict:
        """The transitions written (every row once the ring has wrapped) and where the next one goes: the checkpoint's
        share, so that a resumed run's updates draw from the same transitions."""
        return dict(data=self.data[: self.filled].cpu().to_dict(), pos=self.pos, filled=self.filled)

    def load(self, state: dict):
        """A checkpoint's transitions, copied into this buffer's own tensors."""
        for key, rows in state["data"].items():
            self.data[key][: len(rows)].copy_(rows)
        self.pos = state["pos"]
        self.filled = state["filled"]


# CleanRL's networks: 256-unit MLPs with PyTorch's default init
class SoftQNetwork(nn.Sequential):
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


LOSSES = ("qf1_loss", "qf2_loss", "qf1_values", "actor_loss", "alpha_loss")  # logged, once there are any
LOG_STD_MAX = 2
LOG_STD_MIN = -5


class Actor(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mean = nn.Linear(256, n_actions)
        self.fc_logstd = nn.Linear(256, n_actions)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # squashed into [min, max]
        return mean, log_std

    def get_action(self, x):
        mean, log_std = self(x)
        normal = torch.distributions.Normal(mean, log_std.exp())
        x_t = normal.rsample()  # reparameterization trick: the sample carries the gradient
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        # the density of the squashed, rescaled sample (change of variables through tanh)
        log_prob = normal.log_prob(x_t) - torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
        return action, log_prob.sum(1, keepdim=True), torch.tanh(mean) * self.action_scale + self.action_bias


def main(args: Args):
    ckpt = check_args(args)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)
    if args.cudagraphs:
        plumbing.fail(
            "sac_continuous_action.py is the eager baseline; --cudagraphs needs the units of "
            "leanrl/sac_continuous_action_torchcompile.py"
        )

    global_step = ckpt["global_step"] if ckpt else 0
    env = envpool.make(
        args.env_id, env_type="gymnasium", num_envs=1, seed=plumbing.envpool_seed(args.seed + global_step)
    )
    rng = torch.Generator(device).manual_seed(args.seed)  # the buffer's sampling
    np_rng = np.random.default_rng(args.seed)  # the random actions before learning_starts
    n_obs = env.observation_space.shape[0]
    n_actions = env.action_space.shape[0]
    low = env.action_space.low
    high = env.action_space.high
    actor = Actor(n_obs, n_actions, low, high).to(device)
    qf1 = SoftQNetwork(n_obs, n_actions).to(device)
    qf2 = SoftQNetwork(n_obs, n_actions).to(device)
    qf1_target = SoftQNetwork(n_obs, n_actions).to(device)
    qf2_target = SoftQNetwork(n_obs, n_actions).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr)
    actor_optimizer = torch.optim.Adam(list(actor.parameters()), lr=args.policy_lr)
    target_entropy = -float(n_actions)  # CleanRL's heuristic: -dim(A)
    # CleanRL starts autotuning at log_alpha = 0 (alpha 1); --alpha is the fixed alpha without --autotune
    log_alpha = torch.full((1,), 0.0 if args.autotune else float(np.log(args.alpha)), device=device, requires_grad=True)
    a_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr)
    if args.compile:
        for net in (actor, qf1, qf2, qf1_target, qf2_target):
            net.compile()
    episodes = plumbing.Episodes(1)
    rb = ReplayBuffer(args.buffer_size, n_obs, n_actions, device)
    if ckpt:
        plumbing.resume(
            ckpt,
            args.seed,
            restart=True,  # envpool cannot save its envs: they start new episodes
            actor=actor,
            qf1=qf1,
            qf2=qf2,
            qf1_target=qf1_target,
            qf2_target=qf2_target,
            q_optimizer=q_optimizer,
            actor_optimizer=actor_optimizer,
            a_optimizer=a_optimizer,
            log_alpha=log_alpha,
            rng=rng,
            torch_rng=torch.default_generator,
            device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
            np_rng=np_rng,
            # the finished episodes' returns; the env starts a fresh episode, so the unfinished one's return is dropped
            episodes=episodes,
            buffer=rb,
        )
        del ckpt  # its copy of the replay buffer, now in the run's own, is not held for the whole run
    alpha = log_alpha.exp().item()

    run = plumbing.Run(args, SCRIPT, device, args.total_timesteps, global_step)
    first_update = None
    losses = {}
    t_env = 0.0
    t_policy = 0.0
    t_update = 0.0
    obs, _ = env.reset()
    with run:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            if global_step < args.learning_starts:  # a fresh run explores uniformly first; a resumed one acts
                actions = np_rng.uniform(low, high, size=(1, n_actions)).astype(np.float32)
            else:
                with torch.no_grad():
                    actions, _, _ = actor.get_action(torch.Tensor(obs).to(device))
                actions = actions.cpu().numpy()
            t1 = time.perf_counter()
            real_next_obs, rewards, terminations, truncations, _ = env.step(actions)
            next_obs = real_next_obs  # the buffer gets the real last obs, the loop the next episode's first
            dones = terminations | truncations
            episodes.record_one(float(rewards[0]), bool(dones[0]))
            if dones[0]:  # reset now: envpool would spend the next step on it
                next_obs, _ = env.reset()
            t2 = time.perf_counter()
            rb.add(
                torch.Tensor(obs[0]),
                torch.Tensor(real_next_obs[0]),
                torch.Tensor(actions[0]),
                torch.tensor(rewards[0], dtype=torch.float32),
                torch.tensor(terminations[0], dtype=torch.float32),
            )
            obs = next_obs
            global_step += 1
            t_env += t2 - t1
            t_policy += t1 - t0

            if rb.filled > args.learning_starts:
                first_update = first_update or global_step
                data = rb.sample(args.batch_size, rng)
                with torch.no_grad():
                    next_state_actions, next_state_log_pi, _ = actor.get_action(data["next_obs"])
                    qf1_next_target = qf1_target(data["next_obs"], next_state_actions)
                    qf2_next_target = qf2_target(data["next_obs"], next_state_actions)
                    min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
                    min_qf_next_target = min_qf_next_target.view(-1)
                    next_q_value = data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target

                qf1_a_values = qf1(data["obs"], data["actions"]).view(-1)
                qf2_a_values = qf2(data["obs"], data["actions"]).view(-1)
                qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
                qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
                qf_loss = qf1_loss + qf2_loss
                q_optimizer.zero_grad()
                qf_loss.backward()
                q_optimizer.step()
                losses.update(qf1_loss=qf1_loss, qf2_loss=qf2_loss, qf1_values=qf1_a_values.mean())

                if global_step % args.policy_frequency == 0:  # TD3's delayed update, compensated: as many steps
                    for _ in range(args.policy_frequency):
                        pi, log_pi, _ = actor.get_action(data["obs"])
                        min_qf_pi = torch.min(qf1(data["obs"], pi), qf2(data["obs"], pi))
                        actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
                        actor_optimizer.zero_grad()
                        actor_loss.backward()
                        actor_optimizer.step()
                        losses.update(actor_loss=actor_loss)
                        if args.autotune:
                            with torch.no_grad():
                                _, log_pi, _ = actor.get_action(data["obs"])
                            alpha_loss = (-log_alpha.exp() * (log_pi + target_entropy)).mean()
                            a_optimizer.zero_grad()
                            alpha_loss.backward()
                            a_optimizer.step()
                            alpha = log_alpha.exp().item()
                            losses.update(alpha_loss=alpha_loss)
                    if args.compile and global_step - first_update < args.policy_frequency:
                        run.compiled()  # the first actor update: every network has run (and compiled)

                if global_step % args.target_network_frequency == 0:
                    with torch.no_grad():
                        for net, target in ((qf1, qf1_target), (qf2, qf2_target)):
                            for param, target_param in zip(net.parameters(), target.parameters()):
                                target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                t_update += time.perf_counter() - t2

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
                alpha=alpha,
                buffer=rb.filled,
                **{k: losses[k].item() if k in losses else None for k in LOSSES},
            )
            t_env = 0.0
            t_policy = 0.0
            t_update = 0.0
            if run.stopping:
                break
    env.close()
    run.save(
        global_step=global_step,
        actor=actor,
        qf1=qf1,
        qf2=qf2,
        qf1_target=qf1_target,
        qf2_target=qf2_target,
        q_optimizer=q_optimizer,
        actor_optimizer=actor_optimizer,
        a_optimizer=a_optimizer,
        log_alpha=log_alpha,
        rng=rng,
        torch_rng=torch.default_generator,
        device_rng=plumbing.device_generator(device),  # on a GPU, its own: what the samplers draw from
        np_rng=np_rng,
        episodes=episodes,
        buffer=rb,
    )
    run.finish(global_step, episodes.mean())


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
