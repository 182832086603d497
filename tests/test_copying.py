"""doc/copying.md's copies of the one-graph update and its compile block into CleanRL's files (doc/copying/
ppo_update.patch into ppo.py, ppo_continuous_update.patch into ppo_continuous_action.py): each applies to today's
baseline, pastes the torchcompile script's units as they are, and the copy trains as the baseline does (its autograd
step, the independent reference), so the speed bench_copy.py measures is the speed of the same training."""

import ast
import importlib.util
import os
import re
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import ROOT, read_metrics, run_command

sys.path.insert(0, str(ROOT / "leanrl" / "tools"))
import bench_copy  # noqa: E402

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
TINY += ["--total-timesteps", "128", "--seed", "3"]
# HalfCheetah is chaotic: the update's rounding (parameters 1e-8 apart after one iteration) moves the next rollout's
# losses by ~1%; Reacher's damped arm keeps the two runs at rounding
FLAGS = {
    "ppo": TINY,
    "ppo_continuous_action": ["--env-id", "Reacher-v4", "--num-envs", "1", "--num-steps", "64", *TINY[4:]],
}
LOSSES = ("approx_kl", "clipfrac", "pg_loss", "v_loss", "entropy")
UNITS = ("ppo_loss", "update", "make_optimizer", "adam_step", "Agent.forward")


def units(text: str) -> dict:
    """The module's functions and Agent's methods by name, as code: their ASTs without the docstrings."""
    tree = ast.parse(text)
    nodes = [(n.name, n) for n in tree.body if isinstance(n, ast.FunctionDef)]
    for agent in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Agent"):
        nodes += [(f"Agent.{n.name}", n) for n in agent.body if isinstance(n, ast.FunctionDef)]
    found = {}
    for name, node in nodes:
        if ast.get_docstring(node) is not None:
            node.body = node.body[1:]
        found[name] = ast.dump(node)
    return found


@pytest.mark.parametrize("family", sorted(bench_copy.FAMILIES))
def test_the_patch_pastes_the_scripts_units_as_they_are(tmp_path, family):
    """The functions a patch pastes are the torchcompile script's (docstrings aside), and so are the compile call, its
    options and the minibatch loop's set_stance line: a change to the script that the patch misses fails here."""
    ours = (ROOT / "leanrl" / bench_copy.FAMILIES[family].ours).read_text()
    copied = bench_copy.copy_script(tmp_path, family).read_text()
    theirs, mine = units(copied), units(ours)
    for name in UNITS:
        assert theirs[name] == mine[name], name
    lines = {line.strip() for line in copied.splitlines()}
    block = re.compile(r"options = |update_minibatch = torch\.compile\(|set_stance\(skip_guard_eval_unsafe")
    wanted = [line.strip() for line in ours.splitlines() if block.search(line)]
    assert any("set_stance" in line for line in wanted) and any("torch.compile" in line for line in wanted)
    assert [line for line in wanted if line not in lines] == []


@pytest.mark.parametrize("family", sorted(bench_copy.FAMILIES))
def test_the_copied_update_trains_as_the_baseline(tmp_path, family):
    copied = bench_copy.copy_script(tmp_path / "copy", family)
    text = copied.read_text()
    assert "def adam_step(" in text and "update_minibatch = torch.compile(update_minibatch" in text
    env = dict(os.environ, PYTHONPATH=str(ROOT / "leanrl"))
    rows = {}
    for name, script in (("baseline", ROOT / "leanrl" / bench_copy.FAMILIES[family].baseline), ("copy", copied)):
        log_dir = tmp_path / name
        cmd = [sys.executable, script, *FLAGS[family], "--log-dir", log_dir]
        proc = run_command(cmd, tmp_path / f"{name}.out", 300, env)
        assert proc.returncode == 0, proc.stderr
        rows[name] = read_metrics(log_dir)
    assert len(rows["baseline"]) == len(rows["copy"]) == 2
    for ours, theirs in zip(rows["copy"], rows["baseline"]):
        assert ours["lr"] == pytest.approx(theirs["lr"])  # CleanRL's annealing, in place
        for key in LOSSES:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key


def test_cleanrl_float_lr_line_trains_as_eager_under_compile(tmp_path):
    """CleanRL's own annealing line (`optimizer.param_groups[0]["lr"] = frac * args.learning_rate`, a new float each
    iteration) in the copy, compiled: every iteration's step takes that iteration's lr, as ppo.py's eager Adam does.
    Skipped guards used to keep the first iteration's lr for the whole run (issue 58)."""
    copied = bench_copy.copy_script(tmp_path / "copy")
    text = copied.read_text()
    ours = "lr.fill_(frac * args.learning_rate)"
    assert ours in text
    copied.write_text(text.replace(ours, 'optimizer.param_groups[0]["lr"] = frac * args.learning_rate'))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "leanrl"))
    flags = [*TINY[:-4], "--total-timesteps", "256", "--seed", "3", "--save-model"]
    states = {}
    rows = {}
    for name, script, extra in (("ppo", ROOT / "leanrl" / "ppo.py", []), ("copy", copied, ["--compile"])):
        log_dir = tmp_path / name
        cmd = [sys.executable, script, *flags, *extra, "--log-dir", log_dir]
        proc = run_command(cmd, tmp_path / f"{name}.out", 400, env)
        assert proc.returncode == 0, proc.stderr
        rows[name] = read_metrics(log_dir)
        states[name] = torch.load(log_dir / "agent.pt", weights_only=True)["agent"]
    assert len(rows["copy"]) == 4
    lrs = [row["lr"] for row in rows["ppo"]]
    assert lrs[1] < lrs[0] and lrs[3] < lrs[2]  # the schedule moves every iteration
    for row, reference in zip(rows["copy"], rows["ppo"]):
        for key in LOSSES:
            assert row[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), (row["iteration"], key)
    for key, value in states["ppo"].items():
        torch.testing.assert_close(states["copy"][key], value, rtol=1e-4, atol=1e-6, msg=key)


def guide_function(name: str):
    """The function `name` as doc/copying.md writes it: its Python block, run."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "doc" / "copying.md").read_text(), re.S)
    (code,) = [b for b in blocks if f"def {name}(" in b]
    namespace = dict(np=np, nn=nn, torch=torch)
    exec(code, namespace)
    return namespace[name]


def cleanrl_env(gamma: float):
    """CleanRL's make_env wrappers (gymnasium 1.4's API), around Pendulum-v1: a continuous env without MuJoCo."""
    env = gym.make("Pendulum-v1")
    env = gym.wrappers.FlattenObservation(env)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    return gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))


def test_the_guides_gaussian_acting_behind_gymnasiums_wrappers(tmp_path):
    """doc/copying.md's numpy Gaussian policy acting in CleanRL's wrapped envs (the wrappers normalize; the policy step
    is what changes): each action is actor_mean's torch output plus the step's row of the rollout's noise; the
    batched Agent.forward afterwards gives the log-probs and values CleanRL's per-step get_action_and_value gives for
    the same actions; an optimizer step is seen without a copy."""
    policy_of = guide_function("numpy_gaussian_policy")
    copied = bench_copy.copy_script(tmp_path, "ppo_continuous_action")  # the user's Agent: CleanRL's, plus forward
    spec = importlib.util.spec_from_file_location("ppo_continuous_action_copied", copied)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps, num_envs = 48, 2
    envs = gym.vector.SyncVectorEnv(
        [lambda: cleanrl_env(0.99)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    torch.manual_seed(1)
    n_obs, n_actions = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    agent = module.Agent(n_obs, n_actions)
    with torch.no_grad():
        agent.actor_logstd.fill_(-0.5)  # a std other than 1
    policy = policy_of(agent.actor_mean)
    obs = np.empty((steps, num_envs, n_obs), np.float32)
    actions = np.empty((steps, num_envs, n_actions), np.float32)
    with torch.no_grad():
        noise = (agent.actor_logstd.exp() * torch.randn(actions.shape)).numpy()
    next_obs, _ = envs.reset(seed=1)
    for step in range(steps):
        obs[step] = next_obs
        actions[step] = policy(next_obs, noise[step])
        with torch.no_grad():
            mean = agent.actor_mean(torch.Tensor(next_obs))
        torch.testing.assert_close(torch.from_numpy(actions[step]), mean + torch.from_numpy(noise[step]))
        next_obs, *_ = envs.step(actions[step])
    with torch.no_grad():
        logprobs, _, values = agent(torch.from_numpy(obs), torch.from_numpy(actions))
        for step in range(steps):
            x, a = torch.from_numpy(obs[step]), torch.from_numpy(actions[step])
            _, logprob, _, value = agent.get_action_and_value(x, a)
            torch.testing.assert_close(logprobs[step], logprob)
            torch.testing.assert_close(values[step], value.flatten())
    envs.close()
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.1)
    agent.actor_mean(torch.from_numpy(obs[0])).square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        mean = agent.actor_mean(torch.from_numpy(obs[0]))
    torch.testing.assert_close(torch.from_numpy(policy(obs[0], np.zeros(n_actions, np.float32))), mean)
