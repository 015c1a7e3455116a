"""Executable documentation: run every ``console`` block of the README and the site, compare
what each command prints now with what the page quotes.

A block is a fenced code block whose info string starts with ``console``, its options as classes
(``console {.slow}``: a bare second word would make the site render the block as inline code)::

    ```console
    $ otafl bound --users 200 --p 0.5 --accountant exact
    users    p  ...
      200  0.5  ...
    ```

Lines starting with ``$ `` are commands (a trailing ``\\`` continues them on the next line);
the lines after a command, up to the next command or the end of the block, are its quoted
output. Comparison, token by token after splitting on white space:

* numbers (``1.17e+03``, ``0.8``, ``13``, with trailing flags such as ``!`` or ``?``) must agree
  within :data:`REL_TOL` relative (or :data:`ABS_TOL` absolute), their flags exactly;
* every other token must be equal;
* ``...`` as a token matches any run of tokens on that line, and a line that is only ``...``
  matches any number of output lines (timings, paths, progress);
* the command must exit 0, unless its quoted output has an ``error:`` line.

A ``python {.exec}`` block is run as a script, and an ``output`` block right after it is its
quoted output (the same comparison). ``console {.slow}`` and ``python {.exec .slow}`` blocks run
only with ``--slow`` (and in ``pytest -m slow``). Commands run with ``bash`` in a scratch folder (one
per page, its blocks in page order) that links ``experiments``, ``channels``, ``lectures`` and
``benchmarks`` from the repository and has empty ``runs`` and ``figures``, so that no command
writes into the checkout; one torch thread (``OTAFL_THREADS=1``), ``MPLBACKEND=Agg``. With
``--update`` the figures the commands wrote into the scratch ``figures/`` are copied into the
repository's ``figures/``: a page's figures are regenerated with its numbers.

A command is run once per check for each state of the scratch folder it starts in: the README
and docs/getting-started.md both open with the quickstart run in an empty scratch folder, so the
second page gets the first one's exit code, output and written files (:func:`_memo_run`; the
commands are deterministic, their timings quoted as ``...``) and both pages' quotes are compared
with that one run.

A ``console {.norun}`` block is shown and never run; nothing may be quoted under its commands.
Such blocks, and only they, hold the commands the check cannot run, each for a reason the page
states beside it: installing (``pip install``: it changes the environment and needs a package
index), the test suite itself (``pytest``), servers and interactive sessions (``marimo run``,
``marimo edit``, ``mkdocs serve``), a Ray cluster (``ray start`` on several machines) and the
benchmarks, whose figures are timings of one machine (ratios of timings move with the load and
the CPU, so a tolerance would make the check flaky, not honest; what the benchmarks assert, the
round against the per-user loop, is in the test suite). Plain ``bash`` or ``sh`` blocks are not
allowed on the pages (:func:`unmarked_shell_blocks`): a command is run or says why not.

    python tests/doccheck.py                   # check README.md and docs/ (fast blocks)
    python tests/doccheck.py --slow --jobs 2   # all blocks, two pages at a time
    python tests/doccheck.py --update FILE     # rewrite FILE's quoted outputs (and figures) from fresh runs
    python tests/doccheck.py --update -k paper-table2a docs/guides/sweeps.md   # only blocks naming it
    python tests/doccheck.py --slow --times    # each command's wall time
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from otafl.reaper import Reaper  # noqa: E402
REL_TOL = 5e-3
"""Relative tolerance of a quoted number (the one stated in docs/index.md)."""
ABS_TOL = 1e-9
LINKED = ("experiments", "channels", "lectures", "benchmarks")
FIGURES = ROOT / "figures"
"""Where ``--update`` copies the figures the commands wrote."""
NUMBER = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)([%!?,;:)\]]*)$")
FENCE = re.compile(r"^(\s*)```(.*)$")
SHELL = ("bash", "sh", "shell", "zsh", "console")


@dataclass
class Command:
    text: str  # the command, continuation lines joined
    expected: list[str]  # quoted output lines
    lines: tuple[int, int]  # the expected output's line span in the file [start, stop)


@dataclass
class Block:
    path: Path
    slow: bool
    commands: list[Command] = field(default_factory=list)


def blocks(path: Path) -> list[Block]:
    """The ``console`` blocks of one Markdown file."""
    out, lines = [], path.read_text(encoding="utf-8").splitlines()
    for i, m, j in _fences(lines):
        info, indent = _info(m.group(2)), len(m.group(1))
        if info and info[0] == "python" and "exec" in info[1:]:
            block = Block(path, slow="slow" in info[1:])
            code = [ln[indent:] for ln in lines[i + 1:j]]
            nxt = j + 1
            while nxt < len(lines) and not lines[nxt].strip():
                nxt += 1
            m2 = FENCE.match(lines[nxt]) if nxt < len(lines) else None
            if m2 and m2.group(2).strip() == "output":  # _fences yields its fence next: not a command block
                end = _closing(lines, nxt)
                expected, span = [ln[len(m2.group(1)):] for ln in lines[nxt + 1:end]], (nxt + 1, end)
            else:
                expected, span = ["..."], (j, j)
            block.commands.append(Command("python - <<'OTAFL_DOC_EOF'\n" + "\n".join(code) + "\nOTAFL_DOC_EOF",
                                          expected, span))
            out.append(block)
        elif info and info[0] == "console" and "norun" not in info[1:]:
            block = Block(path, slow="slow" in info[1:])
            k = i + 1
            while k < j:
                line = lines[k][indent:]
                if not line.startswith("$ "):
                    k += 1
                    continue
                text = line[2:]
                while text.endswith("\\") and k + 1 < j:
                    k += 1
                    text = text[:-1].rstrip() + " " + lines[k][indent:].strip()
                start = k + 1
                stop = start
                while stop < j and not lines[stop][indent:].startswith("$ "):
                    stop += 1
                block.commands.append(Command(text.strip(), [ln[indent:] for ln in lines[start:stop]], (start, stop)))
                k = stop
            out.append(block)
    return out


def _closing(lines: list[str], i: int) -> int:
    """Index of the fence closing the block opened at line ``i`` (``len(lines)`` if none)."""
    j = i + 1
    while j < len(lines) and not FENCE.match(lines[j]):
        j += 1
    return j


def _fences(lines: list[str]):
    """(opening index, its FENCE match, closing index) of each fenced block, in order."""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = _closing(lines, i)
        yield i, m, j
        i = j + 1


def _info(text: str) -> list[str]:
    """A fence's language and its classes: ``console {.slow}`` -> ``["console", "slow"]``."""
    words = text.replace("{", " ").replace("}", " ").split()
    return [w.lstrip(".") for w in words if "=" not in w and not w.startswith("#")]


def unmarked_shell_blocks(path: Path) -> list[str]:
    """``FILE:LINE`` of each fenced shell block that is neither run (``console``, ``console {.slow}``)
    nor marked ``console {.norun}``, of each ``norun`` block that quotes output under a command
    (module docstring), and of each fence whose options are bare words (``console slow``: the site
    renders such a block as inline code and the prose after it as code)."""
    out, lines = [], path.read_text(encoding="utf-8").splitlines()
    for i, m, j in _fences(lines):
        raw, info = m.group(2).strip(), _info(m.group(2))
        body = [ln.strip() for ln in lines[i + 1:j] if ln.strip()]
        if len(raw.split()) > 1 and not re.search(r"\{.*\}|=", raw):
            out.append(f"{path}:{i + 1}: ```{raw} renders as inline code on the site (write ```{info[0]} "
                       + "{" + " ".join("." + w for w in info[1:]) + "})")
        elif info and info[0] in SHELL[:-1]:
            out.append(f"{path}:{i + 1}: ```{info[0]} (use console, console {{.slow}} or console {{.norun}})")
        elif info[:1] == ["console"] and "norun" in info[1:] and any(
                not ln.startswith("$ ") and not (k and body[k - 1].endswith("\\")) for k, ln in enumerate(body)):
            out.append(f"{path}:{i + 1}: a console {{.norun}} block quotes output nothing checks")
        elif not info and body and body[0].split()[0] in ("$", "otafl", "python", "python3", "pip", "marimo", "ray"):
            out.append(f"{path}:{i + 1}: commands in an unmarked block")
    return out


def _token_match(expected: str, actual: str) -> bool:
    if expected == actual:
        return True
    me, ma = NUMBER.match(expected), NUMBER.match(actual)
    if not (me and ma) or me.group(2) != ma.group(2):
        return False
    e, a = float(me.group(1)), float(ma.group(1))
    return abs(e - a) <= max(ABS_TOL, REL_TOL * max(abs(e), abs(a)))


def _line_match(expected: str, actual: str) -> bool:
    exp, act = expected.split(), actual.split()

    def go(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(act)
        if exp[i] == "...":
            return any(go(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and _token_match(exp[i], act[j]) and go(i + 1, j + 1)

    return go(0, 0)


def match(expected: list[str], actual: list[str]) -> bool:
    """Whether the quoted lines match the printed ones (module docstring); blank lines ignored."""
    exp = [ln for ln in expected if ln.strip()]
    act = [ln for ln in actual if ln.strip()]

    def go(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(go(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and _line_match(exp[i], act[j]) and go(i + 1, j + 1)

    return go(0, 0)


def _scratch() -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="otafl-doccheck-"))
    for name in LINKED:
        (tmp / name).symlink_to(ROOT / name)
    (tmp / "runs").mkdir()
    (tmp / "figures").mkdir()
    return tmp


_STOP = threading.Event()  # Ctrl-C: no page starts another command
_RUNNING: set = set()  # the commands running now (one a page)
_LOCK = threading.Lock()


def _stop_all() -> None:
    """End every running command (its whole session) and start no other: the page threads
    then finish at once (Ctrl-C with --jobs)."""
    _STOP.set()
    with _LOCK:
        for proc in _RUNNING:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass


def run(command: str, cwd: Path, timeout: float = 3600.0) -> tuple[int, list[str]]:
    """The command's exit code and its output as lines: standard output, and of standard error
    the lines otafl writes for a reader (``error:``, ``note:``, ``warning:``), not progress bars."""
    env = {**os.environ, "OTAFL_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    # a session of its own: a signal to the command's process group never reaches the checker, and
    # a command past its timeout is ended with everything it started. Being in another session, it
    # would outlive a checker that is killed (CI cancelled, Ctrl-C of pytest): otafl's guard process
    # ends every process the checker started when the checker dies (otafl/reaper.py, tree()).
    if _STOP.is_set():
        raise KeyboardInterrupt
    with Reaper() as guard:
        guard.tree()
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        with _LOCK:
            _RUNNING.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # a failure of this command, not of the whole check
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
            return 124, stdout.splitlines() + [f"(doccheck: timed out after {timeout:.0f} s)"]
        except BaseException:  # Ctrl-C, SIGTERM turned into an exception: the command goes first
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            with _LOCK:
                _RUNNING.discard(proc)
    if _STOP.is_set():  # ended by _stop_all, not by itself
        raise KeyboardInterrupt
    said = [ln for ln in stderr.splitlines() if ln.lstrip().startswith(("error:", "note:", "warning:"))]
    return proc.returncode, stdout.splitlines() + said


_MEMO: dict[tuple[str, str], tuple[int, list[str], dict[str, bytes | None]]] = {}
_MEMO_LOCKS: dict[tuple[str, str], threading.Lock] = {}


def _state(cwd: Path) -> dict[str, bytes]:
    """The files the commands of a page wrote so far: every file of the scratch folder but the
    linked repository folders."""
    found = {}
    for top, dirs, files in os.walk(cwd):  # links are not followed
        dirs[:] = [d for d in dirs if not (Path(top) / d).is_symlink()]
        for name in files:
            f = Path(top) / name
            if not f.is_symlink():
                found[str(f.relative_to(cwd))] = f.read_bytes()
    return found


def _memo_run(command: str, cwd: Path) -> tuple[int, list[str]]:
    """:func:`run`, once per (command, scratch state): a page whose command meets a scratch folder
    in a state an earlier page's same command met (both empty, say) takes that run's exit code
    and output, and the files it wrote or removed are written or removed here too."""
    before = _state(cwd)
    key = (command, repr(sorted((k, hash(v)) for k, v in before.items())))
    with _LOCK:
        lock = _MEMO_LOCKS.setdefault(key, threading.Lock())
    with lock:  # a page that meets a running key waits for its result
        if key in _MEMO:
            code, actual, changes = _MEMO[key]
            for rel, data in changes.items():
                if data is None:
                    (cwd / rel).unlink(missing_ok=True)
                else:
                    (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
                    (cwd / rel).write_bytes(data)
            return code, list(actual)
        code, actual = run(command, cwd)
        after = _state(cwd)
        changes = {k: v for k, v in after.items() if before.get(k) != v}
        changes.update({k: None for k in before if k not in after})
        _MEMO[key] = (code, list(actual), changes)
        return code, actual


def check(paths: list[Path], *, slow: bool = False, update: bool = False, log=print, select: str | None = None,
          jobs: int = 1, times: bool = False) -> list[str]:
    """Run the blocks of ``paths``; the mismatches as messages (``update``: rewrite them, and copy
    the figures the commands wrote, instead). ``select``: only the blocks whose text contains it;
    ``jobs``: pages run side by side (each in its own scratch folder); ``times``: log each
    command's wall time."""
    def one(path: Path) -> list[str]:
        return _check_page(path, slow=slow, update=update, log=log, select=select, times=times)

    if jobs > 1 and len(paths) > 1:
        # the pages with the most slow commands start first (the longest chains)
        order = sorted(paths, key=lambda p: -sum(len(b.commands) for b in blocks(p) if b.slow and slow))
        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            return [f for page in pool.map(one, order) for f in page]
        except BaseException:  # Ctrl-C reaches this thread only: end the pages' commands, then wait
            _stop_all()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return [f for path in paths for f in one(path)]


def _check_page(path: Path, *, slow: bool, update: bool, log, select: str | None, times: bool) -> list[str]:
    failures = []
    found = [b for b in blocks(path) if (slow or not b.slow)
             and (select is None or any(select in c.text for c in b.commands))]
    if not found:
        return failures
    cwd = _scratch()
    edits = []
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    try:
        for block in found:
            for cmd in block.commands:
                t0 = time.perf_counter()
                code, actual = _memo_run(cmd.text, cwd)
                where = f"{rel}:{cmd.lines[0]}"
                if times:
                    log(f"{time.perf_counter() - t0:8.1f} s  {where}: {cmd.text.splitlines()[0][:100]}")
                expects_error = any(ln.lstrip().startswith("error:") for ln in cmd.expected)
                if match(cmd.expected, actual) and (code == 0 or expects_error):
                    continue
                if update and (code == 0 or expects_error):
                    edits.append((cmd, actual))
                    log(f"updated {where}: {cmd.text}")
                else:
                    failures.append(f"{where}: `{cmd.text}` exited {code} and printed\n" + "\n".join(actual)
                                    + "\nbut the page quotes\n" + "\n".join(cmd.expected))
        if update:
            for fig in sorted((cwd / "figures").rglob("*")):
                if fig.is_file():
                    dest = FIGURES / fig.relative_to(cwd / "figures")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(fig, dest)
                    log(f"figure {dest} regenerated by {rel}")
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    if edits:
        _rewrite(path, edits)
    return failures


def _rewrite(path: Path, edits: list[tuple[Command, list[str]]]) -> None:
    """Replace each command's quoted output by what it printed, keeping the ``...`` lines'
    places where the rest still matches (a quoted ``...`` line stays)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for cmd, actual in sorted(edits, key=lambda e: -e[0].lines[0]):
        start, stop = cmd.lines
        indent = ""
        if start < len(lines) and lines[start].strip():
            indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        patterns = [ln for ln in cmd.expected if "..." in ln.split()]  # quoted lines with wildcards stay
        new = []
        for ln in actual:
            kept = next((p for p in patterns if p.strip() != "..." and _line_match(p, ln)), None)
            new.append(indent + (kept if kept is not None else ln))
        if any(p.strip() == "..." for p in patterns) and not actual:
            new.append(indent + "...")
        lines[start:stop] = new
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def doc_files() -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _unreadable(path: Path) -> str | None:
    """Why ``path`` is no Markdown page this checker can read, or None."""
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is a folder, not a Markdown file" if path.is_dir() else "is not a regular file"
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if b"\0" in data:
        return "is a binary file, not a Markdown page"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); save it as UTF-8"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/)")
    ap.add_argument("--slow", action="store_true", help="also the `console {.slow}` blocks")
    ap.add_argument("--update", action="store_true",
                    help="rewrite the quoted outputs (and copy the figures written) from fresh runs")
    ap.add_argument("-k", dest="select", metavar="TEXT", help="only the blocks whose commands contain TEXT")
    ap.add_argument("--jobs", type=int, default=1, help="pages run side by side (default 1)")
    ap.add_argument("--times", action="store_true", help="print each command's wall time")
    args = ap.parse_args(argv)
    paths = [p.resolve() for p in args.files] or doc_files()
    for given, path in zip(args.files, paths):
        problem = _unreadable(path)
        if problem:
            print(f"error: {str(given)!r} {problem}", file=sys.stderr)
            return 2
    try:
        failures = check(paths, slow=args.slow or args.update, update=args.update, select=args.select,
                         jobs=args.jobs, times=args.times, log=lambda msg: print(msg, flush=True))
    except KeyboardInterrupt:
        _stop_all()
        print("error: interrupted; no page was rewritten", file=sys.stderr)
        return 130
    for f in failures:
        print(f, end="\n\n", file=sys.stderr)
    print(f"{len(failures)} mismatches" if failures else "every quoted output matches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
