"""The README's answer table: each row is ``storebench advise`` for its situation over the
committed reference rows, read through the same query; at most eight rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from storebench.report import advise as adv
from storebench.report import answer
from storebench.results import Results
from storebench.text import ENCODING_NAMES

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


@pytest.fixture(scope="module")
def reference() -> Results:
    return Results.load(REFERENCE)


def choice(**changes) -> adv.Choice:
    fields = {"study": "prefetch", "question": "q", "key": "a", "label": "A", "median": 2.0,
              "unit": "samples/s", "tied": (), "undecided": False, "runner_up": "B"}
    return adv.Choice(**{**fields, **changes})


def test_a_choice_in_a_cell_collapses_equivalents_and_names_an_undecided_pair():
    assert answer.short_choice(choice()) == "A"
    assert answer.sureness(choice()) == "better"
    assert answer.short_choice(choice(tied=("B", "C"))) == "any of A, B, C"
    assert answer.sureness(choice(tied=("B",))) == "equivalent within 5%"
    assert answer.short_choice(choice(undecided=True)) == "A or B"
    assert answer.sureness(choice(undecided=True)) == "undecided"


def test_each_row_is_what_advise_answers_for_its_situation(reference):
    table = answer.answer_rows(reference)
    assert len(table) == len(answer.ANSWER_SITUATIONS) <= answer.MAX_ANSWER_ROWS
    measured = set(reference.df["encoding"].dropna())
    for row, (_, shown) in zip(answer.ANSWER_SITUATIONS, table.iterrows(), strict=True):
        assert shown["your situation"] == row.text
        if row.images not in measured:
            kinds = ", ".join(name for e, name in ENCODING_NAMES.items() if e in measured)
            assert shown["store as"] == (f"not measured: no study of these results read "
                                         f"{ENCODING_NAMES[row.images]} (they read {kinds})")
            assert shown["load with"] == shown["how sure"] == ""
            continue
        advice = adv.advise(answer.situation_for(row, reference), reference)
        assert shown["store as"] == answer.short_choice(advice.store)
        assert shown["load with"].startswith(answer.short_choice(advice.loader))
        assert shown["load with"].endswith(f", {advice.parallelism_text}")
        if row.storage == "local" and row.ram_ratio <= answer.FIT_FRACTION:
            # One recipe, store and loader timed together, decided as one.
            assert advice.store.study == advice.loader.study == "peers"
            assert advice.store.key == advice.loader.key
            assert shown["how sure"] == f"recipe: {answer.sureness(advice.loader)}"
        else:
            assert shown["how sure"] == (f"store: {answer.sureness(advice.store)}; "
                                         f"load: {answer.load_sureness(advice)}")
            # The loader path the store's own case ran, never one timed only in RAM.
            path = adv.case_knobs(advice.store.evidence[0][1])["path"]
            assert advice.loader.key.startswith(path)
            assert shown["how sure"].endswith("load: as timed with the store")
        assert f"[{advice.store.study}](docs/studies/{advice.store.study}.md)" in (
            shown["evidence"])


def test_a_situation_sized_against_the_node_fits_or_outgrows_its_ram(reference):
    fits = answer.situation_for(answer.AnswerSituation("jpeg"), reference)
    outgrows = answer.situation_for(answer.AnswerSituation("jpeg", ram_ratio=5), reference)
    assert fits.fits_in_ram and not outgrows.fits_in_ram
    assert outgrows.ram_ratio == pytest.approx(5, rel=1e-3)
    assert fits.mean_bytes == adv.sample_bytes(reference, "jpeg")
    assert fits.demand == adv.get_workload(answer.WORKLOAD).samples_per_s


def test_the_default_effect_says_not_measured_without_the_default_path(reference):
    df = reference.df
    peers = df[(df["study"] == "peers")]
    without = Results(df[~((df["study"] == "peers") & (peers.reindex(df.index)["format"]
                                                       == "rawfiles"))], reference.env)
    assert answer.default_effect(without, "jpeg") == "not measured"


def test_the_default_effect_is_the_answer_s_own_guide_row(reference):
    from storebench.studies.peers.study import DEFAULT_PATH
    from storebench.text import format_ratio

    for images in ("jpeg", "raw"):
        row = adv.recipe_row_in_ram(reference, images)
        default = None if row is None else next(
            (c for c in row.candidates if c.key == ":".join(DEFAULT_PATH)), None)
        shown = answer.default_effect(reference, images)
        if default is None:
            assert shown == "not measured"
            continue
        # The same row the answer names its recipe from: the rate and the ratio are one run's.
        answered = adv.advise(answer.situation_for(answer.AnswerSituation(images), reference),
                              reference)
        assert answered.loader.key == row.best.key and answered.loader.study == "peers"
        assert shown.startswith(f"{format_ratio(row.best.stat.median / default.stat.median)} (")


def test_a_situation_no_study_read_is_a_not_measured_row(reference):
    # The reference reads the ImageNet-like set (JPEG and its raw copy): no PNG.
    without_jpeg = Results(reference.df[reference.df["encoding"] != "jpeg"], reference.env)
    table = answer.answer_rows(without_jpeg)
    jpeg_rows = table[table["your situation"].str.startswith("JPEG")]
    assert len(jpeg_rows) == 3
    assert jpeg_rows["store as"].str.startswith(
        "not measured: no study of these results read JPEG (they read raw arrays").all()
