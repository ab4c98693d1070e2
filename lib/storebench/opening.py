"""Opening a built dataset wherever it lies: on disk (``storebench.formats``) or in object
storage (``storebench.remote``). The ``s3://`` dispatch sits here, above both, so the formats
never import the remote layer."""

from __future__ import annotations

from pathlib import Path

from .formats import OBJECT_STORE_SCHEME, Reader
from .formats import open_dataset as open_local


def open_dataset(path: Path | str, **options) -> Reader:
    """Open any built dataset, checked as ``storebench.formats.open_dataset`` checks one on
    disk. An ``s3://bucket/prefix`` path opens a dataset uploaded there
    (``storebench.remote.dataset.open_remote``): the same checks over the network;
    ``s3=S3Config(...)`` says where the store is (default: the AWS environment variables)
    and ``concurrency`` how many requests stay in flight."""
    if str(path).startswith(OBJECT_STORE_SCHEME):
        from .remote.dataset import open_remote

        return open_remote(path, **options)
    return open_local(path, **options)
