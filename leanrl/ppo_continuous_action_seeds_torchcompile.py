"""PPO for continuous control (MuJoCo through envpool, HalfCheetah-v4), --num-seeds agents in one program:
ppo_continuous_action_torchcompile.py plus that.

The trick, in the functions that hold it (doc/seeds.md measures it):

- `stack_members`: member k is the agent `ppo_continuous_action_torchcompile.py --seed <seed + k>` would build, its
  parameters stacked with the others' along a leading dimension (torch.func.stack_module_state); one Adam over the
  stacked parameters steps each member as its own would (Adam is elementwise).
- `update`, `evaluate`, the acting step: torch.func.vmap over the base's functional units, so that every member's
  minibatch, advantage normalization, loss and gradient come from one call; `clip_members` clips each member's
  gradient by its own norm.
- `Normalizer`: each member's observation and reward statistics, stacked, updated in one call for all members.
- `make_envs`, `rollout`: the members' envs step as one envpool pool (one env each: env k is seeded as member k's
  run seeds its env), or a pool per member (more envs each); each member draws its exploration noise and minibatch
  order from its own generator.

The algorithm, network, normalization and defaults of ppo_continuous_action.py (CleanRL's). An iteration is 2048
sequential single-env steps, then 320 minibatch updates of 64 samples: each costs its overhead, not its arithmetic, so
the base's tricks remove machinery. Each in the function that holds it (doc/continuous_control.md measures each):

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
- `update`, `member_adam_step`: torch.func.grad and Adam's step written out with one lr per member, so that
  compiled, forward, backward, clipping and the Adam step are one graph (loss.backward() and optimizer.step() would
  each break it).
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs),
  as in LeanRL's file; lr is a tensor changed in place (no recompilation); the update's guards are checked on an
  iteration's first minibatch and skipped on the rest, so a number the loop changes is never frozen.

    python leanrl/ppo_continuous_action_seeds_torchcompile.py --compile --num-seeds 4               # CPU or GPU
    python leanrl/ppo_continuous_action_seeds_torchcompile.py --compile --cudagraphs --num-seeds 64  # GPU
"""

import functools
import math
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
from tensordict.nn import CudaGraphModule

import plumbing

SCRIPT = plumbing.script_name(__file__)


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment, recorded with the flags (summary.json, wandb's config); the log dir is
    --log-dir's, by default named after the script"""
    seed: int = 1
    """seed of the first member: member k is the run of seed + k"""
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
    learning_rates: tuple[float, ...] = ()
    """one learning rate per member (as many as --num-seeds), a sweep in one program: member k is the run of
    --learning-rate <its value>; empty: --learning-rate for every member"""
    ent_coefs: tuple[float, ...] = ()
    """one entropy coefficient per member (as many as --num-seeds); empty: --ent-coef for every member"""
    clip_coefs: tuple[float, ...] = ()
    """one surrogate clipping coefficient per member (as many as --num-seeds); empty: --clip-coef for every member"""
    num_seeds: int = 4
    """how many agents train side by side: member k is `ppo_continuous_action_torchcompile.py --seed <seed + k>`; the
    steps, fps and budgets are each member's (the program steps num_seeds times as many)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "mujoco", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_seeds")
    if args.target_kl is not None:
        plumbing.fail(
            "--target-kl stops each member's epochs at its own time, and the members update together here: run "
            "ppo_continuous_action_torchcompile.py once per seed for it"
        )
    plumbing.positive_finite(args, "learning_rate", "learning_rates", "clip_coef", "clip_coefs", "max_grad_norm")
    plumbing.non_negative_finite(args, "ent_coef", "ent_coefs", "vf_coef")
    plumbing.one_per_member(args, "learning_rates", "ent_coefs", "clip_coefs")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    # the rollout: float32 observations and actions, and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(
        args,
        "mujoco",
        args.num_seeds,
        rollout=args.num_seeds * batch_size * (sum(plumbing.spaces(args.env_id)) + 4) * 4,
    )
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps", "num_seeds"), step=batch_size)


def make_envs(args: Args, seed: int) -> list:
    """Every member's envs as its run makes them, in envpool pools: envpool seeds env i of a pool with seed + i, so one
    env per member is one pool of num_seeds envs (env k is member k's, seeded seed + k), stepped in one call; with
    more envs per member the members' seeds overlap, and each member gets a pool of its own."""

    def make(seed, num_envs):
        return envpool.make(args.env_id, env_type="gymnasium", num_envs=num_envs, seed=plumbing.envpool_seed(seed))

    if args.num_envs == 1:
        return [make(seed, args.num_seeds)]
    return [make(seed + k, args.num_envs) for k in range(args.num_seeds)]


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


def pools_step(pools: list, action: np.ndarray):
    """`env_step` of every pool, each pool its share of the actions; the outputs in a row, member k's envs
    k * num_envs ... (k + 1) * num_envs - 1."""
    parts = [env_step(envs, a) for envs, a in zip(pools, np.split(action, len(pools)))]
    return [np.concatenate(x) for x in zip(*parts)]


class Normalizer:
    """CleanRL's NormalizeObservation + clip and NormalizeReward + clip, as ppo_continuous_action.py's (gymnasium's
    semantics: an episode's last obs enters the statistics, the discounted return restarts only at a termination) for
    each member's envs at once (one set of statistics per member, fed its envs' values each step; the sets stacked,
    member first). The statistics (mean, population variance, count; from gymnasium's 0, 1, 1e-4) are float64 tensors
    where the rollout acts, updated in place so compiled code and CUDA graphs keep reading the same storage; the
    discounted returns accumulate on the host."""

    def __init__(
        self, num_seeds: int, num_envs: int, obs_dim: int, gamma: float, device, clip: float = 10.0, eps: float = 1e-8
    ):
        f64 = dict(dtype=torch.float64, device=device)
        self.obs_rms = SimpleNamespace(
            mean=torch.zeros((num_seeds, obs_dim), **f64),
            var=torch.ones((num_seeds, obs_dim), **f64),
            count=torch.full((num_seeds, 1), 1e-4, **f64),
        )
        self.ret_rms = SimpleNamespace(
            mean=torch.zeros((num_seeds,), **f64),
            var=torch.ones((num_seeds,), **f64),
            count=torch.full((num_seeds,), 1e-4, **f64),
        )
        self.ret = np.zeros(num_seeds * num_envs)  # each env's discounted return so far in its episode
        self.gamma = gamma
        self.clip = clip
        self.eps = eps

    def observe(self, obs, member: Optional[int] = None):
        """Merge observations, (num_seeds, n, obs_dim), into each member's statistics (Chan et al.'s parallel update),
        in place; or `member`'s rows, (n, obs_dim), into its own. Called alone (eager) for the last obs of ended
        episodes, which the agent does not act on."""
        s = self.obs_rms
        mean, var, count = (
            (s.mean, s.var, s.count) if member is None else (s.mean[member], s.var[member], s.count[member])
        )
        n = obs.shape[-2]
        delta = obs.mean(-2) - mean
        total = count + n
        var.copy_((var * count + obs.var(-2, unbiased=False) * n + delta**2 * count * n / total) / total)
        mean.add_(delta * n / total)
        count.copy_(total)

    def obs(self, obs):
        """Merge the obs the agent is about to see, (num_seeds, num_envs, obs_dim), into the statistics; normalize
        it."""
        self.observe(obs)
        s = self.obs_rms
        x = (obs - s.mean.unsqueeze(1)) / (s.var.unsqueeze(1) + self.eps).sqrt()
        return x.clamp(-self.clip, self.clip).float()

    def discounted_return(self, reward: np.ndarray, terminated: np.ndarray) -> np.ndarray:
        """One step of each env's discounted return (host, numpy), gymnasium's `return * gamma * (1 - terminated) +
        reward`: its value after this step's reward."""
        self.ret = self.ret * self.gamma * (1 - terminated) + reward
        return self.ret.copy()

    def rewards(self, rewards, returns):
        """A rollout's rewards [steps, members, envs] scaled by the std of each member's discounted return, its
        statistics merged with each step's returns in turn, at once: a union's count, sum and sum of squares are
        cumulative sums (float64)."""
        s = self.ret_rms
        x = returns.double()
        steps = torch.arange(1, x.shape[0] + 1, dtype=x.dtype, device=x.device).unsqueeze(1)
        counts = s.count + x.shape[2] * steps
        means = (s.count * s.mean + x.sum(2).cumsum(0)) / counts
        var = (s.count * (s.var + s.mean**2) + (x**2).sum(2).cumsum(0)) / counts - means**2
        s.mean.copy_(means[-1])
        s.var.copy_(var[-1])
        s.count.copy_(counts[-1])
        return (rewards / (var + self.eps).sqrt().unsqueeze(2)).clamp(-self.clip, self.clip).float()

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


def stack_members(args: Args, n_obs: int, n_actions: int, device) -> tuple:
    """Member k's Agent as `ppo_continuous_action_torchcompile.py --seed <seed + k>` builds it (torch's generator
    seeded, then the Agent), the members' parameters stacked along a leading dimension. Returns a parameter-less Agent
    to call with them (torch.func.functional_call) and the stacked parameters, leaves that the optimizer steps."""
    members = []
    for k in range(args.num_seeds):
        torch.manual_seed(args.seed + k)
        members.append(Agent(n_obs, n_actions).to(device))
    params, _ = torch.func.stack_module_state(members)
    return members[0].to("meta"), params


def part(params: dict, module: str) -> dict:
    """The parameters of one submodule (`actor_mean`, `critic`), named as in it."""
    return {name.removeprefix(module + "."): p for name, p in params.items() if name.startswith(module + ".")}


def members_call(module: nn.Module, params: dict, *inputs, dim: int = 0):
    """`module` run by every member with its own parameters on its own inputs, the members along `dim` of the inputs
    and of the outputs (torch.func.vmap over functional_call): one call for all."""
    call = functools.partial(torch.func.functional_call, module)
    return torch.vmap(call, in_dims=(0, dim), out_dims=dim)(params, inputs)


def rollout_noise(logstd, shape, rngs: list):
    """Each member's rollout noise as its run draws it (`Agent.rollout_noise`), std * N(0, 1) from its own generator:
    (num_steps, num_seeds, num_envs, n_actions)."""
    return torch.stack([s.exp() * torch.randn(shape, device=s.device, generator=g) for s, g in zip(logstd, rngs)], 1)


def act(actor_mean, params, x, noise):
    """One rollout step of every member, a sample of Normal(mean, std), nothing else: log-probs and values come
    afterwards. x: (num_seeds, num_envs, n_obs); the actions: every member's envs in a row, as the rollout stores
    them."""
    return (members_call(actor_mean, params, x) + noise).flatten(0, 1)


def numpy_units(actor_mean: dict, normalizer: Normalizer):
    """`Normalizer.obs` and `act` on the CPU in numpy, from views of the normalizer's statistics (updated in place, as
    the torch unit does) and of the members' stacked actor_mean weights: they share the tensors' memory, so every
    update, refresh and resume is seen without a copy. Observations: every member's envs in a row."""
    linears = [name.removesuffix(".weight") for name in actor_mean if name.endswith(".weight")]  # in order
    layers = [(actor_mean[f"{n}.weight"].numpy(), actor_mean[f"{n}.bias"].numpy()[:, None]) for n in linears]
    mean = normalizer.obs_rms.mean.numpy()
    var = normalizer.obs_rms.var.numpy()
    count = normalizer.obs_rms.count.numpy()

    def normalize(obs: np.ndarray) -> np.ndarray:
        obs = obs.reshape(mean.shape[:1] + (-1,) + obs.shape[1:])  # (num_seeds, num_envs, n_obs)
        n = obs.shape[1]
        delta = obs.mean(1) - mean
        total = count + n
        var[:] = (var * count + obs.var(1) * n + delta**2 * count * n / total) / total
        mean[:] = mean + delta * n / total
        count[:] = total
        x = (obs - mean[:, None]) / np.sqrt(var[:, None] + normalizer.eps)
        return np.clip(x, -normalizer.clip, normalizer.clip).astype(np.float32)

    def policy(obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        x = obs
        for w, b in layers[:-1]:
            x = np.tanh(x @ w.transpose(0, 2, 1) + b)
        w, b = layers[-1]
        return (x @ w.transpose(0, 2, 1) + b + noise).reshape(-1, w.shape[1])

    return normalize, policy


def host_copy(params: dict, device: torch.device) -> dict:
    """A copy of `params` on `device` to act with: storage of its own, no autograd; `refresh` keeps it current."""
    return {name: p.detach().to(device, copy=True) for name, p in params.items()}


def refresh(acting: dict, learner: dict):
    """The learner's parameters into its acting copy, in one transfer, copied in place: views of the copy's weights
    (`numpy_units`) stay valid."""
    flat = nn.utils.parameters_to_vector(learner.values()).to(next(iter(acting.values())).device)
    params = list(acting.values())
    with torch.no_grad():
        torch._foreach_copy_(params, [x.view_as(p) for x, p in zip(flat.split([p.numel() for p in params]), params)])


def torch_normalize(normalize, device, shape: tuple, obs: np.ndarray):
    """A torch normalizer step as the rollout calls it: the env's numpy obs in (every member's envs in a row), moved to
    `device` where the rollout acts (a no-op on the host) as `shape`, the normalized obs out, there."""
    return normalize(torch.from_numpy(obs).to(device, non_blocking=True).view(shape))


def torch_step(policy, obs, noise) -> np.ndarray:
    """A torch policy step as the rollout calls it: the normalized obs and the step's row of the noise in, where the
    rollout acts, numpy actions out."""
    return policy(obs, noise).cpu().numpy()


def rollout(pools, policy, normalize, numpy_act: bool, normalizer, next_obs, next_done, buf, noise, action_bounds):
    """num_steps steps of every env into `buf`, acting with `normalize` and `policy` (main's acting choice; numpy steps
    with `numpy_act`) and `noise` where `policy` reads it; returns the last obs (as `normalize` gives it) and done, the
    raw rewards and the dones after each step (numpy, for the loop's episode statistics), and the time split.
    Staged in numpy (obs in a list, as `normalize` gives them), each field reaches `buf` in one copy.
    `buf`: (num_steps, num_seeds, num_envs, ...)."""
    num_steps = buf["obs"].shape[0]
    num_envs = buf["dones"].shape[2]
    device = normalizer.obs_rms.mean.device  # where the rollout acts
    dones = np.empty((num_steps,) + next_done.shape, np.float32)
    rewards = np.empty((num_steps,) + next_done.shape, np.float32)
    ended = np.empty((num_steps,) + next_done.shape, bool)
    returns = np.empty((num_steps,) + next_done.shape)
    actions = np.empty((num_steps,) + next_done.shape + buf["actions"].shape[-1:], np.float32)
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
        raw_obs, reward, terminated, next_done, last = pools_step(pools, np.clip(actions[step], *action_bounds))
        t2 = time.perf_counter()
        if len(last):  # before the reset's obs, as gymnasium's NormalizeObservation sees them; each member its own
            owners = np.flatnonzero(next_done) // num_envs
            for k in np.unique(owners):
                normalizer.observe(torch.from_numpy(last[owners == k]).to(device), k)
        next_obs = normalize(raw_obs)
        t_env += t2 - t1
        t_policy += t1 - t0 + time.perf_counter() - t2
        rewards[step] = reward
        returns[step] = normalizer.discounted_return(reward, terminated)
        ended[step] = next_done
    buf["obs"].copy_(torch.from_numpy(np.stack(obs)) if numpy_act else torch.stack(obs), non_blocking=True)
    buf["actions"].copy_(torch.from_numpy(actions).view(buf["actions"].shape), non_blocking=True)
    buf["dones"].copy_(torch.from_numpy(dones).view(buf["dones"].shape), non_blocking=True)
    scaled = (torch.from_numpy(x).to(device).view(buf["rewards"].shape) for x in (rewards, returns))
    buf["rewards"].copy_(normalizer.rewards(*scaled))
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


def update(agent, params, optimizer, coefs, args, obs, actions, logprobs, advantages, returns, values, inds):
    """One minibatch step of every member, each on its own minibatch (`inds`: (num_seeds, minibatch_size); the data
    member first) with its own clip and entropy coefficients (`coefs`: (num_seeds, 2)) and learning rate (the
    optimizer's `lr`: (num_seeds,)). Returns [approx_kl, clipfrac, pg_loss, v_loss, entropy, grad_norm] per member.
    The base's step under torch.func.vmap: each member's gradient of its own loss, clipped by its own norm, then one
    Adam step over the stacked parameters, which is each member's own step (Adam is elementwise)."""

    def member_grad(p, coef, obs, actions, logprobs, advantages, returns, values, inds):
        batch = [x[inds] for x in (obs, actions, logprobs, advantages, returns, values)]
        member_args = replace(args, clip_coef=coef[0], ent_coef=coef[1])
        return torch.func.grad(ppo_loss, has_aux=True)(p, agent, member_args, *batch)

    detached = {name: p.detach() for name, p in params.items()}
    grads, stats = torch.vmap(member_grad)(detached, coefs, obs, actions, logprobs, advantages, returns, values, inds)
    grads = [grads[name] for name in params]
    grad_norm = clip_members(grads, args.max_grad_norm)
    member_adam_step(optimizer, list(params.values()), grads)
    return torch.cat([stats, grad_norm.unsqueeze(1)], 1)


def clip_members(grads: list, max_norm: float):
    """clip_grad_norm_ of each member on its own (in place): its norm over its own slices of the stacked gradients,
    per tensor then over the tensors, as torch's. Returns the members' norms before clipping."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])
    total = torch.linalg.vector_norm(norms, dim=0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view((-1,) + (1,) * (g.dim() - 1)))
    return total


def make_optimizer(params: list, lr, capturable: bool):
    """torch.optim.Adam owns the state (its state_dict is checkpointed), created here: `member_adam_step` steps it.
    `capturable` where the learner is on CUDA: the step counters live on the device, so a step reads nothing on the
    host and CUDA graphs can replay it. `lr`: one per member, set in the param group after the constructor (which takes
    one lr), the tensor the loop anneals in place and `member_adam_step` steps with."""
    optimizer = torch.optim.Adam(params, eps=1e-5, capturable=capturable)
    optimizer.param_groups[0]["lr"] = lr
    for p in params:
        step = torch.zeros((), device=p.device if capturable else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    return optimizer


def member_adam_step(optimizer, params: list, grads: list):
    """torch.optim.Adam's step (the formulas of its single-tensor path) on the optimizer's own state (see
    make_optimizer), each member with its own learning rate: the param group's `lr` (num_seeds,), the tensor the loop
    anneals in place, scales each member's slice. torch.optim's functional adam takes one lr for all (a tensor of them
    only on CUDA, capturable). With the gradients from torch.func.grad, a compiled update is one graph."""
    group = optimizer.param_groups[0]
    lr = group["lr"]
    beta1, beta2 = group["betas"]
    with torch.no_grad():
        for p, grad in zip(params, grads):
            state = optimizer.state[p]
            step = state["step"].add_(1)
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = lr.view((-1,) + (1,) * (p.dim() - 1)) / (1 - beta1**step)
            denom = (state["exp_avg_sq"].sqrt() / (1 - beta2**step).sqrt()).add_(group["eps"])
            p.sub_(step_size * state["exp_avg"] / denom)


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
    pools = make_envs(args, args.seed + global_step)
    envs = pools[0]
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    seeds = [args.seed + k for k in range(args.num_seeds)]
    rngs = [torch.Generator(device).manual_seed(seed) for seed in seeds]
    n_obs = envs.observation_space.shape[0]
    n_actions = envs.action_space.shape[0]
    action_bounds = (envs.action_space.low, envs.action_space.high)
    agent, params = stack_members(args, n_obs, n_actions, device)
    inference = {name: p.detach() for name, p in params.items()}  # the learner's storage, without autograd
    # each member's learning rate, clip and entropy coefficients: a sweep in one program (by default one value for all)
    member_lrs = list(args.learning_rates or (args.learning_rate,) * args.num_seeds)
    lr = torch.tensor(member_lrs, device=device)  # changed in place: compiled code is not re-traced
    clip_coefs = args.clip_coefs or (args.clip_coef,) * args.num_seeds
    coefs = torch.tensor(list(zip(clip_coefs, args.ent_coefs or (args.ent_coef,) * args.num_seeds)), device=device)
    optimizer = make_optimizer(list(params.values()), lr, capturable=device.type == "cuda")

    # Where the rollout acts, chosen here once, the normalizer's statistics with it: a CPU learner's own actor_mean, a
    # CUDA learner's host copy (--host-actor: a one-row step of a 64-unit MLP costs less there than GPU launches) or the
    # device; on the host in numpy, on views of the statistics and weights (--numpy-act: at one row a torch call is all
    # per-op dispatch), or in torch.
    # Here every member's: its own actor_mean and statistics, stacked.
    host = device.type == "cuda" and args.host_actor
    act_device = torch.device("cpu") if host else device
    acting = host_copy(part(inference, "actor_mean"), act_device) if host else part(inference, "actor_mean")
    normalizer = Normalizer(args.num_seeds, args.num_envs, n_obs, args.gamma, act_device)
    numpy_act = args.numpy_act and act_device.type == "cpu"

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs (CUDA only: off,
    # with one line, elsewhere); the minibatch loop checks the update's guards once an iteration (set_stance).
    normalize = normalizer.obs
    policy = functools.partial(act, agent.actor_mean, acting)
    evaluate = functools.partial(members_call, agent, inference, dim=1)  # the rollout: (num_steps, num_seeds, ...)
    get_value = functools.partial(members_call, agent.critic, part(inference, "critic"))
    update_minibatch = functools.partial(update, agent, params, optimizer, coefs, args)
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
        normalize_step = functools.partial(torch_normalize, normalize, act_device, (args.num_seeds, args.num_envs, -1))
        policy_step = functools.partial(torch_step, policy)

    buf = {
        k: torch.zeros((args.num_steps, args.num_seeds, args.num_envs) + dims, device=device)
        for k, dims in (("obs", (n_obs,)), ("actions", (n_actions,)), ("rewards", ()), ("dones", ()))
    }
    stats = torch.zeros(args.update_epochs * args.num_minibatches, args.num_seeds, 6, device=device)
    episodes = plumbing.MemberEpisodes(args.num_seeds, args.num_envs)
    member_parts = dict(agent=params, optimizer=optimizer, normalizer=normalizer)  # a slice of each per member
    run_parts = dict(rng=rngs, episodes=episodes)
    if ckpt:
        plumbing.resume(ckpt, args.seed, restart=True, **member_parts, **run_parts)  # envpool cannot save its envs

    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step)
    iteration = start_iteration - 1
    with run:
        next_obs = normalize_step(np.concatenate([envs.reset()[0] for envs in pools]))  # a compiled one compiles here
        next_done = np.zeros(args.num_seeds * args.num_envs, dtype=bool)
        for iteration in range(start_iteration, args.num_iterations + 1):
            t0 = time.perf_counter()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lr.copy_(torch.tensor([frac * x for x in member_lrs]))
            if host:
                # the last updates' (or the resumed checkpoint's) parameters
                refresh(acting, part(inference, "actor_mean"))
            # each member's draw from its own generator; brought to where the policy acts in one transfer
            noise_shape = (args.num_steps, args.num_envs, n_actions)
            noise = rollout_noise(inference["actor_logstd"], noise_shape, rngs).to(act_device)
            next_obs, next_done, rewards, ended, t_env, t_policy = rollout(
                pools,
                policy_step,
                normalize_step,
                numpy_act,
                normalizer,
                next_obs,
                next_done,
                buf,
                noise,
                action_bounds,
            )
            episodes.record_steps(rewards, ended)
            global_step += args.batch_size

            t1 = time.perf_counter()
            last_obs = torch.as_tensor(next_obs, device=device)  # as the rollout's obs reach the buffer
            last_done = torch.from_numpy(next_done).to(device).float().view(args.num_seeds, args.num_envs)
            buf["logprobs"], _, buf["values"] = evaluate(buf["obs"], buf["actions"])  # in one batched call
            buf["advantages"], buf["returns"] = gae(
                get_value(last_obs).squeeze(-1),
                last_done,
                buf["rewards"],
                buf["dones"],
                buf["values"],
                args.gamma,
                args.gae_lambda,
            )

            t2 = time.perf_counter()
            # each member's batch as its own run flattens it, member first
            batch = [
                buf[k].transpose(0, 1).flatten(1, 2)
                for k in ("obs", "actions", "logprobs", "advantages", "returns", "values")
            ]
            n = 0
            for _epoch in range(args.update_epochs):
                perm = torch.stack(
                    [
                        torch.randperm(args.batch_size, device=device, generator=g).view(args.num_minibatches, -1)
                        for g in rngs
                    ]
                )
                for inds in perm.unbind(1):
                    # the iteration's first update checks the compiled code's guards, and so sees every number the loop
                    # changed (a float lr, a schedule); the rest skip them (doc/compile.md: what it saves)
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=n > 0):
                        stats[n] = update_minibatch(*batch, inds)
                    n += 1
            t3 = time.perf_counter()

            losses = stats[:n].mean(0).tolist()  # the one host sync of the iteration: [member][loss]
            names = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy", "grad_norm")
            lrs = lr.tolist()
            members = [
                dict(seed=seed, episodic_return=ret, lr=member_lr, **dict(zip(names, member)))
                for seed, ret, member_lr, member in zip(seeds, episodes.means(), lrs, losses)
            ]
            run.log(
                global_step,
                steady=iteration - start_iteration + 1 >= args.measure_burnin,
                iteration=iteration,
                t_rollout=t1 - t0,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t2 - t1,
                t_update=t3 - t2,
                members=members,  # the top-level return, lr and losses: the means of the members still training
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if run.stopping:
                break
    for envs in pools:
        envs.close()
    # a diverged member's parameters, Adam state and statistics: its last finite ones (the resumed checkpoint's)
    run.save(earlier=ckpt, members=member_parts, iteration=iteration, global_step=global_step, **run_parts)
    run.finish(
        global_step,
        run.live_mean(episodes.means()),
        run.compile_time() if args.compile else None,
        num_seeds=args.num_seeds,
        fps_all_seeds=run.fps * args.num_seeds if run.fps else None,
        members=[dict(seed=seed, final_return=ret) for seed, ret in zip(seeds, episodes.means())],
    )


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
