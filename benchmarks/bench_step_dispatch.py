"""What the model contract costs a step: moving a batch and reading the loss through perfsweep.task
against the GPT-only code it replaced (two ``.to()`` calls and a tuple unpack), side by side.

    python benchmarks/bench_step_dispatch.py [--n 20000]

Prints microseconds per step for each; the steps they sit in take milliseconds (CPU) or tens of
milliseconds (MiniGPT on an H100), so the difference is the figure that matters.
"""

from __future__ import annotations

import argparse
import json
import timeit

import torch

from perfsweep import task
from perfsweep.config import ModelConfig
from perfsweep.model import GPTOutput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    x = torch.zeros(8, 128, dtype=torch.long)
    y, dev, out = x.clone(), torch.device("cpu"), GPTOutput(x, torch.tensor(1.0))
    loss_fn = task.loss_function(ModelConfig(name="small", ckpt_modules=["Block"]))

    class Returns(torch.nn.Module):
        def forward(self, idx, targets):
            return out

    model = Returns()

    def before() -> None:
        a, b = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        _, loss = model(a, b)

    def after() -> None:
        loss_fn(model, task.to_device((x, y), dev))

    rounds = {name: [] for name in ("before_us", "after_us")}
    for _ in range(5):  # interleaved, the best of five each
        for name, fn in (("before_us", before), ("after_us", after)):
            rounds[name].append(timeit.timeit(fn, number=args.n) / args.n * 1e6)
    result = {k: round(min(v), 2) for k, v in rounds.items()}
    result["extra_us_per_step"] = round(result["after_us"] - result["before_us"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
