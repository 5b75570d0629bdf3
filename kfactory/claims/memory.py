"""In-process claims store: the default for single-process runs.

It mirrors the Redis layout (one table of namespaced keys with optional expiry times) so
that both implementations behave the same under the contract suite. Expiry uses a
monotonic clock, so wall-clock jumps never expire or resurrect a lock.

Every operation completes without awaiting, so it is atomic with respect to the other
asyncio tasks of the loop; a mutex additionally makes it safe to share between threads.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kfactory.claims.base import (
    KEY_PREFIX,
    Claims,
    ClaimsUnavailable,
    KeySpace,
    Lock,
    check_ttl,
    check_value,
)

#: Expired entries are dropped when read; a full sweep after this many writes bounds the
#: memory held by keys that are written once and never read again.
_SWEEP_EVERY = 1024


@dataclass
class _Entry:
    value: object
    expires_at: float | None


class MemoryClaims(Claims):
    """Claims held in a dict of this process. Not visible to other processes."""

    url = "memory://"

    def __init__(
        self, *, prefix: str = KEY_PREFIX, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``clock`` returns monotonic seconds; injectable so tests can control time."""
        self._keys = KeySpace(prefix)
        self._clock = clock
        self._data: dict[str, _Entry] = {}
        self._mutex = threading.Lock()
        self._writes = 0
        self._closed = False

    async def claim_once(self, key: str, ttl_s: float | None = None) -> bool:
        """Mark ``key`` as claimed; True only for the first caller (until the TTL runs out)."""
        expires_at = self._expiry(ttl_s)
        with self._mutex:
            self._check_open()
            name = self._keys.claim(key)
            if self._live(name) is not None:
                return False
            self._put(name, True, expires_at)
            return True

    async def acquire(self, key: str, ttl_s: float) -> Lock | None:
        """Take the lock on ``key`` with a fresh token and the next fence, or None if held."""
        expires_at = self._expiry(check_ttl(ttl_s))
        with self._mutex:
            self._check_open()
            name = self._keys.lock(key)
            if self._live(name) is not None:
                return None
            token = secrets.token_hex(16)
            self._put(name, token, expires_at)
            fence = self._next_fence(key)
            return Lock(key=key, token=token, fence=fence)

    async def renew(self, lock: Lock, ttl_s: float) -> bool:
        """Extend ``lock`` to ``ttl_s`` from now if it is still ours."""
        expires_at = self._expiry(check_ttl(ttl_s))
        with self._mutex:
            self._check_open()
            entry = self._live(self._keys.lock(lock.key))
            if entry is None or entry.value != lock.token:
                return False
            entry.expires_at = expires_at
            return True

    async def release(self, lock: Lock) -> bool:
        """Delete ``lock`` if it is still ours."""
        with self._mutex:
            self._check_open()
            name = self._keys.lock(lock.key)
            entry = self._live(name)
            if entry is None or entry.value != lock.token:
                return False
            del self._data[name]
            return True

    async def latest_fence(self, key: str) -> int:
        """Highest fence issued for ``key`` (0 if none)."""
        with self._mutex:
            self._check_open()
            entry = self._live(self._keys.fence(key))
            return 0 if entry is None else int(entry.value)  # type: ignore[call-overload]

    async def cache_get(self, key: str) -> bytes | None:
        """Cached bytes for ``key`` or None."""
        with self._mutex:
            self._check_open()
            entry = self._live(self._keys.cache(key))
            return None if entry is None else entry.value  # type: ignore[return-value]

    async def cache_put(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        """Store a copy of ``value`` (so later mutation of a bytearray cannot change it)."""
        data = check_value(value)
        expires_at = self._expiry(ttl_s)
        with self._mutex:
            self._check_open()
            self._put(self._keys.cache(key), data, expires_at)

    async def ping(self) -> None:
        """Raise ClaimsUnavailable if the store was closed."""
        with self._mutex:
            self._check_open()

    async def close(self) -> None:
        """Drop all state; later operations raise ClaimsUnavailable."""
        with self._mutex:
            self._closed = True
            self._data.clear()

    # Internal helpers; callers hold self._mutex.

    def _check_open(self) -> None:
        if self._closed:
            raise ClaimsUnavailable(f"claims store {self.url} is closed", url=self.url)

    def _expiry(self, ttl_s: float | None) -> float | None:
        return None if ttl_s is None else self._clock() + check_ttl(ttl_s)

    def _live(self, name: str) -> _Entry | None:
        entry = self._data.get(name)
        if entry is not None and _expired(entry, self._clock()):
            del self._data[name]
            return None
        return entry

    def _put(self, name: str, value: object, expires_at: float | None) -> None:
        self._data[name] = _Entry(value, expires_at)
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 0:
            self._sweep()

    def _sweep(self) -> None:
        now = self._clock()
        for name in [n for n, e in self._data.items() if _expired(e, now)]:
            del self._data[name]

    def _next_fence(self, key: str) -> int:
        name = self._keys.fence(key)
        entry = self._live(name)
        fence = 1 if entry is None else int(entry.value) + 1  # type: ignore[call-overload]
        self._put(name, fence, None)
        return fence


def _expired(entry: _Entry, now: float) -> bool:
    return entry.expires_at is not None and entry.expires_at <= now
