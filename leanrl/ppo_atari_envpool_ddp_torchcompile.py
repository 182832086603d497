"""PPO on Atari through envpool (Breakout-v5), cut into units that torch.compile and CUDA graphs wrap, made synchronous
data-parallel (DD-PPO style) on torch.distributed (torchrun).

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

The trick, data parallelism (gloo on CPU, nccl on CUDA; launch commands and scaling: doc/distributed.md); all of the
above holds per rank, and rank 0 logs:

- `Dist`: every rank runs its own envpool pools with its own seeds and starts from rank 0's parameters.
- `average_gradients`: every minibatch the ranks average their gradients (one all-reduce of one flat buffer, before
  the Adam step), so all apply the same update.
- `sync_iteration` (--global-adv-norm): advantages are normalized with each minibatch's moments over all ranks; these,
  the episode returns and the stop flag travel in one small all-reduce per iteration.

    python leanrl/ppo_atari_envpool_ddp_torchcompile.py --compile                       # one process, no launcher
    torchrun --nproc-per-node 2 leanrl/ppo_atari_envpool_ddp_torchcompile.py --compile  # 2 ranks on this machine
"""

import contextlib
import datetime
import functools
import hashlib
import io
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import envpool
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
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
    """total timesteps of the experiments, summed over all ranks"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments of each rank"""
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
    global_adv_norm: bool = True
    """normalize each minibatch's advantages with its moments over all ranks (as one process with all envs would)"""
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
    num_threads: Optional[int] = None
    """torch intra-op threads per rank (default: this machine's cores shared out among its ranks)"""
    split_envs: bool = torch.cuda.is_available()
    """step the envs as two envpool pools, one half each: one half's emulators run while the policy acts for the
    other and its actions come back to the host, so the envs need not wait for the policy (the same transitions as one
    pool; the policy acts on half batches). Default: on where CUDA is available (the emulators wait on the GPU policy
    there), off on a CPU, where it pays only with a core the policy leaves free (2 cores: the rollout faster with
    --num-threads 1, slower with the default 2, whose threads fight the emulators for the cores; doc/atari.md)"""
    dist_timeout: float = 300.0
    """seconds a rank waits in a collective for the others before it stops with an error (a rank died or hangs)"""


def check_args(args: Args) -> Optional[dict]:
    """Every flag checked before any work, a mistake refused in one line; returns the checkpoint to resume, if any."""
    # the env first: a refused env makes every other flag moot
    plumbing.check_env_id(args.env_id, "atari", "ppo")
    plumbing.positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    plumbing.positive_finite(args, "learning_rate", "clip_coef", "max_grad_norm", "target_kl", "dist_timeout")
    plumbing.non_negative_finite(args, "ent_coef", "vf_coef")
    plumbing.unit_interval(args, "gamma", "gae_lambda")
    batch_size = args.num_envs * args.num_steps
    plumbing.check_minibatches(args, batch_size)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    if args.total_timesteps < batch_size * world_size:
        plumbing.fail(
            f"--total-timesteps {args.total_timesteps} is below one batch ({batch_size} steps x {world_size} ranks)"
        )
    # the rollout: uint8 frames, an int64 action and four floats (log-prob, reward, done, value) per env step
    plumbing.check_memory(args, "atari", rollout=batch_size * (plumbing.spaces(args.env_id)[0] + 24))
    same = ("env_id", "num_envs", "num_steps")
    # every rank resumes its own RNG and statistics: checked before check_run creates the log dir
    trained = plumbing.load_checkpoint(args, SCRIPT, same).get("world_size") if args.resume else world_size
    if trained != world_size:
        plumbing.fail(f"--resume {args.resume} was trained with {trained} ranks; launch {trained}")
    return plumbing.check_run(
        args, SCRIPT, same=same, lead=os.environ.get("RANK", "0") == "0", step=batch_size * world_size
    )


class Dist:
    """This process's place in the job. torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (and the
    rendezvous address); a plain `python script.py` is rank 0 of 1 and has no process group: nothing communicates."""

    def __init__(self, args: Args, device: torch.device):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.device = device
        if self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        # NCCL wants one GPU per rank; gloo runs on CPU, and on CUDA tensors when ranks share a GPU
        own_gpu = self.device.type == "cuda" and int(os.getenv("LOCAL_WORLD_SIZE", "1")) <= torch.cuda.device_count()
        self.backend = "nccl" if own_gpu else "gloo"
        self.t_sync = 0.0  # seconds in the loop's collectives (not the update's all-reduce), reset every iteration
        if self.world_size > 1:  # the timeout bounds every collective: a rank that died or hangs stops the others
            dist.init_process_group(
                self.backend,
                timeout=datetime.timedelta(seconds=args.dist_timeout),
                device_id=self.device if own_gpu else None,
            )

    @contextlib.contextmanager
    def peers(self):
        """A dead or hung peer (connection closed, or --dist-timeout passed) in a collective inside this block ends
        this rank at once with one clear line, not a traceback from inside gloo/nccl."""
        try:
            yield
        except RuntimeError as e:
            if not isinstance(e, dist.DistError) and "gloo" not in str(e):
                raise  # not a collective's failure (gloo reports a lost peer as a plain RuntimeError)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rsplit("] ", 1)[-1][:160]
            print(
                f"\nerror: rank {self.rank} of {self.world_size} lost the other ranks ({reason}); stopping",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)  # no clean-up that could wait on the lost peers again

    def collective(self, op, *op_args):
        """op(*op_args) over the ranks, timed into t_sync (nothing on one rank). On CUDA the collective runs
        asynchronously: the device is drained before and after, so that t_sync is the collective's time, not its
        launch's."""
        if self.world_size == 1:
            return
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        with self.peers():
            op(*op_args)
            if cuda:
                torch.cuda.synchronize(self.device)
        self.t_sync += time.perf_counter() - t0

    def broadcast_params(self, module: nn.Module):
        """Rank 0's parameters everywhere, in place: with identical updates afterwards they never need sending again."""
        for p in module.parameters():
            self.collective(dist.broadcast, p.detach(), 0)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place."""
        self.collective(dist.all_reduce, x)
        return x

    def all_gather_object(self, obj) -> list:
        out = [obj] * self.world_size
        self.collective(dist.all_gather_object, out, obj)
        return out

    def close(self):
        if self.world_size > 1:
            dist.destroy_process_group()


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


def average_gradients(dist_: Dist, agent: Agent):
    """The mean of every rank's gradients, in place: one all-reduce of one flat buffer, not one per tensor. A
    functional collective: it traces into the compiled update (and its CUDA graph) with the step that follows."""
    grads = [p.grad for p in agent.parameters()]
    flat = funcol.all_reduce(torch.cat([g.flatten() for g in grads]), "sum", dist.group.WORLD) / dist_.world_size
    for g, x in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(x.view_as(g))


def update(
    agent: Agent,
    optimizer,
    args: Args,
    dist_: Dist,
    obs,
    actions,
    logprobs,
    advantages,
    returns,
    values,
    adv_mean,
    adv_std,
):
    """One minibatch: the clipped PPO loss, backward, gradient clipping and the Adam step. Returns the statistics
    as tensors: reading them here would make the host wait for every minibatch."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    if args.norm_adv:
        advantages = (advantages - adv_mean) / (adv_std + 1e-8)  # the minibatch's, over all ranks by default
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
    if dist_.world_size > 1:
        average_gradients(dist_, agent)
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return torch.stack([approx_kl, clipfrac, pg_loss.detach(), v_loss.detach(), entropy_loss.detach()])


def sync_iteration(dist_: Dist, args: Args, advantages, perms, recent: list, stop: bool):
    """The iteration's one small all-reduce, before the update: every minibatch's advantage sum and sum of squares,
    every rank's recent returns, and whether any rank was asked to stop (all stop together). Returns (mean, std) per
    minibatch (over all ranks, or --no-global-adv-norm: this rank's), the mean return, and the stop decision."""
    mb = advantages.flatten()[perms]  # (epochs x minibatches, minibatch size)
    own = torch.tensor([sum(recent), len(recent), float(stop)], dtype=torch.float64, device=mb.device)
    sums = dist_.all_reduce(torch.cat([mb.double().sum(-1), mb.double().square().sum(-1), own]))
    count = sums[-2].item()
    n_mb = mb.shape[0]
    if args.world_size == 1 or not args.global_adv_norm:
        mean = mb.mean(-1)
        std = mb.std(-1)
    else:
        n = mb.shape[1] * args.world_size
        mean = sums[:n_mb] / n
        std = ((sums[n_mb : 2 * n_mb] - n * mean * mean) / (n - 1)).clamp_min(0).sqrt()
    return mean.float(), std.float(), (sums[-3].item() / count if count else None), sums[-1].item() > 0


def params_digest(agent) -> str:
    """A hash of the exact parameter bytes: equal on every rank if and only if the ranks stayed in step."""
    flat = torch.cat([p.detach().flatten() for p in agent.parameters()]).cpu()
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


STAT_NAMES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")


def main(args: Args):
    ckpt = check_args(args)
    global_step = ckpt["global_step"] if ckpt else 0
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    with contextlib.redirect_stderr(sys.stderr if os.environ.get("RANK", "0") == "0" else io.StringIO()):
        device = plumbing.pick_device(args)  # rank 0 says what it picked, once
    dist_ = Dist(args, device)
    rank = dist_.rank
    args.world_size = dist_.world_size
    args.batch_size = args.num_envs * args.num_steps  # per rank; the global batch is world_size times this
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // (args.batch_size * args.world_size)
    global_batch = args.batch_size * args.world_size

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # fp32 matmuls, as in the baseline (CleanRL's): LeanRL's torch.set_float32_matmul_precision("high") (TF32) changes
    # the numbers for little here: on an H200 the update is a small share of Breakout's iteration
    # (doc/gpu.md). cuDNN's convolutions take TF32 by default, in both scripts.
    # the ranks on one machine share its cores: each gets its share, or it oversubscribes them
    args.num_threads = args.num_threads or max(1, plumbing.cores() // int(os.getenv("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(args.num_threads)
    device = dist_.device
    if args.cudagraphs and args.world_size > 1 and dist_.backend != "nccl":
        plumbing.fail(
            "--cudagraphs with several ranks needs one GPU per rank (NCCL's all-reduce can be captured in a CUDA "
            "graph, gloo's cannot); launch at most one rank per GPU or drop --cudagraphs"
        )
    # --bf16 takes effect only where the hardware has native bf16: CUDA, or AVX512-BF16/AMX CPUs (oneDNN's check)
    use_bf16 = args.bf16 and (
        torch.cuda.is_bf16_supported() if device.type == "cuda" else torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )

    # envpool seeds env i with seed + i: rank r's envs continue the numbering, every env of the job its own seed
    pools = make_pools(args, seed=args.seed + rank * args.num_envs + global_step)
    n_actions = pools[0][1].action_space.n
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed + rank)  # each rank its own stream
    agent = Agent(n_actions, use_bf16).to(device)
    dist_.broadcast_params(agent)
    agent_inference = inference_copy(agent)
    lr = torch.tensor(args.learning_rate, device=device)  # changed in place: compiled code is not re-traced
    optimizer = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")

    # The units, then the trick: compiled with --compile, captured in CUDA graphs with --cudagraphs.
    # One acting unit per env pool: with an odd --num-envs the pools differ in size, and a CUDA graph has one shape.
    acts = [functools.partial(policy, agent_inference) for _ in pools]
    compute_gae = functools.partial(gae, agent_inference, gamma=args.gamma, gae_lambda=args.gae_lambda)
    update_minibatch = functools.partial(update, agent, optimizer, args, dist_)
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
        ckpt.update(ckpt["ranks"][rank])  # this rank's own RNG and statistics
        # envpool cannot save its envs: they start new episodes
        plumbing.resume(ckpt, args.seed + rank, restart=True, **parts)
    next_obs = torch.from_numpy(np.concatenate([envs.reset()[0] for _, envs in pools])).to(device)
    next_done = torch.zeros(args.num_envs, device=device)

    # rank 0 leads: it logs, shows the bar and writes the checkpoint
    run = plumbing.Run(args, SCRIPT, device, args.num_iterations * global_batch, global_step, lead=rank == 0)
    iteration = start_iteration - 1
    mean_return = None
    stop_all = False
    with run, dist_.peers():  # a peer lost in the update's all-reduce too: one line, not a traceback
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            dist_.t_sync = 0.0
            if args.anneal_lr:
                lr.fill_((1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate)

            gumbel = -torch.empty(shape + (n_actions,), device=device).exponential_(generator=rng).log()
            games, t_env, t_policy = rollout(pools, acts, next_obs, next_done, buf, gumbel)
            episodes.record_steps(games)
            global_step += global_batch
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            buf["advantages"], buf["returns"] = compute_gae(
                next_obs, next_done, buf["rewards"], buf["values"], buf["dones"]
            )
            t_gae = time.perf_counter() - t0

            t0 = time.perf_counter()
            flat = buf.reshape(-1)
            # every epoch's minibatches drawn up front, so that one all-reduce carries all their advantage moments
            perms = torch.stack(
                [torch.randperm(args.batch_size, device=device, generator=rng) for _ in range(args.update_epochs)]
            ).view(-1, args.minibatch_size)
            adv_mean, adv_std, mean_return, stop_all = sync_iteration(
                dist_, args, buf["advantages"], perms, list(episodes.finished), run.stopping
            )
            mb_stats = []
            for _epoch in range(args.update_epochs):
                for _ in range(args.num_minibatches):
                    n = len(mb_stats)
                    mb = flat[perms[n]]
                    # clone: CUDA graphs hand back the same output buffer at every replay
                    mb_stats.append(
                        update_minibatch(
                            mb["obs"],
                            mb["actions"],
                            mb["logprobs"],
                            mb["advantages"],
                            mb["returns"],
                            mb["values"],
                            adv_mean[n],
                            adv_std[n],
                        ).clone()
                    )
                kl = mb_stats[-1][0]
                # the ranks' mean KL, so that all agree
                if args.target_kl is not None and dist_.all_reduce(kl.clone()) / args.world_size > args.target_kl:
                    break
            losses = torch.stack(mb_stats).mean(0).tolist()  # the iteration's one host sync
            t_update = time.perf_counter() - t0

            run.log(
                global_step,
                steady=iteration - start_iteration + 1 >= args.measure_burnin,
                iteration=iteration,
                episodic_return=mean_return,  # all ranks' recent games; the length and losses are rank 0's
                episodic_length=episodes.mean_length(),
                t_rollout=t_rollout,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t_gae,
                t_update=t_update,
                t_sync=dist_.t_sync,
                world_size=args.world_size,
                lr=lr.item(),
                **dict(zip(STAT_NAMES, losses)),
            )
            if args.compile and iteration == start_iteration:
                run.compiled()
            if stop_all:  # some rank was asked to stop: all stop after the same iteration
                break
    for _, envs in pools:
        envs.close()
    if args.save_model and run.consistent and iteration >= start_iteration:
        # the parameters and optimizer are the same everywhere; the RNG and episode statistics are each rank's own
        ranks = dist_.all_gather_object(plumbing.state_of(dict(rng=rng, episodes=episodes)))
        run.save(
            iteration=iteration,
            global_step=global_step,
            agent=agent,
            optimizer=optimizer,
            world_size=args.world_size,
            ranks=ranks,
        )
    digests = [params_digest(agent)]
    if run.consistent:  # after a forced stop the ranks may be anywhere: no further collective (rank 0's logs are kept)
        digests = dist_.all_gather_object(digests[0])
        dist_.close()
    if rank != 0:  # rank 0 reports the run and its exit code (a non-zero one here: torchrun would tear rank 0 down)
        sys.exit(0)
    # a stop asked of any rank stopped them all, and ends the job as interrupted; a divergence stops them the same
    # way, and is recorded as diverged only, as in a single-process run
    run.stop.set = run.stop.set or (stop_all and run.diverged is None)
    run.finish(
        global_step,
        mean_return,
        run.compile_time() if args.compile else None,
        bf16=use_bf16,
        world_size=args.world_size,
        backend=dist_.backend,
        rank_param_digests=digests,
    )


if __name__ == "__main__":
    main(plumbing.parse_args(Args))
