"""The library's entry points use the CLI's thread policy: $OTAFL_THREADS, else one thread."""

import subprocess
import sys

CODE = """
import torch
from otafl.api import bound_grid
import otafl.device
torch.set_num_threads({preset})
bound_grid(users=[20], p=[0.5], sigma2=[0.1], clip=[1.0], snr_db=[10.0], accountants=["tight"])
print(torch.get_num_threads())
"""


def _threads(preset, env=None):
    import os

    environ = {k: v for k, v in os.environ.items() if k != "OTAFL_THREADS"} | (env or {})
    out = subprocess.run([sys.executable, "-c", CODE.format(preset=preset)], capture_output=True, text=True,
                         env=environ, check=True)
    return int(out.stdout.split()[-1])


def test_library_calls_default_to_one_thread_or_otafl_threads_and_keep_a_callers_choice():
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)  # a fresh process's
    other = default + 1  # a count the caller sets: anything but torch's own default is kept
    assert _threads(other) == other
    if default != 1:
        assert _threads("torch.get_num_threads()") == 1
    assert _threads("torch.get_num_threads()", {"OTAFL_THREADS": str(other)}) == other
