"""Publishing a run folder in one step, never over results another run has published.

:class:`RunFolder` wraps one ``otafl run``: it checks ``--out`` before training
(:func:`otafl.results.prepare_run_dir`), writes the results into a hidden sibling
``.NAME.partial-PID`` and publishes it with one rename:

* a new folder (or an empty one) is renamed into place with Linux's ``renameat2
  RENAME_NOREPLACE``, which fails if ``--out`` was filled meanwhile; where that call is
  missing, ``mkdir`` claims the name first and a plain rename replaces that empty claim;
* ``--overwrite`` swaps the finished stage with the old folder in one step (``RENAME_EXCHANGE``)
  and then removes the old one, which now lies at the stage's name; where the swap is
  missing, the old folder is set aside as ``.NAME.old-PID``, the stage renamed in and the old
  one removed. Other files of the old folder are carried over (hard links).

A guard process (:class:`otafl.reaper.Reaper`) removes the stage, and puts a set-aside old
folder back, if this process is killed outright; should it be killed too, the next run into
the same folder does both. So after a ``kill -9`` at any moment ``--out`` holds the old
results or the new ones, whole. A run that finds ``--out`` published by another run while it
trained raises :class:`PublishConflict` after keeping its own results in ``NAME-2`` (or the
next free number). See docs/guides/failure.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from pathlib import Path

from otafl.errors import OtaflInputError
from otafl.results import _reason

AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
OLD_MARK = ".old-"
#: Names an earlier run may leave in a folder that ``--overwrite`` does not carry over: its
#: results and write_run's temporary files (older versions wrote in place).
OWN_NAMES = ("summary.json", "rounds.csv")
OWN_PREFIXES = (".summary.json.", ".rounds.csv.", ".otafl-write-test.")


class PublishConflict(RuntimeError):
    """``--out`` was published by another run while this one trained; ``kept`` holds this
    run's results (or is None if they could not be kept)."""

    def __init__(self, out: Path, kept: Path | None):
        self.out, self.kept = out, kept
        where = (f"this run's results were kept in {str(kept)!r} instead" if kept is not None
                 else "this run's results could not be kept")
        super().__init__(f"output folder {str(out)!r} was filled by another run while this one ran; {where} "
                         f"(nothing was replaced; use --overwrite to replace a run)")


class _Unsupported(Exception):
    """renameat2 (or the flag) is not available here: use the fallback."""


_RENAMEAT2: list = []


def _libc_renameat2():
    if not _RENAMEAT2:
        fn = None
        with contextlib.suppress(OSError, AttributeError):
            fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        _RENAMEAT2.append(fn)
    return _RENAMEAT2[0]


def renameat2(src: str | Path, dst: str | Path, flags: int) -> None:
    """``renameat2(src, dst, flags)``; :class:`_Unsupported` where the call or the flag is missing
    (another C library, an old kernel, a file system without it), else :class:`OSError`."""
    fn = _libc_renameat2()
    if fn is None:
        raise _Unsupported
    if fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise _Unsupported
        raise OSError(err, os.strerror(err), str(src), None, str(dst))


def rename_noreplace(src: Path, dst: Path, guard=None) -> None:
    """Rename the folder ``src`` to ``dst``, failing with :class:`FileExistsError` (or
    ``ENOTEMPTY``/``ENOTDIR``) if anything is at ``dst``: never replaces it. The fallback's
    empty claim is removed by ``guard`` (a :class:`~otafl.reaper.Reaper`) after a kill."""
    try:
        renameat2(src, dst, RENAME_NOREPLACE)
        return
    except _Unsupported:
        pass
    if guard is not None:
        guard.remove_if_empty(dst)  # only an empty claim: the published folder is never empty
    os.mkdir(dst)  # claim the name (EEXIST if taken), then replace our own empty claim
    try:
        os.rename(src, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(dst)
        raise


def _taken(e: OSError) -> bool:
    return e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def carry_over(old: Path, new: Path) -> None:
    """Hard-link (else copy) into ``new`` every entry of ``old`` but a run's own files."""
    for entry in os.scandir(old):
        if entry.name in OWN_NAMES or entry.name.startswith(OWN_PREFIXES) or os.path.lexists(new / entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(entry.path, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        elif entry.is_symlink():
            os.symlink(os.readlink(entry.path), new / entry.name)
        else:
            _link_or_copy(entry.path, str(new / entry.name))


def old_path(out: Path) -> Path:
    """Where the fallback of ``--overwrite`` sets the old folder aside: ``.NAME.old-PID``."""
    return out.parent / f".{out.name}{OLD_MARK}{os.getpid()}"


def restore_or_remove(aside: Path, out: Path) -> None:
    """After a kill during the fallback swap: put the old folder back if ``out`` is missing (or
    an empty claim), else (the new one is in place) remove it."""
    with contextlib.suppress(OSError):
        os.rmdir(out)
    try:
        os.rename(aside, out) if not os.path.lexists(out) else shutil.rmtree(aside)
    except OSError:
        shutil.rmtree(aside, ignore_errors=True)


def _kept_name(out: Path, stage: Path, guard) -> Path | None:
    for n in range(2, 1000):
        candidate = out.parent / f"{out.name}-{n}"
        try:
            rename_noreplace(stage, candidate, guard)
            return candidate
        except OSError as e:
            if not _taken(e):
                return None
    return None


STAGE_MARK = ".partial-"


def stage_run_dir(out_dir: str | Path) -> Path:
    """A hidden sibling folder ``.NAME.partial-PID`` where a new run writes its files, renamed
    to ``out_dir`` when they are complete (:class:`RunFolder`); so a killed run never
    leaves a half-written ``out_dir``. Stale stages of dead processes are removed first. A
    stage that cannot be made (or take a file) is refused in one line (:class:`OtaflInputError`)."""
    out = Path(out_dir)
    clean_stale(out)
    stage = stage_path(out)
    shutil.rmtree(stage, ignore_errors=True)
    try:
        stage.mkdir()
        fd, tmp = tempfile.mkstemp(dir=stage, prefix=".otafl-write-test.", suffix=".tmp")  # files can be made
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        what = "write to" if out.is_dir() else "create"
        raise OtaflInputError(f"cannot {what} output folder {str(out_dir)!r}: {_reason(e)}") from None
    return stage


def clean_stale(out: Path) -> None:
    """Remove the stages ``.NAME.partial-PID`` of dead processes, and put back an old folder
    that a killed ``--overwrite`` had set aside (``.NAME.old-PID``) if ``out`` is missing."""
    prefix, aside = f".{out.name}{STAGE_MARK}", f".{out.name}{OLD_MARK}"
    for old in out.parent.glob(f"{glob_escape(prefix)}*"):
        pid = old.name[len(prefix):]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    for old in out.parent.glob(f"{glob_escape(aside)}*"):  # --overwrite killed mid-swap with its guard
        pid = old.name[len(aside):]
        if pid.isdigit() and not _alive(int(pid)):
            restore_or_remove(old, out)


def stage_path(out_dir: str | Path) -> Path:
    """Where this process stages ``out_dir`` (:func:`stage_run_dir`): ``.NAME.partial-PID`` beside it."""
    out = Path(out_dir)
    return out.parent / f".{out.name}{STAGE_MARK}{os.getpid()}"


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunFolder:
    """One run's output folder: checked on entry, published by :meth:`publish`, cleaned up on
    any exit without it (an exception, Ctrl-C, SIGTERM) and, by the guard, after a kill."""

    def __init__(self, out_dir: str | Path, *, overwrite: bool = False):
        self.given = Path(out_dir)
        self.overwrite = overwrite
        self.out = Path(os.path.realpath(out_dir) if os.path.islink(out_dir) else os.path.abspath(out_dir))
        self.created: list[Path] = []
        self.stage: Path | None = None
        self.guard = None
        self.published: Path | None = None

    def __enter__(self) -> "RunFolder":
        from otafl.reaper import Reaper
        from otafl.results import check_path_fits, discard_run_dir, prepare_run_dir

        if str(self.given).strip():
            check_path_fits(self.given, "output folder")
            here = os.path.realpath(os.getcwd())
            if os.path.realpath(self.out) in (here, os.path.dirname(here)) or here.startswith(
                    os.path.realpath(self.out).rstrip(os.sep) + os.sep):  # published by a rename: never our cwd
                raise OtaflInputError(f"output folder {str(self.given)!r} is the current folder or holds it; give "
                                      f"the run a folder of its own, such as runs/my-run")
            with contextlib.suppress(OSError):
                clean_stale(self.out)  # a dead run's stage, or an old folder a killed --overwrite set aside
        self.created = prepare_run_dir(str(self.given), overwrite=self.overwrite)  # refused here, before training
        try:
            self.guard = Reaper()  # cleans up after a kill -9
            for folder in self.created:
                self.guard.remove_if_empty(folder)
            self.guard.remove(stage_path(self.out))  # before it exists: no window without the guard
            self.stage = stage_run_dir(self.out)
        except BaseException:
            self._close()
            discard_run_dir(self.created)
            raise
        return self

    def publish(self, summary: dict, rounds: list[dict]) -> Path:
        """Write the results into the stage and publish it (module docstring); returns ``--out``.
        Raises :class:`PublishConflict` if another run filled ``--out`` meanwhile (without
        ``--overwrite``), :class:`OtaflInputError` if the results cannot be written."""
        from otafl.results import write_run

        assert self.stage is not None
        try:
            write_run(self.stage, summary, rounds)
            if self._publish_new():
                return self._done()
            if not self.overwrite:
                kept = _kept_name(self.out, self.stage, self.guard)
                if kept is not None:
                    self.stage = None
                    kept = kept if self.given.is_symlink() else self.given.parent / kept.name  # as given
                raise PublishConflict(self.given, kept)
            self._swap()
            return self._done()
        except OSError as e:
            raise OtaflInputError(f"cannot write the results to {str(self.given)!r}: {e.strerror or e}") from None

    def _done(self) -> Path:
        self.published = self.given
        self.stage = None
        return self.given

    def _publish_new(self) -> bool:
        """Rename the stage to ``--out`` if that is missing or an empty folder; False if taken."""
        with contextlib.suppress(FileNotFoundError):
            try:
                os.rmdir(self.out)  # an empty folder (made by hand, or by us) is no run's results
            except OSError as e:
                if _taken(e):
                    return False
                raise
        try:
            rename_noreplace(self.stage, self.out, self.guard)
        except OSError as e:
            if _taken(e):
                return False
            raise
        return True

    def _swap(self) -> None:
        """``--overwrite``: exchange the finished stage with the old folder, then remove the old."""
        carry_over(self.out, self.stage)
        try:
            renameat2(self.stage, self.out, RENAME_EXCHANGE)
        except _Unsupported:
            aside = old_path(self.out)
            self.guard.restore(aside, self.out)  # a kill between the two renames puts the old one back
            os.rename(self.out, aside)
            try:
                rename_noreplace(self.stage, self.out, self.guard)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.rename(aside, self.out)
                raise
            shutil.rmtree(aside, ignore_errors=True)
            return
        shutil.rmtree(self.stage, ignore_errors=True)  # the old folder, now at the stage's name

    def _close(self) -> None:
        if self.guard is not None:
            self.guard.close()  # published or cleaned up here: the guard exits doing nothing
            self.guard = None

    def __exit__(self, *exc) -> None:
        from otafl.results import discard_run_dir

        try:
            if self.stage is not None:
                shutil.rmtree(self.stage, ignore_errors=True)
            if self.published is None:
                discard_run_dir(self.created)  # a failed or interrupted run leaves no folder of ours behind
        finally:
            self._close()
