"""The CUDA-graph contract (DESIGN.md), checked on the CPU for every torchcompile script.

Each script runs with `--compile --cudagraphs` at its smallest budget under tests/cudagraph_contract.py, which keeps
`--cudagraphs` on without CUDA and stands in for every `CudaGraphModule` the script builds: each unit a CUDA graph would
capture must see one input signature from its capture on, trace whole under dynamo (the three breaks of LeanRL's
update idiom aside), keep its tensors and its optimizers' state on the learner's device with `capturable` as that
device asks, and neither write its inputs, return tensors that require grad, nor draw from torch's global generator;
and, run once on a simulated CUDA device, read or make nothing on the host. Then the run is resumed from the
checkpoint a CUDA-graph run would have written (capturable Adam state, CUDA generators): the resumed run must take its
own settings, not the checkpoint's, step with the lr it logs, and go on with its generators re-seeded, said in one
line. The DDP scripts also run on two ranks, where the update holds the gradient all-reduce. On the CPU, what each
script compiles is the set of units that pay there (`CPU_COMPILED`).

What the CPU cannot show (a real CUDA run's speed and memory, the capture itself) `tests/test_gpu.py` checks on a GPU.
"""

import json
import math
import sys

import pytest
import torch

import plumbing
from conftest import ROOT, SMOKE, Child, read_metrics
from test_dqn import TINY as DQN
from test_dqn_atari_envpool import TINY as DQN_ATARI
from test_ppo_ddp import free_port
from test_sac_continuous_action import TINY as OFFPOLICY

TORCHCOMPILE = sorted(p.name for p in (ROOT / "leanrl").glob("*_torchcompile.py"))
# per family, the smallest run that calls every unit, and the steps a resumed run goes on to
BUDGET = {
    "ppo": ([*SMOKE, "--num-threads", "1"], 384),
    "sac": (OFFPOLICY, 800),
    "td3": (OFFPOLICY, 800),
    "dqn_atari": (DQN_ATARI, 400),
    "dqn": (DQN, 800),
}
# the pruned scripts prune twice within the smoke budget: their units are rebuilt, and captured again, each time
PRUNE_TWICE = ["--prune-ratio", "0.5", "--prune-start", "2", "--prune-every", "1", "--prune-steps", "2"]
RUNNER = ROOT / "tests" / "cudagraph_contract.py"
# what `--compile` compiles on a CPU (doc/compile.md, "What compiles"): the units called often enough to pay back a cold
# start there. The ones a loop calls once an iteration (PPO's evaluate, get_value, Atari's gae), once in hundreds of
# steps (DQN's target copy) or that cost little beside the update (SAC's and TD3's acting and soft target copy) compile
# on CUDA only, where the block compiles and captures every unit
CPU_COMPILED = {
    "dqn_atari_envpool_torchcompile.py": {"act", "update"},
    "dqn_torchcompile.py": {"update"},
    "ppo_atari_envpool_compile_async_torchcompile.py": {"policy", "update"},
    "ppo_atari_envpool_ddp_torchcompile.py": {"policy", "update"},
    "ppo_atari_envpool_pruned_torchcompile.py": {"policy", "update"},
    "ppo_atari_envpool_quantized_torchcompile.py": {"rollout_values", "update"},
    "ppo_atari_envpool_seeds_torchcompile.py": {"policy", "update"},
    "ppo_atari_envpool_torchcompile.py": {"policy", "update"},
    "ppo_compile_async_torchcompile.py": {"update"},
    "ppo_continuous_action_seeds_torchcompile.py": {"Normalizer.obs", "update"},
    "ppo_continuous_action_torchcompile.py": {"Normalizer.obs", "update"},
    "ppo_ddp_torchcompile.py": {"update"},
    "ppo_pruned_torchcompile.py": {"update"},
    "ppo_quantized_torchcompile.py": {"act", "behaviour_logprob", "update"},
    "ppo_seeds_torchcompile.py": {"update"},
    "ppo_teacher_student_torchcompile.py": {"Agent.get_value", "update"},  # the teacher's value, part of its trick
    "ppo_torchcompile.py": {"update"},
    "sac_continuous_action_torchcompile.py": {"update_actor", "update_critic"},
    "td3_continuous_action_torchcompile.py": {"update_actor", "update_critic"},
}
CUDA_RNG_STATE = torch.zeros(plumbing.CUDA_RNG_STATE_BYTES, dtype=torch.uint8)


def flags_of(script: str) -> list:
    budget, _ = next(b for family, b in BUDGET.items() if script.startswith(family))
    flags = [*budget, "--compile", "--cudagraphs", "--seed", "1"]
    if "pruned" in script:
        flags += PRUNE_TWICE
    if "numpy_act: bool" in (ROOT / "leanrl" / script).read_text():
        # on CUDA the learner's units act in torch; numpy acting is a CPU path that no CUDA graph wraps
        flags.append("--no-numpy-act")
    return flags


def contract_run(script: str, *flags, log_dir, ranks: int = 1) -> list:
    """The script under the contract's recorder (on `ranks` ranks through torchrun); returns each rank's findings."""
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1"]
        launch += ["--master-port", str(free_port())]
    proc = Child([*launch, RUNNER, ROOT / "leanrl" / script, *flags, "--log-dir", log_dir], log_dir).result(600)
    names = ["contract.json"] if ranks == 1 else [f"contract.{r}.json" for r in range(ranks)]
    assert all((log_dir / name).exists() for name in names), proc.stderr[-3000:]
    return [json.loads((log_dir / name).read_text()) for name in names]


def assert_contract_holds(found: dict, log_dir):
    assert found["device"] == "cpu"
    assert found["units"], "no unit was wrapped for CUDA graphs"
    assert any(u["calls"] > 2 for u in found["units"]), "no unit was replayed"
    problems = [f"{u['name']}: {v}" for u in found["units"] for v in u["violations"]] + found["optimizers"]
    # every optimizer steps with the lr the run logs (or, where it logs none, the lr it was given)
    rows = read_metrics(log_dir)
    flags = json.loads((log_dir / "summary.json").read_text())["flags"]
    given = [v for k, v in flags.items() if k.endswith("lr") or k == "learning_rate"]
    logged = [rows[-1]["lr"]] if "lr" in rows[-1] else given
    if "members" in rows[-1]:  # a seeds run: each member's own lr
        logged = [member["lr"] for member in rows[-1]["members"]]
    for lr in found["optimizer_lr"]:
        if not any(math.isclose(lr, x, rel_tol=1e-6) for x in logged):
            problems.append(f"an optimizer steps with lr {lr}, the run's is {logged}")
    assert not problems, json.dumps(problems, indent=1)


def cuda_checkpoint(path, out):
    """The checkpoint at `path` as a CUDA-graph run writes it: every Adam capturable, its step counters float32 (torch
    keeps them on the device for such a run; the checkpoint loads onto the host), and the loop's generators CUDA ones
    (a 16-byte state, where a CPU generator's is 5,056)."""
    ckpt = torch.load(path, weights_only=True)
    for holder in [ckpt, *ckpt.get("ranks", [])]:  # a DDP run's generators are per rank
        if "rng" in holder:
            rng = holder["rng"]
            holder["rng"] = [CUDA_RNG_STATE] * len(rng) if isinstance(rng, list) else CUDA_RNG_STATE
    for value in ckpt.values():
        if isinstance(value, dict) and {"state", "param_groups"} <= value.keys():
            for group in value["param_groups"]:
                group["capturable"] = True
            for state in value["state"].values():
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32)
    torch.save(ckpt, out)


@pytest.mark.parametrize("script", TORCHCOMPILE, ids=[s[:-3] for s in TORCHCOMPILE])
def test_units_keep_the_cuda_graph_contract_and_a_resume_takes_its_own_settings(script, tmp_path):
    flags = flags_of(script)
    (found,) = contract_run(script, *flags, "--save-model", log_dir=tmp_path / "first")
    assert_contract_holds(found, tmp_path / "first")
    assert set(found["compiled"]) == CPU_COMPILED[script]

    cuda_checkpoint(tmp_path / "first" / "agent.pt", tmp_path / "cuda.pt")
    _, resumed_steps = next(b for family, b in BUDGET.items() if script.startswith(family))
    i = flags.index("--total-timesteps")
    flags[i + 1] = str(resumed_steps)
    (found,) = contract_run(script, *flags, "--resume", tmp_path / "cuda.pt", log_dir=tmp_path / "resumed")
    assert read_metrics(tmp_path / "resumed")[0]["global_step"] > read_metrics(tmp_path / "first")[-1]["global_step"]
    assert_contract_holds(found, tmp_path / "resumed")
    # a run moved from a GPU node to a CPU goes on, its generators re-seeded, and says so
    assert "--resume: a checkpoint written on CUDA, resumed on cpu" in (tmp_path / "resumed.stderr").read_text()


DDP = ["ppo_ddp_torchcompile.py", "ppo_atari_envpool_ddp_torchcompile.py"]


@pytest.mark.parametrize("script", DDP, ids=[s[:-3] for s in DDP])
def test_ddp_update_traces_whole_with_its_all_reduce_on_two_ranks(script, tmp_path):
    """Two ranks on gloo, where CUDA graphs are refused (gloo's all-reduce cannot be captured; NCCL's can): the
    compiled units, the update with its gradient all-reduce among them, trace whole as they must under CUDA graphs."""
    flags = [f for f in flags_of(script) if f != "--cudagraphs"]
    for found in contract_run(script, *flags, log_dir=tmp_path / "run", ranks=2):
        assert "update" in found["compiled"]
        assert not any(found["compiled"].values()), json.dumps(found["compiled"], indent=1)
