"""A stand-in for a slow network call (an SSH connect, a Proxmox login) that counts how many run at once: each call
is held until all the calls expected at once are inside, or 5 s have passed."""

import threading
import time


class InFlight:
    def __init__(self, result):
        self.result = result            # what each call returns: result(*args)
        self.inside = self.most = 0
        self.calls = []
        self._lock = threading.Lock()
        self._release = threading.Event()

    def __call__(self, *args):
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.calls.append(args)
        self._release.wait(5)
        with self._lock:
            self.inside -= 1
        return self.result(*args)

    def run(self, fns, at_once: int) -> None:
        """Each of fns in a thread of its own; held until `at_once` calls are in flight together (or 5 s)."""
        threads = [threading.Thread(target=fn) for fn in fns]
        [t.start() for t in threads]
        deadline = time.monotonic() + 5
        while self.most < at_once and time.monotonic() < deadline:
            time.sleep(0.01)
        self._release.set()
        [t.join() for t in threads]
