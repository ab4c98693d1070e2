"""A Parquet file over S3: pyarrow reads each row group's column chunks with ranged GETs
(``pre_buffer`` coalesces them into few large requests)."""

from __future__ import annotations

import pyarrow.parquet as pq

from ...formats import parquet
from .base import RemoteReader

NAME = parquet.NAME
OPEN_OPTIONS = parquet.OPEN_OPTIONS


class RemoteParquetReader(RemoteReader, parquet.ParquetReader):
    def _parquet_file(self, *, checked: bool = True) -> pq.ParquetFile:
        return pq.ParquetFile(self.store.open_file(parquet.FILENAME),
                              page_checksum_verification=checked, pre_buffer=True)


def open(store, manifest: dict, **options) -> RemoteParquetReader:  # noqa: A001
    return RemoteParquetReader(store, manifest, **options)
