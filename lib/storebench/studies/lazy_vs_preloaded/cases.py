"""The lazy_vs_preloaded study's case function: one loader epoch, shared with the other
loader studies (``shared_cases.loader_epoch_case``)."""

from ..shared_cases import loader_epoch_case

__all__ = ["loader_epoch_case"]
