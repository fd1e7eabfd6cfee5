"""Helpers of the deployment tests: `python -m project serve` started on a free loopback port and always
stopped, and a disk that fills up."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.conftest import PACKAGE, ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(args: Sequence[object], cwd: Path) -> Iterator[tuple[httpx.Client, subprocess.Popen, Path]]:
    """`python -m project serve ARGS --port P` on a free loopback port, once GET /health answers: (a client of
    it, its process, its log file). Always stopped, with every worker process it started."""
    port = free_port()
    log_path = cwd / "server.log"
    log = open(log_path, "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", PACKAGE, "serve", *map(str, args), "--port", str(port)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the HTTP and inference workers can be found
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("server not ready in 300 s:\n" + log_path.read_text())
        yield client, proc, log_path
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # whatever is left of its group (nothing, normally)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes (whole pages) mounted at `folder` (created): a disk that fills up. Unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("a disk that fills up is a mounted tmpfs here, and mounting one needs root")
    folder.mkdir(parents=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if mount.returncode:
        pytest.fail(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
