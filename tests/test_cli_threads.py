"""The CLI runs one torch thread per process unless told otherwise."""

import torch
from click.testing import CliRunner

from otafl.cli.main import cli


def _threads_after(args, env=None) -> int:
    before = torch.get_num_threads()
    try:
        res = CliRunner().invoke(cli, [*args, "bound", "--users", "10", "--p", "0.5", "--accountant", "paper"],
                                 env=env)
        assert res.exit_code == 0, res.output
        return torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_one_thread_by_default_and_the_flag_or_environment_override_it():
    assert _threads_after([], env={"OTAFL_THREADS": None}) == 1
    assert _threads_after(["--threads", "2"]) == 2
    assert _threads_after([], env={"OTAFL_THREADS": "2"}) == 2


def test_a_bad_thread_count_exits_2_with_one_line():
    res = CliRunner().invoke(cli, ["--threads", "0", "bound", "--users", "10", "--p", "0.5"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "0" in res.output
