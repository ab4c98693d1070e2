"""Import MosaicML Streaming (``streaming``) where torchvision cannot be imported.

``streaming/__init__.py`` imports its three dataset zoos: ``streaming.multimodal`` (WebVid),
``streaming.text`` (C4, EnWiki, Pile: imports ``transformers``, which works here) and
``streaming.vision`` (ADE20K, CIFAR-10, COCO, ImageNet wrappers), whose modules import
torchvision. The peers environment's torchvision is a CUDA build whose import fails
(``storebench.environments.UNAVAILABLE_HERE["torchvision"]``), so a plain ``import
streaming`` fails too, although nothing we use needs torchvision.

``import_streaming()`` puts a stand-in for ``streaming.vision`` in ``sys.modules`` before
importing ``streaming``, then returns the real package. Only that vision dataset zoo (the
CIFAR/ImageNet/COCO/ADE20K subclasses of ``StreamingDataset``) is replaced: ``MDSWriter``,
``StreamingDataset``, ``StreamingDataLoader``, the MDS reader, the shuffles and partitions
are streaming's own code, untouched. ``streaming.multimodal`` and ``streaming.text`` import
without torchvision and are left as they are.

The stand-in raises ``ImportError`` (saying why) on any attribute a caller asks of it, so
``streaming.vision.StreamingCIFAR10`` and ``from streaming.vision import StreamingImageNet``
fail loudly rather than oddly. Dunder lookups (``__file__``, ``__path__``, ...) are the
exception: they raise ``AttributeError`` as on any module, because ``inspect.getmodule`` and
``hasattr`` probe every entry of ``sys.modules`` with them and must not blow up; without a
``__path__``, ``import streaming.vision.cifar10`` fails as "'streaming.vision' is not a
package".
"""

from __future__ import annotations

import sys
import types

VISION = "streaming.vision"


def vision_unavailable_text() -> str:
    from .environments import UNAVAILABLE_HERE

    return (f"{VISION} (streaming's CIFAR/ImageNet/COCO/ADE20K dataset classes) needs "
            f"torchvision, which is unavailable here: {UNAVAILABLE_HERE['torchvision']}. "
            "storebench.streaming_import replaced it; the rest of streaming "
            "(MDSWriter, StreamingDataset, StreamingDataLoader) is the real package")


class UnavailableVisionModule(types.ModuleType):
    """Stands in for ``streaming.vision``: any public attribute is an ``ImportError``."""

    def __init__(self) -> None:
        super().__init__(VISION, vision_unavailable_text())

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {VISION!r} (a stand-in) has no attribute {name!r}")
        raise ImportError(f"cannot use {VISION}.{name}: {self.__doc__}", name=VISION)

    def __repr__(self) -> str:
        return f"<module {VISION!r} (stand-in: torchvision is unavailable)>"


def import_streaming() -> types.ModuleType:
    """The real ``streaming`` package, imported with ``streaming.vision`` replaced by an
    ``UnavailableVisionModule`` (see the module docstring). Idempotent; when ``streaming``
    is already imported (with or without the stand-in), it is returned as it is."""
    loaded = sys.modules.get("streaming")
    if loaded is not None and hasattr(loaded, "StreamingDataset"):
        return loaded
    sys.modules.setdefault(VISION, UnavailableVisionModule())
    import streaming

    return streaming
