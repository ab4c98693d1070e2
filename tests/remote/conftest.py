"""One SeaweedFS S3 server for the remote tests, and the ci datasets uploaded to it."""

from __future__ import annotations

import pytest

from data_gen import PROFILES
from storebench.formats import build_dataset
from storebench.remote.dataset import upload_dataset
from storebench.remote.seaweed import SeaweedServer


@pytest.fixture(scope="session")
def seaweed():
    """(server, S3Config) of a real ``weed server -s3`` on loopback, for the session."""
    server = SeaweedServer()
    config = server.start()
    try:
        yield server, config
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3(seaweed):
    return seaweed[1]


@pytest.fixture(scope="session")
def uploaded(tmp_path_factory, s3):
    """``uploaded(format, encoding) -> (local path, s3 url)``: the ci dataset, built and
    uploaded to ``s3://ci-data/<format>-<encoding>`` on first use."""
    root = tmp_path_factory.mktemp("remote-ci")
    done = {}

    def get(format_name: str, encoding: str):
        key = (format_name, encoding)
        if key not in done:
            spec = PROFILES["ci"].spec_for(encoding)
            path = build_dataset(spec, format_name, root, workers=1).path
            url = f"s3://ci-data/{path.name}"
            upload_dataset(path, url, s3=s3)
            done[key] = (path, url)
        return done[key]

    return get
