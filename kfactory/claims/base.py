"""The claims interface: deduplication, fenced locks, device leases and a result cache.

A claims store is shared by every planner, agent and worker of a campaign. It answers
three questions:

* *Has anyone already scheduled this work?* ``claim_once`` is a first-caller-wins
  marker, so two planners never schedule the same design point twice.
* *Who is working on this right now?* ``acquire`` / ``renew`` / ``release`` implement
  an expiring lock. Every acquisition is issued a strictly increasing *fencing token*
  that callers write next to their results, so a late writer whose lock expired can be
  recognised and ignored (its fence is lower than ``latest_fence``).
* *Has this result been computed before?* ``cache_get`` / ``cache_put`` hold bytes.

``hold`` and ``device_lease`` combine the lock primitives into an async context manager
that waits for the lock, keeps it renewed while the body runs and releases it on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import AsyncContextManager, Self
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

#: Every key an implementation writes starts with this, so a shared Redis can be
#: inspected (and cleaned) without touching other applications' keys.
KEY_PREFIX = "kf:"


class ClaimsError(Exception):
    """Base class of every error raised by a claims store."""


class ClaimsUnavailable(ClaimsError):
    """The claims store cannot be reached (connection refused, timeout, bad password, closed).

    ``url`` is the store's URL with any password redacted; it is also in the message.
    """

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class LockTimeout(ClaimsError):
    """``hold`` gave up waiting for a lock that another holder kept for ``wait_s`` seconds."""

    def __init__(self, key: str, wait_s: float) -> None:
        super().__init__(f"lock {key!r} still held by another after waiting {wait_s:g} s")
        self.key = key
        self.wait_s = wait_s


@dataclass(frozen=True)
class Lock:
    """Proof of one acquisition of ``key``.

    ``token`` is unique to this acquisition (release and renew compare it), ``fence`` is
    the fencing token: strictly greater than every fence issued before for ``key``.
    """

    key: str
    token: str
    fence: int


@dataclass(frozen=True)
class HeldLock(Lock):
    """A ``Lock`` held by ``Claims.hold``, which renews it in the background.

    ``lock_lost`` is set when a renewal (or the final release) finds that the lock is no
    longer ours — it expired and may have been taken by another holder. Work done under a
    lost lock must not be trusted; long bodies can check ``lost`` between steps.
    """

    lock_lost: asyncio.Event = field(default_factory=asyncio.Event, compare=False, repr=False)

    @property
    def lost(self) -> bool:
        """True once the lock is known to have been lost."""
        return self.lock_lost.is_set()


@dataclass(frozen=True)
class KeySpace:
    """Maps a caller's plain key to the namespaced store key of each kind of record."""

    prefix: str = KEY_PREFIX

    def claim(self, key: str) -> str:
        """Key of the ``claim_once`` marker."""
        return f"{self.prefix}claim:{key}"

    def lock(self, key: str) -> str:
        """Key holding the current lock token."""
        return f"{self.prefix}lock:{key}"

    def fence(self, key: str) -> str:
        """Key of the fencing counter; it never expires so fences never go backwards."""
        return f"{self.prefix}fence:{key}"

    def cache(self, key: str) -> str:
        """Key of a cached result."""
        return f"{self.prefix}cache:{key}"


def device_key(device_id: str) -> str:
    """The lock key that serialises measurements on one physical device."""
    return f"device:{device_id}"


def check_ttl(ttl_s: float, name: str = "ttl_s") -> float:
    """Return ``ttl_s`` if it is a finite positive number of seconds, else raise ValueError."""
    if not (isinstance(ttl_s, (int, float)) and math.isfinite(ttl_s) and ttl_s > 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {ttl_s!r}")
    return float(ttl_s)


def check_value(value: bytes) -> bytes:
    """Return ``value`` as immutable bytes; cached values must be bytes-like."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"cache values must be bytes, got {type(value).__name__}")
    return bytes(value)


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` so it can go into messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class Claims(ABC):
    """A store of claims, locks and cached results shared by the processes of a campaign.

    Implementations: ``MemoryClaims`` (one process, many asyncio tasks) and
    ``RedisClaims`` (many processes and machines). Use ``open_claims(url)`` to pick one.
    A store is also an async context manager that closes it on exit.
    """

    #: Human-readable location of the store (password redacted), used in error messages.
    url: str

    @abstractmethod
    async def claim_once(self, key: str, ttl_s: float | None = None) -> bool:
        """Mark ``key`` as claimed; True only for the first caller.

        With ``ttl_s`` the mark expires and ``key`` can be claimed again afterwards
        (for work that must be redone if its claimant vanished).
        """

    @abstractmethod
    async def acquire(self, key: str, ttl_s: float) -> Lock | None:
        """Take the lock on ``key`` for ``ttl_s`` seconds, or return None if another holds it.

        Each successful acquisition gets a fence greater than every earlier one for ``key``.
        """

    @abstractmethod
    async def renew(self, lock: Lock, ttl_s: float) -> bool:
        """Extend ``lock`` to expire ``ttl_s`` seconds from now; False if it is no longer ours."""

    @abstractmethod
    async def release(self, lock: Lock) -> bool:
        """Delete ``lock`` if it is still ours (compare-and-delete); False otherwise."""

    @abstractmethod
    async def latest_fence(self, key: str) -> int:
        """The highest fence ever issued for ``key``; 0 if it was never acquired."""

    @abstractmethod
    async def cache_get(self, key: str) -> bytes | None:
        """The cached bytes for ``key``, or None if absent or expired."""

    @abstractmethod
    async def cache_put(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        """Store ``value`` under ``key``, replacing any previous value; optional expiry."""

    @abstractmethod
    async def ping(self) -> None:
        """Check the store answers; raise ClaimsUnavailable (naming the URL) if not."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections. Idempotent; later operations raise ClaimsUnavailable."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def hold(
        self, key: str, ttl_s: float, wait_s: float | None = None, poll_s: float = 0.05
    ) -> AsyncContextManager[HeldLock]:
        """Hold the lock on ``key`` for the duration of an ``async with`` block.

        Polls every ``poll_s`` until the lock is acquired; raises LockTimeout after
        ``wait_s`` seconds (None waits forever). While held, a background task renews
        the lock every ``ttl_s / 3`` so work may run longer than ``ttl_s``; if the lock
        is lost anyway, ``HeldLock.lock_lost`` is set instead of raising in the
        background. The lock is released on exit, also on error or cancellation.
        """
        check_ttl(ttl_s)
        check_ttl(poll_s, "poll_s")
        if wait_s is not None and not wait_s >= 0:
            raise ValueError(f"wait_s must be None or >= 0, got {wait_s!r}")
        return self._hold(key, ttl_s, wait_s, poll_s)

    def device_lease(
        self, device_id: str, ttl_s: float = 30.0, wait_s: float | None = None
    ) -> AsyncContextManager[HeldLock]:
        """Hold the lease on a physical device: one measurement at a time, across processes."""
        return self.hold(device_key(device_id), ttl_s, wait_s)

    @contextlib.asynccontextmanager
    async def _hold(
        self, key: str, ttl_s: float, wait_s: float | None, poll_s: float
    ) -> AsyncIterator[HeldLock]:
        lock = await self._wait_acquire(key, ttl_s, wait_s, poll_s)
        held = HeldLock(lock.key, lock.token, lock.fence)
        stop = asyncio.Event()
        renewer = asyncio.create_task(
            self._keep_renewed(held, ttl_s, stop), name=f"kf-claims-renew:{key}"
        )
        try:
            yield held
        finally:
            await _stop(renewer, stop)
            if not await self.release(held):
                # Expired between the last renewal and the end of the body.
                held.lock_lost.set()
            _raise_if_crashed(renewer)

    async def _wait_acquire(
        self, key: str, ttl_s: float, wait_s: float | None, poll_s: float
    ) -> Lock:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            lock = await self.acquire(key, ttl_s)
            if lock is not None:
                return lock
            if deadline is None:
                await asyncio.sleep(poll_s)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LockTimeout(key, wait_s if wait_s is not None else 0.0)
            await asyncio.sleep(min(poll_s, remaining))

    async def _keep_renewed(self, held: HeldLock, ttl_s: float, stop: asyncio.Event) -> None:
        """Renew ``held`` every ttl/3 until ``stop``; set ``lock_lost`` and return if it is lost."""
        # The lock is safe until `ttl_s` after the start of the last successful renewal,
        # so an outage shorter than that is retried rather than declared a loss.
        safe_since = time.monotonic()
        while True:
            await asyncio.sleep(ttl_s / 3)
            if stop.is_set():
                return
            started = time.monotonic()
            try:
                renewed = await self.renew(held, ttl_s)
            except ClaimsError as exc:
                if time.monotonic() - safe_since < ttl_s:
                    log.warning("renewal of lock %r failed, retrying: %s", held.key, exc)
                    continue
                log.error("lock %r lost: store unreachable for its whole TTL: %s", held.key, exc)
                held.lock_lost.set()
                return
            if not renewed:
                log.warning("lock %r (fence %d) lost: expired or taken", held.key, held.fence)
                held.lock_lost.set()
                return
            if stop.is_set():
                return
            safe_since = started


async def _stop(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    """End the renewal task and wait for it, without swallowing a cancellation of the caller."""
    # Cancellation alone is not enough: on Python 3.11, asyncio.wait_for (used inside
    # redis-py) can swallow a cancel that races with completion, and the renewer would
    # then keep the lock alive forever. The flag is checked after every renewal.
    stop.set()
    task.cancel()
    await asyncio.wait([task])


def _raise_if_crashed(task: asyncio.Task[None]) -> None:
    """Re-raise an unexpected error of the renewal task (a bug) instead of losing it."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        raise error
