"""Figures regenerate from a saved results file alone, with stable format order and colour."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from storebench import plots
from storebench.bench.schema import make_row, validate
from storebench.formats import FORMATS


@pytest.mark.timeout(180)
def test_plot_all_regenerates_every_figure_from_the_files(formats_results, tmp_path):
    # Only the CSV and env.json travel: nothing else is needed to redraw.
    for name in ("formats.csv", "env.json"):
        shutil.copy(formats_results / name, tmp_path / name)
    written = plots.plot_all(tmp_path)
    expected = {f"{name}{suffix}" for name, _ in plots.FIGURES["formats"]
                for suffix in (".png", ".svg")}
    assert {p.name for p in written} == expected
    for path in written:
        assert path.parent == tmp_path / "figures"
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        else:
            assert ET.parse(path).getroot().tag.endswith("svg")


def test_plot_all_needs_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results"):
        plots.plot_all(tmp_path)


def synthetic_rows(formats, repeats=3):
    """Rows for a sequential-read grid whose values are a known function of format and
    repeat, so that the drawn medians and spreads can be checked exactly."""
    rows = []
    for f, fmt in enumerate(formats):
        for cache in ("cold", "warm"):
            for repeat in range(repeats):
                rows.append(make_row(
                    run_id="r", study="formats", case_id=f"{fmt}-raw/{cache}", format=fmt,
                    encoding="raw", loader="reader", access="sequential", cache=cache,
                    resident_fraction=0.0 if cache == "cold" else 1.0, repeat=repeat,
                    metric="file_MBps", value=100.0 * (f + 1) + 10 * repeat, unit="MB/s",
                    status="ok",
                ))
    return validate(pd.DataFrame(rows))


def test_formats_appear_in_registry_order_whatever_the_data_order():
    registry = list(FORMATS)
    df = synthetic_rows(list(reversed(registry)))
    fig = plots.plot_sequential_read(df, limits={"cold_seq_read_GBps": 2.0,
                                                 "page_cache_read_GBps": 10.0})
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == registry
    limit_lines = sorted(line.get_ydata()[0] for line in ax.get_lines()
                         if line.get_label().endswith("limit"))
    assert limit_lines == [2000.0, 10000.0]


def test_medians_and_spread_come_from_the_repeats():
    df = synthetic_rows(["memmap"], repeats=3)
    summary = plots.summarise(df, "file_MBps", ["format", "cache"])
    assert summary["median"].tolist() == [110.0, 110.0]
    assert summary["low"].tolist() == [100.0, 100.0]
    assert summary["high"].tolist() == [120.0, 120.0]
    failed = df.copy()
    failed.loc[0, "status"], failed.loc[0, "error"] = "failed", "x"
    assert plots.summarise(failed, "file_MBps", ["cache"])["count"].tolist() == [2, 3]


def test_colour_of_a_format_does_not_depend_on_what_else_is_plotted():
    registry = list(FORMATS)
    alone = plots.format_colours([registry[-1]])
    together = plots.format_colours(registry + ["newformat"])
    assert alone[registry[-1]] == together[registry[-1]]
    assert len(set(together.values())) == len(together)


def test_figure_functions_are_pure_and_handle_empty_input(formats_results):
    from storebench.bench.schema import read_results

    df = read_results(formats_results / "formats.csv")
    before = df.copy()
    for draw in (plots.plot_build_cost, plots.plot_sequential_read,
                 plots.plot_resident_fraction, plots.plot_peak_memory, plots.plot_knobs,
                 plots.plot_access_orders, plots.plot_readahead, plots.plot_prefetch_paths,
                 plots.plot_prefetch_scaling, plots.plot_decoders, plots.plot_target_ratios,
                 plots.plot_targets, plots.plot_feed):
        assert isinstance(draw(df), Figure)
        assert isinstance(draw(df.iloc[0:0]), Figure)
    pd.testing.assert_frame_equal(df, before)
    lines = plots.plot_metric_lines(df[df["loader"] == "reader"], metric="samples_per_s",
                                    x="repeat", series="cache")
    assert {t.get_text() for t in lines.axes[0].get_legend().get_texts()} == {"cold", "warm"}
    env = json.loads((formats_results / "env.json").read_text())
    assert np.isfinite(env["limits"]["cold_seq_read_GBps"])


def test_target_figure_draws_each_value_against_its_threshold_from_the_rows():
    rows = []
    for key, value, threshold in (("process_vs_torch", 2.0, 1.0),
                                  ("block_vs_random_parquet", 50.0, 200.0)):
        for metric, v, unit, repeat in (("target_ratio", value, "ratio", 0),
                                        ("target_value", value, "ratio", -1),
                                        ("target_threshold", threshold, "ratio", -1),
                                        ("target_met", float(value >= threshold), "count", -1)):
            rows.append(make_row(run_id="r", study="targets", case_id=key, loader=key,
                                 repeat=repeat, metric=metric, value=v, unit=unit,
                                 status="ok"))
    fig = plots.plot_target_ratios(validate(pd.DataFrame(rows)))
    ax = fig.axes[0]
    bars = {label.get_text(): patch for label, patch in zip(ax.get_yticklabels(), ax.patches,
                                                            strict=True)}
    assert bars["process_vs_torch"].get_width() == 2.0
    assert bars["process_vs_torch"].get_facecolor()[:3] == pytest.approx((0.173, 0.627, 0.173),
                                                                         abs=0.01)
    assert bars["block_vs_random_parquet"].get_facecolor()[:3] == pytest.approx(
        (0.839, 0.153, 0.157), abs=0.01)
    thresholds = sorted(line.get_xdata()[0] for line in ax.lines
                        if len(line.get_xdata()) == 2 and line.get_linewidth() == 2)
    assert thresholds == [1.0, 200.0]
