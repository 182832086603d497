import contextlib
import glob
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "leanrl"))  # the scripts import the plumbing module by its name, as they run
SMOKE = ["--num-envs", "1", "--num-steps", "64", "--total-timesteps", "256"]
# the start of a `python -c` program that drives the run plumbing with a stand-in for a script's Args
PLUMBING_PROGRAM = """
import os, signal, sys, time
sys.path.insert(0, "leanrl")
import plumbing
from dataclasses import dataclass

@dataclass
class A:
    log_dir: str
    env_id: str = "CartPole-v1"
    seed: int = 1
    track: bool = False
    compile: bool = False
    total_timesteps: int = 100
"""
# the PPO scripts' log schema (DESIGN.md): a metrics.jsonl row per iteration, and summary.json
PPO_ROW_FIELDS = {
    "iteration",
    "global_step",
    "fps",
    "episodic_return",
    "t_rollout",
    "t_env",
    "t_policy",
    "t_gae",
    "t_update",
    "lr",
    "approx_kl",
    "clipfrac",
    "pg_loss",
    "v_loss",
    "entropy",
}
# summary.json, as plumbing.Run writes it for every script
SUMMARY_FIELDS = {
    "script",
    "env_id",
    "seed",
    "flags",
    "device",
    "torch",
    "cpu",
    "gpu",
    "num_threads",
    "total_timesteps",
    "wall_time",
    "fps",
    "final_return",
    "compile_time",
}


def process_tree(pid: int) -> list:
    """`pid` and its descendants, read from /proc (the children of each of their threads)."""
    tree = [pid]
    for parent in tree:  # grows as it goes: breadth first
        for children in glob.glob(f"/proc/{parent}/task/*/children"):
            with contextlib.suppress(OSError):
                tree += [int(c) for c in Path(children).read_text().split()]
    return tree


class Child:
    """A command started as a subprocess the way every test here starts one. Its stdout and stderr go to files next
    to the run (a pipe that nobody reads fills at 64 KiB and blocks the child mid-write), it leads a process group of
    its own, and every wait has a deadline after which the child, its descendants (torchrun's ranks, in sessions of
    their own) and its group get SIGKILL and the test fails saying what it was waiting for."""

    started = []  # every child of this test process, killed at the end of each test (see the autouse fixture)

    def __init__(self, cmd, out: Path = None, env: dict = None, cwd: Path = ROOT):
        out = out or Path(tempfile.mkdtemp(prefix="leanrl-test-")) / "out"
        out.parent.mkdir(parents=True, exist_ok=True)
        self.cmd, self.out_path, self.err_path = (
            [str(c) for c in cmd],
            out.with_name(out.name + ".stdout"),
            out.with_name(out.name + ".stderr"),
        )
        env = dict(os.environ if env is None else env, PYTHONWARNINGS="ignore")
        with open(self.out_path, "w") as stdout, open(self.err_path, "w") as stderr:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        Child.started.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def exited(self) -> bool:
        """Whether the child has exited, without reaping it: until it is reaped its pid (the group's id) cannot be
        reused, so a kill of the group can never reach an unrelated process."""
        if self.proc.returncode is not None:
            return True
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self) -> int:
        """SIGKILL to the child, its descendants (torchrun starts each rank in a session of its own) and its process
        group (an exited child may have left members behind), then reap it; returns its exit code."""
        if self.proc.returncode is None:
            for pid in process_tree(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()

    @property
    def name(self) -> str:
        return " ".join(Path(c).name if c.startswith(str(ROOT)) else c for c in self.cmd[:3])

    def wait_until(self, condition, timeout: float, waiting_for: str, poll: float = 0.1):
        """Poll `condition()` while the child runs; returns its first true value. Fails (and kills the child) at the
        deadline or if the child exits before the condition holds."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if self.exited():
                value = condition()  # it may have come true as the child exited, after the check above
                if value:
                    return value
                code = self.kill()
                pytest.fail(
                    f"{self.name} exited {code} before {waiting_for}\nlast stderr:\n{self.stderr[-3000:]}",
                    pytrace=False,
                )
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(
                    f"{self.name} killed after {timeout:.0f}s waiting for {waiting_for}\n"
                    f"last stderr:\n{self.stderr[-3000:]}",
                    pytrace=False,
                )
            time.sleep(poll)

    def wait(self, timeout: float, waiting_for: str = "it to exit") -> int:
        """The exit code, waited for at most `timeout` seconds; whatever the child left running in its group (a
        compile worker, a rank) is killed with it."""
        self.wait_until(self.exited, timeout, waiting_for, poll=0.05)
        return self.kill()

    def result(self, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
        """Wait for the exit (bounded) and return what subprocess.run would."""
        code = self.wait(timeout)
        proc = subprocess.CompletedProcess(self.cmd, code, self.stdout, self.stderr)
        if check and code != 0:
            raise AssertionError(f"{' '.join(self.cmd)} exited {code}\n{proc.stderr[-4000:]}")
        return proc


@pytest.fixture(autouse=True)
def _kill_leftover_children():
    """No test leaves a process behind, whatever way it ended (a failed assertion, pytest-timeout)."""
    yield
    while Child.started:
        Child.started.pop().kill()


def start_script(script: str, *flags: str, log_dir: Path, env: dict = None) -> Child:
    """Start leanrl/<script> as a user would, logging into `log_dir`; its output goes to log_dir.stdout/.stderr."""
    return Child([sys.executable, ROOT / "leanrl" / script, "--log-dir", log_dir, *flags], log_dir, env)


def run_script(script: str, *flags: str, log_dir: Path, timeout: float = 600, check: bool = True):
    """Run leanrl/<script> to the end (at most `timeout` seconds); returns a CompletedProcess."""
    return start_script(script, *flags, log_dir=log_dir).result(timeout, check)


def run_command(cmd, out: Path = None, timeout: float = 600, env: dict = None, check: bool = False):
    """Any other command (a tool, run.sh), run the same way; its output goes to out.stdout/.stderr (default: a
    temporary folder)."""
    return Child(cmd, out, env).result(timeout, check)


def read_metrics(log_dir: Path) -> list:
    with open(log_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def read_metrics_so_far(log_dir: Path) -> list:
    """metrics.jsonl while a run writes it: the rows complete so far (none before the file exists)."""
    path = log_dir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return [json.loads(ln) for ln in lines if ln.endswith("\n")]


def read_summary(log_dir: Path) -> dict:
    with open(log_dir / "summary.json") as f:
        return json.load(f)


def load_script(name: str):
    """Import leanrl/<name>.py as a module, to test its units directly."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "leanrl" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # torch.compile looks the module up by name
    spec.loader.exec_module(module)
    return module


def assert_user_error(proc, *words: str):
    """A user mistake: exit 2, exactly one line on stderr that names the problem, no traceback."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w.lower() in lines[0].lower(), lines[0]


def assert_rejected(script: str, flags, words, log_dir: Path):
    """Running `script` with `flags` is a user mistake: it stops before any work, with the one-line error."""
    proc = run_script(script, *flags, log_dir=log_dir, check=False, timeout=300)
    assert_user_error(proc, *words)
    assert not (log_dir / "metrics.jsonl").exists()


def smoke_runs(runs, tmp_path_factory, budget=(*SMOKE, "--num-threads", "1")) -> dict:
    """Each (script, flags) of `runs` once, with `budget` (default: the smoke flags on one thread):
    {(script, flags): (proc, log_dir)}. Module-scoped fixtures share these runs between tests: a compiled run costs
    tens of seconds."""
    out = {}
    for script, flags in runs:
        log_dir = tmp_path_factory.mktemp("smoke") / "run"
        out[script, flags] = run_script(script, *budget, *flags, log_dir=log_dir), log_dir
    return out


def smoke_fixture(runs, budget=(*SMOKE, "--num-threads", "1")):
    """A module-scoped fixture holding smoke_runs(runs, ..., budget): `smoke = smoke_fixture(RUNS)`."""
    return pytest.fixture(scope="module")(lambda tmp_path_factory: smoke_runs(runs, tmp_path_factory, budget))


def run_ids(runs) -> list:
    """Test ids for (script, flags) pairs: the script's name with its flags."""
    return [f"{s[:-3]}{''.join(f)}" for s, f in runs]


def check_ppo_smoke_logs(run, script: str, flags, env_id: str, lr: float):
    """A PPO smoke run (1 env x 64 steps, 256 steps, 3 burn-in iterations; `run` from smoke_runs): the schema's fields,
    finite losses, fps only after the burn-in, lr annealed linearly; the summary's env, thread count, steps and compile
    time; one line saying that --cudagraphs is ignored without CUDA. Returns (rows, summary) for the family's checks."""
    proc, log_dir = run
    rows, summary = read_metrics(log_dir), read_summary(log_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]  # 256 steps / (1 env x 64 steps)
    assert [r["global_step"] for r in rows] == [64, 128, 192, 256]
    for row in rows:
        assert PPO_ROW_FIELDS <= row.keys(), PPO_ROW_FIELDS - row.keys()
        assert all(math.isfinite(row[k]) for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "t_update"))
    assert rows[0]["fps"] is None and rows[-1]["fps"] > 0  # fps counts only after the 3 burn-in iterations
    assert rows[0]["lr"] == pytest.approx(lr) and rows[-1]["lr"] == pytest.approx(lr / 4)  # annealed
    assert SUMMARY_FIELDS <= summary.keys(), SUMMARY_FIELDS - summary.keys()
    assert summary["script"] == script[:-3] and summary["env_id"] == env_id
    assert summary["num_threads"] == 1 and summary["global_step"] == 256
    assert (summary["compile_time"] is not None) == ("--compile" in flags)
    said = [ln for ln in proc.stderr.splitlines() if "--cudagraphs" in ln]
    assert len(said) == ("--cudagraphs" in flags) and all("ignored" in ln for ln in said), proc.stderr
    return rows, summary


def resume_ppo_smoke(script: str, first: Path, log_dir: Path, *flags) -> dict:
    """Resume a PPO smoke run's agent.pt (4 iterations, 256 steps) for two more iterations into `log_dir`, checking
    that the step count goes on from the checkpoint's. Returns the checkpoint."""
    ckpt = torch.load(first / "agent.pt", weights_only=True)
    assert ckpt["iteration"] == 4 and ckpt["global_step"] == 256
    run_script(
        script,
        *SMOKE[:4],
        "--total-timesteps",
        "384",
        "--num-threads",
        "1",
        "--resume",
        str(first / "agent.pt"),
        *flags,
        log_dir=log_dir,
    )
    rows = read_metrics(log_dir)
    assert [r["iteration"] for r in rows] == [5, 6] and rows[-1]["global_step"] == 384
    return ckpt


def script_fixture(name: str):
    """A module-scoped fixture that imports leanrl/<name>.py once for a test module: `tc = script_fixture("...")`."""
    return pytest.fixture(scope="module")(lambda: load_script(name))


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "run"
