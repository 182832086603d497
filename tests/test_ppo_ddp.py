"""Data-parallel PPO (ppo_ddp_torchcompile.py, ppo_atari_envpool_ddp_torchcompile.py) and bench_scaling.py.

Multi-process runs go through torchrun (`python -m torch.distributed.run`) on CPU (gloo), each on a free port.
The gradient averaging is checked deterministically: the update unit run by 2 ranks on 2 envs each, in a gloo
group this test starts, against the same unit run by 1 process on all 4 envs.
"""

import contextlib
import json
import os
import signal
import socket
import sys
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from conftest import (
    PPO_ROW_FIELDS,
    ROOT,
    SMOKE,
    SUMMARY_FIELDS,
    Child,
    assert_rejected,
    assert_user_error,
    load_script,
    read_metrics,
    read_metrics_so_far,
    read_summary,
    run_command,
    run_ids,
    run_script,
)

ROW_FIELDS = PPO_ROW_FIELDS | {"world_size", "t_sync"}
DDP_SUMMARY_FIELDS = SUMMARY_FIELDS | {"world_size"}
CLASSIC, ATARI = "ppo_ddp_torchcompile.py", "ppo_atari_envpool_ddp_torchcompile.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script, nproc, *flags, log_dir) -> Child:
    """Start `torchrun --nproc-per-node nproc leanrl/<script>` on a free port."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(ROOT / "leanrl" / script),
        "--log-dir",
        str(log_dir),
        "--num-threads",
        "1",
        *flags,
    ]
    return Child(cmd, log_dir)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The classic script on 2 ranks x 2 envs x 32 steps, 8 iterations (128 steps each)."""
    log_dir = tmp_path_factory.mktemp("ddp") / "run"
    proc = torchrun(CLASSIC, 2, "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "1024", log_dir=log_dir)
    return log_dir, proc.result(300).stderr


def test_torchrun_two_ranks_logs(two_ranks):
    log_dir, err = two_ranks
    rows, summary = read_metrics(log_dir), read_summary(log_dir)
    assert [r["global_step"] for r in rows] == [128 * i for i in range(1, 9)]  # both ranks' steps count
    assert all(ROW_FIELDS <= r.keys() for r in rows)
    assert all(r["world_size"] == 2 and r["t_sync"] > 0 for r in rows)
    assert rows[-1]["fps"] > 0 and rows[-1]["episodic_return"] > 0
    assert DDP_SUMMARY_FIELDS <= summary.keys()
    assert summary["world_size"] == 2 and summary["backend"] == "gloo" and summary["global_step"] == 1024
    assert err.count("logs in") == 1  # rank 0 alone reports (and logs)


def test_torchrun_ranks_end_with_identical_parameters(two_ranks):
    digests = read_summary(two_ranks[0])["rank_param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]


# (script, flags): single process, no launcher
SINGLE = [(s, f) for s in (CLASSIC, ATARI) for f in ((), ("--compile",), ("--cudagraphs",))]


@pytest.mark.parametrize("script,flags", SINGLE, ids=run_ids(SINGLE))
def test_single_process_without_launcher(script, flags, log_dir):
    proc = run_script(script, *SMOKE, "--num-threads", "1", *flags, log_dir=log_dir)
    rows, summary = read_metrics(log_dir), read_summary(log_dir)
    assert [r["global_step"] for r in rows] == [64, 128, 192, 256]
    assert all(ROW_FIELDS <= r.keys() and r["world_size"] == 1 and r["t_sync"] == 0 for r in rows)
    assert rows[-1]["fps"] > 0
    assert summary["world_size"] == 1 and len(summary["rank_param_digests"]) == 1
    assert (summary["compile_time"] is not None) == ("--compile" in flags)
    if "--cudagraphs" in flags:
        assert "--cudagraphs ignored" in proc.stderr


def test_single_process_matches_base_script(tmp_path):
    """World size 1 is ppo_torchcompile.py itself: the same seed gives the same losses and returns (eager mode;
    the advantage moments are computed outside the loss, so equal up to float32 rounding)."""
    run_script(CLASSIC, *SMOKE, "--num-threads", "1", log_dir=tmp_path / "ddp")
    run_script("ppo_torchcompile.py", *SMOKE, "--num-threads", "1", log_dir=tmp_path / "base")
    ddp, base = read_metrics(tmp_path / "ddp"), read_metrics(tmp_path / "base")
    for a, b in zip(ddp, base):
        assert a["episodic_return"] == b["episodic_return"]
        for key in ("pg_loss", "v_loss", "entropy", "approx_kl"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("script", [CLASSIC, ATARI])
def test_a_diverged_run_is_recorded_as_diverged_not_interrupted(script, tmp_path):
    """A run whose losses go non-finite stops as diverged, as a single-process script's does: `diverged` in
    summary.json, `interrupted` false (the ranks stop together through the stop they share with Ctrl-C), exit 1."""
    log_dir = tmp_path / "run"
    flags = [*SMOKE, "--num-threads", "1", "--learning-rate", "1e30"]
    proc = run_script(script, *flags, log_dir=log_dir, check=False, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    summary = read_summary(log_dir)
    assert summary["diverged"]["global_step"] == 64, summary["diverged"]
    assert summary["interrupted"] is False


def test_a_diverged_torchrun_run_is_recorded_as_diverged_not_interrupted(tmp_path):
    """The same under torchrun: every rank's weights go non-finite at once (their gradients are averaged), all stop
    together, and rank 0 records the run as diverged."""
    log_dir = tmp_path / "run"
    proc = torchrun(CLASSIC, 2, *SMOKE, "--learning-rate", "1e30", log_dir=log_dir).result(300, check=False)
    assert proc.returncode == 1 and "exitcode  : 1" in proc.stderr, proc.stderr  # torchrun's report of rank 0's exit 1
    summary = read_summary(log_dir)
    assert summary["diverged"]["global_step"] == 128, summary["diverged"]
    assert summary["interrupted"] is False


T, N, MB = 16, 4, 16  # steps, envs in all, minibatch rows per rank (of 2)


def fixed_data():
    """One rollout of 4 envs: (obs, actions, logprobs, advantages, returns, values), each (T, N, ...)."""
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(T, N, 4, generator=g),
        torch.randint(0, 2, (T, N), generator=g),
        -torch.rand(T, N, generator=g),
        3 * torch.randn(T, N, generator=g) + 1,
        torch.randn(T, N, generator=g),
        torch.randn(T, N, generator=g),
    ]


def rank_rows(rank):
    """Rank r's minibatch: MB rows of its own (T x 2)-flattened batch, and where those rows sit in the 4-env batch."""
    local = torch.randperm(T * 2, generator=torch.Generator().manual_seed(10 + rank))[:MB]
    t, e = local // 2, local % 2
    return local, t * N + 2 * rank + e


def run_updates(dd, rank, data, rows, global_adv_norm, n_envs):
    """Two update steps of the script's own units on `data` (this rank's envs) with minibatch `rows`."""
    args = dd.Args(global_adv_norm=global_adv_norm)
    dist_ = dd.Dist(args, torch.device("cpu"))
    args.world_size = dist_.world_size
    torch.manual_seed(rank)  # different initial parameters per rank: the broadcast must make them equal
    agent = dd.Agent(4, 2)
    dist_.broadcast_params(agent)
    lr = torch.tensor(2.5e-4)
    optimizer = dd.make_optimizer(agent, lr, capturable=False)
    obs, actions, logprobs, advantages, returns, values = data
    perms = rows.view(1, -1)
    mean, std, _, _ = dd.sync_iteration(dist_, args, advantages, perms, [], False)
    batch = [x.flatten(0, 1) for x in (obs, actions, logprobs, advantages, returns, values)]
    for _ in range(2):
        dd.update(agent, optimizer, args, dist_, *batch, perms[0], mean[0], std[0])
    dist_.close()
    return [p.detach().clone() for p in agent.parameters()], (mean[0], std[0])


def rank_worker(rank, port, global_adv_norm, out):
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    dd = load_script("ppo_ddp_torchcompile")
    data = [x[:, 2 * rank : 2 * rank + 2] for x in fixed_data()]
    params, moments = run_updates(dd, rank, data, rank_rows(rank)[0], global_adv_norm, 2)
    torch.save(dict(params=params, moments=moments), f"{out}/rank{rank}.pt")


@pytest.fixture(scope="module")
def dd():
    return load_script("ppo_ddp_torchcompile")


def one_process(dd):
    rows = torch.cat([rank_rows(r)[1] for r in (0, 1)])
    return run_updates(dd, 0, fixed_data(), rows, True, N)


@pytest.mark.parametrize("global_adv_norm", [True, False])
def test_two_ranks_equal_one_process_with_all_envs(dd, global_adv_norm, tmp_path, monkeypatch):
    """2 ranks x 2 envs, each on its own minibatch rows, apply the update 1 process x 4 envs computes from the
    union of those rows: averaged gradients, advantages normalized over both ranks' rows. With
    --no-global-adv-norm each rank normalizes on its own rows, which is a different update: the check can fail."""
    ranks = mp.spawn(rank_worker, args=(free_port(), global_adv_norm, str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not ranks.join(timeout=1):  # re-raises a rank's exception
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            pytest.fail("the 2 gloo ranks did not finish their updates within 300 s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for key in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    reference, (mean, std) = one_process(dd)
    union = fixed_data()[3].flatten()[torch.cat([rank_rows(r)[1] for r in (0, 1)])]
    torch.testing.assert_close(mean, union.mean())  # the moments one process computes are the textbook ones
    torch.testing.assert_close(std, union.std())
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)  # every rank applied the same update
    close = all(torch.allclose(p, q, rtol=1e-5, atol=1e-6) for p, q in zip(ranks[0]["params"], reference))
    assert close == global_adv_norm
    if global_adv_norm:
        torch.testing.assert_close(ranks[0]["moments"][0], mean)
        torch.testing.assert_close(ranks[0]["moments"][1], std)


def child_pid(parent: int, rank: int) -> int:
    """The torchrun worker of the given rank (a child of the launcher whose environment says RANK=rank)."""
    with open(f"/proc/{parent}/task/{parent}/children") as f:
        children = [int(c) for c in f.read().split()]
    for pid in children:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"RANK={rank}".encode() in f.read().split(b"\0"):
                return pid
    raise AssertionError(f"no rank {rank} among {children}")


def gone(pid: int) -> bool:
    """The process has exited: no such process, or a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize(
    "sig,words", [(signal.SIGKILL, ("closed", "reset")), (signal.SIGSTOP, ("timed out",))], ids=["killed", "hung"]
)
def test_lost_rank_stops_the_job(sig, words, tmp_path):
    """A rank killed (its socket closes) or hung (SIGSTOP: silent) mid-run: the other stops with one clear line
    within --dist-timeout, and the job exits non-zero. (torchrun itself gives a hung rank 30 s after the other
    failed before it SIGKILLs it; the test kills the hung rank itself once rank 0 is gone, to spare that wait.)"""
    timeout = 5
    log_dir = tmp_path / "run"
    proc = torchrun(
        CLASSIC,
        2,
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--total-timesteps",
        "100000000",
        "--dist-timeout",
        str(timeout),
        log_dir=log_dir,
    )
    proc.wait_until(lambda: len(read_metrics_so_far(log_dir)) >= 2, 120, "2 iterations in metrics.jsonl")
    ranks = [child_pid(proc.pid, r) for r in (0, 1)]
    t0 = time.time()
    os.kill(ranks[1], sig)
    while not gone(ranks[0]) and time.time() < t0 + timeout + 60:
        time.sleep(0.05)
    elapsed = time.time() - t0
    with contextlib.suppress(ProcessLookupError):
        os.kill(ranks[1], signal.SIGKILL)
    assert proc.wait(60, "torchrun to exit once rank 0 was gone") != 0
    err = proc.stderr
    lost = [ln for ln in err.splitlines() if "lost the other ranks" in ln]
    assert lost and lost[0].startswith("error: rank 0 of 2"), err[-3000:]
    assert any(w in lost[0].lower() for w in words), lost[0]
    assert elapsed < timeout + 20  # killed: at once; hung: the timeout, plus slack for a loaded machine


BENCH_SCALING = ROOT / "leanrl" / "tools" / "bench_scaling.py"


def test_bench_scaling_tiny(tmp_path):
    out = tmp_path / "bench"
    cmd = [
        sys.executable,
        str(BENCH_SCALING),
        "--scaling",
        "strong",
        "--max-world-size",
        "2",
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--total-timesteps",
        "768",
        "--measure-burnin",
        "1",
        "--no-compile",
        "--out-dir",
        str(out),
    ]
    run_command(cmd, tmp_path / "bench_scaling", timeout=300, check=True)
    rows = json.loads((out / "scaling_strong.json").read_text())["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    assert [r["num_envs"] for r in rows] == [2, 1]  # strong: the global batch stays 2 envs
    assert rows[0]["speedup"] == 1.0 and rows[0]["efficiency"] == 1.0
    for r in rows:
        assert r["fps"] > 0 and 0 <= r["t_sync_share"] < 1
        assert r["speedup"] == pytest.approx(r["fps"] / rows[0]["fps"])
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["world_size"])
    assert rows[0]["t_sync_share"] == 0 and rows[1]["t_sync_share"] > 0
    assert (out / "scaling_strong.csv").read_text().startswith("world_size,")
    assert (out / "scaling_strong.png").stat().st_size > 1000


BAD_INPUT = [
    ([CLASSIC, "--dist-timeout", "0"], ["--dist-timeout"]),
    ([CLASSIC, "--env-id", "Breakout-v5"], ["Atari"]),
    ([ATARI, "--env-id", "CartPole-v1"], ["classic-control"]),
    ([CLASSIC, "--no-global-adv-norm", "--resume", "/nonexistent/agent.pt"], ["no such file"]),
]


@pytest.mark.parametrize("script_flags,words", BAD_INPUT, ids=[" ".join(f) for f, _ in BAD_INPUT])
def test_bad_input(script_flags, words, log_dir):
    script, *flags = script_flags
    assert_rejected(script, flags, words, log_dir)


BENCH_BAD = [
    (["--scaling", "medium"], ["--scaling"]),
    (["--max-world-size", "0"], ["--max-world-size"]),
    (["--script", "nosuch.py"], ["nosuch.py"]),
    (["--repeats", "-1"], ["--repeats"]),
]


@pytest.mark.parametrize("flags,words", BENCH_BAD, ids=[" ".join(f) for f, _ in BENCH_BAD])
def test_bench_scaling_bad_input(flags, words, tmp_path):
    proc = run_command(
        [sys.executable, BENCH_SCALING, *flags, "--out-dir", tmp_path / "out"],
        tmp_path / "bench_scaling",
        timeout=120,
    )
    assert_user_error(proc, *words)
    assert not (tmp_path / "out").exists()


def test_resume_needs_the_same_world_size(tmp_path):
    """A checkpoint holds every rank's envs: resuming it with another number of ranks is a user mistake."""
    first = tmp_path / "first"
    torchrun(CLASSIC, 2, *SMOKE, "--save-model", log_dir=first).result(300)
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    assert ckpt["world_size"] == 2 and len(ckpt["ranks"]) == 2
    assert not np.array_equal(ckpt["ranks"][0]["next_obs"], ckpt["ranks"][1]["next_obs"])  # own envs, own seeds
    proc = run_script(CLASSIC, *SMOKE, "--resume", str(first / "agent.pt"), log_dir=tmp_path / "second", check=False)
    assert_user_error(proc, "2 ranks")


def test_a_user_mistake_under_torchrun_is_one_line_from_rank_0(tmp_path):
    """Every rank checks its flags; only rank 0 says what is wrong, once. torchrun then reports the failed ranks in its
    own words and exits 1 (its exit code for any failed rank: the script's 2 does not reach the shell)."""
    log_dir = tmp_path / "run"
    proc = torchrun(CLASSIC, 2, *SMOKE, "--gamma", "2", log_dir=log_dir).result(120, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --gamma must be in (0, 1], got 2.0"], proc.stderr
    assert proc.returncode == 1
    assert "exitcode  : 2" in proc.stderr  # torchrun's report: a rank stopped with the script's code for a mistake
    assert not log_dir.exists()
