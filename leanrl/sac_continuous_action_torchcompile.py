"""SAC for continuous control (MuJoCo through envpool, HalfCheetah-v4), restructured to run fast.

sac_continuous_action.py (CleanRL's SAC) cut into units that torch.compile and CUDA graphs wrap. An update per env
step costs mostly Python and dispatch on a CPU, so the tricks remove machinery: the twin Q-networks stacked and called
once under torch.vmap, torch.func.grad and functional Adam (one graph per update), alpha kept on the device.

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


def check_args(args: Args) -> Optional[dict]:
    rules = [(("total_timesteps", "buffer_size", "batch_size", "policy_frequency", "target_network_frequency", "alpha",
               "log_every", "num_threads", "policy_lr", "q_lr"), lambda x: 0 < x < math.inf, "positive and finite"),
             (("learning_starts", "measure_burnin"), lambda x: 0 <= x < math.inf, ">= 0 and finite"),
             (("seed",), lambda x: 0 <= x < 2**31, "in [0, 2**31) (envpool's seeds are int32)"),
             (("gamma", "tau"), lambda x: 0 < x <= 1, "in (0, 1]"),
             (("num_envs",), lambda x: x == 1, "1 (one env, one update per step, as CleanRL's SAC)"),
             (("capture_video",), lambda x: not x, "off (envpool renders no frames)")]
    for names, ok, what in rules:
        for name in names:
            if not ok(getattr(args, name)):  # `not ok`: a NaN fails every rule
                fail(f"--{name.replace('_', '-')} must be {what}, got {getattr(args, name)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} leaves no update in --total-timesteps {args.total_timesteps}")
    family = envpool.registration.registry.specs.get(args.env_id, ("",))[0]
    if family != "envpool.mujoco.gym":
        kind = ("an Atari game (discrete actions: leanrl/ppo_atari_envpool.py)" if "atari" in family else
                "a classic-control task (discrete ones: leanrl/ppo.py)" if "classic_control" in family else
                "not a Gymnasium-style MuJoCo task" if "mujoco" in family else "unknown")
        fail(f"--env-id {args.env_id!r} is {kind}; SAC here takes envpool MuJoCo ids such as HalfCheetah-v4")
    ckpt = load_checkpoint(args) if args.resume else None  # another script's or env's checkpoint is refused now
    with contextlib.suppress(OSError):  # the last check: a bad flag never creates a folder
        os.makedirs(args.log_dir or ".", exist_ok=True)
    if not (os.path.isdir(args.log_dir or ".") and os.access(args.log_dir or ".", os.W_OK)):
        fail(f"--log-dir {args.log_dir} cannot be created or written")
    return ckpt


class ReplayBuffer:
    """A ring buffer preallocated on the learner's device: one tensor of whole transitions (obs, next_obs, actions,
    reward, termination) per row, seen as a TensorDict of columns. A step writes a row, a batch gathers rows."""

    def __init__(self, size: int, n_obs: int, n_actions: int, device):
        self.widths = dict(obs=n_obs, next_obs=n_obs, actions=n_actions, rewards=1, terminations=1)
        self.rows = torch.zeros(size, sum(self.widths.values()), device=device)
        self.data = self.split(self.rows)
        self.size, self.pos, self.filled = size, 0, 0

    def split(self, rows):
        cols = rows.split(list(self.widths.values()), dim=1)
        return TensorDict({k: c.squeeze(1) if k in ("rewards", "terminations") else c
                           for k, c in zip(self.widths, cols)}, batch_size=rows.shape[:1])

    def add(self, row: np.ndarray):
        self.rows[self.pos].copy_(torch.from_numpy(row), non_blocking=True)
        self.pos = (self.pos + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def sample(self, batch_size: int, rng: torch.Generator):
        inds = torch.randint(self.filled, (batch_size,), device=self.rows.device, generator=rng)
        return self.split(self.rows[inds])


# CleanRL's networks: 256-unit MLPs with PyTorch's default init
class SoftQNetwork(nn.Sequential):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__(nn.Linear(n_obs + n_actions, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 1))

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

    def forward(self, x, noise):
        """CleanRL's get_action, in forward (what functional_call calls), with the N(0, 1) noise given (rsample's)."""
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # squashed into [min, max]
        x_t = mean + log_std.exp() * noise
        y_t = torch.tanh(x_t)
        action = y_t * self.action_scale + self.action_bias
        log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)  # Normal's, with no Distribution object
        log_prob = log_prob - torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)  # change of variables: tanh
        return action, log_prob.sum(1, keepdim=True)


def twin_q(qnet, q_params, obs, actions):
    """Both Q-networks in one call: their parameters are stacked on a leading dim of 2. Returns [2, batch]."""
    return torch.vmap(lambda p: functional_call(qnet, p, (obs, actions)))(q_params).squeeze(-1)


def adam_step(optimizer, params: list, grads: list, lr):
    """torch.optim.Adam's step in its functional form, on the optimizer's own state (see make_optimizer)."""
    state, group = [optimizer.state[p] for p in params], optimizer.param_groups[0]
    with torch.no_grad():
        adam(params, grads, [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], [],
             [s["step"] for s in state], foreach=False, capturable=group["capturable"], amsgrad=False, eps=group["eps"],
             beta1=group["betas"][0], beta2=group["betas"][1], lr=lr, weight_decay=0.0, maximize=False)


def update_critic(u, obs, actions, rewards, next_obs, terminations, noise):
    """One gradient step of both Q-networks. Returns [qf1_loss, qf2_loss, qf1_values]."""
    with torch.no_grad():
        next_state_actions, next_state_log_pi = u.actor(next_obs, noise)
        q_next_target = twin_q(u.qnet, u.q_target, next_obs, next_state_actions)
        min_qf_next_target = q_next_target.min(0).values - u.log_alpha.exp() * next_state_log_pi.view(-1)
        next_q_value = rewards + (1 - terminations) * u.gamma * min_qf_next_target

    def qf_loss(q_params):
        q_a_values = twin_q(u.qnet, q_params, obs, actions)
        qf_losses = ((q_a_values - next_q_value) ** 2).mean(1)  # the two MSEs
        return qf_losses.sum(), torch.cat([qf_losses, q_a_values[0].mean().view(1)]).detach()
    grads, stats = torch.func.grad(qf_loss, has_aux=True)(u.q_data)
    adam_step(u.q_optimizer, list(u.q_params.values()), list(grads.values()), u.q_lr)
    return stats


def update_actor(u, obs, noise, alpha_noise):
    """An actor step, then (--autotune) an alpha step on a fresh sample, as CleanRL's. Returns the two losses."""
    def actor_loss(actor_params):
        pi, log_pi = functional_call(u.actor, actor_params, (obs, noise))
        min_qf_pi = twin_q(u.qnet, u.q_data, obs, pi).min(0).values
        return (u.log_alpha.exp() * log_pi.view(-1) - min_qf_pi).mean()
    params = {name: p.detach() for name, p in u.actor.named_parameters()}
    grads, loss = torch.func.grad_and_value(actor_loss)(params)
    adam_step(u.actor_optimizer, list(u.actor.parameters()), list(grads.values()), u.policy_lr)
    if not u.autotune:
        return torch.stack([loss, torch.zeros_like(loss)])
    with torch.no_grad():
        _, log_pi = u.actor(obs, alpha_noise)
        # d alpha_loss / d log_alpha is alpha_loss itself (alpha = exp(log_alpha)): no autograd for one scalar
        alpha_loss = (-u.log_alpha.exp() * (log_pi + u.target_entropy)).mean()
    adam_step(u.a_optimizer, [u.log_alpha], [alpha_loss.view(1)], u.q_lr)
    return torch.stack([loss.detach(), alpha_loss])


def update_targets(u):
    """Polyak averaging of the target Q-parameters, in place: target += tau * (online - target), one fused call."""
    torch._foreach_lerp_(list(u.q_target.values()), list(u.q_data.values()), u.tau)


def policy(u, obs, noise):
    """One acting step with the inference copy of the actor (same storage, no autograd)."""
    return u.actor_inference(obs, noise)[0]


def make_optimizer(params: list, lr, capturable: bool):
    """torch.optim.Adam (its state_dict is the checkpoint's), its state created now: the units step it functionally."""
    optimizer = torch.optim.Adam(params, lr=lr, capturable=capturable)
    for p in params:
        optimizer.state[p] = dict(step=torch.zeros((), device=p.device if capturable else "cpu"),
                                  exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def make_units(args: Args, n_obs: int, n_actions: int, low, high, device, compiled: bool):
    """The training state and the units the loop calls; the twin Q-parameters stack two SoftQNetworks' initial ones."""
    actor = Actor(n_obs, n_actions, low, high).to(device)
    qf1, qf2 = SoftQNetwork(n_obs, n_actions).to(device), SoftQNetwork(n_obs, n_actions).to(device)
    q_params = {name: nn.Parameter(torch.stack([p1.detach(), p2.detach()]))
                for (name, p1), p2 in zip(qf1.named_parameters(), qf2.parameters())}
    actor_inference = Actor(n_obs, n_actions, low, high).to(device)
    from_module(actor).data.to_module(actor_inference, preserve_module_state=False)
    u = SimpleNamespace(
        actor=actor, actor_inference=actor_inference, qnet=qf1.to("meta"), q_params=q_params,
        q_data={k: p.data for k, p in q_params.items()}, q_target={k: p.data.clone() for k, p in q_params.items()},
        log_alpha=torch.full((1,), math.log(args.alpha), device=device), target_entropy=-float(n_actions),
        q_lr=torch.tensor(args.q_lr, device=device), policy_lr=torch.tensor(args.policy_lr, device=device),
        gamma=args.gamma, tau=args.tau, autotune=args.autotune)
    u.q_optimizer = make_optimizer(list(q_params.values()), u.q_lr, args.cudagraphs)
    u.actor_optimizer = make_optimizer(list(actor.parameters()), u.policy_lr, args.cudagraphs)
    u.a_optimizer = make_optimizer([u.log_alpha], u.q_lr, args.cudagraphs)
    for fn in (policy, update_critic, update_actor, update_targets):
        unit = torch.compile(functools.partial(fn, u)) if compiled else functools.partial(fn, u)
        setattr(u, fn.__name__, CudaGraphModule(unit) if args.cudagraphs else unit)
    return u


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return dict(device=str(device), torch=torch.__version__, cpu=f"{cpu} ({os.cpu_count()} cores)", gpu=gpu)


class StopFlag:
    """Ctrl-C (or SIGTERM): stop after the current chunk of log_every steps; before the first, or again: at once."""

    def __init__(self):
        self.set, self.logged = False, False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum, frame):
        if self.set or not self.logged:
            os._exit(130)
        self.set = True
        print("\nstopping after this chunk (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr)


def load_checkpoint(args: Args) -> dict:
    """Networks, targets, optimizers, alpha, RNGs and the step; not the buffer (~170 MB at 1M): a resumed run acts with
    the restored policy until it holds learning_starts transitions again. Episodes restart (with a fresh seed)."""
    if not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        written_by = ckpt["script"]
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if written_by != os.path.basename(__file__)[: -len(".py")]:
        fail(f"--resume {args.resume} was written by {written_by}.py; resume it with that script")
    if ckpt["args"]["env_id"] != args.env_id:
        fail(f"--resume {args.resume} was trained with --env-id {ckpt['args']['env_id']}; pass the same")
    return ckpt


def main(args: Args):
    ckpt = check_args(args)
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

    global_step = ckpt["global_step"] if ckpt else 0
    env = envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=args.seed + global_step)
    rng = torch.Generator(device).manual_seed(args.seed)  # the loop's own: torch.compile restores the global one
    np_rng = np.random.default_rng(args.seed)  # the random actions before learning_starts
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    u = make_units(args, n_obs, n_actions, low, high, device, args.compile)
    if args.compile:
        print("--compile: the units compile on their first call, after learning_starts (a minute or more on a cold "
              "cache; later runs load them from Inductor's on-disk cache)", file=sys.stderr)
    if ckpt:
        for name in ("actor", "q_optimizer", "actor_optimizer", "a_optimizer"):
            getattr(u, name).load_state_dict(ckpt[name])
        for name in u.q_params:
            u.q_params[name].data.copy_(ckpt["q_params"][name])
            u.q_target[name].copy_(ckpt["q_target"][name])
        u.log_alpha.copy_(ckpt["log_alpha"])
        rng.set_state(ckpt["rng"])
        np_rng.bit_generator.state = ckpt["np_rng"]
    rb = ReplayBuffer(args.buffer_size, n_obs, n_actions, device)
    ep_return, finished = 0.0, deque(ckpt["returns"].tolist() if ckpt else [], maxlen=20)  # the last 20 returns
    mean_return = lambda: float(np.mean(finished)) if finished else None  # noqa: E731

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
    losses = torch.zeros(len(LOSSES), device=device)
    noise_shape = (1 + 2 * args.policy_frequency, args.batch_size, n_actions)  # critic, then actor and alpha draws
    t_env = t_policy = t_update = 0.0
    obs, _ = env.reset()
    try:
        while global_step < args.total_timesteps:
            if global_step % args.log_every == 0 or act_noise is None:  # the acting noise of a chunk, at once
                act_noise = torch.randn(args.log_every, 1, n_actions, device=device, generator=rng)
            t0, units = time.perf_counter(), set()
            if global_step < args.learning_starts:  # a fresh run explores uniformly first; a resumed one acts
                actions = np_rng.uniform(low, high, size=(1, n_actions)).astype(np.float32)
            else:
                obs_device = torch.from_numpy(obs).to(device, torch.float32)
                actions = u.policy(obs_device, act_noise[global_step % args.log_every]).cpu().numpy()
                units.add("policy")
            t1 = time.perf_counter()
            real_next_obs, rewards, terminations, truncations, _ = env.step(actions)
            next_obs = real_next_obs  # the buffer gets the real last obs, the loop the next episode's first
            ep_return += float(rewards[0])
            if terminations[0] or truncations[0]:  # reset now: envpool would spend the next step on it
                next_obs = env.reset()[0]
                finished.append(ep_return)
                ep_return = 0.0
            t2 = time.perf_counter()
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
            if measure_from and global_step > measure_from[1]:
                fps = (global_step - measure_from[1]) / (now - measure_from[0])
            row = dict(global_step=global_step, time=now - start, fps=fps, episodic_return=mean_return(),
                       t_env=t_env, t_policy=t_policy, t_update=t_update, buffer=rb.filled,
                       alpha=u.log_alpha.exp().item(),  # the one host sync of a chunk, with the losses'
                       **dict(zip(LOSSES, losses.tolist() if first_update else [None] * len(LOSSES))))
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
        path = os.path.join(log_dir, "agent.pt")
        torch.save(dict(
            script=script, args=asdict(args), global_step=global_step, actor=u.actor.state_dict(),
            q_params={k: p.detach().cpu() for k, p in u.q_params.items()},
            q_target={k: p.cpu() for k, p in u.q_target.items()}, q_optimizer=u.q_optimizer.state_dict(),
            actor_optimizer=u.actor_optimizer.state_dict(), a_optimizer=u.a_optimizer.state_dict(),
            log_alpha=u.log_alpha.cpu(), rng=rng.get_state(), np_rng=np_rng.bit_generator.state,
            returns=torch.tensor(list(finished), dtype=torch.float64)), path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write never leaves a truncated agent.pt

    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps, final_return=mean_return(),
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
