"""The prepared GPU command (leanrl/tools/gpu_check.sh) and its report, on a CPU: the dry run's plan covers every
torchcompile script, bounds every run and fits a short GPU slot; the real run refuses a machine without CUDA; the
report turns a GPU check's folder into its tables."""

import json
import os
import re

from conftest import ROOT, assert_user_error, run_command

CHECK = ROOT / "leanrl" / "tools" / "gpu_check.sh"
REPORT = ROOT / "leanrl" / "tools" / "gpu_report.py"
TORCHCOMPILE = sorted(p.name for p in (ROOT / "leanrl").glob("*_torchcompile.py"))
# each family's eager baseline and torchcompile script, as the sweep pairs them
FAMILIES = {
    "atari": ("ppo_atari_envpool.py", "ppo_atari_envpool_torchcompile.py"),
    "mujoco": ("ppo_continuous_action.py", "ppo_continuous_action_torchcompile.py"),
    "classic": ("ppo.py", "ppo_torchcompile.py"),
    "sac": ("sac_continuous_action.py", "sac_continuous_action_torchcompile.py"),
    "td3": ("td3_continuous_action.py", "td3_continuous_action_torchcompile.py"),
    "dqn": ("dqn.py", "dqn_torchcompile.py"),
    "dqn_atari": ("dqn_atari_envpool.py", "dqn_atari_envpool_torchcompile.py"),
}


def dry_run(tmp_path) -> str:
    env = dict(os.environ, DRY="1", OUT=str(tmp_path / "gpu"), PYTHON=os.environ.get("PYTHON", "python"))
    proc = run_command(["bash", CHECK], tmp_path / "dry", timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "gpu" / "sweep").exists()  # a plan: nothing ran
    return proc.stdout


def test_the_dry_run_plans_every_script_bounded_within_five_minutes(tmp_path):
    out = dry_run(tmp_path)
    # step 1: tests/test_gpu.py, every torchcompile script (the variants' GPU runs are these) in some shard
    shards = [ln for ln in out.splitlines() if ln.strip().startswith("shard ")]
    planned = " ".join(shards)
    for script in TORCHCOMPILE:
        assert f"test_compile_cudagraphs_matches_eager_on_cuda[{script}]" in planned, script
    # step 2: the sweep, every command under its own time box, each family's baseline, compiled and captured run
    runs = [ln.strip() for ln in out.splitlines() if "--log-dir" in ln]
    assert runs and all(re.match(r"timeout -k 10 \d+ ", ln) for ln in runs), runs
    for family, (baseline, torchcompile) in FAMILIES.items():
        assert any(f"leanrl/{baseline} " in ln and f"sweep/{family}/baseline/" in ln for ln in runs), family
        assert any(
            f"leanrl/{torchcompile} --compile --cudagraphs" in ln and f"sweep/{family}/compile-cudagraphs/" in ln
            for ln in runs
        ), family
    for family in ("atari", "mujoco", "classic"):
        assert any(f"--family {family}" in ln and f"sweep/{family}/env-alone/" in ln for ln in runs), family
    # a family's runs and its envs alone share a lane (the same cores), so that the share of env-alone is fair
    for family in FAMILIES:
        cores = {re.search(r"taskset -c (\S+)", ln).group(1) for ln in runs if f"sweep/{family}/" in ln}
        assert len(cores) == 1, (family, cores)
    seconds = int(re.search(r"planned wall time: at most (\d+) s", out).group(1))
    assert seconds <= 300


def test_the_real_run_needs_a_cuda_device(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "gpu"), PYTHON=os.environ.get("PYTHON", "python"))
    env.pop("DRY", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # as on CI, even where this test runs beside a GPU
    proc = run_command(["bash", CHECK], tmp_path / "real", timeout=120, env=env)
    assert_user_error(proc, "no CUDA device", "DRY=1")
    assert not (tmp_path / "gpu" / "tests").exists()


def summary(path, **fields):
    path.mkdir(parents=True)
    base = dict(script="x", env_id="Breakout-v5", gpu="NVIDIA H200", cpu="AMD EPYC (16 cores)", torch="2.11.0")
    (path / "summary.json").write_text(json.dumps(dict(base, **fields)))


def test_the_report_sets_the_sweep_against_its_envs_alone_and_the_targets(tmp_path):
    out = tmp_path / "gpu"
    sweep = out / "sweep"
    summary(sweep / "atari" / "baseline" / "1", fps=2000.0, compile_time=None)
    summary(
        sweep / "atari" / "compile-cudagraphs" / "1",
        script="ppo_atari_envpool_torchcompile",
        fps=4000.0,
        compile_time=30.0,
    )
    summary(sweep / "atari" / "env-alone" / "1", fps=5000.0)
    summary(sweep / "mujoco" / "baseline" / "1", env_id="HalfCheetah-v4", fps=500.0)
    summary(
        sweep / "mujoco" / "compile-cudagraphs" / "1",
        script="ppo_continuous_action_torchcompile",
        env_id="HalfCheetah-v4",
        fps=3000.0,
        compile_time=50.0,
    )
    summary(sweep / "mujoco" / "env-alone" / "1", env_id="HalfCheetah-v4", fps=6000.0)
    shard = out / "tests" / "0"
    shard.mkdir(parents=True)
    (shard / "ids.txt").write_text("tests/test_gpu.py::test_a[x.py]\ntests/test_gpu.py::test_b[y.py]\n")
    (shard / "pytest.txt").write_text("..\nPASSED tests/test_gpu.py::test_a[x.py]\n")  # test_b: the shard stopped
    proc = run_command(["python", REPORT, out, "--commit", "abc1234"], tmp_path / "report", timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = (out / "gpu_table.md").read_text()
    assert "NVIDIA H200" in table and "abc1234" in table and "torch 2.11.0" in table
    assert "| atari (Breakout-v5) | 2,000 | 4,000 | 2.00x | 5,000 | 80% | 30.0 s | 2,047 / 3,656 |" in table
    assert "- atari: 80% of its envs alone (target 85%): NOT met" in table
    assert "- mujoco: 50% of its envs alone (target 70%): NOT met" in table
    assert "- mujoco --compile --cudagraphs: 3,000 fps, slower than 2026-11-22's 3,729" in table
    assert "NOT all: ppo_continuous_action_torchcompile 50 s" in table
    verdicts = (out / "tests.txt").read_text().splitlines()
    assert verdicts[0] == "PASSED tests/test_gpu.py::test_a[x.py]"
    assert verdicts[1].startswith("no verdict") and verdicts[1].endswith("test_b[y.py]")
    # a shard that ran to its end skipping all (no CUDA): pytest names no test, its summary line counts them
    (shard / "pytest.txt").write_text(
        "ss\nSKIPPED [2] tests/test_gpu.py:43: needs a CUDA device\n== 2 skipped in 1.0s ==\n"
    )
    run_command(["python", REPORT, out], tmp_path / "report2", timeout=120, check=True)
    assert (out / "tests.txt").read_text().splitlines() == [
        f"SKIPPED tests/test_gpu.py::test_{t}" for t in ("a[x.py]", "b[y.py]")
    ]
