"""TensorBoard as a person opens it: a real server over a tiny mixed_float16 run, and Debian's
headless Chromium (driven by Selenium through Debian's chromedriver; nothing downloaded)
through the scalars, graphs, histograms, HParams and projector pages, a screenshot of each
saved in the test's folder (`pytest --basetemp DIR` keeps them). Skipped, saying why, only
where the browser is not installed (`make browser` installs it; `.ci/run` does)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from engine.test_tensorboard_server import free_port, get

import amptrain

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# Text inside the page's shadow roots and frames too (TensorBoard's components keep theirs
# there; a plugin such as the projector draws in a frame of the same origin).
DEEP_TEXT = """
function deep(node) {
  let text = node.shadowRoot ? deep(node.shadowRoot) : "";
  if (node.tagName === "IFRAME" && node.contentDocument) text += deep(node.contentDocument.body);
  for (const child of node.childNodes) text += child.nodeType === 3 ? child.textContent + " " : deep(child);
  return text;
}
return deep(document.body);
"""
PAGES = {  # the page, and what must be drawn on it
    # the first group's charts (the page draws a group's charts when it scrolls into view), then
    # every group's heading
    "scalars": ["metrics/accuracy", "metrics/loss", "optimizer", "precision", "size", "system", "throughput"],
    "graphs": ["Main Graph"],
    "histograms": ["weights/", "gradients/"],
    "hparams": ["precision.policy", "train.learning_rate"],
    "projector": ["Points: ", "Label by"],  # "Label by" shows once the pieces (metadata) are loaded
}


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium and chromedriver here: `make browser` installs Debian's")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a test extra: make install-test")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run", "--disable-quic",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1400,1000", f"--user-data-dir={profile}",
        "--use-angle=swiftshader", "--enable-unsafe-swiftshader",  # WebGL on the CPU, for the projector
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_every_tensorboard_page_draws_the_run_in_a_real_browser(tiny, tmp_path, browser, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tiny / "cache"))
    run_dir = tiny / "run"
    overrides = ["precision.policy=mixed_float16", "train.histogram_every=4", "train.projector_rows=50"]
    amptrain.fit(str(tiny / "tiny.toml"), overrides, run_dir=str(run_dir))
    metadata = (run_dir / "tensorboard" / "train" / "projector-tokens.tsv").read_text(encoding="utf-8").splitlines()
    vocabulary = (run_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert metadata == vocabulary[:50]  # one column: no header line; the first 50 pieces, in order
    port = free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(run_dir / "tensorboard")]
    command += ["--port", str(port), "--host", "127.0.0.1", "--load_fast", "false", "--reload_interval", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        _wait_for_runs(server, port)
        for page, expected in PAGES.items():
            browser.get(f"http://127.0.0.1:{port}/#{page}")
            text = _wait_for_text(browser, expected)
            time.sleep(3)  # the charts draw after their titles
            browser.save_screenshot(str(shots / f"{page}.png"))
            missing = [e for e in expected if e not in text]
            assert not missing, f"{page}: {missing} not drawn; the page shows: {text[:1500]}"
        assert "Points: 50" in text  # the projector drew the capped table
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert sorted(os.listdir(shots)) == sorted(f"{page}.png" for page in PAGES)


def _wait_for_runs(server, port, seconds=90):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stderr.read().decode()[-2000:]
        try:
            if "train" in get(port, "/data/plugin/scalars/tags"):
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    raise AssertionError("TensorBoard served no runs")


def _wait_for_text(browser, expected, seconds=60):
    """The page's text once every expected piece is drawn (or the last seen, at the deadline)."""
    deadline = time.monotonic() + seconds
    while True:
        text = " ".join(browser.execute_script(DEEP_TEXT).split())  # text nodes joined by one space
        if all(e in text for e in expected) or time.monotonic() > deadline:
            return text
        time.sleep(1)
