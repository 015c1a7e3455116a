"""Screenshots of the served lecture apps: figures/lecture-01.png, -02.png, -03.png.

    python lectures/screenshot.py                 # all three
    python lectures/screenshot.py 02              # one

Serves each notebook with ``marimo run --headless`` on 127.0.0.1, opens it in headless
Chromium through Playwright, waits until the last cell's summary line has rendered (every
cell has run), grows the window to the page's height, takes the screenshot and stops the
server. Needs, besides the
``lectures`` extra: ``pip install playwright`` and a Chromium (``apt-get install chromium``,
found at /usr/bin/chromium, or ``playwright install chromium``). The PNG is reduced to a
256-colour palette to stay small.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOTEBOOKS = {p.name[:2]: p for p in sorted(HERE.glob("0*.py"))}


def _wait_http(url: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout:.0f} s")


def shoot(number: str, *, port: int, width: int, height: int, max_height: int, out: Path, timeout: float) -> Path:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    path = NOTEBOOKS[number]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    server = subprocess.Popen([sys.executable, "-m", "marimo", "run", str(path), "--headless", "--no-token",
                               "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url, timeout)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium,
                                         args=["--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.get_by_text(f"lecture-{number} summary:").first.wait_for(timeout=timeout * 1000)
            page.wait_for_load_state("networkidle")
            page.wait_for_function("Array.from(document.images).every(i => i.complete)", timeout=timeout * 1000)
            time.sleep(1.0)
            # marimo scrolls inside its own container, so the page is one viewport tall:
            # grow the viewport to the content's height to capture every cell.
            content = page.evaluate("Math.max(...Array.from(document.querySelectorAll('*')).map(e => e.scrollHeight))")
            page.set_viewport_size({"width": width, "height": max(height, min(int(content) + 40, max_height))})
            time.sleep(1.0)
            raw = out.with_suffix(".raw.png")
            page.screenshot(path=str(raw), full_page=True)
            browser.close()
        img = Image.open(raw).convert("RGB")
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
        raw.unlink()
        return out
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its kernel, nothing else
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("numbers", nargs="*", default=sorted(NOTEBOOKS), help="01, 02, 03 (default: all)")
    ap.add_argument("--port", type=int, default=2731)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800, help="smallest viewport height")
    ap.add_argument("--max-height", type=int, default=6000, help="the viewport grows to the content, up to this")
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "figures")
    args = ap.parse_args(argv)
    for i, number in enumerate(args.numbers):
        out = args.out_dir / f"lecture-{number}.png"
        shoot(number, port=args.port + i, width=args.width, height=args.height, max_height=args.max_height, out=out,
              timeout=args.timeout)
        print(f"{out} {out.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
