"""The NVMe tier's swap files of this process, made unreadable and restored: a fault injected
under the runtime (with TIERMEM_CHECKSUM=xxh3 every read of them is refused as corrupt)."""

import os

import numpy


def flip_swap_files(nvme_dir):
    """Inverts every byte of this process's swap files under nvme_dir; returns what to write
    back to undo it ({} when none could be reached). The files have no name (O_TMPFILE): they
    are reached through this process's descriptors."""
    saved = {}  # path -> (the file's identity, its bytes)
    fds, paths = "/proc/self/fd", []
    for fd in os.listdir(fds) if os.path.isdir(fds) else []:
        try:
            if os.readlink(os.path.join(fds, fd)).startswith(str(nvme_dir) + "/"):
                paths.append(os.path.join(fds, fd))
        except OSError:  # the descriptor listdir itself used
            pass
    for path in paths:
        with open(path, "r+b") as f:
            data = f.read()
            st = os.fstat(f.fileno())
            saved[path] = ((st.st_dev, st.st_ino), data)
            f.seek(0)
            f.write((numpy.frombuffer(data, dtype=numpy.uint8) ^ 0xFF).tobytes())
            f.flush()
            os.fsync(f.fileno())
    return saved


def restore(saved):
    """Writes back what flip_swap_files inverted, into the same files: a descriptor closed since
    (a runtime freed meanwhile, whose number a new file then took) is skipped."""
    for path, (identity, data) in saved.items():
        try:
            f = open(path, "r+b")
        except OSError:
            continue  # closed since
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != identity:
                continue  # another file has the number now
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
