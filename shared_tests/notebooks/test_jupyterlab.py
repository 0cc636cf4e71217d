"""The course opened as a person opens it: JupyterLab on localhost, with the settings the build
gives it, a built chapter opened in headless Chromium, every cell run from the browser, and the
rendered page read back (three columns of real code, the agreement table, the picture, the
checker's verdicts, and no pop-up asking about Jupyter's news)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from docs import chromium

websocket = pytest.importorskip("websocket", reason="websocket-client (a jupyter-server dependency) is not installed")
pytest.importorskip("jupyterlab", reason="the course's tools are not installed: pip install -e '.[notebooks]'")
pytestmark = pytest.mark.skipif(
    chromium.find() is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)

from transformer_course.build import LAB_SETTINGS, NOTEBOOKS, build, install_lab_settings  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Page:
    """One browser tab, driven over the Chrome DevTools protocol."""

    def __init__(self, debug_port: int):
        targets = json.loads(_wait_for(f"http://127.0.0.1:{debug_port}/json/list", 60))
        page = next(t for t in targets if t["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.id = 0

    def send(self, method: str, **params):
        self.id += 1
        self.socket.send(json.dumps({"id": self.id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.id:
                if "error" in message:
                    raise RuntimeError(message["error"])
                return message["result"]

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def wait(self, expression: str, seconds: float, state: str = "''"):
        """Wait until `expression` holds; past `seconds`, say what the page showed (`state`, evaluated)."""
        deadline = time.monotonic() + seconds
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {seconds} s still false: {expression}; the page: {self.evaluate(state)}")
            time.sleep(0.5)


_SESSION = "window.jupyterapp.shell.currentWidget?.sessionContext"
KERNEL_IDLE = f"{_SESSION}?.session?.kernel?.status === 'idle'"
# what the page shows, for a failure's message: the kernel, the cells run, any dialog open
STATE = f"""JSON.stringify({{
    kernel: {_SESSION}?.session?.kernel?.status ?? 'none',
    kernelName: {_SESSION}?.kernelDisplayName,
    cellsRun: [...document.querySelectorAll('.jp-InputPrompt')].filter(p => /\\d/.test(p.textContent)).length,
    cellsQueued: [...document.querySelectorAll('.jp-InputPrompt')].filter(p => p.textContent.includes('*')).length,
    checks: document.querySelectorAll('.course-check').length,
    errors: [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type*=error]')].map(e => e.textContent.slice(0, 300)),
    dialog: document.querySelector('.jp-Dialog')?.textContent ?? null,
}})"""


NEWS_QUESTION = "Would you like to get notified about official Jupyter news?"


@pytest.fixture
def lab(tmp_path, tmp_path_factory):
    """A built chapter 1 in a folder of its own, served by JupyterLab with the settings the build
    gives it; yields (port, token, folder)."""
    shutil.copy(NOTEBOOKS / "01_masks.py", tmp_path / "01_masks.py")
    build(tmp_path / "01_masks.py", run=False)  # as `python -m transformer_course.build` writes it: no outputs
    # The build writes its settings into the environment's JupyterLab settings folder; here into a
    # folder of the test's own (the same file, by the same function), which this JupyterLab reads
    # in that folder's place. The user settings and workspaces too: a person's own answer to the
    # news question, saved in their home folder, would hide the pop-up this test looks for.
    settings, user = tmp_path_factory.mktemp("lab-settings"), tmp_path_factory.mktemp("lab-user")
    install_lab_settings(settings)
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(user / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(user / "workspaces"),
    }
    port, token = _free_port(), "course-test"
    server = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
            "--ServerApp.allow_root=True",  # CI runs as root
            "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run the cells as the Run menu does
            # nothing reaches outside this machine: no extension index, no update or news check
            "--LabApp.extension_manager=readonly", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--LabApp.app_settings_dir={settings}",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/status?token={token}", 120)
        yield port, token, tmp_path
    finally:
        server.terminate()
        server.wait(30)


def test_a_chapter_opens_runs_and_renders_in_jupyterlab_in_chromium(lab, tmp_path_factory):
    port, token, _ = lab
    # the build's settings, as JupyterLab's settings service composes them for the page
    for plugin, wanted in LAB_SETTINGS.items():
        served = json.loads(_wait_for(f"http://127.0.0.1:{port}/lab/api/settings/{plugin}?token={token}", 60))
        assert {key: served["schema"]["properties"][key]["default"] for key in wanted} == wanted, plugin
    debug_port = _free_port()
    profile = tmp_path_factory.mktemp("chromium-profile")
    browser = subprocess.Popen(
        [
            chromium.find(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
            f"--remote-debugging-port={debug_port}", "--window-size=1600,1000",
            f"http://127.0.0.1:{port}/lab/tree/01_masks.ipynb?token={token}",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        page = Page(debug_port)
        page.wait("typeof window.jupyterapp !== 'undefined' && document.querySelectorAll('.jp-Cell').length > 5", 180)
        # Run the cells only once the kernel is up: run before, JupyterLab asks which kernel to start
        # (a dialog a headless browser never answers) and runs nothing. A loaded machine starts it late.
        page.wait(KERNEL_IDLE, 180, STATE)
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait("document.querySelectorAll('.course-check').length >= 4", 300, STATE)
        text = page.evaluate("document.querySelector('.jp-Notebook').textContent")
        columns = page.evaluate("document.querySelectorAll('.course-three').length")
        images = page.evaluate("document.querySelectorAll('.jp-OutputArea-output img').length")
        tables = page.evaluate("document.querySelectorAll('.course-agreement tr').length")
        errors = page.evaluate("document.querySelectorAll('.jp-OutputArea-output[data-mime-type*=error]').length")
        shown = page.evaluate("document.body.innerText")  # the notifications too, outside the notebook
    finally:
        browser.terminate()
        browser.wait(30)
    assert columns == 3  # make_causal_mask, make_padding_mask, make_decoder_mask, three backends each
    assert "numpy_impl/masks.py" in text and "torch_impl/masks.py" in text and "jax_impl/masks.py" in text
    assert "np.tril(np.ones((seq_len, seq_len), dtype=bool))" in text  # read from the file, rendered
    assert tables == 4  # a header and one row per backend
    assert images >= 1  # the masks, drawn
    assert errors == 0 and "Traceback" not in text
    assert "This is a classic mistake: the mask's polarity." in text
    assert text.count("Not yet") == 4  # three unwritten exercises and the wrong answer shown on purpose
    assert NEWS_QUESTION not in shown  # the build's setting: JupyterLab opens on the chapter, not on a question
