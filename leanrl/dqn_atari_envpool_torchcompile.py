"""DQN on Atari through envpool (Breakout-v5), restructured to run as fast as the hardware allows.

The algorithm, Nature CNN and defaults of dqn_atari_envpool.py (CleanRL's), cut into units that torch.compile and
CUDA graphs can wrap: `act` (greedy action), `update` (TD step, optimizer step inside), `update_target`. Exploration
is drawn on the device per chunk of steps (`draw_choices`); transitions are staged in numpy, one copy per field per
update; `update` rebuilds the frame stacks on the device and is one compiled graph (torch.func.grad, functional Adam).

    python leanrl/dqn_atari_envpool_torchcompile.py --compile               # CPU or GPU (the buffer takes 7.1 GB)
    python leanrl/dqn_atari_envpool_torchcompile.py --compile --cudagraphs  # GPU: CUDA graphs around the units
"""

import contextlib
import functools
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

import envpool
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
    """not supported with envpool (it renders no frames); the flag is accepted so every script takes it"""

    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (DQN here steps one, as CleanRL's does)"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions, one 84x84 frame each: 7.1 GB at 1M)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate"""
    target_network_frequency: int = 1000
    """the timesteps it takes to update the target network"""
    batch_size: int = 32
    """the batch size of sample from the reply memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 80000
    """timestep to start learning (after --resume: steps of acting that refill the buffer first)"""
    train_frequency: int = 4
    """the frequency of training"""

    compile: bool = False
    """if toggled, wrap the act, update and target units in torch.compile"""
    cudagraphs: bool = False
    """if toggled, wrap the act, update and target units in CUDA graphs (tensordict's CudaGraphModule; CUDA only)"""
    measure_burnin: int = 1000
    """env steps after learning_starts left out of the steady-state fps (compilation and warm-up happen there)"""
    log_every: int = 1000
    """env steps per line of metrics.jsonl"""
    log_dir: Optional[str] = None
    """where metrics.jsonl, summary.json and agent.pt go (default: runs/<env_id>__<script>__<seed>__<time>)"""
    save_model: bool = False
    """if toggled, save the networks and optimizer to `<log_dir>/agent.pt` at the end (and on Ctrl-C)"""
    resume: Optional[str] = None
    """path of an agent.pt written by --save-model: continue that run from where it stopped"""
    num_threads: int = 1
    """torch intra-op threads (1: on a busy 2-core CPU, 2 threads made the batch-1 acting forward 30x slower)"""


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
        fail(f"--env-id {env_id} is a classic-control task; use leanrl/dqn.py")
    if "mujoco" in family:
        fail(f"--env-id {env_id} is a MuJoCo task (continuous actions); DQN needs discrete actions, e.g. Breakout-v5")
    fail(f"--env-id {env_id!r}: unknown env id; this script takes envpool Atari ids such as Breakout-v5 or Pong-v5")


def check_args(args: Args) -> Optional[dict]:
    rules = [(("total_timesteps", "learning_rate", "buffer_size", "target_network_frequency", "batch_size",
               "train_frequency", "log_every", "num_threads"), lambda x: 0 < x < math.inf, "positive and finite"),
             (("seed",), lambda x: 0 <= x < 2**31, "in [0, 2**31)"),
             (("learning_starts", "measure_burnin"), lambda x: x >= 0, ">= 0"),
             (("gamma", "tau", "exploration_fraction"), lambda x: 0 < x <= 1, "in (0, 1]"),
             (("start_e", "end_e"), lambda x: 0 <= x <= 1, "a probability, in [0, 1]"),
             (("num_envs",), lambda x: x == 1, "1 (this DQN steps one env, as CleanRL's does)"),
             (("capture_video",), lambda x: not x, "off (envpool renders no frames)")]
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
    return ckpt


def make_env(args: Args, seed: int):
    # CleanRL's settings, as in our PPO Atari scripts: 84x84 grey, 4 stacked, frameskip 4, a life is an episode,
    # reward sign
    return envpool.make(args.env_id, env_type="gym", num_envs=1, episodic_life=True, reward_clip=True, seed=seed)


class QNetwork(nn.Sequential):
    """The Nature CNN: uint8 frames in (scaled to [0, 1] here), one Q-value per action out."""

    def __init__(self, n_actions: int):
        super().__init__(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
                         nn.Linear(512, n_actions))

    def forward(self, x):
        return super().forward(x / 255.0)


def act(q_network, obs):
    """The greedy action; the loop calls it only on the steps that do not explore (see draw_choices)."""
    with torch.no_grad():
        return q_network(obs).argmax(-1)


def td_loss(params, q_network, obs, actions, td_target):
    q = torch.func.functional_call(q_network, params, (obs,)).gather(1, actions.unsqueeze(1)).squeeze(1)
    loss = F.mse_loss(td_target, q)
    return loss, torch.stack([loss, q.mean()]).detach()


def stacks(fields: dict, inds):
    """The 4-frame stacks of slots `inds` (see dqn_atari_envpool.py's ReplayBuffer), gathered on the device."""
    back = torch.minimum(torch.arange(3, -1, -1, device=inds.device), fields["age"][inds].unsqueeze(1))
    return fields["frames"][(inds.unsqueeze(1) - back) % fields["frames"].shape[0]]


def update(q_network, target_network, optimizer, lr, gamma: float, fields: dict, inds):
    """A TD step on the transitions at `inds`, returns [td_loss, mean Q]. Gradients from torch.func.grad, the step from
    torch.optim's functional Adam: compiled, one graph (loss.backward() and optimizer.step() would each break it)."""
    obs, next_obs = stacks(fields, inds), stacks(fields, (inds + 1) % fields["frames"].shape[0])
    actions, rewards, dones = fields["actions"][inds], fields["rewards"][inds], fields["dones"][inds]
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
    """Optimizer, lr and the units the loop calls (compiled, in CUDA graphs); a first call is timed into `clock`."""
    lr = torch.tensor(args.learning_rate, device=device)  # a tensor: CUDA graphs capture it, changes need no re-trace
    optimizer = torch.optim.Adam(q_network.parameters(), lr=lr, capturable=args.cudagraphs)
    for p in q_network.parameters():  # the state `update` steps, created now rather than by a first optimizer.step()
        step = torch.zeros((), device=p.device if args.cudagraphs else "cpu")
        optimizer.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    units = dict(act=functools.partial(act, q_network),
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
        if args.compile:
            fn = torch.compile(fn)  # the convolutions dominate: no options (max_autotune would tune for minutes)
        if args.cudagraphs:
            fn = CudaGraphModule(fn)
        setattr(u, name, timed_first_call(name, fn))
    return u


def draw_choices(args: Args, rng: torch.Generator, start: int, n: int, n_actions: int, device):
    """Steps start..start+n-1 in one draw and one transfer: a random action where they explore, -1 where greedy."""
    explore = torch.rand(n, generator=rng, device=device) < epsilon_schedule(args, start, n, device)
    random_actions = torch.randint(n_actions, (n,), generator=rng, device=device)
    return torch.where(explore, random_actions, -1).tolist()


def epsilon_schedule(args: Args, start: int, n: int = 1, device=None) -> torch.Tensor:
    """CleanRL's linear schedule from start_e to end_e over exploration_fraction of the run, for n steps at once."""
    steps = torch.arange(start, start + n, device=device)
    frac = (steps / (args.exploration_fraction * args.total_timesteps)).clamp(max=1.0)
    return args.start_e + frac * (args.end_e - args.start_e)


class ReplayBuffer:
    """dqn_atari_envpool.py's ring buffer of single frames (7.1 GB at 1M; `stacks` rebuilds the 4-frame obs). A step is
    written once, into numpy staging rows; they reach the device in one copy per field at `flush`, before updates."""

    def __init__(self, size: int, device, stage: int):
        self.data = TensorDict(frames=torch.empty(size, 84, 84, dtype=torch.uint8),
                               age=torch.zeros(size, dtype=torch.long), actions=torch.zeros(size, dtype=torch.long),
                               rewards=torch.zeros(size), dones=torch.zeros(size), batch_size=[size], device=device)
        self.fields = dict(self.data.items())  # the plain tensors: what `update` gathers from
        self.staged = {k: torch.zeros((stage,) + v.shape[1:], dtype=v.dtype).numpy() for k, v in self.fields.items()}
        self.size, self.pos, self.full, self.n = size, 0, False, 0
        self.age, self.resetting = 0, False  # the steps since the game's reset; whether the next step resets it

    def add(self, frame, action: int, reward: float, done: bool, game_over: bool):
        """One env step (see dqn_atari_envpool.py): the step after a game's end only resets it, no transition."""
        if not self.resetting:
            for staged, x in zip(self.staged.values(), (frame, self.age, action, reward, float(done))):  # fields' order
                staged[self.n] = x
            self.n += 1
            if self.n == len(self.staged["frames"]):
                self.flush()
        self.age = 0 if self.resetting else min(self.age + 1, 3)
        self.resetting = game_over

    def flush(self):
        n, first = self.n, min(self.n, self.size - self.pos)  # the staged rows may wrap around the end
        for key, x in self.staged.items():
            dst, src = self.fields[key], torch.from_numpy(x)
            dst[self.pos:self.pos + first].copy_(src[:first], non_blocking=True)
            dst[:n - first].copy_(src[first:n], non_blocking=True)
        self.full = self.full or self.pos + n >= self.size
        self.pos, self.n = (self.pos + n) % self.size, 0

    def sample_indices(self, batch_size: int, generator) -> torch.Tensor:
        """Slots a batch may hold: the next slot written, the stack not overwritten."""
        first, count = ((self.pos + 3) % self.size, self.size - 4) if self.full else (0, self.pos - 1)
        return (first + torch.randint(count, (batch_size,), device=generator.device, generator=generator)) % self.size


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
    """Networks, optimizer, RNGs and the step; not the buffer (gigabytes): a resumed run acts --learning-starts steps
    to refill it before it learns. The game in flight is lost (envpool cannot snapshot it): a fresh seed restarts it."""
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
    rng = torch.Generator(device).manual_seed(args.seed)  # the loop's own: torch.compile restores the global one

    env = make_env(args, seed=args.seed + (ckpt["global_step"] if ckpt else 0))
    n_actions = env.action_space.n
    q_network = QNetwork(n_actions).to(device)
    target_network = QNetwork(n_actions).to(device).requires_grad_(False)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, device, stage=args.train_frequency)
    u = make_units(q_network, target_network, rb, args, device)
    # the real game's score: info["reward"] (unclipped) summed until info["terminated"] (all lives lost) or the time
    # limit; the 5-tuple's `terminated` is per life under episodic_life, and its reward is clipped
    score, finished = 0.0, deque(maxlen=20)  # the scores of the last 20 finished games
    mean_return = lambda: float(np.mean(finished)) if finished else None  # noqa: E731
    global_step = 0
    if ckpt:
        q_network.load_state_dict(ckpt["q_network"])
        target_network.load_state_dict(ckpt["target_network"])
        u.optimizer.load_state_dict(ckpt["optimizer"])
        rng.set_state(ckpt["rng"])
        finished.extend(ckpt["finished"].tolist())
        global_step = ckpt["global_step"]
    learn_after = global_step + args.learning_starts  # after a resume: refill the buffer first
    obs, _ = env.reset()

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
                action = u.act(torch.from_numpy(obs).to(device, non_blocking=True)).item()
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, info = env.step(np.array([action]))
            t_env += time.perf_counter() - t1
            t_policy += t1 - t0
            score += float(info["reward"][0])
            game_over = bool(info["terminated"][0] or truncated[0])
            if game_over:
                finished.append(score)
                score = 0.0
            rb.add(obs[0, -1], action, reward[0], terminated[0] or truncated[0], game_over)
            obs = next_obs

            t0 = time.perf_counter()
            if global_step > learn_after:
                if global_step % args.train_frequency == 0:
                    rb.flush()
                    stats[n_updates] = u.update(rb.sample_indices(args.batch_size, rng))
                    n_updates += 1
                if global_step % args.target_network_frequency == 0:
                    u.update_target()
            t_update += time.perf_counter() - t0
            global_step += 1

            if global_step % args.log_every and global_step < args.total_timesteps:
                continue
            # steady-state fps: whole chunks after learning_starts plus the burn-in
            now = time.perf_counter()
            if measure_from is None and global_step >= learn_after + args.measure_burnin:
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
        path = os.path.join(log_dir, "agent.pt")
        torch.save(dict(
            script=script, q_network=q_network.state_dict(), target_network=target_network.state_dict(),
            optimizer=u.optimizer.state_dict(), args=asdict(args), global_step=global_step,
            rng=rng.get_state(), finished=torch.tensor(list(finished), dtype=torch.float64)), path + ".tmp")
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
