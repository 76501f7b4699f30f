"""Start ``moto_server`` on a free 127.0.0.1 port as a subprocess, for real boto3 calls."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server(host: str = "127.0.0.1") -> Iterator[str]:
    """Yield the endpoint URL of a fresh moto_server; stop it afterwards."""
    executable = shutil.which("moto_server")
    if executable is None:
        raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    process = subprocess.Popen(
        [executable, "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
