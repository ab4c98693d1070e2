"""What a format declares about itself (``TRAITS`` in its module), so that studies, the
fuzzer, the remote layer and manifests read it from ``FORMATS`` instead of lists of names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SHUFFLE_UNITS = ("sample", "block")
# What a build knob changes, as the formats study's knob table reads it: (its column, what
# that column measures). A knob not declared is shown on warm sequential reads.
KNOB_EFFECTS = {
    "random_cold": "random batches, guest-cold",
    "sequential_cold": "a guest-cold sequential read",
    "sequential_warm": "sequential reads, warm",
    "size_ratio": "bytes on disk / raw bytes",
}


@dataclass(frozen=True)
class KnobVariant:
    """A build of ``format`` x ``encoding`` with ``knobs`` other than the format's defaults,
    stored beside the default build as ``<format>-<encoding>-<knob>=<value>``; built for the
    dataset families in ``families`` (``data_gen.FAMILIES``) only: a variant that answers
    nothing on a family's samples costs that family a whole copy of its set."""

    format: str
    encoding: str
    knobs: tuple[tuple[str, object], ...]
    families: tuple[str, ...] = ("synthetic", "imagenet")

    def __post_init__(self) -> None:
        from data_gen import FAMILIES

        unknown = set(self.families) - set(FAMILIES)
        if unknown or not self.families:
            raise ValueError(f"knob variant {self.name}: families must be among {FAMILIES}, "
                             f"got {self.families}")

    @property
    def name(self) -> str:
        knobs = ",".join(f"{k}={v}" for k, v in self.knobs)
        return f"{self.format}-{self.encoding}-{knobs}"


@dataclass(frozen=True)
class FormatTraits:
    """A format's traits; every field's default is what a plain format has.

    - ``knob_variants``: builds with other knobs that the studies sweep beside the default;
      ``knob_metrics``: per knob, the ``KNOB_EFFECTS`` column that shows its effect.
    - ``shuffle_unit``: ``"block"`` where a random sample costs its whole unit of I/O (a
      Parquet row group), so its shuffled order is a block shuffle; else ``"sample"``.
    - ``variant_access``: the access order its knob variants are read in out of core.
    - ``out_of_core_options``: open options that decide its reads out of core, each with the
      access order where it matters.
    - ``readahead_option``: the open option that turns its read-around on and off.
    - ``checks_content``: its reads check each sample's bytes on their own (a record CRC,
      a page checksum), so damaged content fails even with ``verify=False``.
    - ``remote_unsupported``: why it has no reader over object storage; empty where its
      module has ``open_remote(store, manifest, **options)``.
    - ``distributions``: the PyPI distributions whose versions its manifests record.
    """

    knob_variants: tuple[KnobVariant, ...] = ()
    knob_metrics: Mapping[str, str] = field(default_factory=dict)
    shuffle_unit: str = "sample"
    variant_access: str = ""
    out_of_core_options: tuple[tuple[Mapping[str, object], str], ...] = ()
    readahead_option: str = ""
    checks_content: bool = False
    remote_unsupported: str = ""
    distributions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.shuffle_unit not in SHUFFLE_UNITS:
            raise ValueError(f"shuffle_unit must be one of {SHUFFLE_UNITS}, "
                             f"got {self.shuffle_unit!r}")
        unknown = set(self.knob_metrics.values()) - set(KNOB_EFFECTS)
        if unknown:
            raise ValueError(f"knob metrics {sorted(unknown)} are not among {list(KNOB_EFFECTS)}")
        object.__setattr__(self, "knob_metrics", MappingProxyType(dict(self.knob_metrics)))
        object.__setattr__(self, "out_of_core_options", tuple(
            (MappingProxyType(dict(options)), access)
            for options, access in self.out_of_core_options))

    @property
    def block_only(self) -> bool:
        return self.shuffle_unit == "block"
