"""fp16 loss scaling follows torch.amp.GradScaler's rule step for step, decided by the global gradient norm."""

import math

import torch

from runtime.train.loss_scale import LossScale


def test_loss_scale_follows_grad_scaler_over_overflows_and_growth():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.0)
    ref = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    ours = LossScale(True, init_scale=1024.0, growth_interval=3)
    overflow = [False, False, False, True, False, True, True, False, False, False, False]
    for bad in overflow:
        for scaler_step in ("ref", "ours"):
            opt.zero_grad()
            loss = (p * (math.inf if bad else 1.0)).sum()
            if scaler_step == "ref":
                ref.scale(loss).backward()
                ref.step(opt)
                ref.update()
            else:
                ours.scale(loss).backward()
                ours.unscale_([p])
                took = ours.update(float(p.grad.norm()))
                assert took == (not bad)
                # unscaled gradients are the true ones
                if not bad:
                    assert torch.equal(p.grad, torch.ones(4))
        assert ours.value == ref.get_scale()
    assert ours.skipped == sum(overflow)


def test_disabled_scaling_changes_nothing():
    s = LossScale(False)
    loss = torch.tensor(3.0)
    assert s.scale(loss) is loss and s.update(math.inf)
