"""The built documentation site in a real browser, offline: headless Chromium (Debian's
``chromium``; .ci/run installs it) opens pages served on loopback, MathJax (served from the
site itself, hooks/offline_math.py) typesets every formula, and no TeX delimiter is left in the
visible text. Screenshots of the landing page and of privacy/exact are saved for a person
to look at: ``$OTAFL_SCREENSHOTS`` or ``runs/docs-screenshots/``.

The site is ``$OTAFL_SITE_DIR`` when set (.ci/run builds it once), else built here with
``mkdocs build --strict``. Slow pass: building takes minutes."""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"index": "", "privacy-exact": "privacy/exact/"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--virtual-time-budget=20000"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def site() -> Path:
    given = os.environ.get("OTAFL_SITE_DIR")
    if given:
        return Path(given)
    out = Path(tempfile.mkdtemp(prefix="otafl-site-"))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def server(site):
    """The site on a loopback port (fonts need http: Chromium refuses them to a file:// page)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", handler.func.missing
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    missing: list[str] = []

    def log_message(self, fmt, *args):  # no request log on stderr; remember what was not found
        if len(args) > 1 and str(args[1]) == "404":
            self.missing.append(str(args[0]))


def _browse(url: str, *args: str) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="otafl-chromium-")
    try:
        return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                              capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class VisibleText(html.parser.HTMLParser):
    """The text a reader sees: not scripts, styles, code, nor MathJax's hidden MathML copy."""

    HIDDEN = {"script", "style", "code", "pre", "noscript", "textarea", "mjx-assistive-mml", "template"}

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.parts: list[str] = []
        self.arithmatex = 0
        self.typeset = 0
        self.errors = 0

    def handle_starttag(self, tag, attrs):
        classes = dict(attrs).get("class") or ""
        self.arithmatex += "arithmatex" in classes.split()
        self.typeset += tag == "mjx-container"
        self.errors += tag == "mjx-merror"
        if tag in self.HIDDEN:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in self.HIDDEN and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


def read_dom(dom: str) -> VisibleText:
    parser = VisibleText()
    parser.feed(dom)
    return parser


def test_the_visible_text_reader_sees_untypeset_tex():
    """Teeth: the page as the server sends it (before MathJax runs) fails the check."""
    before = read_dom('<p>Given <span class="arithmatex">\\(n\\)</span>, <code>\\(kept\\)</code></p>'
                      '<div class="arithmatex">\\[ P_n \\]</div>')
    text = "".join(before.parts)
    assert "\\(" in text and "\\[" in text and before.arithmatex == 2 and before.typeset == 0


@pytest.mark.parametrize("name", list(PAGES))
def test_a_browser_typesets_every_formula_offline_and_a_screenshot_is_saved(name, server):
    base, missing = server
    url = base + PAGES[name]
    res = _browse(url, "--dump-dom")
    assert res.returncode == 0 and "</html>" in res.stdout, res.stderr[-2000:]
    dom = read_dom(res.stdout)
    text = "".join(dom.parts)
    assert dom.arithmatex > 0 or name == "index"
    assert dom.typeset >= dom.arithmatex, (dom.typeset, dom.arithmatex)  # each formula typeset (display: 1 each)
    assert dom.errors == 0
    for delimiter in ("\\(", "\\)", "\\[", "\\]", "$$"):
        assert delimiter not in text, text[max(0, text.find(delimiter) - 200):text.find(delimiter) + 200]
    assert missing == [], missing  # every file MathJax or the theme asked for is in the site
    shots = Path(os.environ.get("OTAFL_SCREENSHOTS") or ROOT / "runs" / "docs-screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    png = shots / f"{name}.png"
    png.unlink(missing_ok=True)
    shot = _browse(url, "--window-size=1280,1600", f"--screenshot={png}")
    assert shot.returncode == 0 and png.is_file() and png.stat().st_size > 10_000, shot.stderr[-2000:]


def test_a_lecture_page_renders_offline_from_the_frontend_the_site_serves(server, site):
    """The lectures' exports load marimo's frontend from the site (lectures/site_export.py),
    not from a CDN: in a browser without network the notebook's text and math appear."""
    if not (site / "lectures" / "01_fading_mac.html").is_file():
        pytest.skip("the site was built without marimo (the lectures' exports)")
    base, missing = server
    url = base + "lectures/01_fading_mac.html"
    res = _browse(url, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    text = "".join(read_dom(res.stdout).parts)
    # the notebook's markdown is in the page only as data inside a script until the frontend
    # renders it, so its text among the visible text means the frontend ran (its math is typeset
    # in shadow roots, which --dump-dom does not show: the screenshot does)
    assert "Lecture 1" in text and "The channel, the alignment gain" in text, text[:2000]
    assert [m for m in missing if "lectures/" in m] == []
    shots = Path(os.environ.get("OTAFL_SCREENSHOTS") or ROOT / "runs" / "docs-screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    shot = _browse(url, "--window-size=1280,1600", f"--screenshot={shots / 'lecture-01.png'}")
    assert shot.returncode == 0 and (shots / "lecture-01.png").stat().st_size > 10_000
