"""run.sh's CLEANRL=1 sweep (CleanRL's budgets, resumed from checkpoints) and what keeps a sweep's runs its own:
a run finished at another budget or with other members runs again, and two sweeps never write into one family."""

import json
import os
import subprocess

from conftest import assert_user_error, run_command
from test_report import dry_run, fake_run, flag


def test_run_sh_cleanrl_budgets(tmp_path):
    """CLEANRL=1 DRY=1: CleanRL's budgets; the baseline and --compile of CartPole, DQN and HalfCheetah over five seeds
    (--compile's as one seeds-script run where there is one), TD3's and SAC's --compile and Breakout's two at one seed
    (2M steps); every run saves its checkpoint; nothing run or written."""
    doc = str(tmp_path / "doc")  # not the checkout's doc/, whose record holds runs that would not run again
    runs, other = dry_run(tmp_path, CLEANRL="1", DOC=doc)
    steps = {"classic": 500000, "dqn": 500000, "mujoco": 1000000, "td3": 1000000, "sac": 1000000, "atari": 2000000}
    configs = {"td3": ["03-compile"], "sac": ["03-compile"]}
    expected = [f"{f}/{c}" for f in steps for c in configs.get(f, ["01-baseline", "03-compile"])]
    assert sorted(runs) == sorted(expected)
    for key, script in (("classic", "ppo_seeds_torchcompile.py"), ("mujoco", "ppo_continuous_action_seeds")):
        (command,) = runs.pop(f"{key}/03-compile")
        assert command.startswith(f"python leanrl/{script}") and "--compile" in command, command
        assert flag(command, "--seed") == "1" and flag(command, "--num-seeds") == "5", command
    for key, commands in runs.items():
        family = key.split("/")[0]
        seeds = ["1"] if family in ("td3", "sac", "atari") else ["1", "2", "3", "4", "5"]
        assert [flag(c, "--seed") for c in commands] == seeds, key
        for command in commands:
            assert flag(command, "--total-timesteps") == str(steps[family]), command
            assert "--save-model" in command and "--resume" not in command, command
            assert "--learning-starts" not in command, command  # CleanRL's own
    assert other == [f"python leanrl/tools/report.py {tmp_path / 'runs'} --out {doc} --cleanrl"]
    assert not (tmp_path / "runs").exists()

    # a run stopped early with its checkpoint goes on from it; one finished at the budget is not repeated
    stopped = tmp_path / "runs/atari/03-compile/1"
    fake_run(stopped, "Breakout-v5", 2000000, 400, 10.0)
    summary = json.loads((stopped / "summary.json").read_text())
    (stopped / "summary.json").write_text(json.dumps(dict(summary, interrupted=True, global_step=50000)))
    (stopped / "agent.pt").write_bytes(b"")
    fake_run(tmp_path / "runs/atari/01-baseline/1", "Breakout-v5", 2000000, 400, 10.0)
    runs, _ = dry_run(tmp_path, "atari", CLEANRL="1", DOC=doc)
    assert list(runs) == ["atari/03-compile"]
    assert flag(runs["atari/03-compile"][0], "--resume") == str(stopped / "agent.pt")
    runs, _ = dry_run(tmp_path, "atari", CLEANRL="1", ATARI_STEPS="10000000", DOC=doc)
    assert flag(runs["atari/01-baseline"][0], "--total-timesteps") == "10000000"
    bad = run_command(["bash", "run.sh"], tmp_path / "bad", timeout=60, env=dict(os.environ, LEARN="1", CLEANRL="1"))
    assert_user_error(bad, "different sweeps")


def test_a_run_finished_at_another_budget_or_with_other_members_runs_again(tmp_path):
    """A summary from another budget, or a seeds run with fewer members than SEEDS asks for, is not this sweep's run
    (issue 51: LEARN=1 kept a 2-member run when SEEDS grew to three, and any budget's summary counted as done)."""
    fake_run(tmp_path / "runs/dqn/01-baseline/1", "CartPole-v1", 30000, 100, 500.0)
    runs, _ = dry_run(tmp_path, "dqn", LEARN="1", SEEDS="1")
    assert [flag(c, "--seed") for c in runs["dqn/01-baseline"]] == ["1"]
    seeds_run = tmp_path / "runs/classic/03-compile/1"
    fake_run(seeds_run, "CartPole-v1", 500000, 100, 500.0, script="ppo_seeds_torchcompile")
    summary = json.loads((seeds_run / "summary.json").read_text())
    (seeds_run / "summary.json").write_text(json.dumps(dict(summary, flags={"num_seeds": 2})))
    runs, _ = dry_run(tmp_path, "classic", LEARN="1", SEEDS="1 2")
    assert "classic/03-compile" not in runs
    runs, _ = dry_run(tmp_path, "classic", LEARN="1", SEEDS="1 2 3")
    (command,) = runs["classic/03-compile"]
    assert flag(command, "--num-seeds") == "3"


def test_two_sweeps_never_share_a_family(tmp_path):
    """A second run.sh into a family another run.sh is running is refused in one line before it deletes or writes
    anything (issue 51: it deleted the first sweep's live run folder); other families may run beside it."""
    out = tmp_path / "runs"
    live = out / "classic/01-baseline/1"
    live.mkdir(parents=True)
    (live / "metrics.jsonl").write_text("")
    env = dict(os.environ, OUT=str(out), SMOKE="1", SEEDS="1")
    (out / "classic").mkdir(exist_ok=True)
    holder = subprocess.Popen(
        ["flock", str(out / "classic" / ".lock"), "-c", "echo held; sleep 60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        proc = run_command(["bash", "run.sh", "classic"], tmp_path / "second", timeout=120, env=env)
        assert_user_error(proc, "another run.sh")
        assert (live / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_cleanrl_a_run_in_the_record_is_not_run_again(tmp_path):
    """CLEANRL=1 on a new machine (an empty OUT) goes on from the runs the report recorded under DOC/cleanrl_runs:
    a recorded run finished at the budget is not repeated; one recorded at another budget is."""
    doc = tmp_path / "doc"
    fake_run(doc / "cleanrl_runs/atari/01-baseline/1", "Breakout-v5", 2000000, 400, 10.0)
    fake_run(doc / "cleanrl_runs/dqn/01-baseline/1", "CartPole-v1", 30000, 100, 500.0)
    runs, _ = dry_run(tmp_path, "atari", "dqn", CLEANRL="1", SEEDS="1", DOC=str(doc))
    assert "atari/01-baseline" not in runs and "atari/03-compile" in runs
    assert [flag(c, "--seed") for c in runs["dqn/01-baseline"]] == ["1"]
