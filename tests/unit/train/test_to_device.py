"""Training batches reach the device intact; on CUDA by a pinned, non-blocking copy that the caller's tensor
may change right after (the copy reads the pinned staging copy)."""

import torch

from tformer_cli.train.tasks import to_device


def test_batches_reach_the_device_intact(device):
    batch = torch.randint(0, 100, (64, 33))
    got = to_device(batch, device)
    assert got.device.type == device.type and got.dtype == batch.dtype and torch.equal(got.cpu(), batch)
    outs, sources = [], []
    for i in range(20):
        source = torch.full((256, 256), i)
        outs.append(to_device(source, device) * 1)  # queued work that reads the copy
        source.fill_(-1)  # the caller reuses its tensor at once
        sources.append(source)
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert all(bool((out == i).all()) for i, out in enumerate(outs))
