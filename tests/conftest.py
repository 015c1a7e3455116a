"""Shared test settings: headless matplotlib, one torch thread (as the CLI's default)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)


# The slow pass (``pytest -m slow --dist load``) hands tests to its two workers in collection
# order; a long test collected last ran alone while the other worker idled (CI of 2026-12-02:
# local-steps.md started 30 min in and ran 9 min on its own). So the longest start first (their
# seconds in that run, 2 workers on a loaded 2-core machine), the rest keep their order.
SLOW_FIRST = (
    "test_docs.py::test_every_console_block_of_a_page_with_slow_blocks_prints_what_it_quotes[docs/guides/sweeps.md]",
    "test_fresh_install.py::test_the_readme_install_and_test_commands_pass_in_new_venvs",  # 903 s
    "test_docs.py::test_every_console_block_of_a_page_with_slow_blocks_prints_what_it_quotes[docs/guides/local-steps.md]",
    "test_docs.py::test_every_console_block_of_a_page_with_slow_blocks_prints_what_it_quotes[docs/guides/bounds.md]",
    "test_docs.py::test_every_console_block_of_a_page_with_slow_blocks_prints_what_it_quotes[docs/guides/digital.md]",
    "test_docs.py::test_every_console_block_of_a_page_with_slow_blocks_prints_what_it_quotes[docs/guides/power-control.md]",
)


def pytest_collection_modifyitems(config, items):
    if "slow" not in (config.getoption("markexpr") or "") or "not slow" in config.getoption("markexpr"):
        return
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}

    def key(item):
        tail = item.nodeid.split("tests/", 1)[-1]
        return rank.get(tail, len(SLOW_FIRST))

    items.sort(key=key)  # stable: the others keep their collection order
