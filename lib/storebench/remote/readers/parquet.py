"""A Parquet file over S3: pyarrow reads each row group's column chunks with ranged GETs
(``pre_buffer`` coalesces them into few large requests).

Locally, row-group reads take turns on one ``ParquetFile`` (it is not safe to read from two
threads at once). Over a network that would serialise the round trips too, so here each
thread reads through its own ``ParquetFile`` with its own one-group cache: two prefetch
threads keep two row groups in flight.
"""

from __future__ import annotations

import threading

import pyarrow.parquet as pq

from ...formats import parquet
from .base import RemoteReader

NAME = parquet.NAME
OPEN_OPTIONS = parquet.OPEN_OPTIONS


class RemoteParquetReader(RemoteReader, parquet.ParquetReader):
    def _parquet_file(self, *, checked: bool = True) -> pq.ParquetFile:
        return pq.ParquetFile(self.store.open_file(parquet.FILENAME),
                              page_checksum_verification=checked, pre_buffer=True)

    def _open(self) -> None:
        super()._open()
        self._h_threads = threading.local()

    def _close(self) -> None:
        self._h_threads = None
        super()._close()

    def _row_group(self, group: int) -> parquet._RowGroup:
        mine = self._h_threads
        cached = getattr(mine, "cached", None)
        if cached is not None and cached.group == group:
            return cached
        if not hasattr(mine, "file"):
            mine.file = self._parquet_file()
        first, stop = int(self._h_bounds[group]), int(self._h_bounds[group + 1])
        try:
            rows = self._load(mine.file, group, stop - first)
        except parquet._OPEN_ERRORS as err:
            rows = self._salvage(group, first, stop, err)
        mine.cached = rows
        return rows


def open(store, manifest: dict, **options) -> RemoteParquetReader:  # noqa: A001
    return RemoteParquetReader(store, manifest, **options)
