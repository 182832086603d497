"""ppo_atari_envpool_torchcompile.py made synchronous data-parallel (DD-PPO style) on torch.distributed (torchrun).

Every rank runs its own envpool with its own seed and starts from rank 0's parameters; every minibatch the ranks
average their gradients (one all-reduce of one flat buffer, before the Adam step), so all apply the same update.
Advantages are normalized with each minibatch's moments over all ranks (`--global-adv-norm`); these, the episode
returns and the stop flag travel in one small all-reduce per iteration. Rank 0 logs. gloo on CPU, nccl on CUDA; launch
commands and scaling: doc/distributed.md. The base script's docstring holds per rank.

    python leanrl/ppo_atari_envpool_ddp_torchcompile.py --compile                       # one process, no launcher
    torchrun --nproc-per-node 2 leanrl/ppo_atari_envpool_ddp_torchcompile.py --compile  # 2 ranks on this machine
"""

import contextlib
import datetime
import hashlib
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
from functools import partial
from types import SimpleNamespace
from typing import Optional

import envpool
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule


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
    """if toggled, wrap policy, gae and update in torch.compile"""
    cudagraphs: bool = False
    """if toggled, wrap policy, gae and update in tensordict's CudaGraphModule (CUDA only; ignored on CPU)"""
    bf16: bool = False
    """run the CNN trunk under bfloat16 autocast where the hardware has native bf16 (AVX512-BF16/AMX CPUs, CUDA):
    ~1.5x faster on a 2-core CPU, but on Breakout it learned slower at 200k steps (doc/atari.md), so it is opt-in"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the games restart, see load_checkpoint)"""
    num_threads: Optional[int] = None
    """torch intra-op threads per rank (default: this machine's cores shared out among its ranks)"""
    dist_timeout: float = 300.0
    """seconds a rank waits in a collective for the others before it stops with an error (a rank died or hangs)"""


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
    if "atari" in family:
        return
    if "classic_control" in family:
        fail(f"--env-id {env_id} is a classic-control task; use leanrl/ppo_torchcompile.py")
    if "mujoco" in family:
        fail(f"--env-id {env_id} is a MuJoCo task; this script takes Atari games (no continuous control in leanrl yet)")
    fail(f"--env-id {env_id}: unknown env id; this script takes envpool Atari ids such as Breakout-v5 or Pong-v5")


def check_args(args: Args) -> Optional[dict]:
    """Every flag against its meaning, before any work: a user mistake ends the run here with one line. Returns the
    checkpoint to resume from, if any."""
    def need(ok: bool, name: str, what: str):
        if not ok:
            fail(f"--{name.replace('_', '-')} must be {what}, got {getattr(args, name)}")
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        need(getattr(args, name) > 0, name, "positive")
    for name in ("learning_rate", "clip_coef", "max_grad_norm", "dist_timeout"):
        need(0 < getattr(args, name) < math.inf, name, "positive and finite")
    for name in ("ent_coef", "vf_coef"):
        need(0 <= getattr(args, name) < math.inf, name, "non-negative and finite")
    for name in ("gamma", "gae_lambda"):
        need(0 < getattr(args, name) <= 1, name, "in (0, 1]")
    need(0 <= args.seed < 2**31, "seed", "in [0, 2**31)")
    need(args.measure_burnin >= 0, "measure_burnin", "non-negative")
    need(args.target_kl is None or 0 < args.target_kl < math.inf, "target_kl", "positive and finite")
    need(args.num_threads is None or args.num_threads > 0, "num_threads", "positive")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} "
             f"(num_envs x num_steps); pick a divisor of {batch_size}")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    if args.total_timesteps < batch_size * world_size:
        fail(f"--total-timesteps {args.total_timesteps} is below one batch ({batch_size} steps x {world_size} ranks)")
    if args.capture_video:
        fail("--capture-video is not supported: envpool renders no frames")
    if args.target_kl is not None and args.cudagraphs:
        fail("--target-kl reads the KL on the host after every epoch, which CUDA graphs exist to avoid; drop one")
    check_env_id(args.env_id)
    ckpt = load_checkpoint(args) if args.resume else None
    check_log_dir(args)
    return ckpt


def check_log_dir(args: Args):
    """The last check (a bad flag never creates a folder): the default log dir resolved, created and written to."""
    script = os.path.basename(__file__)[: -len(".py")]
    args.log_dir = args.log_dir or f"runs/{args.env_id}__{script}__{args.seed}__{int(time.time())}"
    try:
        os.makedirs(args.log_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.log_dir).close()
    except OSError as e:
        fail(f"--log-dir {args.log_dir}: cannot write there ({e.strerror or e})")


class Dist:
    """This process's place in the job. torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (and the
    rendezvous address); a plain `python script.py` is rank 0 of 1 and has no process group: nothing communicates."""

    def __init__(self, args: Args):
        self.rank, self.world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        self.device = torch.device("cpu")
        if torch.cuda.is_available() and args.cuda:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        # NCCL wants one GPU per rank; gloo runs on CPU, and on CUDA tensors when ranks share a GPU
        own_gpu = self.device.type == "cuda" and int(os.getenv("LOCAL_WORLD_SIZE", "1")) <= torch.cuda.device_count()
        self.backend = "nccl" if own_gpu else "gloo"
        self.t_sync = 0.0  # seconds spent in collectives, reset every iteration
        if self.world_size > 1:  # the timeout bounds every collective: a rank that died or hangs stops the others
            dist.init_process_group(self.backend, timeout=datetime.timedelta(seconds=args.dist_timeout),
                                    device_id=self.device if own_gpu else None)

    def collective(self, op, *op_args):
        """op(*op_args) over the ranks, timed into t_sync (nothing on one rank); a dead or hung peer (connection closed,
        or --dist-timeout passed) ends this rank at once with one clear line, not a traceback from inside gloo/nccl."""
        if self.world_size == 1:
            return
        t0 = time.perf_counter()
        try:
            op(*op_args)
        except RuntimeError as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rsplit("] ", 1)[-1][:160]
            print(f"\nerror: rank {self.rank} of {self.world_size} lost the other ranks ({reason}); stopping",
                  file=sys.stderr, flush=True)
            os._exit(1)  # no clean-up that could wait on the lost peers again
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


def make_envs(args: Args, seed: int):
    # CleanRL's settings: 84x84 grey frames, 4 stacked, frameskip 4; a lost life ends the (training) episode and
    # rewards are clipped to their sign. The real game score comes back unclipped in info["reward"].
    return envpool.make(args.env_id, env_type="gym", num_envs=args.num_envs, episodic_life=True, reward_clip=True,
                        seed=seed)


class EpisodeStats:
    """The full game's unclipped score: info["reward"] summed until info["terminated"] (all lives lost) or the time
    limit. The 5-tuple's `terminated` is per life under episodic_life and its reward is clipped, so neither is used."""

    def __init__(self, num_envs: int, window: int = 20):
        self.score = np.zeros(num_envs)
        self.returns, self.lengths = deque(maxlen=window), deque(maxlen=window)

    def step(self, info: dict, truncated: np.ndarray):
        ids = info["env_id"]
        self.score[ids] += info["reward"]
        over = np.logical_or(info["terminated"], truncated)
        self.returns.extend(self.score[ids[over]].tolist())
        self.lengths.extend(info["elapsed_step"][over].tolist())
        self.score[ids[over]] = 0.0

    def mean_length(self):
        return float(np.mean(self.lengths)) if self.lengths else None


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
        # bf16 autocast covers the convolutions and the 3136x512 layer, where the time goes (~2x fp32 on AMX/AVX512);
        # heads and downstream see fp32. No cast cache: each weight is cast once a call; CUDA graph capture needs it off.
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


def rollout(envs, policy, next_obs, next_done, buf: TensorDict, stats: EpisodeStats, gumbel):
    """num_steps of every env into `buf`, acting on the noise `gumbel` [steps, envs, actions]; returns the time split."""
    t_env = t_policy = 0.0
    device = next_obs.device
    for step in range(buf.shape[0]):
        t0 = time.perf_counter()
        buf["obs"][step] = next_obs
        buf["dones"][step] = next_done
        action, logprob, value = policy(next_obs, gumbel[step])
        buf["actions"][step], buf["logprobs"][step], buf["values"][step] = action, logprob, value
        t1 = time.perf_counter()
        obs_np, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
        t2 = time.perf_counter()
        stats.step(info, truncated)
        # from_numpy shares the host arrays: on CPU nothing is copied until the buffer write above
        next_obs = torch.from_numpy(obs_np).to(device, non_blocking=True)
        next_done = torch.from_numpy(np.logical_or(terminated, truncated)).to(device, torch.float32, non_blocking=True)
        buf["rewards"][step] = torch.from_numpy(reward).to(device, non_blocking=True)
        t_env, t_policy = t_env + t2 - t1, t_policy + t1 - t0
    return next_obs, next_done, t_env, t_policy


def gae(next_value, next_done, rewards, values, dones, gamma: float, gae_lambda: float):
    advantages = torch.empty_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    nextnonterminal, nextvalues = 1.0 - next_done, next_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
        nextnonterminal, nextvalues = 1.0 - dones[t], values[t]
    return advantages, advantages + values


@torch.compiler.disable  # left eager inside the compiled update (a graph break), so that its time is measured: t_sync
def average_gradients(dist_: Dist, agent: Agent):
    """The mean of every rank's gradients, in place: one all-reduce of one flat buffer, not one per tensor."""
    grads = [p.grad for p in agent.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist_.all_reduce(flat)
    flat /= dist_.world_size
    for g, x in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(x.view_as(g))


def update(agent: Agent, optimizer, args: Args, dist_: Dist, obs, actions, logprobs, advantages, returns, values,
           adv_mean, adv_std):
    """One minibatch: the clipped PPO loss, backward, gradient clipping and the Adam step. Returns the statistics
    as tensors: reading them here would make the host wait for every minibatch."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    if args.norm_adv:
        advantages = (advantages - adv_mean) / (adv_std + 1e-8)  # the minibatch's, over all ranks by default
    pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
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


def sync_iteration(dist_: Dist, args: Args, advantages, perms, stats: EpisodeStats, stop: bool):
    """The iteration's one small all-reduce, before the update: every minibatch's advantage sum and sum of squares,
    every rank's recent returns, and whether any rank was asked to stop (all stop together). Returns (mean, std) per
    minibatch (over all ranks, or --no-global-adv-norm: this rank's), the mean return, and the stop decision."""
    mb = advantages.flatten()[perms]  # (epochs x minibatches, minibatch size)
    recent = list(stats.returns)
    sums = torch.cat([mb.double().sum(-1), mb.double().square().sum(-1),
                      torch.tensor([sum(recent), len(recent), float(stop)], dtype=torch.float64, device=mb.device)])
    sums = dist_.all_reduce(sums)
    count, n_mb = sums[-2].item(), mb.shape[0]
    if args.world_size == 1 or not args.global_adv_norm:
        mean, std = mb.mean(-1), mb.std(-1)
    else:
        n = mb.shape[1] * args.world_size
        mean = sums[:n_mb] / n
        std = ((sums[n_mb:2 * n_mb] - n * mean * mean) / (n - 1)).clamp_min(0).sqrt()
    return mean.float(), std.float(), (sums[-3].item() / count if count else None), sums[-1].item() > 0


def params_digest(agent) -> str:
    """A hash of the exact parameter bytes: equal on every rank if and only if the ranks stayed in step."""
    flat = torch.cat([p.detach().flatten() for p in agent.parameters()]).cpu()
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def make_units(agent: Agent, agent_inference: Agent, args: Args, dist_: Dist, device, compiled: bool):
    """The training state around `agent` (optimizer) and the units the loop calls, compiled if `compiled`.
    `agent_inference` is the rollout's copy of `agent`; it is made to share `agent`'s storage here."""
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    # lr is a tensor updated in place, so annealing never re-traces the compiled update; CUDA graphs replay the
    # Adam step with its counters on the device (capturable), which torch.compile arranges by itself
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(args.learning_rate, device=device), eps=1e-5,
                                 capturable=args.cudagraphs and not args.compile)
    u = SimpleNamespace(agent=agent, agent_inference=agent_inference, optimizer=optimizer,
                        act=partial(policy, agent_inference),
                        advantage=partial(gae, gamma=args.gamma, gae_lambda=args.gae_lambda),
                        learn=partial(update, agent, optimizer, args, dist_))
    if compiled:
        u.act, u.advantage, u.learn = torch.compile(u.act), torch.compile(u.advantage), torch.compile(u.learn)
    return u


def add_cudagraphs(u):
    u.act, u.advantage, u.learn = CudaGraphModule(u.act), CudaGraphModule(u.advantage), CudaGraphModule(u.learn)


STAT_NAMES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
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


def save_checkpoint(path: str, payload: dict):
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves a truncated agent.pt


def load_checkpoint(args: Args) -> dict:
    """Agent, optimizer, RNGs, iteration and step count. envpool cannot snapshot the emulators, so a resumed run
    restarts its games (with a fresh seed) and loses the games that were in flight."""
    if not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        assert isinstance(ckpt, dict) and "args" in ckpt
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    script = os.path.basename(__file__)[: -len(".py")]
    if ckpt.get("script", script) != script:  # checkpoints from before the key go on to the args checks
        fail(f"--resume {args.resume} was written by {ckpt['script']}.py; resume it with that script")
    for key in ("env_id", "num_envs", "num_steps"):
        if ckpt["args"].get(key) != getattr(args, key):
            fail(f"--resume {args.resume} was trained with --{key.replace('_', '-')} {ckpt['args'][key]}; pass the same")
    if ckpt.get("world_size") != int(os.environ.get("WORLD_SIZE", "1")):  # every rank resumes its own RNG and stats
        fail(f"--resume {args.resume} was trained with {ckpt.get('world_size')} ranks; launch {ckpt.get('world_size')}")
    return ckpt


def main(args: Args):
    ckpt = check_args(args)
    dist_ = Dist(args)
    rank, lead = dist_.rank, dist_.rank == 0  # rank 0 leads: it logs, shows the bar and writes the checkpoint
    args.world_size = dist_.world_size
    args.batch_size = args.num_envs * args.num_steps  # per rank; the global batch is world_size times this
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // (args.batch_size * args.world_size)
    script, log_dir = os.path.basename(__file__)[: -len(".py")], args.log_dir

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # the ranks on one machine share its cores: each gets its share, or it oversubscribes them
    args.num_threads = args.num_threads or max(1, (os.cpu_count() or 1) // int(os.getenv("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(args.num_threads)
    device = dist_.device
    if args.cudagraphs and device.type != "cuda":
        if lead:
            print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False
    if args.cudagraphs and args.world_size > 1 and dist_.backend != "nccl":
        fail("--cudagraphs with several ranks needs one GPU per rank (NCCL's all-reduce can be captured in a CUDA "
             "graph, gloo's cannot); launch at most one rank per GPU or drop --cudagraphs")
    use_bf16 = args.bf16 and bf16_supported(device)

    # envpool seeds env i with seed + i: rank r's envs continue the numbering, every env of the job its own seed
    envs = make_envs(args, seed=args.seed + rank * args.num_envs + (ckpt["global_step"] if ckpt else 0))
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed + rank)  # each rank its own stream
    agent = Agent(envs.action_space.n, use_bf16).to(device)
    dist_.broadcast_params(agent)
    u = make_units(agent, inference_copy(agent), args, dist_, device, args.compile)
    if args.cudagraphs:
        add_cudagraphs(u)

    shape = (args.num_steps, args.num_envs)
    buf = TensorDict(obs=torch.zeros(shape + envs.observation_space.shape, dtype=torch.uint8),
                     actions=torch.zeros(shape, dtype=torch.long), logprobs=torch.zeros(shape),
                     rewards=torch.zeros(shape), dones=torch.zeros(shape), values=torch.zeros(shape),
                     batch_size=shape, device=device)

    stats = EpisodeStats(args.num_envs)
    global_step, start_iteration = 0, 1
    if ckpt:
        u.agent.load_state_dict(ckpt["agent"])
        u.optimizer.load_state_dict(ckpt["optimizer"])
        ckpt.update(ckpt["ranks"][rank])  # this rank's own RNG and statistics
        rng.set_state(ckpt["rng"])
        stats.returns.extend(ckpt["returns"].tolist())
        stats.lengths.extend(ckpt["lengths"].tolist())
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
    next_obs = torch.from_numpy(envs.reset()[0]).to(device)
    next_done = torch.zeros(args.num_envs, device=device)

    def checkpoint(iteration):
        # the parameters and optimizer are the same everywhere; the RNG and episode statistics are each rank's own
        ranks = dist_.all_gather_object(dict(
            rng=rng.get_state(), returns=torch.tensor(list(stats.returns), dtype=torch.float64),
            lengths=torch.tensor(list(stats.lengths), dtype=torch.float64)))
        if lead:
            save_checkpoint(os.path.join(log_dir, "agent.pt"), dict(
                script=script, agent=u.agent.state_dict(), optimizer=u.optimizer.state_dict(), args=asdict(args),
                iteration=iteration, global_step=global_step, world_size=args.world_size, ranks=ranks))

    run = None
    if args.track and lead:
        import wandb

        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                         name=os.path.basename(log_dir), dir=log_dir, save_code=True)
    metrics = open(os.path.join(log_dir, "metrics.jsonl") if lead else os.devnull, "a", buffering=1)
    stop = StopFlag()
    global_batch = args.batch_size * args.world_size
    bar = tqdm.tqdm(total=args.num_iterations * global_batch, initial=global_step, unit="step", dynamic_ncols=True,
                    disable=not lead)
    iteration, start, iter_times, measure_from, fps, forced = start_iteration - 1, time.perf_counter(), [], None, None, False
    stop_all, mean_return = False, None
    if args.compile and lead:  # the first iteration compiles: say so, or a first run looks stuck
        bar.write("compiling the units on their first call (a minute or more on a cold cache; later runs load them "
                  "from Inductor's on-disk cache)", file=sys.stderr)
        bar.set_description("compiling")
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            dist_.t_sync = 0.0
            if args.anneal_lr:
                lr = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
                u.optimizer.param_groups[0]["lr"].copy_(lr)

            gumbel = -torch.empty(shape + (envs.action_space.n,), device=device).exponential_(generator=rng).log()
            next_obs, next_done, t_env, t_policy = rollout(envs, u.act, next_obs, next_done, buf, stats, gumbel)
            global_step += global_batch
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            buf["advantages"], buf["returns"] = u.advantage(u.agent_inference.get_value(next_obs), next_done,
                                                          buf["rewards"], buf["values"], buf["dones"])
            t_gae = time.perf_counter() - t0

            t0 = time.perf_counter()
            flat = buf.reshape(-1)
            # every epoch's minibatches drawn up front, so that one all-reduce carries all their advantage moments
            perms = torch.stack([torch.randperm(args.batch_size, device=device, generator=rng)
                                 for _ in range(args.update_epochs)]).view(-1, args.minibatch_size)
            adv_mean, adv_std, mean_return, stop_all = sync_iteration(dist_, args, buf["advantages"], perms, stats, stop.set)
            losses = []
            for epoch in range(args.update_epochs):
                for _ in range(args.num_minibatches):
                    n = len(losses)
                    mb = flat[perms[n]]
                    # clone: CUDA graphs hand back the same output buffer at every replay
                    losses.append(u.learn(mb["obs"], mb["actions"], mb["logprobs"], mb["advantages"], mb["returns"],
                                          mb["values"], adv_mean[n], adv_std[n]).clone())
                if (args.target_kl is not None  # the ranks' mean KL, so that all agree
                        and dist_.all_reduce(losses[-1][0].clone()) / args.world_size > args.target_kl):
                    break
            losses = torch.stack(losses).mean(0).tolist()  # the iteration's one host sync
            t_update = time.perf_counter() - t0

            # steady-state fps: whole iterations after the burn-in
            now = time.perf_counter()
            iter_times.append(now - t_iter)
            if iteration - start_iteration + 1 == args.measure_burnin:
                measure_from = (now, global_step)
            fps = None
            if measure_from and global_step > measure_from[1]:
                fps = (global_step - measure_from[1]) / (now - measure_from[0])
            # episodic_return: all ranks' recent games; the length and losses are rank 0's
            row = dict(iteration=iteration, global_step=global_step, time=now - start, fps=fps,
                       episodic_return=mean_return, episodic_length=stats.mean_length(),
                       t_rollout=t_rollout, t_env=t_env, t_policy=t_policy, t_gae=t_gae, t_update=t_update,
                       t_sync=dist_.t_sync, world_size=args.world_size, lr=u.optimizer.param_groups[0]["lr"].item(),
                       **dict(zip(STAT_NAMES, losses)))
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            bar.update(global_batch)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            if args.compile and iteration == start_iteration:
                bar.set_description("")
            stop.iterated = True
            if stop_all:  # some rank was asked to stop: all stop after the same iteration
                break
    except KeyboardInterrupt:  # the second Ctrl-C: stop mid-iteration, with no consistent state to save
        stop.set = forced = True
    finally:
        bar.close()
        metrics.close()
        envs.close()
    if args.save_model and not forced and iteration >= start_iteration:
        checkpoint(iteration)
    stop.set, digests = stop.set or stop_all, [params_digest(u.agent)]
    if not forced:  # after a forced stop the ranks may be anywhere: no further collective (rank 0's logs are kept)
        digests = dist_.all_gather_object(digests[0])
        dist_.close()
    if not lead:  # rank 0 reports the run and its exit code (a non-zero one here: torchrun would tear rank 0 down)
        sys.exit(0)

    steady = iter_times[args.measure_burnin:]
    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), bf16=use_bf16, total_timesteps=args.total_timesteps,
                   global_step=global_step, wall_time=time.perf_counter() - start, fps=fps if measure_from else None,
                   final_return=mean_return,
                   compile_time=iter_times[0] - float(np.median(steady)) if args.compile and steady else None,
                   interrupted=stop.set, world_size=args.world_size, backend=dist_.backend, rank_param_digests=digests)
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
