"""Open JupyterLab headless on 127.0.0.1, load one executed notebook and save a screenshot
of it as a user sees it, outside the repository (``make notebook-screenshot``).

It checks that a notebook renders with its figures in JupyterLab itself, not only that it
executes. Without Playwright or a Chromium for it, it says why and exits 0 (a skip)."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "results/reference/notebooks/03_thread_vs_process_prefetch.ipynb"
OUT = Path(tempfile.gettempdir()) / "storebench-notebook-screenshot.png"
START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser_path() -> str | None:
    """Playwright's own Chromium where installed, else the system's."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", default=NOTEBOOK, help="path from the repository root")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        print("notebook-screenshot: skipped: playwright is not installed "
              "(pip install -e '.[dev]')")
        return 0
    port, token = free_port(), secrets.token_hex(16)
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={ROOT}",
         # JupyterLab refuses root unless told: a container's user often is.
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        env={**os.environ, "JUPYTER_CONFIG_DIR": tempfile.mkdtemp(prefix="jupyter-config-")})
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or lab.poll() is not None:
                    print("notebook-screenshot: failed: JupyterLab did not start")
                    return 1
                time.sleep(1)
        with sync_playwright() as p:
            try:
                browser = p.chromium.launch()
            except Error:
                executable = browser_path()
                if executable is None:
                    print("notebook-screenshot: skipped: no Chromium for Playwright "
                          "(playwright install chromium, or apt-get install chromium)")
                    return 0
                browser = p.chromium.launch(executable_path=executable)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.goto(f"{base}/lab/tree/{args.notebook}?token={token}")
            # The notebook's first figure, rendered from its stored outputs.
            page.wait_for_selector(".jp-OutputArea-output img", timeout=120_000)
            page.locator(".jp-OutputArea-output img").first.scroll_into_view_if_needed()
            time.sleep(1)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(args.out))
            images = page.locator(".jp-OutputArea-output img").count()
            browser.close()
        print(f"notebook-screenshot: {args.notebook} rendered in JupyterLab with {images} "
              f"figure(s); screenshot: {args.out}")
        return 0
    finally:
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.kill()


if __name__ == "__main__":
    sys.exit(main())
