"""DQN on discrete classic control (CartPole-v1), restructured to run as fast as the hardware allows.

The algorithm, Q-network and defaults of dqn.py (CleanRL's), cut into units that torch.compile and CUDA graphs can
wrap: `act` (one epsilon-greedy step), `update` (TD step, optimizer step inside), `update_target`. At these sizes a
step costs its machinery, not its arithmetic, so the tricks remove machinery: on a CPU, the greedy action from numpy
views of the weights; exploration drawn on the device for a chunk of steps at once, one transfer per chunk; steps
staged in numpy, one copy per field into the device buffer per update; `update` gathers its batch, takes gradients
with torch.func.grad and applies torch.optim's functional Adam (one compiled graph); lr a tensor; guards skipped.

    python leanrl/dqn_torchcompile.py --compile               # CPU or GPU
    python leanrl/dqn_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the three units
"""

import contextlib
import functools
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
from types import SimpleNamespace
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm
import tyro
from tensordict import TensorDict
from tensordict.nn import CudaGraphModule
from torch.optim.adam import adam


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
    """if toggled, wrap the act, update and target units in torch.compile"""
    cudagraphs: bool = False
    """if toggled, wrap the act, update and target units in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    numpy_act: bool = True
    """if toggled, a CPU learner acts with numpy views of the Q-network's weights instead of torch (ignored on CUDA)"""
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


def act(q_network, obs):
    """The greedy action; the loop calls it only on the steps that do not explore (see draw_choices)."""
    with torch.no_grad():
        return q_network(obs).argmax(-1)


def numpy_act(q_network):
    """`act` for one obs on a CPU, from numpy views of the weights (they share the Q-network's memory: every update is
    seen). At one obs a torch forward is all per-op dispatch, ~50 us a step in the loop; numpy's three GEMVs take ~9."""
    (w1, b1), (w2, b2), (w3, b3) = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in list(q_network)[::2]]
    return lambda obs: int((w3 @ np.maximum(w2 @ np.maximum(w1 @ obs + b1, 0) + b2, 0) + b3).argmax())


def td_loss(params, q_network, obs, actions, td_target):
    q = torch.func.functional_call(q_network, params, (obs,)).gather(1, actions.unsqueeze(1)).squeeze(1)
    loss = F.mse_loss(td_target, q)
    return loss, torch.stack([loss, q.mean()]).detach()


def update(q_network, target_network, optimizer, lr, gamma: float, fields: dict, inds):
    """A TD step on the transitions at `inds`, returns [td_loss, mean Q]. Gradients from torch.func.grad, the step from
    torch.optim's functional Adam: compiled, one graph (loss.backward() and optimizer.step() would each break it)."""
    obs, next_obs, actions, rewards, dones = (fields[k][inds] for k in fields)  # the fields' order
    with torch.no_grad():
        td_target = rewards + gamma * target_network(next_obs).max(dim=1).values * (1 - dones)
    params = {name: p.detach() for name, p in q_network.named_parameters()}
    grads, stats = torch.func.grad(td_loss, has_aux=True)(params, q_network, obs, actions, td_target)
    plist = list(q_network.parameters())
    state = [optimizer.state[p] for p in plist]
    group = optimizer.param_groups[0]
    with torch.no_grad():
        adam(plist, [grads[name] for name in params], [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state],
             [], [s["step"] for s in state], foreach=False, capturable=group["capturable"], amsgrad=False,
             beta1=group["betas"][0], beta2=group["betas"][1], lr=lr, weight_decay=0.0, eps=group["eps"],
             maximize=False)
    return stats


def update_target(q_params: list, target_params: list, tau: float):
    with torch.no_grad():  # target <- tau * q + (1 - tau) * target, one foreach call (tau 1: a copy)
        torch._foreach_lerp_(target_params, q_params, tau)


def make_units(q_network, target_network, rb, args, device):
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: CUDA graphs capture it, changes need no re-trace
    optimizer = torch.optim.Adam(q_network.parameters(), lr=lr, capturable=args.cudagraphs)
    for p in q_network.parameters():  # the state `update` steps, created now rather than by a first optimizer.step()
        step = torch.zeros((), device=p.device if args.cudagraphs else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    units = dict(act=numpy_act(q_network) if args.numpy_act else functools.partial(act, q_network),
                 update=functools.partial(update, q_network, target_network, optimizer, lr, args.gamma, rb.fields),
                 update_target=functools.partial(update_target, list(q_network.parameters()),
                                                 list(target_network.parameters()), args.tau))
    u = SimpleNamespace(optimizer=optimizer, lr=lr, clock={})
    def timed_first_call(name, fn):  # then `fn` itself takes its place: later calls pay nothing for the timing
        def first(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            u.clock[name] = time.perf_counter() - t0
            setattr(u, name, fn)
            return out
        return first
    for name, fn in units.items():
        # a CPU call costs its overhead, not its arithmetic: C++ wrapper code instead of Python; on CUDA no options.
        # On a CPU `act` is not compiled: at one obs torch's took 32 us eager, 38.5 compiled (cpp_wrapper), 48 plain
        if args.compile and (name != "act" or device.type == "cuda"):
            fn = torch.compile(fn, options=dict(cpp_wrapper=True) if device.type == "cpu" else None)
        fn = CudaGraphModule(fn) if args.cudagraphs else fn
        setattr(u, name, timed_first_call(name, fn))
    return u


def draw_choices(args: Args, rng: torch.Generator, start: int, n: int, n_actions: int, device):
    """Steps start..start+n-1 drawn at once from the loop's generator, one transfer to the host: a random action where
    a uniform draw falls under the step's epsilon, else -1 (greedy). As in dqn.py, exploring runs no forward."""
    explore = torch.rand(n, generator=rng, device=device) < epsilon_schedule(args, start, n, device)
    random_actions = torch.randint(n_actions, (n,), generator=rng, device=device)
    return torch.where(explore, random_actions, -1).tolist()


def epsilon_schedule(args: Args, start: int, n: int = 1, device=None) -> torch.Tensor:
    """CleanRL's linear schedule from start_e to end_e over exploration_fraction of the run, for n steps at once."""
    steps = torch.arange(start, start + n, device=device)
    frac = (steps / (args.exploration_fraction * args.total_timesteps)).clamp(max=1.0)
    return args.start_e + frac * (args.end_e - args.start_e)


class ReplayBuffer:
    """A preallocated ring buffer on the learner's device (full: the oldest transition is overwritten). A step is
    written once, into numpy staging rows; they reach the device in one copy per field at `flush`, before updates."""

    def __init__(self, size: int, n_obs: int, device, stage: int):
        self.data = TensorDict(obs=torch.zeros(size, n_obs), next_obs=torch.zeros(size, n_obs),
                               actions=torch.zeros(size, dtype=torch.long), rewards=torch.zeros(size),
                               dones=torch.zeros(size), batch_size=[size], device=device)
        self.fields = dict(self.data.items())  # the plain tensors: what `update` gathers from
        self.staged = {k: torch.zeros((stage,) + v.shape[1:], dtype=v.dtype).numpy() for k, v in self.fields.items()}
        self.size, self.pos, self.full, self.n = size, 0, False, 0

    def __len__(self):  # the transitions written so far
        return self.size if self.full else self.pos

    def add(self, obs, next_obs, action: int, reward: float, done: float):
        for staged, x in zip(self.staged.values(), (obs, next_obs, action, reward, done)):  # the fields' order
            staged[self.n] = x
        self.n += 1
        if self.n == len(self.staged["obs"]):
            self.flush()

    def flush(self):
        n, first = self.n, min(self.n, self.size - self.pos)  # the staged rows may wrap around the end
        for key, x in self.staged.items():
            dst, src = self.fields[key], torch.from_numpy(x)
            dst[self.pos:self.pos + first].copy_(src[:first], non_blocking=True)
            dst[:n - first].copy_(src[first:n], non_blocking=True)
        self.full = self.full or self.pos + n >= self.size
        self.pos, self.n = (self.pos + n) % self.size, 0


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
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if args.cudagraphs and device.type != "cuda":
        print("--cudagraphs ignored: CUDA graphs need a CUDA device and none is in use", file=sys.stderr)
        args.cudagraphs = False
    args.numpy_act = args.numpy_act and device.type == "cpu"
    # the loop's random numbers come from its own generator: torch.compile restores the global one after compiling
    rng = torch.Generator(device).manual_seed(args.seed)

    env = make_env(args, os.path.join(log_dir, "videos"))
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.n
    q_network = QNetwork(n_obs, n_actions).to(device)
    target_network = QNetwork(n_obs, n_actions).to(device).requires_grad_(False)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, n_obs, device, stage=args.train_frequency)
    u = make_units(q_network, target_network, rb, args, device)
    ep_return, finished = 0.0, deque(maxlen=20)  # the returns of the last 20 finished episodes
    mean_return = lambda: float(np.mean(finished)) if finished else None  # noqa: E731
    global_step = 0
    if ckpt:
        q_network.load_state_dict(ckpt["q_network"])
        target_network.load_state_dict(ckpt["target_network"])
        u.optimizer.load_state_dict(ckpt["optimizer"])
        rb.data.update(TensorDict(ckpt["buffer"], batch_size=[args.buffer_size]).to(device))
        rb.pos, rb.full = ckpt["buffer_pos"], ckpt["buffer_full"]
        rng.set_state(ckpt["rng"])
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
    if args.compile:
        print("--compile: the act, update and target units compile on their first call (a minute or more on a cold "
              "cache; later runs load them from Inductor's on-disk cache)", file=sys.stderr)
    bar = tqdm.tqdm(total=args.total_timesteps, initial=global_step, unit="step", dynamic_ncols=True,
                    desc="compiling units" if args.compile else None)
    start, measure_from, fps, forced = time.perf_counter(), None, None, False
    t_env = t_policy = t_update = 0.0
    stats = torch.zeros(args.log_every // args.train_frequency + 1, 2, device=device)
    start_step, n_updates, choices, k = global_step, 0, (), 0
    try:
        while global_step < args.total_timesteps:
            t0 = time.perf_counter()
            if k == len(choices):  # the exploration of the next chunk of steps, up to the next log line
                n = min(args.log_every - global_step % args.log_every, args.total_timesteps - global_step)
                choices, k = draw_choices(args, rng, global_step, n, n_actions, device), 0
            action, k = choices[k], k + 1
            if action < 0:
                action = u.act(obs) if args.numpy_act else u.act(torch.from_numpy(obs).to(device)).item()
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            t_env += time.perf_counter() - t1
            t_policy += t1 - t0
            ep_return += reward
            if terminated or truncated:
                finished.append(ep_return)
                ep_return = 0.0
            # the transition keeps the true last obs: a truncated episode still bootstraps from it (CleanRL's rule)
            rb.add(obs, next_obs, action, reward, float(terminated))
            obs = env.reset()[0] if terminated or truncated else next_obs

            t0 = time.perf_counter()
            if global_step > args.learning_starts:
                if global_step % args.train_frequency == 0:
                    rb.flush()
                    inds = torch.randint(len(rb), (args.batch_size,), generator=rng, device=device)
                    stats[n_updates] = u.update(inds)
                    n_updates += 1
                if global_step % args.target_network_frequency == 0:
                    u.update_target()
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
            td, qv = stats[:n_updates].mean(0).tolist() if n_updates else (None, None)  # the chunk's one host sync
            row = dict(iteration=global_step // args.log_every, global_step=global_step, time=now - start, fps=fps,
                       episodic_return=mean_return(),
                       epsilon=epsilon_schedule(args, global_step - 1).item(),
                       t_env=t_env, t_policy=t_policy, t_update=t_update, td_loss=td, q_values=qv,
                       compiled=len(u.clock) == 3 if args.compile else None)
            metrics.write(json.dumps(row) + "\n")
            if run:
                run.log(row, step=global_step)
            if args.compile and len(u.clock) == 3 and bar.desc:
                # every unit has compiled and nothing its guards check can change any more: stop checking them
                torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
                bar.set_description_str("")
            bar.update(global_step - bar.n)
            bar.set_postfix(fps=f"{fps or 0:.0f}", ret=f"{row['episodic_return'] or 0:.1f}", refresh=False)
            t_env = t_policy = t_update = 0.0
            n_updates = 0
            stop.logged = True
            if stop.set:
                break
    except KeyboardInterrupt:  # the second Ctrl-C: stop mid-chunk, with no consistent state to save
        stop.set = forced = True
    finally:
        torch.compiler.set_stance("default")
        bar.close()
        metrics.close()
        env.close()
    if args.save_model and not forced and global_step > start_step:
        rb.flush()
        path = os.path.join(log_dir, "agent.pt")
        torch.save(dict(script=script, q_network=q_network.state_dict(), target_network=target_network.state_dict(),
                        optimizer=u.optimizer.state_dict(), buffer=rb.data.to_dict(), buffer_pos=rb.pos,
                        buffer_full=rb.full, args=asdict(args), global_step=global_step, rng=rng.get_state(),
                        finished=torch.tensor(list(finished), dtype=torch.float64)), path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write never leaves a truncated agent.pt

    summary = dict(script=script, env_id=args.env_id, seed=args.seed, flags=asdict(args), **machine_info(device),
                   num_threads=torch.get_num_threads(), total_timesteps=args.total_timesteps, global_step=global_step,
                   wall_time=time.perf_counter() - start, fps=fps, final_return=mean_return(),
                   compile_time=sum(u.clock.values()) if args.compile else None,
                   compile_times=u.clock if args.compile else None, interrupted=stop.set)
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
