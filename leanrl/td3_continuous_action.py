"""TD3 for continuous control (MuJoCo through envpool, HalfCheetah-v4): the eager baseline.

CleanRL's `td3_continuous_action.py` algorithm, networks and defaults, written plainly: twin Q-networks and their
targets, a deterministic tanh actor with Gaussian exploration noise, target policy smoothing (clipped noise on the
target action), delayed actor and target updates, one env, one critic update per env step after `learning_starts`,
autograd and torch.optim step by step. The replay buffer is a preallocated TensorDict on the learner's device,
sampled there with the loop's own generator. No observation or reward normalization (CleanRL's TD3 has none).
It is the yardstick `td3_continuous_action_torchcompile.py` is measured against.

    python leanrl/td3_continuous_action.py              # 1M steps of HalfCheetah-v4
    python leanrl/td3_continuous_action.py --compile    # the same code with nn.Module.compile() on the networks
"""

import contextlib
import io
import json
import math
import os
import platform
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Optional

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro
from tensordict import TensorDict


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
    num_envs: int = 1
    """the number of parallel game environments (TD3 here steps one env, as CleanRL's does)"""
    buffer_size: int = int(1e6)
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer (actor and critics)"""
    exploration_noise: float = 0.1
    """the scale of exploration noise (a fraction of the action range's half-width)"""
    learning_starts: int = int(25e3)
    """timestep to start learning (random actions until then)"""
    policy_frequency: int = 2
    """the frequency of training policy (delayed): one actor and target update every this many critic updates"""
    noise_clip: float = 0.5
    """noise clip parameter of the Target Policy Smoothing Regularization"""
    policy_noise: float = 0.2
    """the scale of policy noise"""

    compile: bool = False
    """if toggled, nn.Module.compile() the three networks (the naive one-liner; see the _torchcompile script)"""
    cudagraphs: bool = False
    """CUDA graphs need the units of td3_continuous_action_torchcompile.py; ignored without CUDA"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per metrics.jsonl row"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save networks and optimizers to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run (the buffer refills, see load_checkpoint)"""
    num_threads: int = 1
    """torch intra-op threads (1, as in the PPO scripts: the env and the loop keep the other core)"""


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
    rules = [(("total_timesteps", "buffer_size", "batch_size", "policy_frequency", "log_every", "num_threads",
               "learning_rate"), lambda x: 0 < x < math.inf, "positive and finite"),
             (("learning_starts", "measure_burnin", "exploration_noise", "noise_clip", "policy_noise"),
              lambda x: 0 <= x < math.inf, ">= 0 and finite"),
             (("seed",), lambda x: 0 <= x < 2**31, "in [0, 2**31) (envpool's seeds are int32)"),
             (("gamma", "tau"), lambda x: 0 < x <= 1, "in (0, 1]"),
             (("num_envs",), lambda x: x == 1, "1 (one env, one update per step, as CleanRL's TD3)"),
             (("capture_video",), lambda x: not x, "off (envpool renders no frames)")]
    for names, ok, what in rules:
        for name in names:
            if not ok(getattr(args, name)):  # `not ok`: a NaN fails every rule
                fail(f"--{name.replace('_', '-')} must be {what}, got {getattr(args, name)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} leaves no update in --total-timesteps {args.total_timesteps}")
    family = envpool.registration.registry.specs.get(args.env_id, ("",))[0]
    if family != "envpool.mujoco.gym":
        kind = ("an Atari game (discrete actions: leanrl/ppo_atari_envpool.py)" if "atari" in family else
                "a classic-control task (discrete ones: leanrl/ppo.py)" if "classic_control" in family else
                "not a Gymnasium-style MuJoCo task" if "mujoco" in family else "unknown")
        fail(f"--env-id {args.env_id!r} is {kind}; TD3 here takes envpool MuJoCo ids such as HalfCheetah-v4")
    ckpt = load_checkpoint(args) if args.resume else None  # another script's or env's checkpoint is refused now
    with contextlib.suppress(OSError):  # the last check: a bad flag never creates a folder
        os.makedirs(args.log_dir or ".", exist_ok=True)
    if not (os.path.isdir(args.log_dir or ".") and os.access(args.log_dir or ".", os.W_OK)):
        fail(f"--log-dir {args.log_dir} cannot be created or written")
    return ckpt


class ReplayBuffer:
    """A ring buffer of transitions, preallocated on the learner's device as one TensorDict: one write per env step,
    batches drawn on the device from the transitions written so far, with the caller's torch.Generator."""

    def __init__(self, size: int, n_obs: int, n_actions: int, device):
        self.data = TensorDict(obs=torch.zeros(size, n_obs), next_obs=torch.zeros(size, n_obs),
                               actions=torch.zeros(size, n_actions), rewards=torch.zeros(size),
                               terminations=torch.zeros(size), batch_size=[size], device=device)
        self.size, self.pos, self.filled = size, 0, 0

    def add(self, obs, next_obs, actions, rewards, terminations):
        self.data[self.pos] = TensorDict(obs=obs, next_obs=next_obs, actions=actions, rewards=rewards,
                                         terminations=terminations).to(self.data.device)
        self.pos = (self.pos + 1) % self.size
        self.filled = min(self.filled + 1, self.size)

    def sample(self, batch_size: int, rng: torch.Generator):
        return self.data[torch.randint(self.filled, (batch_size,), device=self.data.device, generator=rng)]


# CleanRL's networks: 256-unit MLPs with PyTorch's default init
class QNetwork(nn.Sequential):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__(nn.Linear(n_obs + n_actions, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 1))

    def forward(self, x, a):
        return super().forward(torch.cat([x, a], 1))


LOSSES = ("qf1_loss", "qf2_loss", "qf1_values", "actor_loss")  # logged, once there are any


class Actor(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, n_actions)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return dict(device=str(device), torch=torch.__version__, cpu=f"{cpu} ({os.cpu_count()} cores)", gpu=gpu)


class StopFlag:
    """Ctrl-C (or SIGTERM): stop after the current chunk of log_every steps; before the first, or again: at once."""

    def __init__(self):
        self.set, self.logged = False, False
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum, frame):
        if self.set or not self.logged:
            os._exit(130)
        self.set = True
        print("\nstopping after this chunk (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr)


def load_checkpoint(args: Args) -> dict:
    """Networks, targets, optimizers, RNGs and the step; not the buffer (~170 MB at 1M): a resumed run acts with the
    restored policy until it holds learning_starts transitions again. Episodes restart (with a fresh seed)."""
    if not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        written_by = ckpt["script"]
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if written_by != os.path.basename(__file__)[: -len(".py")]:
        fail(f"--resume {args.resume} was written by {written_by}.py; resume it with that script")
    if ckpt["args"]["env_id"] != args.env_id:
        fail(f"--resume {args.resume} was trained with --env-id {ckpt['args']['env_id']}; pass the same")
    return ckpt


def main(args: Args):
    ckpt = check_args(args)
    script = os.path.basename(__file__)[: -len(".py")]
    log_dir = args.log_dir or f"runs/{args.env_id}__{script}__{args.seed}__{int(time.time())}"
    os.makedirs(log_dir, exist_ok=True)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
    elif args.cudagraphs:
        fail("td3_continuous_action.py is the eager baseline; --cudagraphs needs the units of "
             "leanrl/td3_continuous_action_torchcompile.py")

    global_step = ckpt["global_step"] if ckpt else 0
    env = envpool.make(args.env_id, env_type="gymnasium", num_envs=1, seed=args.seed + global_step)
    rng = torch.Generator(device).manual_seed(args.seed)  # the buffer's sampling
    np_rng = np.random.default_rng(args.seed)  # the random actions before learning_starts
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    env_low, env_high = (torch.tensor(b, dtype=torch.float32, device=device) for b in (low, high))
    actor = Actor(n_obs, n_actions, low, high).to(device)
    qf1, qf2 = QNetwork(n_obs, n_actions).to(device), QNetwork(n_obs, n_actions).to(device)
    target_actor = Actor(n_obs, n_actions, low, high).to(device)
    qf1_target, qf2_target = QNetwork(n_obs, n_actions).to(device), QNetwork(n_obs, n_actions).to(device)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.learning_rate)
    actor_optimizer = torch.optim.Adam(list(actor.parameters()), lr=args.learning_rate)
    nets = dict(actor=actor, qf1=qf1, qf2=qf2, target_actor=target_actor, qf1_target=qf1_target, qf2_target=qf2_target)
    if args.compile:
        for net in nets.values():
            net.compile()
    if ckpt:
        for name, obj in dict(nets, q_optimizer=q_optimizer, actor_optimizer=actor_optimizer).items():
            obj.load_state_dict(ckpt[name])
        rng.set_state(ckpt["rng"])
        torch.set_rng_state(ckpt["torch_rng"])
        np_rng.bit_generator.state = ckpt["np_rng"]
    rb = ReplayBuffer(args.buffer_size, n_obs, n_actions, device)
    ep_return, finished = 0.0, deque(ckpt["returns"].tolist() if ckpt else [], maxlen=20)  # the last 20 returns
    mean_return = lambda: float(np.mean(finished)) if finished else None  # noqa: E731

    run = None
    if args.track:
        import wandb
        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                         name=os.path.basename(log_dir), dir=log_dir, save_code=True)
    metrics = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1)
    stop = StopFlag()
    bar = tqdm.tqdm(total=args.total_timesteps, initial=global_step, unit="step", dynamic_ncols=True)
    start, measure_from, fps, forced, first_update = time.perf_counter(), None, None, False, None
    losses = {}
    t_env = t_policy = t_update = 0.0
    obs, _ = env.reset()
    try:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            if global_step < args.learning_starts:  # a fresh run explores uniformly first; a resumed one acts
                actions = np_rng.uniform(low, high, size=(1, n_actions)).astype(np.float32)
            else:
                with torch.no_grad():
                    actions = actor(torch.Tensor(obs).to(device))
                    actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(low, high)
            t1 = time.perf_counter()
            real_next_obs, rewards, terminations, truncations, _ = env.step(actions)
            next_obs = real_next_obs  # the buffer gets the real last obs, the loop the next episode's first
            ep_return += float(rewards[0])
            if terminations[0] or truncations[0]:  # reset now: envpool would spend the next step on it
                next_obs = env.reset()[0]
                finished.append(ep_return)
                ep_return = 0.0
            t2 = time.perf_counter()
            rb.add(torch.Tensor(obs[0]), torch.Tensor(real_next_obs[0]), torch.Tensor(actions[0]),
                   torch.tensor(rewards[0], dtype=torch.float32), torch.tensor(terminations[0], dtype=torch.float32))
            obs = next_obs
            global_step += 1
            t_env += t2 - t1
            t_policy += t1 - t0

            if rb.filled > args.learning_starts:
                first_update = first_update or global_step
                data = rb.sample(args.batch_size, rng)
                with torch.no_grad():
                    clipped_noise = (torch.randn_like(data["actions"]) * args.policy_noise).clamp(
                        -args.noise_clip, args.noise_clip) * target_actor.action_scale
                    next_state_actions = (target_actor(data["next_obs"]) + clipped_noise).clamp(
                        env_low, env_high)  # elementwise (CleanRL: the first bound, the same on MuJoCo)
                    qf1_next_target = qf1_target(data["next_obs"], next_state_actions)
                    qf2_next_target = qf2_target(data["next_obs"], next_state_actions)
                    min_qf_next_target = torch.min(qf1_next_target, qf2_next_target)
                    next_q_value = data["rewards"] + (1 - data["terminations"]) * args.gamma * min_qf_next_target.view(-1)

                qf1_a_values = qf1(data["obs"], data["actions"]).view(-1)
                qf2_a_values = qf2(data["obs"], data["actions"]).view(-1)
                qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
                qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
                qf_loss = qf1_loss + qf2_loss
                q_optimizer.zero_grad()
                qf_loss.backward()
                q_optimizer.step()
                losses.update(qf1_loss=qf1_loss, qf2_loss=qf2_loss, qf1_values=qf1_a_values.mean())

                if global_step % args.policy_frequency == 0:  # delayed: the actor and the targets move less often
                    actor_loss = -qf1(data["obs"], actor(data["obs"])).mean()
                    actor_optimizer.zero_grad()
                    actor_loss.backward()
                    actor_optimizer.step()
                    losses.update(actor_loss=actor_loss)
                    with torch.no_grad():
                        for net, target in ((actor, target_actor), (qf1, qf1_target), (qf2, qf2_target)):
                            for param, target_param in zip(net.parameters(), target.parameters()):
                                target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                t_update += time.perf_counter() - t2

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            # steady-state fps: env steps after learning_starts plus the burn-in
            now = time.perf_counter()
            if measure_from is None and first_update and global_step - first_update >= args.measure_burnin:
                measure_from = (now, global_step)
            if measure_from and global_step > measure_from[1]:
                fps = (global_step - measure_from[1]) / (now - measure_from[0])
            row = dict(global_step=global_step, time=now - start, fps=fps, episodic_return=mean_return(),
                       t_env=t_env, t_policy=t_policy, t_update=t_update, buffer=rb.filled,
                       **{k: losses[k].item() if k in losses else None for k in LOSSES})
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            stop.logged = True
            t_env = t_policy = t_update = 0.0
            bar.update(global_step - bar.n)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            if stop.set:
                break
    except KeyboardInterrupt:  # stop mid-chunk, with no consistent state to save
        stop.set = forced = True
    finally:
        bar.close()
        metrics.close()
        env.close()
    if args.save_model and not forced:
        path = os.path.join(log_dir, "agent.pt")
        torch.save(dict(
            script=script, args=asdict(args), global_step=global_step, **{k: v.state_dict() for k, v in nets.items()},
            q_optimizer=q_optimizer.state_dict(), actor_optimizer=actor_optimizer.state_dict(), rng=rng.get_state(),
            torch_rng=torch.get_rng_state(), np_rng=np_rng.bit_generator.state,
            returns=torch.tensor(list(finished), dtype=torch.float64)), path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write never leaves a truncated agent.pt

    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps, final_return=mean_return(),
                   compile_time=None, interrupted=stop.set)
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
