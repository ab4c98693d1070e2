"""Resumable loaders: the state of a loader that reads ahead is what it has *delivered*.

A prefetcher or a DataLoader takes batches from a ``BatchSampler`` ahead of the training loop,
so the sampler's own position counts batches read ahead. ``Delivered`` counts instead the
samples the loader handed out in the sampler's current pass; the loader's state is the
sampler's state at that position (``BatchSampler.state_at``) and the dataset's (its size and
content digest, checked on load). Batches read ahead but not delivered when the state was taken
are delivered again after a resume: the training loop never saw them. See
``storebench.loaders.samplers`` for what a resume delivers, at the same or another world size.
"""

from __future__ import annotations


class Delivered:
    """The samples a loader has delivered in the current pass of its ``batches``."""

    def __init__(self, batches) -> None:
        self.batches = batches
        self._pass: int | None = None  # batches.passes when the last batch was delivered
        self._start = 0
        self._count = 0

    def add(self, count: int) -> None:
        """Count a batch of ``count`` samples handed to the training loop."""
        passes = self.batches.passes
        if passes != self._pass:  # the first batch of a new pass
            self._pass, self._start, self._count = passes, self.batches.pass_start, 0
        self._count += count

    def reset(self) -> None:
        self._pass = None

    def loader_state(self, dataset) -> dict:
        """The loader's state: the batches' at the delivered position (their own before any
        batch was delivered, or after a ``load``), and the dataset's."""
        if not getattr(self.batches, "resumable", False):
            raise TypeError(
                f"this loader cannot be resumed: its batches {self.batches!r} are not a "
                "storebench BatchSampler over a storebench sampler")
        if self._pass is None:
            state = self.batches.state_dict()
        else:
            state = self.batches.state_at(self._start + self._count)
        if dataset is not None and hasattr(dataset, "state_dict"):
            state["dataset"] = dataset.state_dict()
        return state

    def load(self, state: dict, dataset) -> None:
        """Check the state's dataset against ``dataset``, and make the next pass of the
        batches deliver the rest of the state's epoch."""
        state = dict(state)
        saved = state.pop("dataset", None)
        if saved is not None and dataset is not None and hasattr(dataset, "load_state_dict"):
            dataset.load_state_dict(saved)
        self.batches.load_state_dict(state)
        self.reset()
