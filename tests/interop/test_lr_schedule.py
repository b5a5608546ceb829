"""The learning-rate schedule against transformers' schedulers (docs/training.md,
"Learning-rate schedule"): the engine's step s, counted from 1, trains at the rate that
transformers' LambdaLR gives after s scheduler steps, lr_lambda(s), which transformers'
own loop uses for its (s+1)-th update. So the first update is at lr / warmup_steps, not
at 0, and the warmup's last step reaches lr.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import json

import numpy as np
import pytest
import torch
import transformers

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

STEPS, WARMUP, LR = 12, 4, 3e-3


def engine_rates(tmp_path, decay, min_lr):
    run_dir = tmp_path / decay
    cmd = [SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
           "--dataset-cache", str(tmp_path / "datasets"),
           "--set", f"train.steps={STEPS}", "--set", f"optimizer.warmup_steps={WARMUP}",
           "--set", f"optimizer.lr={LR}", "--set", f"optimizer.min_lr={min_lr}",
           "--set", f"optimizer.decay={decay}", "--set", "train.log_interval=1",
           "--set", "train.eval_interval=0", "--set", "train.global_batch_size=2",
           "--set", "train.micro_batch_size=2", "--set", "model.num_layers=1",
           "--set", "train.seq_len=32", "--set", "runtime.threads=1"]
    run(cmd)
    lines = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    rates = {m["step"]: m["lr"] for m in lines if "loss" in m}
    assert sorted(rates) == list(range(1, STEPS + 1)), rates
    return [rates[s] for s in range(1, STEPS + 1)]


def transformers_rates(make_scheduler):
    """lr_lambda(s) for s = 1..STEPS: the rate after s scheduler steps."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(np.float32(LR)))
    scheduler = make_scheduler(optimizer)
    rates = []
    for _ in range(STEPS):
        optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    return rates


@pytest.mark.parametrize("decay", ["COSINE", "LINEAR"])
def test_each_step_trains_at_the_rate_transformers_gives_the_next_update(tmp_path, decay):
    min_lr = 3e-4 if decay == "COSINE" else 0.0  # transformers' linear decay ends at 0
    if decay == "COSINE":
        expected = transformers_rates(
            lambda opt: transformers.get_cosine_with_min_lr_schedule_with_warmup(
                opt, WARMUP, STEPS, min_lr=float(np.float32(min_lr))))
    else:
        expected = transformers_rates(
            lambda opt: transformers.get_linear_schedule_with_warmup(opt, WARMUP, STEPS))
    rates = engine_rates(tmp_path, decay, min_lr)
    np.testing.assert_allclose(rates, expected, rtol=1e-6, atol=1e-12)
    assert rates[0] == pytest.approx(LR / WARMUP, rel=1e-6)  # the first update is not at 0
    assert rates[WARMUP - 1] == pytest.approx(LR, rel=1e-6)
