"""TD3 continuous control (MuJoCo through envpool): smoke runs of both scripts (the torchcompile one with --compile),
the update units against CleanRL's autograd update on the baseline's networks, compiled against eager, the replay
buffer, checkpoints and --resume, bad input.

The smoke budget: 600 steps, updates from step 200, batch 32 in a buffer of 500 (so the runs wrap it around).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import read_metrics, read_summary, run_script, script_fixture, smoke_runs

SCRIPTS = ("td3_continuous_action.py", "td3_continuous_action_torchcompile.py")
TINY = ["--total-timesteps", "600", "--learning-starts", "200", "--batch-size", "32", "--buffer-size", "500",
        "--log-every", "200", "--measure-burnin", "100", "--num-threads", "1"]
RUNS = {"td3_continuous_action.py": ("--cudagraphs", "--save-model"),
        "td3_continuous_action_torchcompile.py": ("--compile", "--cudagraphs", "--save-model")}
LOSSES = ("qf1_loss", "qf2_loss", "qf1_values", "actor_loss")
N_OBS, N_ACT, B = 17, 6, 32


base = script_fixture("td3_continuous_action")
tc = script_fixture("td3_continuous_action_torchcompile")


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
    assert rows[1]["fps"] is None and rows[2]["fps"] > 0  # fps only after learning_starts + 100 burn-in steps
    summary = read_summary(log_dir)
    assert summary["script"] == script[:-3] and summary["global_step"] == 600 and summary["num_threads"] == 1
    assert (summary["compile_time"] or 0) > 0 if "--compile" in RUNS[script] else summary["compile_time"] is None
    said = [ln for ln in proc.stderr.splitlines() if "--cudagraphs" in ln]
    assert len(said) == 1 and "ignored" in said[0], proc.stderr


def fixed_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(obs=torch.randn(B, N_OBS, generator=g), actions=torch.rand(B, N_ACT, generator=g) * 2 - 1,
                rewards=torch.randn(B, generator=g), next_obs=torch.randn(B, N_OBS, generator=g),
                terminations=(torch.rand(B, generator=g) < 0.2).float())


def make_pair(base, tc, compiled=False, seed=0):
    """The baseline's networks and the torchcompile script's units, holding the same parameters."""
    low, high = -np.ones(N_ACT, np.float32), np.ones(N_ACT, np.float32)
    args = tc.Args(batch_size=B)
    torch.manual_seed(seed)
    u = tc.make_units(args, N_OBS, N_ACT, low, high, torch.device("cpu"), compiled)
    actor, qf1, qf2 = base.Actor(N_OBS, N_ACT, low, high), base.QNetwork(N_OBS, N_ACT), base.QNetwork(N_OBS, N_ACT)
    actor.load_state_dict(u.actor.state_dict(), strict=False)  # the units' actor also holds the bounds
    for i, q in enumerate((qf1, qf2)):
        q.load_state_dict({k: p[i] for k, p in u.q_params.items()})
    return u, actor, qf1, qf2


def cleanrl_update(base, actor, qf1, qf2, batch, noise, gamma=0.99, tau=0.005, policy_noise=0.2, noise_clip=0.5):
    """CleanRL's TD3 update at a step where the actor and the targets move too, with autograd and torch.optim on the
    baseline's networks; the target smoothing noise is `noise` (CleanRL draws it with randn_like)."""
    target_actor = base.Actor(N_OBS, N_ACT, -np.ones(N_ACT, np.float32), np.ones(N_ACT, np.float32))
    target_actor.load_state_dict(actor.state_dict())
    targets = [base.QNetwork(N_OBS, N_ACT) for _ in range(2)]
    for t, q in zip(targets, (qf1, qf2)):
        t.load_state_dict(q.state_dict())
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=3e-4)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    with torch.no_grad():
        clipped = (noise * policy_noise).clamp(-noise_clip, noise_clip) * target_actor.action_scale
        next_a = (target_actor(batch["next_obs"]) + clipped).clamp(-1, 1)
        min_next = torch.min(targets[0](batch["next_obs"], next_a), targets[1](batch["next_obs"], next_a))
        next_q = batch["rewards"] + (1 - batch["terminations"]) * gamma * min_next.view(-1)
    q1, q2 = qf1(batch["obs"], batch["actions"]).view(-1), qf2(batch["obs"], batch["actions"]).view(-1)
    loss = F.mse_loss(q1, next_q) + F.mse_loss(q2, next_q)
    q_opt.zero_grad()
    loss.backward()
    q_opt.step()
    actor_loss = -qf1(batch["obs"], actor(batch["obs"])).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    with torch.no_grad():
        for t, net in zip([target_actor] + targets, (actor, qf1, qf2)):
            for tp, p in zip(t.parameters(), net.parameters()):
                tp.copy_(tau * p + (1 - tau) * tp)
    return target_actor, targets


def run_units(u, batch, noise):
    stats = u.update_critic(batch["obs"], batch["actions"], batch["rewards"], batch["next_obs"],
                            batch["terminations"], noise)
    stats = torch.cat([stats, u.update_actor(batch["obs"])])
    u.update_targets()
    return stats


def test_units_match_cleanrl_update(base, tc):
    """One update step of the units (stacked twin Q via vmap, torch.func.grad, functional Adam, foreach lerp) against
    CleanRL's autograd + torch.optim update on the baseline's networks, same parameters and noise: equal up to
    float32 rounding (rtol 1e-4, atol 1e-5: Adam's first step is lr * g / (|g| + eps), so a gradient near eps moves its
    weight by a few 1e-6 either way). A wrong sign, target or smoothing noise moves weights by ~lr = 3e-4."""
    u, actor, qf1, qf2 = make_pair(base, tc)
    batch, noise = fixed_batch(), torch.randn(B, N_ACT, generator=torch.Generator().manual_seed(5))
    target_actor, targets = cleanrl_update(base, actor, qf1, qf2, batch, noise)
    run_units(u, batch, noise)
    for i, (q, t) in enumerate(zip((qf1, qf2), targets)):
        for (name, p), tp in zip(q.named_parameters(), t.parameters()):
            torch.testing.assert_close(u.q_params[name][i].detach(), p.detach(), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(u.q_target[name][i], tp.detach(), rtol=1e-4, atol=1e-5)
    for (name, p), q, tp, tq in zip(actor.named_parameters(), u.actor.parameters(), target_actor.parameters(),
                                    u.target_actor.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(tq, tp.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_units_equal_eager(base, tc):
    """The compiled units against the same units run eagerly, from the same parameters, on the same fixed batches and
    noise, three update steps: the losses and every parameter agree within rtol 1e-4 / atol 1e-5 (Inductor fuses and
    sums in another order; a compile that dropped an in-place write or a step would differ by far more)."""
    (eager, *_), (compiled, *_) = make_pair(base, tc, False), make_pair(base, tc, True)
    for step in range(3):
        batch, noise = fixed_batch(step), torch.randn(B, N_ACT, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(run_units(compiled, batch, noise), run_units(eager, batch, noise), rtol=1e-4, atol=1e-5)
    for name in eager.q_params:
        torch.testing.assert_close(compiled.q_params[name].detach(), eager.q_params[name].detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(compiled.q_target[name], eager.q_target[name], rtol=1e-4, atol=1e-5)
    for p, q, tp, tq in zip(eager.actor.parameters(), compiled.actor.parameters(), eager.target_actor.parameters(),
                            compiled.target_actor.parameters()):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tq, tp, rtol=1e-4, atol=1e-5)
    # the acting unit reads the trained parameters (the inference copy shares their storage) and clips to the bounds
    obs, noise = torch.randn(1, N_OBS), torch.randn(1, N_ACT) * 30
    action = compiled.policy(obs, noise)
    torch.testing.assert_close(action, eager.policy(obs, noise), rtol=1e-4, atol=1e-5)
    assert action.abs().max() == 1.0


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_continues(smoke, script, tmp_path):
    """--resume restores networks and optimizers, and continues the step count; the empty buffer refills for
    learning_starts steps (acting with the restored policy) before updates start again."""
    _, first = smoke[script]
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    assert ckpt["global_step"] == 600 and ckpt["script"] == script[:-3]
    flags = [f if f != "600" else "1000" for f in TINY]
    run_script(script, *flags, "--resume", str(first / "agent.pt"), log_dir=tmp_path / "resumed")
    rows = read_metrics(tmp_path / "resumed")
    assert [r["global_step"] for r in rows] == [800, 1000] and [r["buffer"] for r in rows] == [200, 400]
    assert np.isfinite(rows[1]["qf1_loss"])

