"""TD3 continuous control (MuJoCo through envpool): the update units against CleanRL's autograd update on the
baseline's networks, compiled against eager. The smoke runs, --resume, the buffer and bad input of TD3's scripts are
tested with SAC's, in tests/test_sac_continuous_action.py (the scripts have the same shape)."""

from types import SimpleNamespace

import numpy as np
import torch
from tensordict import from_module

from conftest import script_fixture
from test_sac_continuous_action import (
    HIGH,
    LOW,
    N_ACT,
    N_OBS,
    B,
    assert_bf16_update_near_fp32,
    assert_critics_match,
    bind,
    critic_step,
    fixed_batch,
    make_pair,
)

base = script_fixture("td3_continuous_action")
tc = script_fixture("td3_continuous_action_torchcompile")


def td3_units(tc, compiled=False, **flags):
    """The TD3 torchcompile script's training state, built as its main builds it, with its units bound to it: a
    namespace of the state the tests read and the four units."""
    args = tc.Args(batch_size=B, **flags)
    actor = tc.Actor(N_OBS, N_ACT, LOW, HIGH)
    qf1 = tc.QNetwork(N_OBS, N_ACT)
    qf2 = tc.QNetwork(N_OBS, N_ACT)
    q_params = tc.stack_twins(qf1, qf2)
    q_target = {name: p.data.clone() for name, p in q_params.items()}
    qnet = qf1.to("meta")
    actor_inference = tc.Actor(N_OBS, N_ACT, LOW, HIGH)
    target_actor = tc.Actor(N_OBS, N_ACT, LOW, HIGH)
    from_module(actor).data.to_module(actor_inference, preserve_module_state=False)
    target_actor.load_state_dict(actor.state_dict())
    target_actor.requires_grad_(False)
    lr = torch.tensor(args.learning_rate)
    q_optimizer = tc.make_optimizer(list(q_params.values()), lr, False)
    actor_optimizer = tc.make_optimizer(list(actor.parameters()), lr, False)
    return SimpleNamespace(
        actor=actor,
        target_actor=target_actor,
        q_params=q_params,
        q_target=q_target,
        policy=bind(tc.act, compiled, actor_inference, args.exploration_noise),
        update_critic=bind(tc.update_critic, compiled, target_actor, qnet, q_params, q_target, q_optimizer, args),
        update_actor=bind(tc.update_actor, compiled, actor, qnet, q_params, actor_optimizer, args),
        update_targets=bind(tc.update_targets, compiled, target_actor, q_target, actor, q_params, args.tau),
    )


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
    critic_step(qf1, qf2, q_opt, targets, batch, next_a, gamma)
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
    stats = u.update_critic(
        batch["obs"], batch["actions"], batch["rewards"], batch["next_obs"], batch["terminations"], noise
    )
    stats = torch.cat([stats, u.update_actor(batch["obs"])])
    u.update_targets()
    return stats


def test_units_match_cleanrl_update(base, tc):
    """One update step of the units (stacked twin Q via vmap, torch.func.grad, functional Adam, foreach lerp) against
    CleanRL's autograd + torch.optim update on the baseline's networks, same parameters and noise: equal up to
    float32 rounding (rtol 1e-4, atol 1e-5: Adam's first step is lr * g / (|g| + eps), so a gradient near eps moves its
    weight by a few 1e-6 either way). A wrong sign, target or smoothing noise moves weights by ~lr = 3e-4."""
    u, actor, qf1, qf2 = make_pair(base, tc, td3_units)
    batch, noise = fixed_batch(), torch.randn(B, N_ACT, generator=torch.Generator().manual_seed(5))
    target_actor, targets = cleanrl_update(base, actor, qf1, qf2, batch, noise)
    run_units(u, batch, noise)
    assert_critics_match(u, qf1, qf2, targets)
    for (name, p), q, tp, tq in zip(
        actor.named_parameters(), u.actor.parameters(), target_actor.parameters(), u.target_actor.parameters()
    ):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(tq, tp.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_units_equal_eager(base, tc):
    """The compiled units against the same units run eagerly, from the same parameters, on the same fixed batches and
    noise, three update steps: the losses and every parameter agree within rtol 1e-4 / atol 1e-5 (Inductor fuses and
    sums in another order; a compile that dropped an in-place write or a step would differ by far more)."""
    (eager, *_), (compiled, *_) = make_pair(base, tc, td3_units, False), make_pair(base, tc, td3_units, True)
    for step in range(3):
        batch, noise = fixed_batch(step), torch.randn(B, N_ACT, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(
            run_units(compiled, batch, noise), run_units(eager, batch, noise), rtol=1e-4, atol=1e-5
        )
    for name in eager.q_params:
        torch.testing.assert_close(
            compiled.q_params[name].detach(), eager.q_params[name].detach(), rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(compiled.q_target[name], eager.q_target[name], rtol=1e-4, atol=1e-5)
    for p, q, tp, tq in zip(
        eager.actor.parameters(),
        compiled.actor.parameters(),
        eager.target_actor.parameters(),
        compiled.target_actor.parameters(),
    ):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tq, tp, rtol=1e-4, atol=1e-5)
    # the acting unit reads the trained parameters (the inference copy shares their storage) and clips to the bounds
    obs, noise = torch.randn(1, N_OBS), torch.randn(1, N_ACT) * 30
    action = compiled.policy(obs, noise)
    torch.testing.assert_close(action, eager.policy(obs, noise), rtol=1e-4, atol=1e-5)
    assert action.abs().max() == 1.0


def test_bf16_update_stays_near_fp32(tc):
    noise = torch.randn(B, N_ACT, generator=torch.Generator().manual_seed(51))
    assert_bf16_update_near_fp32(lambda bf16: td3_units(tc, bf16=bf16), lambda u: run_units(u, fixed_batch(), noise))
