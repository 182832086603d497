"""The GPU path without a GPU (DESIGN.md, "The CUDA-graph contract"): the simulated CUDA device of
tests/cudagraph_contract.py, and checkpoints that cross devices.

tests/test_cudagraph_contract.py runs every unit of every torchcompile script once on the simulated device; here the
simulation itself is checked to see what it must (a tensor made on the host inside a unit, optimizer state or an lr
left on the host, a host read) and to pass what a CUDA run does right. `plumbing.restore_rngs` is checked both ways:
a CUDA generator's state (16 bytes) resumed on a CPU, a CPU one's (5,056) on CUDA, where no CUDA generator can exist
here: a stand-in with a CUDA generator's state takes its place. Every script's CUDA-to-CPU resume runs in
tests/test_cudagraph_contract.py.
"""

import functools

import numpy as np
import pytest
import torch
from torch.optim.adam import adam

import cudagraph_contract as contract
import plumbing
from test_plumbing import Args

CUDA_STATE = torch.zeros(plumbing.CUDA_RNG_STATE_BYTES, dtype=torch.uint8)


def step(model, optimizer, lr, x, target, *, make=None):
    """A unit as the scripts write them: forward, gradients, a functional Adam step on the optimizer's own state."""
    params = dict(model.named_parameters())
    grads = torch.func.grad(lambda p: (torch.func.functional_call(model, p, (x,)) - target).pow(2).mean())(params)
    state = [optimizer.state[p] for p in params.values()]
    with torch.no_grad():
        adam(
            list(params.values()),
            list(grads.values()),
            [s["exp_avg"] for s in state],
            [s["exp_avg_sq"] for s in state],
            [],
            [s["step"] for s in state],
            foreach=False,
            capturable=optimizer.param_groups[0]["capturable"],
            amsgrad=False,
            beta1=0.9,
            beta2=0.999,
            lr=lr,
            weight_decay=0.0,
            eps=1e-5,
            maximize=False,
        )
    out = grads["weight"].norm()
    return make(out) if make else out


def simulated(make=None, state=torch.zeros_like, lr_device=True, make_x=None):
    """`step` built as a script builds it on the learner's device (the CPU here), then run on the simulated device;
    `state` makes the Adam moments, `lr_device` says whether the lr tensor is given the device, `make_x` makes the
    input."""
    device = torch.device("cpu")
    contract.LEARNER["device"] = device
    with contract.HOST_TAGS:
        model = torch.nn.Linear(3, 2).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=False)
        for p in model.parameters():
            optimizer.state[p] = dict(step=torch.zeros((), device="cpu"), exp_avg=state(p), exp_avg_sq=state(p))
        lr = torch.tensor(1e-3, device=device) if lr_device else torch.tensor(1e-3)
        x = make_x() if make_x else torch.zeros(4, 3, device=device)
        target = torch.zeros(4, 2, device=device)
    contract.OPTIMIZERS[:] = [optimizer]
    unit = functools.partial(step, model, optimizer, lr, make=make)
    weight = model.weight.detach().clone()
    found = contract.simulate(unit, (x, target), {})
    assert torch.equal(model.weight, weight), "the simulation wrote the run's own parameters"
    return found


def test_a_unit_that_keeps_to_the_learners_device_passes():
    assert simulated() is None
    # a scalar the unit makes itself: a CUDA op takes it, and a constant is the same at every replay
    assert simulated(make=lambda out: out + torch.tensor(0.5)) is None


@pytest.mark.parametrize(
    "make, op",
    [
        (lambda out: out + torch.zeros(1), "aten.zeros"),  # made without device=
        (lambda out: out * torch.tensor([1.0, 2.0]), "aten.lift_fresh"),  # a host constant
    ],
    ids=["zeros-without-device", "host-constant"],
)
def test_a_tensor_made_on_the_host_inside_a_unit_is_named(make, op):
    found = simulated(make=make)
    assert found and op in found and "on cpu" in found, found


def test_optimizer_state_left_on_the_host_is_seen():
    found = simulated(state=lambda p: torch.zeros(p.shape))
    assert found and "reads a tensor on cpu" in found, found


def test_an_lr_left_on_the_host_is_seen():
    found = simulated(lr_device=False)
    assert found and "reads a tensor on cpu" in found, found


def test_an_input_from_numpy_not_moved_to_the_device_is_seen(monkeypatch):
    monkeypatch.setattr(torch, "from_numpy", torch.from_numpy)  # the runner's tagging, undone after the test
    contract.host_from_numpy()
    found = simulated(make_x=lambda: torch.from_numpy(np.zeros((4, 3), np.float32)))
    assert found and "reads a tensor on cpu" in found, found
    assert simulated(make_x=lambda: torch.from_numpy(np.zeros((4, 3), np.float32)).to(torch.device("cpu"))) is None


def test_a_host_read_inside_a_unit_is_seen():
    found = simulated(make=lambda out: out.item())
    assert found and "item" in found, found


class CudaGenerator:
    """What `restore_rngs` sees of a CUDA generator: its 16-byte state and its device."""

    device = torch.device("cuda")

    def __init__(self):
        self.state = CUDA_STATE.clone()
        self.seeded = None

    def get_state(self):
        return self.state

    def set_state(self, state):
        assert len(state) == len(self.state), "a CPU generator's state set into a CUDA generator"
        self.state = state

    def manual_seed(self, seed):
        self.seeded = seed
        return self


def draws(rng) -> torch.Tensor:
    return torch.rand(8, generator=rng)


def one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_generator_resumed_on_its_own_device_goes_on_with_its_stream(capsys):
    written = torch.Generator().manual_seed(3)
    draws(written)
    resumed = torch.Generator().manual_seed(99)
    plumbing.restore_rngs([resumed], [written.get_state()], [3], 100)
    assert torch.equal(draws(resumed), draws(written))
    assert capsys.readouterr().err == ""


def test_a_cuda_checkpoint_resumed_on_a_cpu_goes_on_reseeded_from_seed_and_step(capsys):
    first, again, later = (torch.Generator() for _ in range(3))
    plumbing.restore_rngs([first], [CUDA_STATE], [3], 100)
    line = one_line(capsys)
    assert "CUDA" in line and "cpu" in line and "100" in line, line
    plumbing.restore_rngs([again], [CUDA_STATE], [3], 100)
    plumbing.restore_rngs([later], [CUDA_STATE], [3], 200)
    capsys.readouterr()
    assert torch.equal(draws(first), draws(again)), "the same checkpoint resumes to the same numbers"
    assert not torch.equal(draws(first), draws(later)), "another step, another stream"


def test_a_cpu_checkpoint_resumed_on_cuda_goes_on_reseeded_from_seed_and_step(capsys):
    members = [CudaGenerator(), CudaGenerator()]
    cpu_state = torch.Generator().manual_seed(3).get_state()
    plumbing.restore_rngs(members, [cpu_state, cpu_state], [3, 4], 100)
    line = one_line(capsys)
    assert "CPU" in line and "cuda" in line and "100" in line, line
    seeds = [g.seeded for g in members]
    assert None not in seeds and seeds[0] != seeds[1], "each member its own stream"
    again = CudaGenerator()
    plumbing.restore_rngs([again], [cpu_state], [3], 100)
    assert again.seeded == seeds[0]


def test_the_reseed_line_names_the_writing_device_the_checkpoint_records(tmp_path, capsys):
    """A checkpoint records each generator's device beside its state (the state's size guessed it: 16 bytes "CUDA",
    anything else "a CPU"); the line names that device and says that the run now differs from the uninterrupted one
    (issue 59). A checkpoint of the format before (a bare state) resumes as it did."""
    path = str(tmp_path / "agent.pt")
    plumbing.save_checkpoint(path, "script_a", Args(), global_step=100, rng=torch.Generator().manual_seed(3))
    saved = plumbing.load_checkpoint(Args(resume=path), "script_a")["rng"]
    assert saved["device"] == "cpu" and torch.equal(saved["state"], torch.Generator().manual_seed(3).get_state())
    other = dict(state=torch.zeros(44, dtype=torch.uint8), device="mps")  # another device's generator, another size
    plumbing.restore_rngs([torch.Generator()], [other], [3], 100)
    line = one_line(capsys)
    assert "written on mps, resumed on cpu" in line and "no longer" in line, line
    resumed = torch.Generator()
    plumbing.resume(dict(global_step=100, rng=saved), 3, restart=True, rng=resumed)
    assert torch.equal(draws(resumed), draws(torch.Generator().manual_seed(3))) and capsys.readouterr().err == ""
    old = torch.Generator()
    plumbing.resume(dict(global_step=100, rng=saved["state"]), 3, restart=True, rng=old)
    assert torch.equal(draws(old), draws(torch.Generator().manual_seed(3))) and capsys.readouterr().err == ""


def test_the_reseed_line_is_said_by_rank_0_only(capsys, monkeypatch):
    """Under torchrun every rank restores its own generator: the line comes once, from rank 0, not once a rank."""
    monkeypatch.setenv("RANK", "1")
    rng = torch.Generator()
    plumbing.restore_rngs([rng], [CUDA_STATE], [3], 100)
    assert capsys.readouterr().err == ""
    again = torch.Generator()
    plumbing.restore_rngs([again], [CUDA_STATE], [3], 100)
    assert torch.equal(draws(rng), draws(again)), "re-seeded all the same"


def test_the_device_generator_is_the_cuda_default_one_on_a_gpu(monkeypatch):
    """What the eager baselines sample from on a GPU (a Categorical's, a Normal's sample, torch.randint without a
    generator) is the device's default generator, which no checkpoint saved (issue 59): `device_generator` names it, the
    CPU's on a CPU."""
    gpus = (CudaGenerator(), CudaGenerator())
    monkeypatch.setattr(torch.cuda, "default_generators", gpus)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert plumbing.device_generator(torch.device("cuda", 0)) is gpus[0]
    assert plumbing.device_generator(torch.device("cuda")) is gpus[1]
    assert plumbing.device_generator(torch.device("cpu")) is torch.default_generator


def test_a_checkpoint_without_the_cuda_generator_resumes_it_reseeded(capsys):
    """A checkpoint written before the device's generator was saved: a CUDA one is re-seeded from the seed and the
    step, said in one line (it would replay the first run's noise); the CPU's is the one `torch_rng` restores, left
    as it is, without a word."""

    class CudaDefault(torch.Generator):
        """A torch.Generator as resume sees the CUDA default one: on cuda, re-seeded by manual_seed."""

        device = torch.device("cuda")
        seeded = None

        def manual_seed(self, seed):
            self.seeded = seed
            return self

    gpu = CudaDefault()
    plumbing.resume(dict(global_step=100), 3, restart=True, device_rng=gpu)
    line = one_line(capsys)
    assert gpu.seeded is not None and "device_rng" in line and "100" in line, line
    cpu = torch.Generator().manual_seed(5)
    plumbing.resume(dict(global_step=100), 3, restart=True, device_rng=cpu)
    assert torch.equal(draws(cpu), draws(torch.Generator().manual_seed(5))) and capsys.readouterr().err == ""
