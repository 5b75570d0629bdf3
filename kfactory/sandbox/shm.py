"""Shared memory between a runner parent and its child: arrays in /dev/shm files that both map (ShmBuffers, with
guard bands around a checked tensor), and the ring of arenas a session (cpu or cuda) takes its requests' buffers
from."""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import threading
import uuid
from pathlib import Path

import numpy as np

from kfactory.observability import stagetime
from kfactory.platform import scratch
from kfactory.sandbox.parent import HarnessError
from kfactory.sandbox.protocol import shared_dir


class GrowthStopped(Exception):
    """A growth ahead (ShmBuffers.grow) gave way, between two pieces, to a request that wants its arena."""


class SharedMemoryFull(HarnessError):
    """The shared-memory filesystem has no room for a request's buffers: the deployment's fault, not the
    candidate's (a harness error: the work is dead-lettered with this message, to be sent back once it is fixed)."""


#: the prefix of a buffer directory's name (kfactory.platform.scratch names it by its owner)
PREFIX = "kf-shm"
#: ShmBuffers.grow allocates and maps in a file this much at a time (each piece host work of its own, short enough
#: for a timing to wait for: 64 MiB took about 0.06 s on the 2-core host)
GROW_PIECE = 64 << 20
PAGE = mmap.PAGESIZE


def sweep_stale(base: Path, grace_s: float = scratch.GRACE_S, legacy_s: float = scratch.LEGACY_S) -> int:
    """Remove the buffer directories that processes left when they died without closing them (killed, or crashed):
    their files hold memory (tmpfs pages) until removed (kfactory.platform.scratch.sweep_stale says which are left
    alone). The directories removed."""
    return scratch.sweep_stale(base, PREFIX, grace_s, legacy_s)


def _base() -> Path:
    """Where buffers live (/dev/shm, else the temporary directory), swept of dead processes' directories the first
    time this process uses it."""
    base = Path(shared_dir())
    scratch.sweep_once(base, PREFIX)
    return base


class ShmBuffers:
    """Arrays in /dev/shm files that both the parent and the runner map.

    `reserve(nbytes)` makes one arena file that later arrays are carved from (64-byte aligned), so a pool
    of hundreds of small input sets costs one file and one mapping, not hundreds.
    """

    ALIGN = 64

    def __init__(self, base: Path | None = None):
        """`base`: the directory to make this one's in (default /dev/shm, else the temporary directory)."""
        # the lock is held until close (or this process's death): sweep_stale's sign of life
        self.dir, self._owner = scratch.make_owned(base or _base(), PREFIX)
        self.arrays: list[np.ndarray] = []
        self._arena: tuple[str, np.memmap] | None = None
        self._used = 0
        #: held by the request an ArenaRing gave this arena to, and by ArenaRing.ready while it grows the arena: the
        #: two never change it at once (close() takes neither: it ends the arena)
        self.busy = threading.Lock()
        #: requests waiting for `busy` (ArenaRing.take, under the ring's lock): a growth in progress stops at its
        #: next piece while any does (GrowthStopped)
        self.wanting = 0

    def _file(self, nbytes: int) -> tuple[str, np.memmap]:
        """A new file of nbytes, its space allocated now: a sparse file on a full tmpfs maps fine and then kills
        the process that writes to it (SIGBUS), where the allocation fails with an error that says what to fix.
        A container's /dev/shm is 64 MiB unless the deployment gives it more; softmax 4096x4096 needs 768 MiB
        for one timing of three kernels."""
        path = str(self.dir / uuid.uuid4().hex)
        return path, self._extend(path, 0, max(1, nbytes), None)

    def _extend(self, path: str, start: int, size: int, piece) -> np.memmap:
        """File `path` (made where `start` is 0) allocated from byte `start` to `size`, mapped whole. With `piece`
        (grow's): allocated GROW_PIECE bytes at a time, then those new pages mapped in here by a write to each,
        each piece inside piece(), stopping between pieces where a request wants the arena (GrowthStopped). A full
        filesystem is SharedMemoryFull; on any failure the file is as it was (a new one gone, a grown one cut back
        to `start`)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not hasattr(os, "posix_fallocate"):   # not Linux: sparse, as before
                os.ftruncate(fd, size)
                return np.memmap(path, dtype=np.uint8, mode="r+", shape=(size,))
            step = GROW_PIECE if piece is not None else size - start
            mm = None
            try:
                for offset in range(start, size, step):
                    self._stop_if_wanted(piece)
                    with piece() if piece is not None else contextlib.nullcontext():
                        self._stop_if_wanted(piece)   # (again after piece()'s own wait, if any)
                        self._allocate(fd, offset, min(step, size - offset), size)
                mm = np.memmap(path, dtype=np.uint8, mode="r+", shape=(size,))
                for offset in range(start, size, GROW_PIECE) if piece is not None else ():
                    self._stop_if_wanted(piece)
                    with piece():  # a write to each new page maps it in now, not in a request's first writes
                        self._stop_if_wanted(piece)
                        mm[offset:min(offset + GROW_PIECE, size):PAGE] = 0
            except BaseException:
                mm = None   # unmapped before the file is cut back: no mapping reaches past its end
                if start:
                    os.ftruncate(fd, start)
                else:
                    os.unlink(path)
                raise
            return mm
        finally:
            os.close(fd)

    def _stop_if_wanted(self, piece) -> None:
        if piece is not None and self.wanting:
            raise GrowthStopped()

    def _allocate(self, fd: int, offset: int, length: int, size: int) -> None:
        """posix_fallocate of one range of file `fd`; a full filesystem is SharedMemoryFull."""
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            free = shutil.disk_usage(self.dir).free
            raise SharedMemoryFull(
                f"{self.dir.parent} has {free / 2**20:.0f} MiB free and a request's buffers need "
                f"{size / 2**20:.0f} MiB: give this process a larger shared-memory filesystem (Kubernetes: an "
                "emptyDir with medium: Memory mounted at /dev/shm, as deploy/k8s does for the verifier and the "
                "benchmarker; Docker: --shm-size)") from e

    def reserve(self, nbytes: int) -> None:
        self._arena = self._file(nbytes + self.ALIGN)
        self._used = 0

    def new(self, shape: tuple[int, ...], dtype: str) -> tuple[str, int, np.ndarray]:
        """(path, byte offset, array view) of a fresh array."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self._arena is not None and self._used + nbytes <= self._arena[1].size:
            path, mm = self._arena
            offset = self._used
            self._used = -(-(offset + nbytes) // self.ALIGN) * self.ALIGN
        else:
            (path, mm), offset = self._file(nbytes), 0
        arr = np.ndarray(shape, dtype=dtype, buffer=mm, offset=offset)
        self.arrays.append(arr)
        return path, offset, arr

    GUARD = 4096
    GUARD_BYTE = 0xA5

    def new_guarded(self, shape: tuple[int, ...], dtype: str) -> tuple[str, int, np.ndarray, list[np.ndarray]]:
        """Like new(), with GUARD bytes of a known pattern right before and right after the array, so a
        write out of bounds by a few elements is seen (intact_guards) instead of landing in padding."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        path, offset, raw = self.new((nbytes + 2 * self.GUARD,), "uint8")
        raw[: self.GUARD] = self.GUARD_BYTE
        raw[self.GUARD + nbytes:] = self.GUARD_BYTE
        arr = raw[self.GUARD: self.GUARD + nbytes].view(dtype).reshape(shape)
        return path, offset + self.GUARD, arr, [raw[: self.GUARD], raw[self.GUARD + nbytes:]]

    @classmethod
    def intact(cls, guards: list[np.ndarray]) -> bool:
        """True when no guard band written by new_guarded has changed."""
        return all(bool((g == cls.GUARD_BYTE).all()) for g in guards)

    def close(self) -> None:
        with stagetime.span("buffers"):  # unlinking a tmpfs file frees its pages: not free for large ones
            self.arrays.clear()
            self._arena = None
            shutil.rmtree(self.dir, ignore_errors=True)
            if self._owner >= 0:
                os.close(self._owner)
                self._owner = -1

    def __enter__(self) -> "ShmBuffers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def rewind(self, nbytes: int) -> None:
        """Make this arena ready for another request of `nbytes`: its file is kept when it is large enough (its
        pages are allocated, and a runner that keeps it mapped takes no page faults), else replaced by a larger
        one; any file made beside it is deleted. Arrays handed out before are written over from now on."""
        with stagetime.span("buffers"):
            self.arrays.clear()
            kept = self._arena if self._arena is not None and self._arena[1].size >= nbytes + self.ALIGN else None
            for f in self.dir.iterdir():
                if kept is None or str(f) != kept[0]:
                    f.unlink(missing_ok=True)
            if kept is None:
                # the old file is gone: if the new one does not fit (SharedMemoryFull) nothing may name it again
                self._arena, self._used = None, 0
                self.reserve(nbytes)
            self._used = 0

    def grow(self, nbytes: int, piece) -> bool:
        """Make this arena ready for a request of `nbytes` before one comes (ArenaRing.ready): where its file is
        smaller than rewind would keep, the same file grown in place (a new one where it has none), the new pages
        allocated and mapped in a piece at a time, each inside piece(); True when it grew. In place, because the
        runner child keeps its mapping of an arena's file until its next request: a new file beside it could not
        take the old one's pages, and fresh pages are dear in a VM (three 768 MiB arenas replaced at once took
        3.7-4.2 s each in a campaign, against 0.8 s in isolation). Arrays handed out before stay valid (the same
        pages, below the old size). GrowthStopped or SharedMemoryFull leave the arena as it was. The caller holds
        `busy`."""
        size = nbytes + self.ALIGN
        if self._arena is not None and self._arena[1].size >= size:
            return False
        with stagetime.span("buffers"):
            if self._arena is None:
                for f in self.dir.iterdir():   # (a file made beside an arena that did not fit)
                    f.unlink(missing_ok=True)
                path, start = str(self.dir / uuid.uuid4().hex), 0
            else:
                path, start = self._arena[0], self._arena[1].size
            self._arena = path, self._extend(path, start, size, piece)
        return True

    def path(self) -> str:
        """The arena's file ("" before reserve)."""
        return self._arena[0] if self._arena is not None else ""


def ring_bytes(mb: int) -> int:
    """The largest request a session's ring of arenas takes (ArenaRing's max_bytes): `mb` MiB, but never more
    than a twelfth of the shared-memory filesystem, so that one session's three arenas hold at most a quarter of
    it (a container's /dev/shm is what its deployment gives). A service keeps a session per problem for its life,
    and arenas are not given back before their session closes: a service judging several problems' large shapes
    holds a quarter for each, and a fresh request then finds less room (SharedMemoryFull says so)."""
    return min(mb << 20, shutil.disk_usage(shared_dir()).total // 12)


class ArenaRing:
    """Shared-memory arenas used in turn, request after request (issue 23: a fresh file per call cost more than
    the kernel). Each request takes the next arena (rewound: inputs written, outputs poisoned, guard bands set
    afresh by the caller), so consecutive requests never share a buffer and a runner that keeps every arena
    mapped (the command's "keep") sees consecutive calls at different addresses; the views a request handed
    out stay valid until the ring comes round to their arena again, `count` requests later. A request over
    `max_bytes` takes no arena (None): its caller uses fresh buffers, as the ring would hold that much for ever.
    """

    def __init__(self, max_bytes: int, count: int = 3, base: Path | None = None):
        """`base`: the directory the arenas' own directories go in (default as ShmBuffers')."""
        self.max_bytes, self.count, self.base = max_bytes, count, base
        self.arenas: list[ShmBuffers] = []
        self.turn = 0
        self._lock = threading.Lock()   # the arenas' list and the turn (ready runs in another thread than take)
        self._closed = False

    def take(self, nbytes: int) -> ShmBuffers | None:
        """The next arena, rewound for `nbytes` and held (its `busy`) until release(); None when `nbytes` is over
        max_bytes. Where ready() is growing that arena, the growth stops at its next piece, and rewind makes what
        this request needs."""
        if nbytes > self.max_bytes:
            return None
        with self._lock:
            if len(self.arenas) < self.count:
                self.arenas.append(ShmBuffers(self.base))
            arena = self.arenas[self.turn % self.count]
            self.turn += 1
            arena.wanting += 1   # a growth of this arena in progress stops at its next piece
        try:
            arena.busy.acquire()
        finally:
            with self._lock:
                arena.wanting -= 1
        try:
            arena.rewind(nbytes)
        except BaseException:
            arena.busy.release()
            raise
        return arena

    @staticmethod
    def release(arena: ShmBuffers) -> None:
        """The request that took `arena` is over (its views stay valid until the ring comes round to it)."""
        arena.busy.release()

    def ready(self, sizes: list[int], piece) -> int:
        """Grow every arena of the ring now for the largest request of `sizes` it takes (none over max_bytes),
        before that request (and the device lease it runs under) comes: a first timing of three softmax 4096x4096
        kernels otherwise allocated and faulted in three 768 MiB files under the lease, 2.9-3.8 s of a 15 s final
        comparison against 0.4 s once they were made. Each piece of the work inside piece()
        (kfactory.sandbox.shm.GROW_PIECE; the session's host work). An arena a request is using is left to grow
        when it is next taken, as before; a growth that a request comes to want stops at its next piece, and the
        request grows the arena itself; a full filesystem stops it all, for the request that needs the room to
        meet SharedMemoryFull itself, typed. The arenas grown."""
        fitting = [n for n in sizes if n <= self.max_bytes]
        if not fitting:
            return 0
        with self._lock:
            if self._closed:
                return 0
            while len(self.arenas) < self.count:
                self.arenas.append(ShmBuffers(self.base))
            arenas = list(self.arenas)
        grown = 0
        for arena in arenas:
            if arena.wanting or not arena.busy.acquire(blocking=False):
                continue
            try:
                grown += arena.grow(max(fitting), piece)
            except GrowthStopped:
                continue
            except SharedMemoryFull:
                return grown  # (see above: the request that needs the room says so, typed)
            except FileNotFoundError:
                if self._closed:  # the session closed meanwhile and took the arenas' directories with it
                    return grown
                raise
            finally:
                arena.busy.release()
        return grown

    def paths(self) -> list[str]:
        """Every arena's file: the runner keeps these mapped and lets go of any other it kept."""
        return [a.path() for a in self.arenas if a.path()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for a in self.arenas:
            a.close()
        self.arenas.clear()


@contextlib.contextmanager
def request_buffers(ring: ArenaRing | None, nbytes: int, reserve: bool):
    """(buffers for one runner request, the request's keep): the ring's next arena, with every arena of the ring
    named for the runner to keep mapped, or fresh buffers deleted after the request (no ring, or a request too
    large for one) and None; `reserve`: fresh buffers in one file rather than one per tensor."""
    arena = ring.take(nbytes) if ring is not None else None
    if ring is not None and arena is not None:
        try:
            yield arena, ring.paths()
        finally:
            ring.release(arena)
        return
    with ShmBuffers() as bufs:
        if reserve:
            bufs.reserve(nbytes)
        yield bufs, None
