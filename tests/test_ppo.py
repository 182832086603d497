"""Classic-control PPO: ppo.py (eager baseline) and ppo_torchcompile.py."""

import copy
import functools
import signal
import sys

import numpy as np
import pytest
import torch
from tensordict import from_module

from conftest import (
    PPO_ROW_FIELDS,
    SMOKE,
    SUMMARY_FIELDS,
    assert_rejected,
    assert_user_error,
    load_script,
    read_metrics,
    read_metrics_so_far,
    read_summary,
    run_command,
    run_script,
    start_script,
)

SCRIPTS = ["ppo.py", "ppo_torchcompile.py"]


@pytest.fixture(scope="module")
def tc():
    return load_script("ppo_torchcompile")


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", [None, "--compile", "--cudagraphs"])
def test_smoke(script, flag, log_dir):
    proc = run_script(script, *SMOKE, *([flag] if flag else []), log_dir=log_dir)
    rows, summary = read_metrics(log_dir), read_summary(log_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["global_step"] == 256
    assert all(PPO_ROW_FIELDS <= r.keys() for r in rows)
    assert [r["fps"] is None for r in rows] == [True, True, True, False]  # burn-in of 3 iterations
    assert rows[-1]["fps"] > 0 and rows[-1]["episodic_return"] > 0
    assert SUMMARY_FIELDS <= summary.keys()
    assert summary["flags"]["compile"] == (flag == "--compile")
    assert (summary["compile_time"] is not None) == (flag == "--compile")
    if flag == "--cudagraphs":  # no CUDA here: one line says so, and the run goes on
        assert "--cudagraphs ignored" in proc.stderr
    # a compiled run says, once, that its first iteration compiles
    assert proc.stderr.count("compiling the units on their first call") == (flag == "--compile")


def test_track_logs_to_wandb(monkeypatch, log_dir):
    """--track: the run goes to Weights and Biases (offline here: CI has no account), the same rows as metrics.jsonl."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_script("ppo_torchcompile.py", *SMOKE, "--track", log_dir=log_dir)
    runs = list((log_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert len(read_metrics(log_dir)) == 4


def numpy_gae(rewards, dones, values, next_value, next_done, gamma, lam):
    """Textbook GAE, written independently of the scripts: A_t = sum_k (gamma*lam)^k delta_{t+k}, cut at episode
    ends."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                alive_next = 1.0 - (next_done[n] if k == T - 1 else dones[k + 1, n])
                v_next = next_value[n] if k == T - 1 else values[k + 1, n]
                total += discount * (rewards[k, n] + gamma * v_next * alive_next - values[k, n])
                discount *= gamma * lam * alive_next
                if alive_next == 0:
                    break
            adv[t, n] = total
    return adv


def test_gae_matches_numpy_reference(tc):
    """The torchcompile script's GAE (its recursion over numpy rows) against an independent reference."""
    rng = np.random.default_rng(0)
    T, N, gamma, lam = 32, 3, 0.99, 0.95
    rewards, values = rng.normal(size=(T, N)), rng.normal(size=(T, N))
    dones = (rng.random((T, N)) < 0.15).astype(np.float64)
    next_value, next_done = rng.normal(size=N), np.array([0.0, 1.0, 0.0])
    gae = tc.gae
    f32 = functools.partial(torch.tensor, dtype=torch.float32)
    adv, ret = gae(f32(next_value), f32(next_done), f32(rewards), f32(dones), f32(values), gamma, lam)
    expected = numpy_gae(rewards, dones, values, next_value, next_done, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-4, atol=1e-4)


def make_update_state(tc, seed):
    torch.manual_seed(seed)
    agent = tc.Agent(4, 2)
    lr = torch.tensor(2.5e-4)
    return agent, tc.make_optimizer(agent, lr, capturable=False), lr


def random_batch(n):
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn(n, 4, generator=g),
        torch.randint(0, 2, (n,), generator=g),
        -torch.rand(n, generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, generator=g),
    ]


def test_update_matches_eager_autograd_step(tc):
    """The func.grad + functional-Adam `update` equals the plain loss.backward(); clip; Adam.step() of ppo.py."""
    args = tc.Args()
    agent, optimizer, lr = make_update_state(tc, 0)
    torch.manual_seed(0)
    reference = tc.Agent(4, 2)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=2.5e-4, eps=1e-5)
    batch = random_batch(512)
    inds = torch.randperm(512)[:128]
    for _ in range(3):  # a few steps, so Adam's moments and bias correction are exercised
        stats = tc.update(agent, optimizer, args, *batch, inds)
        loss, ref_stats = tc.ppo_loss(dict(reference.named_parameters()), reference, args, *(x[inds] for x in batch))
        ref_opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), args.max_grad_norm)
        ref_opt.step()
        torch.testing.assert_close(stats[:5], ref_stats, rtol=1e-5, atol=1e-6)
    for p, q in zip(agent.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def eager_and_compiled_update(tc, make_state, batch, inds, compile):
    """One update from the same state (`make_state(tc, 0)`), eager and through `compile`: for each, the stats, the
    parameters and Adam's second moments (tests/test_ppo_continuous_action.py uses this too)."""
    results = []
    for compiled in (False, True):
        agent, optimizer, lr = make_state(tc, 0)
        update = functools.partial(tc.update, agent, optimizer, tc.Args())
        stats = (compile(update) if compiled else update)(*batch, inds)
        results.append(
            (
                stats,
                [p.detach().clone() for p in agent.parameters()],
                [optimizer.state[p]["exp_avg_sq"].clone() for p in agent.parameters()],
            )
        )
    assert not torch.equal(results[0][1][0], next(make_state(tc, 0)[0].parameters()))  # the step did move them
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)  # the losses
    return results


def test_compiled_update_matches_eager(tc):
    """Same seed and state: the compiled update gives the eager update's losses and parameters.
    Tolerance: float32 with the reductions reordered by inductor, a few ulps on O(1) values."""
    compile = functools.partial(torch.compile, options=dict(cpp_wrapper=True, max_autotune=True))
    (_, p0, v0), (_, p1, v1) = eager_and_compiled_update(
        tc, make_update_state, random_batch(512), torch.randperm(512)[:128], compile
    )
    for a, b in zip(p0 + v0, p1 + v1):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_gumbel_max_sampling_matches_categorical(tc):
    """act() samples argmax(logits + Gumbel noise): its action frequencies are the softmax probabilities."""
    torch.manual_seed(0)
    agent = tc.Agent(4, 3)
    with torch.no_grad():
        agent.actor[4].bias.copy_(torch.tensor([1.0, 0.0, -1.0]))
    n = 200_000
    x = torch.zeros(n, 4)
    actions = tc.act(agent.actor, x, -torch.empty(n, 3).exponential_().log())
    freq = torch.bincount(actions, minlength=3) / n
    expected = agent.actor(x[:1]).softmax(-1)[0].detach()
    torch.testing.assert_close(freq, expected, rtol=0, atol=0.005)  # ~5 standard errors at n=200k


def linear_tensors(module):
    return [t for m in module.modules() if isinstance(m, torch.nn.Linear) for t in (m.weight, m.bias)]


def is_current_copy(acting, learner) -> bool:
    """`acting` holds `learner`'s parameters, in storage of its own and without autograd."""
    return all(
        torch.equal(p, q) and p.data_ptr() != q.data_ptr() and not q.requires_grad
        for p, q in zip(linear_tensors(learner), linear_tensors(acting), strict=True)
    )


def run_main_recording(tc, tmp_path, monkeypatch, **flags):
    """main() of the script in this process for one iteration (1 env x 64 steps), recording the Agents it builds (the
    learner, then the inference copy) and the policy each rollout acts with."""
    agents, policies = [], []

    class RecordedAgent(tc.Agent):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            agents.append(self)

    def recorded_rollout(envs, policy, *a):
        policies.append(policy)
        return rollout(envs, policy, *a)

    rollout = tc.rollout
    monkeypatch.setattr(tc, "Agent", RecordedAgent)
    monkeypatch.setattr(tc, "rollout", recorded_rollout)
    args = tc.Args(num_envs=1, num_steps=64, total_timesteps=64, log_dir=str(tmp_path / "run"), **flags)
    tc.main(args)
    return agents, policies


def test_inference_copy_shares_storage_without_grad(tc, tmp_path, monkeypatch):
    """On a CPU the learner's units and the rollout use the inference copy: the agent's storage, no autograd, nothing
    to refresh (the host copy of --host-actor is for a CUDA learner). Checked on what main() builds."""
    (agent, agent_inference), [policy] = run_main_recording(tc, tmp_path, monkeypatch, numpy_act=False)
    pairs = list(zip(linear_tensors(agent), linear_tensors(agent_inference)))
    assert len(pairs) == 12 and all(p.data_ptr() == q.data_ptr() and not q.requires_grad for p, q in pairs)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    g = -np.log(rng.exponential(size=(300, 2))).astype(np.float32)
    before = policy(x, torch.from_numpy(g))
    with torch.no_grad():
        agent.actor[0].weight.add_(1.0)
        agent.actor[4].bias.add_(torch.tensor([3.0, -3.0]))
    assert torch.equal(agent.actor[0].weight, agent_inference.actor[0].weight)
    after = policy(x, torch.from_numpy(g))  # the rollout's step acts with the learner's weights as they are now
    assert (after != before).any()
    assert np.array_equal(after, tc.act(agent.actor, torch.from_numpy(x), torch.from_numpy(g)).detach().numpy())


def cartpole_rollout(tc, policy, num_envs=2, num_steps=48, seed=3, numpy_act=False) -> dict:
    """The buffers of one rollout from a fixed seed (envs and Gumbel noise), acting with `policy` on the CPU (a torch
    policy, in the rollout's form as main builds it, or a numpy one with `numpy_act`)."""
    if not numpy_act:
        policy = functools.partial(tc.torch_step, policy, torch.device("cpu"))
    args = tc.Args(num_envs=num_envs, num_steps=num_steps)
    envs = tc.make_envs(args, "")
    shape = (num_steps, num_envs)
    buf = dict(
        obs=torch.zeros(shape + (4,)),
        actions=torch.zeros(shape, dtype=torch.long),
        dones=torch.zeros(shape),
        rewards=torch.zeros(shape),
    )
    tc.rollout(
        envs,
        policy,
        torch.device("cpu"),
        numpy_act,
        envs.reset(seed=seed)[0],
        np.zeros(num_envs, dtype=bool),
        buf,
        2,
        torch.Generator().manual_seed(seed),
    )
    envs.close()
    return buf


def assert_same_buffers(a: dict, b: dict, same: bool = True):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a) == same, {k: torch.equal(a[k], b[k]) for k in a}


def test_host_copy_acts_as_the_learner_and_refresh_brings_the_updates(tc):
    """--host-actor (a CUDA learner) acts with a host copy of the actor, refreshed after the updates. Here the copy is
    made on the CPU explicitly, with storage of its own: a rollout acting with it fills the buffers that one acting
    with the learner's actor fills, exactly; after updates a stale copy's rollout differs, and a refreshed one is
    the learner's again. Large steps (lr 0.05) move the policy far from uniform, where a wrong weight flips actions."""
    torch.manual_seed(0)
    agent = tc.Agent(4, 2)
    agent_inference = tc.Agent(4, 2)  # as main() builds it: the learner's storage, no autograd
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    lr = torch.tensor(0.05)
    update = functools.partial(tc.update, agent, tc.make_optimizer(agent, lr, capturable=False), tc.Args())
    policy = functools.partial(tc.act, agent_inference.actor)
    batch = random_batch(512)

    def train():
        for _ in range(3):
            update(*batch, torch.randperm(512)[:128])

    train()
    acting = tc.host_copy(agent.actor, torch.device("cpu"))
    copy_policy = functools.partial(tc.act, acting)
    assert is_current_copy(acting, agent.actor)
    assert_same_buffers(cartpole_rollout(tc, copy_policy), cartpole_rollout(tc, policy))
    train()
    learner = cartpole_rollout(tc, policy)
    assert not is_current_copy(acting, agent.actor)
    assert_same_buffers(cartpole_rollout(tc, copy_policy), learner, same=False)  # stale: acts otherwise
    numpy_copy_policy = tc.numpy_policy(acting)  # views of the stale copy: the refresh must reach them
    tc.refresh(acting, agent.actor)
    assert is_current_copy(acting, agent.actor)
    assert_same_buffers(cartpole_rollout(tc, copy_policy), learner)
    assert_same_buffers(cartpole_rollout(tc, numpy_copy_policy, numpy_act=True), learner)


def test_numpy_policy_acts_as_torch_and_follows_the_learner(tc, tmp_path, monkeypatch):
    """--numpy-act (on by default where the policy acts on a CPU): on fixed inputs the numpy policy picks the torch
    policy's actions, before and after updates that change them, because it reads views of the weights. A policy on
    a copy of the weights taken once would act on stale weights: it must fail this test (checked below)."""
    torch.manual_seed(0)
    agent = tc.Agent(4, 2)
    agent_inference = tc.Agent(4, 2)
    from_module(agent).data.to_module(agent_inference, preserve_module_state=False)
    lr = torch.tensor(0.05)
    update = functools.partial(tc.update, agent, tc.make_optimizer(agent, lr, capturable=False), tc.Args())
    numpy_policy = tc.numpy_policy(agent_inference.actor)
    taken_once = tc.numpy_policy(copy.deepcopy(agent_inference.actor))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(300, 4)).astype(np.float32)
    gumbel = -np.log(rng.exponential(size=(300, 2))).astype(np.float32)

    def torch_actions():
        return tc.act(agent_inference.actor, torch.from_numpy(obs), torch.from_numpy(gumbel)).numpy()

    before = torch_actions()
    assert np.array_equal(numpy_policy(obs, gumbel), before)
    batch = random_batch(512)
    for _ in range(3):
        update(*batch, torch.randperm(512)[:128])
    after = torch_actions()
    assert (after != before).any()  # the updates changed the policy
    assert np.array_equal(numpy_policy(obs, gumbel), after)
    assert not np.array_equal(taken_once(obs, gumbel), after)
    torch_policy = functools.partial(tc.act, agent_inference.actor)
    assert_same_buffers(cartpole_rollout(tc, numpy_policy, numpy_act=True), cartpole_rollout(tc, torch_policy))
    # what main() acts with by default on a CPU: a numpy policy over the inference copy's actor
    (_, recorded_inference), [policy] = run_main_recording(tc, tmp_path, monkeypatch)
    assert not isinstance(policy, functools.partial)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    g = np.zeros((3, 2), np.float32)
    assert np.array_equal(policy(x, g), tc.act(recorded_inference.actor, torch.from_numpy(x), torch.from_numpy(g)))


def test_learns_cartpole(tmp_path):
    """CartPole-v1 solved (mean of the last 20 episodes >= 475) within the default 500k steps, compiled, seed 1."""
    log_dir = tmp_path / "learn"
    run_script("ppo_torchcompile.py", "--compile", "--seed", "1", log_dir=log_dir, timeout=900)
    rows = read_metrics(log_dir)
    assert rows[-1]["global_step"] <= 500000
    best = max(r["episodic_return"] or 0 for r in rows)
    assert best >= 475, f"best mean return {best}"


BAD_INPUT = [
    (["--env-id", "NoSuchEnv-v9"], ["unknown env id"]),
    (["--env-id", "Breakout-v5"], ["Atari", "ppo_atari_envpool.py"]),
    (["--env-id", "Pendulum-v1"], ["continuous-action", "ppo_continuous_action.py"]),
    (["--num-minibatches", "3"], ["does not divide"]),
    (["--total-timesteps", "0"], ["--total-timesteps"]),
    (["--resume", "/nonexistent/agent.pt"], ["no such file"]),
    (["--total-timestep", "10"], ["unrecognized"]),
    (["--num-envs", "four"], ["--num-envs"]),
]


@pytest.mark.parametrize("script", [*SCRIPTS, "ppo_compile_async_torchcompile.py"])  # its checks are the base's
@pytest.mark.parametrize("flags,words", BAD_INPUT, ids=[" ".join(f) for f, _ in BAD_INPUT])
def test_bad_input(script, flags, words, log_dir):
    assert_rejected(script, flags, words, log_dir)


def test_ctrl_c_before_the_first_iteration_stops_at_once(tmp_path):
    """Before any iteration has finished there is nothing to save and a compile can hold the process for minutes:
    Ctrl-C ends it at once (130, one line). After one, the first Ctrl-C only asks the loop to stop."""
    code = (
        "import os, signal, sys, time; sys.path.insert(0, 'leanrl'); import plumbing\n"
        "stop = plumbing.StopFlag(); stop.logged = True; os.kill(os.getpid(), signal.SIGINT); time.sleep(0.5)\n"
        "print('asked', stop.set, flush=True); stop = plumbing.StopFlag(); os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(60); print('not stopped')"
    )
    proc = run_command([sys.executable, "-c", code], tmp_path / "stop", timeout=120)
    assert proc.returncode == 130 and proc.stdout == "asked True\n", (proc.stdout, proc.stderr)
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [
        "stopping at the next log line (Ctrl-C again: stop now, no checkpoint)",
        "stopped before the first log line: nothing to save",
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_then_resume_matches_uninterrupted(script, tmp_path):
    """Ctrl-C stops after the iteration with logs and a checkpoint; resuming it reaches the parameters of a run
    that was never interrupted, bit for bit (eager mode: the same ops in the same order; the checkpoint carries
    the RNG and the classic-control env state)."""
    flags = [
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--total-timesteps",
        str(64 * 300),
        "--save-model",
        "--num-threads",
        "1",
    ]
    first = tmp_path / "first"
    proc = start_script(script, *flags, log_dir=first)
    proc.wait_until(lambda: len(read_metrics_so_far(first)) >= 5, 300, "5 iterations in metrics.jsonl")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120, "the exit after Ctrl-C") == 130, proc.stderr[-2000:]
    stopped_at = len(read_metrics(first))
    assert 5 <= stopped_at < 300 and read_summary(first)["interrupted"]
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    assert ckpt["iteration"] == stopped_at

    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    run_script(script, *flags, "--resume", str(first / "agent.pt"), log_dir=resumed)
    run_script(script, *flags, log_dir=straight)
    assert read_metrics(resumed)[0]["iteration"] == stopped_at + 1
    a = torch.load(resumed / "agent.pt", weights_only=True)
    b = torch.load(straight / "agent.pt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 64 * 300
    for key in b["agent"]:
        assert torch.equal(a["agent"][key], b["agent"][key]), key
    assert read_metrics(resumed)[-1]["episodic_return"] == read_metrics(straight)[-1]["episodic_return"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_rejects_other_config(script, tmp_path):
    first = tmp_path / "first"
    run_script(script, *SMOKE, "--save-model", log_dir=first)
    proc = run_script(
        script,
        *SMOKE,
        "--num-steps",
        "32",
        "--resume",
        str(first / "agent.pt"),
        log_dir=tmp_path / "second",
        check=False,
    )
    assert_user_error(proc, "--num-steps 64")


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_box2d_task_trains_and_resumes(script, tmp_path):
    """LunarLander-v3, which CleanRL's ppo.py runs (gymnasium's, with Box2D installed): a smoke run with --save-model
    and its resume go through. The checkpoint cannot hold a Box2D world (its `env` is None): the resumed run starts
    new episodes, its step count going on from the checkpoint's (issue 59)."""
    pytest.importorskip("Box2D")
    pytest.importorskip("pygame")
    first = tmp_path / "first"
    run_script(script, "--env-id", "LunarLander-v3", *SMOKE, "--num-threads", "1", "--save-model", log_dir=first)
    assert torch.load(first / "agent.pt", weights_only=True)["env"] is None
    run_script(
        script,
        *SMOKE[:4],
        "--total-timesteps",
        "384",
        "--env-id",
        "LunarLander-v3",
        "--num-threads",
        "1",
        "--resume",
        str(first / "agent.pt"),
        log_dir=tmp_path / "resumed",
    )
    assert [r["global_step"] for r in read_metrics(tmp_path / "resumed")] == [320, 384]
