"""A run's lifecycle, from its first check to its last write (leanrl/plumbing/, issue 41 items 9-16): the log dir a
run may write to, resuming (rows past the checkpoint, a finished run), the final writes (a full disk, a signal while
they run), `--track` without a login or a network, and the memory and threads a run asks for.

Most of it is tested in this process against plumbing directly; one script (ppo.py, at the smoke flags) shows that the
scripts' calls into it give the same behaviour end to end."""

import importlib
import json
import os
import socket
import sys

import pytest
import torch

import plumbing
from conftest import (
    PLUMBING_PROGRAM,
    ROOT,
    SMOKE,
    Child,
    assert_user_error,
    load_script,
    read_metrics,
    read_summary,
    run_command,
    run_script,
)
from test_plumbing import Args, refused

CPU = torch.device("cpu")


def files(folder) -> dict:
    """{name: bytes} of every file in `folder`: what "untouched" compares."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# --- 9. a --log-dir that holds another run -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json", "agent.pt"])
def test_a_log_dir_holding_another_run_is_refused_and_left_untouched(name, tmp_path, capsys):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / name).write_text("another run's\n")
    line = refused(capsys, plumbing.check_run, Args(log_dir=str(log_dir)), "some_script")
    assert "--log-dir" in line and "another run" in line and name in line, line
    assert files(log_dir) == {name: b"another run's\n"}


def test_a_log_dir_is_reused_when_resume_points_into_it(tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / "metrics.jsonl").write_text(json.dumps(dict(global_step=10)) + "\n")
    plumbing.save_checkpoint(str(log_dir / "agent.pt"), "some_script", Args(), global_step=10)
    args = Args(log_dir=str(log_dir), resume=str(log_dir / "agent.pt"))
    assert plumbing.check_run(args, "some_script")["global_step"] == 10
    # an empty folder (made beforehand, as run.sh and the tests do) holds no run
    plumbing.check_run(Args(log_dir=str(tmp_path / "empty")), "some_script")


def test_default_log_dirs_never_collide(tmp_path, monkeypatch):
    """Two runs of one script and seed started in the same second get two folders, each created by its own run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plumbing.logdir.time, "time", lambda: 1767225600.0)
    first, second = Args(seed=3), Args(seed=3)
    plumbing.check_run(first, "some_script")
    plumbing.check_run(second, "some_script")
    assert first.log_dir != second.log_dir
    for args in (first, second):
        assert args.log_dir.startswith("runs/CartPole-v1__some_script__3__1767225600") and os.path.isdir(args.log_dir)


# --- 10. rows past the checkpoint ----------------------------------------------------------------------------------


def test_a_resumed_run_drops_the_rows_past_its_checkpoint(tmp_path, capsys):
    """A run that logged up to step 60 after its checkpoint at 30, then died (SIGKILL, a second Ctrl-C), leaving half a
    line: the run resumed from step 30 keeps rows 10-30 and goes on from there."""
    rows = [dict(global_step=s, logged_by="first") for s in (10, 20, 30, 40, 50, 60)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"global_step": 7')
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", CPU, total_steps=60, start_step=30)
    with run:
        for step in (40, 50):
            run.log(step, steady=True, logged_by="resumed")
    kept = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["global_step"], r["logged_by"]) for r in kept] == [
        (10, "first"),
        (20, "first"),
        (30, "first"),
        (40, "resumed"),
        (50, "resumed"),
    ]
    assert "dropped 3 rows" in capsys.readouterr().err


# --- 9, 10, 11 end to end: ppo.py -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """ppo.py at the smoke flags with --save-model: 4 iterations, agent.pt at step 256, summary.json."""
    log_dir = tmp_path_factory.mktemp("lifecycle") / "run"
    run_script("ppo.py", *SMOKE, "--num-threads", "1", "--save-model", log_dir=log_dir, timeout=300)
    return log_dir


def test_a_script_refuses_a_reused_log_dir(finished_run, tmp_path):
    before = files(finished_run)
    proc = run_script("ppo.py", *SMOKE, "--num-threads", "1", log_dir=finished_run, check=False, timeout=120)
    assert_user_error(proc, "--log-dir", "another run")
    assert files(finished_run) == before


def test_resuming_a_finished_run_is_refused_before_touching_it(finished_run):
    """Its checkpoint is at the end of --total-timesteps: nothing to train, and its summary is kept as it was."""
    before = files(finished_run)
    resume = ["--resume", str(finished_run / "agent.pt")]
    proc = run_script("ppo.py", *SMOKE, "--num-threads", "1", *resume, log_dir=finished_run, check=False, timeout=120)
    assert_user_error(proc, "--resume", "already at step 256")
    assert files(finished_run) == before


def test_a_script_resumed_after_an_unclean_stop_never_rewinds_its_rows(finished_run, tmp_path):
    """A resumed run that logged steps 320 and 384 and was killed before it saved leaves rows past agent.pt's step 256;
    the next resume from that agent.pt drops them: global_step only goes up in metrics.jsonl."""
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    for name, data in files(finished_run).items():
        (log_dir / name).write_bytes(data)
    lost = [dict(global_step=s, iteration=i, lost=True) for s, i in ((320, 5), (384, 6))]
    with open(log_dir / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in lost))
    flags = [*SMOKE[:4], "--total-timesteps", "512", "--num-threads", "1", "--resume", str(log_dir / "agent.pt")]
    run_script("ppo.py", *flags, log_dir=log_dir, timeout=300)
    rows = read_metrics(log_dir)
    assert [r["global_step"] for r in rows] == [64, 128, 192, 256, 320, 384, 448, 512]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8] and not any("lost" in r for r in rows)


# --- 11. a finished run ---------------------------------------------------------------------------------------------


def test_a_checkpoint_at_the_end_of_the_budget_is_refused(tmp_path, capsys):
    """Off-policy: one step per env step, done at --total-timesteps; PPO: done when less than a batch is left."""
    path = str(tmp_path / "agent.pt")
    plumbing.save_checkpoint(path, "some_script", Args(), global_step=1000)
    line = refused(capsys, plumbing.check_run, Args(resume=path, total_timesteps=1000), "some_script")
    assert "--resume" in line and "already at step 1,000" in line and "--total-timesteps" in line
    args = Args(resume=path, total_timesteps=1063)
    line = refused(capsys, lambda: plumbing.check_run(args, "some_script", step=64))
    assert "already at step 1,000" in line
    log_dir = str(tmp_path / "run")
    args = Args(resume=path, total_timesteps=1064, log_dir=log_dir)
    assert plumbing.check_run(args, "some_script", step=64)["global_step"] == 1000
    assert plumbing.check_run(Args(resume=path, total_timesteps=1001, log_dir=log_dir), "some_script") is not None


def test_a_ppo_script_passes_its_batch_as_the_step(tmp_path, capsys, monkeypatch):
    """ppo.py with a checkpoint at step 256 and --total-timesteps 300: 4 x 64 steps is every whole batch of 300."""
    ppo = load_script("ppo")
    path = str(tmp_path / "agent.pt")
    plumbing.save_checkpoint(path, "ppo", ppo.Args(num_envs=1, num_steps=64), global_step=256, iteration=4)
    argv = [*SMOKE[:4], "--total-timesteps", "300", "--resume", path, "--log-dir", str(tmp_path / "run")]
    monkeypatch.setattr(sys, "argv", ["ppo.py", *argv])
    line = refused(capsys, lambda: ppo.check_args(plumbing.parse_args(ppo.Args)))
    assert "already at step 256" in line
    assert not (tmp_path / "run").exists()


# --- 12. a full disk at the final writes ----------------------------------------------------------------------------

FINAL_WRITES = (
    PLUMBING_PROGRAM
    + """
import resource
import torch

args = A(sys.argv[1])
run = plumbing.Run(args, "s", torch.device("cpu"), total_steps=100)
with run:
    run.log(100, steady=True)
limit = int(sys.argv[2])  # the bytes any file may have from here on: the writes past them fail as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
plumbing.save_checkpoint(os.path.join(args.log_dir, "agent.pt"), "s", args, weights=torch.zeros(10**4), global_step=100)
run.finish(100, final_return=1.0, padding="x" * 4000)
"""
)


def test_a_failed_final_write_leaves_no_partial_file_and_says_so(tmp_path):
    """The final checkpoint and summary.json written when files can no longer grow (RLIMIT_FSIZE: the kernel fails the
    write, EFBIG, as it fails one on a full disk with ENOSPC). Each says in one line which file it could not write;
    no partial file or temporary is left, the earlier agent.pt and summary.json are kept whole, exit code 1."""
    (tmp_path / "agent.pt").write_bytes(b"the earlier checkpoint")
    (tmp_path / "summary.json").write_text('{"earlier": true}')
    proc = run_command([sys.executable, "-c", FINAL_WRITES, str(tmp_path), "3000"], tmp_path / "full", timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, proc.stderr
    for line, name in zip(errors, ("agent.pt", "summary.json")):
        assert str(tmp_path / name) in line and os.strerror(27) in line, line  # EFBIG: "File too large"
    assert sorted(os.listdir(tmp_path)) == ["agent.pt", "full.stderr", "full.stdout", "metrics.jsonl", "summary.json"]
    assert (tmp_path / "agent.pt").read_bytes() == b"the earlier checkpoint"
    assert json.loads((tmp_path / "summary.json").read_text()) == {"earlier": True}


def test_final_writes_are_whole_when_they_fit(tmp_path):
    """The control: the same writes under a limit they fit in (the summary is about 5 kB, agent.pt about 42 kB)."""
    proc = run_command([sys.executable, "-c", FINAL_WRITES, str(tmp_path), "65536"], tmp_path / "fits", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert torch.load(tmp_path / "agent.pt", weights_only=True)["global_step"] == 100
    assert json.loads((tmp_path / "summary.json").read_text())["global_step"] == 100
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# --- 13. a signal during the final writes ---------------------------------------------------------------------------

SIGNAL_IN_SAVE = (
    PLUMBING_PROGRAM
    + """
import torch

save = torch.save

def save_while_signalled(*a, **kw):  # Ctrl-C twice (or SIGTERM twice) while the checkpoint is being written
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    save(*a, **kw)

torch.save = save_while_signalled
args = A(sys.argv[1])
run = plumbing.Run(args, "s", torch.device("cpu"), total_steps=100)
with run:
    run.log(100, steady=True)
plumbing.save_checkpoint(os.path.join(args.log_dir, "agent.pt"), "s", args, global_step=100)
run.finish(100, final_return=1.0)
"""
)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signals_during_the_final_writes_wait_for_them(sig, tmp_path):
    """The loop is over and the checkpoint is being written: two signals do not cut it (a KeyboardInterrupt inside
    torch.save left a traceback, a stale agent.pt.tmp and no summary); the writes end whole, then exit code 130."""
    proc = run_command([sys.executable, "-c", SIGNAL_IN_SAVE, str(tmp_path), sig], tmp_path / "sig", timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert torch.load(tmp_path / "agent.pt", weights_only=True)["global_step"] == 100
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == 100 and summary["interrupted"] is False  # the loop had finished its budget
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# --- 15. --track ----------------------------------------------------------------------------------------------------


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    """No API key anywhere wandb looks: not in the environment, not in a netrc file."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))


def no_network(monkeypatch):
    """Every connection fails at once, as on this machine: the tests never wait on a network."""

    def refuse(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)


def test_track_without_a_wandb_login_is_refused_before_any_work(no_wandb_login, tmp_path, capsys):
    log_dir = tmp_path / "run"
    line = refused(capsys, plumbing.check_run, Args(track=True, log_dir=str(log_dir)), "some_script")
    assert "--track" in line and "wandb login" in line and "WANDB_API_KEY" in line and "WANDB_MODE=offline" in line
    assert not log_dir.exists()


def test_track_with_a_key_and_no_network_logs_offline_and_says_so(no_wandb_login, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    no_network(monkeypatch)
    plumbing.check_run(Args(track=True, log_dir=str(tmp_path / "run")), "some_script")
    assert os.environ["WANDB_MODE"] == "offline"
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "api.wandb.ai" in lines[0] and "offline" in lines[0] and "wandb sync" in lines[0]


def test_track_with_a_netrc_login_needs_no_key_in_the_environment(no_wandb_login, tmp_path, capsys, monkeypatch):
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    no_network(monkeypatch)
    plumbing.check_run(Args(track=True, log_dir=str(tmp_path / "run")), "some_script")
    assert os.environ["WANDB_MODE"] == "offline"


def test_track_offline_needs_no_login_and_no_network(no_wandb_login, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")

    def connect(*args, **kwargs):
        raise AssertionError("an offline run reached for the network")

    monkeypatch.setattr(socket, "create_connection", connect)
    plumbing.check_run(Args(track=True, log_dir=str(tmp_path / "run")), "some_script")
    assert capsys.readouterr().err == ""


def test_the_network_probe_is_bounded(monkeypatch):
    """A connection that never answers (a black-holed route) is given up after the bound, not wandb's 90 s."""
    import threading

    never = threading.Event()

    def hang(*args, **kwargs):
        never.wait(60)
        raise OSError(110, "Connection timed out")

    monkeypatch.setattr(socket, "create_connection", hang)
    try:
        assert plumbing.reachable("https://api.wandb.ai", timeout=0.5) is False
    finally:
        never.set()  # lets the probe's thread end


# --- 16. memory and threads -----------------------------------------------------------------------------------------

GIB = 2**30


@pytest.fixture
def sixteen_gib(monkeypatch):
    """A machine with 16 GiB free and no CUDA device, whatever this one has."""
    monkeypatch.setattr(plumbing.memory, "available_memory", lambda: 16 * GIB, raising=False)
    monkeypatch.setattr(plumbing.memory.torch.cuda, "is_available", lambda: False)


def script_check(name, argv, tmp_path, monkeypatch):
    module = load_script(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--log-dir", str(tmp_path / name), *argv])
    return lambda: module.check_args(plumbing.parse_args(module.Args))


@pytest.mark.parametrize(
    "name,argv,flags",
    [
        (
            "ppo_atari_envpool",
            ["--num-envs", "100000", "--num-steps", "8", "--total-timesteps", "800000"],
            ["--num-envs"],
        ),
        (
            "ppo_atari_envpool_torchcompile",
            ["--num-envs", "100000", "--num-steps", "8", "--total-timesteps", "800000"],
            ["--num-envs"],
        ),
        (
            "ppo_atari_envpool_ddp_torchcompile",
            ["--num-envs", "100000", "--num-steps", "8", "--total-timesteps", "800000"],
            ["--num-envs"],
        ),
        ("ppo_torchcompile", ["--num-steps", "200000000", "--total-timesteps", "800000000"], ["--num-steps"]),
        (
            "ppo_continuous_action",
            ["--num-envs", "100000", "--num-steps", "8", "--total-timesteps", "800000"],
            ["--num-envs"],
        ),
        ("sac_continuous_action", ["--buffer-size", "1000000000"], ["--buffer-size"]),
        ("sac_continuous_action_torchcompile", ["--buffer-size", "1000000000"], ["--buffer-size"]),
        ("td3_continuous_action", ["--buffer-size", "1000000000"], ["--buffer-size"]),
        ("dqn_torchcompile", ["--buffer-size", "1000000000"], ["--buffer-size"]),
        ("dqn_atari_envpool", ["--buffer-size", "3000000"], ["--buffer-size"]),
    ],
)
def test_a_run_that_cannot_fit_in_memory_is_refused_before_any_work(
    name, argv, flags, sixteen_gib, tmp_path, capsys, monkeypatch
):
    line = refused(capsys, script_check(name, argv, tmp_path, monkeypatch))
    assert "GiB" in line and "16.0 GiB" in line, line
    for flag in flags:
        assert flag in line, line
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("name", ["ppo_atari_envpool_torchcompile", "sac_continuous_action", "dqn_atari_envpool"])
def test_the_defaults_fit_in_sixteen_gib(name, sixteen_gib, tmp_path, capsys, monkeypatch):
    """The control: a default run (Atari DQN's 1M-frame buffer is 7.1 GB) is not refused on such a machine."""
    script_check(name, [], tmp_path, monkeypatch)()


def test_the_estimate_covers_the_replay_buffer_a_script_allocates(monkeypatch):
    """The estimate against an independent reference: the bytes of the buffer the script itself builds."""
    needs = {}
    monkeypatch.setattr(plumbing, "check_memory", lambda args, family, **stores: needs.update(stores))
    monkeypatch.setattr(plumbing, "check_run", lambda *args, **kwargs: None)
    for name, n_obs, n_actions in (("sac_continuous_action", 17, 6), ("td3_continuous_action_torchcompile", 17, 6)):
        module = load_script(name)
        module.check_args(module.Args(buffer_size=1000, env_id="HalfCheetah-v4", log_dir=None))
        rb = module.ReplayBuffer(1000, n_obs, n_actions, CPU)
        tensors = [t for t in rb.__dict__.values() if isinstance(t, torch.Tensor)] + list(rb.data.values())
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}  # views once
        allocated = sum(storages.values())
        assert allocated <= needs["replay_buffer"] <= 1.2 * allocated, (name, allocated, needs)


def test_check_memory_counts_the_ranks_on_this_machine(capsys, monkeypatch):
    """torchrun's ranks share the host's memory: 3 GiB per rank fits 8 GiB alone, not with 4 ranks."""
    monkeypatch.setattr(plumbing.memory, "available_memory", lambda: 8 * GIB)
    monkeypatch.setattr(plumbing.memory.torch.cuda, "is_available", lambda: False)
    args = Args(num_envs=1)
    args.num_steps = 1000
    plumbing.check_memory(args, "classic", rollout=3 * GIB)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    line = refused(capsys, lambda: plumbing.check_memory(args, "classic", rollout=3 * GIB))
    assert "4 ranks" in line and "--num-envs" in line and "--num-steps" in line


def test_more_threads_than_cores_is_said_in_one_line(tmp_path, capsys):
    cores = plumbing.cores()
    plumbing.check_run(Args(num_threads=cores, log_dir=str(tmp_path / "a")), "some_script")
    assert capsys.readouterr().err == ""
    plumbing.check_run(Args(num_threads=cores + 1, log_dir=str(tmp_path / "b")), "some_script")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--num-threads {cores + 1}" in lines[0] and f"{cores} cores" in lines[0], lines


def test_check_memory_puts_the_stores_on_a_cuda_learner_against_the_gpu(capsys, monkeypatch):
    """A CUDA learner (faked here: no GPU needed) holds the rollout on the GPU and the env pools on the host: 8 GiB of
    rollout does not fit 4 GiB free on the GPU, however much the host has; 4 Atari envs fit the host."""
    monkeypatch.setattr(plumbing.memory, "available_memory", lambda: 64 * GIB)
    monkeypatch.setattr(plumbing.memory.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(plumbing.memory.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(plumbing.memory.torch.cuda, "mem_get_info", lambda index: (4 * GIB, 80 * GIB))
    args = Args(num_envs=4)
    args.num_steps = 128
    plumbing.check_memory(args, "atari", rollout=3 * GIB)
    line = refused(capsys, lambda: plumbing.check_memory(args, "atari", rollout=8 * GIB))
    assert "4.0 GiB is free on the GPU" in line and "--num-steps" in line
    args.cuda = False  # --no-cuda: the same rollout on the host fits
    plumbing.check_memory(args, "atari", rollout=8 * GIB)


# --- issue 51: the edges not tried before ---------------------------------------------------------------------------


def test_a_diverged_run_stops_keeps_no_checkpoint_and_says_so(tmp_path, capsys):
    """A non-finite loss at a log line: one line naming the step and the loss, the row written as strict JSON, the run
    asked to stop with no state worth saving (`consistent` false: the last checkpoint is kept), `diverged` in the
    summary and a non-zero exit."""
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", CPU, total_steps=30)
    with run:
        run.log(10, steady=True, pg_loss=0.5, v_loss=1.0)
        assert not run.stopping and run.consistent
        run.log(20, steady=True, pg_loss=float("nan"), v_loss=float("inf"), td_loss=None)
        assert run.stopping and not run.consistent
    with pytest.raises(SystemExit) as e:
        run.finish(20, final_return=None)
    assert e.value.code == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if "training diverged" in line]
    assert len(lines) == 1 and "step 20" in lines[0] and "pg_loss nan" in lines[0] and "v_loss inf" in lines[0], lines
    rows = [
        json.loads(line, parse_constant=pytest.fail) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[1]["pg_loss"] is None and rows[1]["v_loss"] is None and rows[0]["pg_loss"] == 0.5
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["diverged"] == dict(global_step=20, losses=["pg_loss", "v_loss"])
    assert summary["interrupted"] is False


def test_a_script_that_diverges_keeps_the_last_good_checkpoint(finished_run, tmp_path):
    """The issue's case: a good run resumed into its own folder with --learning-rate 1e30 (every weight NaN after the
    first minibatch) leaves agent.pt as it was, exits 1 and says so in one line. In ppo.py the NaN logits fail
    torch.distributions' check within the iteration, before any log line."""
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    for name, data in files(finished_run).items():
        (log_dir / name).write_bytes(data)
    good = (log_dir / "agent.pt").read_bytes()
    flags = [*SMOKE[:4], "--total-timesteps", "512", "--num-threads", "1", "--learning-rate", "1e30", "--save-model"]
    proc = run_script(
        "ppo.py", *flags, "--resume", str(log_dir / "agent.pt"), log_dir=log_dir, check=False, timeout=300
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "training diverged" in line]
    assert len(said) == 1 and "step 256" in said[0], proc.stderr
    assert (log_dir / "agent.pt").read_bytes() == good
    assert read_summary(log_dir)["diverged"]["global_step"] == 256


def test_a_torchcompile_script_that_diverges_writes_no_checkpoint(tmp_path):
    """ppo_torchcompile.py's units make no check of their own: the NaN losses reach the first log line, which stops
    the run there."""
    flags = [*SMOKE, "--num-threads", "1", "--learning-rate", "1e30", "--save-model"]
    proc = run_script("ppo_torchcompile.py", *flags, log_dir=tmp_path / "run", check=False, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "training diverged" in line]
    assert len(said) == 1 and "step 64" in said[0], proc.stderr
    assert not (tmp_path / "run" / "agent.pt").exists()
    assert len(read_metrics(tmp_path / "run")) == 1 and read_summary(tmp_path / "run")["diverged"]["global_step"] == 64


BIG_SEED = 2**31 - 1  # the largest --seed: every seed derived from it (+ env, member, resumed step) is past int32


def test_derived_env_seeds_wrap_as_envpool_wraps_them():
    """envpool takes an int32 seed and seeds env i of a pool with seed + i in 32 bits: a pool's env past 2**31 - 1 is
    the env of the wrapped seed. The seeds derived in the scripts (--split-envs pools, seeds members) wrap the same
    way, so that a pool of its own gives an env the observations it has in one big pool."""
    import envpool

    pool = envpool.make("HalfCheetah-v4", env_type="gymnasium", num_envs=2, seed=BIG_SEED).reset()[0]
    alone = envpool.make("HalfCheetah-v4", env_type="gymnasium", num_envs=1, seed=plumbing.envpool_seed(BIG_SEED + 1))
    assert (alone.reset()[0][0] == pool[1]).all()
    assert plumbing.envpool_seed(5) == 5 and plumbing.envpool_seed(2**31 + 5) == -(2**31) + 5


def test_a_seeds_script_and_split_pools_build_their_envs_at_the_largest_seed():
    """Member k seeded seed + k, the second --split-envs pool seed + num_envs / 2: no envpool AssertionError."""
    seeds = load_script("ppo_continuous_action_seeds_torchcompile")
    args = seeds.Args(num_seeds=2, num_envs=2)
    assert len(seeds.make_envs(args, BIG_SEED)) == 2
    atari = load_script("ppo_atari_envpool_torchcompile")
    assert len(atari.make_pools(atari.Args(num_envs=2, split_envs=True), BIG_SEED)) == 2


def test_a_run_at_the_largest_seed_resumes(tmp_path):
    """A MuJoCo resume seeds its envs seed + global_step (envpool cannot save them): past int32 at --seed 2**31 - 1."""
    flags = ["--num-envs", "1", "--num-steps", "64", "--num-threads", "1", "--seed", str(BIG_SEED), "--save-model"]
    log_dir = tmp_path / "run"
    run_script("ppo_continuous_action.py", *flags, "--total-timesteps", "64", log_dir=log_dir, timeout=300)
    resume = ["--total-timesteps", "128", "--resume", str(log_dir / "agent.pt")]
    run_script("ppo_continuous_action.py", *flags, *resume, log_dir=log_dir, timeout=300)
    assert [r["global_step"] for r in read_metrics(log_dir)] == [64, 128]


def test_a_resume_with_another_seed_is_refused(tmp_path, capsys):
    """The checkpoint carries its run's random state: another --seed would go on with the old one while the logs and
    the summary (and a seeds run's members) said the new one."""
    path = str(tmp_path / "agent.pt")
    plumbing.save_checkpoint(path, "some_script", Args(seed=1), global_step=10)
    line = refused(capsys, plumbing.check_run, Args(seed=2, resume=path, log_dir=str(tmp_path / "b")), "some_script")
    assert "--resume" in line and "--seed 1" in line, line
    assert plumbing.check_run(Args(seed=1, resume=path, log_dir=str(tmp_path / "a")), "some_script") is not None


def test_a_full_disk_mid_run_stops_it_as_ctrl_c_does(tmp_path, capsys, monkeypatch):
    """metrics.jsonl on a full disk (/dev/full: every write fails with ENOSPC): the row's write says so in one line and
    stops the run at that log line with its state consistent, so the checkpoint and the summary are still tried; exit
    code 1, no traceback."""
    monkeypatch.setattr(plumbing.logdir, "UNWRITTEN", [])
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", CPU, total_steps=30)
    with run:
        run.log(10, steady=True, pg_loss=0.5)
        assert run.stopping and run.consistent
    plumbing.save_checkpoint(str(tmp_path / "agent.pt"), "some_script", Args(), global_step=10)
    with pytest.raises(SystemExit) as e:
        run.finish(10, final_return=None)
    assert e.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "metrics.jsonl" in errors[0] and os.strerror(28) in errors[0], errors  # ENOSPC
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is True
    assert torch.load(tmp_path / "agent.pt", weights_only=True)["global_step"] == 10


@pytest.mark.parametrize(
    "script,state,words",
    [
        (
            "ppo_seeds_torchcompile",
            dict(agent={"actor.0.weight": torch.zeros(2, 64, 4), "actor.4.weight": torch.zeros(2, 2, 64)}),
            ["ppo_seeds_torchcompile.py", "2 agents", "one agent"],
        ),
        ("dqn", dict(q_network={"network.0.weight": torch.zeros(120, 4)}), ["dqn.py", "DQN"]),
        (
            "sac_continuous_action",
            dict(actor={"fc1.weight": torch.zeros(256, 17)}),
            ["sac_continuous_action.py", "SAC"],
        ),
    ],
)
def test_eval_compressed_says_what_it_does_not_support(script, state, words, tmp_path, capsys, monkeypatch):
    """A seeds run's checkpoint (its agents stacked) was a ValueError traceback; DQN's and SAC's were called "not a
    checkpoint written by --save-model", which they are: one line saying what the tool does not evaluate."""
    monkeypatch.syspath_prepend(str(ROOT / "leanrl" / "tools"))
    ec = importlib.import_module("eval_compressed")
    path = tmp_path / "agent.pt"
    args = dict(env_id="CartPole-v1", num_seeds=2) if "seeds" in script else dict(env_id="CartPole-v1")
    torch.save(dict(script=script, format=plumbing.CHECKPOINT_FORMAT, args=args, **state), path)
    line = refused(capsys, ec.load_agent, ec.Args(checkpoint=str(path)))
    assert "not a checkpoint" not in line and all(w in line for w in words), line


CLAIM = """
import sys, time
sys.path[:0] = ["leanrl", "tests"]
import plumbing
from test_plumbing import Args

plumbing.check_run(Args(log_dir=sys.argv[1]), "s")
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_log_dir_is_claimed_by_the_run_that_gets_it(tmp_path, capsys):
    """Two runs started into one --log-dir at once both found it empty and both wrote there. A run holds its folder
    from its check on: a second run's check while the first lives is refused in one line; once the first is gone
    (even killed), the folder is free again."""
    log_dir = tmp_path / "run"
    first = Child([sys.executable, "-c", CLAIM, str(log_dir)], tmp_path / "first")
    first.wait_until(lambda: "claimed" in first.stdout, 120, "its check_run")
    line = refused(capsys, plumbing.check_run, Args(log_dir=str(log_dir)), "some_script")
    assert "--log-dir" in line and "another run" in line, line
    first.kill()
    plumbing.check_run(Args(log_dir=str(log_dir)), "some_script")


def test_a_seeds_run_names_the_member_that_diverged_and_goes_on(tmp_path, capsys):
    """The seeds scripts log each member's losses in `members`: a member's non-finite losses are one line naming its
    seed, the step and the losses, its row strict JSON; the run goes on (consistent: it may save) with the top-level
    fields the means of the members still training. Once every member has diverged the run stops as any diverged run
    does."""
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", CPU, total_steps=30)
    with run:
        run.log(10, steady=True, members=[dict(seed=1, pg_loss=0.5, lr=1.0), dict(seed=2, pg_loss=1.5, lr=3.0)])
        run.log(
            20, steady=True, members=[dict(seed=1, pg_loss=0.5, lr=1.0), dict(seed=2, pg_loss=float("nan"), lr=3.0)]
        )
        assert not run.stopping and run.consistent
        run.log(
            30, steady=True, members=[dict(seed=1, pg_loss=float("inf"), lr=1.0), dict(seed=2, pg_loss=0.0, lr=3.0)]
        )
        assert run.stopping and not run.consistent
    lines = [line for line in capsys.readouterr().err.splitlines() if "training diverged" in line]
    assert len(lines) == 2, lines
    assert "seed 2" in lines[0] and "step 20" in lines[0] and "pg_loss nan" in lines[0] and "seed 1" not in lines[0]
    assert "step 30" in lines[1] and "members[0].pg_loss inf" in lines[1] and "run stops" in lines[1], lines[1]
    rows = [json.loads(line, parse_constant=pytest.fail) for line in (tmp_path / "metrics.jsonl").open()]
    assert [(row["pg_loss"], row["lr"]) for row in rows] == [(1.0, 2.0), (0.5, 1.0), (None, None)]
    assert rows[1]["members"][1]["pg_loss"] is None and rows[1]["members"][0]["pg_loss"] == 0.5
    assert run.members_diverged == {
        1: dict(global_step=20, losses=["pg_loss"]),
        0: dict(global_step=30, losses=["pg_loss"]),
    }
    assert run.diverged == dict(global_step=20, losses=["members[1].pg_loss", "members[0].pg_loss"], members=[2, 1])


# --- issue 59: the edges of a stop, and the commit ------------------------------------------------------------------


def test_a_second_ctrl_c_records_the_step_of_the_last_log_line(tmp_path):
    """A second Ctrl-C ends the loop mid-iteration: summary.json's global_step is the last logged one (the one the
    metrics and the checkpoint hold), not the half-done iteration's steps."""
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", CPU, total_steps=100)
    with run:
        run.log(40, steady=True)
        raise KeyboardInterrupt  # the second Ctrl-C, 10 steps into the next iteration
    with pytest.raises(SystemExit) as e:
        run.finish(50, final_return=None)
    summary = read_summary(tmp_path)
    assert e.value.code == 130 and summary["global_step"] == 40 and summary["interrupted"] is True


STOPPED_EARLY = (
    PLUMBING_PROGRAM
    + """
os.makedirs(sys.argv[1])
run = plumbing.Run(A(sys.argv[1]), "s", None, total_steps=100)
os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C before the first log line: the run stops at once
time.sleep(30)
"""
)


def test_a_run_stopped_before_its_first_log_line_leaves_its_folder_free(tmp_path):
    """A run stopped before its first log line wrote no row: it leaves no metrics.jsonl (it left a 0-byte one, which
    refused every later run into its own folder), and a 0-byte one an older run left holds no run either."""
    proc = run_command([sys.executable, "-c", STOPPED_EARLY, str(tmp_path / "run")], tmp_path / "early", timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    plumbing.check_run(Args(log_dir=str(tmp_path / "run")), "some_script")
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "metrics.jsonl").write_text("")
    plumbing.check_run(Args(log_dir=str(tmp_path / "older")), "some_script")


def test_the_summary_names_the_commit(tmp_path):
    """summary.json records the commit the run's code is at (git's own short hash, '-dirty' for uncommitted changes to
    tracked files), so that a report cannot mix commits unawares."""
    import subprocess

    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    run = plumbing.Run(Args(log_dir=str(tmp_path)), "some_script", CPU, total_steps=10)
    with run:
        run.log(10, steady=True)
    run.finish(10, final_return=None)
    assert read_summary(tmp_path)["commit"] == head + ("-dirty" if dirty.stdout.strip() else "")


def test_a_resume_with_other_training_flags_says_so_in_one_line(tmp_path, capsys):
    """--resume with other values of the flags that shape training (a learning rate, a minibatch count, the lr's
    annealing, a larger --total-timesteps, which re-plans the schedules that run to it) is taken, and said in one line
    naming each, the checkpoint's value beside it: the run is no longer the one it would have been uninterrupted.
    Flags of how it runs (threads, the log dir, the burn-in, --compile) change nothing it trains, and say nothing."""
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    plumbing.save_checkpoint(str(log_dir / "agent.pt"), "some_script", Args(), global_step=10)
    resume = str(log_dir / "agent.pt")
    # two threads where the process has two cores: more than its cores is a warning of its own
    threads = min(2, plumbing.cores())
    plumbing.check_run(
        Args(log_dir=str(log_dir), resume=resume, num_threads=threads, measure_burnin=0, compile=True), "some_script"
    )
    assert capsys.readouterr().err == ""
    changed = Args(log_dir=str(log_dir), resume=resume, learning_rate=1e-3, gamma=0.9, total_timesteps=2000)
    plumbing.check_run(changed, "some_script")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for said in ("--learning-rate 0.001 (", "0.00025", "--gamma 0.9 (", "0.99", "--total-timesteps 2000 (", "1000"):
        assert said in lines[0], lines[0]
