"""A capacity model for reading a training set from object storage, on paper.

One rank runs ``W`` loader workers; each turns a batch of ``B`` samples into ``q`` GET
requests (``q = B / k``, ``k`` samples per request: 1 for an object per sample or a shuffled
batch of records, more where adjacent records coalesce), then decodes it. A reader keeps
``C`` requests in flight, shared by its workers, so a worker's batch waits for
``ceil(q / (C / W))`` rounds of one round trip each, while the other workers use the cores.
Measured at 0 ms, a worker needs ``t0 = W * B / rate0`` seconds a batch (reading, checking,
decoding, the server's and the proxy's share of the CPU included); at a round trip ``r``
and a per-rank bandwidth ``bw``:

    t(r) = t0 + ceil(q * W / C) * r + B * s / bw          (s: bytes a sample)
    rate(r) = min(rate0, W * B / t(r))                    per rank

The cap: latency can only slow a pipeline down, never lift it above what its CPU reached
at 0 ms. ``R`` ranks on one machine share its cores: the aggregate is measured at 0 ms for
each ``R``, and the same rule applies per rank.

Beyond one machine (``scale_out``): every node runs this pipeline on its own cores and link,
so ``N`` nodes read ``N * rate(r)``, until the store's aggregate bandwidth is the limit.
What this assumes: the store serves requests at a constant time regardless of load (true of
S3 up to its per-prefix request rates: thousands of GETs/s per prefix, more with more
prefixes), nodes do not share a link, and requests are independent (no retries, no tail
latency). Where these fail, measure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Pipeline:
    """What was measured at 0 ms for one path: its rate, workers, batch size, samples per
    request, requests in flight and bytes per sample."""

    rate0: float
    workers: int
    batch_size: int
    samples_per_request: float
    concurrency: int
    sample_bytes: float

    @property
    def requests_per_batch(self) -> float:
        return self.batch_size / self.samples_per_request


def predicted_rate(pipeline: Pipeline, rtt_s: float, *, bandwidth_Bps: float = math.inf,
                   workers: int | None = None, concurrency: int | None = None) -> float:
    """Samples/s one rank reaches at round trip ``rtt_s`` (see the module's formula).

    ``workers`` other than the measured count share the same cores: at 0 ms each then takes
    ``workers * B / rate0`` a batch, so more workers only add batches waiting on the
    network, which is what hides a distance. ``concurrency`` defaults to the measured
    requests in flight per worker, times the workers."""
    w = pipeline.workers if workers is None else workers
    c = (pipeline.concurrency * w / pipeline.workers if concurrency is None else concurrency)
    rounds = math.ceil(pipeline.requests_per_batch * w / c)
    seconds = (w * pipeline.batch_size / pipeline.rate0 + rounds * rtt_s
               + pipeline.batch_size * pipeline.sample_bytes / bandwidth_Bps)
    return min(pipeline.rate0, w * pipeline.batch_size / seconds)


def workers_to_keep(pipeline: Pipeline, rtt_s: float, fraction: float = 0.8,
                    most: int = 1024) -> int:
    """The fewest loader workers (batches in flight, each with the measured requests in
    flight per worker) that keep ``fraction`` of the 0 ms rate at ``rtt_s``; ``most`` + 1
    when even ``most`` do not."""
    for workers in range(1, most + 1):
        if predicted_rate(pipeline, rtt_s, workers=workers) >= fraction * pipeline.rate0:
            return workers
    return most + 1


def scale_out(pipeline: Pipeline, rtt_s: float, nodes: int, *,
              store_bandwidth_Bps: float = math.inf, node_bandwidth_Bps: float = math.inf
              ) -> float:
    """Aggregate samples/s of ``nodes`` nodes, each one rank of ``pipeline`` on its own
    link, capped by the store's aggregate bandwidth."""
    per_node = predicted_rate(pipeline, rtt_s, bandwidth_Bps=node_bandwidth_Bps)
    return min(nodes * per_node, store_bandwidth_Bps / pipeline.sample_bytes)
