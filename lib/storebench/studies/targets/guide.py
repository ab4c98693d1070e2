"""The targets study's guide row: tf.data against our PyTorch paths over TFRecord shards."""

from __future__ import annotations

from ...plots import profile_caption
from ...results import Results, stat


def guide(results: Results) -> list:
    """TFRecord shards: tf.data's pipeline vs our PyTorch paths, paired in one case."""
    from ...guide import Candidate, choose

    rows = results.df[(results.df["study"] == "targets")
                      & (results.df["loader"] == "torch_vs_tf_data")]
    labels = {"tf_data_autotune": "tf.data AUTOTUNE (TensorFlow decodes)",
              "torch_thread_prefetcher": "ThreadPrefetcher \u00d72 (simplejpeg)",
              "torch_process_prefetcher": "ProcessPrefetcher \u00d72 (simplejpeg)",
              "torch_dataloader": "torch DataLoader \u00d72 (simplejpeg)"}
    # Every path the case measured is a candidate; the labels only say how to read them.
    paths = [m.removesuffix(".samples_per_s") for m in dict.fromkeys(rows["metric"])
             if m.endswith(".samples_per_s")]
    candidates = []
    for path in paths:
        try:
            candidates.append(Candidate(path, labels.get(path, path.replace("_", " ")),
                                        stat(rows, f"{path}.samples_per_s")))
        except LookupError:
            continue
    if not candidates:
        return []
    return [choose("targets", "JPEG in TFRecord shards, 2 workers: tf.data or a PyTorch path? "
                   f"({profile_caption(rows)})", "samples_per_s", candidates)]
