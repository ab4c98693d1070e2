"""What a recipe is: a whole training input pipeline, declared as data.

A recipe names the stored layout (a format of ``storebench.formats``), the reader, the
decoder, the training transform (``TransformTraits``: its resize filter, and whether it
decodes the whole image or only the crop window), the loader (a path of
``storebench.loaders.paths``, whose label, family, environment and libraries it reads rather
than retypes), the parallelism and tuning its library's docs advise, the output the training
loop receives, the situations it can serve, the doc it follows and the code a user copies.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field

# The situations a recipe may serve: the set in the page cache, a set larger than the RAM
# read from local disk, and a set in object storage.
IN_RAM = "in RAM"
OUT_OF_CORE = "larger than RAM"
OBJECT_STORAGE = "object storage"
SITUATIONS = (IN_RAM, OUT_OF_CORE, OBJECT_STORAGE)

# The training transform every recipe applies: a random resized crop to 224 (scale
# 0.08-1, ratio 3/4-4/3) and a horizontal flip. Speed is compared within one filter class,
# or with the filter shown beside the ratio.
TRANSFORM = "random resized crop to 224 (scale 0.08-1, ratio 3/4-4/3), horizontal flip"
FILTERS = {
    "antialiased": "bilinear with antialiasing (Pillow's, FFCV's INTER_AREA, DALI's default)",
    "plain": "bilinear without antialiasing (tf.image.resize(antialias=False))",
}
WINDOWS = ("whole image", "crop window")


# Who resizes where storebench's RandomResizedCropFlip crops: its own C resize, or Pillow
# (as torchvision's transforms do).
RESAMPLERS = ("storebench", "pillow")


@dataclass(frozen=True)
class TransformTraits:
    """How a recipe applies ``TRANSFORM``: its resize ``filter`` (a ``FILTERS`` key), what
    it decodes (``window``: the whole image, or only the crop window), by what code, and,
    where storebench's ``RandomResizedCropFlip`` crops for it, which ``resampler``."""

    filter: str
    window: str
    by: str
    resampler: str = "storebench"

    def __post_init__(self) -> None:
        if self.filter not in FILTERS:
            raise ValueError(f"transform filter must be one of {sorted(FILTERS)}, got "
                             f"{self.filter!r}")
        if self.window not in WINDOWS:
            raise ValueError(f"transform window must be one of {WINDOWS}, got {self.window!r}")
        if self.resampler not in RESAMPLERS:
            raise ValueError(f"transform resampler must be one of {RESAMPLERS}, got "
                             f"{self.resampler!r}")


@dataclass(frozen=True)
class Tuning:
    """One knob set as the library's docs advise: its value and the advice."""

    knob: str
    value: str
    advice: str


@dataclass(frozen=True)
class Recipe:
    """One training input pipeline. ``loader`` is a ``LOADER_PATHS`` name; ``layout`` a
    format name, ``encoding`` its samples'. ``cannot`` maps each situation the recipe cannot
    serve to what it lacks. ``code`` is what a user copies, with ``{dataset}`` where the
    dataset's directory goes; where it is empty, it is the loader path's as storebench runs
    it (``path_code``), from ``decode`` (what storebench's dataset decodes with, None for
    raw pixels) and ``start_method``. Object storage, where ``cannot`` does not say, is as
    far as the layout's reader goes (``FormatTraits.remote_unsupported``): a library that
    streams from S3 itself is not run there by storebench, so it is not a measured answer
    there."""

    name: str
    layout: str
    encoding: str
    reader: str
    decoder: str
    transform: TransformTraits
    loader: str
    parallelism: str
    output: str
    doc: str
    code: str = ""
    decode: str | None = "simplejpeg"
    start_method: str | None = None
    tuning: tuple[Tuning, ...] = ()
    cannot: Mapping[str, str] = field(default_factory=dict)
    # Distributions beyond the loader path's libraries and the format's (Pillow, say).
    distributions: tuple[str, ...] = ()
    # What a reader should know of the label: a library with no loader of its own.
    note: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.cannot) - set(SITUATIONS)
        if unknown:
            raise ValueError(f"recipe {self.name}: unknown situations {sorted(unknown)}; "
                             f"known: {SITUATIONS}")
        if self.code and "{dataset}" not in self.code:
            raise ValueError(f"recipe {self.name}: its code must name {{dataset}}")

    @property
    def path(self):
        from ..loaders.paths import LOADER_PATHS

        return LOADER_PATHS[self.loader]

    @property
    def label(self) -> str:
        """``"ThreadPrefetcher over lmdb-jpeg"``: the loader path's label and the layout."""
        return f"{self.path.label} over {self.layout}-{self.encoding}"

    @property
    def environment(self) -> str:
        """The environment whose interpreter runs it (``storebench.environments``): the
        loader path's, or the peers' where its layout is a peer format."""
        from ..formats import FORMATS

        if self.path.environment:
            return self.path.environment
        return "peers" if getattr(FORMATS[self.layout], "PEER", False) else "main"

    def why_not(self, situation: str) -> str:
        """Why the recipe cannot serve ``situation``; "" where it can."""
        if situation not in SITUATIONS:
            raise ValueError(f"unknown situation {situation!r}; known: {SITUATIONS}")
        if situation in self.cannot:
            return self.cannot[situation]
        if situation == OBJECT_STORAGE:
            from ..formats import FORMATS

            return FORMATS[self.layout].TRAITS.remote_unsupported
        return ""

    def serves(self, situation: str) -> bool:
        return not self.why_not(situation)

    def unavailable(self) -> str | None:
        """Why this interpreter cannot run the recipe (a library of its loader path or of
        its layout missing, or a system library), or None."""
        import importlib.util

        from ..formats import unavailable_reason

        for module in self.path.libraries:
            try:
                found = importlib.util.find_spec(module)
            except ModuleNotFoundError:
                found = None
            if found is None:
                return f"recipe {self.name}: no module {module!r} in this environment"
        return unavailable_reason(self.layout) or self.path.unavailable()

    def distribution_names(self) -> tuple[str, ...]:
        """The distributions whose versions the recipe's results depend on."""
        from ..formats import FORMATS

        format_dists = FORMATS[self.layout].TRAITS.distributions
        libraries = tuple(DISTRIBUTIONS.get(m, m) for m in self.path.libraries)
        return tuple(dict.fromkeys((*libraries, *format_dists, *self.distributions)))

    def versions(self) -> dict[str, str]:
        """Each distribution's installed version in this interpreter, or "not installed"."""
        found = {}
        for name in self.distribution_names():
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = "not installed"
        return found

    def snippet(self, dataset: str) -> str:
        code = self.code or path_code(self.loader, reads_files=self.path.reads_dataset_files,
                                      decode=self.decode, start_method=self.start_method)
        return code.replace("{dataset}", dataset)

    def open(self, root: str, *, batch_size: int, workers: int, seed: int = 0,
             rank: int = 0, world_size: int = 1) -> RecipeRun:
        """The recipe's pipeline over the dataset at ``root`` with the training transform,
        as storebench measures it (its loader path, its decoder); as rank ``rank`` of
        ``world_size``, its share of each epoch (split by storebench's sampler, or by the
        peer library's own mechanism where it reads its own files)."""
        from ..loaders.paths import PathOptions

        options = PathOptions(batch_size=batch_size, workers=workers, seed=seed, root=root,
                              decode=self.decode, transform="train",
                              start_method=self.start_method, rank=rank,
                              world_size=world_size)
        if self.path.reads_dataset_files:
            return RecipeRun(*self.path.open(None, None, options))
        from ..formats import open_dataset
        from ..loaders import LazyDataset, RandomResizedCropFlip, ShuffleSampler

        crop = RandomResizedCropFlip(seed=seed, filter=self.transform.filter,
                                     resampler=self.transform.resampler)
        dataset = LazyDataset(open_dataset(root), decode=self.decode, transform=crop,
                              output_shape=(224, 224, 3))
        sampler = ShuffleSampler(len(dataset), seed=seed, rank=rank, world_size=world_size)
        try:
            batches, stop = self.path.open(dataset, sampler, options)
        except BaseException:
            dataset.close()
            raise
        return RecipeRun(batches, stop, sampler, dataset)


@dataclass
class RecipeRun:
    """An open recipe: ``epoch(n)`` is epoch ``n``'s batches (a path over storebench's
    reader is told the epoch through its sampler, which its workers' crops follow; a path
    that reads its own files starts the next epoch on each pass); ``close()`` stops its
    workers, then closes the dataset it opened (an LMDB environment may be open once per
    process: a second run over the same set needs the first one's closed)."""

    batches: object
    stop: object = None
    sampler: object = None
    dataset: object = None

    def epoch(self, number: int):
        if self.sampler is not None:
            self.sampler.set_epoch(number)
        return self.batches

    def close(self) -> None:
        try:
            if self.stop is not None:
                self.stop()
        finally:
            if self.dataset is not None:
                self.dataset.close()
                self.dataset = None

    def __enter__(self) -> RecipeRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Module a loader path imports -> the distribution that installs it.
DISTRIBUTIONS = {"nvidia.dali": "nvidia-dali-cuda120", "spdl.pipeline": "spdl",
                 "spdl.io": "spdl", "streaming": "mosaicml-streaming"}


def path_code(loader: str, *, reads_files: bool, decode: str | None = "simplejpeg",
              workers: str = "os.cpu_count()", start_method: str | None = None) -> str:
    """The code that runs loader path ``loader`` as storebench measures it (its library's
    calls, tuned as its docs advise, are in the path's module), for a recipe of a peer
    library: over the dataset's own files (``reads_files``), or over storebench's reader of
    the dataset. ``workers``: the expression for its workers; ``start_method``: its workers'
    where the path's default does not do (Lance is not fork-safe). The code sits in a
    function behind a main guard, as spawned workers need."""
    decoder = "None" if decode is None else f'"{decode}"'
    method = "" if start_method is None else f', start_method="{start_method}"'
    options = ("PathOptions(\n"
               f"        batch_size=64, workers={workers}, seed=0, root=\"{{dataset}}\",\n"
               f"        decode={decoder}, transform=\"train\"{method}))\n")
    if reads_files:
        imports = ("import os\n\nfrom storebench.loaders.paths import LOADER_PATHS, "
                   "PathOptions\n")
        body = f"    batches, close = LOADER_PATHS[\"{loader}\"].open(None, None, {options}"
        epoch = ""
    else:
        imports = ("import os\n\nfrom storebench import open_dataset\n"
                   "from storebench.loaders import LazyDataset, RandomResizedCropFlip, "
                   "ShuffleSampler\n"
                   "from storebench.loaders.paths import LOADER_PATHS, PathOptions\n")
        body = ("    reader = open_dataset(\"{dataset}\")\n"
                f"    dataset = LazyDataset(reader, decode={decoder}, "
                "transform=RandomResizedCropFlip(),\n"
                "                          output_shape=(224, 224, 3))\n"
                "    sampler = ShuffleSampler(len(dataset), seed=0)\n"
                f"    batches, close = LOADER_PATHS[\"{loader}\"].open(dataset, sampler, "
                f"{options}")
        epoch = ("            sampler.set_epoch(epoch)\n"
                 "            dataset.set_epoch(epoch)  # fresh crops each epoch\n")
    return (imports + "\n\ndef train():\n" + body
            + "    try:\n"
            "        for epoch in range(1):\n" + epoch
            + "            for batch in batches:\n"
            "                images, labels = batch.images, batch.labels  # your step\n"
            "    finally:\n"
            "        if close is not None:\n"
            "            close()\n"
            "\n\n"
            "if __name__ == \"__main__\":  # spawned workers import this module again\n"
            "    train()\n")
