"""PPO on Breakout (envpool), --num-seeds agents in one program: ppo_atari_envpool_torchcompile.py plus that.

The trick, in the functions that hold it:

- `stack_members`: member k is the agent `ppo_atari_envpool_torchcompile.py --seed <seed + k>` would build, its
  parameters stacked with the others' along a leading dimension (torch.func.stack_module_state); one Adam over the
  stacked parameters steps each member as its own would (Adam is elementwise).
- `members_call`, `policy`, `gae`, `update`: torch.func.vmap over the base's units, so that every member's acting,
  bootstrap value, minibatch, advantage normalization, loss and gradient come from one call; `clip_members` clips
  each member's gradient by its own norm.
- `make_member_pools`, `rollout`: each member's own envpool pools, seeded as its run's (envpool seeds env i of a pool
  with seed + i: one pool for all members would give them overlapping seeds); every member's pool is sent its actions
  before any is received, so the members' emulators run together. Each member draws its exploration noise and
  minibatch order from its own generator, and `plumbing.MemberAtariEpisodes` keeps its own game scores.

The algorithm, network and defaults of ppo_atari_envpool.py (CleanRL's). The base's tricks, each in the function that
holds it (doc/atari.md measures each):

- `Agent.get_action_and_value`: a rollout step samples argmax(log p + Gumbel noise), exact Categorical sampling from
  noise the loop draws with its own generator: the policy holds no random op.
- `Agent.trunk` (--bf16): the CNN trunk under bf16 autocast where the hardware has native bfloat16 (AVX512-BF16/AMX
  CPUs, CUDA): the update's cost halves; losses, ratios and value targets stay fp32. Opt-in: Breakout learned slower.
- `rollout`: observations stored as uint8 (a quarter of the float32 bytes to store and gather).
- `make_pools`, `rollout` (--split-envs, on with CUDA): two envpool pools; one half's emulators run while the policy
  acts for the other.
- `update`: one minibatch (forward, backward, clipping, Adam step); its statistics stay tensors until the iteration's
  one host sync.
- `main`, the block after "The units": the units compiled (--compile) and captured in CUDA graphs (--cudagraphs);
  lr is a tensor changed in place (no recompilation).

    python leanrl/ppo_atari_envpool_seeds_torchcompile.py --compile --num-seeds 4                # CPU or GPU
    python leanrl/ppo_atari_envpool_seeds_torchcompile.py --compile --bf16 --num-seeds 4         # see doc/atari.md
    python leanrl/ppo_atari_envpool_seeds_torchcompile.py --compile --cudagraphs --num-seeds 16  # GPU
"""

import functools
import time
from dataclasses import dataclass, replace
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
from tensordict import TensorDict
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

    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
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
    clip_coef: float = 0.1
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
    """if toggled, wrap policy and update in torch.compile, and gae on CUDA (once an iteration: on a CPU not worth its
    compile)"""
    cudagraphs: bool = False
    """if toggled, wrap policy, gae and update in tensordict's CudaGraphModule (CUDA only; ignored on CPU)"""
    bf16: bool = False
    """run the CNN trunk under bfloat16 autocast where the hardware has native bf16 (AVX512-BF16/AMX CPUs, CUDA):
    faster than fp32 there, but on Breakout it learned slower at 200k steps (doc/atari.md), so it is opt-in"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the games restart: envpool cannot snapshot
    its emulators, so a resumed run plays fresh games, seeded anew, and loses the games that were in flight)"""
    num_threads: int = plumbing.cores()
    """torch intra-op threads (default: every core the process may use: the update's convolutions dominate and use
    them all; on a 2-core CPU, 2 measured fastest)"""
    split_envs: bool = torch.cuda.is_available()
    """step the envs as two envpool pools, one half each: one half's emulators run while the policy acts for the
    other and its actions come back to the host, so the envs need not wait for the policy (the same transitions as one
    pool; the policy acts on half batches). Default: on where CUDA is available (the emulators wait on the GPU policy
    there), off on a CPU, where it pays only with a core the policy leaves free (2 cores: the rollout faster with
    --num-threads 1, slower with the default 2, whose threads fight the emulators for the cores; doc/atari.md)"""
    learning_rates: tuple[float, ...] = ()
    """one learning rate per member (as many as --num-seeds), a sweep in one program: member k is the run of
    --learning-rate <its value>; empty: --learning-rate for every member"""
    ent_coefs: tuple[float, ...] = ()
    """one entropy coefficient per member (as many as --num-seeds); empty: --ent-coef for every member"""
    clip_coefs: tuple[float, ...] = ()
    """one surrogate clipping coefficient per member (as many as --num-seeds); empty: --clip-coef for every member"""
    num_seeds: int = 4
    """how many agents train side by side: member k is `ppo_atari_envpool_torchcompile.py --seed <seed + k>`; the
    steps, fps and budgets are each member's (the program steps num_seeds times as many)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "atari", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_seeds")
    if args.target_kl is not None:
        plumbing.fail(
            "--target-kl stops each member's epochs at its own time, and the members update together here: run "
            "ppo_atari_envpool_torchcompile.py once per seed for it"
        )
    plumbing.positive_finite(args, "learning_rate", "learning_rates", "clip_coef", "clip_coefs", "max_grad_norm")
    plumbing.non_negative_finite(args, "ent_coef", "ent_coefs", "vf_coef")
    plumbing.one_per_member(args, "learning_rates", "ent_coefs", "clip_coefs")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    # the rollout: uint8 frames, an int64 action and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(
        args, "atari", args.num_seeds, rollout=args.num_seeds * batch_size * (plumbing.spaces(args.env_id)[0] + 24)
    )
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps", "num_seeds"), step=batch_size)


def make_envs(args: Args, seed: int, num_envs: int):
    # CleanRL's settings: 84x84 grey frames, 4 stacked, frameskip 4; a lost life ends the (training) episode and
    # rewards are clipped to their sign. The real game score comes back unclipped in info["reward"].
    return envpool.make(
        args.env_id,
        env_type="gym",
        num_envs=num_envs,
        episodic_life=True,
        reward_clip=True,
        seed=plumbing.envpool_seed(seed),
    )


def make_pools(args: Args, seed: int) -> list:
    """The envs as envpool pools, (index of the pool's first env, pool). envpool seeds env i of a pool with seed + i,
    so the pool that starts at env `lo` gets seed + lo: every env plays the games it plays in a single pool."""
    half = args.num_envs // 2 if args.split_envs else 0  # one env makes one pool
    sizes = [args.num_envs - half, half] if half else [args.num_envs]
    los = np.cumsum([0] + sizes[:-1]).tolist()
    return [(lo, make_envs(args, seed + lo, n)) for lo, n in zip(los, sizes)]


def make_member_pools(args: Args, seeds: list) -> list:
    """Each member's pools as its run makes them (`make_pools` with its seed), grouped by pool: (index of the pool's
    first env, [every member's pool of it]). envpool seeds env i of a pool with seed + i, so the members' envs cannot
    share one pool: member k's env i would get the seed of member k + 1's env i - 1."""
    members = [make_pools(args, seed) for seed in seeds]
    return [(group[0][0], [envs for _, envs in group]) for group in zip(*members)]


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN trunk shared by a linear actor and a linear critic. Observations arrive as uint8 (a quarter of
    the float32 bytes to store and gather) and become floats only here."""

    def __init__(self, n_actions: int, bf16: bool = False):
        super().__init__()
        self.bf16 = bf16
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def trunk(self, x):
        # bf16 autocast covers the convolutions and the 3136x512 layer, where the time goes (doc/atari.md);
        # heads and downstream see fp32. No cast cache (CUDA graph capture needs it off): each weight is cast per call.
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            hidden = self.network(x.float() / 255.0)
        return hidden.float()

    def get_value(self, x):
        return self.critic(self.trunk(x)).squeeze(-1)

    def get_action_and_value(self, x, action=None, gumbel=None):
        """With no `action`, one is sampled as argmax(log p + `gumbel`), Gumbel noise drawn by the caller: exact
        Categorical sampling (the Gumbel-max trick) with no random number drawn in here."""
        hidden = self.trunk(x)
        logp = torch.log_softmax(self.actor(hidden), dim=-1)
        if action is None:
            action = (logp + gumbel).argmax(-1)
        logprob = logp.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return action, logprob, entropy, self.critic(hidden).squeeze(-1)

    def forward(self, method: str, *inputs, **kwargs):
        # torch.func.functional_call calls forward: the members' units name the method they run
        return getattr(self, method)(*inputs, **kwargs)


def stack_members(args: Args, n_actions: int, bf16: bool, device) -> tuple:
    """Member k's Agent as `ppo_atari_envpool_torchcompile.py --seed <seed + k>` builds it (torch's generator seeded,
    then the Agent), the members' parameters stacked along a leading dimension. Returns a parameter-less Agent to call
    with them (`members_call`) and the stacked parameters, leaves that the optimizer steps."""
    members = []
    for k in range(args.num_seeds):
        torch.manual_seed(args.seed + k)
        members.append(Agent(n_actions, bf16).to(device))
    params, _ = torch.func.stack_module_state(members)
    return members[0].to("meta"), params


def members_call(module: nn.Module, params: dict, method: str, *inputs, dim: int = 0, **kwargs):
    """`module.<method>` run by every member with its own parameters on its own inputs, the members along `dim` of the
    inputs and of the outputs (torch.func.vmap over functional_call): one call for all."""

    def call(p, x, kw):
        return torch.func.functional_call(module, p, (method, *x), kw)

    return torch.vmap(call, in_dims=(0, dim, dim), out_dims=dim)(params, inputs, kwargs)


def policy(agent: Agent, params: dict, obs, gumbel):
    """Every member acts on its own envs' obs [members, envs, ...]: one vmapped call."""
    action, logprob, _, value = members_call(agent, params, "get_action_and_value", obs, gumbel=gumbel)
    return action, logprob, value


def rollout(pools: list, acts: list, next_obs, next_done, buf: TensorDict, gumbel):
    """num_steps of every member's envs into `buf` [steps, members, envs], acting on the noise `gumbel` [steps,
    members, envs, actions]; updates `next_obs` and `next_done` in place. At each step each pool in turn is received
    from every member, acted for (by its unit of `acts`, all members in one call) and sent every member its actions,
    so the members' emulators run together, and while the policy acts for the next pool. The last step is received
    before the return (no step in flight during the update). Returns each recv's (member, info, truncated, offset of
    the pool) for the loop's game statistics, t_env (waiting in recv) and t_policy (acting: the forward and its
    buffer writes, what the baseline times, so the two splits compare)."""
    t_env = 0.0
    t_policy = 0.0
    games = []
    for step in range(buf.shape[0] + 1):
        for (lo, group), act in zip(pools, acts):
            part = slice(lo, lo + len(group[0]))
            if step > 0:
                for k, envs in enumerate(group):
                    t1 = time.perf_counter()
                    obs_np, reward, terminated, truncated, info = envs.recv()
                    t_env += time.perf_counter() - t1
                    games.append((k, info, truncated, lo))
                    next_obs[k, part] = torch.from_numpy(obs_np)
                    next_done[k, part] = torch.from_numpy(np.logical_or(terminated, truncated))
                    buf["rewards"][step - 1, k, part] = torch.from_numpy(reward)
            if step < buf.shape[0]:
                buf["obs"][step, :, part] = next_obs[:, part]
                buf["dones"][step, :, part] = next_done[:, part]
                t0 = time.perf_counter()
                action, logprob, value = act(next_obs[:, part], gumbel[step, :, part])
                buf["actions"][step, :, part] = action
                buf["logprobs"][step, :, part] = logprob
                buf["values"][step, :, part] = value
                t_policy += time.perf_counter() - t0
                for envs, member_action in zip(group, action.cpu().numpy()):
                    envs.send(member_action)
    return games, t_env, t_policy


def gae(agent: Agent, params: dict, next_obs, next_done, rewards, values, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation, CleanRL's recursion; compiled it fuses into one loop. The bootstrap value of
    the last observations is computed in here, as LeanRL does: under CUDA graphs, one captured graph for both. Every
    member at once: the recursion is elementwise over [members, envs]."""
    next_value = members_call(agent, params, "get_value", next_obs)
    advantages = torch.empty_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    nextnonterminal = 1.0 - next_done
    nextvalues = next_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
        nextnonterminal = 1.0 - dones[t]
        nextvalues = values[t]
    return advantages, advantages + values


def ppo_loss(params: dict, agent: Agent, args: Args, obs, actions, logprobs, advantages, returns, values):
    """One member's clipped PPO loss on its minibatch, a function of its parameters (for torch.func.grad): the base's
    update up to its backward. Returns the loss and the statistics."""
    _, newlogprob, entropy, newvalue = torch.func.functional_call(agent, params, ("get_action_and_value", obs, actions))
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    with torch.no_grad():
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
    return loss, torch.stack([approx_kl, clipfrac, pg_loss.detach(), v_loss.detach(), entropy_loss.detach()])


def update(
    agent: Agent, params: dict, optimizer, coefs, args: Args, obs, actions, logprobs, advantages, returns, values
):
    """One minibatch of every member, each on its own (the inputs member first) with its own clip and entropy
    coefficients (`coefs`: (num_seeds, 2)) and learning rate (the optimizer's `lr`: (num_seeds,)): each member's
    gradient of its own loss (torch.func.grad under torch.func.vmap), clipped by its own norm, then one Adam step over
    the stacked parameters, which is each member's own step (Adam is elementwise). Returns the statistics
    [members, stats] as tensors: reading them here would make the host wait for every minibatch."""

    def member_grad(p, coef, *batch):
        member_args = replace(args, clip_coef=coef[0], ent_coef=coef[1])
        return torch.func.grad(ppo_loss, has_aux=True)(p, agent, member_args, *batch)

    detached = {name: p.detach() for name, p in params.items()}
    grads, stats = torch.vmap(member_grad)(detached, coefs, obs, actions, logprobs, advantages, returns, values)
    grads = [grads[name] for name in params]
    clip_members(grads, args.max_grad_norm)
    member_adam_step(optimizer, list(params.values()), grads)
    return stats


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


STAT_NAMES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")


def main(args: Args):
    ckpt = check_args(args)
    global_step = ckpt["global_step"] if ckpt else 0
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # fp32 matmuls, as in the baseline (CleanRL's): LeanRL's torch.set_float32_matmul_precision("high") (TF32) changes
    # the numbers for little here: on an H200 the update is a small share of Breakout's iteration
    # (doc/gpu.md). cuDNN's convolutions take TF32 by default, in both scripts.
    torch.set_num_threads(args.num_threads)
    device = plumbing.pick_device(args)
    # --bf16 takes effect only where the hardware has native bf16: CUDA, or AVX512-BF16/AMX CPUs (oneDNN's check)
    use_bf16 = args.bf16 and (
        torch.cuda.is_bf16_supported() if device.type == "cuda" else torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )

    seeds = [args.seed + k for k in range(args.num_seeds)]
    pools = make_member_pools(args, [seed + global_step for seed in seeds])
    n_actions = pools[0][1][0].action_space.n
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile.
    # Each member's from its own, seeded as its run seeds its one.
    rngs = [torch.Generator(device).manual_seed(seed) for seed in seeds]
    agent, params = stack_members(args, n_actions, use_bf16, device)
    inference = {name: p.detach() for name, p in params.items()}  # the learner's storage, without autograd
    # each member's learning rate, clip and entropy coefficients: a sweep in one program (by default one value for all)
    member_lrs = list(args.learning_rates or (args.learning_rate,) * args.num_seeds)
    lr = torch.tensor(member_lrs, device=device)  # changed in place: compiled code is not re-traced
    clip_coefs = args.clip_coefs or (args.clip_coef,) * args.num_seeds
    coefs = torch.tensor(list(zip(clip_coefs, args.ent_coefs or (args.ent_coef,) * args.num_seeds)), device=device)
    optimizer = make_optimizer(list(params.values()), lr, capturable=device.type == "cuda")

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs.
    # One acting unit per env pool: with an odd --num-envs the pools differ in size, and a CUDA graph has one shape.
    acts = [functools.partial(policy, agent, inference) for _ in pools]
    compute_gae = functools.partial(gae, agent, inference, gamma=args.gamma, gae_lambda=args.gae_lambda)
    update_minibatch = functools.partial(update, agent, params, optimizer, coefs, args)
    if args.compile:
        # the vector ISA the CPU reports (ATen's own check), not a test program compiled per candidate ISA: most of a
        # cold start's fixed cost on a CPU (doc/compile.md); CUDA kernels do not use it
        torch._inductor.config.cpp.vec_isa_ok = True
        acts = [torch.compile(act) for act in acts]
        # gae runs once an iteration: on a CPU compiling it adds seconds to a cold start and saves a millisecond an
        # iteration (doc/compile.md); on CUDA it is one graph instead of hundreds of kernel launches
        if device.type == "cuda":
            compute_gae = torch.compile(compute_gae)
        update_minibatch = torch.compile(update_minibatch)
    if args.cudagraphs:
        acts = [CudaGraphModule(act) for act in acts]
        compute_gae = CudaGraphModule(compute_gae)
        update_minibatch = CudaGraphModule(update_minibatch)

    shape = (args.num_steps, args.num_seeds, args.num_envs)
    buf = TensorDict(
        obs=torch.zeros(shape + pools[0][1][0].observation_space.shape, dtype=torch.uint8),
        actions=torch.zeros(shape, dtype=torch.long),
        logprobs=torch.zeros(shape),
        rewards=torch.zeros(shape),
        dones=torch.zeros(shape),
        values=torch.zeros(shape),
        batch_size=shape,
        device=device,
    )
    episodes = plumbing.MemberAtariEpisodes(args.num_seeds, args.num_envs)
    # the run's state: resumed from the checkpoint and saved to it under these names
    parts = dict(agent=params, optimizer=optimizer, rng=rngs, episodes=episodes)
    if ckpt:
        # envpool cannot save its envs: they start new episodes
        plumbing.resume(ckpt, args.seed, restart=True, **parts)
    resets = [np.stack([envs.reset()[0] for envs in group]) for _, group in pools]  # [members, a pool's envs, ...]
    next_obs = torch.from_numpy(np.concatenate(resets, 1)).to(device)
    next_done = torch.zeros(args.num_seeds, args.num_envs, device=device)

    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step)
    iteration = start_iteration - 1
    with run:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lr.copy_(torch.tensor([frac * x for x in member_lrs]))

            # each member's draw from its own generator, as its own run draws it
            noise = (args.num_steps, args.num_envs, n_actions)
            gumbel = torch.stack([-torch.empty(noise, device=device).exponential_(generator=g).log() for g in rngs], 1)
            games, t_env, t_policy = rollout(pools, acts, next_obs, next_done, buf, gumbel)
            episodes.record_steps(games)
            global_step += args.batch_size
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            buf["advantages"], buf["returns"] = compute_gae(
                next_obs, next_done, buf["rewards"], buf["values"], buf["dones"]
            )
            t_gae = time.perf_counter() - t0

            t0 = time.perf_counter()
            flat = buf.transpose(0, 1).reshape(args.num_seeds, -1)  # each member's batch as its run flattens it
            member_ids = torch.arange(args.num_seeds, device=device).unsqueeze(1)
            mb_stats = []
            for _epoch in range(args.update_epochs):
                perm = torch.stack([torch.randperm(args.batch_size, device=device, generator=g) for g in rngs])
                for mb_inds in perm.split(args.minibatch_size, 1):
                    mb = flat[member_ids, mb_inds]
                    # clone: CUDA graphs hand back the same output buffer at every replay
                    mb_stats.append(
                        update_minibatch(
                            mb["obs"], mb["actions"], mb["logprobs"], mb["advantages"], mb["returns"], mb["values"]
                        ).clone()
                    )
            losses = torch.stack(mb_stats).mean(0).tolist()  # the iteration's one host sync: [member][stat]
            lrs = lr.tolist()
            members = [
                dict(
                    seed=seed, episodic_return=ret, episodic_length=length, lr=member_lr, **dict(zip(STAT_NAMES, stats))
                )
                for seed, ret, length, member_lr, stats in zip(
                    seeds, episodes.means(), episodes.mean_lengths(), lrs, losses
                )
            ]
            t_update = time.perf_counter() - t0

            run.log(
                global_step,
                steady=iteration - start_iteration + 1 >= args.measure_burnin,
                iteration=iteration,
                t_rollout=t_rollout,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t_gae,
                t_update=t_update,
                members=members,  # the top-level return, length, lr and losses: the means of the members still training
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if run.stopping:
                break
    for _, group in pools:
        for envs in group:
            envs.close()
    run.save(
        earlier=ckpt,
        # a diverged member's parameters and Adam state: its last finite ones, from the resumed checkpoint
        members=dict(agent=params, optimizer=optimizer),
        iteration=iteration,
        global_step=global_step,
        rng=rngs,
        episodes=episodes,
    )
    run.finish(
        global_step,
        run.live_mean(episodes.means()),
        run.compile_time() if args.compile else None,
        bf16=use_bf16,
        num_seeds=args.num_seeds,
        fps_all_seeds=run.fps * args.num_seeds if run.fps else None,
        members=[dict(seed=seed, final_return=ret) for seed, ret in zip(seeds, episodes.means())],
    )


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
