"""Executable docs: every `console` block of the README and the site prints what it quotes
(tests/doccheck.py; tolerance doccheck.REL_TOL), and the checker has teeth."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doccheck  # noqa: E402

PAGE = """# A page

```console
$ python -c "print('exact eps', 13.85, 'at delta', 0.00101, '!'); print('wall', 1.23, 's')"
exact eps 13.85 at delta 0.00101 !
wall ... s
```
"""


def _page(tmp_path, text=PAGE) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_a_page_that_quotes_what_its_command_prints_passes(tmp_path):
    assert doccheck.check([_page(tmp_path)]) == []


def test_a_quoted_number_edited_by_hand_fails_and_one_within_the_tolerance_passes(tmp_path):
    wrong = _page(tmp_path, PAGE.replace("eps 13.85 at", "eps 14.2 at"))
    failures = doccheck.check([wrong])
    assert len(failures) == 1 and "14.2" in failures[0] and "13.85" in failures[0]
    close = _page(tmp_path, PAGE.replace("eps 13.85 at", "eps 13.86 at"))  # 0.07 % < REL_TOL
    assert doccheck.check([close]) == []
    flag = _page(tmp_path, PAGE.replace("0.00101 !", "0.00101"))  # a flag is not a number's tolerance
    assert len(doccheck.check([flag])) == 1


def test_ellipses_match_any_tokens_and_any_lines():
    assert doccheck.match(["a ... d"], ["a b c d"]) and doccheck.match(["a ... d"], ["a d"])
    assert doccheck.match(["x", "...", "z"], ["x", "1", "2", "z"])
    assert not doccheck.match(["x", "z"], ["x", "1", "z"])
    assert doccheck.match(["n = 1.17e+03"], ["n = 1170"]) and not doccheck.match(["n = 1.17e+03"], ["n = 1200"])


def test_update_rewrites_the_quoted_output_from_a_fresh_run(tmp_path):
    path = _page(tmp_path, PAGE.replace("eps 13.85 at", "eps 99 at"))
    doccheck.check([path], update=True, log=lambda *_: None)
    assert "eps 13.85 at" in path.read_text() and doccheck.check([path]) == []


def test_continuation_lines_join_one_command(tmp_path):
    path = _page(tmp_path, '```console\n$ python -c \\\n    "print(42)"\n42\n```\n')
    (block,) = doccheck.blocks(path)
    assert block.commands[0].text == 'python -c "print(42)"' and doccheck.check([path]) == []


SLOW_PAGES = sorted((p for p in doccheck.doc_files() if any(b.slow for b in doccheck.blocks(p))),
                    key=lambda p: -sum(b.slow for b in doccheck.blocks(p)))
"""The pages with slow blocks, the most first: the slow pass hands tests out in this order, and
the longest page (sweeps.md, with Table II) was the last to start in a 39-minute CI run."""


def test_every_fast_console_block_of_the_readme_and_the_site_prints_what_it_quotes():
    """The pages without slow blocks; a page with slow blocks is checked whole (its fast blocks
    too) by the slow pass's test below, one test per page, which CI runs."""
    pages = [p for p in doccheck.doc_files() if p not in SLOW_PAGES]
    failures = doccheck.check(pages, jobs=2)  # pages side by side: the rest of the suite is one process
    assert failures == [], "\n\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES, ids=lambda p: str(p.relative_to(doccheck.ROOT)))
def test_every_console_block_of_a_page_with_slow_blocks_prints_what_it_quotes(page):
    """Every block of a page with slow blocks (its fast blocks may make what the slow ones read,
    and only this test checks them); the pages with fast blocks only are the default suite's
    test above, which CI runs too, so they are not run twice. One test per page, so that the
    slow pass spreads the pages over its workers (``--dist load``)."""
    failures = doccheck.check([page], slow=True, times=True)  # times shown with -s or on failure
    assert failures == [], "\n\n".join(failures)


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_command_and_the_main_functions(tmp_path):
    import subprocess

    import os

    pytest.importorskip("mkdocs")
    if os.environ.get("OTAFL_SITE_DIR"):  # .ci/run built it with this same command just before
        site = Path(os.environ["OTAFL_SITE_DIR"])
    else:
        site = tmp_path / "site"
        out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                             cwd=doccheck.ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
    cli = (site / "reference" / "cli" / "index.html").read_text()
    from otafl.cli.main import cli as group

    assert all(f"otafl {name}" in cli for name in group.commands)
    api = (site / "reference" / "api" / "index.html").read_text()
    assert all(f in api for f in ("run_experiment", "bound_grid", "audit_grid", "calibrate", "audit_run"))
    import importlib.util

    if importlib.util.find_spec("marimo"):  # the lectures' HTML exports (lectures/site_export.py)
        lectures = (site / "lectures" / "index.html").read_text()
        for nb in ("01_fading_mac", "02_accountants", "03_tradeoff"):
            page = (site / "lectures" / f"{nb}.html").read_text()
            assert f'href="{nb}.html"' in lectures and "marimo" in page
            assert "cdn.jsdelivr.net" not in page and "marimo-frontend/assets/" in page  # served by the site
    assert not [p for p in site.rglob("*.html") if "cdn.jsdelivr.net" in p.read_text(errors="replace")]


def test_a_failing_command_fails_unless_its_quoted_output_is_an_error(tmp_path):
    assert len(doccheck.check([_page(tmp_path, "```console\n$ false\n...\n```\n")])) == 1
    ok = '```console\n$ python -c "import sys; sys.exit(\'error: x = 2 is outside [0, 1]\')"\nerror: x = 2 is outside [0, 1]\n```\n'
    assert doccheck.check([_page(tmp_path, ok)]) == []


def test_a_python_exec_block_is_compared_with_the_output_block_after_it(tmp_path):
    page = "```python {.exec}\nx = 6 * 7\nprint('answer', x)\n```\n\n```output\nanswer 42\n```\n"
    assert doccheck.check([_page(tmp_path, page)]) == []
    assert len(doccheck.check([_page(tmp_path, page.replace("answer 42", "answer 41"))])) == 1


def test_every_shell_block_of_the_readme_and_the_site_is_run_or_marked_norun():
    unmarked = [u for path in doccheck.doc_files() for u in doccheck.unmarked_shell_blocks(path)]
    assert unmarked == []


def test_a_norun_block_is_shown_not_run_and_a_bash_block_is_reported(tmp_path):
    page = _page(tmp_path, "```console {.norun}\n$ false\n```\n\n```bash\notafl run x\n```\n")
    assert doccheck.check([page], slow=True) == []
    (bash,) = doccheck.unmarked_shell_blocks(page)
    assert ":5:" in bash and "bash" in bash
    quoting = _page(tmp_path, "```console {.norun}\n$ echo 1\n1\n```\n")
    assert len(doccheck.unmarked_shell_blocks(quoting)) == 1


def test_a_fence_with_bare_option_words_is_reported_it_would_render_as_inline_code(tmp_path):
    markdown = pytest.importorskip("markdown", reason="the docs extra (pip install -e '.[docs]')")
    pytest.importorskip("pymdownx", reason="the docs extra (pip install -e '.[docs]')")

    bare = "```console slow\n$ echo 1\n1\n```\n\nafter *this*\n"
    (msg,) = doccheck.unmarked_shell_blocks(_page(tmp_path, bare))
    assert "console {.slow}" in msg
    render = markdown.Markdown(extensions=["pymdownx.superfences", "attr_list"]).convert
    assert "highlight" not in render(bare)  # the damage it does: no code block, its text inline
    good = bare.replace("console slow", "console {.slow}")
    assert doccheck.unmarked_shell_blocks(_page(tmp_path, good)) == [] and "highlight" in render(good)
    (block,) = doccheck.blocks(_page(tmp_path, good))
    assert block.slow


def test_select_runs_only_the_blocks_naming_it_and_update_copies_the_figures(tmp_path, monkeypatch):
    figures = tmp_path / "figures"
    monkeypatch.setattr(doccheck, "FIGURES", figures)
    page = _page(tmp_path, "```console\n$ echo new > figures/f.txt; echo 1\n2\n```\n\n```console\n$ false\n```\n")
    assert len(doccheck.check([page])) == 2
    assert doccheck.check([page], select="figures/f.txt", update=True, log=lambda *_: None) == []
    assert (figures / "f.txt").read_text() == "new\n" and "$ echo new > figures/f.txt; echo 1\n1\n" in page.read_text()


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page as the site builds them (toc slugs of its headings outside
    code fences, explicit ``id="..."`` and ``{#...}``)."""
    import re

    from markdown.extensions.toc import slugify

    found, fence = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        m = re.match(r"^#+\s+(.*?)\s*(\{#([\w-]+)\})?$", line)
        if m:
            found.add(m.group(3) or slugify(m.group(1).replace("`", ""), "-"))
        found.update(re.findall(r'id="([\w-]+)"', line))
    return found


def test_every_docs_reference_in_the_code_and_the_pages_names_a_page_and_an_anchor_that_exist():
    import re

    pytest.importorskip("markdown")
    root = doccheck.ROOT
    ref = re.compile(r"docs/([\w./-]+?\.md)(#[\w-]+)?")
    files = [root / "README.md", *doccheck.doc_files()]
    for sub in ("otafl", "tests", "experiments", "lectures", "benchmarks"):
        files += [p for p in (root / sub).rglob("*") if p.suffix in (".py", ".toml", ".md")]
    broken = []
    for f in files:
        for m in ref.finditer(f.read_text()):
            page = root / "docs" / m.group(1)
            if not page.is_file() or (m.group(2) and m.group(2)[1:] not in _anchors(page)):
                broken.append(f"{f.relative_to(root)}: {m.group(0)}")
    assert broken == []


def test_a_command_that_runs_too_long_fails_alone_and_takes_its_children_with_it(tmp_path):
    import time

    marker = tmp_path / "late"
    code, lines = doccheck.run(f"echo started; (sleep 2; touch {marker}) & sleep 5", tmp_path, timeout=0.5)
    assert code == 124 and lines[0] == "started" and lines[-1].startswith("(doccheck: timed out")
    time.sleep(2.5)
    assert not marker.exists()  # the background child was ended with the command


def test_a_command_that_signals_its_process_group_does_not_end_the_check():
    code, _ = doccheck.run("kill -9 0", Path("."))
    assert code != 0  # the command died, the checker did not


def test_a_killed_checker_takes_the_command_it_runs_down(tmp_path):
    """The commands run in sessions of their own; a checker killed with SIGKILL (CI cancelled)
    must not leave them running (otafl's guard process ends them)."""
    import os
    import signal
    import subprocess
    import time

    pidfile = tmp_path / "pid"
    page = _page(tmp_path, "```console\n$ python -c \"import os, time; open('%s', 'w').write(str(os.getpid())); "
                 "time.sleep(120)\"\n```\n" % pidfile)
    checker = subprocess.Popen([sys.executable, str(Path(doccheck.__file__)), str(page)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = int(pidfile.read_text())
        time.sleep(0.6)  # the guard records the checker's descendants every 0.25 s
        os.kill(checker.pid, signal.SIGKILL)
        checker.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the command (pid {pid}) outlived its killed checker by 10 s")
    finally:
        if checker.poll() is None:
            checker.kill()
