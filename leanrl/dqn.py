"""DQN on discrete classic control (CartPole-v1): the eager baseline.

CleanRL's `dqn.py` algorithm, Q-network and defaults, written plainly: one env, epsilon-greedy acting decided on
the host, a replay buffer written one transition at a time, one autograd step per update. It is the yardstick
dqn_torchcompile.py is measured against.

    python leanrl/dqn.py                      # 500k steps of CartPole-v1
    python leanrl/dqn.py --compile            # the same code under a naive torch.compile of the Q-network
"""

import contextlib
import importlib.util
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

import gymnasium as gym
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
    """whether to capture videos of the agent performances (into `<log_dir>/videos`; needs pygame and moviepy)"""

    env_id: str = "CartPole-v1"
    """the id of the environment (discrete-action classic control)"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (DQN here steps one, as CleanRL's does)"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 500
    """the timesteps it takes to update the target network"""
    batch_size: int = 128
    """the batch size of sample from the reply memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 10000
    """timestep to start learning"""
    train_frequency: int = 10
    """the frequency of training"""

    compile: bool = False
    """if toggled, wrap the Q-network in torch.compile (the naive one-liner; see dqn_torchcompile.py)"""
    cudagraphs: bool = False
    """CUDA graphs need the act/update/target units of dqn_torchcompile.py; ignored here without CUDA"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per line of metrics.jsonl"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the networks, optimizer and replay buffer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped"""
    num_threads: int = 1
    """torch intra-op threads (1 measures fastest for these small layers)"""


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
    spec = gym.registry.get(env_id)
    if spec is not None and "classic_control" in str(spec.entry_point):
        if isinstance(gym.make(env_id).action_space, gym.spaces.Discrete):
            return
        fail(f"--env-id {env_id} has continuous actions; DQN needs discrete actions (e.g. CartPole-v1)")
    import envpool.registration  # knows the Atari and MuJoCo ids, to point at the right script

    family = envpool.registration.registry.specs.get(env_id, ("",))[0]
    if "atari" in family:
        fail(f"--env-id {env_id} is an Atari game; use leanrl/dqn_atari_envpool.py")
    if spec is not None and "mujoco" in str(spec.entry_point) or "mujoco" in family:
        fail(f"--env-id {env_id} is a MuJoCo task (continuous actions); DQN needs discrete actions, e.g. CartPole-v1")
    known = [k for k, s in gym.registry.items() if "classic_control" in str(s.entry_point)]
    fail(f"--env-id {env_id!r}: unknown env id; discrete classic-control ids: {', '.join(sorted(known))}")


def check_args(args: Args) -> Optional[dict]:
    rules = [(("total_timesteps", "learning_rate", "buffer_size", "target_network_frequency", "batch_size",
               "train_frequency", "log_every", "num_threads"), lambda x: 0 < x < math.inf, "positive and finite"),
             (("seed",), lambda x: 0 <= x < 2**31, "in [0, 2**31)"),
             (("learning_starts", "measure_burnin"), lambda x: x >= 0, ">= 0"),
             (("gamma", "tau", "exploration_fraction"), lambda x: 0 < x <= 1, "in (0, 1]"),
             (("start_e", "end_e"), lambda x: 0 <= x <= 1, "a probability, in [0, 1]"),
             (("num_envs",), lambda x: x == 1, "1 (this DQN steps one env, as CleanRL's does)")]
    for names, ok, what in rules:
        for name in names:
            if not ok(getattr(args, name)):  # `not ok`: a NaN fails every rule
                fail(f"--{name.replace('_', '-')} must be {what}, got {getattr(args, name)}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}")
    if args.end_e > args.start_e:
        fail(f"--end-e {args.end_e} must not exceed --start-e {args.start_e}: epsilon anneals down")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} must be less than --total-timesteps {args.total_timesteps}")
    ckpt = load_checkpoint(args) if args.resume else None  # another script's or run's checkpoint is refused now
    if args.log_dir is not None:
        with contextlib.suppress(OSError):
            os.makedirs(args.log_dir, exist_ok=True)
        if not os.access(args.log_dir, os.W_OK | os.X_OK):  # also when it could not be made
            fail(f"--log-dir {args.log_dir}: cannot create or write that folder")
    check_env_id(args.env_id)
    if args.capture_video and not all(importlib.util.find_spec(m) for m in ("moviepy", "pygame")):
        fail("--capture-video needs pygame and moviepy: pip install pygame moviepy")
    return ckpt


def make_env(args: Args, video_dir: str):
    # One plain env, reset by hand: 112k steps/s here, against 71k for gymnasium's SyncVectorEnv of one and 23k for
    # envpool (its per-call overhead dominates at one CartPole).
    if args.capture_video:
        return gym.wrappers.RecordVideo(gym.make(args.env_id, render_mode="rgb_array"), video_dir)
    return gym.make(args.env_id)


class QNetwork(nn.Sequential):
    """CleanRL's Q-network: a 120-84 MLP with one output per action."""

    def __init__(self, n_obs: int, n_actions: int):
        super().__init__(nn.Linear(n_obs, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions))


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e) if end_e <= start_e else min(slope * t + start_e, end_e)


class ReplayBuffer:
    """A preallocated ring buffer on the learner's device: the oldest transition is overwritten when it is full."""

    def __init__(self, size: int, n_obs: int, device):
        self.data = TensorDict(obs=torch.zeros(size, n_obs), next_obs=torch.zeros(size, n_obs),
                               actions=torch.zeros(size, dtype=torch.long), rewards=torch.zeros(size),
                               dones=torch.zeros(size), batch_size=[size], device=device)
        self.size, self.pos, self.full = size, 0, False

    def __len__(self):
        return self.size if self.full else self.pos

    def add(self, transition: TensorDict):
        self.data[self.pos] = transition
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch_size: int, generator=None) -> TensorDict:
        return self.data[torch.randint(len(self), (batch_size,), device=self.data.device, generator=generator)]



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
        if not self.logged:
            os._exit(130)
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        print("\nstopping after this chunk (Ctrl-C again: stop now, no checkpoint)", file=sys.stderr)


def load_checkpoint(args: Args) -> dict:
    """Networks, optimizer, replay buffer (10k CartPole transitions are 0.4 MB: saved whole), RNGs and the step.
    The env itself restarts with a fresh seed: the episode in flight is lost."""
    if not os.path.isfile(args.resume):
        fail(f"--resume {args.resume}: no such file")
    try:
        ckpt = torch.load(args.resume, weights_only=True, map_location="cpu")
        written_by, trained = ckpt["script"], ckpt["args"]
    except Exception as e:  # a corrupt or foreign file is a user mistake, not a crash
        fail(f"--resume {args.resume}: not a checkpoint this script wrote ({type(e).__name__})")
    if written_by != os.path.basename(__file__)[: -len(".py")]:
        fail(f"--resume {args.resume} was written by {written_by}.py; resume it with leanrl/{written_by}.py")
    for key in ("env_id", "buffer_size"):
        if trained[key] != getattr(args, key):
            fail(f"--resume {args.resume} was trained with --{key.replace('_', '-')} {trained[key]}; pass the same")
    return ckpt


def main(args: Args):
    ckpt = check_args(args)
    script = os.path.basename(__file__)[: -len(".py")]
    log_dir = args.log_dir or f"runs/{args.env_id.replace('/', '-')}__{script}__{args.seed}__{int(time.time())}"
    os.makedirs(log_dir, exist_ok=True)

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.num_threads)
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
    elif args.cudagraphs:
        fail("dqn.py is the eager baseline; --cudagraphs needs the units of leanrl/dqn_torchcompile.py")

    env = make_env(args, os.path.join(log_dir, "videos"))
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.n
    q_network = QNetwork(n_obs, n_actions).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(n_obs, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    q_forward, target_forward = q_network, target_network
    if args.compile:
        q_forward, target_forward = torch.compile(q_network), torch.compile(target_network)
    rb = ReplayBuffer(args.buffer_size, n_obs, device)
    ep_return, finished = 0.0, deque(maxlen=20)  # the returns of the last 20 finished episodes
    mean_return = lambda: float(np.mean(finished)) if finished else None  # noqa: E731
    global_step = 0
    if ckpt:
        q_network.load_state_dict(ckpt["q_network"])
        target_network.load_state_dict(ckpt["target_network"])
        optimizer.load_state_dict(ckpt["optimizer"])
        rb.data.update(TensorDict(ckpt["buffer"], batch_size=[args.buffer_size]).to(device))
        rb.pos, rb.full = ckpt["buffer_pos"], ckpt["buffer_full"]
        torch.set_rng_state(ckpt["torch_rng"])
        rng.bit_generator.state = ckpt["np_rng"]
        finished.extend(ckpt["finished"].tolist())
        global_step = ckpt["global_step"]
    obs, _ = env.reset(seed=args.seed + global_step)

    run = None
    if args.track:
        import wandb
        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args),
                         name=os.path.basename(log_dir), dir=log_dir, save_code=True)
    metrics = open(os.path.join(log_dir, "metrics.jsonl"), "a", buffering=1)
    stop = StopFlag()
    bar = tqdm.tqdm(total=args.total_timesteps, initial=global_step, unit="step", dynamic_ncols=True)
    start, measure_from, fps, forced, first_update = time.perf_counter(), None, None, False, None
    t_env = t_policy = t_update = 0.0
    losses, q_values = [], []
    start_step = global_step
    try:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                                      global_step)
            if rng.random() < epsilon:
                action = int(rng.integers(n_actions))
            else:
                with torch.no_grad():
                    action = int(q_forward(torch.as_tensor(obs, device=device)).argmax().item())
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            t_env += time.perf_counter() - t1
            t_policy += t1 - t0
            ep_return += reward
            if terminated or truncated:
                finished.append(ep_return)
                ep_return = 0.0
            # the transition keeps the true last obs: a truncated episode still bootstraps from it (CleanRL's rule)
            rb.add(TensorDict(obs=torch.as_tensor(obs), next_obs=torch.as_tensor(next_obs), actions=torch.tensor(action),
                              rewards=torch.tensor(reward, dtype=torch.float32),
                              dones=torch.tensor(float(terminated)), device=device))
            obs = env.reset()[0] if terminated or truncated else next_obs

            t0 = time.perf_counter()
            if global_step > args.learning_starts:
                if global_step % args.train_frequency == 0:
                    data = rb.sample(args.batch_size)
                    with torch.no_grad():
                        target_max, _ = target_forward(data["next_obs"]).max(dim=1)
                        td_target = data["rewards"] + args.gamma * target_max * (1 - data["dones"])
                    old_val = q_forward(data["obs"]).gather(1, data["actions"].unsqueeze(1)).squeeze(1)
                    loss = F.mse_loss(td_target, old_val)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.item())
                    q_values.append(old_val.mean().item())
                    first_update = first_update or time.perf_counter() - t0
                if global_step % args.target_network_frequency == 0:
                    for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)
            t_update += time.perf_counter() - t0
            global_step += 1

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            # steady-state fps: whole chunks after learning_starts plus the burn-in
            now = time.perf_counter()
            if measure_from is None and global_step >= max(args.learning_starts + args.measure_burnin, start_step + 1):
                measure_from = (now, global_step)
            elif measure_from:
                fps = (global_step - measure_from[1]) / (now - measure_from[0])
            row = dict(iteration=global_step // args.log_every, global_step=global_step, time=now - start, fps=fps,
                       episodic_return=mean_return(), epsilon=epsilon, t_env=t_env, t_policy=t_policy,
                       t_update=t_update, td_loss=float(np.mean(losses)) if losses else None,
                       q_values=float(np.mean(q_values)) if q_values else None)
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            bar.update(global_step - bar.n)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            t_env = t_policy = t_update = 0.0
            losses, q_values = [], []
            stop.logged = True
            if stop.set:
                break
    except KeyboardInterrupt:  # the second Ctrl-C: stop mid-chunk, with no consistent state to save
        stop.set = forced = True
    finally:
        bar.close()
        metrics.close()
        env.close()
    if args.save_model and not forced and global_step > start_step:
        path = os.path.join(log_dir, "agent.pt")
        torch.save(dict(
            script=script, q_network=q_network.state_dict(), target_network=target_network.state_dict(),
            optimizer=optimizer.state_dict(), buffer=rb.data.to_dict(), buffer_pos=rb.pos,
            buffer_full=rb.full, args=asdict(args), global_step=global_step,
            torch_rng=torch.get_rng_state(), np_rng=rng.bit_generator.state,
            finished=torch.tensor(list(finished), dtype=torch.float64)), path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write never leaves a truncated agent.pt

    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps, final_return=mean_return(),
                   compile_time=first_update if args.compile else None, interrupted=stop.set)
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
