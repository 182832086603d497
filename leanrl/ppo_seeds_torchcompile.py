"""PPO on discrete classic control (CartPole-v1), --num-seeds agents in one program: ppo_torchcompile.py plus that.

The trick, in the functions that hold it (doc/seeds.md measures it):

- `stack_members`: member k is the agent `ppo_torchcompile.py --seed <seed + k>` would build, its parameters stacked
  with the others' along a leading dimension (torch.func.stack_module_state); one Adam over the stacked parameters
  steps each member as its own would (Adam is elementwise).
- `update`, `evaluate`, the acting step: torch.func.vmap over the base's functional units, so that every member's
  minibatch, advantage normalization, loss and gradient come from one call; `clip_members` clips each member's
  gradient by its own norm.
- `make_envs`, `rollout`: the members' envs step as one vector env (member k owns envs k*num_envs...), seeded as
  its own run's; each member draws its exploration noise and minibatch order from its own generator.

The algorithm, network and defaults of ppo.py (CleanRL's). The base's tricks, each in the function that holds it
(doc/classic_control.md measures each):

- `act`: a rollout step only samples, argmax(logits + Gumbel noise), exact Categorical sampling without a Distribution;
  the log-probabilities and values come from one batched forward per iteration (`Agent.forward`).
- `main`, the acting choice just before the compile block: where the rollout acts, chosen once. A CPU learner acts
  with its own actor and a CUDA learner with a host copy of it (--host-actor, `host_copy`, and `refresh` in the loop: a
  4-row step of a 64-unit MLP costs less on the CPU than GPU launches), through numpy views of the weights
  (--numpy-act, `numpy_policy`) or eagerly (`torch_step`): the rollout's `step`, bound once after the block. A CUDA
  learner with --no-host-actor acts with the policy unit, the one case where the block compiles and graphs it.
- `rollout`: the env's outputs and the actions are staged in numpy and reach the buffers in one copy per iteration.
- `update`, `member_adam_step`: torch.func.grad and Adam's step written out with one lr per member, so that
  compiled, forward, backward, clipping and the Adam step are one graph (loss.backward() and optimizer.step() would
  each break it).
- `gae`: the recursion over numpy rows: as fast as compiled torch ops, with nothing to compile.
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs),
  as in LeanRL's file; lr is a tensor changed in place (no recompilation); the update's guards are checked on an
  iteration's first minibatch and skipped on the rest, so a number the loop changes is never frozen.

    python leanrl/ppo_seeds_torchcompile.py --compile --num-seeds 8               # CPU or GPU
    python leanrl/ppo_seeds_torchcompile.py --compile --cudagraphs --num-seeds 64  # GPU: CUDA graphs around the units
"""

import functools
import time
from dataclasses import dataclass, replace
from typing import Optional

import gymnasium as gym
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
    """whether to capture videos of the agent performances (into `<log_dir>/videos`; needs pygame and moviepy)"""

    env_id: str = "CartPole-v1"
    """the id of the environment (discrete-action classic control or Box2D: CartPole-v1, LunarLander-v3, ...)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold"""

    compile: bool = False
    """if toggled, wrap the units in torch.compile: `update`, and on CUDA `evaluate`, `get_value` (once an iteration
    each: on a CPU not worth their compile) and the policy step where it acts there (--no-host-actor; a policy acting on
    the host, a CPU learner's or --host-actor's, acts in numpy or eagerly: main's acting choice); `gae` runs in numpy,
    with nothing to compile"""
    cudagraphs: bool = False
    """if toggled, wrap the units that run on CUDA in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    host_actor: bool = True
    """with the learner on CUDA, act in the rollout with a host copy of the actor, refreshed after each iteration's
    updates (one copy of ~20 KB): a 4-row step of a 64-unit MLP costs less on the CPU than GPU launches. A CPU
    learner acts with its own actor (no copy)"""
    numpy_act: bool = True
    """if toggled, a policy that acts on the CPU (a CPU learner's, or the --host-actor copy) acts through numpy views of
    the actor's weights: at 4 rows a torch forward is all per-op dispatch"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped"""
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
    """how many agents train side by side: member k is `ppo_torchcompile.py --seed <seed + k>`; the steps, fps and
    budgets are each member's (the program steps num_seeds times as many)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "classic", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_seeds")
    if args.target_kl is not None:
        plumbing.fail(
            "--target-kl stops each member's epochs at its own time, and the members update together here: run "
            "ppo_torchcompile.py once per seed for it"
        )
    plumbing.positive_finite(args, "learning_rate", "learning_rates", "clip_coef", "clip_coefs", "max_grad_norm")
    plumbing.non_negative_finite(args, "ent_coef", "ent_coefs", "vf_coef")
    plumbing.one_per_member(args, "learning_rates", "ent_coefs", "clip_coefs")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    # the rollout: float32 observations and five floats (action, log-prob, reward, done, value) per env step
    plumbing.check_memory(
        args, "classic", args.num_seeds, rollout=args.num_seeds * batch_size * (plumbing.spaces(args.env_id)[0] + 5) * 4
    )
    return plumbing.check_run(
        args, SCRIPT, same=("env_id", "num_envs", "num_steps", "num_seeds"), video=True, step=batch_size
    )


def make_envs(args: Args, video_dir: str):
    # Gymnasium's SyncVectorEnv steps 4 CartPoles faster than envpool, whose per-call overhead dominates at this size
    # (doc/classic_control.md). SAME_STEP autoreset is CleanRL's: the observation after a done is the reset one.
    # copy=False hands back the env's own obs array (rollout copies it before the next step) instead of a deepcopy.
    def make(idx):
        if args.capture_video and idx == 0:
            return gym.wrappers.RecordVideo(gym.make(args.env_id, render_mode="rgb_array"), video_dir)
        return gym.make(args.env_id)

    # every member's envs in one vector env: member k owns envs k * num_envs ... (k + 1) * num_envs - 1
    return gym.vector.SyncVectorEnv(
        [functools.partial(make, i) for i in range(args.num_seeds * args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )


class Agent(nn.Module):
    @staticmethod
    def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
        torch.nn.init.orthogonal_(layer.weight, std)
        torch.nn.init.constant_(layer.bias, bias_const)
        return layer

    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            self.layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            self.layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            self.layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def forward(self, x, action):
        """Log-probability and entropy of `action`, and the state value: what the loss needs."""
        logp = self.actor(x).log_softmax(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return logp.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy, self.critic(x).squeeze(-1)


def stack_members(args: Args, n_obs: int, n_actions: int, device) -> tuple:
    """Member k's Agent as `ppo_torchcompile.py --seed <seed + k>` builds it (torch's generator seeded, then the Agent),
    the members' parameters stacked along a leading dimension. Returns a parameter-less Agent to call with them
    (torch.func.functional_call) and the stacked parameters, leaves that the optimizer steps."""
    members = []
    for k in range(args.num_seeds):
        torch.manual_seed(args.seed + k)
        members.append(Agent(n_obs, n_actions).to(device))
    params, _ = torch.func.stack_module_state(members)
    return members[0].to("meta"), params


def part(params: dict, module: str) -> dict:
    """The parameters of one submodule (`actor`, `critic`), named as in it."""
    return {name.removeprefix(module + "."): p for name, p in params.items() if name.startswith(module + ".")}


def members_call(module: nn.Module, params: dict, *inputs, dim: int = 0):
    """`module` run by every member with its own parameters on its own inputs, the members along `dim` of the inputs
    and of the outputs (torch.func.vmap over functional_call): one call for all."""
    call = functools.partial(torch.func.functional_call, module)
    return torch.vmap(call, in_dims=(0, dim), out_dims=dim)(params, inputs)


def act(actor, params, x, gumbel):
    """One rollout step of every member: argmax(logits + Gumbel noise), exact Categorical sampling. Acting needs
    nothing else: the rollout's log-probabilities and values come from one batched forward afterwards (same numbers).
    x: (num_seeds, num_envs, n_obs); the actions: every member's envs in a row, as the rollout stores them."""
    return (members_call(actor, params, x) + gumbel).argmax(-1).flatten()


def numpy_policy(actor: dict):
    """`act` on the CPU from numpy views of the members' stacked actor weights. The views share the weights' memory, so
    every update, refresh and resume is seen without a copy; a few small GEMMs in numpy cost a third of a torch
    forward. Observations: every member's envs in a row, (num_seeds * num_envs, n_obs)."""
    layers = [(actor[f"{name}.weight"].numpy(), actor[f"{name}.bias"].numpy()[:, None]) for name in linear_names(actor)]

    def policy(obs: np.ndarray, gumbel: np.ndarray) -> np.ndarray:
        x = obs.reshape(gumbel.shape[:2] + obs.shape[1:])
        for w, b in layers[:-1]:
            x = np.tanh(x @ w.transpose(0, 2, 1) + b)
        w, b = layers[-1]
        return (x @ w.transpose(0, 2, 1) + b + gumbel).argmax(-1).reshape(-1)

    return policy


def linear_names(params: dict) -> list:
    """The Linear layers of an nn.Sequential's parameters, in order."""
    return [name.removesuffix(".weight") for name in params if name.endswith(".weight")]


def host_copy(params: dict, device: torch.device) -> dict:
    """A copy of `params` on `device` to act with: storage of its own, no autograd; `refresh` keeps it current."""
    return {name: p.detach().to(device, copy=True) for name, p in params.items()}


def refresh(acting: dict, learner: dict):
    """The learner's parameters into its acting copy, in one transfer, copied in place: views of the copy's weights
    (`numpy_policy`) stay valid."""
    flat = nn.utils.parameters_to_vector(learner.values()).to(next(iter(acting.values())).device)
    params = list(acting.values())
    with torch.no_grad():
        torch._foreach_copy_(params, [x.view_as(p) for x, p in zip(flat.split([p.numel() for p in params]), params)])


def torch_step(policy, device, shape: tuple, obs: np.ndarray, gumbel) -> np.ndarray:
    """A torch policy step as the rollout calls it: numpy observations in (every member's envs in a row), moved to
    `device` where the policy acts (a no-op on the host) as `shape`, the step's row of the rollout's noise already
    there, numpy actions out."""
    return policy(torch.from_numpy(obs).to(device, non_blocking=True).view(shape), gumbel).cpu().numpy()


def rollout(envs, step, act_device, numpy_act: bool, next_obs, next_done, buf, n_actions: int, rngs: list):
    """num_steps steps of every env into `buf` ((num_steps, num_seeds, num_envs, ...)), acting with `step` (main's
    acting choice: numpy observations and the step's row of the noise in, numpy actions out) on `act_device`, a numpy
    step with `numpy_act`; returns the last obs/done, the rewards and the dones after each step (numpy, for the loop's
    episode statistics) and the time split. The env's outputs and the actions
    are staged in numpy and reach `buf` in one copy per iteration each."""
    num_steps = buf["obs"].shape[0]
    device = buf["obs"].device
    obs = np.empty((num_steps,) + next_obs.shape, np.float32)
    dones = np.empty((num_steps,) + next_done.shape, np.float32)
    rewards = np.empty((num_steps,) + next_done.shape, np.float32)
    ended = np.empty((num_steps,) + next_done.shape, bool)
    actions = np.empty((num_steps,) + next_done.shape, np.int64)
    t_env = 0.0
    t_policy = 0.0
    # each member's draw from its own generator, as its own run draws it; brought to where the policy acts at once (a
    # numpy step reads a view of it)
    noise_shape = (num_steps, buf["dones"].shape[2], n_actions)
    gumbel = torch.stack([-torch.empty(noise_shape, device=device).exponential_(generator=g).log() for g in rngs], 1)
    gumbel = gumbel.to(act_device)
    if numpy_act:
        gumbel = gumbel.numpy()
    for t in range(num_steps):
        obs[t] = next_obs
        dones[t] = next_done
        t0 = time.perf_counter()
        actions[t] = step(next_obs, gumbel[t])
        t1 = time.perf_counter()
        next_obs, reward, terminations, truncations, _ = envs.step(actions[t])
        t_env += time.perf_counter() - t1
        t_policy += t1 - t0
        next_done = terminations | truncations
        rewards[t] = reward
        ended[t] = next_done
    for key, x in (("obs", obs), ("actions", actions), ("dones", dones), ("rewards", rewards)):
        buf[key].copy_(torch.from_numpy(x).view(buf[key].shape), non_blocking=True)
    return next_obs, next_done, rewards, ended, t_env, t_policy


def gae(next_value, next_done, rewards, dones, values, gamma: float, gae_lambda: float):
    """CleanRL's GAE: deltas and discounts at once in torch, the recursion over numpy rows on the host (the same
    numbers). As torch ops the loop is slower eager, and compiling it cost far more of a cold start than it saved
    (doc/classic_control.md)."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.unsqueeze(0)])
    nextvalues = torch.cat([values[1:], next_value.unsqueeze(0)])
    deltas = (rewards + gamma * nextvalues * nextnonterminal - values).cpu().numpy()
    discounts = (gamma * gae_lambda * nextnonterminal).cpu().numpy()
    advantages = np.empty_like(deltas)
    lastgaelam = np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        lastgaelam = deltas[t] + discounts[t] * lastgaelam
        advantages[t] = lastgaelam
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
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)

    envs = make_envs(args, f"{args.log_dir}/videos")
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    seeds = [args.seed + k for k in range(args.num_seeds)]
    rngs = [torch.Generator(device).manual_seed(seed) for seed in seeds]
    n_obs = envs.single_observation_space.shape[0]
    n_actions = envs.single_action_space.n
    agent, params = stack_members(args, n_obs, n_actions, device)
    inference = {name: p.detach() for name, p in params.items()}  # the learner's storage, without autograd
    # each member's learning rate, clip and entropy coefficients: a sweep in one program (by default one value for all)
    member_lrs = list(args.learning_rates or (args.learning_rate,) * args.num_seeds)
    lr = torch.tensor(member_lrs, device=device)  # changed in place: compiled code is not re-traced
    clip_coefs = args.clip_coefs or (args.clip_coef,) * args.num_seeds
    coefs = torch.tensor(list(zip(clip_coefs, args.ent_coefs or (args.ent_coef,) * args.num_seeds)), device=device)
    optimizer = make_optimizer(list(params.values()), lr, capturable=device.type == "cuda")

    # The acting choice. A CUDA learner acts with a host copy of its actor (--host-actor, refreshed by the loop: a 4-row
    # step of this MLP costs less on the CPU than GPU launches) or on the device, the one case the block compiles the
    # policy unit; a CPU learner with its own actor. On the host a step reads numpy views of the weights (--numpy-act: a
    # 4-row torch forward is all dispatch) or runs eagerly (compiled, it and the env evict each other's caches).
    act_device = torch.device("cpu") if args.host_actor else device
    acting = part(inference, "actor") if act_device == device else host_copy(part(inference, "actor"), act_device)
    numpy_act = args.numpy_act and act_device.type == "cpu"

    # The units, compiled (--compile) and captured in CUDA graphs (--cudagraphs; CUDA only: pick_device drops it)
    policy = functools.partial(act, agent.actor, acting)
    evaluate = functools.partial(members_call, agent, inference, dim=1)  # the rollout: (num_steps, num_seeds, ...)
    get_value = functools.partial(members_call, agent.critic, part(inference, "critic"))
    update_minibatch = functools.partial(update, agent, params, optimizer, coefs, args)
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        # at these sizes a compiled call costs its overhead, not its arithmetic: C++ wrapper code instead of Python on
        # a CPU (the base's max_autotune fails to compile the members' batched GEMMs in torch 2.13's inductor)
        options = dict(cpp_wrapper=True) if device.type == "cpu" else {}
        if act_device.type == "cuda":
            policy = torch.compile(policy, options=options)
        # evaluate and get_value run once an iteration: on a CPU compiling them adds seconds to a cold start and buys
        # no fps (doc/compile.md); on CUDA each is one graph instead of dozens of kernel launches
        if device.type == "cuda":
            evaluate = torch.compile(evaluate, options=options)
            get_value = torch.compile(get_value, options=options)
        update_minibatch = torch.compile(update_minibatch, options=options)
    if args.cudagraphs:
        if act_device.type == "cuda":
            policy = CudaGraphModule(policy)
        evaluate = CudaGraphModule(evaluate)
        get_value = CudaGraphModule(get_value)
        update_minibatch = CudaGraphModule(update_minibatch)
    # the rollout's step: numpy observations and the step's row of the noise in, numpy actions out
    torch_shape = (args.num_seeds, args.num_envs, -1)  # the members' observations, as the policy unit takes them
    step = numpy_policy(acting) if numpy_act else functools.partial(torch_step, policy, act_device, torch_shape)

    shape = (args.num_steps, args.num_seeds, args.num_envs)
    buf = dict(
        obs=torch.zeros(shape + (n_obs,), device=device),
        actions=torch.zeros(shape, dtype=torch.long, device=device),
        **{k: torch.zeros(shape, device=device) for k in ("logprobs", "rewards", "dones", "values")},
    )
    stats = torch.zeros(args.update_epochs * args.num_minibatches, args.num_seeds, 6, device=device)
    episodes = plumbing.MemberEpisodes(args.num_seeds, args.num_envs)
    # member k's envs seeded as its own run seeds its envs (seed + k + i for its env i)
    next_obs, _ = envs.reset(seed=[seed + i for seed in seeds for i in range(args.num_envs)])
    next_done = np.zeros(args.num_seeds * args.num_envs, dtype=bool)
    if ckpt:
        # the envs go on where the checkpoint left them; where it could not hold them (Box2D), new episodes
        restart = not plumbing.env_saved(ckpt)
        plumbing.resume(
            ckpt,
            args.seed,
            restart=restart,
            agent=params,
            optimizer=optimizer,
            rng=rngs,  # moved between devices, member k re-seeds from args.seed + k, as in `seeds`
            episodes=episodes,
            **({} if restart else dict(env=envs, next_obs=next_obs, next_done=next_done)),
        )
    global_step = ckpt["global_step"] if ckpt else 0
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1

    iteration = start_iteration - 1
    with plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step) as run:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lr.copy_(torch.tensor([frac * x for x in member_lrs]))
            if act_device != device:  # a host copy: the last updates' (or the resumed checkpoint's) parameters
                refresh(acting, part(inference, "actor"))
            next_obs, next_done, rewards, ended, t_env, t_policy = rollout(
                envs, step, act_device, numpy_act, next_obs, next_done, buf, n_actions, rngs
            )
            episodes.record_steps(rewards, ended)
            global_step += args.batch_size
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            last_obs = torch.from_numpy(next_obs).to(device).view(args.num_seeds, args.num_envs, n_obs)
            last_done = torch.from_numpy(next_done).to(device).float().view(args.num_seeds, args.num_envs)
            logprobs, _, values = evaluate(buf["obs"], buf["actions"])  # the rollout's, in one batched call
            buf["logprobs"].copy_(logprobs)
            buf["values"].copy_(values)
            advantages, returns = gae(
                get_value(last_obs).squeeze(-1),
                last_done,
                buf["rewards"],
                buf["dones"],
                buf["values"],
                args.gamma,
                args.gae_lambda,
            )
            t_gae = time.perf_counter() - t0

            t0 = time.perf_counter()
            # each member's batch as its own run flattens it, member first
            batch = [
                x.transpose(0, 1).flatten(1, 2)
                for x in (buf["obs"], buf["actions"], buf["logprobs"], advantages, returns, buf["values"])
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
            t_update = time.perf_counter() - t0

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
                t_rollout=t_rollout,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t_gae,
                t_update=t_update,
                members=members,  # the top-level return, lr and losses: the means of the members still training
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if run.stopping:
                break
    envs.close()
    run.save(
        earlier=ckpt,
        # a diverged member's parameters and Adam state: its last finite ones, from the resumed checkpoint
        members=dict(agent=params, optimizer=optimizer),
        iteration=iteration,
        global_step=global_step,
        rng=rngs,
        env=envs,
        next_obs=next_obs,
        next_done=next_done,
        episodes=episodes,
    )
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
