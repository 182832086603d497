"""SAC for continuous control (MuJoCo through envpool, HalfCheetah-v4), restructured to run fast.

sac_continuous_action.py's algorithm, networks and defaults (CleanRL's), cut into units that torch.compile and
CUDA graphs wrap: `policy` (one acting step), `update_critic`, `update_actor`, `update_targets`. Each env step is
followed by an update of 256 samples, whose cost on a CPU is mostly Python and dispatch, so the tricks remove
machinery: the twin Q-networks are stacked parameters evaluated in one call (torch.vmap over functional_call);
gradients come from torch.func.grad and the step from torch.optim's functional Adam, so each update compiles into one
graph; the entropy coefficient stays a tensor on the device (CleanRL's .item() is a host sync per
actor update); the target update is one in-place torch._foreach_lerp_; the update's random numbers are
drawn outside the units from the loop's generator, in one call each; a transition is one row of one device tensor.

    python leanrl/sac_continuous_action_torchcompile.py --compile               # CPU or GPU
    python leanrl/sac_continuous_action_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the units
"""

import contextlib
import functools
import io
import json
import math
import os
import platform
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.func import functional_call
from torch.optim.adam import adam


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
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
    """not supported with envpool (it renders no frames); the flag is accepted so every script takes it"""

    env_id: str = "HalfCheetah-v4"
    """the id of the environment (an envpool MuJoCo task with the Gymnasium interface)"""
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
    """entropy regularization coefficient (the starting value with --autotune)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient"""

    compile: bool = False
    """if toggled, wrap the policy, critic, actor and target-update units in torch.compile"""
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
    """path of an agent.pt written by --save-model: continue that run (the buffer refills, see load_checkpoint)"""
    num_threads: int = 1
    """torch intra-op threads (1, as in the PPO scripts: the env and the loop keep the other core)"""


def fail(message: str):
    """A user mistake: one line on stderr, exit code 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args() -> Args:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tyro.cli(Args)
    except SystemExit as e:
        if e.code:  # tyro draws a multi-line box: fold it into the one line a user mistake gets
            lines = [ln.strip(" │╭╮╰╯─") for ln in err.getvalue().splitlines()]
            fail(" ".join(ln for ln in lines[1:] if ln and not ln.startswith("For full helptext")))
        raise


def check_env_id(env_id: str):
    family = envpool.registration.registry.specs.get(env_id, ("",))[0]
    if family != "envpool.mujoco.gym":
        kind = ("an Atari game (discrete actions: leanrl/ppo_atari_envpool.py)" if "atari" in family else
                "a classic-control task (discrete ones: leanrl/ppo.py)" if "classic_control" in family else
                "not a Gymnasium-style MuJoCo task" if "mujoco" in family else "unknown")
        fail(f"--env-id {env_id!r} is {kind}; SAC here takes envpool MuJoCo ids such as HalfCheetah-v4, Hopper-v4")


def check_args(args: Args):
    for name in ("total_timesteps", "buffer_size", "batch_size", "policy_frequency", "target_network_frequency",
                 "log_every", "num_threads", "policy_lr", "q_lr", "alpha"):
        if not 0 < getattr(args, name) < math.inf:  # NaN fails too
            fail(f"--{name.replace('_', '-')} must be positive and finite, got {getattr(args, name)}")
    for name in ("learning_starts", "measure_burnin", "seed"):
        if not 0 <= getattr(args, name) < math.inf:
            fail(f"--{name.replace('_', '-')} must be >= 0 and finite, got {getattr(args, name)}")
    if args.seed >= 2**31:
        fail(f"--seed must be below 2**31 (envpool's seeds are int32), got {args.seed}")
    for name in ("gamma", "tau"):
        if not 0 < getattr(args, name) <= 1:
            fail(f"--{name} must be in (0, 1], got {getattr(args, name)}")
    if args.num_envs != 1:
        fail(f"--num-envs must be 1 (one env, one update per step, as CleanRL's SAC), got {args.num_envs}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} leaves no update in --total-timesteps {args.total_timesteps}")
    if args.capture_video:
        fail("--capture-video is not supported: envpool renders no frames")
    if args.resume and not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    if args.resume:  # a checkpoint of another script or run is refused now, before any work
        load_checkpoint(args, os.path.basename(__file__)[: -len(".py")])
    with contextlib.suppress(OSError):
        os.makedirs(args.log_dir or ".", exist_ok=True)
    if not (os.path.isdir(args.log_dir or ".") and os.access(args.log_dir or ".", os.W_OK)):
        fail(f"--log-dir {args.log_dir} cannot be created or written")
    check_env_id(args.env_id)


def make_env(args: Args, seed: int):
    return envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=seed)


def env_step(env, action: np.ndarray):
    """One step. Returns the real next observation (what the buffer stores, the final one at an episode's end), the
    observation to act on next (the next episode's first after an end: envpool would otherwise spend the next step
    on its reset), the reward, termination (what stops bootstrapping; a time limit does not) and done."""
    obs, reward, terminated, truncated, _ = env.step(action)
    done = terminated | truncated
    next_obs = obs
    if done.any():
        next_obs = env.reset(np.flatnonzero(done))[0]
    return obs, next_obs, reward, terminated, done


class EpisodeStats:
    """Episode returns: the mean of the last `window` finished episodes."""

    def __init__(self, window: int = 20):
        self.ret, self.returns = 0.0, deque(maxlen=window)

    def step(self, reward: float, done: bool):
        self.ret += reward
        if done:
            self.returns.append(self.ret)
            self.ret = 0.0

    def mean_return(self):
        return float(np.mean(self.returns)) if self.returns else None


class ReplayBuffer:
    """A ring buffer of transitions, preallocated on the learner's device: one tensor whose rows are whole
    transitions, seen as a TensorDict of column views. A step writes one row (one copy; one host-to-device transfer
    on a GPU) and a batch is one gather of rows, drawn on the device with the caller's torch.Generator."""

    def __init__(self, size: int, n_obs: int, n_actions: int, device):
        self.widths = dict(obs=n_obs, next_obs=n_obs, actions=n_actions, rewards=1, terminations=1)
        self.rows = torch.zeros(size, sum(self.widths.values()), device=device)
        self.data = self.split(self.rows)
        self.size, self.pos, self.filled = size, 0, 0

    def split(self, rows):
        cols = rows.split(list(self.widths.values()), dim=1)
        return TensorDict({k: c.squeeze(1) if k in ("rewards", "terminations") else c for k, c in zip(self.widths, cols)},
                          batch_size=rows.shape[:1])

    def add(self, row: np.ndarray):
        """`row`: obs, next_obs, actions, reward, termination, concatenated (float32)."""
        self.rows[self.pos].copy_(torch.from_numpy(row), non_blocking=True)
        self.pos = (self.pos + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def sample(self, batch_size: int, rng: torch.Generator):
        return self.split(self.rows[torch.randint(self.filled, (batch_size,), device=self.rows.device, generator=rng)])


# CleanRL's networks: 256-unit MLPs with PyTorch's default init
class SoftQNetwork(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.fc1 = nn.Linear(n_obs + n_actions, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 1)

    def forward(self, x, a):
        x = F.relu(self.fc1(torch.cat([x, a], 1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


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

    def get_action(self, x, noise):
        return squashed_sample(*self(x), noise, self.action_scale, self.action_bias)


def squashed_sample(mean, log_std, noise, scale, bias):
    """CleanRL's get_action with the N(0, 1) noise given: the sample is mean + std * noise (rsample's formula) and
    its log-density Normal's, written out (no Distribution object), then squashed by tanh and rescaled."""
    x_t = mean + log_std.exp() * noise
    y_t = torch.tanh(x_t)
    action = y_t * scale + bias
    log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_prob = log_prob - torch.log(scale * (1 - y_t.pow(2)) + 1e-6)  # change of variables through tanh
    return action, log_prob.sum(1, keepdim=True)


def twin_q(qnet, q_params, obs, actions):
    """Both Q-networks in one call: their parameters are stacked on a leading dim of 2. Returns [2, batch]."""
    return torch.vmap(lambda p: functional_call(qnet, p, (obs, actions)))(q_params).squeeze(-1)


def adam_step(optimizer, params: list, grads: list, lr):
    """torch.optim.Adam's step in its functional form, on the optimizer's own state (see make_optimizer)."""
    state, group = [optimizer.state[p] for p in params], optimizer.param_groups[0]
    with torch.no_grad():
        adam(params, grads, [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], [], [s["step"] for s in state],
             foreach=False, capturable=group["capturable"], amsgrad=False, beta1=group["betas"][0],
             beta2=group["betas"][1], lr=lr, weight_decay=0.0, eps=group["eps"], maximize=False)


def critic_loss(q_params, u, obs, actions, rewards, next_obs, terminations, noise):
    with torch.no_grad():
        next_state_actions, next_state_log_pi = u.actor.get_action(next_obs, noise)
        q_next_target = twin_q(u.qnet, u.q_target, next_obs, next_state_actions)
        alpha = u.log_alpha.exp()
        min_qf_next_target = q_next_target.min(0).values - alpha * next_state_log_pi.view(-1)
        next_q_value = rewards + (1 - terminations) * u.gamma * min_qf_next_target
    q_a_values = twin_q(u.qnet, q_params, obs, actions)
    qf_losses = ((q_a_values - next_q_value) ** 2).mean(1)  # the two MSEs
    return qf_losses.sum(), torch.cat([qf_losses, q_a_values[0].mean().view(1)]).detach()


def update_critic(u, obs, actions, rewards, next_obs, terminations, noise):
    """One gradient step of both Q-networks. Returns [qf1_loss, qf2_loss, qf1_values]."""
    grads, stats = torch.func.grad(critic_loss, has_aux=True)(u.q_params_data, u, obs, actions, rewards, next_obs,
                                                              terminations, noise)
    adam_step(u.q_optimizer, list(u.q_params.values()), list(grads.values()), u.q_lr)
    return stats


def actor_loss(actor_params, u, obs, noise):
    pi, log_pi = squashed_sample(*functional_call(u.actor, actor_params, (obs,)), noise, u.actor.action_scale,
                                 u.actor.action_bias)
    min_qf_pi = twin_q(u.qnet, u.q_params_data, obs, pi).min(0).values
    return (u.log_alpha.exp() * log_pi.view(-1) - min_qf_pi).mean()


def update_actor(u, obs, noise, alpha_noise):
    """One gradient step of the actor, then (with --autotune) one of the entropy coefficient, whose loss samples the
    updated actor anew, as CleanRL's does. Returns [actor_loss, alpha_loss]."""
    params = {name: p.detach() for name, p in u.actor.named_parameters()}
    grads, loss = torch.func.grad_and_value(actor_loss)(params, u, obs, noise)
    adam_step(u.actor_optimizer, list(u.actor.parameters()), list(grads.values()), u.policy_lr)
    if not u.autotune:
        return torch.stack([loss, torch.zeros_like(loss)])
    with torch.no_grad():
        _, log_pi = u.actor.get_action(obs, alpha_noise)
        alpha = u.log_alpha.exp()
        alpha_loss = (-alpha * (log_pi + u.target_entropy)).mean()
        grad = -alpha * (log_pi + u.target_entropy).mean()  # d alpha_loss / d log_alpha, by hand: one scalar
    adam_step(u.a_optimizer, [u.log_alpha], [grad.view(1)], u.q_lr)
    return torch.stack([loss.detach(), alpha_loss])


def update_targets(u):
    """Polyak averaging of the target Q-parameters, in place: target += tau * (online - target), one fused call."""
    torch._foreach_lerp_(list(u.q_target.values()), list(u.q_params_data.values()), u.tau)


def policy(u, obs, noise):
    """One acting step with the inference copy of the actor (same storage, no autograd)."""
    return u.actor_inference.get_action(obs, noise)[0]


def make_optimizer(params: list, lr, capturable: bool):
    """torch.optim.Adam owns the state (and its state_dict the checkpoint); the units apply its functional form, so
    the state is created here rather than lazily on a first optimizer.step()."""
    optimizer = torch.optim.Adam(params, lr=lr, capturable=capturable)
    for p in params:
        optimizer.state[p] = dict(step=torch.zeros((), device=p.device if capturable else "cpu"),
                                  exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def make_units(args: Args, n_obs: int, n_actions: int, low, high, device, compiled: bool):
    """The training state (networks, stacked twin Q-parameters and their targets, optimizers, lrs as tensors, the
    entropy coefficient) and the units the loop calls, compiled if `compiled`. The twin Q-networks start from two
    SoftQNetworks initialized like the baseline's, stacked."""
    actor = Actor(n_obs, n_actions, low, high).to(device)
    qf1, qf2 = SoftQNetwork(n_obs, n_actions).to(device), SoftQNetwork(n_obs, n_actions).to(device)
    q_params = {name: nn.Parameter(torch.stack([p1.detach(), p2.detach()]))
                for (name, p1), p2 in zip(qf1.named_parameters(), qf2.parameters())}
    actor_inference = Actor(n_obs, n_actions, low, high).to(device)
    from_module(actor).data.to_module(actor_inference, preserve_module_state=False)
    tensor = functools.partial(torch.tensor, device=device)
    u = SimpleNamespace(
        actor=actor, actor_inference=actor_inference, qnet=qf1.to("meta"), q_params=q_params,
        q_params_data={k: p.data for k, p in q_params.items()}, q_target={k: p.detach().clone() for k, p in q_params.items()},
        log_alpha=torch.full((1,), math.log(args.alpha), device=device), target_entropy=-float(n_actions),
        q_lr=tensor(args.q_lr), policy_lr=tensor(args.policy_lr), gamma=args.gamma, tau=args.tau, autotune=args.autotune)
    u.q_optimizer = make_optimizer(list(q_params.values()), u.q_lr, args.cudagraphs)
    u.actor_optimizer = make_optimizer(list(actor.parameters()), u.policy_lr, args.cudagraphs)
    u.a_optimizer = make_optimizer([u.log_alpha], u.q_lr, args.cudagraphs)
    for fn in (policy, update_critic, update_actor, update_targets):
        unit = torch.compile(functools.partial(fn, u)) if compiled else functools.partial(fn, u)
        setattr(u, fn.__name__, CudaGraphModule(unit) if args.cudagraphs else unit)
    return u


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return dict(device=str(device), torch=torch.__version__, cpu=f"{cpu} ({os.cpu_count()} cores)", gpu=gpu)


class StopFlag:
    """Ctrl-C (or SIGTERM) asks the loop to stop after the current chunk of log_every steps, so the checkpoint is
    consistent; before the first chunk is logged there is nothing to keep, so it exits at once."""

    def __init__(self):
        self.set, self.logged = False, False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum, frame):
        if self.set or not self.logged:
            os._exit(130)
        self.set = True
        print("\nstopping after this chunk (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr)


def save_checkpoint(path: str, payload: dict):
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves a truncated agent.pt


def load_checkpoint(args: Args, script: str) -> dict:
    """Networks, targets, optimizers, entropy coefficient, RNG and step count. The replay buffer is not saved (at 1M
    transitions it is ~170 MB): a resumed run starts with an empty buffer and acts with the restored policy, without
    updates, until the buffer holds learning_starts transitions again. envpool cannot snapshot the simulator, so the
    episodes restart (with a fresh seed)."""
    try:
        ckpt = torch.load(args.resume, weights_only=True)
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if not isinstance(ckpt, dict) or "script" not in ckpt:
        fail(f"--resume {args.resume}: not a checkpoint this script wrote")
    if ckpt["script"] != script:
        fail(f"--resume {args.resume} was written by {ckpt['script']}.py; resume it with that script")
    if ckpt["args"]["env_id"] != args.env_id:
        fail(f"--resume {args.resume} was trained with --env-id {ckpt['args']['env_id']}; pass the same")
    return ckpt


def main(args: Args):
    check_args(args)
    script = os.path.basename(__file__)[: -len(".py")]
    log_dir = args.log_dir or f"runs/{args.env_id}__{script}__{args.seed}__{int(time.time())}"
    os.makedirs(log_dir, exist_ok=True)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False

    ckpt = load_checkpoint(args, script) if args.resume else None
    global_step = ckpt["global_step"] if ckpt else 0
    env = make_env(args, seed=args.seed + global_step)
    # the loop's random numbers come from its own generator: torch.compile restores torch's global generator after
    # compiling, which would replay numbers already drawn
    rng = torch.Generator(device).manual_seed(args.seed)
    np_rng = np.random.default_rng(args.seed)  # the random actions before learning_starts
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    u = make_units(args, n_obs, n_actions, low, high, device, args.compile)
    if args.compile:
        print("--compile: the units compile on their first call, after learning_starts (a minute or more on a cold "
              "cache; later runs load them from Inductor's on-disk cache)", file=sys.stderr)
    if ckpt:
        u.actor.load_state_dict(ckpt["actor"])
        for name in ("q_optimizer", "actor_optimizer", "a_optimizer"):
            getattr(u, name).load_state_dict(ckpt[name])
        with torch.no_grad():
            for name in u.q_params:
                u.q_params[name].copy_(ckpt["q_params"][name])
                u.q_target[name].copy_(ckpt["q_target"][name])
            u.log_alpha.copy_(ckpt["log_alpha"])
        rng.set_state(ckpt["rng"])
        np_rng.bit_generator.state = ckpt["np_rng"]
    rb, stats = ReplayBuffer(args.buffer_size, n_obs, n_actions, device), EpisodeStats()
    stats.returns.extend(ckpt["returns"].tolist() if ckpt else [])

    def checkpoint():
        save_checkpoint(os.path.join(log_dir, "agent.pt"), dict(
            script=script, args=asdict(args), global_step=global_step, actor=u.actor.state_dict(),
            q_params={k: p.detach().cpu() for k, p in u.q_params.items()},
            q_target={k: p.cpu() for k, p in u.q_target.items()}, q_optimizer=u.q_optimizer.state_dict(),
            actor_optimizer=u.actor_optimizer.state_dict(), a_optimizer=u.a_optimizer.state_dict(),
            log_alpha=u.log_alpha.cpu(), rng=rng.get_state(), np_rng=np_rng.bit_generator.state,
            returns=torch.tensor(list(stats.returns), dtype=torch.float64)))

    run = None
    if args.track:
        import wandb

        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                         name=os.path.basename(log_dir), dir=log_dir, save_code=True)
    metrics, stop = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1), StopFlag()
    bar = tqdm.tqdm(total=args.total_timesteps, initial=global_step, unit="step", dynamic_ncols=True,
                    desc="compiling on first call" if args.compile else None)
    start, measure_from, fps, forced, first_update, act_noise = time.perf_counter(), None, None, False, None, None
    compile_time, compiled = 0.0 if args.compile else None, set()  # the seconds of steps that ran a unit first
    losses = torch.zeros(5, device=device)  # qf1_loss, qf2_loss, qf1_values, actor_loss, alpha_loss
    t_env = t_policy = t_update = 0.0
    noise_shape = (1 + 2 * args.policy_frequency, args.batch_size, n_actions)  # critic, then actor and alpha draws
    obs, _ = env.reset()
    try:
        while global_step < args.total_timesteps:
            if global_step % args.log_every == 0 or act_noise is None:  # the acting noise of a chunk, at once
                act_noise = torch.randn(args.log_every, 1, n_actions, device=device, generator=rng)
            t0, units = time.perf_counter(), set()
            if global_step < args.learning_starts:  # a fresh run explores uniformly first; a resumed one acts
                actions = np_rng.uniform(low, high, size=(1, n_actions)).astype(np.float32)
            else:
                actions = u.policy(torch.from_numpy(obs).to(device, torch.float32), act_noise[global_step % args.log_every])
                actions = actions.cpu().numpy()
                units.add("policy")
            t1 = time.perf_counter()
            real_next_obs, next_obs, rewards, terminations, done = env_step(env, actions)
            t2 = time.perf_counter()
            stats.step(float(rewards[0]), bool(done[0]))
            rb.add(np.concatenate([obs[0], real_next_obs[0], actions[0], rewards, terminations], dtype=np.float32))
            obs = next_obs
            global_step += 1
            t_env += t2 - t1
            t_policy += t1 - t0

            if rb.filled > args.learning_starts:
                first_update = first_update or global_step
                data = rb.sample(args.batch_size, rng)
                noise = torch.randn(noise_shape, device=device, generator=rng)
                losses[:3] = u.update_critic(data["obs"], data["actions"], data["rewards"], data["next_obs"],
                                             data["terminations"], noise[0])
                if global_step % args.policy_frequency == 0:  # TD3's delayed update, compensated: as many steps
                    for i in range(args.policy_frequency):
                        losses[3:] = u.update_actor(data["obs"], noise[1 + 2 * i], noise[2 + 2 * i])
                    units.add("actor")
                if global_step % args.target_network_frequency == 0:
                    u.update_targets()
                    units.add("targets")
                units.add("critic")
                t_update += time.perf_counter() - t2
            if args.compile and not units <= compiled:  # a unit ran for the first time: it compiled in this step
                compile_time, compiled = compile_time + time.perf_counter() - t0, compiled | units
                bar.set_description(None if len(compiled) == 4 else bar.desc)

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            # steady-state fps: env steps after learning_starts plus the burn-in
            now = time.perf_counter()
            if measure_from is None and first_update and global_step - first_update >= args.measure_burnin:
                measure_from = (now, global_step)
            fps = (global_step - measure_from[1]) / (now - measure_from[0]) if measure_from and global_step > measure_from[1] else None
            updated = first_update is not None
            row = dict(global_step=global_step, time=now - start, fps=fps, episodic_return=stats.mean_return(),
                       t_env=t_env, t_policy=t_policy, t_update=t_update, buffer=rb.filled,
                       alpha=u.log_alpha.exp().item(),  # the one host sync of a chunk, with the losses'
                       **dict(zip(("qf1_loss", "qf2_loss", "qf1_values", "actor_loss", "alpha_loss"),
                                  losses.tolist() if updated else [None] * 5)))
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            stop.logged = True
            t_env = t_policy = t_update = 0.0
            bar.update(global_step - bar.n)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            if stop.set:
                break
    except KeyboardInterrupt:  # stop mid-chunk, with no consistent state to save
        stop.set = forced = True
    finally:
        bar.close()
        metrics.close()
        env.close()
    if args.save_model and not forced:
        checkpoint()

    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps, final_return=stats.mean_return(),
                   compile_time=compile_time, interrupted=stop.set)
    with open(os.path.join(log_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if run:
        run.summary.update(summary)
        run.finish()
    print(f"{global_step} steps, {summary['wall_time']:.1f}s, fps {summary['fps'] or 0:.0f}, "
          f"return {summary['final_return']}, logs in {log_dir}", file=sys.stderr)
    if stop.set:
        sys.exit(130)


if __name__ == "__main__":
    main(parse_args())
