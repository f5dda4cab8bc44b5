"""Shared test setup: no network (the hub fails at once instead of retrying), few threads."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
