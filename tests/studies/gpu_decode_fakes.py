"""A fake ``Device`` for the gpu_decode tests: it records every call, and its decoders give
what our CPU decode gives (``decode_crop_reference``), or that shifted by ``offset`` grey
levels on the "device" side, so the case logic runs and is checked without a GPU."""

from __future__ import annotations

import numpy as np

from storebench.loaders.device import decode_crop_reference


class FakeDecoder:
    def __init__(self, device: FakeDevice, library: str, on_cpu: bool) -> None:
        self.device, self.library, self.on_cpu = device, library, on_cpu

    def run(self, encoded, plan):
        self.device.calls.append(("run", self.library, self.on_cpu, len(encoded)))
        out = decode_crop_reference(encoded, plan)
        if not self.on_cpu and self.device.offset:
            out = np.clip(out.astype(np.int16) + self.device.offset, 0, 255).astype(np.uint8)
        return out

    def to_host(self, batch) -> np.ndarray:
        self.device.calls.append(("to_host", self.library, self.on_cpu))
        return batch

    def close(self) -> None:
        self.device.calls.append(("close_decoder", self.library, self.on_cpu))


class FakeDevice:
    """Records ``calls``; ``offset``: what the device side adds to every pixel."""

    name = "fake device"
    feed_device = "cpu"

    def __init__(self, *, offset: int = 0) -> None:
        self.calls: list[tuple] = []
        self.offset = offset
        self.steps_run: list[int] = []

    def open_decoder(self, library, *, batch_size, hw_decoder_load=None, on_cpu=False,
                     threads=4):
        self.calls.append(("open_decoder", library, batch_size, hw_decoder_load, on_cpu))
        return FakeDecoder(self, library, on_cpu)

    def model_steps(self, *, batch_size):
        self.calls.append(("model_steps", batch_size))

        def steps(n: int) -> None:
            self.calls.append(("steps", n))

        return steps

    def synchronize(self) -> None:
        self.calls.append(("synchronize",))

    def reset_memory_peak(self) -> None:
        self.calls.append(("reset_memory_peak",))

    def memory(self) -> dict[str, int]:
        self.calls.append(("memory",))
        return {"torch_peak_bytes": 1 << 20, "device_used_bytes": 3 << 30}

    def close(self) -> None:
        self.calls.append(("close",))


def fake_device() -> FakeDevice:
    """A case's ``device_factory`` (``"gpu_decode_fakes:fake_device"``) in a worker."""
    return FakeDevice()
