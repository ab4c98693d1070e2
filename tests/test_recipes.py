"""The recipe registry (``storebench.recipes``): every pipeline the answer weighs is declared
once, with traits that hold, refusals that say why, and code that runs."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import data_gen
from storebench.formats import FORMATS, build_dataset
from storebench.loaders.paths import LOADER_PATHS
from storebench.recipes import (
    IN_RAM,
    OBJECT_STORAGE,
    OUT_OF_CORE,
    RECIPES,
    SITUATIONS,
    Recipe,
    TransformTraits,
    get_recipe,
)
from storebench.report.recipes import example_dataset, recipe_text, recipes_table

ROOT = Path(__file__).resolve().parents[1]


def test_every_peer_library_the_default_and_storebench_have_a_recipe():
    loaders = {recipe.loader for recipe in RECIPES.values()}
    layouts = {recipe.layout for recipe in RECIPES.values()}
    # tf.data, FFCV, DALI (CPU), WebDataset, LitData, MDS, SPDL, torchdata, the tuned torch
    # DataLoader over files, and storebench's prefetchers.
    assert loaders >= {"tf_data", "ffcv", "dali_file", "webdataset", "litdata", "mds", "spdl",
                       "torchdata", "torch", "thread", "process"}
    # Lance and Zarr have no loader: their reader feeds a prefetcher.
    assert layouts >= {"lance", "zarr"}
    for name in ("lance-process", "zarr-process"):
        assert "has no loader of its own" in RECIPES[name].note
    # Every peer library's own loader path is some recipe's, or a variant of one.
    peer_libraries = {LOADER_PATHS[r.loader].libraries[0] for r in RECIPES.values()
                      if LOADER_PATHS[r.loader].family == "peer"}
    for path in LOADER_PATHS.values():
        if path.family == "peer":
            assert path.libraries[0] in peer_libraries, path.name


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_recipe_declares_a_pipeline_that_exists(name):
    recipe = RECIPES[name]
    assert recipe.loader in LOADER_PATHS
    assert recipe.layout in FORMATS and recipe.encoding in FORMATS[recipe.layout].ENCODINGS
    assert recipe.doc.startswith("https://") or (ROOT / recipe.doc).is_file()
    assert recipe.tuning, "a recipe sets what its docs advise"
    code = recipe.snippet(example_dataset(recipe))
    ast.parse(code)
    assert example_dataset(recipe) in code and "{dataset}" not in code
    named = re.findall(r'LOADER_PATHS\["(\w+)"\]', code)
    assert named in ([], [recipe.loader])
    # The code decodes with the recipe's decoder, as its pipeline (``Recipe.open``) does.
    decodes = re.findall(r"LazyDataset\(reader, (?:decode=(\w+|\"\w+\"), )?", code)
    assert all(d.strip('"') == str(recipe.decode) or (d == "" and recipe.decode is None)
               for d in decodes), (decodes, recipe.decode)
    assert recipe.environment in ("main", "peers")
    assert set(recipe.versions()) == set(recipe.distribution_names())


def test_a_recipe_says_why_it_cannot_serve_a_situation():
    thread = get_recipe("storebench-thread-lmdb")
    assert thread.serves(IN_RAM) and thread.serves(OUT_OF_CORE)
    assert thread.why_not(OBJECT_STORAGE) == FORMATS["lmdb"].TRAITS.remote_unsupported != ""
    tf_data = get_recipe("tf-data-tfrecord")
    assert not tf_data.serves(OBJECT_STORAGE)
    assert tf_data.why_not(OBJECT_STORAGE).startswith("TensorFlow 2.21 has no S3 filesystem")
    with pytest.raises(ValueError, match=r"^unknown situation 'moon'; known: "):
        thread.why_not("moon")
    # A library that streams from S3 itself is not run there here: not an answer there.
    webdataset = get_recipe("webdataset")
    assert webdataset.why_not(OBJECT_STORAGE) == (
        FORMATS["webdataset"].TRAITS.remote_unsupported)


def test_declarations_that_do_not_hold_are_refused():
    with pytest.raises(ValueError, match=r"^transform filter must be one of \['antialiased', "
                                         r"'plain'\], got 'sharp'$"):
        TransformTraits("sharp", "whole image", "x")
    with pytest.raises(ValueError, match=r"^transform window must be one of"):
        TransformTraits("plain", "half", "x")
    with pytest.raises(ValueError, match=r"^transform resampler must be one of"):
        TransformTraits("plain", "crop window", "x", resampler="cv2")
    good = get_recipe("storebench-thread-lmdb")
    with pytest.raises(ValueError, match=r"unknown situations \['moon'\]"):
        Recipe(**{**good.__dict__, "cannot": {"moon": "no air"}})
    with pytest.raises(ValueError, match=r"its code must name \{dataset\}"):
        Recipe(**{**good.__dict__, "code": "print(1)\n"})
    with pytest.raises(KeyError, match="unknown recipe 'nope'; known: storebench-window-lmdb, "):
        get_recipe("nope")


def test_a_recipe_says_why_this_environment_cannot_run_it():
    """The main environment runs storebench's recipes and lacks the peers' libraries."""
    for name, recipe in RECIPES.items():
        if recipe.environment == "main":
            assert recipe.unavailable() is None, name
    if importlib.util.find_spec("ffcv") is None:
        assert get_recipe("ffcv").unavailable() == (
            "recipe ffcv: no module 'ffcv' in this environment")


def test_the_table_and_the_text_come_from_the_declarations():
    table = recipes_table()
    assert list(table["recipe"]) == list(RECIPES)
    tf_row = table[table["recipe"] == "tf-data-tfrecord"].iloc[0]
    assert tf_row["resize filter"] == "plain" and tf_row["decodes"] == "crop window"
    text = recipe_text("tf-data-tfrecord")
    assert text.splitlines()[0] == ("tf-data-tfrecord: tf.data TFRecord AUTOTUNE over "
                                    "tfrecord-jpeg")
    assert "    object storage: cannot: TensorFlow 2.21 has no S3 filesystem" in text
    assert "tensorflow-cpu " in text and "https://www.tensorflow.org/guide/data_performance" in text
    for situation in SITUATIONS:
        assert f"    {situation}: " in text


def storebench(*args):
    return subprocess.run([sys.executable, "-m", "storebench.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_the_recipes_command_lists_them_and_prints_one_in_full():
    listed = storebench("recipes")
    assert listed.returncode == 0 and listed.stderr == ""
    assert all(f"| {name} |" in listed.stdout for name in RECIPES)
    one = storebench("recipes", "ffcv")
    assert one.returncode == 0 and one.stdout == recipe_text("ffcv") + "\n"
    wrong = storebench("recipes", "nope")
    assert wrong.returncode == 2 and "invalid choice: 'nope'" in wrong.stderr
    assert "Traceback" not in wrong.stderr


MAIN_RECIPES = [name for name, recipe in RECIPES.items() if recipe.environment == "main"]


@pytest.fixture(scope="module")
def ci_sets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recipes")
    for layout, encoding in {(RECIPES[n].layout, RECIPES[n].encoding) for n in MAIN_RECIPES}:
        build_dataset(data_gen.PROFILES["ci"].spec_for(encoding), layout, root, workers=1)
    return root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", MAIN_RECIPES)
def test_a_recipe_s_code_runs_an_epoch_of_its_dataset(ci_sets, name, tmp_path):
    """The code a user copies, as printed, over the ci set of its layout."""
    recipe = RECIPES[name]
    script = tmp_path / "recipe.py"
    script.write_text(recipe.snippet(str(ci_sets / f"{recipe.layout}-{recipe.encoding}"))
                      + "print('epoch done')\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.endswith("epoch done\n")


def test_a_closed_recipe_run_lets_the_next_one_open_the_same_set(ci_sets):
    """Closing a run closes the dataset it opened: an LMDB environment can be open once per
    process, so a second run over the same set fails while the first one's is open."""
    import gc

    recipe = RECIPES["storebench-thread-lmdb"]
    root = str(ci_sets / f"{recipe.layout}-{recipe.encoding}")
    kept = []
    for _ in range(2):
        run = recipe.open(root, batch_size=16, workers=1, seed=3)
        with run:
            first = next(iter(run.epoch(0)))
        kept.append(run)  # still referenced: only close() can have released its set
        assert len(first.labels) == 16
    gc.collect()
    assert all(run.dataset is None for run in kept)
