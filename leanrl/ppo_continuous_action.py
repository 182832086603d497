"""PPO for continuous control (MuJoCo through envpool, HalfCheetah-v4): the eager baseline.

CleanRL's `ppo_continuous_action.py` algorithm, network and defaults, written plainly: a Gaussian policy with a
state-independent log-std, Python loops, one autograd step per minibatch. CleanRL gets observation normalization,
reward scaling and action clipping from gymnasium wrappers; here they are written out (`RunningMeanStd`,
`Normalizer`), shared by all envs, reset at episode ends, and saved in the checkpoint with the agent.
It is the yardstick `ppo_continuous_action_torchcompile.py` is measured against.

    python leanrl/ppo_continuous_action.py                  # 1M steps of HalfCheetah-v4
    python leanrl/ppo_continuous_action.py --compile        # the same code under a naive torch.compile of the agent
"""

import contextlib
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
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import tqdm
import tyro
from torch.distributions.normal import Normal


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

    env_id: str = "HalfCheetah-v4"
    """the id of the environment (an envpool MuJoCo task with the Gymnasium interface)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
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
    """if toggled, wrap the agent's methods in torch.compile (the naive one-liner; see the _torchcompile script)"""
    cudagraphs: bool = False
    """CUDA graphs need the rollout/gae/update units of ppo_continuous_action_torchcompile.py; ignored without CUDA"""
    measure_burnin: int = 3
    """iterations left out of the steady-state fps (compilation and warm-up happen there)"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the agent, optimizer and normalizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the episodes restart, see load_checkpoint)"""
    num_threads: int = 1
    """torch intra-op threads (1 measures fastest for these 64-unit layers)"""


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


def check_args(args: Args) -> Optional[dict]:
    """Every flag against its meaning, before any work (a mistake: one line, exit 2); returns the checkpoint, if any."""
    def need(ok: bool, name: str, what: str):
        if not ok:
            fail(f"--{name.replace('_', '-')} must be {what}, got {getattr(args, name)}")

    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "num_threads"):
        need(getattr(args, name) > 0, name, "positive")
    for name in ("learning_rate", "clip_coef", "max_grad_norm"):
        need(0 < getattr(args, name) < math.inf, name, "positive and finite")
    for name in ("ent_coef", "vf_coef", "measure_burnin"):
        need(0 <= getattr(args, name) < math.inf, name, "non-negative and finite")
    for name in ("gamma", "gae_lambda"):
        need(0 < getattr(args, name) <= 1, name, "in (0, 1]")
    need(0 <= args.seed < 2**31, "seed", "in [0, 2**31) (envpool's seeds are int32)")
    need(args.target_kl is None or 0 < args.target_kl < math.inf, "target_kl", "positive and finite")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch of {batch_size} "
             f"(num_envs x num_steps); pick a divisor of {batch_size}")
    if args.total_timesteps < batch_size:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {batch_size} steps")
    if args.capture_video:
        fail("--capture-video is not supported: envpool renders no frames")
    if args.cudagraphs and args.cuda and torch.cuda.is_available():
        fail("ppo_continuous_action.py is the eager baseline; --cudagraphs needs the units of "
             "leanrl/ppo_continuous_action_torchcompile.py")
    env_id, family = args.env_id, envpool.registration.registry.specs.get(args.env_id, ("",))[0]
    if "atari" in family:
        fail(f"--env-id {env_id} is an Atari game (discrete actions); use leanrl/ppo_atari_envpool.py")
    if "classic_control" in family:
        fail(f"--env-id {env_id} is a classic-control task; this script takes MuJoCo tasks such as HalfCheetah-v4 "
             "(discrete classic control: leanrl/ppo.py)")
    if family != "envpool.mujoco.gym":
        fail(f"--env-id {env_id}: {'not a Gymnasium-style MuJoCo task' if 'mujoco' in family else 'unknown env id'}; "
             "this script takes envpool MuJoCo ids such as HalfCheetah-v4, Hopper-v4, Ant-v4")
    ckpt = load_checkpoint(args) if args.resume else None
    check_log_dir(args)
    return ckpt


def check_log_dir(args: Args):
    """The last check (a bad flag never creates a folder): the log dir, its default resolved into args, is writable."""
    script = os.path.basename(__file__)[: -len(".py")]
    args.log_dir = args.log_dir or f"runs/{args.env_id}__{script}__{args.seed}__{int(time.time())}"
    try:
        os.makedirs(args.log_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=args.log_dir).close()
    except OSError as e:
        fail(f"--log-dir {args.log_dir}: cannot write there ({e.strerror or e})")


def make_envs(args: Args, seed: int):
    return envpool.make(args.env_id, env_type="gymnasium", num_envs=args.num_envs, seed=seed)


def env_step(envs, action: np.ndarray):
    """One step with CleanRL's (gymnasium's SAME_STEP) auto-reset: the observation after an episode's end is the
    next episode's first. envpool resets an env on the step *after* its episode ended, ignoring that step's action and
    returning reward 0 (checked on envpool 1.2.5): left alone, that dead step would enter the batch as a transition
    the action did not cause. Resetting the ended envs right away (envpool's reset takes a subset of env ids) keeps
    every stored transition real, at one extra env call per episode end."""
    obs, reward, terminated, truncated, _ = envs.step(action)
    done = terminated | truncated
    if done.any():
        ended = np.flatnonzero(done)
        obs[ended] = envs.reset(ended)[0]
    return obs, reward, done


class RunningMeanStd:
    """Mean and (population) variance of everything seen so far, merged one batch at a time (Chan et al.'s parallel
    update, exact for any batch size). Starts like gymnasium's: mean 0, var 1, with a weight of 1e-4 samples."""

    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x: np.ndarray):
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        self.count = total

    def state_dict(self):
        return dict(mean=torch.as_tensor(self.mean), var=torch.as_tensor(self.var), count=torch.tensor(self.count))

    def load_state_dict(self, s):
        self.mean, self.var, self.count = s["mean"].numpy(), s["var"].numpy(), s["count"].item()


class Normalizer:
    """CleanRL's NormalizeObservation + clip and NormalizeReward + clip, for all envs at once (one set of statistics,
    updated with every env's values each step) and with episode ends handled: each env's discounted return starts
    again from 0 when its episode ends, by termination or by time limit. (gymnasium's wrapper resets it only on
    termination, and one step late, so on HalfCheetah, which only times out, it never resets.)"""

    def __init__(self, num_envs: int, obs_dim: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.obs_rms, self.ret_rms = RunningMeanStd((obs_dim,)), RunningMeanStd()
        self.ret = np.zeros(num_envs)  # each env's discounted return so far in its episode
        self.gamma, self.clip, self.eps = gamma, clip, eps

    def obs(self, obs: np.ndarray) -> np.ndarray:
        """Update the statistics with the observations the agent is about to see, then normalize them."""
        self.obs_rms.update(obs)
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.eps), -self.clip, self.clip)

    def reward(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Scale the reward by the std of the discounted return (updated with this step's), then clip."""
        self.ret = self.ret * self.gamma + reward
        self.ret_rms.update(self.ret)
        scaled = np.clip(reward / np.sqrt(self.ret_rms.var + self.eps), -self.clip, self.clip)
        self.ret[done] = 0.0
        return scaled

    def state_dict(self):
        return dict(obs_rms=self.obs_rms.state_dict(), ret_rms=self.ret_rms.state_dict())

    def load_state_dict(self, s):
        self.obs_rms.load_state_dict(s["obs_rms"])
        self.ret_rms.load_state_dict(s["ret_rms"])


class EpisodeStats:
    """Episode returns from the raw rewards: the returns logged are the real, unnormalized ones."""

    def __init__(self, num_envs: int, window: int = 20):
        self.ret, self.returns = np.zeros(num_envs), deque(maxlen=window)

    def step(self, reward: np.ndarray, done: np.ndarray):
        self.ret += reward
        self.returns.extend(self.ret[done].tolist())
        self.ret[done] = 0.0

    def mean_return(self):
        return float(np.mean(self.returns)) if self.returns else None


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
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
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return dict(device=str(device), torch=torch.__version__, cpu=f"{cpu} ({os.cpu_count()} cores)", gpu=gpu)


class StopFlag:
    """Ctrl-C (or SIGTERM) asks the loop to stop after the current iteration, so the checkpoint is consistent;
    a second Ctrl-C stops at once."""

    def __init__(self):
        self.set = False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        print("\nstopping after this iteration (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr)


def save_checkpoint(path: str, payload: dict):
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves a truncated agent.pt


def load_checkpoint(args: Args) -> dict:
    """Agent, optimizer, normalizer statistics, RNGs, iteration and step count. envpool cannot snapshot the
    simulators, so a resumed run starts new episodes (with a fresh seed); the normalizer carries on."""
    if not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    script = os.path.basename(__file__)[: -len(".py")]
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        written_by, trained = ckpt.get("script", script), ckpt["args"]  # no "script": written before it was stored
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if written_by != script:
        fail(f"--resume {args.resume} was written by {written_by}.py; resume it with that script")
    for key in ("env_id", "num_envs", "num_steps"):
        if trained.get(key) != getattr(args, key):
            fail(f"--resume {args.resume} was trained with --{key.replace('_', '-')} {trained.get(key)}; pass the same")
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
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)

    envs = make_envs(args, seed=args.seed + (ckpt["global_step"] if ckpt else 0))
    n_obs, n_actions = envs.observation_space.shape[0], envs.action_space.shape[0]
    action_low, action_high = envs.action_space.low, envs.action_space.high
    agent = Agent(n_obs, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    get_action_and_value, get_value = agent.get_action_and_value, agent.get_value
    if args.compile:
        get_action_and_value, get_value = torch.compile(get_action_and_value), torch.compile(get_value)

    obs = torch.zeros((args.num_steps, args.num_envs, n_obs)).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs, n_actions)).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    normalizer = Normalizer(args.num_envs, n_obs, args.gamma)
    stats = EpisodeStats(args.num_envs)
    global_step, start_iteration = 0, 1
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        normalizer.load_state_dict(ckpt["normalizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        rng.bit_generator.state = ckpt["np_rng"]
        stats.returns.extend(ckpt["returns"].tolist())
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
    next_obs, _ = envs.reset()
    next_obs = torch.Tensor(normalizer.obs(next_obs)).to(device)
    next_done = torch.zeros(args.num_envs).to(device)

    def checkpoint(iteration):
        save_checkpoint(os.path.join(log_dir, "agent.pt"), dict(
            script=script, agent=agent.state_dict(), optimizer=optimizer.state_dict(),
            normalizer=normalizer.state_dict(), args=asdict(args), iteration=iteration, global_step=global_step,
            torch_rng=torch.get_rng_state(), np_rng=rng.bit_generator.state,
            returns=torch.tensor(list(stats.returns), dtype=torch.float64)))

    run = None
    if args.track:
        import wandb

        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                         name=os.path.basename(log_dir), dir=log_dir, save_code=True)
    metrics = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1)
    stop = StopFlag()
    bar = tqdm.tqdm(total=args.num_iterations * args.batch_size, initial=global_step, unit="step", dynamic_ncols=True)
    iteration, start, iter_times, measure_from, fps, forced = start_iteration - 1, time.perf_counter(), [], None, None, False
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            t_iter = time.perf_counter()
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            t_env = t_policy = 0.0
            for step in range(0, args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done

                t0 = time.perf_counter()
                with torch.no_grad():
                    action, logprob, _, value = get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob
                t1 = time.perf_counter()
                # the env gets the action clipped to its bounds (CleanRL's ClipAction); the batch keeps the sample
                next_obs, reward, next_done = env_step(envs, np.clip(action.cpu().numpy(), action_low, action_high))
                t_env += time.perf_counter() - t1
                t_policy += t1 - t0
                stats.step(reward, next_done)
                rewards[step] = torch.tensor(normalizer.reward(reward, next_done)).to(device).view(-1)
                next_obs = torch.Tensor(normalizer.obs(next_obs)).to(device)
                next_done = torch.Tensor(next_done).to(device)
            t_rollout = time.perf_counter() - t_iter

            # bootstrap value if not done
            t0 = time.perf_counter()
            with torch.no_grad():
                next_value = get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards).to(device)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal = 1.0 - next_done
                        nextvalues = next_value
                    else:
                        nextnonterminal = 1.0 - dones[t + 1]
                        nextvalues = values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                returns = advantages + values
            t_gae = time.perf_counter() - t0

            # flatten the batch
            t0 = time.perf_counter()
            b_obs = obs.reshape((-1, n_obs))
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape((-1, n_actions))
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

            # Optimizing the policy and value network
            b_inds = np.arange(args.batch_size)
            losses = []
            for epoch in range(args.update_epochs):
                rng.shuffle(b_inds)
                for start_mb in range(0, args.batch_size, args.minibatch_size):
                    mb_inds = b_inds[start_mb:start_mb + args.minibatch_size]

                    _, newlogprob, entropy, newvalue = get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()

                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                    # Policy loss
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    # Value loss
                    newvalue = newvalue.view(-1)
                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_clipped = b_values[mb_inds] + torch.clamp(
                            newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                        v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    losses.append([approx_kl.item(), clipfrac.item(), pg_loss.item(), v_loss.item(), entropy_loss.item()])

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            t_update = time.perf_counter() - t0

            # steady-state fps: whole iterations after the burn-in
            now = time.perf_counter()
            iter_times.append(now - t_iter)
            if iteration - start_iteration + 1 == args.measure_burnin:
                measure_from = (now, global_step)
            fps = None
            if measure_from and global_step > measure_from[1]:
                fps = (global_step - measure_from[1]) / (now - measure_from[0])
            row = dict(iteration=iteration, global_step=global_step, time=now - start, fps=fps,
                       episodic_return=stats.mean_return(), t_rollout=t_rollout, t_env=t_env, t_policy=t_policy,
                       t_gae=t_gae, t_update=t_update, lr=optimizer.param_groups[0]["lr"],
                       **dict(zip(("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy"), np.mean(losses, 0).tolist())))
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            bar.update(args.batch_size)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
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

    steady = iter_times[args.measure_burnin:]
    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps if measure_from else None,
                   final_return=stats.mean_return(),
                   compile_time=iter_times[0] - float(np.median(steady)) if args.compile and steady else None,
                   interrupted=stop.set)
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
