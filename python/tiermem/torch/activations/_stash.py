"""Sources of copies that the compute stream does not wait for (tm_tensor_copy_in_async): each
source tensor is kept alive here until tiermem reports its copy done, so that its memory is not
reused while the copy still reads it (as torchtune's OffloadActivations keeps its stash). The
stash is bounded: beyond max_bytes, the host waits for the oldest copies (the compute stream
never does)."""

import collections
import threading
import time


class CopyStash:
    __slots__ = ("max_bytes", "bytes", "_entries", "waits", "_lock")

    def __init__(self, max_bytes):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self._entries = collections.deque()  # (owner, source, nbytes), oldest first
        self.waits = 0  # times the bound made the host wait for a copy
        # Packs run on the forward's thread, drains also on the backward's (a CUDA backward
        # runs on PyTorch's device threads).
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._entries)

    def add(self, owner, source, nbytes):
        """Keeps source until owner.copy_done(); owner stays alive as long (its tiermem tensor
        must not be destroyed while the copy reads source)."""
        with self._lock:
            self._entries.append((owner, source, nbytes))
            self.bytes += nbytes
            self._drain()
            while self.bytes > self.max_bytes and len(self._entries) > 1:
                self.waits += 1
                self._wait_oldest()

    def drain(self):
        """Lets go of the sources whose copies are done, oldest first (copies pass in order on
        one copy stream; one still in flight holds back the ones behind it until next time)."""
        if self._entries:
            with self._lock:
                self._drain()

    def _drain(self):
        entries = self._entries
        while entries and _done(entries[0][0]):
            self.bytes -= entries.popleft()[2]

    def flush(self):
        """Waits for every copy (the host; the compute stream is not involved)."""
        with self._lock:
            while self._entries:
                self._wait_oldest()

    def _wait_oldest(self):
        owner = self._entries[0][0]
        delay = 20e-6
        while not _done(owner):
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
        self.bytes -= self._entries.popleft()[2]


def _done(owner):
    return owner.copy_done()  # True too once the runtime, which waited for it, is closed
