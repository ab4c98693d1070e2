"""Peer libraries' own loader pipelines (the peers environment; Ray Data's lives in the main
one): see ``loaders.paths``.

One module per peer; each imports its library only inside its functions. The helpers here
are what several of them share.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...formats import DatasetError, read_manifest
from ...formats.base import has_encoding_magic
from ...formats.manifest import check_files
from ...formats.specs import Spec, fixed_size, spec_from_dict


def decode_image(data, decode: str | None, channels: int) -> np.ndarray | bytes:
    """One stored image decoded as ``decode`` says (``simplejpeg``, ``pil``, ``auto``; None:
    the stored bytes), as (H, W, C) uint8."""
    if decode is None:
        return bytes(data)
    if decode == "simplejpeg" or (decode == "auto" and has_encoding_magic("jpeg", data)):
        import simplejpeg

        image = simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == 1 else "RGB")
        return image.reshape(*image.shape[:2], -1)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        mode = "L" if channels == 1 else "RGB"
        image = np.asarray(img if img.mode == mode else img.convert(mode))
    return image.reshape(*image.shape[:2], -1)


# After torch's own join: how long a terminated worker gets to be reaped before a SIGKILL.
WORKER_REAP_TIMEOUT_S = 5.0


def shut_down_dataloader_workers(iterator) -> None:
    """Stop a torch DataLoader iterator's workers (what its ``__del__`` calls) and reap them;
    no-op for None or an iterator without workers.

    A worker told to exit sometimes dies on the way out (LitData's spawned workers abort
    now and then: "terminate called without an active exception"). torch's SIGCHLD handler
    would raise that death from inside the shutdown's joins: the workers not yet joined are
    then left unjoined, and a raise that lands between a ``waitpid`` and its bookkeeping
    leaves a reaped worker that multiprocessing counts as alive for good. So the workers
    leave torch's SIGCHLD watch before they are told to stop (the epoch being abandoned
    delivers nothing more), and each is joined after torch's shutdown, killed if it
    outlives ``WORKER_REAP_TIMEOUT_S``. A worker that dies while an epoch is read still
    raises from the loader's ``__next__``."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data._utils.signal_handling import _remove_worker_pids

        _remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False  # so that torch's shutdown does not remove them twice
    shutdown()
    for worker in getattr(iterator, "_workers", ()):
        worker.join(WORKER_REAP_TIMEOUT_S)
        if worker.exitcode is None:
            worker.kill()
            worker.join(WORKER_REAP_TIMEOUT_S)


def check_rank(root: Path, library: str, seen: tuple[int, int], options) -> None:
    """A peer library's own rank split must see this run's rank: ``seen`` is its (rank,
    world size), which it reads from the environment or ``torch.distributed``."""
    wanted = (int(options.rank), int(options.world_size))
    if tuple(int(x) for x in seen) != wanted:
        raise DatasetError(
            f"{root}: {library} sees rank {seen[0]} of {seen[1]} (from the environment or "
            f"torch.distributed), but this run is rank {wanted[0]} of {wanted[1]}: it would "
            "read another share of each epoch")


def open_peer_dataset(root: Path, format_name: str, *, what: str) -> tuple[dict, Spec]:
    """(manifest, spec) of the dataset at ``root``, refused unless it is ``format_name``
    (``what`` names its files in the message); its files' sizes and fingerprints are checked
    first, since the peers' own readers check little or nothing."""
    manifest = read_manifest(root)
    if manifest["format"] != format_name:
        raise DatasetError(f"{root}: the {format_name} loader reads {format_name!r} datasets "
                           f"({what}), this one is {manifest['format']!r}")
    check_files(root, manifest)
    return manifest, spec_from_dict(manifest["spec"])


def decoded_arrays(root: Path, spec: Spec, decode: str | None,
                   resize: tuple[int, int] | None, *, cropped: bool = False) -> bool:
    """Whether batches are arrays (raw pixels, or decoded images), refusing what cannot make
    one uint8 array per batch: an unknown decoder, decoding raw pixels, simplejpeg on
    another encoding, a resize or crop (``cropped``: the training crop) without decoding,
    images of several sizes without a resize or crop."""
    from ..datasets import DECODERS

    encoding = spec.encoding
    if decode is not None:
        if decode not in DECODERS:
            raise ValueError(f"decode must be None or one of {DECODERS}, got {decode!r}")
        if encoding == "raw":
            raise ValueError(f"{root}: samples are raw pixels, pass decode=None")
        if decode == "simplejpeg" and encoding != "jpeg":
            raise ValueError(f"{root}: simplejpeg decodes JPEG only, these samples are "
                             f"{encoding}; use decode='auto' or 'pil'")
    arrays = encoding == "raw" or decode is not None
    if (resize or cropped) and not arrays:
        raise ValueError(f"{root}: resizing or cropping needs decoded images; pass "
                         "decode='auto'")
    if arrays and not fixed_size(spec) and not (resize or cropped):
        raise ValueError(f"{root}: the images differ in size and a batch is one array; "
                         "pass resize=")
    return arrays


# ``PathOptions.transform`` "train": the standard training crop (scale and ratio as
# torchvision's RandomResizedCrop) and flip. DALI and FFCV apply their own crop ops with
# these parameters; the other peers apply storebench's seeded ``RandomResizedCropFlip``,
# resized with Pillow as torchvision's transforms resize.
TRAIN = "train"
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def training_crop(options):
    """The standard training crop and flip (``loaders.RandomResizedCropFlip``, seeded by
    ``options.seed``) for ``options.transform == "train"``; None without a transform. A peer
    whose library has no crop op of its own applies it in its map step: the same work, and
    the same pixels, as storebench's paths."""
    if options.transform is None:
        return None
    if options.transform != TRAIN:
        raise ValueError(f"unknown transform {options.transform!r}; known: {TRAIN!r}")
    from ..train_transform import RandomResizedCropFlip

    # Pillow resizes, as the torchvision transforms these peers' docs use do.
    return RandomResizedCropFlip(seed=int(options.seed), resampler="pillow")


@dataclass(frozen=True)
class EpochCrop:
    """``crop`` of one epoch as a picklable one-image map step: sample ``index``'s image of
    epoch ``epoch`` cropped as every storebench path crops it."""

    crop: object
    epoch: int

    def __call__(self, image: np.ndarray, index: int) -> np.ndarray:
        return self.crop(image, index=int(index), epoch=self.epoch)


def tracked_loader_class(base: type) -> type:
    """A subclass of a peer's DataLoader (LitData's, streaming's) that remembers the worker
    iterator of the running epoch, so that ``close()`` can stop an epoch left unfinished."""

    class TrackedLoader(base):
        live_iterator = None

        def _get_iterator(self):
            self.live_iterator = super()._get_iterator()
            return self.live_iterator

    TrackedLoader.__name__ = TrackedLoader.__qualname__ = f"Tracked{base.__name__}"
    return TrackedLoader
