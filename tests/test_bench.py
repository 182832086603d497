"""The benchmark tools in leanrl/tools/: bench_inference.py (the policy networks under each configuration),
eval_compressed.py (post-training compression of a trained agent) and bench_env.py (the envs alone). Tiny settings:
the tables' numbers are not checked, their structure, the compressed agents' actions and the sizes are."""

import importlib
import importlib.util
import io
import json
import re
import sys

import envpool
import numpy as np
import pytest
import torch

from conftest import ROOT, SMOKE, assert_user_error, load_script, run_command, run_script

TOOLS = ROOT / "leanrl" / "tools"
sys.path.insert(0, str(TOOLS))  # eval_compressed imports bench_inference by its name, as they run


def run_tool(tool: str, *flags: str):
    return run_command([sys.executable, TOOLS / tool, *flags], timeout=600)


def table_rows(path) -> list:
    """The data rows of a markdown table: lists of cells, the first without its backquotes."""
    rows = [ln.strip("|").split("|") for ln in path.read_text().splitlines() if ln.startswith("| `")]
    return [[c.strip().strip("`") for c in row] for row in rows]


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("bench_inference")


@pytest.fixture(scope="module")
def ec(bench):
    return importlib.import_module("eval_compressed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A CartPole agent from ppo_torchcompile.py's smoke run."""
    log_dir = tmp_path_factory.mktemp("cartpole") / "run"
    run_script("ppo_torchcompile.py", *SMOKE, "--save-model", log_dir=log_dir)
    return log_dir / "agent.pt"


@pytest.mark.parametrize("family", ["classic", "atari"])
def test_networks_are_the_scripts(bench, family):
    """Same parameters, same numbers: the tool's network loads the script's weights and its acting step gives the
    log-probability and value that the script's own Agent computes for that action."""
    torch.manual_seed(0)
    if family == "classic":
        script = load_script("ppo_torchcompile").Agent(4, 2)
        net, obs = bench.ClassicAgent(4, 2), torch.randn(16, 4)
    else:
        script = load_script("ppo_atari_envpool_torchcompile").Agent(4)
        net, obs = bench.AtariAgent(4), torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in script.state_dict().items()}
    net.load_state_dict(script.state_dict())
    with torch.no_grad():
        action, logprob, value = bench.Policy(net, gaussian=False)(obs)
        if family == "classic":
            ref_logprob, _, ref_value = script(obs, action)
        else:
            _, ref_logprob, _, ref_value = script.get_action_and_value(obs, action)
    torch.testing.assert_close(logprob, ref_logprob)
    torch.testing.assert_close(value, ref_value)


def test_gaussian_policy_matches_torch_distributions(bench):
    torch.manual_seed(0)
    net = bench.ContinuousAgent(17, 6)
    with torch.no_grad():
        net.actor_logstd.fill_(-0.5)
        obs = torch.randn(32, 17)
        action, logprob, value = bench.Policy(net, gaussian=True)(obs)
        mean, logstd, ref_value = net(obs)
        ref = torch.distributions.Normal(mean, logstd.exp()).log_prob(action).sum(-1)
    torch.testing.assert_close(logprob, ref)
    torch.testing.assert_close(value, ref_value)
    assert action.shape == (32, 6) and not torch.equal(action, mean)  # sampled, not the mean


def test_bench_inference_table(tmp_path):
    table, plot = tmp_path / "inference.md", tmp_path / "inference.png"
    proc = run_tool(
        "bench_inference.py",
        "--families",
        "classic-64x2",
        "--configs",
        "eager",
        "cudagraphs",
        "int8-dynamic",
        "--batch-sizes",
        "4",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--cold-compile",
        "--table",
        str(table),
        "--plot",
        str(plot),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(table)
    assert [r[0] for r in rows] == ["eager", "int8-dynamic"]  # cudagraphs: no CUDA here
    assert "Skipped here: `cudagraphs` (CUDA graphs need a CUDA device)" in table.read_text()
    assert "Compile times: first compiles" in table.read_text()
    for row in rows:
        assert float(re.match(r"([\d.]+) \(", row[1]).group(1)) > 0
        assert len(row[2].split(" / ")) == 1  # a compile time per batch size
    assert rows[0][1].endswith("(+0%)")  # eager is the reference
    assert plot.stat().st_size > 0


def play_actions(policy, env_id: str, steps: int = 20) -> np.ndarray:
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=4, seed=0)
    obs, _ = envs.reset()
    actions = []
    with torch.no_grad():
        for _ in range(steps):
            action, logprob, value = policy(torch.from_numpy(obs))
            assert torch.isfinite(logprob).all() and (logprob <= 0).all() and torch.isfinite(value).all()
            actions.append(action.numpy())
            obs, *_ = envs.step(action.numpy())
    return np.stack(actions)


def test_compressed_agents_act(ec, bench, checkpoint):
    """Every compressed copy of a trained CartPole agent acts in the env (valid actions, finite outputs); the int8
    and half-precision copies stay close to the fp32 agent, the structured-pruned ones really shrink."""
    args = ec.Args(checkpoint=str(checkpoint))
    agent, family, env_id, _ = ec.load_agent(args)
    assert family == "classic_control" and env_id == "CartPole-v1"
    obs = torch.from_numpy(envpool.make(env_id, env_type="gymnasium", num_envs=64, seed=0).reset()[0])
    rows = ec.compressed(agent, args, obs)
    assert list(rows) == [
        "fp32",
        "fp16",
        "bf16",
        "int8-dynamic",
        "int8-static",
        "structured-25%",
        "structured-50%",
        "structured-75%",
        "unstructured-50%",
        "unstructured-75%",
        "unstructured-90%",
    ]
    with torch.no_grad():
        ref_logits, ref_value = agent(obs)
        for name, build in rows.items():
            net = build()
            actions = play_actions(bench.Policy(net, gaussian=False), env_id)
            assert set(np.unique(actions)) <= {0, 1}, name
            logits, value = net(obs)
            if name in ("fp16", "bf16", "int8-dynamic", "int8-static"):
                torch.testing.assert_close(logits.float(), ref_logits, atol=0.05, rtol=0.05)
                torch.testing.assert_close(value.float(), ref_value, atol=0.05 * ref_value.abs().max(), rtol=0.05)
            if name.startswith("structured"):
                ratio = int(name[-3:-1]) / 100
                assert net.actor[0].out_features == round(64 * (1 - ratio))
                assert net.actor[4].out_features == 2 and net.critic[4].out_features == 1  # heads keep their outputs
            if name.startswith("unstructured"):
                assert ec.zero_fraction(net) >= int(name[-3:-1]) / 100 - 0.01


def serialized_bytes(state_dict) -> int:
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    return len(buffer.getvalue())


def test_eval_compressed_table(ec, checkpoint, tmp_path):
    """One row per method; sizes are the serialized state_dicts' bytes. Eager (--no-compile): the compiled timings
    cost a compile per method, tens of seconds each."""
    table = tmp_path / "compression.md"
    proc = run_tool(
        "eval_compressed.py",
        str(checkpoint),
        "--episodes",
        "4",
        "--batch",
        "4",
        "--passes",
        "5",
        "--table",
        str(table),
        "--no-compile",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r[0]: r for r in table_rows(table)}
    expected = [
        "fp32",
        "fp16",
        "bf16",
        "int8-dynamic",
        "int8-static",
        "structured-25%",
        "structured-50%",
        "structured-75%",
        "unstructured-50%",
        "unstructured-75%",
        "unstructured-90%",
    ]
    assert list(rows) == expected
    for r in rows.values():
        mean = float(r[1].split()[0])
        assert 1 <= mean <= 500  # CartPole returns
        assert float(r[2]) > 0
    size = {name: int(r[5]) for name, r in rows.items()}
    for name, r in rows.items():
        assert float(r[4]) == pytest.approx(size[name] / 1e6, abs=5e-4)  # MB from the same bytes
    agent_state = torch.load(checkpoint, weights_only=True)["agent"]
    assert size["fp32"] == serialized_bytes(agent_state)
    assert size["int8-static"] < size["fp32"]
    agent = ec.load_agent(ec.Args(checkpoint=str(checkpoint)))[0]
    assert size["int8-dynamic"] == serialized_bytes(ec.int8_dynamic(agent).state_dict()) < size["fp32"]
    assert size["fp16"] == serialized_bytes(agent.half().state_dict()) < size["fp32"]
    assert size["structured-75%"] < size["structured-25%"] < size["fp32"]
    assert size["unstructured-90%"] == size["fp32"]  # dense zeros weigh as much
    assert rows["unstructured-90%"][6] == "90%"


def test_eval_compressed_atari(tmp_path):
    """An Atari checkpoint loads as the Nature CNN, plays whole games (the full score, lives exhausted) and prunes
    structurally; eager and two methods only, to keep it short."""
    run = tmp_path / "run"
    run_script("ppo_atari_envpool_torchcompile.py", *SMOKE, "--num-threads", "1", "--save-model", log_dir=run)
    table = tmp_path / "compression.md"
    proc = run_tool(
        "eval_compressed.py",
        str(run / "agent.pt"),
        "--methods",
        "structured",
        "--structured-ratios",
        "0.5",
        "--episodes",
        "2",
        "--batch",
        "2",
        "--passes",
        "3",
        "--num-threads",
        "1",
        "--no-compile",
        "--table",
        str(table),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## Breakout-v5" in table.read_text()
    rows = {r[0]: r for r in table_rows(table)}
    assert list(rows) == ["fp32", "structured-50%"]
    assert int(rows["structured-50%"][5]) < int(rows["fp32"][5]) / 2
    for r in rows.values():
        assert float(r[1].split()[0]) >= 0  # a game's score


@pytest.mark.parametrize(
    "flags,words",
    [
        (("--batch-sizes", "0"), ("--batch-sizes", "positive")),
        (("--families", "mujoco"), ("mujoco",)),
        (("--repeats", "-1"), ("--repeats",)),
    ],
)
def test_bench_inference_bad_input(flags, words):
    assert_user_error(run_tool("bench_inference.py", *flags), *words)


def test_eval_compressed_bad_input(checkpoint, tmp_path):
    assert_user_error(run_tool("eval_compressed.py", str(tmp_path / "missing.pt")), "no such file")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert_user_error(run_tool("eval_compressed.py", str(tmp_path / "junk.pt")), "not a checkpoint")
    assert_user_error(run_tool("eval_compressed.py", str(checkpoint), "--env-id", "Breakout-v5"), "Breakout-v5")
    assert_user_error(run_tool("eval_compressed.py", str(checkpoint), "--episodes", "0"), "--episodes")
    assert_user_error(run_tool("eval_compressed.py"), "missing", "agent.pt")


@pytest.mark.parametrize(
    "family,env_id,num_envs",
    [("classic", "CartPole-v1", 4), ("atari", "Breakout-v5", 8), ("mujoco", "HalfCheetah-v4", 1)],
)
def test_bench_env_writes_a_run(family, env_id, num_envs, tmp_path):
    """The family's default env and env count, one metrics line an iteration, fps only after the burn-in."""
    proc = run_tool(
        "bench_env.py",
        "--family",
        family,
        "--num-steps",
        "16",
        "--total-timesteps",
        str(64 * num_envs),
        "--log-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_id"] == env_id and summary["global_step"] == 64 * num_envs
    assert summary["flags"]["num_envs"] == num_envs
    assert summary["fps"] > 0 and summary["final_return"] is None
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [16 * num_envs * i for i in range(1, 5)]
    assert [r["fps"] is None for r in rows] == [True, True, False, False]  # --measure-burnin 2


@pytest.mark.parametrize(
    "flags,words",
    [
        (("--family", "atari", "--env-id", "HalfCheetah-v4"), ("HalfCheetah-v4", "atari")),
        (("--family", "classic", "--env-id", "NoSuchEnv-v0"), ("NoSuchEnv-v0",)),
        (("--num-envs", "0"), ("--num-envs",)),
        (("--total-timesteps", "10"), ("--total-timesteps", "iteration")),
    ],
)
def test_bench_env_bad_input(flags, words):
    assert_user_error(run_tool("bench_env.py", *flags), *words)


IDIOM_BUDGETS = {
    "classic": ["--total-timesteps", "1536", "--num-steps", "128"],
    "dqn_atari": ["--total-timesteps", "300", "--learning-starts", "100", "--measure-burnin", "50", "--log-every", "50"]
    + ["--buffer-size", "200", "--batch-size", "8"],
    "td3": ["--total-timesteps", "400", "--learning-starts", "200", "--batch-size", "32", "--buffer-size", "1000"]
    + ["--log-every", "100", "--measure-burnin", "100"],
}


@pytest.mark.parametrize("family", list(IDIOM_BUDGETS))
def test_bench_idiom_swaps_in_units_that_compute_the_scripts_own(tmp_path, family):
    """bench_idiom.py's LeanRL-idiom units (loss.backward(), optimizer.step()) in place of the script's functional ones
    (torch.func.grad, torch.optim's functional Adam): eager, the run logs the very losses the script's own units
    give."""
    losses = {}
    for idiom in ("functional", "leanrl"):
        log = tmp_path / idiom
        flags = [*IDIOM_BUDGETS[family], "--seed", "1", "--num-threads", "1", "--log-dir", str(log)]
        proc = run_tool("bench_idiom.py", "--worker", family, idiom, *flags)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
        losses[idiom] = [[v for k, v in r.items() if "loss" in k] for r in rows]
    assert any(v is not None for row in losses["functional"] for v in row)
    assert losses["leanrl"] == losses["functional"]


def test_mujoco_versions_sees_no_drift_between_one_simulator_and_itself():
    """mujoco_versions.py's drift: two copies of envpool's HalfCheetah from one seed agree exactly at every step
    (identical simulators, identical actions), and two seeds apart they differ from the first step."""
    mv = importlib.import_module("mujoco_versions")
    first_a, step_a, action_dim = mv.envpool_sim("HalfCheetah-v4", 1)
    first_b, step_b, _ = mv.envpool_sim("HalfCheetah-v4", 1)
    assert action_dim == 6 and np.array_equal(first_a, first_b)
    assert mv.drift(step_a, step_b, 50, action_dim, seed=1) == [(0.0, 0.0)] * 50
    _, step_c, _ = mv.envpool_sim("HalfCheetah-v4", 2)
    assert mv.drift(step_a, step_c, 1, action_dim, seed=1)[0][0] > 0


def test_mujoco_versions_without_mujoco_says_so():
    """leanrl's requirements leave gymnasium's MuJoCo out: the tool says in one line what to install."""
    if importlib.util.find_spec("mujoco") is not None:
        pytest.skip("mujoco is installed here")
    assert_user_error(run_tool("mujoco_versions.py", "--steps", "5"), "mujoco package")


@pytest.mark.parametrize(
    "tool,flags,words",
    [
        # bench_seeds.py checked --processes only after its whole ordinary phase (issue 59)
        ("bench_seeds.py", ["--num-seeds", "3", "--processes", "2"], ["--num-seeds 3", "--processes 2"]),
        ("bench_seeds.py", ["--processes", "0"], ["--processes"]),
        ("bench_seeds.py", ["--num-seeds", "0"], ["--num-seeds"]),
        ("bench_seeds.py", ["--total-timesteps", "-5"], ["--total-timesteps"]),
        ("bench_seeds.py", ["--sizes", "0"], ["--sizes"]),
        ("bench_idiom.py", ["--families", "nope"], ["--families", "nope"]),
        ("bench_idiom.py", ["--idioms", "nope"], ["--idioms", "nope"]),
        ("bench_idiom.py", ["--seeds", "-1"], ["--seeds"]),
    ],
)
def test_bench_tools_refuse_bad_flags_before_any_work(tool, flags, words, tmp_path):
    """One line and exit code 2 before any run starts: nothing is written into --out. (A small budget: where a check is
    missing, the tool's runs start, and fail the test, at little cost.)"""
    out = tmp_path / "out"
    budget = ["--total-timesteps", "512"] if tool == "bench_seeds.py" and "--total-timesteps" not in flags else []
    assert_user_error(run_tool(tool, *budget, *flags, "--out", str(out)), *words)
    assert not out.exists()


def test_bench_scaling_refuses_an_out_dir_it_cannot_write_before_any_run(tmp_path):
    """bench_scaling.py created --out-dir only after every world size had run, then lost the numbers to a traceback."""
    (tmp_path / "file").write_text("")
    out_dir = tmp_path / "file" / "scaling"
    flags = ["--max-world-size", "1", "--total-timesteps", "2048", "--num-envs", "1", "--no-compile"]
    proc = run_tool("bench_scaling.py", *flags, "--out-dir", str(out_dir))
    assert_user_error(proc, "--out-dir")
    assert "world size 1" not in proc.stderr  # refused before the first run
