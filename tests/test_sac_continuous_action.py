"""SAC continuous control (MuJoCo through envpool): the update units against CleanRL's autograd update on the
baseline's networks, compiled against eager. For SAC's and TD3's scripts alike (the same shape): smoke runs (the
torchcompile ones with --compile), checkpoints and --resume, the replay buffer, bad input.

The smoke budget: 600 steps, updates from step 200, batch 32 in a buffer of 500 (so the runs wrap it around).
"""

import functools
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensordict import from_module

import plumbing
from conftest import assert_rejected, load_script, read_metrics, read_summary, run_script, script_fixture, smoke_runs

SCRIPTS = [f"{algo}_continuous_action{v}.py" for algo in ("sac", "td3") for v in ("", "_torchcompile")]
TINY = [
    "--total-timesteps",
    "600",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    "--buffer-size",
    "500",
    "--log-every",
    "200",
    "--measure-burnin",
    "100",
    "--num-threads",
    "1",
]
RUNS = {s: ("--compile",) * ("torchcompile" in s) + ("--cudagraphs", "--save-model") for s in SCRIPTS}
LOSSES = ("qf1_loss", "qf2_loss", "qf1_values", "actor_loss")  # and SAC's alpha_loss and alpha
N_OBS, N_ACT, B = 17, 6, 32


base = script_fixture("sac_continuous_action")
tc = script_fixture("sac_continuous_action_torchcompile")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return {script: run for (script, _), run in smoke_runs(RUNS.items(), tmp_path_factory, TINY).items()}


@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_writes_logs(smoke, script):
    proc, log_dir = smoke[script]
    rows = read_metrics(log_dir)
    assert [r["global_step"] for r in rows] == [200, 400, 600]
    assert [r["buffer"] for r in rows] == [200, 400, 500]  # the ring buffer holds at most --buffer-size
    assert rows[0]["qf1_loss"] is None  # no update yet
    for row in rows[1:]:
        assert all(np.isfinite(row[k]) for k in LOSSES + ("t_update", "t_env"))
        if script.startswith("sac"):
            assert np.isfinite(row["alpha_loss"])
    assert rows[1]["fps"] is None and rows[2]["fps"] > 0  # fps only after learning_starts + 100 burn-in steps
    summary = read_summary(log_dir)
    assert summary["script"] == script[:-3] and summary["global_step"] == 600 and summary["num_threads"] == 1
    assert (summary["compile_time"] or 0) > 0 if "--compile" in RUNS[script] else summary["compile_time"] is None
    said = [ln for ln in proc.stderr.splitlines() if "--cudagraphs" in ln]
    assert len(said) == 1 and "ignored" in said[0], proc.stderr


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.startswith("sac")])
def test_sac_autotune_starts_alpha_at_one(smoke, script):
    """With --autotune (the default) CleanRL's SAC starts at log_alpha = 0, alpha 1 (--alpha is used only without
    it). Each Adam step moves log_alpha by at most about q_lr = 1e-3, and a fresh actor's entropy is above
    -dim(A) = -6, so alpha falls from 1: after 200 and 400 alpha updates (the smoke rows at steps 400 and 600) it lies
    in (exp(-0.44), 1). Started at --alpha's 0.2 it would lie below 0.2."""
    _, log_dir = smoke[script]
    rows = read_metrics(log_dir)
    alphas = [r["alpha"] for r in rows[1:]]
    assert all(math.exp(-1.1e-3 * 400) < a < 1 for a in alphas), alphas
    assert alphas[1] < alphas[0], alphas


def fixed_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        obs=torch.randn(B, N_OBS, generator=g),
        actions=torch.rand(B, N_ACT, generator=g) * 2 - 1,
        rewards=torch.randn(B, generator=g),
        next_obs=torch.randn(B, N_OBS, generator=g),
        terminations=(torch.rand(B, generator=g) < 0.2).float(),
    )


LOW = -np.ones(N_ACT, np.float32)
HIGH = np.ones(N_ACT, np.float32)


def bind(unit, compiled: bool, *state):
    """`unit` bound to its state, as main binds it, and compiled as main compiles it with --compile."""
    bound = functools.partial(unit, *state)
    return torch.compile(bound) if compiled else bound


def sac_units(tc, compiled=False, **flags):
    """The SAC torchcompile script's training state, built as its main builds it, with its units bound to it: a
    namespace of the state the tests read and the four units."""
    args = tc.Args(batch_size=B, **flags)
    actor = tc.Actor(N_OBS, N_ACT, LOW, HIGH)
    qf1 = tc.SoftQNetwork(N_OBS, N_ACT)
    qf2 = tc.SoftQNetwork(N_OBS, N_ACT)
    q_params = tc.stack_twins(qf1, qf2)
    q_target = {name: p.data.clone() for name, p in q_params.items()}
    qnet = qf1.to("meta")
    actor_inference = tc.Actor(N_OBS, N_ACT, LOW, HIGH)
    from_module(actor).data.to_module(actor_inference, preserve_module_state=False)
    log_alpha = torch.full((1,), 0.0 if args.autotune else math.log(args.alpha))
    q_lr = torch.tensor(args.q_lr)
    policy_lr = torch.tensor(args.policy_lr)
    q_optimizer = tc.make_optimizer(list(q_params.values()), q_lr, False)
    actor_optimizer = tc.make_optimizer(list(actor.parameters()), policy_lr, False)
    a_optimizer = tc.make_optimizer([log_alpha], q_lr, False)
    return SimpleNamespace(
        actor=actor,
        q_params=q_params,
        q_target=q_target,
        log_alpha=log_alpha,
        policy=bind(tc.act, compiled, actor_inference),
        update_critic=bind(tc.update_critic, compiled, actor, qnet, q_params, q_target, log_alpha, q_optimizer, args),
        update_actor=bind(
            tc.update_actor,
            compiled,
            actor,
            qnet,
            q_params,
            log_alpha,
            actor_optimizer,
            a_optimizer,
            args,
        ),
        update_targets=bind(tc.update_targets, compiled, q_target, q_params, args.tau),
    )


def make_pair(base, tc, units, compiled=False, seed=0):
    """The torchcompile script's units (`units(tc, compiled)`: `sac_units`, or TD3's in
    tests/test_td3_continuous_action.py) and the baseline's networks holding the same parameters."""
    torch.manual_seed(seed)
    u = units(tc, compiled)
    qnet = getattr(base, "SoftQNetwork", None) or base.QNetwork  # SAC's name, TD3's
    actor, qf1, qf2 = base.Actor(N_OBS, N_ACT, LOW, HIGH), qnet(N_OBS, N_ACT), qnet(N_OBS, N_ACT)
    actor.load_state_dict(u.actor.state_dict(), strict=False)  # TD3's units' actor also holds the bounds
    for i, q in enumerate((qf1, qf2)):
        q.load_state_dict({k: p[i] for k, p in u.q_params.items()})
    return u, actor, qf1, qf2


def critic_step(qf1, qf2, q_opt, targets, batch, next_a, gamma, next_bonus=0.0):
    """CleanRL's critic step, SAC's and TD3's: both Q-networks regress on the clipped double-Q target computed from the
    target networks at `next_a` (SAC adds its entropy term as `next_bonus`), then one step of `q_opt`."""
    with torch.no_grad():
        min_next = torch.min(targets[0](batch["next_obs"], next_a), targets[1](batch["next_obs"], next_a)) + next_bonus
        next_q = batch["rewards"] + (1 - batch["terminations"]) * gamma * min_next.view(-1)
    q1, q2 = qf1(batch["obs"], batch["actions"]).view(-1), qf2(batch["obs"], batch["actions"]).view(-1)
    loss = F.mse_loss(q1, next_q) + F.mse_loss(q2, next_q)
    q_opt.zero_grad()
    loss.backward()
    q_opt.step()


def cleanrl_update(base, actor, qf1, qf2, batch, seeds, gamma=0.99, tau=0.005, policy_frequency=2):
    """CleanRL's update (critic, then policy_frequency actor + alpha steps, then the target update) with autograd and
    torch.optim on the baseline's networks; get_action's noise comes from torch's global generator seeded by `seeds`."""
    targets = [base.SoftQNetwork(N_OBS, N_ACT) for _ in range(2)]
    for t, q in zip(targets, (qf1, qf2)):
        t.load_state_dict(q.state_dict())
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
    a_opt_actor = torch.optim.Adam(actor.parameters(), lr=3e-4)
    log_alpha = torch.zeros(1, requires_grad=True)  # CleanRL's start with --autotune
    a_opt = torch.optim.Adam([log_alpha], lr=1e-3)
    alpha = log_alpha.exp().item()
    torch.manual_seed(seeds[0])
    with torch.no_grad():
        next_a, next_logp, _ = actor.get_action(batch["next_obs"])
    critic_step(qf1, qf2, q_opt, targets, batch, next_a, gamma, next_bonus=-alpha * next_logp)
    for i in range(policy_frequency):
        torch.manual_seed(seeds[1 + 2 * i])
        pi, log_pi, _ = actor.get_action(batch["obs"])
        actor_loss = (alpha * log_pi - torch.min(qf1(batch["obs"], pi), qf2(batch["obs"], pi))).mean()
        a_opt_actor.zero_grad()
        actor_loss.backward()
        a_opt_actor.step()
        torch.manual_seed(seeds[2 + 2 * i])
        with torch.no_grad():
            _, log_pi, _ = actor.get_action(batch["obs"])
        alpha_loss = (-log_alpha.exp() * (log_pi - N_ACT)).mean()
        a_opt.zero_grad()
        alpha_loss.backward()
        a_opt.step()
        alpha = log_alpha.exp().item()
    with torch.no_grad():
        for t, q in zip(targets, (qf1, qf2)):
            for tp, p in zip(t.parameters(), q.parameters()):
                tp.copy_(tau * p + (1 - tau) * tp)
    return targets, log_alpha.detach()


def run_units(u, batch, seeds, policy_frequency=2):
    noise = [torch.randn(B, N_ACT, generator=torch.Generator().manual_seed(s)) for s in seeds]
    stats = [
        u.update_critic(
            batch["obs"], batch["actions"], batch["rewards"], batch["next_obs"], batch["terminations"], noise[0]
        )
    ]
    for i in range(policy_frequency):
        stats.append(u.update_actor(batch["obs"], noise[1 + 2 * i], noise[2 + 2 * i]))
    u.update_targets()
    return torch.cat(stats)


def assert_critics_match(u, qf1, qf2, targets):
    """The units' stacked twin Q-networks and their targets against the baseline's (tests/test_td3_continuous_action.py
    uses this too): rtol 1e-4, atol 1e-5."""
    for i, (q, t) in enumerate(zip((qf1, qf2), targets)):
        for (name, p), tp in zip(q.named_parameters(), t.parameters()):
            torch.testing.assert_close(u.q_params[name][i].detach(), p.detach(), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(u.q_target[name][i], tp.detach(), rtol=1e-4, atol=1e-5)


def test_units_match_cleanrl_update(base, tc):
    """One update step of the units (stacked twin Q via vmap, torch.func.grad, functional Adam, foreach lerp) against
    CleanRL's autograd + torch.optim update on the baseline's networks, same parameters and noise: equal up to
    float32 rounding (rtol 1e-4, atol 1e-5: Adam's first step is lr * g / (|g| + eps), so a gradient near eps moves its
    weight by a few 1e-6 either way). A wrong sign, target or alpha gradient moves weights by ~lr = 1e-3."""
    u, actor, qf1, qf2 = make_pair(base, tc, sac_units)
    seeds, batch = [11, 12, 13, 14, 15], fixed_batch()
    targets, log_alpha = cleanrl_update(base, actor, qf1, qf2, batch, seeds)
    run_units(u, batch, seeds)
    assert_critics_match(u, qf1, qf2, targets)
    for (name, p), q in zip(actor.named_parameters(), u.actor.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(u.log_alpha, log_alpha, rtol=1e-5, atol=1e-7)


def test_compiled_units_equal_eager(base, tc):
    """The compiled units against the same units run eagerly, from the same parameters, on the same fixed batches and
    noise, three update steps: the losses and every parameter agree within rtol 1e-4 / atol 1e-5 (Inductor fuses and
    sums in another order; a compile that dropped an in-place write or a step would differ by far more)."""
    (eager, *_), (compiled, *_) = make_pair(base, tc, sac_units, False), make_pair(base, tc, sac_units, True)
    seeds = [21, 22, 23, 24, 25]
    for step in range(3):
        batch = fixed_batch(step)
        torch.testing.assert_close(
            run_units(compiled, batch, seeds), run_units(eager, batch, seeds), rtol=1e-4, atol=1e-5
        )
    for name in eager.q_params:
        torch.testing.assert_close(
            compiled.q_params[name].detach(), eager.q_params[name].detach(), rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(compiled.q_target[name], eager.q_target[name], rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(eager.actor.named_parameters(), compiled.actor.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(compiled.log_alpha, eager.log_alpha)
    # the acting unit reads the trained parameters (the inference copy shares their storage)
    obs, noise = torch.randn(1, N_OBS), torch.randn(1, N_ACT)
    torch.testing.assert_close(compiled.policy(obs, noise), eager.policy(obs, noise), rtol=1e-4, atol=1e-5)


def assert_bf16_update_near_fp32(units, run):
    """--bf16 against fp32 from the same parameters and batch, one update step of every unit: the losses within a few
    percent (bf16 keeps 8 bits of mantissa), not identical (the matrix products did run in bf16), and every parameter
    still fp32 (Adam's state and step stay fp32)."""
    torch.manual_seed(0)
    fp32 = units(False)
    torch.manual_seed(0)
    bf16 = units(True)
    a = run(fp32)
    b = run(bf16)
    torch.testing.assert_close(b, a, rtol=5e-2, atol=5e-2)
    assert not torch.equal(a, b)
    assert all(p.dtype == torch.float32 for p in [*bf16.q_params.values(), *bf16.actor.parameters()])


def test_bf16_update_stays_near_fp32(tc):
    seeds = [41, 42, 43, 44, 45]
    assert_bf16_update_near_fp32(lambda bf16: sac_units(tc, bf16=bf16), lambda u: run_units(u, fixed_batch(), seeds))


@pytest.mark.parametrize("script", [f"{a}_continuous_action{v}" for a in ("sac", "td3") for v in ("", "_torchcompile")])
def test_buffer_wraps_and_samples_only_what_was_written(script):
    """The replay buffer of SAC's and TD3's scripts (the same in both algorithms): the torchcompile one is written a
    whole transition row at a time, the baseline's field by field."""
    m = load_script(script)
    rb = m.ReplayBuffer(5, 2, 1, torch.device("cpu"))
    rows = [np.array([i, i, -i, -i, 0.5 * i, i, i % 2], np.float32) for i in range(1, 8)]
    for i, row in enumerate(rows):
        if script.endswith("_torchcompile"):
            rb.add(row)
        else:
            rb.add(*(torch.tensor(x) for x in (row[:2], row[2:4], row[4:5], row[5], row[6])))
        if i == 1:  # 2 of 5 written: a batch holds only those two
            batch = rb.sample(64, torch.Generator().manual_seed(0))
            assert set(batch["obs"][:, 0].tolist()) == {1.0, 2.0}
            assert batch["obs"].device.type == "cpu" and batch["rewards"].shape == (64,)
    assert rb.filled == 5 and rb.pos == 2
    assert rb.data["obs"][:, 0].tolist() == [6, 7, 3, 4, 5]  # 6 and 7 overwrote the oldest
    assert rb.data["next_obs"][:, 0].tolist() == [-6, -7, -3, -4, -5]
    assert rb.data["terminations"].tolist() == [0, 1, 1, 0, 1] and rb.data["rewards"].tolist() == [6, 7, 3, 4, 5]
    batch = rb.sample(256, torch.Generator().manual_seed(1))
    assert set(batch["obs"][:, 0].tolist()) == {3.0, 4.0, 5.0, 6.0, 7.0}
    torch.testing.assert_close(batch["actions"][:, 0], batch["obs"][:, 0] * 0.5)  # rows stay whole


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_continues(smoke, script, tmp_path):
    """--resume restores networks, optimizers, SAC's alpha and the replay buffer (the smoke run's 500-row ring, full
    at the checkpoint), and continues the step count, updating from its first step."""
    _, first = smoke[script]
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    assert ckpt["global_step"] == 600 and ckpt["script"] == script[:-3]
    flags = [f if f != "600" else "1000" for f in TINY]
    run_script(script, *flags, "--resume", str(first / "agent.pt"), log_dir=tmp_path / "resumed")
    rows = read_metrics(tmp_path / "resumed")
    assert [r["global_step"] for r in rows] == [800, 1000] and [r["buffer"] for r in rows] == [500, 500]
    assert ckpt["buffer"]["filled"] == 500 and ckpt["buffer"]["pos"] == 600 % 500
    if script.startswith("sac"):
        assert rows[0]["alpha"] < read_metrics(first)[-1]["alpha"]  # it goes on falling from there, not from 1
    assert np.isfinite(rows[1]["qf1_loss"])


@pytest.mark.parametrize("script", SCRIPTS)
def test_checkpoint_keeps_the_finished_episodes(script, tmp_path):
    """The checkpoint holds the returns of the finished episodes (Hopper's end within a few dozen steps, HalfCheetah's
    never in a smoke run) and --resume goes on from them: resumed for one step (the env starts a new episode, which
    cannot end in one step), the final return is the saved run's, the mean of the same last 20 episodes."""
    flags = ["--env-id", "Hopper-v4", "--total-timesteps", "300", *TINY[2:], "--save-model"]
    run_script(script, *flags, log_dir=tmp_path / "first")
    saved = torch.load(tmp_path / "first" / "agent.pt", weights_only=True)["episodes"]
    assert 0 < len(saved["finished"]) <= 20 and saved["ret"].shape == (1,)
    last = read_metrics(tmp_path / "first")[-1]["episodic_return"]
    assert last == saved["finished"].mean().item() == read_summary(tmp_path / "first")["final_return"]
    flags[3] = "301"
    run_script(script, *flags, "--resume", str(tmp_path / "first" / "agent.pt"), log_dir=tmp_path / "resumed")
    summary = read_summary(tmp_path / "resumed")
    assert summary["global_step"] == 301 and summary["final_return"] == last
    assert [r["global_step"] for r in read_metrics(tmp_path / "resumed")] == [301]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "flags,words",
    [(["--env-id", "Breakout-v5"], ["--env-id", "atari"]), (["--num-envs", "4"], ["--num-envs", "one env"])],
)
def test_bad_input_from_the_command_line(script, flags, words, tmp_path):
    """SAC's and TD3's scripts, what tests/test_bad_input_matrix.py cannot know: an env of another family is named,
    and one env only. The matrix covers the rest (every flag's range, batch larger than the buffer, a checkpoint of
    the other script)."""
    assert_rejected(script, flags, words, tmp_path / "run")


@pytest.mark.parametrize("script", ["sac_continuous_action.py", "td3_continuous_action.py"])
def test_a_baselines_checkpoint_from_cuda_resumes_on_a_cpu(script, tmp_path):
    """The eager baselines restore their device generator as the torchcompile scripts do (plumbing.restore_rngs): a
    checkpoint written on CUDA (a 16-byte generator state) resumes on a CPU with one line, re-seeded, where set_state
    raised a traceback (issue 49)."""
    first = tmp_path / "first"
    run_script(script, *TINY, "--save-model", log_dir=first)
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    ckpt["rng"] = torch.zeros(16, dtype=torch.uint8)  # what torch.Generator("cuda").get_state() holds
    torch.save(ckpt, first / "agent.pt")
    flags = [*TINY, "--total-timesteps", "800", "--resume", str(first / "agent.pt")]
    proc = run_script(script, *flags, log_dir=first, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--resume: a checkpoint written on CUDA, resumed on cpu" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", ["sac_continuous_action.py", "td3_continuous_action_torchcompile.py"])
def test_a_classic_control_task_with_continuous_actions_trains(script, tmp_path):
    """MountainCarContinuous-v0 (envpool's, one action in [-1, 1]) trains as CleanRL's SAC and TD3 take any Box-action
    env: the run goes through, its actor scaled to the env's action bounds."""
    flags = ["--env-id", "MountainCarContinuous-v0", "--total-timesteps", "400", *TINY[2:], "--save-model"]
    run_script(script, *flags, log_dir=tmp_path / "run")
    assert read_metrics(tmp_path / "run")[-1]["global_step"] == 400
    actor = torch.load(tmp_path / "run" / "agent.pt", weights_only=True)["actor"]
    assert actor["action_scale"].tolist() == [1.0] and actor["action_bias"].tolist() == [0.0]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("buffer_size", [300, 400, 2000])
def test_resume_takes_the_checkpoints_buffer_size_only(script, buffer_size, tmp_path, capsys, monkeypatch):
    """The checkpoint's ring buffer (1,000 rows, 400 written) goes back into a buffer of the same size: a smaller one
    was a traceback at load (300) or an IndexError at the first add, the run's folder left with an empty metrics.jsonl
    (400), and a larger one would sample the empty rows past a wrapped ring; refused in one line, as DQN refuses it."""
    ckpt = tmp_path / "agent.pt"
    saved = dict(seed=1, env_id="HalfCheetah-v4", buffer_size=1000)
    torch.save(dict(script=script[:-3], format=4, args=saved, global_step=400), ckpt)
    module = load_script(script[:-3])
    argv = ["--buffer-size", str(buffer_size), "--resume", str(ckpt), "--log-dir", str(tmp_path / "run")]
    monkeypatch.setattr(sys, "argv", [script, *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        module.check_args(plumbing.parse_args(module.Args))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and "--buffer-size 1000" in lines[0], lines
