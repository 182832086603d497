"""What the compiled update's idiom costs, per family, end to end at the sweep's budget (run.sh).

Two ways to compile an update. `functional`: gradients from torch.func.grad and a step of torch.optim's functional
Adam (`adam_step`), so that compiled, the update is one graph. LeanRL's idiom, the one every PyTorch user knows: the
loss, `optimizer.zero_grad()`, `loss.backward()`, `clip_grad_norm_`, `optimizer.step()`, compiled as one function
(graph breaks at backward and step). This tool runs each family's torchcompile script with `--compile` as it is and
with its update units swapped for LeanRL's idiom, in four forms:

- `functional`: the scripts' own;
- `leanrl`: LeanRL's idiom, the function compiled, as LeanRL's scripts do;
- `leanrl-ca`: the same with compiled autograd (torch._dynamo.config.compiled_autograd), which traces the backward;
- `leanrl-step`: the loss and backward compiled as one unit and `optimizer.step` as its own (torch's
  "compiling the optimizer" recipe), called one after the other from the loop.

The swapped units compute what the script's own do (same loss functions, clip and Adam settings); the runs log the
script's own metrics. Per configuration: steady fps (the sweep's measure) and the update units' time per env step
and per call (from t_update). Runs go one at a time, idioms interleaved within a seed.

    python leanrl/tools/bench_idiom.py --families classic mujoco sac td3 dqn dqn_atari --seeds 1 2 3
"""

import contextlib
import functools
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

LEANRL = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LEANRL))  # plumbing/ is in leanrl/, one up
import plumbing  # noqa: E402

IDIOMS = ("functional", "leanrl", "leanrl-ca", "leanrl-step")
# family: script, the sweep's budget flags (run.sh), env steps per update call at the scripts' defaults (PPO: a
# minibatch, 512 steps / 16 minibatches for CartPole, 2048 / 320 for HalfCheetah; SAC: a critic and an actor step;
# TD3: a critic step and half an actor step; DQN: a TD step every 10 steps, every 4 on Atari)
FAMILIES = {
    "classic": ("ppo_torchcompile", ["--total-timesteps", "200000"], 32),
    "mujoco": ("ppo_continuous_action_torchcompile", ["--total-timesteps", "20480"], 6.4),
    "sac": ("sac_continuous_action_torchcompile", ["--total-timesteps", "8000", "--learning-starts", "5000"], 1),
    "td3": ("td3_continuous_action_torchcompile", ["--total-timesteps", "8000", "--learning-starts", "5000"], 1),
    "dqn": ("dqn_torchcompile", ["--total-timesteps", "30000"], 10),
    "dqn_atari": (
        "dqn_atari_envpool_torchcompile",
        ["--total-timesteps", "6000", "--learning-starts", "2000", "--measure-burnin", "500", "--log-every", "500"]
        + ["--buffer-size", "100000"],
        4,
    ),
}


@dataclass
class Args:
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    """families to measure (classic, mujoco, sac, td3, dqn, dqn_atari)"""
    idioms: list[str] = field(default_factory=lambda: list(IDIOMS))
    """idioms to measure (functional, leanrl, leanrl-ca, leanrl-step)"""
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds, one run per family, idiom and seed"""
    out: str = "runs/idiom"
    """folder of the runs and the table (table.md, results.json)"""


def check_args(args: Args):
    """Every flag checked before any run starts: a mistake is one line and exit code 2, not a traceback."""
    for name, known in (("families", FAMILIES), ("idioms", IDIOMS)):
        values = getattr(args, name)
        unknown = [v for v in values if v not in known]
        if not values:
            plumbing.fail(f"--{name}: give at least one of {', '.join(known)}")
        if unknown:
            plumbing.fail(f"--{name} {' '.join(unknown)}: not one of {', '.join(known)}")
    plumbing.require(args, lambda v: 0 <= v < 2**31, "in [0, 2**31)", "seeds")
    if not args.seeds:
        plumbing.fail("--seeds: give at least one seed")
    plumbing.check_compile_cache()  # every run compiles


def load(script: str):
    spec = importlib.util.spec_from_file_location(script, LEANRL / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def step_with(idiom: str, options):
    """How the idiom steps an optimizer: optimizer.step() inside the compiled unit, or (leanrl-step) a compiled step
    of its own, called from outside the unit's graph."""
    if idiom != "leanrl-step":
        return lambda optimizer: optimizer.step()
    compiled = {}

    @torch.compiler.disable
    def step(optimizer):
        if optimizer not in compiled:
            compiled[optimizer] = torch.compile(optimizer.step, options=options)
        compiled[optimizer]()

    return step


def split(idiom: str, options, unit):
    """leanrl-step: the unit (loss and backward) compiled on its own, called from an uncompiled frame, so that the
    optimizer step that follows it is a unit of its own; the other idioms leave the unit to the script's block."""
    if idiom != "leanrl-step":
        return unit
    compiled = torch.compile(unit, options=options)
    return functools.wraps(unit)(torch.compiler.disable(compiled))


def ppo_units(mod, idiom, options):
    step = step_with(idiom, options)

    def update(agent, optimizer, args, obs, actions, logprobs, advantages, returns, values, inds):
        params = dict(agent.named_parameters())
        loss, stats = mod.ppo_loss(
            params, agent, args, obs[inds], actions[inds], logprobs[inds], advantages[inds], returns[inds], values[inds]
        )
        optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=False)
        step(optimizer)
        return torch.cat([stats, grad_norm.unsqueeze(0)])

    return dict(update=update)


def dqn_units(mod, idiom, options, atari: bool):
    step = step_with(idiom, options)

    def update(q_network, target_network, optimizer, gamma, fields, inds):
        if atari:
            obs = mod.stacks(fields, inds)
            next_obs = mod.stacks(fields, (inds + 1) % fields["frames"].shape[0])
            actions, rewards, dones = (fields[k][inds] for k in ("actions", "rewards", "dones"))
        else:
            obs, next_obs, actions, rewards, dones = (fields[k][inds] for k in fields)
        with torch.no_grad():
            td_target = rewards + gamma * target_network(next_obs).max(dim=1).values * (1 - dones)
        q = q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1)  # the script's td_loss, in update
        loss = nn.functional.mse_loss(td_target, q)
        stats = torch.stack([loss, q.mean()]).detach()
        optimizer.zero_grad()
        loss.backward()
        step(optimizer)
        return stats

    return dict(update=update)


def td3_units(mod, idiom, options):
    step = step_with(idiom, options)

    def update_critic(
        target_actor,
        qnet,
        q_params,
        q_target,
        optimizer,
        args,
        obs,
        actions,
        rewards,
        next_obs,
        terminations,
        noise,
    ):
        bf16 = torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16)
        with torch.no_grad():
            clipped_noise = (noise * args.policy_noise).clamp(-args.noise_clip, args.noise_clip)
            clipped_noise = clipped_noise * target_actor.action_scale
            with bf16:
                next_actions = target_actor(next_obs).float()
            next_state_actions = (next_actions + clipped_noise).clamp(target_actor.low, target_actor.high)
            with bf16:
                min_qf_next_target = qnet.twin_q(q_target, next_obs, next_state_actions).float().min(0).values
            next_q_value = rewards + (1 - terminations) * args.gamma * min_qf_next_target
        with bf16:
            q_a_values = qnet.twin_q(q_params, obs, actions).float()
        qf_losses = ((q_a_values - next_q_value) ** 2).mean(1)
        optimizer.zero_grad()
        qf_losses.sum().backward()
        step(optimizer)
        return torch.cat([qf_losses, q_a_values[0].mean().view(1)]).detach()

    def update_actor(actor, qnet, q_params, optimizer, args, obs):
        q1_data = {name: p.detach()[0] for name, p in q_params.items()}
        with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            q1 = torch.func.functional_call(qnet, q1_data, (obs, actor(obs)))
        loss = -q1.float().mean()
        optimizer.zero_grad()
        loss.backward()
        step(optimizer)
        return loss.detach().view(1)

    return dict(update_critic=update_critic, update_actor=update_actor)


def sac_units(mod, idiom, options):
    step = step_with(idiom, options)

    def update_critic(
        actor,
        qnet,
        q_params,
        q_target,
        log_alpha,
        optimizer,
        args,
        obs,
        actions,
        rewards,
        next_obs,
        terminations,
        noise,
    ):
        bf16 = torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16)
        with torch.no_grad(), bf16:
            next_state_actions, next_state_log_pi = actor(next_obs, noise)
            q_next_target = qnet.twin_q(q_target, next_obs, next_state_actions).float()
        with torch.no_grad():
            min_qf_next_target = q_next_target.min(0).values - log_alpha.exp() * next_state_log_pi.float().view(-1)
            next_q_value = rewards + (1 - terminations) * args.gamma * min_qf_next_target
        with bf16:
            q_a_values = qnet.twin_q(q_params, obs, actions).float()
        qf_losses = ((q_a_values - next_q_value) ** 2).mean(1)
        optimizer.zero_grad()
        qf_losses.sum().backward()
        step(optimizer)
        return torch.cat([qf_losses, q_a_values[0].mean().view(1)]).detach()

    def update_actor(actor, qnet, q_params, log_alpha, actor_optimizer, a_optimizer, args, obs, noise, alpha_noise):
        q_data = {name: p.detach() for name, p in q_params.items()}
        with torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            pi, log_pi = actor(obs, noise)
            min_qf_pi = qnet.twin_q(q_data, obs, pi).min(0).values
        loss = (log_alpha.exp().detach() * log_pi.float().view(-1) - min_qf_pi.float()).mean()
        actor_optimizer.zero_grad()
        loss.backward()
        step(actor_optimizer)
        if not args.autotune:
            return torch.stack([loss.detach(), torch.zeros_like(loss)])
        with torch.no_grad(), torch.autocast(obs.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            _, log_pi = actor(obs, alpha_noise)
        alpha_loss = (-log_alpha.exp() * (log_pi.float() - actor.fc_mean.out_features)).mean()  # target entropy -dim(A)
        a_optimizer.zero_grad()
        alpha_loss.backward()
        step(a_optimizer)
        return torch.stack([loss.detach(), alpha_loss.detach()])

    return dict(update_critic=update_critic, update_actor=update_actor)


def worker(family: str, idiom: str, argv: list[str]):
    """One run of the family's script with the idiom's units in place of its own."""
    script = FAMILIES[family][0]
    mod = load(script)
    options = dict(cpp_wrapper=True, max_autotune=True) if family == "classic" else None
    if family == "dqn":
        options = dict(cpp_wrapper=True)
    if idiom != "functional":
        if family in ("classic", "mujoco"):
            units = ppo_units(mod, idiom, options)
        elif family in ("dqn", "dqn_atari"):
            units = dqn_units(mod, idiom, options, atari=family == "dqn_atari")
        elif family == "td3":
            units = td3_units(mod, idiom, options)
        else:
            units = sac_units(mod, idiom, options)
            make_optimizer = mod.make_optimizer

            def make_leaf_optimizer(params, lr, capturable):
                for p in params:  # log_alpha, a plain tensor where the gradient is written by hand, needs autograd
                    p.requires_grad_(True)
                return make_optimizer(params, lr, capturable)

            mod.make_optimizer = make_leaf_optimizer
        for name, unit in units.items():
            setattr(mod, name, split(idiom, options, unit))
    if idiom == "leanrl-ca":
        torch._dynamo.config.compiled_autograd = True
    if idiom != "functional":
        # the scripts skip the update's guards after an iteration's first minibatch; the idiom's frames after a graph
        # break may then raise "Recompilation triggered with skip_guard_eval_unsafe stance", so its runs check them
        torch.compiler.set_stance = lambda *args, **kwargs: contextlib.nullcontext()
    sys.argv = [script, *argv]
    mod.main(mod.plumbing.parse_args(mod.Args))


def measure(log_dir: Path) -> dict:
    """The run's steady fps and its update units' time per env step (median over the steady rows)."""
    summary = json.loads((log_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    per_row = [
        b["t_update"] / (b["global_step"] - a["global_step"])
        for a, b in zip(rows, rows[1:])
        if b.get("fps") is not None and b.get("t_update")
    ]
    per_step = statistics.median(per_row) if per_row else None
    return dict(fps=summary["fps"], update_us_per_step=per_step * 1e6 if per_step else None)


def main(args: Args):
    check_args(args)
    out = Path(args.out)
    results = {}
    for seed in args.seeds:
        for family in args.families:
            for idiom in args.idioms:
                log_dir = out / family / idiom / str(seed)
                if not (log_dir / "summary.json").exists():
                    budget = FAMILIES[family][1]
                    argv = [*budget, "--compile", "--seed", str(seed), "--log-dir", str(log_dir)]
                    print(f"== {family} {idiom} seed {seed}", file=sys.stderr, flush=True)
                    t0 = time.perf_counter()
                    subprocess.run(
                        [sys.executable, __file__, "--worker", family, idiom, *argv], check=True, timeout=3600
                    )
                    print(f"   {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
                results.setdefault(family, {}).setdefault(idiom, []).append(measure(log_dir))
    lines = [
        "| family | idiom | steady fps (median) | vs functional | update time per env step, us | per update call, us |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for family, by_idiom in results.items():
        base = statistics.median(r["fps"] for r in by_idiom.get("functional", by_idiom[next(iter(by_idiom))]))
        for idiom, runs in by_idiom.items():
            fps = statistics.median(r["fps"] for r in runs)
            upd = [r["update_us_per_step"] for r in runs if r["update_us_per_step"] is not None]
            per_step = statistics.median(upd) if upd else None
            per_call = f"{per_step * FAMILIES[family][2]:,.0f}" if upd else "-"
            per_step_text = f"{per_step:.1f}" if upd else "-"
            lines.append(f"| {family} | {idiom} | {fps:,.0f} | {fps / base - 1:+.1%} | {per_step_text} | {per_call} |")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main(plumbing.parse_args(Args))
