"""One learning rate: every script's `adam_step` steps with the lr in its optimizer's param group, the one a CleanRL
user anneals (`optimizer.param_groups[0]["lr"] = lrnow`), as torch.optim.Adam would. It used to take the lr as an
argument of its own, so that CleanRL's annealing line, in a copy of the update, did nothing and the run trained at a
constant rate without a word (issue 50)."""

import glob
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import ROOT, load_script

SCRIPTS = sorted(
    Path(p).stem for p in glob.glob(str(ROOT / "leanrl" / "*_torchcompile.py")) if "adam_step(" in open(p).read()
)
MEMBERS = 2  # the seeds scripts' optimizers: each parameter stacked over the members, one lr per member


def reference_step(params, grads, lrs, group) -> list:
    """torch.optim.Adam's first step from fresh state at each member's lr (a plain script: one member)."""
    out = []
    for p, g in zip(params, grads):
        rows = []
        for k, lr in enumerate(lrs):
            x = nn.Parameter(p.detach()[k].clone() if len(lrs) > 1 else p.detach().clone())
            x.grad = g[k].clone() if len(lrs) > 1 else g.clone()
            torch.optim.Adam([x], lr=lr, betas=group["betas"], eps=group["eps"]).step()
            rows.append(x.detach())
        out.append(torch.stack(rows) if len(lrs) > 1 else rows[0])
    return out


@pytest.mark.parametrize("script", SCRIPTS)
def test_cleanrl_annealing_line_sets_the_step(script):
    module = load_script(script)
    seeds = "_seeds_" in script
    torch.manual_seed(0)
    shape = (MEMBERS, 3, 2) if seeds else (3, 2)
    net = nn.Module()
    net.w = nn.Parameter(torch.randn(shape))
    net.b = nn.Parameter(torch.randn(shape[:-1]))
    params = list(net.parameters())
    lr = torch.full((MEMBERS,), 1e-3) if seeds else torch.tensor(1e-3)
    takes_module = module.make_optimizer.__code__.co_varnames[0] in ("agent", "q_network")
    optimizer = module.make_optimizer(net if takes_module else params, lr, capturable=False)
    lrs = [0.05, 0.2] if seeds else [0.05]
    # CleanRL's line (a seeds script's lr is a tensor of one per member)
    optimizer.param_groups[0]["lr"] = torch.tensor(lrs) if seeds else lrs[0]
    grads = [torch.randn_like(p) for p in params]
    expected = reference_step(params, grads, lrs, optimizer.param_groups[0])
    (module.member_adam_step if seeds else module.adam_step)(optimizer, params, grads)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e)


@pytest.mark.parametrize("script", [s for s in SCRIPTS if "_seeds_" not in s])
def test_a_float_lr_on_a_cuda_learner_is_refused(script):
    """A CUDA learner's optimizer is capturable and its update may be a CUDA graph, which replays the lr it captured:
    CleanRL's float assignment there would train at one rate without a word, so `adam_step` refuses it in one line.
    Checked on the CPU with a capturable optimizer, as a CUDA learner makes it (the refusal comes before any step)."""
    module = load_script(script)
    net = nn.Linear(3, 2)
    params = list(net.parameters())
    takes_module = module.make_optimizer.__code__.co_varnames[0] in ("agent", "q_network")
    optimizer = module.make_optimizer(net if takes_module else params, torch.tensor(1e-3), capturable=True)
    optimizer.param_groups[0]["lr"] = 5e-4  # CleanRL's line
    before = [p.detach().clone() for p in params]
    with pytest.raises(TypeError, match=r"lr\.fill_"):
        module.adam_step(optimizer, params, [torch.ones_like(p) for p in params])
    for p, b in zip(params, before):
        torch.testing.assert_close(p.detach(), b)
