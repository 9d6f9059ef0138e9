"""Open a page in headless Chromium and report what a person with DevTools open would see: console errors,
uncaught exceptions, failed loads, every URL the page requested, and the values of DOM queries.

It speaks the DevTools protocol over `--remote-debugging-pipe` (JSON messages separated by NUL bytes on
file descriptors 3 and 4), so it needs nothing beyond the standard library and a `chromium` binary.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


@dataclass
class PageLoad:
    console_errors: list[str] = field(default_factory=list)  # console.error/assert, uncaught exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, the page itself included
    failed_loads: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # expression -> its value in the loaded page


class _Pipe:
    def __init__(self, binary: str, profile: str):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def as_fds_3_and_4() -> None:
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=as_fds_3_and_4, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        reply = self.wait(lambda m, i=self._next_id: m.get("id") == i, timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait(self, matches, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if matches(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buffer += chunk

    def close(self) -> None:
        try:
            os.write(self._to_chrome, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            os.close(self._to_chrome)
            os.close(self._from_chrome)


def load(path: Path, expressions: list[str], settle_s: float = 0.5, screenshot: Path | None = None,
         width: int = 1280) -> PageLoad:
    """Load `path` as a file:// page, wait for its load event, then evaluate each JavaScript expression;
    `screenshot`: also write the whole page as a PNG there, `width` CSS pixels wide, for a person to look at."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("no chromium binary")
    with tempfile.TemporaryDirectory() as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            pipe.wait(lambda m: m.get("method") == "Page.loadEventFired", 60)
            time.sleep(settle_s)  # late console messages and image decoding
            result = PageLoad()
            for expression in expressions:
                reply = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                       "awaitPromise": True}, session=session)
                if "exceptionDetails" in reply:
                    raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
                result.values[expression] = reply["result"].get("value")
            if screenshot is not None:
                height = pipe.call("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                        "returnByValue": True}, session=session)["result"]["value"]
                pipe.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": int(height),
                                                                 "deviceScaleFactor": 1, "mobile": False},
                          session=session)
                time.sleep(settle_s)
                shot = pipe.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                 session=session, timeout=60)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
        finally:
            pipe.close()
    for event in pipe.events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            result.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            result.console_errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            result.console_errors.append(f"{params['entry']['text']} ({params['entry'].get('url', '')})")
        elif method == "Network.requestWillBeSent":
            result.requests.append(params["request"]["url"])
        elif method == "Network.loadingFailed":
            result.failed_loads.append(f"{params.get('type')}: {params.get('errorText')}")
    return result
