"""The ``otafl`` click group.

Every bad-input path ends the same way: one line ``error: ...`` on stderr, exit code 2,
no traceback. Library code raises :class:`otafl.errors.OtaflInputError`; click's own
usage errors are folded into the same single line.
"""

from __future__ import annotations

import sys

import click

from otafl import __version__
from otafl.errors import OtaflInputError
from otafl.limits import DEFAULT_MEMORY_GB, MEMORY_ENV


class OtaflGroup(click.Group):
    """A click group whose errors are single lines with exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.Exit as e:  # --help, --version
            if standalone_mode:
                sys.exit(e.exit_code)
            raise
        except click.exceptions.Abort as e:
            if isinstance(e.__cause__, KeyboardInterrupt):  # Ctrl-C that no command caught itself
                from otafl.cli.options import forget_caught_interrupt

                forget_caught_interrupt()  # so that python -m otafl exits 130, not by SIGINT
                click.echo("error: interrupted", err=True)
                sys.exit(130)
            click.echo("error: aborted", err=True)
            sys.exit(1)
        except click.exceptions.NoArgsIsHelpError as e:  # plain `otafl`: the help, as --help prints it
            click.echo(e.ctx.get_help() if e.ctx is not None else self.get_help(click.Context(self)))
            if standalone_mode:
                sys.exit(0)
            return 0
        except click.ClickException as e:
            msg = " ".join(e.format_message().split())
            click.echo(f"error: {msg}", err=True)
            sys.exit(2)
        except OtaflInputError as e:
            click.echo(f"error: {' '.join(str(e).split())}", err=True)
            sys.exit(2)
        except OSError as e:  # standard output (or a file no writer caught) refused a write
            import errno

            if e.errno not in (errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
                raise
            stdout = _stdout_broken()
            if e.errno == errno.EPIPE and stdout:  # `otafl ... | head`: the reader left, as click does
                sys.exit(1)
            where = "standard output" if stdout or e.filename is None else repr(str(e.filename))
            click.echo(f"error: cannot write to {where}: {e.strerror or e}", err=True)
            sys.exit(2)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


def _stdout_broken() -> bool:
    """True if standard output refuses what it holds (a full disk, /dev/full, a closed pipe);
    then it is pointed at /dev/null, so that the interpreter's final flush stays quiet."""
    import os

    try:
        sys.stdout.flush()
        return False
    except OSError:
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, sys.stdout.fileno())
            os.close(fd)
        except (OSError, ValueError, AttributeError):  # not a real file (CliRunner): nothing to flush later
            pass
        return True


THREADS_ENV = "OTAFL_THREADS"


class _FromEnv:
    """A range type whose refusal names the environment variable when the value came from
    there (``OTAFL_MEMORY_LIMIT_GB=abc`` was blamed on ``--memory-limit``)."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as e:
            from click.core import ParameterSource

            if ctx is not None and param is not None and param.envvar \
                    and ctx.get_parameter_source(param.name) == ParameterSource.ENVIRONMENT:
                raise OtaflInputError(f"environment variable {param.envvar} = {value!r} is refused for "
                                      f"{param.opts[0]}: {e.message}") from None
            raise


class _IntRange(_FromEnv, click.IntRange):
    pass


class _FloatRange(_FromEnv, click.FloatRange):
    pass


@click.group(cls=OtaflGroup)
@click.version_option(version=__version__, package_name="otafl")  # no package metadata read
@click.option("--threads", type=_IntRange(1, 1024), envvar=THREADS_ENV, default=1, show_default=True,
              help=f"Torch threads of this process (also ${THREADS_ENV}). One is fastest on a shared or small "
                   "machine; sweeps parallelise with --workers processes instead.")
@click.option("--memory-limit", type=_FloatRange(0, min_open=True), envvar=MEMORY_ENV, default=None,
              metavar="GB", help=f"Refuse work estimated to need more memory than this (also ${MEMORY_ENV}) "
                                 f"[default: {DEFAULT_MEMORY_GB:g} GiB].")
def cli(threads: int, memory_limit: float | None) -> None:
    """otafl: over-the-air federated learning privacy simulator."""
    import os

    if memory_limit is not None and not memory_limit < float("inf"):
        from click.core import ParameterSource

        name = (f"environment variable {MEMORY_ENV}" if click.get_current_context().get_parameter_source(
            "memory_limit") == ParameterSource.ENVIRONMENT else "--memory-limit")
        raise OtaflInputError(f"{name} = {memory_limit!r} is outside the allowed range (0, inf), finite (GiB)")
    if memory_limit is not None:  # the environment carries it to sweep workers too
        os.environ[MEMORY_ENV] = repr(memory_limit)
    click.get_current_context().meta[THREADS_META] = threads  # set by the command itself (_with_threads)


THREADS_META = "otafl.threads"


def _with_threads(callback):
    """A command's callback that first gives torch the group's ``--threads``.

    Click runs the group's callback before it parses the command's options, so the count is
    given here, once they parsed, and without importing torch: through ``$OTAFL_THREADS``, which
    :func:`otafl.device.default_threads` reads when a command first uses torch (so ``--help``,
    ``--version``, a bad option and an input error found before any computation never load it;
    tests/test_cli_startup.py), or directly where torch is already loaded."""
    import functools

    @functools.wraps(callback)
    def run(*args, **kwargs):
        ctx = click.get_current_context(silent=True)
        threads = ctx.meta.get(THREADS_META) if ctx is not None else None
        if threads is not None:
            import os
            import sys

            if "torch" in sys.modules:  # already loaded (a caller's process, CliRunner): set it now
                import torch

                from otafl.device import threads_chosen

                torch.set_num_threads(threads)
                threads_chosen()
            else:  # read by otafl.device.default_threads when the command first needs torch
                os.environ[THREADS_ENV] = str(threads)
        return callback(*args, **kwargs)

    return run


#: Command name -> the module of otafl/cli that defines it (a function of the same name).
COMMANDS = {"run": "run", "bound": "bound", "scaling": "scaling", "sweep": "sweep", "table": "table",
            "plot": "plot", "audit": "audit", "audit-run": "audit_run", "plot-accountants": "accountants", "calibrate": "calibrate",
            "plot-digital": "digital"}


def _register() -> None:
    import importlib

    for name, module in COMMANDS.items():
        command = getattr(importlib.import_module(f"otafl.cli.{module}"), name.replace("-", "_"))
        command.callback = _with_threads(command.callback)
        cli.add_command(command)


_register()


if __name__ == "__main__":  # python -m otafl.cli.main, as python -m otafl
    cli()
