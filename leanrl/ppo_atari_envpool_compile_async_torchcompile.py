"""PPO on Atari through envpool (Breakout-v5), cut into units that torch.compile and CUDA graphs wrap.

The algorithm, network and defaults of ppo_atari_envpool.py (CleanRL's). Its tricks, each in the function that holds it
(doc/atari.md measures each):

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

The one trick of this script, `--compile-async` (it pays when a run is short against a cold-cache compile;
doc/compile.md shows that a warm Inductor cache makes the compile cost nearly nothing, and plain --compile fastest):

- `fill_compile_cache`: a subprocess (this command with --compile-cache-only) fills Inductor's on-disk cache off the
  training loop's GIL and core.
- `compile_in_background`, `compile_units`, `warm_up`: a thread then compiles the units from that cache around a twin
  of the learner (its own copy of the agent, optimizer and lr) and makes their first calls, while the loop trains with
  the eager units; the thread touches nothing the loop uses (the policy holds no random op: it draws nothing from the
  loop's stream).
- `load_units`, `main`'s loop: at an iteration boundary the training state is copied into the twin, whose compiled
  units take over; the result is unchanged.

    python leanrl/ppo_atari_envpool_compile_async_torchcompile.py --compile --compile-async
"""

import copy
import functools
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule

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
    compile_async: bool = False
    """with --compile: train eagerly while the units compile in the background, then swap them in at an iteration
    boundary (summary.json: compile_time, swap_iteration, time_to_compiled)"""
    compile_cache_only: bool = False
    """with --compile: compile the units and run them once on dummy inputs of this run's shapes, which fills Inductor's
    on-disk cache, then exit without training (what --compile-async runs in a subprocess; also warms a cache by hand)"""
    compile_swap_iteration: Optional[int] = None
    """with --compile-async: swap at the start of this iteration, waiting for the compile if it is not done (a
    reproducible eager/compiled split); default: the first iteration boundary after it is done"""
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


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "atari", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    plumbing.positive_finite(args, "learning_rate", "clip_coef", "max_grad_norm", "target_kl")
    plumbing.non_negative_finite(args, "ent_coef", "vf_coef")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    if args.total_timesteps < batch_size:
        plumbing.fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    if (args.compile_async or args.compile_cache_only) and not args.compile:
        plumbing.fail("--compile-async and --compile-cache-only need --compile (they compile the same units)")
    swap = args.compile_swap_iteration
    if swap is not None and not (args.compile_async and swap >= 1):
        plumbing.fail(f"--compile-swap-iteration needs --compile-async and an iteration >= 1, got {swap}")
    # the rollout: uint8 frames, an int64 action and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "atari", rollout=batch_size * (plumbing.spaces(args.env_id)[0] + 24))
    # the --compile-cache-only subprocess writes nothing in the log dir: the run that started it owns the folder
    return plumbing.check_run(
        args, SCRIPT, same=("env_id", "num_envs", "num_steps"), step=batch_size, lead=not args.compile_cache_only
    )


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


def inference_copy(agent: Agent) -> Agent:
    """The rollout's copy of the agent: the same storage, detached, so acting builds no autograd graph (no no_grad).
    preserve_module_state=False: since tensordict 0.14 the default keeps the target's Parameters, swapping only data."""
    copy = Agent(agent.actor.out_features, agent.bf16).to(next(agent.parameters()).device)
    from_module(agent).data.to_module(copy, preserve_module_state=False)
    return copy


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


def compile_units(agent: Agent, args: Args, device, n_pools: int) -> dict:
    """The units of main's compile block, compiled, with a learner of their own around `agent`: its inference copy
    (a deepcopy: no random number drawn), an optimizer and the optimizer's lr tensor."""
    agent_inference = copy.deepcopy(agent)
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    lr = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")
    compute_gae = functools.partial(gae, agent_inference, gamma=args.gamma, gae_lambda=args.gae_lambda)
    return dict(
        agent=agent,
        agent_inference=agent_inference,
        optimizer=optimizer,
        lr=lr,
        acts=[torch.compile(functools.partial(policy, agent_inference)) for _ in range(n_pools)],
        compute_gae=torch.compile(compute_gae) if device.type == "cuda" else compute_gae,  # as main's block
        update_minibatch=torch.compile(functools.partial(update, agent, optimizer, args)),
    )


def warm_up(units: dict, args: Args, device, obs_shape, n_actions: int) -> dict:
    """Call every unit on zeros of the loop's shapes, so that each compiles now (the policy draws no random number).
    Every input is a tensor of its own, as in the loop: Dynamo specializes a graph on two inputs being the same."""
    half = args.num_envs // 2 if args.split_envs else 0  # the pools' sizes, as make_pools splits the envs
    sizes = [args.num_envs - half, half] if half else [args.num_envs]
    for act, n in zip(units["acts"], sizes):
        act(torch.zeros((n,) + obs_shape, dtype=torch.uint8, device=device), torch.zeros(n, n_actions, device=device))
    num_steps = args.num_steps
    num_envs = args.num_envs
    units["compute_gae"](
        torch.zeros((num_envs,) + obs_shape, dtype=torch.uint8, device=device),
        torch.zeros(num_envs, device=device),
        *[torch.zeros(num_steps, num_envs, device=device) for _ in range(3)],
    )
    mb = args.minibatch_size
    obs = torch.zeros((mb,) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros(mb, dtype=torch.long, device=device)
    for _ in range(2):  # the first Adam step creates the optimizer's state, the second runs the steady graph
        units["update_minibatch"](obs, actions, *[torch.zeros(mb, device=device) for _ in range(4)])
    return units


def fill_compile_cache(log_dir: str):
    """This same command with --compile-cache-only, in a subprocess with one compile thread: the costly part (tracing,
    code generation, C++ builds, autotuning) runs off the training loop's GIL and core, and this process then compiles
    from Inductor's on-disk cache. A run that ends first leaves it to finish, so the next run starts warm."""
    command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--log-dir", log_dir, "--compile-cache-only"]
    with open(os.path.join(log_dir, "compile_async.log"), "w") as log:
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")
        if subprocess.run(command, env=env, stdout=log, stderr=log).returncode:
            raise RuntimeError(f"the compile subprocess failed; see {log.name}")


def compile_in_background(agent: Agent, args: Args, device, obs_shape, n_actions: int, n_pools: int) -> Future:
    """In a daemon thread (neither Ctrl-C nor the run's end waits for it): fill the cache, compile and warm up units
    on a copy of `agent` (deepcopy draws no random number). The future holds (units, seconds) or the thread's error."""
    twin = copy.deepcopy(agent)
    future = Future()

    def run():
        t0 = time.perf_counter()
        try:
            fill_compile_cache(args.log_dir)
            units = warm_up(compile_units(twin, args, device, n_pools), args, device, obs_shape, n_actions)
            future.set_result((units, time.perf_counter() - t0))
        except Exception as e:
            future.set_exception(e)

    threading.Thread(target=run, daemon=True).start()
    return future


def load_units(dst: dict, agent: Agent, optimizer):
    """Copy the training state (`agent`, `optimizer`) into the compiled units' learner in place (the compiled code
    keeps the tensors it was traced with): parameters, Adam's moments, step counts and lr; no Adam state yet (no update
    so far) is zeros, as Adam would create it. Exact copies: the swap changes no result."""
    with torch.no_grad():
        for p, q in zip(agent.parameters(), dst["agent"].parameters()):
            q.copy_(p)
            for key, value in dst["optimizer"].state[q].items():
                if optimizer.state[p]:
                    value.copy_(optimizer.state[p][key])
                else:
                    value.zero_()
        dst["lr"].copy_(optimizer.param_groups[0]["lr"])


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

    pools = make_pools(args, seed=args.seed + global_step)
    n_actions = pools[0][1].action_space.n
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    agent = Agent(n_actions, use_bf16).to(device)
    obs_shape = pools[0][1].observation_space.shape
    if args.compile_cache_only:  # see fill_compile_cache
        warm_up(compile_units(agent, args, device, len(pools)), args, device, obs_shape, n_actions)
        for _, envs in pools:
            envs.close()
        return
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
    if args.compile and not args.compile_async:
        acts = [torch.compile(act) for act in acts]
        # gae runs once an iteration: on a CPU compiling it adds seconds to a cold start and saves a millisecond an
        # iteration (doc/compile.md); on CUDA it is one graph instead of hundreds of kernel launches
        if device.type == "cuda":
            compute_gae = torch.compile(compute_gae)
        update_minibatch = torch.compile(update_minibatch)
    if args.cudagraphs and not args.compile_async:
        acts = [CudaGraphModule(act) for act in acts]
        compute_gae = CudaGraphModule(compute_gae)
        update_minibatch = CudaGraphModule(update_minibatch)
    pending = None
    if args.compile_async:
        pending = compile_in_background(agent, args, device, obs_shape, n_actions, len(pools))

    shape = (args.num_steps, args.num_envs)
    buf = TensorDict(
        obs=torch.zeros(shape + obs_shape, dtype=torch.uint8),
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

    # with --compile-async the loop starts eager while the units compile beside it: nothing to wait for
    compiling = args.compile and not args.compile_async
    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * args.batch_size, global_step, compiling=compiling)
    iteration = start_iteration - 1
    compiled_from = start_iteration if args.compile and not args.compile_async else None
    swap_iteration = None
    time_to_compiled = None
    compile_time = None
    with run:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            swap_at = args.compile_swap_iteration
            if pending is not None and (iteration >= swap_at if swap_at else pending.done()):
                units, compile_time = pending.result()
                load_units(units, agent, optimizer)
                agent = units["agent"]
                agent_inference = units["agent_inference"]
                optimizer = units["optimizer"]
                lr = units["lr"]
                acts = units["acts"]
                compute_gae = units["compute_gae"]
                update_minibatch = units["update_minibatch"]
                parts.update(agent=agent, optimizer=optimizer)  # the learner the loop trains from now on, to be saved
                if args.cudagraphs:
                    acts = [CudaGraphModule(act) for act in acts]
                    compute_gae = CudaGraphModule(compute_gae)
                    update_minibatch = CudaGraphModule(update_minibatch)
                pending = None
                compiled_from = iteration
                swap_iteration = iteration
                run.say(f"compiled units swapped in at iteration {iteration} (compiled in {compile_time:.1f}s)")
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
                compiled=compiled_from is not None,
                **dict(zip(STAT_NAMES, losses)),
            )
            if iteration == compiled_from:
                run.compiled()
                time_to_compiled = time.perf_counter() - run.start
            if run.stopping:
                break
    for _, envs in pools:
        envs.close()
    run.save(iteration=iteration, global_step=global_step, **parts)
    if not args.compile_async:
        compile_time = run.compile_time() if args.compile else None
    try:
        run.finish(
            global_step,
            episodes.mean(),
            compile_time,
            bf16=use_bf16,
            swap_iteration=swap_iteration,
            time_to_compiled=time_to_compiled,
        )
    finally:
        if pending is not None:
            # the compile outlived the run: its thread cannot be stopped and shutting down under it aborts, so leave now
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(run.exit_code)


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
