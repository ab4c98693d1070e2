"""storebench: how to store an image training set, and how to feed it to the accelerator.

The entry points, importable from here (loaded on first use, so ``import storebench`` stays
light): ``build_dataset`` (a synthetic spec in one format), ``import_images`` (your own
folder or listing in every format that fits), ``open_dataset`` (any built dataset, from its
manifest, on disk or at ``s3://``) and ``verify_dataset``. The loaders live in
``storebench.loaders``.
"""

from importlib import import_module

_ENTRY_POINTS = {
    "build_dataset": "storebench.formats",
    "open_dataset": "storebench.opening",
    "import_images": "storebench.importer",
    "verify_dataset": "storebench.verify",
}

__all__ = ["__version__", *_ENTRY_POINTS]


def __getattr__(name: str):
    # importlib.metadata costs every fresh process (each case's) tens of milliseconds.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("storebench")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    if name in _ENTRY_POINTS:
        return getattr(import_module(_ENTRY_POINTS[name]), name)
    raise AttributeError(f"module 'storebench' has no attribute {name!r}")
