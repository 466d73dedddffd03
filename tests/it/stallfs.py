"""A FUSE file system for the tests of issue 47 (`tests/it/stall.rs`): a read-only mirror of
SOURCE at MOUNT whose every operation blocks while the file FLAG exists, as a network or FUSE
mount that stops answering does. Needs mfusepy (pip) and /dev/fuse.

Usage: stallfs.py SOURCE MOUNT FLAG [reads]   (runs in the foreground until unmounted or killed)

With ``reads``, only opening and reading files block (names and attributes still answer, as a
``stat``-based check sees them): what a process start that reads its program then waits on.
"""

import errno
import os
import sys
import time

import mfusepy as fuse


class Stalling(fuse.Operations):
    use_ns = True

    def __init__(self, source, flag, reads_only=False):
        self.source = source
        self.flag = flag
        self.reads_only = reads_only

    def _wait(self):
        while os.path.exists(self.flag):
            time.sleep(0.05)

    def _real(self, path, read=False):
        if read or not self.reads_only:
            self._wait()
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._real(path))
        except OSError as e:
            raise fuse.FuseOSError(e.errno)
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        attrs = {k: getattr(st, k) for k in keys}
        for k in ("st_atime", "st_mtime", "st_ctime"):
            attrs[k] = getattr(st, k + "_ns")
        return attrs

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._real(path))

    def readlink(self, path):
        return os.readlink(self._real(path))

    def access(self, path, mode):
        if not os.access(self._real(path), mode):
            raise fuse.FuseOSError(errno.EACCES)

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        return os.open(self._real(path, read=True), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        self._wait()
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)
        return 0

    def statfs(self, path):
        st = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}


def main():
    source, mount, flag = (os.path.abspath(p) for p in sys.argv[1:4])
    reads_only = sys.argv[4:5] == ["reads"]
    # No caching of names or attributes by the kernel: once stalled, every lookup waits.
    fuse.FUSE(
        Stalling(source, flag, reads_only),
        mount,
        foreground=True,
        nothreads=False,
        ro=True,
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    main()
