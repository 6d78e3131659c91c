"""A JupyterLab server for the browser tier: on 127.0.0.1, from this Python environment, isolated.

Everything the server and its kernels write goes under one work folder: a copy of the notebooks
(autosave must never write outputs into the repository), Jupyter's config, data, runtime and
workspace folders, the IPython folder, and settings that silence the news popup (a toast that
would cover the notebook on a first start). The server log is ``<work>/server.log``.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# JupyterLab's notification settings: no news feed, no update check, so no popup at start.
NOTIFICATION_SETTINGS = {"fetchNews": "false", "checkForUpdates": False}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    """``with JupyterLab(notebooks, work) as lab:`` serves a copy of ``notebooks`` (a folder of .ipynb).

    ``disabled_extensions`` are lab extensions turned off in this server's own config
    (``jupyter labextension disable --level=user``), to show what the tier sees without them.
    ``lab.notebooks`` is the served copy; ``lab.url(path)`` a browser URL with the token.
    """

    def __init__(self, notebooks: Path, work: Path, disabled_extensions: tuple[str, ...] = ()):
        self.work = work
        self.notebooks = work / "notebooks"
        shutil.copytree(notebooks, self.notebooks, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.env = self._environment()
        self.disabled_extensions = disabled_extensions
        self.process: subprocess.Popen | None = None
        self.log = work / "server.log"

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for variable, folder in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                                 ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                                 ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("IPYTHONDIR", "ipython")):
            env[variable] = str(self.work / folder)
            (self.work / folder).mkdir(parents=True, exist_ok=True)
        notification = self.work / "settings" / "@jupyterlab" / "apputils-extension"
        notification.mkdir(parents=True, exist_ok=True)
        notification /= "notification.jupyterlab-settings"
        notification.write_text(json.dumps(NOTIFICATION_SETTINGS))
        return env

    def start(self, timeout_s: float = 120.0) -> JupyterLab:
        for extension in self.disabled_extensions:
            subprocess.run([sys.executable, "-m", "jupyter", "labextension", "disable", "--level=user", extension],
                           env=self.env, check=True, capture_output=True)
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                   "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                   f"--ServerApp.root_dir={self.notebooks}", "--LabApp.expose_app_in_browser=True"]
        if os.geteuid() == 0:
            command.append("--allow-root")  # CI runs as root; the server refuses root without it
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, cwd=self.notebooks, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "api/status")
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{self.log_tail()}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def api(self, method: str, path: str):
        """Call the server's REST API; the decoded JSON answer (None when empty)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> int:
        """Shut down every session's kernel (each holds several hundred MB with torch); how many."""
        sessions = self.api("GET", "api/sessions")
        for session in sessions:
            self.api("DELETE", f"api/sessions/{session['id']}")
        return len(sessions)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> JupyterLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
