"""For tests that press Ctrl-C on a child process.

A shell without job control starts background commands with SIGINT ignored (``cmd &`` in a
script, ``nohup``), and a process inherits that: Python then installs no KeyboardInterrupt
handler, the child never sees the Ctrl-C the test sends, and the test fails for a reason that
is not the code's. ``preexec_fn=interruptible`` gives the child SIGINT's default disposition,
as an interactive terminal would.
"""

import signal


def interruptible() -> None:
    """Run in the child before exec: SIGINT back to its default (Python's handler installs then)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
