# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one I/O seam of the collection.

Every path under /sys, /proc, /etc, /dev and /boot that a module reads or writes goes through a
HostFS, which maps absolute host paths under a ``root``. Tests build a fake tree under tmp_path
and pass it as ``root``; nothing patches ``open``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
import time


class HostFSError(Exception):
    """A read or write under the host tree failed; the message says which path and why."""

    def __init__(self, op: str, path: str, err: OSError):
        self.op = op
        self.path = path
        self.errno = err.errno
        self.strerror = err.strerror or str(err)
        super().__init__(f"cannot {op} {path}: {self.strerror}")


class HostPathError(HostFSError):
    """A host path a module was given (or built) that the seam refuses: not a string, relative, empty, with a NUL
    byte, or one that leads out of ``root`` (through ``..`` or a symlink). Nothing was read or written there."""

    def __init__(self, path, why: str):
        super().__init__("use", path, OSError(why))
        self.args = (f"host path {path!r} refused: {why}",)


def fsync_dir(path: str) -> None:
    """fsync a directory, so that a rename or unlink in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HostFS:
    """Read and write host files relative to ``root`` (``/`` on a real host)."""

    def __init__(self, root: str | None = "/"):
        root = "/" if root is None else root
        # A bad root is refused by the first path() (inside the module's finish()), not here.
        self.refused = None if isinstance(root, str) and root.startswith("/") and "\0" not in root else root
        self.root = "/" if self.refused is not None else os.path.abspath(root)
        self._real_root = os.path.realpath(self.root)

    def path(self, host_path: str, follow: bool = True) -> str:
        """Map an absolute host path (``/sys/...``) to the real path under root. HostPathError for a path that is not
        an absolute string, holds a NUL byte, or leads out of root: through ``..`` past the root, or through a symlink
        (every link but the last one followed when ``follow`` is False, for lstat, readlink, unlink)."""
        if self.refused is not None:
            raise HostPathError(self.refused, "root must be an absolute path without NUL bytes ('/' on a real host)")
        if not isinstance(host_path, str) or not host_path.startswith("/"):
            raise HostPathError(host_path, "expected an absolute path (starting with /)")
        if "\0" in host_path:
            raise HostPathError(host_path, "it holds a NUL byte")
        if self.root == "/":
            return host_path
        parts = [p for p in host_path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise HostPathError(host_path, f"'..' in a host path could lead out of root {self.root}; give the path "
                                           "without '..'")
        real = self.root + host_path
        head, tail = os.path.split(real.rstrip("/") or "/")
        resolved = os.path.realpath(real) if follow else os.path.join(os.path.realpath(head), tail)
        if not self._inside(resolved):
            raise HostPathError(host_path, f"it resolves to {resolved}, outside root {self.root} (a symlink leads out)")
        return real

    def _inside(self, real_path: str) -> bool:
        return real_path == self._real_root or real_path.startswith(self._real_root.rstrip("/") + "/")

    def unroot(self, real_path: str) -> str:
        """Inverse of path(): the host path for a real path under root."""
        if self.root == "/":
            return real_path
        if real_path == self.root:
            return "/"
        if real_path.startswith(self.root + "/"):
            return real_path[len(self.root):]
        return real_path

    # ---- reads -------------------------------------------------------------------------
    def exists(self, host_path: str) -> bool:
        return os.path.lexists(self.path(host_path, follow=False))

    def isdir(self, host_path: str) -> bool:
        return os.path.isdir(self.path(host_path))

    def read_text(self, host_path: str, default: str | None = None) -> str | None:
        """Text content with the trailing newline stripped; ``default`` when the file is absent."""
        try:
            with open(self.path(host_path), "r", encoding="utf-8", errors="replace") as fh:
                return fh.read().rstrip("\n")
        except OSError as err:
            if default is not None and err.errno in (errno.ENOENT, errno.ENOTDIR):
                return default
            raise HostFSError("read", host_path, err) from None

    def read_optional(self, host_path: str) -> str | None:
        """Text content, or None when the file is absent or cannot be read (sysfs EIO/EINVAL)."""
        try:
            with open(self.path(host_path), "r", encoding="utf-8", errors="replace") as fh:
                return fh.read().rstrip("\n")
        except OSError:
            return None

    def read_exact(self, host_path: str, errors: str = "replace") -> str | None:
        """The exact text of a file (trailing newlines kept, unlike read_text), None when it does not
        exist; HostFSError when it exists and cannot be read (with ``errors="strict"``, text that is not
        UTF-8 raises UnicodeDecodeError)."""
        if not self.exists(host_path):
            return None
        try:
            with open(self.path(host_path), "r", encoding="utf-8", errors=errors, newline="") as fh:
                return fh.read()
        except OSError as err:
            raise HostFSError("read", host_path, err) from None

    def read_bytes(self, host_path: str, size: int = -1, offset: int = 0) -> bytes:
        """``size`` bytes (all with -1) from ``offset`` (fewer at the end of the file); HostFSError when it cannot be
        read."""
        try:
            with open(self.path(host_path), "rb") as fh:
                if offset:
                    fh.seek(offset)
                return fh.read(size)
        except OSError as err:
            raise HostFSError("read", host_path, err) from None

    def size(self, host_path: str) -> int:
        """The size in bytes of a file (symlinks followed, inside root); HostFSError when it cannot be stat'ed."""
        try:
            return os.stat(self.path(host_path)).st_size
        except OSError as err:
            raise HostFSError("stat", host_path, err) from None

    def listdir(self, host_path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(host_path)))
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return []
            raise HostFSError("list", host_path, err) from None

    def readlink(self, host_path: str) -> str | None:
        try:
            return os.readlink(self.path(host_path, follow=False))
        except OSError:
            return None

    def lstat(self, host_path: str):
        """``os.lstat`` of the path, None when it does not exist."""
        try:
            return os.lstat(self.path(host_path, follow=False))
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise HostFSError("stat", host_path, err) from None

    def realpath(self, host_path: str) -> str:
        """Resolve symlinks inside the tree; the result is a host path again."""
        return self.unroot(os.path.realpath(self.path(host_path)))

    # ---- writes (callers keep them behind check mode) --------------------------------------
    def write_text(self, host_path: str, data: str) -> None:
        """Plain write, for sysfs/procfs attributes (no temp file, no rename)."""
        try:
            with open(self.path(host_path), "w", encoding="utf-8") as fh:
                fh.write(data)
        except OSError as err:
            raise HostFSError("write", host_path, err) from None

    def write_atomic(self, host_path: str, data: str, mode: int = 0o644) -> None:
        """Write a regular file durably: a temp file in the same directory, fsync'd, chmod'd, renamed
        over the target, then the directory fsync'd, so that after a crash or power loss the path
        holds either the old content or the new one, never an empty or partial file."""
        real = self.path(host_path)
        parent = os.path.dirname(real)
        try:
            os.makedirs(parent, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".gpufleet-", dir=parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:  # bytes read back as they were
                    fh.write(data)
                    fh.flush()
                    os.fchmod(fh.fileno(), mode)
                    os.fsync(fh.fileno())
                os.replace(tmp, real)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            fsync_dir(parent)
        except OSError as err:
            raise HostFSError("write", host_path, err) from None

    def write_durable(self, host_path: str, data: str, mode: int = 0o644) -> None:
        """The name the kernel-upgrade journal uses: every atomic write is durable (write_atomic)."""
        self.write_atomic(host_path, data, mode)

    def makedirs(self, host_path: str, mode: int = 0o755) -> None:
        """Create a directory and its missing parents (each with ``mode``, as ``mkdir -p -m``)."""
        real = self.path(host_path)
        try:
            missing = []
            while real and not os.path.lexists(real):
                missing.append(real)
                real = os.path.dirname(real)
            for path in reversed(missing):
                os.mkdir(path, mode)
                os.chmod(path, mode)
        except OSError as err:
            raise HostFSError("mkdir", host_path, err) from None

    def chmod(self, host_path: str, mode: int) -> None:
        try:
            os.chmod(self.path(host_path), mode)
        except OSError as err:
            raise HostFSError("chmod", host_path, err) from None

    def chown(self, host_path: str, uid: int, gid: int) -> None:
        try:
            os.lchown(self.path(host_path, follow=False), uid, gid)
        except OSError as err:
            raise HostFSError("chown", host_path, err) from None

    def fsync_dir(self, host_path: str) -> None:
        """fsync the directory holding ``host_path`` (after a rename or an unlink there)."""
        fsync_dir(os.path.dirname(self.path(host_path)))

    def remove(self, host_path: str) -> bool:
        """Remove a file (the removal made durable with a directory fsync); False when it was not there."""
        try:
            real = self.path(host_path, follow=False)
            os.unlink(real)
            fsync_dir(os.path.dirname(real))
            return True
        except FileNotFoundError:
            return False
        except OSError as err:
            raise HostFSError("remove", host_path, err) from None

    def remove_tree(self, host_path: str) -> bool:
        """Remove a directory and everything under it (a file too); False when it was not there. Links are
        removed, never followed."""
        real = self.path(host_path, follow=False)
        try:
            if os.path.isdir(real) and not os.path.islink(real):
                shutil.rmtree(real)
            else:
                os.unlink(real)
            fsync_dir(os.path.dirname(real))
            return True
        except FileNotFoundError:
            return False
        except OSError as err:
            raise HostFSError("remove", host_path, err) from None

    # ---- an exclusive lock, for a read-decide-write that one process at a time may do ------------
    @contextlib.contextmanager
    def lock(self, host_path: str, timeout: float = 30.0):
        """Hold an exclusive ``flock`` on the lock file ``host_path`` for the ``with`` block (a write: keep it
        behind check mode). The file is created (0600, with its missing directories) and never removed, since
        two processes that lock two files of one name hold nothing. The kernel drops the lock when its
        holder ends, even by SIGKILL. HostFSError when another holder keeps it ``timeout`` seconds."""
        real = self.path(host_path)
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            raise HostFSError("lock", host_path, err) from None
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        busy = OSError(errno.EAGAIN, f"another process has held it for more than {timeout:g} s")
                        raise HostFSError("lock", host_path, busy) from None
                    time.sleep(0.002)
                except OSError as err:
                    raise HostFSError("lock", host_path, err) from None
            yield
        finally:
            os.close(fd)
