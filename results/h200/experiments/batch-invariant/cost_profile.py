"""Where the torch mode's time goes in the invariance record's decoder (issue 54: forward 2.24x and training step
1.67x at batch 64 with the mode on): torch's profiler over forward passes at batch 1 and 256, the mode off and held
on, the ten largest entries by host time and by device time, and the count of kernel launches a pass.

    python results/h200/experiments/batch-invariant/cost_profile.py   (on a GPU)
"""
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from compare.invariance.decoder import Decoder, TorchRunner

MODEL = Decoder(vocab=32768, dim=1024, heads=8, hidden=4096, layers=2, length=128)
PASSES = 5


def main():
    runner = TorchRunner(MODEL, MODEL.weights(0), on_gpu=True)
    tokens = MODEL.tokens(256, 0)
    for batch in (1, 256):
        rows = tokens[np.arange(batch) % len(tokens)]
        for invariant in (False, True):
            with runner.held(invariant):
                runner.forward(rows, invariant)  # compiled and warm
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
                    for _ in range(PASSES):
                        runner.forward(rows, invariant)
            events = profiler.key_averages()
            launches = sum(event.count for event in events if event.device_type == torch.autograd.DeviceType.CUDA)
            print(f"\n=== batch {batch}, mode {'on' if invariant else 'off'}: {launches / PASSES:.0f} kernels a pass; "
                  f"per pass: host {sum(e.self_cpu_time_total for e in events) / PASSES / 1e3:.2f} ms, device "
                  f"{sum(e.self_device_time_total for e in events) / PASSES / 1e3:.2f} ms")
            print(events.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60))
            print(events.table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=60))


if __name__ == "__main__":
    main()
