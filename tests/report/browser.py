"""Load a page in real headless Chromium and report what a person's browser would see: console
errors, uncaught exceptions, every request made, each figure's rendered size, and a screenshot.

Chromium is driven through the DevTools protocol over ``--remote-debugging-pipe`` (file
descriptors 3 and 4, NUL-separated JSON messages): no websocket library, no port to race for."""

from __future__ import annotations

import base64
import fcntl
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

CHROMIUM_FLAGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-extensions",
                  "--disable-sync", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
                  "--remote-debugging-pipe", "--window-size=1400,1000"]

# every <figure>'s svg: its rendered box and how many drawn elements it holds
_FIGURES_JS = """JSON.stringify([...document.querySelectorAll('figure')].map(f => {
  const s = f.querySelector('svg'); const r = s ? s.getBoundingClientRect() : {width: 0, height: 0};
  return {title: f.dataset.title || '', width: r.width, height: r.height,
          drawn: s ? s.querySelectorAll('path, use, text, rect, image').length : 0};
}))"""

# every pair of text boxes of one figure that intersect (matplotlib draws each text, a tick label,
# a title, a legend entry, as a <g id="...text_N"> group of glyph paths; the comment in it holds the
# text): what a person would see as labels written over each other
_OVERLAPS_JS = """JSON.stringify([...document.querySelectorAll('figure')].flatMap(f => {
  const boxes = [...f.querySelectorAll('svg g[id*="text_"]')].map(g => {
    const r = g.getBoundingClientRect();
    const note = [...g.childNodes].find(n => n.nodeType === 8);
    return {text: note ? note.data.trim() : g.id, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom};
  }).filter(b => b.x1 > b.x0 && b.y1 > b.y0);
  const out = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    const w = Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0), h = Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0);
    if (w > 0.5 && h > 0.5) out.push({figure: f.dataset.title || '', a: a.text, b: b.text});
  }
  return out;
}))"""


def chromium_binary() -> str:
    for candidate in ("/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("chromium is not installed (Debian: apt-get install chromium; .ci/run does it)")


@dataclass
class PageVisit:
    url: str
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    overlaps: list[dict[str, str]] = field(default_factory=list)  # intersecting text boxes of one figure
    texts: int = 0  # text boxes seen in figures (the overlap check had something to check)
    title: str = ""
    text: str = ""
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int) -> None:
        self.proc, self.write_fd, self.read_fd = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.write_fd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            self.events.append(self._read(max(0.1, deadline - time.monotonic())))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer")
            ready, _, _ = select.select([self.read_fd], [], [], left)
            if ready:
                chunk = os.read(self.read_fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed its pipe (exit {self.proc.poll()})")
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)


def _above_4(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def visit(path: Path, *, settle_s: float = 0.5, timeout: float = 60.0) -> PageVisit:
    """Open ``path`` (file://) in a fresh headless Chromium profile and record the visit."""
    url = path.resolve().as_uri()
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    # chromium reads commands on fd 3 and writes replies on fd 4; its ends are first moved above 4,
    # so that neither dup2 in the child can overwrite the other's source
    to_chrome_r, from_chrome_w = _above_4(to_chrome_r), _above_4(from_chrome_w)

    def child_fds() -> None:
        os.dup2(to_chrome_r, 3)  # dup2 onto another number clears close-on-exec
        os.dup2(from_chrome_w, 4)

    with tempfile.TemporaryDirectory(prefix="sweepbench-chromium-") as profile:
        proc = subprocess.Popen([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                preexec_fn=child_fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=False)  # dup2 leaves 3 and 4 inheritable; Python's own fds are CLOEXEC
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
        try:
            return _visit(pipe, url, settle_s=settle_s, timeout=timeout)
        finally:
            try:
                pipe.send("Browser.close", timeout=10)
            except Exception:
                pass
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_chrome_w)
            os.close(from_chrome_r)


def _visit(pipe: _Pipe, url: str, *, settle_s: float, timeout: float) -> PageVisit:
    target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
    session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        pipe.send(f"{domain}.enable", session=session)
    pipe.events.clear()  # about:blank's own events
    pipe.send("Page.navigate", {"url": url}, session=session)
    pipe.wait_event("Page.loadEventFired", timeout=timeout)
    time.sleep(settle_s)  # anything a page would do after load (it should do nothing)

    def evaluate(expr: str) -> Any:
        result = pipe.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session)
        return result["result"].get("value")

    page = PageVisit(url=url)
    page.figures = json.loads(evaluate(_FIGURES_JS))
    page.overlaps = json.loads(evaluate(_OVERLAPS_JS))
    page.texts = evaluate("document.querySelectorAll('figure svg g[id*=\"text_\"]').length")
    page.title = evaluate("document.title")
    page.text = evaluate("document.body.innerText")
    metrics = pipe.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
    shot = pipe.send("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": 1400, "height": min(metrics["height"], 4000), "scale": 1}},
        session=session, timeout=timeout)
    page.screenshot = base64.b64decode(shot["data"])
    for event in pipe.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            page.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            page.console_errors.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            page.console_errors.append("console: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            page.console_errors.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
        elif method == "Network.loadingFailed":
            page.console_errors.append(f"request failed: {params.get('errorText')}")
    return page


def png_is_not_blank(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct colours) of a PNG; raises if it is not a PNG."""
    import io

    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    image = Image.open(io.BytesIO(data)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    return image.width, image.height, len(colours)
