"""PPO on Atari through envpool (Breakout-v5), ppo_atari_envpool_torchcompile.py plus iterative structured pruning.

Zeroed weights in a dense convolution cost as much as others, so this script removes channels: on a schedule
(--prune-start, --prune-every, --prune-steps up to --prune-ratio) Torch-Pruning ranks each group of coupled layers (a
layer's output channels and the inputs reading them, across the flatten into the 3136x512 layer) and rebuilds the
layers without the least important ones; Adam's moments are cut alike and the units rebuilt (recompiled, CUDA graphs
recaptured). `--prune-mode mask` zeroes them instead (masks alone buy nothing). Measured in doc/pruned.md.

    python leanrl/ppo_atari_envpool_pruned_torchcompile.py --compile                    # CPU or GPU
    python leanrl/ppo_atari_envpool_pruned_torchcompile.py --compile --prune-mode mask  # the comparison
"""

import contextlib
import copy
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
from typing import Literal, Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch_pruning as tp
import tqdm
import tyro
from tensordict import TensorDict, from_module
from tensordict.nn import CudaGraphModule
from torch.nn.utils import parametrize


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
    num_threads: int = 2
    """torch intra-op threads (2 measures fastest on a 2-core CPU: the update's convolutions dominate)"""
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
    """structural removes the channels (smaller dense layers); mask zeroes them and keeps the shapes (comparison)"""


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

    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_threads"):
        need(getattr(args, name) > 0, name, "positive")
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        need(0 < getattr(args, name) < math.inf, name, "positive and finite")
    for name in ("ent_coef", "vf_coef"):
        need(0 <= getattr(args, name) < math.inf, name, "non-negative and finite")
    for name in ("gamma", "gae_lambda"):
        need(0 < getattr(args, name) <= 1, name, "in (0, 1]")
    need(0 <= args.seed < 2**31, "seed", "in [0, 2**31)")
    need(args.measure_burnin >= 0, "measure_burnin", "non-negative")
    need(args.target_kl is None or 0 < args.target_kl < math.inf, "target_kl", "positive and finite")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} "
            f"(num_envs x num_steps); pick a divisor of {batch_size}"
        )
    if args.total_timesteps < batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    if args.capture_video:
        fail("--capture-video is not supported: envpool renders no frames")
    if args.target_kl is not None and args.cudagraphs:
        fail("--target-kl reads the KL on the host after every epoch, which CUDA graphs exist to avoid; drop one")
    for name in ("prune_steps", "prune_every", "prune_start"):
        need(getattr(args, name) > 0, name, "positive")
    need(0 <= args.prune_ratio < 1, "prune_ratio", "the fraction of channels removed, in [0, 1)")
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


def make_envs(args: Args, seed: int):
    # CleanRL's settings: 84x84 grey frames, 4 stacked, frameskip 4; a lost life ends the (training) episode and
    # rewards are clipped to their sign. The real game score comes back unclipped in info["reward"].
    return envpool.make(
        args.env_id, env_type="gym", num_envs=args.num_envs, episodic_life=True, reward_clip=True, seed=seed
    )


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

    def mean_return(self):
        return float(np.mean(self.returns)) if self.returns else None

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

    def forward(self, x, action):
        """Both heads on given actions: what Torch-Pruning traces and counts."""
        return self.get_action_and_value(x, action)


def inference_copy(agent: Agent) -> Agent:
    """The rollout's copy of the agent, whatever its shapes: the same storage, detached (acting builds no autograd
    graph). preserve_module_state=False: since tensordict 0.14 the default keeps the target's Parameters."""
    twin = copy.deepcopy(agent)
    from_module(agent).data.to_module(twin, preserve_module_state=False)
    return twin


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


def update(agent: Agent, optimizer, args: Args, obs, actions, logprobs, advantages, returns, values):
    """One minibatch: the clipped PPO loss, backward, gradient clipping and the Adam step. Returns the statistics
    as tensors: reading them here would make the host wait for every minibatch."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
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
def prune_step(pruner, optimizer, structural: bool) -> dict:
    """One step: Torch-Pruning picks each group's least important channels; structural mode rebuilds the layers without
    them, cutting Adam's moments alike (step count kept); mask mode zeroes them. Returns Adam's state, re-keyed."""
    moments = dict(optimizer.state)
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
    return moments


def model_size(agent: Agent, example: tuple) -> dict:
    """Parameters, MACs per observation (Torch-Pruning's counter), state_dict bytes and live (unmasked) parameters."""
    dense = copy.deepcopy(agent)  # the counter knows plain layers: masks, if any, folded into the weights
    for layer in dense.modules():
        for name in list(getattr(layer, "parametrizations", {})):
            parametrize.remove_parametrizations(layer, name)
    macs, params = tp.utils.count_ops_and_params(dense, example)
    buf = io.BytesIO()
    torch.save(agent.state_dict(), buf)
    masked = sum(int((mask == 0).sum()) for name, mask in agent.named_buffers() if name.endswith(".mask"))
    return dict(params=int(params), macs=int(macs), bytes=buf.tell(), live=int(params) - masked)


def make_units(agent: Agent, agent_inference: Agent, args: Args, device, compiled: bool):
    """The training state around `agent` (optimizer) and the units the loop calls, compiled if `compiled`.
    `agent_inference` is the rollout's copy of `agent`; it is made to share `agent`'s storage here."""
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    # lr is a tensor updated in place, so annealing never re-traces the compiled update; CUDA graphs replay the
    # Adam step with its counters on the device (capturable), which torch.compile arranges by itself
    optimizer = torch.optim.Adam(
        agent.parameters(),
        lr=torch.tensor(args.learning_rate, device=device),
        eps=1e-5,
        capturable=args.cudagraphs and not args.compile,
    )
    u = SimpleNamespace(
        agent=agent,
        agent_inference=agent_inference,
        optimizer=optimizer,
        act=partial(policy, agent_inference),
        advantage=partial(gae, gamma=args.gamma, gae_lambda=args.gae_lambda),
        learn=partial(update, agent, optimizer, args),
    )
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
    for key in ("env_id", "num_envs", "num_steps", "prune_mode"):
        if ckpt["args"].get(key) != getattr(args, key):
            fail(
                f"--resume {args.resume} was trained with --{key.replace('_', '-')} {ckpt['args'][key]}; pass the same"
            )
    return ckpt


def main(args: Args):
    ckpt = check_args(args)
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    script, log_dir = os.path.basename(__file__)[: -len(".py")], args.log_dir

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False
    use_bf16 = args.bf16 and bf16_supported(device)

    envs = make_envs(args, seed=args.seed + (ckpt["global_step"] if ckpt else 0))
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    agent = Agent(envs.action_space.n, use_bf16).to(device)
    example = (
        torch.zeros((1,) + envs.observation_space.shape, dtype=torch.uint8, device=device),
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
    u = make_units(agent, inference_copy(agent), args, device, args.compile)
    if args.cudagraphs:
        add_cudagraphs(u)

    shape = (args.num_steps, args.num_envs)
    buf = TensorDict(
        obs=torch.zeros(shape + envs.observation_space.shape, dtype=torch.uint8),
        actions=torch.zeros(shape, dtype=torch.long),
        logprobs=torch.zeros(shape),
        rewards=torch.zeros(shape),
        dones=torch.zeros(shape),
        values=torch.zeros(shape),
        batch_size=shape,
        device=device,
    )

    stats = EpisodeStats(args.num_envs)
    global_step, start_iteration = 0, 1
    if ckpt:
        u.agent.load_state_dict(ckpt["agent"])
        u.optimizer.load_state_dict(ckpt["optimizer"])
        rng.set_state(ckpt["rng"])
        stats.returns.extend(ckpt["returns"].tolist())
        stats.lengths.extend(ckpt["lengths"].tolist())
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
    next_obs = torch.from_numpy(envs.reset()[0]).to(device)
    next_done = torch.zeros(args.num_envs, device=device)

    def checkpoint(iteration):
        save_checkpoint(
            os.path.join(log_dir, "agent.pt"),
            dict(
                script=script,
                agent=u.agent.state_dict(),
                optimizer=u.optimizer.state_dict(),
                args=asdict(args),
                iteration=iteration,
                global_step=global_step,
                rng=rng.get_state(),
                returns=torch.tensor(list(stats.returns), dtype=torch.float64),
                lengths=torch.tensor(list(stats.lengths), dtype=torch.float64),
                pruning=dict(
                    step=pruner.current_step,
                    history=pruner.pruning_history(),
                    initial_channels=dict(pruner._scope_initial_channels),
                ),
            ),
        )

    run = None
    if args.track:
        import wandb

        run = wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=os.path.basename(log_dir),
            dir=log_dir,
            save_code=True,
        )
    metrics = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1)
    stop = StopFlag()
    bar = tqdm.tqdm(total=args.num_iterations * args.batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    iteration, start, iter_times, measure_from, fps, forced = (
        start_iteration - 1,
        time.perf_counter(),
        [],
        None,
        None,
        False,
    )
    traced_at = start_iteration  # the units compile in this iteration, and again after a structural pruning step
    if args.compile:  # the first iteration compiles: say so, or a first run looks stuck
        bar.write(
            "compiling the units on their first call (a minute or more on a cold cache; later runs load them "
            "from Inductor's on-disk cache)",
            file=sys.stderr,
        )
        bar.set_description("compiling")
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.prune_ratio > 0 and iteration in prune_at:
                moments = prune_step(pruner, u.optimizer, structural=args.prune_mode == "structural")
                if args.prune_mode == "structural":  # new shapes: new units (optimizer, acting copy, compiled code)
                    torch.compiler.reset()  # drop the code traced for the old shapes
                    u = make_units(agent, inference_copy(agent), args, device, args.compile)
                    u.optimizer.state.update(moments)
                    if args.cudagraphs:  # new wrappers, which capture again: the old ones replay the old tensors
                        add_cudagraphs(u)
                    traced_at = iteration
                    if args.compile:
                        bar.set_description("compiling")
            if args.anneal_lr:
                lr = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
                u.optimizer.param_groups[0]["lr"].copy_(lr)

            gumbel = -torch.empty(shape + (envs.action_space.n,), device=device).exponential_(generator=rng).log()
            next_obs, next_done, t_env, t_policy = rollout(envs, u.act, next_obs, next_done, buf, stats, gumbel)
            global_step += args.batch_size
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            buf["advantages"], buf["returns"] = u.advantage(
                u.agent_inference.get_value(next_obs), next_done, buf["rewards"], buf["values"], buf["dones"]
            )
            t_gae = time.perf_counter() - t0

            t0 = time.perf_counter()
            flat = buf.reshape(-1)
            losses = []
            for epoch in range(args.update_epochs):
                for mb_inds in torch.randperm(args.batch_size, device=device, generator=rng).split(args.minibatch_size):
                    mb = flat[mb_inds]
                    # clone: CUDA graphs hand back the same output buffer at every replay
                    losses.append(
                        u.learn(
                            mb["obs"], mb["actions"], mb["logprobs"], mb["advantages"], mb["returns"], mb["values"]
                        ).clone()
                    )
                if args.target_kl is not None and losses[-1][0] > args.target_kl:
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
            row = dict(
                iteration=iteration,
                global_step=global_step,
                time=now - start,
                fps=fps,
                episodic_return=stats.mean_return(),
                episodic_length=stats.mean_length(),
                t_rollout=t_rollout,
                t_env=t_env,
                t_policy=t_policy,
                t_gae=t_gae,
                t_update=t_update,
                lr=u.optimizer.param_groups[0]["lr"].item(),
                **dict(zip(STAT_NAMES, losses)),
            )
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            bar.update(args.batch_size)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            if args.compile and iteration == traced_at:
                bar.set_description("")
            stop.iterated = True
            if stop.set:
                break
    except KeyboardInterrupt:  # the second Ctrl-C: stop mid-iteration, with no consistent state to save
        stop.set = forced = True
    finally:
        bar.close()
        metrics.close()
        envs.close()
    if args.save_model and not forced and iteration >= start_iteration:
        checkpoint(iteration)

    steady = iter_times[args.measure_burnin :]
    size_after = model_size(agent, example)
    summary = dict(
        script=script,
        env_id=args.env_id,
        seed=args.seed,
        flags=asdict(args),
        **machine_info(device),
        num_threads=torch.get_num_threads(),
        bf16=use_bf16,
        total_timesteps=args.total_timesteps,
        global_step=global_step,
        wall_time=time.perf_counter() - start,
        fps=fps if measure_from else None,
        final_return=stats.mean_return(),
        compile_time=iter_times[0] - float(np.median(steady)) if args.compile and steady else None,
        interrupted=stop.set,
        prune_steps_done=pruner.current_step,
        prune_sparsity=1 - size_after["live"] / size_before["live"],
        **{
            f"prune_{k}_{when}": size[k]
            for k in ("params", "macs", "bytes")
            for when, size in (("before", size_before), ("after", size_after))
        },
    )
    with open(os.path.join(log_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if run:
        run.summary.update(summary)
        run.finish()
    print(
        f"{global_step} steps, {summary['wall_time']:.1f}s, fps {summary['fps'] or 0:.0f}, "
        f"return {summary['final_return']}, parameters {size_before['params']} -> {size_after['params']}, "
        f"logs in {log_dir}",
        file=sys.stderr,
    )
    if stop.set:
        sys.exit(130)


if __name__ == "__main__":
    main(parse_args())
