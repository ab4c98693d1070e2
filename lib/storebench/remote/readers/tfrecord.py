"""TFRecord shards over S3: the offset index turns every batch into ranged GETs, runs of
adjacent records coalesced into one request (a block-shuffled batch is one or two), all of a
batch's requests in flight at once."""

from __future__ import annotations

from ...formats import tfrecord
from .base import RemoteObject, RemoteReader

NAME = tfrecord.NAME
OPEN_OPTIONS = tfrecord.OPEN_OPTIONS


class RemoteTFRecordReader(RemoteReader, tfrecord.TFRecordReader):
    def _open_shards(self) -> list[RemoteObject]:
        names = [path.name for path in self.shards]
        return [RemoteObject(name, size)
                for name, size in zip(names, self.store.sizes_of(names))]

    def _shard_size(self, files: list[RemoteObject], shard: int) -> int:
        return files[shard].size

    def _read_index_files(self, paths) -> list[bytes]:
        return self.store.read_many([path.name for path in paths])

    def _read_at(self, shard: int, offset: int, length: int) -> bytes:
        return self.store.read_range(self.shards[shard].name, offset, length)

    def _fetch_runs(self, runs) -> list[bytes]:
        return self.store.read_ranges(
            [(self.shards[shard].name, offset, length) for shard, offset, length, _ in runs]
        )


def open(store, manifest: dict, **options) -> RemoteTFRecordReader:  # noqa: A001
    return RemoteTFRecordReader(store, manifest, **options)
