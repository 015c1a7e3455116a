"""otafl.progress: the library's (done, total) bookkeeping and the command line's tqdm bar."""

from __future__ import annotations

import io

from otafl.progress import Tally, progress_bar


def test_tally_reports_the_start_each_piece_and_exactly_the_total_at_the_end():
    calls = []
    tally = Tally(lambda done, total: calls.append((done, total)), 10)
    tally.advance(3)
    sub = tally.part(4)  # a sub-job worth 4 units, with its own total of 100
    sub(0, 100), sub(50, 100), sub(100, 100)
    tally.advance(5)  # past the total: clamped
    tally.finish()
    assert calls == [(0, 10), (3, 10), (5, 10), (7, 10), (10, 10), (10, 10)]
    Tally(None, 5).finish()  # no callback: nothing to call


def test_the_bar_is_drawn_on_a_terminal_and_nothing_is_written_when_quiet_or_not_a_terminal():
    out = io.StringIO()
    with progress_bar("job", file=out, enabled=True, delay=0.0) as progress:
        for done in range(5):
            progress(done, 4)
    text = out.getvalue()
    assert "job:" in text and "/4" in text and text.endswith("\r")  # drawn, then cleared (leave=False)
    for kw in ({"quiet": True, "enabled": True}, {}):  # quiet, or a StringIO (not a terminal)
        out = io.StringIO()
        with progress_bar("job", file=out, delay=0.0, **kw) as progress:
            progress(0, 2), progress(2, 2)
        assert out.getvalue() == ""
