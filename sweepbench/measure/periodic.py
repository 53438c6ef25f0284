"""A reading taken every few milliseconds on a thread of its own while a span runs (the GPU's
state, its used memory), and once more as the span ends."""

from __future__ import annotations

import threading


class Periodic:
    """Calls ``read()`` every ``period_s`` while resumed (``resume``/``pause``, as often as the caller
    asks), and once as it pauses, so that a span shorter than the period is read too."""

    def __init__(self, *, period_s: float, name: str) -> None:
        self.period_s, self.name = period_s, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.read()

    def resume(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def pause(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.read()
