"""leanrl/tools/cleanrl_reference.py: CleanRL's own file run per seed into its log layout (here a stand-in script
that prints as CleanRL's does), and the logs of finished seeds converted into the runs the CleanRL page reads."""

import datetime
import importlib.metadata
import json
import os
import re
import statistics
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT, assert_user_error

BATCH = 2048  # CleanRL's ppo_continuous_action.py: num_envs 1 x num_steps 2048, a line `SPS: N` after each


@pytest.fixture
def tool(monkeypatch, capsys):
    """The tool called in this process (importing torch for each call would take most of the test's time): its exit
    code, stdout and stderr."""
    monkeypatch.syspath_prepend(ROOT / "leanrl" / "tools")
    import cleanrl_reference

    def call(*args):
        monkeypatch.setattr(sys, "argv", ["cleanrl_reference.py", *map(str, args)])
        try:
            cleanrl_reference.main()
            code = 0
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return call


def version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def synthetic_log(folder, iterations, episode_steps=300, done=None):
    """stdout.log as the runner writes it: CleanRL's lines, each after the seconds since the start. Returns the
    episodes' returns as they were printed, each with the iteration it was printed in, and the SPS values."""
    folder.mkdir(parents=True)
    lines = []
    returns = []
    sps = []
    episode = 0
    for it in range(1, iterations + 1):
        while (episode + 1) * episode_steps <= it * BATCH:
            episode += 1
            returns.append((it, 7.5 * episode - 40.0 + (episode % 3)))
            lines.append(
                f"{it * 1.3 + episode * 0.01:.3f} global_step={episode * episode_steps}, "
                f"episodic_return={returns[-1][1]}"
            )
        sps.append(600 + it)
        lines.append(f"{it * 1.3 + 0.9:.3f} SPS: {sps[-1]}")
    (folder / "stdout.log").write_text("\n".join(lines) + "\n")
    (folder / "stderr.log").write_text("")
    if done:
        (folder / ".done").write_text(done + "\n")
    return returns, sps


def test_convert_finished_seeds_into_runs(tmp_path, monkeypatch, tool):
    """A finished seed becomes <out>/<seed>/{metrics.jsonl, summary.json} as our runs are recorded: a row per
    iteration (its env step, the seconds of its SPS line, the mean of the last 20 episodes finished by then), the
    summary's final return the mean of the last 20 episodes, the day from .done, the versions of the reference's
    python; a seed still running is left out and named."""
    logs = tmp_path / "logs"
    returns, sps = synthetic_log(logs / "seed_3", iterations=4, done="2026-12-01")
    synthetic_log(logs / "seed_4", iterations=2)
    out = tmp_path / "doc/cleanrl_runs/mujoco/00-cleanrl-file"
    proc = tool("convert", logs, "--python", sys.executable, "--out", out, "--total-timesteps", 4 * BATCH)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"seed 4: in progress at step 4,096 of 8,192", proc.stdout), proc.stdout
    assert not (out / "4").exists()
    rows = [json.loads(line) for line in (out / "3/metrics.jsonl").read_text().splitlines()]
    expected = []
    for it in range(1, 5):
        done = [r for i, r in returns if i <= it]
        expected.append(
            dict(
                episodic_return=statistics.mean(done[-20:]) if done else None,
                global_step=it * BATCH,
                time=round(it * 1.3 + 0.9, 3),
            )
        )
    assert rows == expected
    summary = json.loads((out / "3/summary.json").read_text())
    assert summary["final_return"] == statistics.mean([r for _, r in returns][-20:])
    assert summary["wall_time"] == round(4 * 1.3 + 0.9, 3)
    assert summary["fps"] == sps[-1]
    assert summary["finished_on"] == "2026-12-01"
    assert summary["script"] == "cleanrl/ppo_continuous_action.py"
    assert (summary["seed"], summary["env_id"]) == (3, "HalfCheetah-v4")
    assert (summary["total_timesteps"], summary["global_step"], summary["interrupted"]) == (8192, 8192, False)
    assert summary["torch"] == version("torch") and summary["gymnasium"] == version("gymnasium")
    assert summary["mujoco"] == version("mujoco")
    assert re.fullmatch(r".+ \(\d+ cores, this process on 1\)", summary["cpu"]), summary["cpu"]
    # the CleanRL page reads it as a run like ours
    monkeypatch.syspath_prepend(ROOT / "leanrl" / "tools")
    import report

    assert report.read_run(out / "3") is not None


def test_a_finished_seed_with_a_short_log_is_not_converted(tmp_path, tool):
    """A .done beside a log that stops before the budget (a run at another budget) is refused for that seed, by name."""
    logs = tmp_path / "logs"
    synthetic_log(logs / "seed_1", iterations=3, done="2026-12-01")
    out = tmp_path / "out"
    proc = tool("convert", logs, "--python", sys.executable, "--out", out, "--total-timesteps", 4 * BATCH)
    assert proc.returncode == 0, proc.stderr
    assert "seed 1: finished with 3 of 4 iterations" in proc.stderr
    assert not (out / "1").exists()


FAKE = """import json, os, sys
seed = int(sys.argv[sys.argv.index("--seed") + 1])
print("global_step=1000, episodic_return=-1.5")
print("SPS: 100")
print("a warning", file=sys.stderr)
record = dict(argv=sys.argv[1:], cwd=os.getcwd(), nice=os.nice(0), cores=sorted(os.sched_getaffinity(0)),
              threads=os.environ.get("OMP_NUM_THREADS"))
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps(record) + "\\n")
sys.exit(3 if seed == 13 else 0)
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins a core: Linux")
def test_run_writes_the_layout_and_resumes_per_seed(tmp_path, monkeypatch, tool):
    """Each seed runs in <out>/seed_N (CleanRL writes its runs/ there), niced, pinned to the core, one thread, with
    CleanRL's flags; its stdout.log has each line after the seconds since its start, its stderr.log the rest, and
    .done the day (UTC) it finished. A second call runs only the seeds not finished: an unfinished one from its start.
    A seed that fails stops the tool, naming its stderr.log, with no .done."""
    script = tmp_path / "fake_cleanrl.py"
    script.write_text(FAKE)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    core = min(os.sched_getaffinity(0))
    logs = tmp_path / "logs"
    args = ("run", "--python", sys.executable, "--script", script, "--out", logs, "--core", core)
    proc = tool(*args, "--seeds", 1, 2, "--total-timesteps", 4096)
    assert proc.returncode == 0, proc.stderr
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["argv"] for r in runs] == [
        ["--no-cuda", "--seed", str(seed), "--env-id", "HalfCheetah-v4", "--total-timesteps", "4096"] for seed in (1, 2)
    ]
    assert [r["cwd"] for r in runs] == [str(logs / "seed_1"), str(logs / "seed_2")]
    assert all(r["nice"] == 19 and r["cores"] == [core] and r["threads"] == "1" for r in runs), runs
    lines = (logs / "seed_1/stdout.log").read_text().splitlines()
    assert re.fullmatch(r"\d+\.\d{3} global_step=1000, episodic_return=-1\.5", lines[0]), lines
    assert re.fullmatch(r"\d+\.\d{3} SPS: 100", lines[1]), lines
    assert (logs / "seed_1/stderr.log").read_text() == "a warning\n"
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert (logs / "seed_1/.done").read_text().strip() == today
    # seed 2 stopped before its end: it runs again from its start, seed 1 does not
    (logs / "seed_2/.done").unlink()
    (logs / "seed_2/stale").write_text("")
    proc = tool(*args, "--seeds", 1, 2)
    assert proc.returncode == 0, proc.stderr
    assert len(record.read_text().splitlines()) == 3
    assert not (logs / "seed_2/stale").exists() and (logs / "seed_2/.done").exists()
    proc = tool(*args, "--seeds", 13, 3)
    assert proc.returncode == 1
    assert str(logs / "seed_13/stderr.log") in proc.stderr
    assert not (logs / "seed_13/.done").exists() and not (logs / "seed_3").exists()


def test_bad_input(tmp_path, tool):
    """A missing script or python, a core this process may not use, no seed logs to convert: one line, exit 2."""
    script = tmp_path / "fake_cleanrl.py"
    script.write_text(FAKE)
    logs = tmp_path / "logs"
    missing = tmp_path / "nowhere.py"
    assert_user_error(
        tool("run", "--python", sys.executable, "--script", missing, "--out", logs), "--script", "nowhere"
    )
    assert_user_error(tool("run", "--python", missing, "--script", script, "--out", logs), "--python", "nowhere")
    if hasattr(os, "sched_getaffinity"):
        core = max(os.sched_getaffinity(0)) + 1000
        proc = tool("run", "--python", sys.executable, "--script", script, "--out", logs, "--core", core)
        assert_user_error(proc, "--core", str(core))
    (tmp_path / "empty").mkdir()
    assert_user_error(tool("convert", tmp_path / "empty", "--python", sys.executable), "seed_")
    assert not logs.exists()
