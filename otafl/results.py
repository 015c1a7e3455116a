"""Writing a run's results: ``summary.json`` and ``rounds.csv``, atomically.

:func:`prepare_run_dir` checks an output folder before a run starts (refusing an earlier
run's folder unless asked to overwrite it, and paths that cannot be written);
:func:`discard_run_dir` removes what it created if the run then fails.

JSON has no NaN or infinity: non-finite floats are written as the strings ``"nan"``,
``"inf"`` and ``"-inf"`` (an undefined or unbounded epsilon stays visible as such), and read
back as floats by :func:`read_summary`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from otafl.errors import OtaflInputError


def jsonable(value: Any) -> Any:
    """Recursively replace non-finite floats by strings; tensors/numpy scalars by Python numbers."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def unjson(value: Any) -> Any:
    """Inverse of :func:`jsonable` for non-finite floats written as strings."""
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: unjson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unjson(v) for v in value]
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


NAME_MAX, PATH_MAX = 255, 4096  # bytes, as on Linux (and most file systems)


def check_path_fits(path: str | Path, what: str = "output path") -> None:
    """Refuse, in one line, a path with a name over 255 bytes or over 4096 bytes in all
    (the file system would say "File name too long" only after the work is done)."""
    from otafl.errors import OtaflInputError

    full = os.fsencode(os.path.abspath(str(path)))
    short = str(path) if len(str(path)) <= 80 else f"{str(path)[:60]}...{str(path)[-12:]}"
    if len(full) >= PATH_MAX:
        raise OtaflInputError(f"{what} {short!r} is {len(full)} bytes long, over the limit of {PATH_MAX - 1}")
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise OtaflInputError(f"{what} {short!r} has a name of {len(os.fsencode(part))} bytes, over the limit "
                                  f"of {NAME_MAX}; choose a shorter name")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def output_target(path: str | Path, what: str = "output file") -> Path:
    """The file that writing ``path`` replaces, checked before any work: ``path`` itself when
    it does not exist or is a regular file; for a symbolic link to a regular file, the file
    it points to (written in place of that file, the link kept). Refused in one line
    (:class:`OtaflInputError`): a name over 255 bytes or a path over 4095 (:func:`check_path_fits`),
    and a path that exists and is not a regular file (a device node, a FIFO, a socket, a
    folder), or a link to one or to nothing: otafl never renames over those."""
    check_path_fits(path, what)
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except OSError:  # absent, or a parent that is not a folder: the writer reports it
        return p
    if stat.S_ISREG(mode):
        return p
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            raise OtaflInputError(f"{what} {str(p)!r} is a symbolic link to a missing file ({os.readlink(p)!r}); "
                                  f"otafl does not write through it, choose another path") from None
        target = Path(os.path.realpath(p))
        if stat.S_ISREG(mode) and _same_file(target, p):
            return target
        if stat.S_ISREG(mode):  # a /proc/PID/fd link to a deleted or unnamed file
            raise OtaflInputError(f"{what} {str(p)!r} is a symbolic link to a file without a name "
                                  f"({os.readlink(p)!r}); choose another path")
        raise OtaflInputError(f"{what} {str(p)!r} is a symbolic link to {_kind(mode)}, not to a regular file; "
                              f"otafl replaces only regular files, choose another path")
    raise _not_regular(what, p, _kind(mode))


def _not_regular(what: str, path: Path, kind: str) -> OtaflInputError:
    return OtaflInputError(f"{what} {str(path)!r} exists and is {kind}, not a regular file; otafl replaces only "
                           f"regular files, choose another path")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _still_replaceable(path: Path, what: str) -> None:
    """Just before a rename: ``path`` is absent or a regular file (not swapped for a device meanwhile)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(what, path, "a symbolic link" if stat.S_ISLNK(mode) else _kind(mode))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file beside it and an atomic rename, with
    the usual permissions: either the whole file appears or nothing changes. A path that
    cannot be written (a read-only folder, a path under a file, /proc) raises
    :class:`OtaflInputError` naming the path and the reason; so does one that exists and is
    not a regular file (:func:`output_target`; a link to a regular file writes that file)."""
    path = output_target(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OtaflInputError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        _still_replaceable(path, "output file")
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise OtaflInputError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write_bytes` of UTF-8 ``text`` (newlines as given)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def rounds_csv(rounds: list[dict]) -> str:
    """The per-round records as CSV text (columns: the union of keys, first-seen order)."""
    columns: list[str] = []
    for r in rounds:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rounds:
        writer.writerow({k: jsonable(r.get(k, "")) for k in columns})
    return buf.getvalue()


def write_run(out_dir: str | Path, summary: dict, rounds: list[dict]) -> None:
    """Write ``summary.json`` and ``rounds.csv`` into ``out_dir`` (created if needed), all or nothing.

    Both files are written to temporary files first and then renamed into place,
    ``summary.json`` last. If anything fails, the files it had already replaced are put
    back (an earlier run's pair stays as it was; a new folder gets neither file). An existing
    file of that name that is not a regular file is refused, a link to one is written
    through (:func:`output_target`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = [("rounds.csv", rounds_csv(rounds)),
             ("summary.json", json.dumps(jsonable(summary), indent=2, sort_keys=True) + "\n")]
    temps: list[tuple[str, Path]] = []
    replaced: list[tuple[Path, str | None]] = []  # (file, backup of the file it replaced, or None)
    backups: list[str] = []
    try:
        for name, text in texts:
            final = output_target(out / name, "results file")
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
            temps.append((tmp, final))
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, final in temps:
            backup = None
            if final.exists():  # keep the earlier file (a hard link, else a copy) until both are in place
                fd, backup = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".bak")
                os.close(fd)
                os.unlink(backup)
                backups.append(backup)
                try:
                    os.link(final, backup)
                except OSError:
                    shutil.copy2(final, backup)
            _still_replaceable(final, "results file")
            os.replace(tmp, final)
            replaced.append((final, backup))
    except BaseException:
        for final, backup in reversed(replaced):
            with contextlib.suppress(OSError):
                if backup is None:
                    os.unlink(final)
                else:
                    os.replace(backup, final)
        raise
    finally:
        for tmp in [t for t, _ in temps] + backups:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def prepare_run_dir(out_dir: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Check, before a run starts, that ``out_dir`` can take its ``summary.json`` and ``rounds.csv``.

    Creates the missing parent folders (not ``out_dir`` itself: the run publishes it whole,
    :class:`otafl.publish.RunFolder`, after :func:`stage_run_dir` proved the place writable).
    Refused with a one-line :class:`OtaflInputError` naming the path and the reason: an
    empty path, a path that is a file or lies under one, a parent that cannot be created,
    and an existing folder that is not empty (an earlier run's results) unless ``overwrite``.
    Nothing is left behind when refused.

    Returns the folders it created, outermost first, for :func:`discard_run_dir`.
    """
    from otafl.errors import OtaflInputError

    if str(out_dir).strip() == "":
        raise OtaflInputError("the output folder is empty (''); give a folder such as runs/my-run")
    check_path_fits(out_dir, "output folder")
    out = Path(out_dir)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OtaflInputError(f"output folder {str(out)!r} exists and is not a folder; choose another --out")
        try:
            entries = sorted(os.listdir(out))
        except OSError as e:
            raise OtaflInputError(f"output folder {str(out)!r} cannot be read: {_reason(e)}") from None
        if entries and not overwrite:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise OtaflInputError(f"output folder {str(out)!r} is not empty ({shown}); pass --overwrite to "
                                  f"replace its summary.json and rounds.csv, or choose another --out")
        for name in ("summary.json", "rounds.csv"):  # --overwrite replaces regular files only
            output_target(out / name, "results file")
        return []
    created: list[Path] = []
    missing: list[Path] = []
    probe = out.parent
    while not (probe.exists() or probe.is_symlink()):
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if (probe.exists() or probe.is_symlink()) and not probe.is_dir():
        raise OtaflInputError(f"cannot create output folder {str(out)!r}: {str(probe)!r} is a file, not a folder")
    try:
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
    except OSError as e:
        discard_run_dir(created)
        raise OtaflInputError(f"cannot create output folder {str(out)!r}: {_reason(e)}") from None
    return created


def discard_run_dir(created: list[Path]) -> None:
    """Remove the folders :func:`prepare_run_dir` created, innermost first, if still empty."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:  # not empty (someone else's files) or already gone: leave it
            break


def read_summary(path: str | Path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return unjson(json.load(fh))
