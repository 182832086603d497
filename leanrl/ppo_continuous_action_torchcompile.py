"""PPO for continuous control (MuJoCo through envpool, HalfCheetah-v4), cut into units that torch.compile and CUDA
graphs wrap.

The algorithm, network, normalization and defaults of ppo_continuous_action.py (CleanRL's). An iteration is 2048
sequential single-env steps, then 320 minibatch updates of 64 samples: each costs its overhead, not its arithmetic, so
the tricks remove machinery. Each in the function that holds it (doc/continuous_control.md measures each):

- `act`, `Agent.rollout_noise`: a rollout step only samples, mean + std * noise drawn once per rollout; the
  log-probabilities and values come from one batched forward per iteration (`Agent.forward`).
- `main`, the acting choice (its steps after the block): where the rollout acts, chosen once. A CPU learner acts
  with its own actor_mean and a CUDA learner with a host copy of it (--host-actor, `host_copy`, and `refresh` in the
  loop: a one-row step of a 64-unit MLP costs less there than GPU launches), the normalizer on the host too, in numpy
  on views of the tensors (--numpy-act, `numpy_units`) or in torch (`torch_normalize`, `torch_step`); a CUDA learner
  with --no-host-actor acts with the normalizer and policy units, the one case where the block graphs them.
- `rollout`: the env's outputs and the actions are staged in numpy and reach the buffers in one copy per iteration.
- `Normalizer`: the observation statistics are tensors updated in place where the rollout acts (compiled, one fused
  step); the reward scaling of a whole rollout is done at once from cumulative sums (`Normalizer.rewards`).
- `gae`: the deltas in torch, the recursion over numpy rows on the host.
- `update`, `adam_step`: torch.func.grad and torch.optim's functional Adam, so that compiled, forward, backward,
  clipping and the Adam step are one graph (loss.backward() and optimizer.step() would each break it).
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs),
  as in LeanRL's file; lr is a tensor changed in place (no recompilation); the update's guards are checked on an
  iteration's first minibatch and skipped on the rest, so a number the loop changes is never frozen.

    python leanrl/ppo_continuous_action_torchcompile.py --compile               # CPU or GPU
    python leanrl/ppo_continuous_action_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the units
"""

import copy
import functools
import math
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
from tensordict import from_module
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

    env_id: str = "HalfCheetah-v4"
    """the id of the environment (any continuous-action envpool task: MuJoCo's, Pendulum-v1, ...)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (more than one: the envs share one set of observation and reward
    statistics, where CleanRL's wrappers keep one per env)"""
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
    """if toggled, wrap the units in torch.compile: `update`, the observation normalizer where it runs in torch, and on
    CUDA `evaluate`, `get_value` (once an iteration each: on a CPU not worth their compile) and the policy step where it
    acts there (--no-host-actor; a rollout acting on the host, a CPU learner's or --host-actor's, normalizes and acts in
    numpy, or with the normalizer compiled and the policy eager: main's acting choice); `gae` runs in numpy, with
    nothing to compile"""
    cudagraphs: bool = False
    """if toggled, wrap the units that run on CUDA in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    host_actor: bool = True
    """with a CUDA learner, act with a host copy of actor_mean (refreshed after each iteration's updates: ~20 KB) and
    the normalizer on the host: a one-row 64-unit MLP step costs less there than GPU launches. CPU: no copy"""
    numpy_act: bool = True
    """if toggled, a rollout that acts on the CPU (a CPU learner's, or the --host-actor copy) normalizes the obs and
    acts through numpy views of the normalizer's statistics and of actor_mean's weights: at one row a torch call is
    all per-op dispatch"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent, optimizer and normalizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (envpool cannot snapshot its simulators: the
    episodes restart)"""
    num_threads: int = 1
    """torch intra-op threads (1 measures fastest for these 64-unit layers)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "mujoco", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    plumbing.positive_finite(args, "learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    plumbing.non_negative_finite(args, "ent_coef", "vf_coef")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    # the rollout: float32 observations and actions, and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "mujoco", rollout=batch_size * (sum(plumbing.spaces(args.env_id)) + 4) * 4)
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps"), step=batch_size)


def env_step(envs, action: np.ndarray):
    """One step with CleanRL's (gymnasium's SAME_STEP) auto-reset. envpool 1.2.5 resets an env on the step *after* its
    episode ended (action ignored, reward 0): resetting at once keeps the dead step out of the batch (one call more).
    Returns the obs, reward, termination, done and the last obs of the episodes that ended."""
    obs, reward, terminated, truncated, _ = envs.step(action)
    done = terminated | truncated
    last = obs[done]
    if done.any():
        obs[done] = envs.reset(np.flatnonzero(done))[0]
    return obs, reward, terminated, done, last


class Normalizer:
    """CleanRL's NormalizeObservation + clip and NormalizeReward + clip, as ppo_continuous_action.py's (gymnasium's
    semantics: an episode's last obs enters the statistics, the discounted return restarts only at a termination) for
    all envs at once (one set of statistics fed every env's values each step, where CleanRL's wrappers keep one per
    env: the same at its default of one env). The statistics (mean, population variance, count; from gymnasium's 0, 1,
    1e-4) are float64 tensors where the rollout acts, updated in place so compiled code and CUDA graphs keep reading
    the same storage; the discounted returns accumulate on the host."""

    def __init__(self, num_envs: int, obs_dim: int, gamma: float, device, clip: float = 10.0, eps: float = 1e-8):
        f64 = dict(dtype=torch.float64, device=device)
        # count of shape (1,): torch 2.13's compiled code drops in-place writes to a 0-dim tensor read from an object
        self.obs_rms = SimpleNamespace(
            mean=torch.zeros((obs_dim,), **f64), var=torch.ones((obs_dim,), **f64), count=torch.full((1,), 1e-4, **f64)
        )
        self.ret_rms = SimpleNamespace(
            mean=torch.zeros((), **f64), var=torch.ones((), **f64), count=torch.full((1,), 1e-4, **f64)
        )
        self.ret = np.zeros(num_envs)  # each env's discounted return so far in its episode
        self.gamma = gamma
        self.clip = clip
        self.eps = eps

    def observe(self, obs):
        """Merge observations into the statistics (Chan et al.'s parallel update), in place. Called alone (eager) for
        the last obs of ended episodes, which the agent does not act on."""
        s = self.obs_rms
        n = obs.shape[0]
        delta = obs.mean(0) - s.mean
        total = s.count + n
        s.var.copy_((s.var * s.count + obs.var(0, unbiased=False) * n + delta**2 * s.count * n / total) / total)
        s.mean.add_(delta * n / total)
        s.count.copy_(total)

    def obs(self, obs):
        """Merge the obs the agent is about to see into the statistics; normalize it."""
        self.observe(obs)
        s = self.obs_rms
        return ((obs - s.mean) / (s.var + self.eps).sqrt()).clamp(-self.clip, self.clip).float()

    def discounted_return(self, reward: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        """One step of each env's discounted return (host, numpy), gymnasium's `return * gamma * (1 - terminated) +
        reward`: its value after this step's reward."""
        self.ret = self.ret * self.gamma * (1 - terminated) + reward
        return self.ret.copy()

    def rewards(self, rewards, returns):
        """A rollout's rewards [steps, envs] scaled by the std of the discounted return, the statistics merged with
        each step's returns in turn, at once: a union's count, sum and sum of squares are cumulative sums (float64)."""
        s = self.ret_rms
        x = returns.double()
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


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()

        def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
            torch.nn.init.orthogonal_(layer.weight, std)
            torch.nn.init.constant_(layer.bias, bias_const)
            return layer

        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )
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


def numpy_units(actor_mean: nn.Sequential, normalizer: Normalizer):
    """`Normalizer.obs` and `act` on the CPU in numpy, from views of the normalizer's statistics (updated in place, as
    the torch unit does) and of actor_mean's weights: they share the tensors' memory, so every update, refresh and
    resume is seen without a copy."""
    layers = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in actor_mean if isinstance(m, nn.Linear)]
    mean = normalizer.obs_rms.mean.numpy()
    var = normalizer.obs_rms.var.numpy()
    count = normalizer.obs_rms.count.numpy()

    def normalize(obs: np.ndarray) -> np.ndarray:
        n = obs.shape[0]
        delta = obs.mean(0) - mean
        total = count + n
        var[:] = (var * count + obs.var(0) * n + delta**2 * count * n / total) / total
        mean[:] = mean + delta * n / total
        count[:] = total
        x = (obs - mean) / np.sqrt(var + normalizer.eps)
        return np.clip(x, -normalizer.clip, normalizer.clip).astype(np.float32)

    def policy(obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        x = obs
        for w, b in layers[:-1]:
            x = np.tanh(x @ w.T + b)
        w, b = layers[-1]
        return x @ w.T + b + noise

    return normalize, policy


def host_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `module` on `device` to act with: storage of its own, no autograd; `refresh` keeps it current."""
    return copy.deepcopy(module).requires_grad_(False).to(device)


def refresh(acting: nn.Module, learner: nn.Module):
    """The learner's parameters into its acting copy, in one transfer (~20 KB), copied in place: views of the copy's
    weights (`numpy_units`) stay valid."""
    flat = nn.utils.parameters_to_vector(learner.parameters()).to(next(acting.parameters()).device)
    params = list(acting.parameters())
    with torch.no_grad():
        torch._foreach_copy_(params, [x.view_as(p) for x, p in zip(flat.split([p.numel() for p in params]), params)])


def torch_normalize(normalize, device, obs: np.ndarray):
    """A torch normalizer step as the rollout calls it: the env's numpy obs in, moved to `device` where the rollout
    acts (a no-op on the host), the normalized obs out, there."""
    return normalize(torch.from_numpy(obs).to(device, non_blocking=True))


def torch_step(policy, obs, noise) -> np.ndarray:
    """A torch policy step as the rollout calls it: the normalized obs and the step's row of the noise in, where the
    rollout acts, numpy actions out."""
    return policy(obs, noise).cpu().numpy()


def rollout(envs, policy, normalize, numpy_act: bool, normalizer, next_obs, next_done, buf, noise, action_bounds):
    """num_steps steps of every env into `buf`, acting with `normalize` and `policy` (main's acting choice; numpy steps
    with `numpy_act`) and `noise` where `policy` reads it; returns the last obs (as `normalize` gives it) and done, the
    raw rewards and the dones after each step (numpy, for the loop's episode statistics), and the time split.
    Staged in numpy (obs in a list, as `normalize` gives them), each field reaches `buf` in one copy."""
    num_steps = buf["obs"].shape[0]
    device = normalizer.obs_rms.mean.device  # where the rollout acts
    dones = np.empty(buf["dones"].shape, np.float32)
    rewards = np.empty(buf["rewards"].shape, np.float32)
    ended = np.empty(buf["dones"].shape, bool)
    returns = np.empty(buf["rewards"].shape)
    actions = np.empty(buf["actions"].shape, np.float32)
    obs = []
    t_env = 0.0
    t_policy = 0.0
    if numpy_act:
        noise = noise.numpy()  # a view
    for step in range(num_steps):
        obs.append(next_obs)
        dones[step] = next_done
        t0 = time.perf_counter()
        actions[step] = policy(next_obs, noise[step])
        t1 = time.perf_counter()
        raw_obs, reward, terminated, next_done, last = env_step(envs, np.clip(actions[step], *action_bounds))
        t2 = time.perf_counter()
        if len(last):  # before the reset's obs, as gymnasium's NormalizeObservation sees them
            normalizer.observe(torch.from_numpy(last).to(device))
        next_obs = normalize(raw_obs)
        t_env += t2 - t1
        t_policy += t1 - t0 + time.perf_counter() - t2
        rewards[step] = reward
        returns[step] = normalizer.discounted_return(reward, terminated)
        ended[step] = next_done
    buf["obs"].copy_(torch.from_numpy(np.stack(obs)) if numpy_act else torch.stack(obs), non_blocking=True)
    buf["actions"].copy_(torch.from_numpy(actions), non_blocking=True)
    buf["dones"].copy_(torch.from_numpy(dones), non_blocking=True)
    buf["rewards"].copy_(normalizer.rewards(torch.from_numpy(rewards).to(device), torch.from_numpy(returns).to(device)))
    return next_obs, next_done, rewards, ended, t_env, t_policy


def gae(next_value, next_done, rewards, dones, values, gamma: float, gae_lambda: float):
    """CleanRL's GAE: deltas and discounts at once in torch, the recursion over numpy rows on the host: a
    loop of torch ops is thousands of tiny dispatches, and torch.compile takes minutes to unroll it
    (doc/continuous_control.md)."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.unsqueeze(0)])
    nextvalues = torch.cat([values[1:], next_value.unsqueeze(0)])
    deltas = (rewards + gamma * nextvalues * nextnonterminal - values).cpu().numpy()
    discounts = (gamma * gae_lambda * nextnonterminal).cpu().numpy()
    advantages = np.empty_like(deltas)
    lastgaelam = np.zeros_like(deltas[0])
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
    pg_loss = torch.max(
        -advantages * ratio, -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    ).mean()
    if args.clip_vloss:
        v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return loss, torch.stack([approx_kl, clipfrac, pg_loss, v_loss, entropy_loss]).detach()


def update(agent, optimizer, args, obs, actions, logprobs, advantages, returns, values, inds):
    """One minibatch step; returns [approx_kl, clipfrac, pg_loss, v_loss, entropy, grad_norm]. torch.func.grad and
    torch.optim's functional Adam on the optimizer's state: compiled, one graph (backward(), step() would break it)."""
    params = {name: p.detach() for name, p in agent.named_parameters()}
    grads, stats = torch.func.grad(ppo_loss, has_aux=True)(
        params, agent, args, obs[inds], actions[inds], logprobs[inds], advantages[inds], returns[inds], values[inds]
    )
    plist = list(agent.parameters())
    for p, name in zip(plist, params):
        p.grad = grads[name]
    # per-tensor norms fuse; foreach does not
    grad_norm = nn.utils.clip_grad_norm_(plist, args.max_grad_norm, foreach=False)
    adam_step(optimizer, plist, [p.grad for p in plist])
    return torch.cat([stats, grad_norm.unsqueeze(0)])


def make_optimizer(agent, lr, capturable: bool):
    """torch.optim.Adam owns the state (its state_dict is checkpointed), created here: `adam_step` steps it.
    `capturable` where the learner is on CUDA: the step counters live on the device, so a step reads nothing on the
    host and CUDA graphs can replay it."""
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=capturable)
    for p in agent.parameters():
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


def main(args: Args):
    ckpt = check_args(args)
    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // args.batch_size
    global_step = ckpt["global_step"] if ckpt else 0
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)

    # envpool cannot snapshot its simulators: a resumed run starts new episodes, from a seed of its own
    envs = envpool.make(
        args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=plumbing.envpool_seed(args.seed + global_step)
    )
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    n_obs = envs.observation_space.shape[0]
    n_actions = envs.action_space.shape[0]
    action_bounds = (envs.action_space.low, envs.action_space.high)
    agent = Agent(n_obs, n_actions).to(device)
    # the inference copy: the learner's storage as plain tensors without requires_grad (tensordict >= 0.14 would
    # otherwise keep Parameters of its own, requires_grad and all, and only swap their data)
    agent_inference = Agent(n_obs, n_actions).to(device)
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    lr = torch.tensor(args.learning_rate, device=device)  # changed in place: compiled code is not re-traced
    optimizer = make_optimizer(agent, lr, capturable=device.type == "cuda")

    # Where the rollout acts, chosen here once, the normalizer's statistics with it: a CPU learner's own actor_mean, a
    # CUDA learner's host copy (--host-actor: a one-row step of a 64-unit MLP costs less there than GPU launches) or the
    # device; on the host in numpy, on views of the statistics and weights (--numpy-act: at one row a torch call is all
    # per-op dispatch), or in torch.
    host = device.type == "cuda" and args.host_actor
    act_device = torch.device("cpu") if host else device
    acting = host_copy(agent.actor_mean, act_device) if host else agent_inference.actor_mean
    normalizer = Normalizer(args.num_envs, n_obs, args.gamma, act_device)
    numpy_act = args.numpy_act and act_device.type == "cpu"

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs (CUDA only: off,
    # with one line, elsewhere); the minibatch loop checks the update's guards once an iteration (set_stance).
    normalize = normalizer.obs
    policy = functools.partial(act, acting)
    evaluate = agent_inference.forward
    get_value = agent_inference.get_value
    update_minibatch = functools.partial(update, agent, optimizer, args)
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        # default options: on CUDA max_autotune would spend minutes autotuning Triton GEMMs for these tiny layers
        if not numpy_act:  # in torch, on the host too: one fused step instead of several ops
            normalize = torch.compile(normalize)
        if act_device.type == "cuda":  # on the host it stays eager: compiled it is slower (doc/continuous_control.md)
            policy = torch.compile(policy)
        # evaluate and get_value run once an iteration: on a CPU compiling them adds seconds to a cold start and buys
        # no fps (doc/compile.md); on CUDA each is one graph instead of dozens of kernel launches
        if device.type == "cuda":
            evaluate = torch.compile(evaluate)
            get_value = torch.compile(get_value)
        update_minibatch = torch.compile(update_minibatch)
    if args.cudagraphs:
        if act_device.type == "cuda":
            normalize = CudaGraphModule(normalize)
            policy = CudaGraphModule(policy)
        evaluate = CudaGraphModule(evaluate)
        get_value = CudaGraphModule(get_value)
        update_minibatch = CudaGraphModule(update_minibatch)
    # the rollout's steps, as it acts: the env's numpy obs in, normalized obs out; those and the noise in, numpy actions
    if numpy_act:
        normalize_step, policy_step = numpy_units(acting, normalizer)
    else:
        normalize_step = functools.partial(torch_normalize, normalize, act_device)
        policy_step = functools.partial(torch_step, policy)

    buf = {
        k: torch.zeros((args.num_steps, args.num_envs) + dims, device=device)
        for k, dims in (("obs", (n_obs,)), ("actions", (n_actions,)), ("rewards", ()), ("dones", ()))
    }
    stats = torch.zeros(args.update_epochs * args.num_minibatches, 6, device=device)
    episodes = plumbing.Episodes(args.num_envs)
    parts = dict(agent=agent, optimizer=optimizer, normalizer=normalizer, rng=rng, episodes=episodes)
    if ckpt:
        plumbing.resume(ckpt, args.seed, restart=True, **parts)  # envpool cannot save its envs: new episodes

    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step)
    iteration = start_iteration - 1
    with run:
        next_obs = normalize_step(envs.reset()[0])  # a compiled normalizer compiles here
        next_done = np.zeros(args.num_envs, dtype=bool)
        for iteration in range(start_iteration, args.num_iterations + 1):
            t0 = time.perf_counter()
            if args.anneal_lr:
                lr.fill_((1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate)
            if host:
                refresh(acting, agent.actor_mean)  # the last updates' (or the resumed checkpoint's) parameters
            noise = agent_inference.rollout_noise(buf["actions"].shape, rng).to(act_device)  # one draw, one transfer
            next_obs, next_done, rewards, ended, t_env, t_policy = rollout(
                envs, policy_step, normalize_step, numpy_act, normalizer, next_obs, next_done, buf, noise, action_bounds
            )
            episodes.record_steps(rewards, ended)
            global_step += args.batch_size

            t1 = time.perf_counter()
            last_obs = torch.as_tensor(next_obs, device=device)  # as the rollout's obs reach the buffer
            last_done = torch.from_numpy(next_done).to(device).float()
            buf["logprobs"], _, buf["values"] = evaluate(buf["obs"], buf["actions"])  # in one batched call
            buf["advantages"], buf["returns"] = gae(
                get_value(last_obs), last_done, buf["rewards"], buf["dones"], buf["values"], args.gamma, args.gae_lambda
            )

            t2 = time.perf_counter()
            batch = [buf[k].flatten(0, 1) for k in ("obs", "actions", "logprobs", "advantages", "returns", "values")]
            n = 0
            for _epoch in range(args.update_epochs):
                for inds in torch.randperm(args.batch_size, device=device, generator=rng).chunk(args.num_minibatches):
                    # the iteration's first update checks the compiled code's guards, and so sees every number the loop
                    # changed (a float lr, a schedule); the rest skip them (doc/compile.md: what it saves)
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=n > 0):
                        stats[n] = update_minibatch(*batch, inds)
                    n += 1
                if args.target_kl is not None and stats[n - 1, 0] > args.target_kl:  # a host sync, only when asked
                    break
            t3 = time.perf_counter()

            losses = stats[:n].mean(0).tolist()  # the one host sync of the iteration
            run.log(
                global_step,
                steady=iteration - start_iteration + 1 >= args.measure_burnin,
                iteration=iteration,
                episodic_return=episodes.mean(),
                t_rollout=t1 - t0,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t2 - t1,
                t_update=t3 - t2,
                lr=lr.item(),
                **dict(zip(("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy", "grad_norm"), losses)),
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if run.stopping:
                break
    envs.close()
    run.save(iteration=iteration, global_step=global_step, **parts)
    run.finish(global_step, episodes.mean(), run.compile_time() if args.compile else None)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
