"""Names the bottom layer accepts that the CLI offers as choices, kept apart from the torch
code behind them (:mod:`otafl.device`) so that ``otafl --help`` and a misspelt option import
no torch. Each name's implementation stays in its module, which re-exports it from here."""

#: Accepted device names (``train.device``, ``--device``): ``auto`` = CUDA when present, CPU
#: otherwise (:func:`otafl.device.resolve_device`).
DEVICES = ("auto", "cpu", "cuda")
