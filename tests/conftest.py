"""Shared test settings: headless matplotlib, at most 2 torch threads."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
