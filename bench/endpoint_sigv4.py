"""The key-injecting port's cost of signing a Bedrock call (SigV4 in nginx's Lua) per call.

    python bench/endpoint_sigv4.py [--calls 2000]

Runs in this checkout's egress-proxy image, in nginx with its Lua module, as the port
does: ``kagura_upstream.sigv4`` (HMAC-SHA256 and SHA-256 through LuaJIT's FFI to the
image's OpenSSL) over a request the size of one the Claude Code CLI sends mid-session
(~60 KB), against the baseline every endpoint pays: reading the credential from its file
(``kagura_upstream.read_key``, once per request, so a renewed lease is in force at the
next call). Both are timed in the same nginx, the same run. bench/model_calls.py measures
what the whole port adds to a call.

    RESULT endpoint_sigv4 sign_ms=<ms> sign_2k_ms=<ms> read_key_ms=<ms> ratio=<sign/read_key> n=<calls>
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testing.egress_images import this_proxy_image

LABEL = {"dev.kagura.bench": "endpoint_sigv4"}
NGINX = """
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
daemon off; pid /tmp/nginx.pid; error_log stderr error; events {}
http {
  access_log off; lua_package_path "/usr/local/share/kagura/?.lua;;";
  client_body_temp_path /tmp/b; proxy_temp_path /tmp/p; fastcgi_temp_path /tmp/f;
  uwsgi_temp_path /tmp/u; scgi_temp_path /tmp/s;
  init_by_lua_block {
    require("kagura_upstream").init({api = "bedrock", auth = "sigv4", region = "us-east-1",
      upstream_host = "bedrock-runtime.us-east-1.amazonaws.com"})
  }
  server { listen 127.0.0.1:8081; location / { content_by_lua_block {
    local u = require "kagura_upstream"
    local n = tonumber(ngx.var.arg_n)
    local key = u.read_key("/tmp/key")
    local target = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
    local function timed(f)
      ngx.update_time(); local t0 = ngx.now()
      for _ = 1, n do f() end
      ngx.update_time(); return (ngx.now() - t0) * 1000 / n
    end
    local big, small = string.rep("x", 60000), string.rep("x", 2000)
    local sign = timed(function() u.sigv4(key, target, big) end)
    local sign_2k = timed(function() u.sigv4(key, target, small) end)
    local read = timed(function() u.read_key("/tmp/key") end)
    ngx.say(string.format("sign_ms=%.4f sign_2k_ms=%.4f read_key_ms=%.4f", sign, sign_2k, read))
  } } }
}
"""
KEY = "ASIABENCHSIGV4000001:bench/secret+" + "k" * 28 + ":IQoJb3" + "T" * 700


def _archive(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def measure(client: Any, image: str, calls: int) -> dict[str, float]:
    container = client.containers.create(
        image,
        ["sh", "-c", "nginx -c /tmp/nginx.conf"],
        entrypoint=[],
        labels=LABEL,
        network_mode="none",
    )
    with contextlib.ExitStack() as stack:
        stack.callback(container.remove, force=True)
        container.put_archive("/tmp", _archive({"nginx.conf": NGINX, "key": KEY + "\n"}))
        container.start()
        # -t: socat waits this long for the answer once the request is sent (its default,
        # 0.5 s, is shorter than the timed loops take on a loaded machine).
        ask = f"printf 'GET /?n={calls} HTTP/1.0\\r\\n\\r\\n' | socat -t 120 - TCP:127.0.0.1:8081"
        deadline = time.monotonic() + 30
        while True:
            out = container.exec_run(["sh", "-c", ask]).output.decode(errors="replace")
            found = dict(re.findall(r"(\w+)=([\d.]+)", out))
            if found:
                return {k: float(v) for k, v in found.items()}
            if time.monotonic() > deadline:
                raise SystemExit(f"nginx gave no figures: {out[-500:]}")
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("KAGURA_BENCH_QUICK") == "1"
    parser.add_argument("--calls", type=int, default=200 if quick else 2000)
    args = parser.parse_args()
    client = docker.from_env()
    figures = measure(client, this_proxy_image(client), args.calls)
    ratio = figures["sign_ms"] / figures["read_key_ms"]
    print(
        f"SigV4 of a 60 KB call {figures['sign_ms']:.3f} ms, of a 2 KB call"
        f" {figures['sign_2k_ms']:.3f} ms; reading the credential {figures['read_key_ms']:.4f} ms"
    )
    print(
        f"RESULT endpoint_sigv4 sign_ms={figures['sign_ms']:.4f}"
        f" sign_2k_ms={figures['sign_2k_ms']:.4f} read_key_ms={figures['read_key_ms']:.4f}"
        f" ratio={ratio:.1f} n={args.calls}"
    )


if __name__ == "__main__":
    main()
