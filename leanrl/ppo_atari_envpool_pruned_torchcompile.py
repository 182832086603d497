"""PPO on Atari through envpool (Breakout-v5) with iterative structured pruning: the base plus that.

ppo_atari_envpool_torchcompile.py plus one trick, in the functions that hold it (doc/pruned.md measures it):

- `make_pruner`, `prune_step`: zeroed weights in a dense convolution cost as much as others, so channels are removed:
  on a schedule (--prune-start, --prune-every, --prune-steps up to --prune-ratio) Torch-Pruning ranks each group of
  coupled layers (a layer's output channels and the inputs reading them, across the flatten into the 3136x512 layer)
  and rebuilds the layers without the least important ones; Adam's moments are cut at the same indices. `main` then
  recompiles the units for the new shapes and captures their CUDA graphs again.
- `Mask`, `add_masks` (--prune-mode mask): the same channels zeroed instead, the shapes kept: masks alone buy nothing.

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

    python leanrl/ppo_atari_envpool_pruned_torchcompile.py --compile                    # CPU or GPU
    python leanrl/ppo_atari_envpool_pruned_torchcompile.py --compile --prune-mode mask  # the comparison
    python leanrl/ppo_atari_envpool_pruned_torchcompile.py --compile --cudagraphs       # GPU
"""

import copy
import functools
import io
import time
from dataclasses import dataclass
from typing import Literal, Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch_pruning as tp
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.nn.utils import parametrize

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
    prune_ratio: float = 0.5
    """final fraction of every hidden layer's channels (neurons) removed (0 turns pruning off)"""
    prune_steps: int = 5
    """pruning steps that reach --prune-ratio, an equal share each"""
    prune_every: int = 20
    """iterations between two pruning steps"""
    prune_start: int = 150
    """iteration of the first pruning step; late, as Breakout pruned from iteration 20 learned less (doc/pruned.md)"""
    prune_importance: Literal["magnitude", "random"] = "magnitude"
    """which channels go: those whose group of weights has the smallest L2 norm, or random ones (the control)"""
    prune_mode: Literal["structural", "mask"] = "structural"
    """structural removes the channels (smaller convolutions and dense layers); mask zeroes them and keeps the shapes
    (comparison)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "atari", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    plumbing.positive_finite(args, "learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    plumbing.non_negative_finite(args, "ent_coef", "vf_coef")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    plumbing.positive(args, "prune_steps", "prune_every", "prune_start")
    plumbing.require(args, lambda v: 0 <= v < 1, "the fraction of channels removed, in [0, 1)", "prune_ratio")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    # the rollout: uint8 frames, an int64 action and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "atari", rollout=batch_size * (plumbing.spaces(args.env_id)[0] + 24))
    return plumbing.check_run(args, SCRIPT, same=("env_id", "num_envs", "num_steps", "prune_mode"), step=batch_size)


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

    def forward(self, x, action):
        """Both heads on given actions: what Torch-Pruning traces and counts."""
        return self.get_action_and_value(x, action)


def inference_copy(agent: Agent) -> Agent:
    """The rollout's copy of the agent, whatever its shapes (pruned, masked): the same storage, detached, so acting
    builds no autograd graph (no no_grad). preserve_module_state=False: since tensordict 0.14 the default keeps the
    target's Parameters, swapping only data."""
    twin = copy.deepcopy(agent)
    from_module(agent).data.to_module(twin, preserve_module_state=False)
    return twin


def policy(agent: Agent, obs, gumbel):
    action, logprob, _, value = agent.get_action_and_value(obs, gumbel=gumbel)
    return action, logprob, value


def rollout(pools: list, acts: list, next_obs, next_done, buf: TensorDict, gumbel):
    """num_steps of every env into `buf`, acting on the noise `gumbel` [steps, envs, actions]; updates `next_obs` and
    `next_done` in place. At each step each pool in turn is received, acted for (by its unit of `acts`) and sent its
    actions, so its emulators run while the policy acts for the next pool (one pool: a synchronous step). The last
    step is received before the return (no step in flight during the update). Returns each recv's (info, truncated,
    offset of the pool) for the loop's game statistics, t_env (waiting in recv) and t_policy (acting: the forward
    and its buffer writes, what the baseline times, so the two splits compare)."""
    t_env = 0.0
    t_policy = 0.0
    games = []
    for step in range(buf.shape[0] + 1):
        for (lo, envs), act in zip(pools, acts):
            part = slice(lo, lo + len(envs))
            if step > 0:
                t1 = time.perf_counter()
                obs_np, reward, terminated, truncated, info = envs.recv()
                t_env += time.perf_counter() - t1
                games.append((info, truncated, lo))
                next_obs[part] = torch.from_numpy(obs_np)
                next_done[part] = torch.from_numpy(np.logical_or(terminated, truncated))
                buf["rewards"][step - 1, part] = torch.from_numpy(reward)
            if step < buf.shape[0]:
                buf["obs"][step, part] = next_obs[part]
                buf["dones"][step, part] = next_done[part]
                t0 = time.perf_counter()
                action, logprob, value = act(next_obs[part], gumbel[step, part])
                buf["actions"][step, part] = action
                buf["logprobs"][step, part] = logprob
                buf["values"][step, part] = value
                t_policy += time.perf_counter() - t0
                envs.send(action.cpu().numpy())
    return games, t_env, t_policy


def gae(agent: Agent, next_obs, next_done, rewards, values, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation, CleanRL's recursion; compiled it fuses into one loop. The bootstrap value of
    the last observations is computed in here, as LeanRL does: under CUDA graphs, one captured graph for both."""
    next_value = agent.get_value(next_obs)
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


def update(agent: Agent, optimizer, args: Args, obs, actions, logprobs, advantages, returns, values):
    """One minibatch: the clipped PPO loss, backward, gradient clipping and the Adam step. Returns the statistics
    as tensors: reading them here would make the host wait for every minibatch."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
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

    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return torch.stack([approx_kl, clipfrac, pg_loss.detach(), v_loss.detach(), entropy_loss.detach()])


STAT_NAMES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")


class Mask(nn.Module):
    """--prune-mode mask: a weight (or bias) times a 0/1 mask, as a parametrization, so the product is in the traced
    graph (torch.nn.utils.prune's pre-hook sets it on the module, a side effect); masks change in place: no re-trace."""

    def __init__(self, like: torch.Tensor):
        super().__init__()
        self.register_buffer("mask", torch.ones_like(like))

    def forward(self, x):
        return x * self.mask


def add_masks(agent: Agent):
    for layer in agent.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            parametrize.register_parametrization(layer, "weight", Mask(layer.weight))
            parametrize.register_parametrization(layer, "bias", Mask(layer.bias))


def make_pruner(agent: Agent, example: tuple, args: Args, rng: torch.Generator):
    """Torch-Pruning traces the coupled layer groups (heads kept whole); each layer loses an equal share a step."""

    def random(group):  # random ranking drawn from `rng`, which the checkpoint holds and torch.compile does not rewind
        return torch.rand(len(group[0].idxs), generator=rng, device=rng.device)

    def masked_first(group):  # masked layers keep their size: the masked channels rank last, to be picked again
        imp = importance(group)
        dead = group[0].dep.target.module.parametrizations.weight[0].mask.flatten(1).sum(1) == 0
        return imp.masked_fill(dead.to(imp.device), -float("inf"))

    importance = dict(magnitude=tp.importance.MagnitudeImportance(p=2), random=random)[args.prune_importance]
    return tp.pruner.BasePruner(
        agent,
        example,
        importance=masked_first if args.prune_mode == "mask" else importance,
        pruning_ratio=args.prune_ratio,
        iterative_steps=args.prune_steps,
        ignored_layers=[agent.actor, agent.critic],
    )


@torch.no_grad()
def prune_step(pruner, optimizer, structural: bool):
    """One step: Torch-Pruning picks each group's least important channels. Structural mode rebuilds the layers without
    them (new, smaller Parameters), cuts each Adam moment at the same indices (step count kept) and points the optimizer
    at the new Parameters, all in place: the units that hold the optimizer stay valid. Mask mode zeroes them."""
    moments = optimizer.state
    for group in pruner.step(interactive=True):
        # (layer, dim, indices): dim 0 for a layer's output channels (weight rows, bias), 1 for its inputs (after
        # the flatten, Torch-Pruning has already expanded a channel into its 7x7 input columns)
        cuts = [
            (dep.target.module, 0 if pruner.DG.is_out_channel_pruning_fn(dep.handler) else 1, idxs)
            for dep, idxs in group
            if isinstance(dep.target.module, (nn.Linear, nn.Conv2d))
        ]
        if not structural:
            for layer, dim, idxs in cuts:
                for name in ("weight", "bias") if dim == 0 else ("weight",):
                    mask = getattr(layer.parametrizations, name)[0].mask
                    mask.index_fill_(dim, torch.tensor(idxs, device=mask.device), 0.0)
            continue
        before = [dict(layer.named_parameters()) for layer, _, _ in cuts]
        group.prune()
        for (layer, dim, idxs), old in zip(cuts, before):
            for name, p in layer.named_parameters():
                if p is old[name] or old[name] not in moments:  # untouched (a bias, for an input cut)
                    continue
                keep = torch.tensor(sorted(set(range(old[name].shape[dim])) - set(idxs)), device=p.device)
                moments[p] = {k: v.index_select(dim, keep) if v.dim() else v for k, v in moments.pop(old[name]).items()}
    if structural:
        optimizer.param_groups[0]["params"] = list(pruner.model.parameters())


def model_size(agent: Agent, example: tuple) -> dict:
    """Parameters, MACs per observation (Torch-Pruning's counter), state_dict bytes and live (unmasked) parameters."""
    dense = copy.deepcopy(agent)  # the counter knows plain layers: masks, if any, folded into the weights
    for layer in dense.modules():
        for name in list(getattr(layer, "parametrizations", {})):
            parametrize.remove_parametrizations(layer, name)
    macs, params = tp.utils.count_ops_and_params(dense, example)
    out = io.BytesIO()
    torch.save(agent.state_dict(), out)
    masked = sum(int((mask == 0).sum()) for name, mask in agent.named_buffers() if name.endswith(".mask"))
    return dict(params=int(params), macs=int(macs), bytes=out.tell(), live=int(params) - masked)


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

    pools = make_pools(args, seed=args.seed + global_step)
    n_actions = pools[0][1].action_space.n
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    agent = Agent(n_actions, use_bf16).to(device)
    example = (
        torch.zeros((1,) + pools[0][1].observation_space.shape, dtype=torch.uint8, device=device),
        torch.zeros(1, dtype=torch.long, device=device),
    )
    pruner = make_pruner(agent, example, args, rng)  # traces the plain network, before any mask
    size_before = model_size(agent, example)
    if args.prune_mode == "mask":
        add_masks(agent)
    if ckpt:  # the pruning done so far, replayed on the full network, gives the checkpoint's shapes
        pruner.load_pruning_history(ckpt["pruning"]["history"])
        pruner.current_step = ckpt["pruning"]["step"]
        pruner._scope_initial_channels.update(ckpt["pruning"]["initial_channels"])  # what the ratios count from
    prune_at = range(args.prune_start, args.prune_start + args.prune_steps * args.prune_every, args.prune_every)
    agent_inference = inference_copy(agent)
    lr = torch.tensor(args.learning_rate, device=device)  # changed in place: compiled code is not re-traced
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs.
    # One acting unit per env pool: with an odd --num-envs the pools differ in size, and a CUDA graph has one shape.
    acts = [functools.partial(policy, agent_inference) for _ in pools]
    compute_gae = functools.partial(gae, agent_inference, gamma=args.gamma, gae_lambda=args.gae_lambda)
    update_minibatch = functools.partial(update, agent, optimizer, args)
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

    shape = (args.num_steps, args.num_envs)
    buf = TensorDict(
        obs=torch.zeros(shape + pools[0][1].observation_space.shape, dtype=torch.uint8),
        actions=torch.zeros(shape, dtype=torch.long),
        logprobs=torch.zeros(shape),
        rewards=torch.zeros(shape),
        dones=torch.zeros(shape),
        values=torch.zeros(shape),
        batch_size=shape,
        device=device,
    )
    episodes = plumbing.AtariEpisodes(args.num_envs)
    # the run's state: resumed from the checkpoint and saved to it under these names
    parts = dict(agent=agent, optimizer=optimizer, rng=rng, episodes=episodes)
    if ckpt:
        # envpool cannot save its envs: they start new episodes
        plumbing.resume(ckpt, args.seed, restart=True, **parts)
    next_obs = torch.from_numpy(np.concatenate([envs.reset()[0] for _, envs in pools])).to(device)
    next_done = torch.zeros(args.num_envs, device=device)

    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step)
    iteration = start_iteration - 1
    traced_at = start_iteration  # the units compile in this iteration, and again after a structural pruning step
    with run:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.prune_ratio > 0 and iteration in prune_at:
                prune_step(pruner, optimizer, structural=args.prune_mode == "structural")
                if args.prune_mode == "structural":
                    # new, smaller Parameters: the inference copy takes them, the units compile again for the new
                    # shapes and are captured again in CUDA graphs (the old graphs replay the old tensors)
                    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
                    torch.compiler.reset()  # drop the code traced for the old shapes
                    if args.cudagraphs:
                        acts = [CudaGraphModule(act.module) for act in acts]
                        compute_gae = CudaGraphModule(compute_gae.module)
                        update_minibatch = CudaGraphModule(update_minibatch.module)
                    traced_at = iteration
                    if args.compile:
                        run.compiling()
            if args.anneal_lr:
                lr.fill_((1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate)

            gumbel = -torch.empty(shape + (n_actions,), device=device).exponential_(generator=rng).log()
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
            flat = buf.reshape(-1)
            mb_stats = []
            for _epoch in range(args.update_epochs):
                perm = torch.randperm(args.batch_size, device=device, generator=rng)
                for mb_inds in perm.split(args.minibatch_size):
                    mb = flat[mb_inds]
                    # clone: CUDA graphs hand back the same output buffer at every replay
                    mb_stats.append(
                        update_minibatch(
                            mb["obs"], mb["actions"], mb["logprobs"], mb["advantages"], mb["returns"], mb["values"]
                        ).clone()
                    )
                if args.target_kl is not None and mb_stats[-1][0] > args.target_kl:  # a host sync, only when asked
                    break
            losses = torch.stack(mb_stats).mean(0).tolist()  # the iteration's one host sync
            t_update = time.perf_counter() - t0

            run.log(
                global_step,
                steady=iteration - start_iteration + 1 >= args.measure_burnin,
                iteration=iteration,
                episodic_return=episodes.mean(),
                episodic_length=episodes.mean_length(),
                t_rollout=t_rollout,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t_gae,
                t_update=t_update,
                lr=lr.item(),
                **dict(zip(STAT_NAMES, losses)),
            )
            if args.compile and iteration == traced_at:
                run.compiled()
            if run.stopping:
                break
    for _, envs in pools:
        envs.close()
    run.save(
        iteration=iteration,
        global_step=global_step,
        **parts,
        pruning=dict(
            step=pruner.current_step,
            history=pruner.pruning_history(),
            initial_channels=dict(pruner._scope_initial_channels),
        ),
    )
    size_after = model_size(agent, example)
    run.say(f"parameters {size_before['params']} -> {size_after['params']} after {pruner.current_step} pruning steps")
    sizes = (("before", size_before), ("after", size_after))
    run.finish(
        global_step,
        episodes.mean(),
        run.compile_time() if args.compile else None,
        bf16=use_bf16,
        prune_steps_done=pruner.current_step,
        prune_sparsity=1 - size_after["live"] / size_before["live"],
        **{f"prune_{k}_{when}": size[k] for k in ("params", "macs", "bytes") for when, size in sizes},
    )


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
