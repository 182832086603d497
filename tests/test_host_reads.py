"""The eager PPO baselines read the device from the host as often as CleanRL's scripts do, and no more: once per
minibatch (CleanRL's `clipfracs += [... .item()]`). On a GPU each read waits for the device to drain; a baseline that
reads more runs slower than CleanRL's and inflates every speed-up measured against it.

Each baseline runs at the smoke budget with its own host reads (`Tensor.item`, `Tensor.tolist` called from leanrl's
code; torch.optim's reads of its host-side step counters are not device reads) counted."""

import json
import sys

import pytest

from conftest import ROOT, SMOKE, run_command

COUNTING = """
import json, os, runpy, sys, torch
reads = [0]
for name in ("item", "tolist"):
    method = getattr(torch.Tensor, name)
    def counted(self, *args, _method=method, **kwargs):
        reads[0] += sys._getframe(1).f_code.co_filename.startswith(LEANRL)  # the script's reads, not torch's own
        return _method(self, *args, **kwargs)
    setattr(torch.Tensor, name, counted)
script, out, *flags = sys.argv[1:]
sys.argv = [script, *flags]
LEANRL = os.path.dirname(script)
sys.path.insert(0, LEANRL)  # as `python leanrl/<script>` has it
try:
    runpy.run_path(script, run_name="__main__")
finally:
    json.dump(dict(reads=reads[0]), open(out, "w"))
"""
# the smoke budget is 4 iterations; epochs x minibatches per iteration are each family's defaults (CleanRL's)
BASELINES = {"ppo.py": 4 * 4, "ppo_atari_envpool.py": 4 * 4, "ppo_continuous_action.py": 10 * 32}


@pytest.mark.parametrize("script", BASELINES)
def test_a_baseline_reads_the_device_once_per_minibatch(script, tmp_path):
    iterations = 4
    minibatches = iterations * BASELINES[script]
    flags = [*SMOKE, "--num-threads", "1", "--log-dir", tmp_path / "run"]
    proc = run_command(
        [sys.executable, "-c", COUNTING, ROOT / "leanrl" / script, tmp_path / "reads.json", *flags], tmp_path / "out"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reads = json.loads((tmp_path / "reads.json").read_text())["reads"]
    assert minibatches <= reads <= minibatches + 3 * iterations, reads  # a few more per iteration: the log line
