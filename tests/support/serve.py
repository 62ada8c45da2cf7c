"""`trainjob-admission serve` as its own process, started from the installed console script as a
user runs it, on a free loopback port.

    with Serve(workdir, cert_dir, ca_pem, "--bundle", "builtin:default", "--cluster-state", state) as server:
        code, text = server.call("/validate", review)     # over TLS, verified against ca_pem

The constructor returns once ``ready`` (``/readyz`` by default; ``/healthz`` where readiness is what
the test looks at) answers 200 on the probe port (``--probe-port``, as the kubelet asks), and raises (the process stopped) if serve exits first or is not
ready within ``timeout`` seconds. ``stop()`` sends SIGTERM, then SIGKILL after its timeout.

The process sees no KUBECONFIG and no HTTPS proxy: only its arguments say what it talks to. Files
in ``workdir``: ``<name>.stderr``, ``<name>-decisions.jsonl`` (the file sink, ``--decision-log``)
and, with ``keep_stdout``, ``<name>.stdout`` (else stdout goes to /dev/null).
"""
from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .net import LOOPBACK, free_port

CLI = Path(sys.executable).parent / "trainjob-admission"


class Serve:
    def __init__(self, workdir: Path, cert_dir: Path, ca_pem: bytes, *args: str, name: str = "serve",
                 ready: str = "/readyz", timeout: float = 60.0, keep_stdout: bool = False,
                 client_cert: tuple[Path, Path] | None = None):
        """cert_dir holds tls.crt and tls.key (the ``--cert-dir`` layout) issued by the CA ca_pem;
        args are further serve flags (bundles, cluster state or kubeconfig, ...); client_cert is the
        (cert, key) ``call`` presents, for a server started with ``--client-ca``."""
        self.port, self.probe_port = free_port(), free_port()
        self.url = f"https://{LOOPBACK}:{self.port}"
        self.probe_url = f"https://{LOOPBACK}:{self.probe_port}"
        self.ca_pem = ca_pem
        self.ssl_context = ssl.create_default_context(cadata=ca_pem.decode())
        if client_cert:
            self.ssl_context.load_cert_chain(*client_cert)
        self.decision_log = workdir / f"{name}-decisions.jsonl"
        self.stderr_path = workdir / f"{name}.stderr"
        self.stdout_path = workdir / f"{name}.stdout" if keep_stdout else None
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HTTPS_PROXY", "https_proxy")}
        env["NO_PROXY"] = env["no_proxy"] = f"{LOOPBACK},localhost"
        argv = [str(CLI), "serve", "--host", LOOPBACK, "--port", str(self.port), "--probe-port", str(self.probe_port),
                "--cert-dir", str(cert_dir),
                "--decision-log", str(self.decision_log), *args]
        with contextlib.ExitStack() as files:
            stderr = files.enter_context(open(self.stderr_path, "wb"))
            stdout = files.enter_context(open(self.stdout_path, "wb")) if self.stdout_path else subprocess.DEVNULL
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                            cwd=workdir, env=env)
        try:
            self._wait(ready, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        code, body = 0, ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"trainjob-admission serve exited ({self.process.returncode}):\n{self.output()}")
            code, body = self.call(path, timeout=2.0, base=self.probe_url)
            if code == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"serve not ready after {timeout:.0f} s (last {path}: {code} {body!r}):\n{self.output()}")

    def call(self, path: str, body: dict | None = None, timeout: float = 5.0, base: str = "") -> tuple[int, str]:
        """GET ``path`` (or POST ``body`` as JSON) over TLS on ``base`` (default: the admission port);
        (status, text), (0, error) if unreachable."""
        data = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"Content-Type": "application/json"}
        request = urllib.request.Request((base or self.url) + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.ssl_context) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def records(self) -> list[dict]:
        """Decision-log records written so far (the file sink, rotated files not included)."""
        if not self.decision_log.exists():
            return []
        return [json.loads(line) for line in self.decision_log.read_text().split("\n") if line.strip()]

    def output(self) -> str:
        """The tail of the service's stderr, for failure messages."""
        return self.stderr_path.read_text(errors="replace")[-4000:] if self.stderr_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` s; returns the exit code
        (negative: the signal that ended it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def send_json(handler, status: int, obj: object) -> None:
    """Answers an http.server request with ``obj`` as JSON: the stand-ins for the API server that
    server-tier tests run (a SubjectAccessReview, a runtime snapshot)."""
    body = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
