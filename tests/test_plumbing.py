"""The run plumbing every training script imports (leanrl/plumbing/), tested once here: one behaviour everywhere.

The scripts' own tests check that they call it (their smoke runs' logs, resume, bad input); this module checks what
it does, against references written independently of it."""

import io
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

import gymnasium as gym
import numpy as np
import pytest
import torch

import plumbing
from conftest import PLUMBING_PROGRAM, ROOT, run_command


@dataclass
class Args:
    """A script's shared flags, as every training script has them."""

    env_id: str = "CartPole-v1"
    """the env"""
    seed: int = 1
    """the seed"""
    num_threads: int = 1
    """threads"""
    measure_burnin: int = 3
    """burn-in"""
    capture_video: bool = False
    """video"""
    resume: Optional[str] = None
    """resume"""
    log_dir: Optional[str] = None
    """log dir"""
    num_envs: int = 4
    """envs"""
    learning_rate: float = 2.5e-4
    """lr"""
    gamma: float = 0.99
    """gamma"""
    target_kl: Optional[float] = None
    """kl"""
    track: bool = False
    """wandb"""
    compile: bool = False
    """compile"""
    cuda: bool = True
    """cuda"""
    cudagraphs: bool = False
    """cudagraphs"""
    total_timesteps: int = 1000
    """budget"""


def refused(capsys, call, *args) -> str:
    """`call(*args)` is a user mistake: SystemExit(2) and one line on stderr, returned."""
    with pytest.raises(SystemExit) as e:
        call(*args)
    assert e.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_parse_args_folds_tyro_errors_into_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["x", "--num-envs", "four"])
    assert "--num-envs" in refused(capsys, plumbing.parse_args, Args)
    monkeypatch.setattr(sys, "argv", ["x", "--num-env", "4"])
    assert "unrecognized" in refused(capsys, plumbing.parse_args, Args).lower()
    monkeypatch.setattr(sys, "argv", ["x", "--num-envs", "8", "--target-kl", "0.02"])
    args = plumbing.parse_args(Args)
    assert args.num_envs == 8 and args.target_kl == 0.02


@pytest.mark.parametrize(
    "rule,name,good,bad",
    [
        (plumbing.positive, "num_envs", [1, 10**9], [0, -1]),
        (plumbing.positive_finite, "learning_rate", [1e-9, 3.0], [0.0, -1.0, float("inf"), float("nan")]),
        (plumbing.non_negative_finite, "learning_rate", [0.0, 2.0], [-1e-9, float("inf"), float("nan")]),
        (plumbing.unit_interval, "gamma", [1e-9, 1.0], [0.0, 1.0 + 1e-9, float("nan")]),
        (plumbing.probability, "gamma", [0.0, 1.0], [-1e-9, 1.0 + 1e-9, float("nan")]),
    ],
)
def test_range_rules(rule, name, good, bad, capsys):
    for value in good:
        rule(Args(**{name: value}), name)
    for value in bad:
        line = refused(capsys, rule, Args(**{name: value}), name)
        assert line.startswith(f"error: --{name.replace('_', '-')} must be") and line.endswith(f"got {value}")


def test_an_unset_optional_flag_passes_its_rule():
    plumbing.positive_finite(Args(target_kl=None), "target_kl")


@pytest.mark.parametrize(
    "env_id,family,algo,words",
    [
        ("Breakout-v5", "classic", "ppo", ["Atari", "leanrl/ppo_atari_envpool.py"]),
        ("Breakout-v5", "classic", "dqn", ["Atari", "leanrl/dqn_atari_envpool.py"]),
        ("HalfCheetah-v4", "atari", "ppo", ["continuous-action", "leanrl/ppo_continuous_action.py"]),
        ("HalfCheetah-v4", "classic", "dqn", ["continuous-action", "no DQN script"]),
        ("CartPole-v1", "mujoco", "sac", ["classic-control", "no SAC script"]),
        ("CartPole-v1", "atari", "ppo", ["classic-control", "leanrl/ppo.py"]),
        ("Pendulum-v1", "classic", "ppo", ["continuous-action", "leanrl/ppo_continuous_action.py"]),
        ("MountainCarContinuous-v0", "classic", "dqn", ["continuous-action", "no DQN script"]),
        # CleanRL's ppo.py and dqn.py run LunarLander-v3: the classic scripts take it, with or without Box2D here
        ("LunarLander-v3", "mujoco", "sac", ["discrete-action", "no SAC script"]),
        ("LunarLander-v3", "atari", "dqn", ["discrete-action", "leanrl/dqn.py"]),
        ("NoSuchEnv-v9", "mujoco", "td3", ["unknown env id", "HalfCheetah-v4"]),
        # CleanRL's own names (dqn_atari's default, the MuJoCo-v2 era's): the id to use instead (issue 59)
        ("BreakoutNoFrameskip-v4", "atari", "dqn", ["unknown env id", "--env-id Breakout-v5"]),
        ("ALE/Pong-v5", "atari", "ppo", ["--env-id Pong-v5"]),
        ("SpaceInvadersNoFrameskip-v4", "classic", "ppo", ["--env-id SpaceInvaders-v5", "leanrl/ppo_atari_envpool.py"]),
        ("Hopper-v2", "mujoco", "td3", ["unknown env id", "--env-id Hopper-v4"]),
        ("Walker2d-v2", "mujoco", "sac", ["--env-id Walker2d-v4"]),
        ("HalfCheetah-v2", "classic", "dqn", ["names it HalfCheetah-v4", "no DQN script"]),
    ],
)
def test_an_env_of_another_family_names_the_script_that_takes_it(env_id, family, algo, words, capsys):
    line = refused(capsys, plumbing.check_env_id, env_id, family, algo)
    assert f"--env-id {env_id}" in line
    for word in words:
        assert word in line, line


@pytest.mark.parametrize(
    "env_id,family",
    [
        ("CartPole-v1", "classic"),
        ("Pong-v5", "atari"),
        ("Hopper-v4", "mujoco"),
        # CleanRL's continuous scripts take any Box-action env: envpool ships these classic-control ones (issue 59)
        ("Pendulum-v1", "mujoco"),
        ("MountainCarContinuous-v0", "mujoco"),
        ("LunarLanderContinuous-v3", "mujoco"),  # envpool's own Box2D: no package to install
    ],
)
def test_an_env_of_the_family_passes(env_id, family):
    plumbing.check_env_id(env_id, family, "ppo")


def without_box2d(monkeypatch):
    """Box2D (and gymnasium's Box2D envs, which import it) not importable, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [name for name in sys.modules if name.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)


def test_a_box2d_env_without_its_packages_says_how_to_install_them(capsys, monkeypatch):
    """LunarLander-v3 for the classic scripts (gymnasium builds it) needs Box2D and pygame: one line naming the
    install, not "unknown env id" (issue 59)."""
    without_box2d(monkeypatch)
    line = refused(capsys, plumbing.check_env_id, "LunarLander-v3", "classic", "dqn")
    assert "--env-id LunarLander-v3" in line and 'pip install "gymnasium[box2d]"' in line, line


def test_a_box2d_env_with_its_packages_passes():
    pytest.importorskip("Box2D")
    pytest.importorskip("pygame")
    plumbing.check_env_id("LunarLander-v3", "classic", "ppo")


class Unsaved(gym.Env):
    """A gymnasium env whose state the checkpoint cannot hold (as Box2D's physics world): not classic control."""

    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(2, dtype=np.float32), 1.0, False, False, {}


def test_envs_a_checkpoint_cannot_hold_restart_their_episodes(tmp_path):
    """A vector env of an env whose state cannot be saved is saved as None; the checkpoint says so (`env_saved`), and a
    resume with `restart` drops the returns of the episodes in flight, one without keeps them."""
    envs = gym.vector.SyncVectorEnv([Unsaved, Unsaved])
    envs.reset(seed=0)
    episodes = plumbing.Episodes(2)
    episodes.record(np.array([1.0, 2.0]), np.array([False, True]))
    episodes.record(np.array([3.0, 4.0]), np.array([False, False]))
    path = str(tmp_path / "agent.pt")
    plumbing.save_checkpoint(path, "script_a", Args(), global_step=2, env=envs, episodes=episodes)
    ckpt = plumbing.load_checkpoint(Args(resume=path), "script_a")
    assert ckpt["env"] is None and not plumbing.env_saved(ckpt)
    restarted, kept = plumbing.Episodes(2), plumbing.Episodes(2)
    plumbing.resume(ckpt, 1, restart=True, episodes=restarted)
    plumbing.resume(ckpt, 1, restart=False, episodes=kept)
    assert list(restarted.ret) == [0.0, 0.0] and list(kept.ret) == [4.0, 4.0]
    assert list(restarted.finished) == list(kept.finished) == [2.0]
    classic = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    classic.reset(seed=0)
    plumbing.save_checkpoint(path, "script_a", Args(), global_step=2, env=classic)
    assert plumbing.env_saved(plumbing.load_checkpoint(Args(resume=path), "script_a"))


def test_check_run_resolves_and_creates_the_log_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = Args(seed=7)
    assert plumbing.check_run(args, "some_script") is None
    assert args.log_dir.startswith("runs/CartPole-v1__some_script__7__") and os.path.isdir(args.log_dir)


@pytest.mark.parametrize(
    "args,words",
    [
        (Args(seed=-1), ["--seed"]),
        (Args(seed=2**31), ["--seed"]),
        (Args(num_threads=0), ["--num-threads"]),
        (Args(measure_burnin=-1), ["--measure-burnin"]),
        (Args(capture_video=True), ["--capture-video", "envpool"]),
        (Args(log_dir="/proc/leanrl/run"), ["--log-dir", "cannot write"]),
        (Args(resume="/nonexistent/agent.pt"), ["--resume", "no such file"]),
    ],
)
def test_check_run_refuses_bad_shared_flags(args, words, capsys):
    line = refused(capsys, plumbing.check_run, args, "some_script")
    for word in words:
        assert word in line, line


def test_only_the_lead_process_creates_the_log_dir(tmp_path):
    args = Args(log_dir=str(tmp_path / "run"))
    plumbing.check_run(args, "some_script", lead=False)
    assert args.log_dir == str(tmp_path / "run") and not (tmp_path / "run").exists()


def test_a_refused_flag_leaves_no_folder_behind(tmp_path, capsys):
    log_dir = tmp_path / "run"
    refused(capsys, plumbing.check_run, Args(num_threads=0, log_dir=str(log_dir)), "some_script")
    assert not log_dir.exists()


def test_checkpoints_round_trip_and_refuse_what_is_not_theirs(tmp_path, capsys):
    path = str(tmp_path / "agent.pt")
    state = dict(weights=torch.arange(5.0), step=12)
    plumbing.save_checkpoint(path, "script_a", Args(num_envs=2), **state)
    assert sorted(os.listdir(tmp_path)) == ["agent.pt"]  # written whole, no temporary left behind
    ckpt = plumbing.load_checkpoint(Args(num_envs=2, resume=path), "script_a", same=("env_id", "num_envs"))
    assert torch.equal(ckpt["weights"], state["weights"]) and ckpt["step"] == 12
    assert ckpt["script"] == "script_a" and ckpt["args"]["num_envs"] == 2

    line = refused(capsys, plumbing.load_checkpoint, Args(resume=path), "script_b")
    assert "written by script_a.py" in line
    line = refused(capsys, plumbing.load_checkpoint, Args(num_envs=4, resume=path), "script_a", ("num_envs",))
    assert "--num-envs 2" in line and "pass the same" in line
    torch.save(dict(script="script_a", args={}, weights=torch.zeros(2)), tmp_path / "old.pt")  # before the format key
    line = refused(capsys, plumbing.load_checkpoint, Args(resume=str(tmp_path / "old.pt")), "script_a")
    assert "older version of script_a.py" in line
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    line = refused(capsys, plumbing.load_checkpoint, Args(resume=str(tmp_path / "junk.pt")), "script_a")
    assert "not a checkpoint this script wrote" in line


def atari_episodes(seed: int) -> "plumbing.AtariEpisodes":
    """An Atari episode record with a few finished games in it."""
    episodes = plumbing.AtariEpisodes(2)
    rng = np.random.default_rng(seed)
    episodes.finished.extend(rng.integers(0, 400, 5).tolist())
    episodes.lengths.extend(rng.integers(100, 9000, 5).tolist())
    return episodes


def test_an_atari_checkpoint_of_format_3_resumes(tmp_path):
    """Format 3 held an Atari run's episode record at the checkpoint's top level ("returns", "lengths"; a DDP run's in
    each rank's part; a seeds run's as "members"), format 4 under "episodes" (one part of `resume`): a file written
    before resumes as the same checkpoint written now does."""
    single, ranks = atari_episodes(1), [atari_episodes(2), atari_episodes(3)]
    members = plumbing.MemberAtariEpisodes(2, 2)
    members.members[1].finished.extend([3.0, 7.0])
    now = dict(global_step=64, episodes=single.state())
    path = tmp_path / "now.pt"
    plumbing.save_checkpoint(str(path), "script_a", Args(), global_step=64, episodes=single)
    old = dict(script="script_a", format=3, args={}, global_step=64)
    written = {
        "single": dict(old, **single.state()),
        "ddp": dict(old, ranks=[dict(rng=torch.zeros(3), **e.state()) for e in ranks]),
        "seeds": dict(old, **members.state()),
    }
    for name, ckpt in written.items():
        torch.save(ckpt, tmp_path / f"{name}.pt")
    loaded = {name: plumbing.load_checkpoint(Args(resume=str(tmp_path / f"{name}.pt")), "script_a") for name in written}
    assert loaded["single"]["episodes"].keys() == now["episodes"].keys()

    resumed = plumbing.AtariEpisodes(2)
    plumbing.resume(loaded["single"], 1, restart=True, episodes=resumed)
    assert list(resumed.finished) == list(single.finished) and list(resumed.lengths) == list(single.lengths)
    from_now = plumbing.AtariEpisodes(2)
    plumbing.resume(plumbing.load_checkpoint(Args(resume=str(path)), "script_a"), 1, restart=True, episodes=from_now)
    assert list(from_now.finished) == list(single.finished)
    for rank, episodes in enumerate(ranks):
        ckpt = dict(loaded["ddp"], **loaded["ddp"]["ranks"][rank])
        resumed = plumbing.AtariEpisodes(2)
        plumbing.resume(ckpt, 1, restart=True, episodes=resumed)
        assert list(resumed.finished) == list(episodes.finished) and list(resumed.lengths) == list(episodes.lengths)
    resumed = plumbing.MemberAtariEpisodes(2, 2)
    plumbing.resume(loaded["seeds"], 1, restart=True, episodes=resumed)
    assert list(resumed.members[1].finished) == [3.0, 7.0] and not resumed.members[0].finished


@pytest.mark.parametrize(
    "saved,part",
    [
        (torch.zeros(1), torch.zeros(4)),  # copy_ broadcast one env's obs over four
        (torch.zeros(4, dtype=torch.float64), torch.zeros(4)),  # and cast float64 to float32
        (torch.zeros(2, 3), torch.zeros(3, 2)),
        (np.zeros(4, dtype=bool), np.zeros(4, dtype=np.float32)),  # [...] = casts a done flag to a float
        (np.zeros(1), np.zeros(4)),
    ],
)
def test_resume_refuses_a_tensor_or_array_of_another_shape_or_dtype(saved, part, tmp_path, capsys):
    """A tensor or an array goes back only into one of its own shape and dtype: copy_ and [...] = would broadcast and
    cast it without a word (issue 59)."""
    path = str(tmp_path / "agent.pt")
    plumbing.save_checkpoint(path, "script_a", Args(), global_step=1, next_obs=saved)
    ckpt = plumbing.load_checkpoint(Args(resume=path), "script_a")
    line = refused(capsys, lambda: plumbing.resume(ckpt, 1, restart=False, next_obs=part))
    assert "next_obs" in line and str(tuple(saved.shape)) in line and str(tuple(part.shape)) in line, line
    same = torch.ones_like(part) if isinstance(part, torch.Tensor) else np.ones_like(part)
    plumbing.resume(dict(ckpt, next_obs=plumbing.state_of(same)), 1, restart=False, next_obs=part)
    assert (part == 1).all()


def test_a_dqn_checkpoint_of_format_3_resumes(tmp_path):
    """Format 3 held DQN's buffer position beside its rows ("buffer", "buffer_pos", "buffer_full"), format 4 the three
    under "buffer", which the script's ReplayBuffer loads: a file written before reads as one written now."""
    rows = dict(obs=torch.arange(8.0).view(4, 2), dones=torch.tensor([0.0, 1.0, 0.0, 0.0]))
    old = dict(script="script_a", format=3, args={}, global_step=3, buffer=rows, buffer_pos=3, buffer_full=False)
    torch.save(old, tmp_path / "old.pt")
    ckpt = plumbing.load_checkpoint(Args(resume=str(tmp_path / "old.pt")), "script_a")
    assert ckpt["buffer"]["pos"] == 3 and ckpt["buffer"]["full"] is False and "buffer_pos" not in ckpt
    for key, value in rows.items():
        assert torch.equal(ckpt["buffer"]["data"][key], value)


def reference_returns(rewards: np.ndarray, dones: np.ndarray, window: int) -> list:
    """Episode returns from a (steps, envs) record, env by env, in the order the episodes end."""
    ended, running = [], np.zeros(rewards.shape[1])
    for reward, done in zip(rewards, dones):
        running = running + reward
        ended += [running[i] for i in range(len(done)) if done[i]]
        running = np.where(done, 0.0, running)
    return ended[-window:]


def test_episodes_match_a_reference_and_resume():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(300, 3))
    dones = rng.random((300, 3)) < 0.05
    episodes = plumbing.Episodes(3, window=7)
    for reward, done in zip(rewards[:150], dones[:150]):
        episodes.record(reward, done)
    resumed = plumbing.Episodes(3, window=7)
    resumed.load(episodes.state(), restart=False)
    for reward, done in zip(rewards[150:], dones[150:]):
        resumed.record(reward, done)
    expected = reference_returns(rewards, dones, 7)
    assert np.allclose(list(resumed.finished), expected)
    assert resumed.mean() == pytest.approx(np.mean(expected))
    assert plumbing.Episodes(2).mean() is None


def test_one_env_recorded_alone_matches_the_reference_and_restart_drops_the_episode_in_flight():
    rng = np.random.default_rng(2)
    rewards = rng.normal(size=(400, 1))
    dones = rng.random((400, 1)) < 0.05
    episodes = plumbing.Episodes(1)
    for reward, done in zip(rewards, dones):
        episodes.record_one(float(reward[0]), bool(done[0]))
    assert np.allclose(list(episodes.finished), reference_returns(rewards, dones, 20))
    episodes.record_one(5.0, False)
    restarted = plumbing.Episodes(1)
    restarted.load(episodes.state(), restart=True)
    assert list(restarted.ret) == [0.0] and list(restarted.finished) == list(episodes.finished)


def test_episodes_of_a_pool_add_to_its_own_envs():
    """A pool of envs 2 and 3 of 4 (envpool's ids within the pool, offset by its first env)."""
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(200, 4))
    dones = rng.random((200, 4)) < 0.1
    episodes = plumbing.Episodes(4, window=1000)
    for reward, done in zip(rewards, dones):
        episodes.record(reward[:2], done[:2], ids=np.array([0, 1]))
        episodes.record(reward[2:], done[2:], ids=np.array([0, 1]) + 2)
    expected = reference_returns(rewards, dones, 1000)
    assert sorted(episodes.finished) == pytest.approx(sorted(expected))


def test_run_logs_rows_fps_and_summary(tmp_path, capsys):
    args = Args(log_dir=str(tmp_path), compile=True)
    run = plumbing.Run(args, "some_script", torch.device("cpu"), total_steps=40)
    with run:
        for i in range(1, 5):
            run.log(i * 10, steady=i >= 2, iteration=i, episodic_return=float(i))
    run.finish(40, final_return=4.0, compile_time=run.compile_time(), extra_field=1)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4] and [r["global_step"] for r in rows] == [10, 20, 30, 40]
    assert rows[0]["fps"] is None and rows[1]["fps"] is None  # steady state begins at the second row
    assert rows[2]["fps"] > 0 and rows[3]["fps"] > 0
    assert all(r["time"] >= 0 for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["script"] == "some_script" and summary["global_step"] == 40 and summary["final_return"] == 4.0
    assert summary["fps"] == rows[-1]["fps"] and summary["extra_field"] == 1 and summary["interrupted"] is False
    assert summary["compile_time"] is not None and summary["flags"]["compile"] is True
    assert {"device", "torch", "cpu", "gpu", "num_threads", "wall_time"} <= summary.keys()
    err = capsys.readouterr().err
    assert err.count("compiling the units on their first call") == 1 and "40 steps" in err


def test_the_bar_shows_no_return_before_an_episode_has_finished(tmp_path):
    """The progress bar's return is the row's: none ("-") while metrics.jsonl says null, 0.0 only for a real 0 (issue
    59: it showed ret=0.0 before any episode had finished); the same for fps before steady state."""
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", torch.device("cpu"), total_steps=40)
    shown = []
    with run:
        for step, ret in ((10, None), (20, 0.0), (30, -3.5), (40, None)):
            run.log(step, steady=step >= 20, episodic_return=ret)
            shown.append(dict(item.split("=") for item in run.bar.postfix.split(", ")))
    assert [s["ret"] for s in shown] == ["-", "0.0", "-3.5", "-"]
    assert shown[0]["fps"] == "-" and shown[1]["fps"] == "-" and float(shown[2]["fps"]) > 0


def test_untimed_seconds_are_left_out_of_the_fps_and_the_compile_time(tmp_path, monkeypatch):
    """A clock that moves 1 s per interval, a quarter of it an evaluation: 10 steps per interval count as 10 / 0.75."""
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(plumbing.life.time, "perf_counter", lambda: next(clock))
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", torch.device("cpu"), total_steps=50)
    with run:
        for i in range(1, 6):
            run.log(i * 10, steady=i >= 2, untimed=0.25)
    assert run.fps == pytest.approx(30 / 2.25)  # steady from the 2nd log: 3 intervals of 0.75 s
    assert run.compile_time() == pytest.approx(0.0)  # the first interval minus the steady median: 0.75 - 0.75
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["time"] == pytest.approx(5.0)  # the row's time is the wall clock's


def test_a_run_that_never_reaches_steady_state_has_no_fps(tmp_path):
    args = Args(log_dir=str(tmp_path))
    run = plumbing.Run(args, "some_script", torch.device("cpu"), total_steps=20)
    with run:
        run.log(10, steady=False)
        run.log(20, steady=False)
    assert run.fps is None and run.compile_time() is None


def test_pick_device_drops_cudagraphs_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: --cudagraphs is kept")
    args = Args(cudagraphs=True)
    assert plumbing.pick_device(args).type == "cpu" and args.cudagraphs is False
    assert capsys.readouterr().err.count("--cudagraphs ignored") == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity mask on this OS")
def test_cores_counts_the_cores_the_process_may_use():
    """Under taskset-like pinning to one core, the thread default follows the mask, not the machine's core count."""
    code = (
        "import os, torch, plumbing; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "print(plumbing.cores()); print(plumbing.machine_info(torch.device('cpu'))['cpu'])"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "leanrl"))
    result = run_command([sys.executable, "-c", code], env=env, timeout=60, check=True)
    pinned, cpu = result.stdout.splitlines()
    assert pinned == "1"
    # the machine's cores, and the one this process was held to when that is fewer
    n = os.cpu_count()
    assert cpu.endswith(f"({n} cores, this process on 1)" if n > 1 else f"({n} cores)"), cpu
    assert plumbing.cores() == len(os.sched_getaffinity(0))


STOP = (
    PLUMBING_PROGRAM
    + """

run = plumbing.Run(A(sys.argv[1]), "s", None, total_steps=100)
before_log = sys.argv[2] == "before"
with run:
    if not before_log:
        run.log(10, steady=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    print("stopping", run.stopping, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    print("not interrupted", flush=True)
print("consistent", run.consistent, flush=True)
sys.exit(130 if run.stopping else 0)
"""
)


def test_ctrl_c_asks_to_stop_then_stops_at_once(tmp_path):
    """After a log line, the first Ctrl-C only asks the loop to stop (the state stays consistent: a checkpoint can be
    saved); the second ends the block at once and leaves nothing consistent to save."""
    proc = run_command([sys.executable, "-c", STOP, str(tmp_path), "after"], tmp_path / "after", timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout.splitlines() == ["stopping True", "consistent False"], proc.stdout
    assert "stopping at the next log line (Ctrl-C again: stop now, no checkpoint)" in proc.stderr


def test_ctrl_c_before_the_first_log_line_stops_at_once(tmp_path):
    """Before any log line there is nothing to save and a compile can hold the process for minutes: it ends at once."""
    proc = run_command([sys.executable, "-c", STOP, str(tmp_path), "before"], tmp_path / "before", timeout=120)
    assert proc.returncode == 130 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert proc.stderr.strip().endswith("stopped before the first log line: nothing to save")


def test_every_training_script_imports_the_plumbing_and_keeps_no_copy_of_it():
    """The run plumbing lives once: no training script defines its own copy of a plumbing piece."""
    pieces = (
        "def fail(",
        "def parse_args(",
        "def machine_info(",
        "platform.processor(",
        "class StopFlag",
        "signal.signal(",
        "def save_checkpoint(",
        "def load_checkpoint(",
        "os.replace(",
        "wandb.init(",
        "tqdm.tqdm(",
    )
    for path in sorted((ROOT / "leanrl").glob("*.py")):
        if path.name == "plumbing.py":
            continue
        text = path.read_text()
        assert "import plumbing" in text, path.name
        assert not [p for p in pieces if p in text], (path.name, [p for p in pieces if p in text])


def test_the_second_signal_can_be_sigterm(tmp_path):
    """SIGTERM (a scheduler's stop) is handled as Ctrl-C is."""
    code = STOP.replace("signal.SIGINT", "signal.SIGTERM")
    proc = run_command([sys.executable, "-c", code, str(tmp_path), "after"], tmp_path / "term", timeout=120)
    assert proc.returncode == 130 and proc.stdout.splitlines() == ["stopping True", "consistent False"]


def test_sighup_stops_a_run_as_sigterm_does(tmp_path):
    """A closed terminal (SIGHUP) stops the run at its next log line, as Ctrl-C and SIGTERM do: files kept."""
    code = STOP.replace("signal.SIGINT", "signal.SIGHUP")
    proc = run_command([sys.executable, "-c", code, str(tmp_path), "after"], tmp_path / "hup", timeout=120)
    assert proc.returncode == 130 and proc.stdout.splitlines() == ["stopping True", "consistent False"], proc.stderr


STREAMS = (
    PLUMBING_PROGRAM
    + """
import torch

os.makedirs(sys.argv[1])
sys.argv = ["s", "--log-dir", sys.argv[1]]
run = plumbing.Run(plumbing.parse_args(A), "s", torch.device("cpu"), total_steps=50)
with run:
    for step in range(1, 51):
        run.log(step, steady=True)
        print("row", step, file=sys.stderr, flush=True)
        print("row", step, flush=True)
        time.sleep(0.01)  # the reader of `| head -1` is gone well before the run ends
run.finish(50, final_return=1.0)
"""
)


@pytest.mark.parametrize("redirect", ["2>&- >&-", "2>&1 | head -1 >/dev/null"])
def test_a_closed_or_broken_stream_never_ends_a_run(redirect, tmp_path):
    """stderr and stdout closed (`2>&-`), or read by a reader that is gone (`| head -1`): the run goes to its end,
    writes its summary and exits 0."""
    log_dir = tmp_path / "run"
    shell = f'"$0" -c "$1" "$2" {redirect}; exit ${{PIPESTATUS[0]}}'
    proc = run_command(["bash", "-c", shell, sys.executable, STREAMS, str(log_dir)], tmp_path / "out", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((log_dir / "summary.json").read_text())["global_step"] == 50
    assert len((log_dir / "metrics.jsonl").read_text().splitlines()) == 50


def test_a_broken_stream_without_a_file_descriptor_is_replaced():
    """A stream with no fd of its own (a StringIO, pytest's capture) whose write fails: replaced by /dev/null."""

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    stream = plumbing.Unbroken(Gone())
    assert stream.write("a line\n") == 7
    stream.write("another\n")
    stream.flush()
