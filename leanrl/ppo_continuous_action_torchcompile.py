"""PPO for continuous control (MuJoCo through envpool, HalfCheetah-v4), made to run as fast as the hardware allows.

ppo_continuous_action.py's algorithm, network, normalization and defaults (CleanRL's), cut into units that
torch.compile and CUDA graphs can wrap: `policy`, `normalize`, `gae`, `update`. An iteration is 2048 sequential
single-env steps, then 320 minibatch updates of 64 samples: on a CPU each costs its Python and dispatcher overhead, not
its arithmetic, so the tricks remove machinery (doc/continuous_control.md has the measurements): a rollout step only
samples, with an inference copy of the agent (log-probs and values come after, in one batched forward); env outputs
are staged in numpy and reach the buffers once an iteration, the reward scaling too; GAE recurses over numpy rows on
the host; `update` is one compiled graph (torch.func.grad, clipping, torch.optim's functional Adam); lr is a tensor
changed in place (no recompilation), and once everything has compiled the guards are skipped. A CUDA learner acts
through a host copy of the actor, the normalizer on the host too (--host-actor): a one-row step costs less there.

    python leanrl/ppo_continuous_action_torchcompile.py --compile               # CPU or GPU
    python leanrl/ppo_continuous_action_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the units
"""

import contextlib
import copy
import functools
import io
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from tensordict import from_module
from tensordict.nn import CudaGraphModule
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
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold"""

    compile: bool = False
    """if toggled, wrap the policy, normalize and update units in torch.compile"""
    cudagraphs: bool = False
    """if toggled, wrap the units that run on CUDA in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    host_actor: bool = True
    """with a CUDA learner, act with a host copy of actor_mean (refreshed after each iteration's updates: ~20 KB) and
    the normalizer on the host: a one-row 64-unit MLP step costs less there than GPU launches. CPU: no copy"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent, optimizer and normalizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the episodes restart, see load_checkpoint)"""
    num_threads: int = 1
    """torch intra-op threads (1 measures fastest for these 64-unit layers)"""


def fail(message: str):
    """A user mistake: one line on stderr, exit code 2, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args() -> Args:
    try:
        with contextlib.redirect_stderr(err := io.StringIO()):
            return tyro.cli(Args)
    except SystemExit as e:
        if e.code:  # tyro draws a multi-line box: fold it into the one line a user mistake gets
            lines = [ln.strip(" │╭╮╰╯─") for ln in err.getvalue().splitlines()]
            fail(" ".join(ln for ln in lines[1:] if ln and not ln.startswith("For full helptext")))
        raise


def check_args(args: Args) -> Optional[dict]:
    """Every flag against its meaning, before any work (a mistake: one line, exit 2); returns the checkpoint, if any."""
    def need(ok: bool, name: str, what: str):
        if not ok:
            fail(f"--{name.replace('_', '-')} must be {what}, got {getattr(args, name)}")
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_threads"):
        need(getattr(args, name) > 0, name, "positive")
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        need(0 < getattr(args, name) < math.inf, name, "positive and finite")
    for name in ("ent_coef", "vf_coef", "measure_burnin"):
        need(0 <= getattr(args, name) < math.inf, name, "non-negative and finite")
    for name in ("gamma", "gae_lambda"):
        need(0 < getattr(args, name) <= 1, name, "in (0, 1]")
    need(0 <= args.seed < 2**31, "seed", "in [0, 2**31) (envpool's seeds are int32)")
    need(args.target_kl is None or 0 < args.target_kl < math.inf, "target_kl", "positive and finite")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} "
             f"(num_envs x num_steps); pick a divisor of {batch_size}")
    if args.total_timesteps < batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    if args.capture_video:
        fail("--capture-video is not supported: envpool renders no frames")
    env_id, family = args.env_id, envpool.registration.registry.specs.get(args.env_id, ("",))[0]
    if "atari" in family:
        fail(f"--env-id {env_id} is an Atari game (discrete actions); use leanrl/ppo_atari_envpool.py")
    if "classic_control" in family:
        fail(f"--env-id {env_id} is a classic-control task; this script takes MuJoCo tasks such as HalfCheetah-v4 "
             "(discrete classic control: leanrl/ppo.py)")
    if family != "envpool.mujoco.gym":
        fail(f"--env-id {env_id}: {'not a Gymnasium-style MuJoCo task' if 'mujoco' in family else 'unknown env id'}; "
             "this script takes envpool MuJoCo ids such as HalfCheetah-v4, Hopper-v4, Ant-v4")
    ckpt = load_checkpoint(args) if args.resume else None
    check_log_dir(args)
    return ckpt


def check_log_dir(args: Args):
    """The last check (a bad flag never creates a folder): the log dir, its default resolved into args, is writable."""
    script = os.path.basename(__file__)[: -len(".py")]
    args.log_dir = args.log_dir or f"runs/{args.env_id}__{script}__{args.seed}__{int(time.time())}"
    try:
        os.makedirs(args.log_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.log_dir).close()
    except OSError as e:
        fail(f"--log-dir {args.log_dir}: cannot write there ({e.strerror or e})")


def env_step(envs, action: np.ndarray):
    """One step with CleanRL's (gymnasium's SAME_STEP) auto-reset. envpool 1.2.5 resets an env on the step *after* its
    episode ended (action ignored, reward 0): resetting at once keeps the dead step out of the batch (one call more)."""
    obs, reward, terminated, truncated, _ = envs.step(action)
    done = terminated | truncated
    if done.any():
        obs[done] = envs.reset(np.flatnonzero(done))[0]
    return obs, reward, done


class Normalizer:
    """CleanRL's NormalizeObservation + clip and NormalizeReward + clip for all envs at once (one set of statistics fed
    every env's values each step), each env's discounted return restarting at 0 when its episode ends by termination or
    time limit (gymnasium's: only on termination, so on HalfCheetah never). The statistics (mean, population variance,
    count; from gymnasium's 0, 1, 1e-4) are float64 tensors where the rollout acts, updated in place so compiled code
    and CUDA graphs keep reading the same storage; the discounted returns accumulate on the host, in the rollout."""
    def __init__(self, num_envs: int, obs_dim: int, gamma: float, device, clip: float = 10.0, eps: float = 1e-8):
        f64 = dict(dtype=torch.float64, device=device)
        # count of shape (1,): torch 2.13's compiled code drops in-place writes to a 0-dim tensor read from an object
        self.obs_rms, self.ret_rms = (SimpleNamespace(mean=torch.zeros(dims, **f64), var=torch.ones(dims, **f64),
                                                      count=torch.full((1,), 1e-4, **f64)) for dims in ((obs_dim,), ()))
        self.ret = np.zeros(num_envs)  # each env's discounted return so far in its episode
        self.gamma, self.clip, self.eps = gamma, clip, eps

    def obs(self, obs):
        """Merge the obs the agent is about to see into the statistics (Chan et al.'s parallel update); normalize."""
        s, n = self.obs_rms, obs.shape[0]
        delta, total = obs.mean(0) - s.mean, s.count + n
        s.var.copy_((s.var * s.count + obs.var(0, unbiased=False) * n + delta**2 * s.count * n / total) / total)
        s.mean.add_(delta * n / total)
        s.count.copy_(total)
        return ((obs - s.mean) / (s.var + self.eps).sqrt()).clamp(-self.clip, self.clip).float()

    def discounted_return(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """One step of each env's discounted return (host, numpy): its value after this step's reward."""
        self.ret = self.ret * self.gamma + reward
        out = self.ret.copy()
        self.ret[done] = 0.0
        return out

    def rewards(self, rewards, returns):
        """A rollout's rewards [steps, envs] scaled by the std of the discounted return, the statistics merged with
        each step's returns in turn, at once: a union's count, sum and sum of squares are cumulative sums (float64)."""
        s, x = self.ret_rms, returns.double()
        counts = s.count + x.shape[1] * torch.arange(1, x.shape[0] + 1, dtype=x.dtype, device=x.device)
        means = (s.count * s.mean + x.sum(1).cumsum(0)) / counts
        var = (s.count * (s.var + s.mean**2) + (x**2).sum(1).cumsum(0)) / counts - means**2
        s.mean.copy_(means[-1])
        s.var.copy_(var[-1])
        s.count.copy_(counts[-1])
        return (rewards / (var + self.eps).sqrt().unsqueeze(1)).clamp(-self.clip, self.clip).float()

    def state_dict(self):
        return {name: {k: v.cpu() for k, v in vars(getattr(self, name)).items()} for name in ("obs_rms", "ret_rms")}

    def load_state_dict(self, state):
        for name in ("obs_rms", "ret_rms"):
            for k, v in vars(getattr(self, name)).items():
                v.copy_(state[name][k])


class EpisodeStats:
    """Episode returns from the raw rewards: the returns logged are the real, unnormalized ones."""
    def __init__(self, num_envs: int, window: int = 20):
        self.ret, self.returns = np.zeros(num_envs), deque(maxlen=window)

    def step(self, reward: np.ndarray, done: np.ndarray):
        self.ret += reward
        if done.any():  # rare: most steps cost one numpy add
            self.returns.extend(self.ret[done].tolist())
            self.ret[done] = 0.0

    def mean_return(self):
        return float(np.mean(self.returns)) if self.returns else None


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(n_obs, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                                    nn.Tanh(), layer_init(nn.Linear(64, 1), std=1.0))
        self.actor_mean = nn.Sequential(layer_init(nn.Linear(n_obs, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)),
                                        nn.Tanh(), layer_init(nn.Linear(64, n_actions), std=0.01))
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_actions))

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def rollout_noise(self, shape, rng: torch.Generator):
        """A rollout's exploration noise, std * N(0, 1), in one call: the parameters are fixed during a rollout."""
        return self.actor_logstd.exp() * torch.randn(shape, device=self.actor_logstd.device, generator=rng)

    def forward(self, x, action):
        """Log-prob and entropy of `action` under the diagonal Gaussian (Normal's formulas, no object); the value."""
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        logprob = (-0.5 * ((action - mean) / logstd.exp()) ** 2 - logstd - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + logstd).sum(-1)
        return logprob, entropy, self.critic(x).squeeze(-1)


def act(actor_mean, x, noise):
    """One rollout step, a sample of Normal(mean, std), nothing else: log-probs and values come afterwards."""
    return actor_mean(x) + noise


def host_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `module` on `device` to act with: storage of its own, no autograd; `refresh` keeps it current."""
    return copy.deepcopy(module).requires_grad_(False).to(device)


def refresh(acting: nn.Module, learner: nn.Module):
    """The learner's parameters into its acting copy, in one transfer (~20 KB)."""
    flat = nn.utils.parameters_to_vector(learner.parameters()).to(next(acting.parameters()).device)
    nn.utils.vector_to_parameters(flat, acting.parameters())  # sets each one's .data: autograd stays out


def rollout(envs, policy, normalize, normalizer, next_obs, next_done, buf, stats, noise, action_bounds):
    """num_steps steps of every env into `buf`, acting where `next_obs` and `noise` are; returns the last (normalized)
    obs and done, and the time split. Staged in numpy (obs in a list), each field reaches `buf` in one copy."""
    num_steps, device = buf["obs"].shape[0], next_obs.device
    dones, rewards = np.empty(buf["dones"].shape, np.float32), np.empty(buf["rewards"].shape, np.float32)
    returns, actions = np.empty(buf["rewards"].shape), np.empty(buf["actions"].shape, np.float32)
    obs, t_env, t_policy = [], 0.0, 0.0
    for step in range(num_steps):
        obs.append(next_obs)
        dones[step] = next_done
        t0 = time.perf_counter()
        actions[step] = policy(next_obs, noise[step]).cpu().numpy()
        t1 = time.perf_counter()
        raw_obs, reward, next_done = env_step(envs, np.clip(actions[step], *action_bounds))
        t2 = time.perf_counter()
        next_obs = normalize(torch.from_numpy(raw_obs).to(device, non_blocking=True))
        t_env, t_policy = t_env + t2 - t1, t_policy + t1 - t0 + time.perf_counter() - t2
        rewards[step], returns[step] = reward, normalizer.discounted_return(reward, next_done)
        stats.step(reward, next_done)
    buf["obs"].copy_(torch.stack(obs), non_blocking=True)
    buf["actions"].copy_(torch.from_numpy(actions), non_blocking=True)
    buf["dones"].copy_(torch.from_numpy(dones), non_blocking=True)
    buf["rewards"].copy_(normalizer.rewards(torch.from_numpy(rewards).to(device), torch.from_numpy(returns).to(device)))
    return next_obs, next_done, t_env, t_policy


def gae(next_value, next_done, rewards, dones, values, gamma: float, gae_lambda: float):
    """CleanRL's GAE: deltas and discounts at once in torch, the recursion over numpy rows on the host (~2 us a step);
    a loop of torch ops costs ~12k dispatches (~50 ms an iteration), and torch.compile takes minutes to unroll it."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.unsqueeze(0)])
    nextvalues = torch.cat([values[1:], next_value.unsqueeze(0)])
    deltas = (rewards + gamma * nextvalues * nextnonterminal - values).cpu().numpy()
    discounts = (gamma * gae_lambda * nextnonterminal).cpu().numpy()
    advantages, lastgaelam = np.empty_like(deltas), np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        advantages[t] = lastgaelam = deltas[t] + discounts[t] * lastgaelam
    advantages = torch.from_numpy(advantages).to(values.device)
    return advantages, advantages + values


def ppo_loss(params, agent, args, obs, actions, logprobs, advantages, returns, values):
    newlogprob, entropy, newvalue = torch.func.functional_call(agent, params, (obs, actions))
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html
    clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return loss, torch.stack([approx_kl, clipfrac, pg_loss, v_loss, entropy_loss]).detach()


def update(agent, optimizer, lr, args, obs, actions, logprobs, advantages, returns, values, inds):
    """One minibatch step; returns [approx_kl, clipfrac, pg_loss, v_loss, entropy, grad_norm]. torch.func.grad and
    torch.optim's functional Adam on the optimizer's state: compiled, one graph (backward(), step() would break it)."""
    params = {name: p.detach() for name, p in agent.named_parameters()}
    grads, stats = torch.func.grad(ppo_loss, has_aux=True)(
        params, agent, args, obs[inds], actions[inds], logprobs[inds], advantages[inds], returns[inds], values[inds])
    plist = list(agent.parameters())
    for p, name in zip(plist, params):
        p.grad = grads[name]
    grad_norm = nn.utils.clip_grad_norm_(plist, args.max_grad_norm, foreach=False)  # per-tensor norms fuse; foreach does not
    state, group = [optimizer.state[p] for p in plist], optimizer.param_groups[0]
    with torch.no_grad():
        adam(plist, [p.grad for p in plist], [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state], [],
             [s["step"] for s in state], foreach=False, capturable=group["capturable"], amsgrad=False,
             beta1=group["betas"][0], beta2=group["betas"][1], lr=lr, weight_decay=0.0, eps=group["eps"], maximize=False)
    return torch.cat([stats, grad_norm.unsqueeze(0)])


def make_optimizer(agent, lr, capturable: bool):
    """Adam's state, made here, not on a first step(): `update` applies Adam's functional form to it."""
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=capturable)
    for p in agent.parameters():
        step = torch.zeros((), device=p.device if capturable else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def make_units(n_obs: int, n_actions: int, args, device):
    """The agent, optimizer, lr, normalizer, units; an inference copy (same storage, no grad) acts and evaluates, but
    with --host-actor and a CUDA learner a host copy of actor_mean acts (`refresh` updates it), with the normalizer."""
    agent, agent_inference = Agent(n_obs, n_actions).to(device), Agent(n_obs, n_actions).to(device)
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    host = args.host_actor and device.type == "cuda"
    act_device = torch.device("cpu") if host else device
    acting = host_copy(agent.actor_mean, act_device) if host else agent_inference.actor_mean
    normalizer = Normalizer(args.num_envs, n_obs, args.gamma, act_device)
    lr = torch.tensor(args.learning_rate, device=device)  # changed in place: compiled code is not re-traced
    optimizer = make_optimizer(agent, lr, capturable=args.cudagraphs)  # CUDA graphs need the step on device
    u = SimpleNamespace(agent=agent, optimizer=optimizer, lr=lr, normalizer=normalizer, normalize=normalizer.obs,
                        act_device=act_device, acting=acting, policy=functools.partial(act, acting),
                        refresh=functools.partial(refresh, acting, agent.actor_mean) if host else lambda: None,
                        rollout_noise=agent_inference.rollout_noise, evaluate=agent_inference.forward,
                        get_value=agent_inference.get_value, update=functools.partial(update, agent, optimizer, lr, args))
    if args.compile:
        # on a CPU (the learner's or the host's) only what repays its compile, the per-step normalizer (~80 -> ~40 us)
        # and 320 updates an iteration; policy is slower compiled (~90 vs ~45 us), evaluate/get_value run once (save
        # < 1 ms). Default options: on CUDA max_autotune autotunes Triton GEMMs for minutes on tiny layers
        cuda_only = ("policy",) * (act_device.type == "cuda") + ("evaluate", "get_value") * (device.type == "cuda")
        for name in cuda_only + ("normalize", "update"):
            setattr(u, name, torch.compile(getattr(u, name)))
    if args.cudagraphs:  # CUDA graphs capture CUDA work only: units acting on the host stay out
        for name in ("policy", "normalize") * (act_device.type == "cuda") + ("evaluate", "get_value", "update"):
            setattr(u, name, CudaGraphModule(getattr(u, name)))
    return u


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return dict(device=str(device), torch=torch.__version__, cpu=f"{cpu} ({os.cpu_count()} cores)", gpu=gpu)


class StopFlag:
    """Ctrl-C (or SIGTERM) asks the loop to stop after the current iteration, so the checkpoint is consistent; a second
    one stops at once, and so does the first before any iteration is done (nothing to save; a compile takes minutes)."""
    def __init__(self):
        self.set = self.iterated = False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum, frame):
        if not self.iterated:
            print("\nstopped before the first iteration finished: nothing to save", file=sys.stderr, flush=True)
            os._exit(130)
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        print("\nstopping after this iteration (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr)


def load_checkpoint(args: Args) -> dict:
    """Agent, optimizer, normalizer statistics, RNGs, iteration and step count. envpool cannot snapshot the
    simulators, so a resumed run starts new episodes (with a fresh seed); the normalizer carries on."""
    if not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    script = os.path.basename(__file__)[: -len(".py")]
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        written_by, trained = ckpt.get("script", script), ckpt["args"]  # no "script": written before it was stored
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if written_by != script:
        fail(f"--resume {args.resume} was written by {written_by}.py; resume it with that script")
    for key in ("env_id", "num_envs", "num_steps"):
        if trained.get(key) != getattr(args, key):
            fail(f"--resume {args.resume} was trained with --{key.replace('_', '-')} {trained.get(key)}; pass the same")
    return ckpt


def main(args: Args):
    ckpt = check_args(args)
    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // args.batch_size
    script, log_dir = os.path.basename(__file__)[: -len(".py")], args.log_dir

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False
    envs = envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs,
                        seed=args.seed + (ckpt["global_step"] if ckpt else 0))  # a resumed run: new episodes
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    n_obs, n_actions = envs.observation_space.shape[0], envs.action_space.shape[0]
    action_bounds = (envs.action_space.low, envs.action_space.high)
    u = make_units(n_obs, n_actions, args, device)
    shape = (args.num_steps, args.num_envs)
    buf = dict(obs=torch.zeros(shape + (n_obs,), device=device), actions=torch.zeros(shape + (n_actions,), device=device),
               **{k: torch.zeros(shape, device=device) for k in ("logprobs", "rewards", "dones", "values")})
    stats_buf = torch.zeros(args.update_epochs * args.num_minibatches, 6, device=device)
    stats = EpisodeStats(args.num_envs)
    global_step, start_iteration = 0, 1
    if ckpt:
        u.agent.load_state_dict(ckpt["agent"])
        u.optimizer.load_state_dict(ckpt["optimizer"])
        u.normalizer.load_state_dict(ckpt["normalizer"])
        rng.set_state(ckpt["rng"])
        stats.returns.extend(ckpt["returns"].tolist())
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
    run = None
    if args.track:
        import wandb
        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                         name=os.path.basename(log_dir), dir=log_dir, save_code=True)
    metrics = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1)
    stop = StopFlag()
    bar = tqdm.tqdm(total=args.num_iterations * args.batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    if args.compile:  # the first iteration compiles: say so, or a first run looks stuck
        bar.write("compiling the units on their first call (a minute or more on a cold cache; later runs load them "
                  "from Inductor's on-disk cache)", file=sys.stderr)
        bar.set_description("compiling")
    next_obs = u.normalize(torch.from_numpy(envs.reset()[0]).to(u.act_device))  # with --compile, normalize compiles here
    next_done = np.zeros(args.num_envs, dtype=bool)
    iteration, start, iter_times, measure_from, fps, forced = start_iteration - 1, time.perf_counter(), [], None, None, False
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.anneal_lr:
                u.lr.fill_((1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate)
            u.refresh()  # the acting copy, if any, takes the last updates' (or the resumed checkpoint's) parameters
            noise = u.rollout_noise(buf["actions"].shape, rng).to(u.act_device)  # one draw, one transfer a rollout
            next_obs, next_done, t_env, t_policy = rollout(envs, u.policy, u.normalize, u.normalizer, next_obs,
                                                           next_done, buf, stats, noise, action_bounds)
            global_step += args.batch_size
            t_rollout = time.perf_counter() - t_iter
            t0 = time.perf_counter()
            logprobs, _, values = u.evaluate(buf["obs"], buf["actions"])  # the rollout's, in one batched call
            buf["logprobs"].copy_(logprobs)
            buf["values"].copy_(values)
            advantages, returns = gae(u.get_value(next_obs.to(device)), torch.from_numpy(next_done).to(device).float(),
                                      buf["rewards"], buf["dones"], buf["values"], args.gamma, args.gae_lambda)
            t_gae = time.perf_counter() - t0
            t0 = time.perf_counter()
            n, batch = 0, [x.flatten(0, 1) for x in
                           (buf["obs"], buf["actions"], buf["logprobs"], advantages, returns, buf["values"])]
            for epoch in range(args.update_epochs):
                perm = torch.randperm(args.batch_size, device=device, generator=rng).view(args.num_minibatches, -1)
                for inds in perm:
                    stats_buf[n] = u.update(*batch, inds)
                    n += 1
                if args.target_kl is not None and stats_buf[n - 1, 0] > args.target_kl:  # a host sync, only when asked
                    break
            t_update = time.perf_counter() - t0
            now = time.perf_counter()  # steady-state fps: whole iterations after the burn-in
            iter_times.append(now - t_iter)
            if iteration - start_iteration + 1 == args.measure_burnin:
                measure_from = (now, global_step)
            if measure_from and global_step > measure_from[1]:
                fps = (global_step - measure_from[1]) / (now - measure_from[0])
            row = dict(iteration=iteration, global_step=global_step, time=now - start, fps=fps,
                       episodic_return=stats.mean_return(), t_rollout=t_rollout, t_env=t_env, t_policy=t_policy,
                       t_gae=t_gae, t_update=t_update, lr=u.lr.item(),
                       **dict(zip(("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy", "grad_norm"),
                                  stats_buf[:n].mean(0).tolist())))  # the one host sync of the iteration
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            bar.update(args.batch_size)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            if args.compile and iteration == start_iteration:
                # every unit has compiled and nothing its guards check can change any more: stop checking them
                torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
                bar.set_description("")
            stop.iterated = True
            if stop.set:
                break
    except KeyboardInterrupt:  # the second Ctrl-C: stop mid-iteration, with no consistent state to save
        stop.set = forced = True
    finally:
        torch.compiler.set_stance("default")
        bar.close()
        metrics.close()
        envs.close()
    if args.save_model and not forced and iteration >= start_iteration:
        path = os.path.join(log_dir, "agent.pt")
        torch.save(dict(script=script, agent=u.agent.state_dict(), optimizer=u.optimizer.state_dict(),
                        normalizer=u.normalizer.state_dict(), args=asdict(args), iteration=iteration,
                        global_step=global_step, rng=rng.get_state(),
                        returns=torch.tensor(list(stats.returns), dtype=torch.float64)), path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write never leaves a truncated agent.pt

    steady = iter_times[args.measure_burnin:]
    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps if measure_from else None, final_return=stats.mean_return(),
                   compile_time=iter_times[0] - float(np.median(steady)) if args.compile and steady else None,
                   interrupted=stop.set)
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
