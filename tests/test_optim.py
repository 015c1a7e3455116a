"""The server optimizers (otafl/fl/optim.py) are torch.optim's updates, without torch.compile's
import: the same parameters after several steps as ``torch.optim.Adam(fused=True)`` /
``torch.optim.SGD``, and a training process never imports ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from otafl.fl.optim import make_optimizer


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_the_server_optimizer_takes_torch_optims_steps(name):
    gen = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(7, 3, generator=gen)), torch.nn.Parameter(torch.randn(5, generator=gen))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = make_optimizer(name, ours, 1e-2)
    ref_opt = torch.optim.Adam(ref, lr=1e-2, fused=True) if name == "adam" else torch.optim.SGD(ref, lr=1e-2)
    for _ in range(25):
        for p, q in zip(ours, ref):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref):
        # the same kernel on the same state: equal up to float32 rounding (a stated tolerance, as
        # a later torch may reorder its arithmetic)
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
        assert not torch.equal(p.detach(), torch.zeros_like(p))


def test_a_training_run_does_not_import_torch_compile(tmp_path):
    code = ("import sys, otafl; from otafl.config import load_spec; from otafl.fl.loop import run_experiment; "
            "cfg = load_spec('experiments/quickstart.toml', ['train.rounds=3', "
            "\"privacy.accountants=[]\", 'train.eval_every=3']); run_experiment(cfg); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
