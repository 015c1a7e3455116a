"""Shared test settings: headless matplotlib, one torch thread (as the CLI's default)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)
