"""PPO on Atari through envpool (Breakout-v5) that acts with a reduced-precision copy of the Nature CNN.

ppo_atari_envpool_torchcompile.py plus one trick: the rollout acts with a low-precision copy of the agent, rebuilt from
the fp32 weights every `--quant-every` iterations (`--quant-async`: in a thread); the update trains the fp32 agent on
the copy's log-probs (a true importance ratio). On a CPU its trunk is int8 (`--quant-method int8`): eager static
quantization, x86 engine (fbgemm/oneDNN VNNI), convs and the 3136x512 layer fused with their ReLUs, ranges calibrated
on recent frames, rebuilt eagerly in ~0.1 s (PT2E's int8 is as fast but recompiles per rebuild; torchao's covers Linear
only). Elsewhere, bf16 weights (`--quant-method bf16`). Measured in doc/quantized.md.

    python leanrl/ppo_atari_envpool_quantized_torchcompile.py --compile                 # CPU or GPU
    python leanrl/ppo_atari_envpool_quantized_torchcompile.py --compile --quant-async   # rebuild off the critical path
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
import timeit
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from types import SimpleNamespace
from typing import Literal, Optional

import envpool
import numpy as np
import torch
import torch.ao.quantization as tq
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
    quant_every: int = 1
    """rebuild the low-precision rollout policy from the trained fp32 weights every this many iterations"""
    quant_async: bool = False
    """build the next rollout policy in a background thread while the rollouts go on; it acts from the next iteration"""
    quant_method: Literal["auto", "int8", "bf16"] = "auto"
    """the rollout policy's trunk: int8 (CPU, x86 engine), bf16 weights, or auto: int8 on such a CPU, else bf16"""


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
    need(args.quant_every > 0, "quant_every", "positive")
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


def inference_copy(agent: Agent) -> Agent:
    """The rollout's copy of the agent: the same storage, detached, so acting builds no autograd graph (no no_grad).
    preserve_module_state=False: since tensordict 0.14 the default keeps the target's Parameters, swapping only data."""
    copy = Agent(agent.actor.out_features, agent.bf16).to(next(agent.parameters()).device)
    from_module(agent).data.to_module(copy, preserve_module_state=False)
    return copy


# eager int8 warns at every rebuild that torch.ao.quantization is deprecated (see above); the pinned torch 2.13 has it
warnings.filterwarnings("ignore", message=r"(?s).*(torch\.ao\.quantization is deprecated|quantized tensor creation)")
# activations per tensor, ranges from the calibration batch (min/max: as close to fp32 as the histogram observer
# here at a third of its cost); 7 bits keep fbgemm's int16 accumulation from saturating on CPUs without VNNI
INT8_QCONFIG = tq.QConfig(
    activation=tq.MinMaxObserver.with_args(quant_min=0, quant_max=127), weight=tq.default_per_channel_weight_observer
)


def quantize_policy(agent: Agent, obs, method: str, calib_obs=None) -> Agent:
    """The rollout policy: `agent` (a fresh copy of the trained one) with a low-precision trunk, fp32 heads. int8: the
    trunk between quant/dequant stubs, each conv/linear fused with its ReLU, activation ranges observed on `calib_obs`
    (recent frames; default `obs`), converted to the x86 engine's int8 modules: trunk ~2.8x, acting step ~1.75x faster
    than fp32 at 8 envs on this CPU (AVX512-VNNI), rebuilt in ~0.1 s. bf16: the trunk's weights cast, run under its
    bf16 autocast (no per-call casts), step ~1.35x here. Returned warmed up on `obs` (a rollout step's batch)."""
    agent.requires_grad_(False)
    if method == "bf16":
        agent.network.to(torch.bfloat16)
        agent.bf16 = True
    else:
        net = nn.Sequential(tq.QuantStub(), *agent.network, tq.DeQuantStub()).eval()
        net = tq.fuse_modules(net, [["1", "2"], ["3", "4"], ["5", "6"], ["8", "9"]])  # conv/linear + ReLU
        net.qconfig = INT8_QCONFIG
        tq.prepare(net, inplace=True)
        net((obs if calib_obs is None else calib_obs).float() / 255.0)
        agent.network, agent.bf16 = tq.convert(net), False
    agent.get_value(obs)
    return agent


class Requantizer:
    """Keeps the rollout policy fresh: when due, a copy of the trained agent is converted in line or (--quant-async) in
    a background thread, acting from the next boundary. t_quant: the rebuild's time; t_swap: the loop's (or its wait)."""

    def __init__(self, agent: Agent, method: str, every: int, background: bool):
        self.agent, self.method, self.every = agent, method, every
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="quantize") if background else None
        self.current = self.pending = self.t_quant = None

    def build(self, snapshot, obs, calib_obs):
        t0 = time.perf_counter()
        return quantize_policy(snapshot, obs, self.method, calib_obs), time.perf_counter() - t0

    def refresh(self, age: int, obs, rollout_obs):
        """At each iteration's start. `age`: this run's iterations so far, `obs`: the next step's frames, `rollout_obs`:
        the last rollout's. Returns t_swap."""
        t0, self.t_quant = time.perf_counter(), None
        if self.pending is not None:
            (self.current, self.t_quant), self.pending = self.pending.result(), None
        if age % self.every == 0:
            # registered Parameters (an inference copy's plain tensors would be invisible to .to() and state_dict)
            snapshot = copy.deepcopy(self.agent)
            # int8 ranges from the frames at hand and every 16th step of the last rollout; copies: an async rebuild
            # reads them while the next rollout writes the buffer
            obs, calib_obs = obs.clone(), torch.cat([obs, rollout_obs[::16].flatten(0, 1)])
            if self.pool is None or self.current is None:  # the first copy is built in line: there is none to act yet
                self.current, self.t_quant = self.build(snapshot, obs, calib_obs)
            else:
                self.pending = self.pool.submit(self.build, snapshot, obs, calib_obs)
        return time.perf_counter() - t0

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def policy_bytes(module: nn.Module) -> int:
    """The size of the policy's serialized state (torch.save), as it would be shipped to an actor process."""
    out = io.BytesIO()
    torch.save(module.state_dict(), out)
    return out.getbuffer().nbytes


def forward_latency(policy, x, gumbel, reps: int = 30) -> float:
    """Seconds per call of one rollout step of `policy`: the median of 5 rounds after a warm-up round."""
    return float(np.median(timeit.repeat(lambda: policy(x, gumbel), number=reps, repeat=6)[1:])) / reps


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
    # the policy step takes the copy that acts as an argument: a rebuilt copy changes no code
    u = SimpleNamespace(
        agent=agent,
        agent_inference=agent_inference,
        optimizer=optimizer,
        act=policy,
        advantage=partial(gae, gamma=args.gamma, gae_lambda=args.gae_lambda),
        learn=partial(update, agent, optimizer, args),
    )
    if compiled:
        u.advantage, u.learn = torch.compile(u.advantage), torch.compile(u.learn)
        # on a CPU the policy step stays eager: int8 modules run prepacked kernels eagerly; a compiled bf16 step ran
        # slower unfrozen (oneDNN reorders the weights every call), and freezing bakes them in (a recompile per rebuild)
        if device.type == "cuda":
            u.act = torch.compile(u.act)
    return u


def add_cudagraphs(u):
    # the rollout policy stays out of CUDA graphs: a graph replays the tensors it captured; every rebuild makes new ones
    u.advantage, u.learn = CudaGraphModule(u.advantage), CudaGraphModule(u.learn)


STAT_NAMES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")


QUANT_METHODS = dict(
    int8="int8 trunk (eager static quantization, x86 engine: fbgemm/oneDNN VNNI kernels), fp32 heads",
    bf16="bf16 trunk weights (oneDNN AVX512-BF16/AMX or CUDA convolutions and GEMM), fp32 heads",
)


def resolve_quant_method(args: Args, device: torch.device):
    """--quant-method auto is int8 where PyTorch's x86 int8 engine runs (a CPU), else bf16."""
    int8_ok = device.type == "cpu" and "x86" in torch.backends.quantized.supported_engines
    if args.quant_method == "auto":
        args.quant_method = "int8" if int8_ok else "bf16"
    if args.quant_method == "int8":
        if not int8_ok:
            fail(f"--quant-method int8 runs PyTorch's x86 CPU int8 kernels, not available on {device.type}; use bf16")
        torch.backends.quantized.engine = "x86"


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
    resolve_quant_method(args, device)

    envs = make_envs(args, seed=args.seed + (ckpt["global_step"] if ckpt else 0))
    # the loop's random numbers (exploration, minibatches) come from its own generator: torch.compile restores torch's
    # global generator after compiling a function, which would replay numbers the loop drew before the compile
    rng = torch.Generator(device).manual_seed(args.seed)
    agent = Agent(envs.action_space.n, use_bf16).to(device)
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
    requant = Requantizer(u.agent, args.quant_method, args.quant_every, args.quant_async)
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
            if args.anneal_lr:
                lr = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
                u.optimizer.param_groups[0]["lr"].copy_(lr)

            t_swap = requant.refresh(iteration - start_iteration, next_obs, buf["obs"])
            qagent = requant.current  # the policy that acts in this rollout: its log-probs and values are stored
            gumbel = -torch.empty(shape + (envs.action_space.n,), device=device).exponential_(generator=rng).log()
            next_obs, next_done, t_env, t_policy = rollout(
                envs, partial(u.act, qagent), next_obs, next_done, buf, stats, gumbel
            )
            global_step += args.batch_size
            t_rollout = time.perf_counter() - t_iter

            t0 = time.perf_counter()
            # values from the acting copy's critic, free with its step: fp32 values cost a trunk forward (~10% of an
            # iteration, more than int8 saves) and ended Breakout at 400k not significantly higher (9.4 vs 8.2, 3 seeds)
            buf["advantages"], buf["returns"] = u.advantage(
                qagent.get_value(next_obs), next_done, buf["rewards"], buf["values"], buf["dones"]
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
                t_quant=requant.t_quant,
                t_swap=t_swap,
                lr=u.optimizer.param_groups[0]["lr"].item(),
                **dict(zip(STAT_NAMES, losses)),
            )
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            bar.update(args.batch_size)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            if args.compile and iteration == start_iteration:
                bar.set_description("")
            stop.iterated = True
            if stop.set:
                break
    except KeyboardInterrupt:  # the second Ctrl-C: stop mid-iteration, with no consistent state to save
        stop.set = forced = True
    finally:
        requant.close()
        bar.close()
        metrics.close()
        envs.close()
    if args.save_model and not forced and iteration >= start_iteration:
        checkpoint(iteration)

    # the policy's cost per rollout step, both precisions side by side on the last observations (eager both)
    gumbel = -torch.empty(args.num_envs, u.agent.actor.out_features, device=device).exponential_().log()
    latency_fp32 = forward_latency(partial(policy, u.agent_inference), next_obs, gumbel)
    latency_quant = forward_latency(partial(policy, requant.current), next_obs, gumbel)
    quant = dict(
        quant_method=QUANT_METHODS[args.quant_method],
        quant_every=args.quant_every,
        quant_async=args.quant_async,
        policy_bytes_fp32=policy_bytes(u.agent),
        policy_bytes_quant=policy_bytes(requant.current),
        policy_latency_fp32_us=latency_fp32 * 1e6,
        policy_latency_quant_us=latency_quant * 1e6,
    )

    steady = iter_times[args.measure_burnin :]
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
        **quant,
    )
    with open(os.path.join(log_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if run:
        run.summary.update(summary)
        run.finish()
    print(
        f"{global_step} steps, {summary['wall_time']:.1f}s, fps {summary['fps'] or 0:.0f}, "
        f"return {summary['final_return']}, logs in {log_dir}",
        file=sys.stderr,
    )
    if stop.set:
        sys.exit(130)


if __name__ == "__main__":
    main(parse_args())
