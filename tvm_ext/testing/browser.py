"""Open a local HTML page in a real headless Chromium and say what it saw: console errors, images
that did not decode, the page's headings; save a full-page screenshot.

Chromium from the OS packages (``apt-get update && apt-get install -y chromium``), driven over the
DevTools protocol on a pipe (``--remote-debugging-pipe``: fd 3 carries commands in, fd 4 replies
out, each message JSON ended by a NUL byte): no port, no driver, no package beyond the standard
library.  Started with the flags a closed, root-run machine needs (no sandbox as root; no
background networking, component updates or sync, which would try to reach the network), its
own temporary profile, and stopped by its process id.
"""
from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

INSTALL = "apt-get update && apt-get install -y chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--remote-debugging-pipe")
CHECK = """JSON.stringify({images: document.images.length,
  broken: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
  headings: Array.from(document.querySelectorAll('h1,h2')).map(e => e.textContent),
  text: document.body.innerText, height: document.documentElement.scrollHeight})"""


class BrowserMissing(RuntimeError):
    """No Chromium on this machine; the message says how to install it."""


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise BrowserMissing(f"no Chromium here: install it with `{INSTALL}` (as root)")
    return found


class _Pipe:
    """The DevTools protocol over Chromium's pipe: numbered commands, events kept for later."""

    def __init__(self, proc, write_fd: int, read_fd: int):
        self.proc, self.write_fd, self.next_id, self.events = proc, write_fd, 0, []
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(read_fd,), daemon=True).start()

    def _read(self, fd: int) -> None:
        buffer = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.replies.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                self.replies.put(json.loads(raw))

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30.0,
             until_event: str | None = None) -> dict:
        """Send one command and wait for its reply (and, with ``until_event``, for that event after it)."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline, result, seen = time.monotonic() + timeout, None, until_event is None
        while result is None or not seen:
            try:
                reply = self.replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"Chromium did not answer {method} in {timeout:.0f} s") from None
            if reply is None:
                raise RuntimeError(f"Chromium closed its pipe during {method} (exit code {self.proc.poll()})")
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"Chromium: {method}: {reply['error'].get('message')}")
                result = reply.get("result", {})
            elif "method" in reply:
                self.events.append(reply)
                seen = seen or reply["method"] == until_event
        return result


def open_page(html_path: str, screenshot: str | None = None, width: int = 1280, height: int = 900,
              timeout: float = 60.0) -> dict:
    """Load ``html_path`` in headless Chromium; returns {"errors": console errors and exceptions,
    "images", "broken": alt texts of images that did not decode, "headings", "text", "height"};
    writes a full-page PNG screenshot to ``screenshot`` when given."""
    binary = chromium_path()
    profile = tempfile.mkdtemp(prefix="tvm_ext_chromium_")
    to_child, from_parent = os.pipe()  # commands: we write from_parent, Chromium reads fd 3
    from_child, to_parent = os.pipe()  # replies: Chromium writes fd 4, we read from_child
    high = [os.dup(fd) for fd in (to_child, to_parent)]  # out of the way of fds 3 and 4

    def child_fds():
        os.dup2(high[0], 3)
        os.dup2(high[1], 4)

    # the pipes are close-on-exec; dup2 in the child makes fds 3 and 4 inheritable, so only they survive exec
    proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"], close_fds=False,
                            preexec_fn=child_fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for fd in (to_child, to_parent, *high):
        os.close(fd)
    try:
        cdp = _Pipe(proc, from_parent, from_child)
        target = cdp.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            cdp.call(method, session=session)
        cdp.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        url = "file://" + os.path.abspath(html_path)
        cdp.call("Page.navigate", {"url": url}, session=session, timeout=timeout, until_event="Page.loadEventFired")
        found = json.loads(cdp.call("Runtime.evaluate", {"expression": CHECK, "returnByValue": True},
                                    session=session)["result"]["value"])
        if screenshot:
            shot = cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
                "x": 0, "y": 0, "width": width, "height": found["height"], "scale": 1}}, session=session,
                timeout=timeout)
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        found["errors"] = _errors(cdp.events)
        try:
            cdp.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
        return found
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(from_parent)
        os.close(from_child)
        shutil.rmtree(profile, ignore_errors=True)


def _errors(events: list) -> list:
    """Console errors, uncaught exceptions and error log entries among the DevTools events."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            out.append(p["exceptionDetails"].get("text", "exception"))
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif e["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(p["entry"].get("text", ""))
    return out
