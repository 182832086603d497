"""The GPU path without a GPU (DESIGN.md, "The CUDA-graph contract"): the simulated CUDA device of
tests/cudagraph_contract.py.

tests/test_cudagraph_contract.py runs every unit of every torchcompile script once on the simulated device; here the
simulation itself is checked to see what it must (a tensor made on the host inside a unit, optimizer state or an lr
left on the host, a host read) and to pass what a CUDA run does right.
"""

import functools

import pytest
import torch
from torch.optim.adam import adam

import cudagraph_contract as contract


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


def simulated(make=None, state=torch.zeros_like, lr_device=True):
    """`step` built as a script builds it on the learner's device (the CPU here), then run on the simulated device;
    `state` makes the Adam moments, `lr_device` says whether the lr tensor is given the device."""
    device = torch.device("cpu")
    contract.LEARNER["device"] = device
    with contract.HOST_TAGS:
        model = torch.nn.Linear(3, 2).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=False)
        for p in model.parameters():
            optimizer.state[p] = dict(step=torch.zeros((), device="cpu"), exp_avg=state(p), exp_avg_sq=state(p))
        lr = torch.tensor(1e-3, device=device) if lr_device else torch.tensor(1e-3)
        x = torch.zeros(4, 3, device=device)
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


def test_a_host_read_inside_a_unit_is_seen():
    found = simulated(make=lambda out: out.item())
    assert found and "item" in found, found
