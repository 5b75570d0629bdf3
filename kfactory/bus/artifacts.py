"""The artifact store: sources, PTX, cubins, shared objects, logs and large reports, keyed by their sha256, so
events carry a digest and never megabytes. `ObjectStoreArtifacts` keeps them in a JetStream object store bucket
(kfactory/bus/topology.py ARTIFACT_BUCKET); `MemoryArtifacts` in a dict of this process (the in-memory bus)."""
from __future__ import annotations

import nats.js.errors
from nats.js.api import StorageType

from kfactory.bus import events as ev
from kfactory.bus.errors import ArtifactMissing
from kfactory.bus.topology import ARTIFACT_BUCKET


class ObjectStoreArtifacts:
    """Artifacts in the JetStream object store bucket."""

    def __init__(self, store):
        self._store = store

    @classmethod
    async def open(cls, js, replicas: int = 1) -> ObjectStoreArtifacts:
        """The bucket, created where missing (with `replicas` copies: 3 on a 3-server cluster)."""
        try:
            return cls(await js.object_store(ARTIFACT_BUCKET))
        except nats.js.errors.BucketNotFoundError:
            return cls(await js.create_object_store(ARTIFACT_BUCKET, storage=StorageType.FILE, replicas=replicas))

    async def put(self, data: bytes) -> str:
        """Store bytes under their sha256; storing the same bytes twice is a no-op."""
        digest = ev.sha256_hex(data)
        try:
            await self._store.get_info(digest)
        except nats.js.errors.ObjectNotFoundError:
            await self._store.put(digest, data)
        return digest

    async def get(self, digest: str) -> bytes:
        """Fetch an artifact by digest; raises ArtifactMissing."""
        try:
            res = await self._store.get(digest)
        except nats.js.errors.ObjectNotFoundError as e:
            raise ArtifactMissing(digest) from e
        return res.data


class MemoryArtifacts:
    """Artifacts in a dict: shared by the buses of one in-memory broker, gone with the process."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    async def put(self, data: bytes) -> str:
        """Store bytes under their sha256; storing the same bytes twice is a no-op."""
        digest = ev.sha256_hex(data)
        self._blobs.setdefault(digest, bytes(data))
        return digest

    async def get(self, digest: str) -> bytes:
        """Fetch an artifact by digest; raises ArtifactMissing."""
        try:
            return self._blobs[digest]
        except KeyError as e:
            raise ArtifactMissing(digest) from e
