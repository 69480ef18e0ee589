"""Headless Chromium for the explorer: the driver the browser test uses, and the README's screenshot
(`python -m viz.explorer.screenshot --run outputs/latest docs/explore.png`). Needs selenium and Debian's
chromium + chromium-driver packages (requirements-dev.txt, .ci/run).
"""
from __future__ import annotations

import shutil
import sys
import threading

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def missing_browser() -> str | None:
    """Why headless Chromium cannot run here (None: it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -r requirements-dev.txt)"
    if not any(shutil.which(b) for b in CHROMIUM):
        return "no chromium browser found (apt-get install chromium chromium-driver)"
    if not shutil.which(DRIVER):
        return "no chromedriver found (apt-get install chromium-driver)"
    return None


def chromium_driver(width: int = 1400, height: int = 1000):
    """A headless Chromium driven by selenium, console messages kept (driver.get_log('browser'))."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(b) for b in CHROMIUM if shutil.which(b))
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which(DRIVER)), options=options)


def wait_for_map(driver, timeout: float = 30) -> None:
    """Until the main heat map has been drawn for the tokens now in the page."""
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "const m = document.getElementById('map'); return m.dataset.ready && +m.dataset.t === S.ids.length "
        "&& S.ids.length > 0"))


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch
    from selenium.webdriver.support.ui import WebDriverWait

    from viz.explorer.model_view import load_views
    from viz.explorer.server import make_server
    p = argparse.ArgumentParser(prog="python -m viz.explorer.screenshot", description=__doc__.split("\n")[0])
    p.add_argument("--run", help="training run directory (default: the newest run)")
    p.add_argument("--prompt", default="ROMEO:\nBut soft, what light through yonder window breaks?")
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("out", help="PNG file to write")
    args = p.parse_args(argv)
    if (why := missing_browser()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    views = load_views([("run", args.run)] if args.run else [], torch.device("cpu"))
    server = make_server(views, "127.0.0.1", 0, args.prompt)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver = chromium_driver(1400, 1600)
    try:
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
        wait_for_map(driver)
        driver.execute_script(f"S.layer = {args.layer}; S.head = {args.head}; document.getElementById('layer')"
                              f".value = {args.layer}; document.getElementById('head').value = {args.head}; "
                              "ensureLayer().then(() => render());")
        wait_for_map(driver)
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(  # and the training timeline, if the run has one
            "return TL.info !== null && (!TL.info.steps.length || $('tl-map').dataset.step !== undefined)"))
        driver.save_screenshot(args.out)
    finally:
        driver.quit()
        server.shutdown()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
