"""Teacher-student PPO: ppo_teacher_student_torchcompile.py (a small student acts, a large teacher learns too).

The runs use a small teacher (32 x 2): what is checked is the plumbing of the trick, not the size. They are shared by
the assertions through a module-scoped fixture (a compiled run costs tens of seconds); the unit tests import the script
and check the teacher's update against a reference written here.
"""

import functools
import math

import pytest
import torch
from torch.distributions import Categorical

from conftest import (
    SMOKE,
    assert_rejected,
    check_ppo_smoke_logs,
    read_metrics,
    read_summary,
    resume_ppo_smoke,
    run_script,
    script_fixture,
    smoke_fixture,
)

SCRIPT = "ppo_teacher_student_torchcompile.py"
BASE = "ppo_torchcompile.py"
TEACHER = ("--teacher-hidden-dim", "32", "--teacher-hidden-depth", "2", "--eval-every", "2")
COMPILED = (*TEACHER, "--compile")
EAGER = TEACHER
# the script compiled, the script eager and its base eager, on the same seed
RUNS = [(SCRIPT, COMPILED), (SCRIPT, EAGER), (BASE, ())]
TEACHER_FIELDS = (
    "teacher_approx_kl",
    "teacher_clipfrac",
    "teacher_pg_loss",
    "teacher_v_loss",
    "teacher_entropy",
    "teacher_grad_norm",
    "t_teacher",
    "t_eval",
)

ts = script_fixture("ppo_teacher_student_torchcompile")
smoke = smoke_fixture(RUNS)


def same_numbers(row: dict) -> dict:
    """A metrics row without its timings: what two runs of the same computation must share exactly."""
    return {k: v for k, v in row.items() if k not in ("time", "fps") and not k.startswith("t_")}


@pytest.mark.parametrize("flags", [COMPILED, EAGER], ids=["compile", "eager"])
def test_smoke(smoke, flags):
    """The PPO schema and the teacher's fields: its update's statistics every iteration, its return where it was
    measured (the first iteration, every 2nd, the last), the last one in summary.json."""
    rows, summary = check_ppo_smoke_logs(smoke[SCRIPT, flags], SCRIPT, flags, "CartPole-v1", 2.5e-4)
    for row in rows:
        assert all(math.isfinite(row[k]) for k in TEACHER_FIELDS), row
    assert [r["iteration"] for r in rows if r["teacher_return"] is not None] == [1, 2, 4]
    assert all(r["teacher_return"] > 0 for r in rows if r["teacher_return"] is not None)
    assert summary["teacher_return"] == rows[-1]["teacher_return"]
    assert summary["flags"]["teacher_hidden_dim"] == 32 and summary["flags"]["student_hidden_dim"] == 64


def test_student_learns_as_in_the_base(smoke):
    """The student is the base's agent and learns as in the base: with the teacher beside it, the eager run's every
    number the base logs is the base's, exactly (the teacher draws nothing from the loop's generator)."""
    rows = read_metrics(smoke[SCRIPT, EAGER][1])
    base = read_metrics(smoke[BASE, ()][1])
    assert len(rows) == len(base) == 4
    for row, expected in zip(rows, base):
        assert {k: row[k] for k in same_numbers(expected)} == same_numbers(expected)
    assert read_summary(smoke[SCRIPT, EAGER][1])["final_return"] == read_summary(smoke[BASE, ()][1])["final_return"]


def test_resume_continues_with_the_teacher(tmp_path):
    """--save-model, then --resume: iterations and steps go on from the checkpoint, and the resumed iterations are
    those of one run straight through, the teacher's statistics and return included (its weights and Adam state were
    restored). A constant lr: annealed, a 4-iteration run's lr is not the first 4 iterations' of a 6-iteration one.
    The resumed run also measures the teacher at its first iteration, so that row's return is left out."""
    flags = (*TEACHER, "--no-anneal-lr")
    first = tmp_path / "first"
    run_script(SCRIPT, *SMOKE, "--num-threads", "1", *flags, "--save-model", log_dir=first)
    ckpt = resume_ppo_smoke(SCRIPT, first, tmp_path / "resumed", *flags)
    assert {"teacher", "teacher_optimizer"} <= ckpt.keys()
    straight = tmp_path / "straight"
    run_script(SCRIPT, *SMOKE[:4], "--total-timesteps", "384", "--num-threads", "1", *flags, log_dir=straight)
    resumed = read_metrics(tmp_path / "resumed")
    expected = read_metrics(straight)[4:]
    assert [r["teacher_return"] is not None for r in resumed] == [True, True]
    resumed[0].pop("teacher_return")
    expected[0].pop("teacher_return")
    assert [same_numbers(r) for r in resumed] == [same_numbers(r) for r in expected]
    assert_rejected(
        SCRIPT,
        [*SMOKE[:4], "--resume", str(first / "agent.pt"), "--teacher-hidden-dim", "64"],
        ["--teacher-hidden-dim"],
        tmp_path / "other-teacher",
    )


def fixed_batch(n: int = 256):
    """A batch as the student leaves it: observations, its actions and their log-probabilities under a confident
    policy (so that the ratio pi_teacher / pi_student is clipped on both sides on some steps), advantages, returns."""
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(n, 4, generator=g)
    actions = torch.randint(0, 2, (n,), generator=g)
    student_logprobs = (2.0 * torch.randn(n, 2, generator=g)).log_softmax(-1).gather(-1, actions[:, None]).squeeze(-1)
    return obs, actions, student_logprobs, torch.randn(n, generator=g), torch.randn(n, generator=g)


def make_teacher(ts, seed: int):
    torch.manual_seed(seed)
    teacher = ts.Agent(4, 2, 32, 2)
    torch.nn.init.orthogonal_(teacher.actor[-1].weight, 1.0)  # logits far from uniform: ratios far from 1
    return teacher


def reference_teacher_steps(teacher, args, obs, actions, student_logprobs, advantages, returns, minibatches):
    """The teacher's update written out with plain autograd and torch.optim.Adam: PPO with the student as the
    behaviour policy (the ratio pi_teacher / pi_student), the advantages normalized per minibatch, the value clipped
    around the teacher's own values before the update, the entropy bonus, gradient clipping and Adam. Returns each
    step's (pg_loss, v_loss)."""
    optimizer = torch.optim.Adam(teacher.parameters(), lr=args.learning_rate, eps=1e-5)
    with torch.no_grad():
        old_values = teacher.critic(obs).squeeze(-1)
    losses = []
    for inds in minibatches:
        dist = Categorical(logits=teacher.actor(obs[inds]))
        ratio = torch.exp(dist.log_prob(actions[inds]) - student_logprobs[inds])
        adv = (advantages[inds] - advantages[inds].mean()) / (advantages[inds].std() + 1e-8)
        low, high = 1 - args.clip_coef, 1 + args.clip_coef
        pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, low, high)).mean()
        value = teacher.critic(obs[inds]).squeeze(-1)
        clipped = old_values[inds] + torch.clamp(value - old_values[inds], -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((value - returns[inds]) ** 2, (clipped - returns[inds]) ** 2).mean()
        loss = pg_loss - args.ent_coef * dist.entropy().mean() + args.vf_coef * v_loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(teacher.parameters(), args.max_grad_norm)
        optimizer.step()
        losses.append(torch.stack([pg_loss, v_loss]).detach())
    return losses


def script_teacher_steps(ts, teacher, args, obs, actions, student_logprobs, advantages, returns, minibatches, unit):
    """The script's path for the same steps: the teacher's values before its update, then `unit` (the update, eager
    or compiled) per minibatch on the student's log-probabilities and advantages. Returns each step's statistics."""
    with torch.no_grad():
        old_values = teacher.get_value(obs)
    data = (obs, actions, student_logprobs, advantages, returns, old_values)
    return [unit(*data, inds) for inds in minibatches]


def test_teacher_update_matches_eager_reference(ts):
    """Four minibatch steps of the script's update unit (func.grad + functional Adam, the teacher's own optimizer
    state) on a fixed batch equal the reference's: the losses of each step and the parameters after the last."""
    args = ts.Args()
    obs, actions, student_logprobs, advantages, returns = fixed_batch()
    minibatches = torch.randperm(256, generator=torch.Generator().manual_seed(2)).view(4, -1)
    teacher = make_teacher(ts, 0)
    lr = torch.tensor(args.learning_rate)
    unit = functools.partial(ts.update, teacher, ts.make_optimizer(teacher, lr, capturable=False), args)
    stats = script_teacher_steps(
        ts, teacher, args, obs, actions, student_logprobs, advantages, returns, minibatches, unit
    )
    reference = make_teacher(ts, 0)
    with torch.no_grad():
        ratio = (Categorical(logits=reference.actor(obs)).log_prob(actions) - student_logprobs).exp()
    low, high = 1 - args.clip_coef, 1 + args.clip_coef
    assert (ratio < low).any() and (ratio > high).any()  # the clip is exercised on both sides
    expected = reference_teacher_steps(
        reference, args, obs, actions, student_logprobs, advantages, returns, minibatches
    )
    for got, want in zip(stats, expected):
        torch.testing.assert_close(got[2:4], want, rtol=1e-5, atol=1e-6)
    moved = [not torch.equal(p, q) for p, q in zip(teacher.parameters(), make_teacher(ts, 0).parameters())]
    assert all(moved)
    for p, q in zip(teacher.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_compiled_units_run_each_networks_graph(ts):
    """The student's and the teacher's updates are one function compiled twice, as main compiles them: with the
    guards skipped (main's stance after an iteration's first minibatch), each call must still run its own network's
    graph.
    Dynamo's eager backend: the dispatch between cached graphs is what is tested, not Inductor's code."""
    args = ts.Args()
    obs, actions, student_logprobs, advantages, returns = fixed_batch()
    minibatches = torch.randperm(256, generator=torch.Generator().manual_seed(2)).view(4, -1)
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        teacher = make_teacher(ts, 0)
        torch.manual_seed(0)
        nets = [ts.Agent(4, 2), teacher]
        units = []
        for net in nets:
            lr = torch.tensor(args.learning_rate)
            unit = functools.partial(ts.update, net, ts.make_optimizer(net, lr, capturable=False), args)
            units.append(torch.compile(unit, backend="eager", dynamic=False) if compiled else unit)
        out = []
        for step, inds in enumerate(minibatches):
            for net, unit in zip(nets, units):
                with torch.no_grad():
                    old_logprobs, _, old_values = net(obs, actions)
                with torch.compiler.set_stance(skip_guard_eval_unsafe=step > 0):
                    out.append(unit(obs, actions, old_logprobs, advantages, returns, old_values, inds))
        results.append((out, [p.detach().clone() for net in nets for p in net.parameters()]))
    (eager_stats, eager_params), (compiled_stats, compiled_params) = results
    for a, b in zip(eager_stats + eager_params, compiled_stats + compiled_params):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


BAD_INPUT = [
    (["--teacher-hidden-dim", "0"], ["--teacher-hidden-dim"]),
    (["--teacher-hidden-depth", "-1"], ["--teacher-hidden-depth"]),
    (["--student-hidden-dim", "-64"], ["--student-hidden-dim"]),
    (["--student-hidden-depth", "0"], ["--student-hidden-depth"]),
    (["--eval-every", "0"], ["--eval-every"]),
    (["--eval-episodes", "0"], ["--eval-episodes"]),
    (["--teacher-learning-rate", "0"], ["--teacher-learning-rate"]),
    (["--teacher-hidden-dim", "wide"], ["--teacher-hidden-dim"]),
]


@pytest.mark.parametrize("flags,words", BAD_INPUT, ids=[" ".join(f) for f, _ in BAD_INPUT])
def test_bad_input(flags, words, log_dir):
    assert_rejected(SCRIPT, flags, words, log_dir)
