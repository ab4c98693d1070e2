"""Hostile input (issue 51): a dataset, an image folder or a listing handed over by someone
else cannot reach outside itself, hang, or exhaust the machine. One test (or more) per
defect of the issue, numbered as there; every hostile input is built in ``tmp_path``, and
every probe that could hang or allocate without bound runs in a child with a time and a
memory limit (``hostile.bounded``). The S3 ones (1, 2) are in tests/remote/test_s3_hostile.py;
``storebench fuzz``'s hostile kinds cover every format in tests/test_fuzz.py."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from hostile import (
    assert_one_line_error,
    bounded,
    copy_dataset,
    edit_manifest,
    python_bounded,
    reseal,
)
from image_folder import make_image_folder

from storebench.formats import DatasetError, ManifestError, find_datasets, open_dataset
from storebench.formats.build import remove_stale_builds

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def small_folder(tmp_path) -> Path:
    root = tmp_path / "images"
    make_image_folder(root, per_class=3)
    return root


# -- 3: fuzz never damages a file outside its scratch copies --------------------------------
def test_3_fuzz_refuses_a_manifest_naming_an_absolute_path(ci_dataset, tmp_path):
    from storebench.fuzz import run_fuzz

    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n" * 1000)
    data = tmp_path / "data"
    copy = copy_dataset(ci_dataset("memmap", "raw"), data / "memmap-raw")
    edit_manifest(copy, lambda m: [m[k].__setitem__(str(victim), m[k].pop("labels.npy"))
                                   for k in ("files", "fingerprints")])
    with pytest.raises(ManifestError, match="absolute path"):
        run_fuzz(data, copies_per_dataset=3, workers=1, progress=False)
    assert victim.read_bytes() == b"precious\n" * 1000


# -- 4: LMDB: a crafted data.mdb is a failed verify, never a dead process -------------------
def _craft_lmdb_size_field(path: Path) -> None:
    """Raise the data size of sample 100's leaf node (an overflow value) to 16 MiB."""
    data = bytearray(path.read_bytes())
    key = data.rfind(b"00000100")
    lo, hi, flags, ksize = struct.unpack_from("<HHHH", data, key - 8)
    assert ksize == 8 and flags == 1, "not the leaf node of an overflow value"
    struct.pack_into("<H", data, key - 6, 0x0100)
    path.write_bytes(bytes(data))


def test_4_crafted_lmdb_fails_verify_in_one_line_without_sigbus(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("lmdb", "raw"), tmp_path / "lmdb-raw")
    _craft_lmdb_size_field(copy / "data.mdb")
    reseal(copy)  # the sender recomputes every fingerprint and the digest
    result = bounded(["verify", str(copy), "--quiet"])
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "FAIL" in result.stdout and "SIGBUS" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr


def test_4_open_refuses_an_lmdb_file_not_built_or_verified_here(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("lmdb", "raw"), tmp_path / "lmdb-raw")
    with pytest.raises(DatasetError, match="trusted input only"):
        open_dataset(copy)
    open_dataset(ci_dataset("lmdb", "raw")).close()  # the user's own build opens
    result = bounded(["verify", str(copy), "--quiet"])  # a verify that passes trusts it
    assert result.returncode == 0, result.stdout + result.stderr
    open_dataset(copy).close()
    os.utime(copy / "data.mdb")  # any change to the file (its ctime) loses the trust
    with pytest.raises(DatasetError, match="trusted input only"):
        open_dataset(copy)


# -- 5, 6: FIFOs and endless devices are refused by name, never waited on or read -----------
def test_5_fifo_as_memmap_labels_is_refused(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    (copy / "labels.npy").unlink()
    os.mkfifo(copy / "labels.npy")
    reseal(copy)
    result = bounded(["verify", str(copy), "--quiet"])
    assert_one_line_error(result, "labels.npy", "FIFO")


def test_5_fifo_as_a_rawfiles_sample_is_refused(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("rawfiles", "png"), tmp_path / "rawfiles-png")
    sample = sorted((copy / "3").iterdir())[0]
    sample.unlink()
    os.mkfifo(sample)
    reseal(copy)  # the manifest lists it as an empty file: sizes and fingerprints agree
    result = bounded(["verify", str(copy), "--quiet"])
    assert_one_line_error(result, sample.name, "FIFO")


def test_5_and_6_fifo_or_dev_zero_in_an_import_folder_is_refused(small_folder, tmp_path):
    cls = sorted(p for p in small_folder.iterdir() if p.is_dir() and p.name[0] != ".")[0]
    os.mkfifo(cls / "pipe.png")
    (cls / "zero.png").symlink_to("/dev/zero")
    result = bounded(["import", str(small_folder), "--out", str(tmp_path / "out"),
                      "--formats", "rawfiles", "--quiet"])
    assert_one_line_error(result, "not a regular file")
    assert "pipe.png" in result.stderr or "zero.png" in result.stderr
    result = bounded(["import", str(small_folder), "--out", str(tmp_path / "out"),
                      "--formats", "rawfiles", "--quiet", "--on-error", "skip"])
    assert result.returncode == 0, result.stderr
    sources = json.loads((tmp_path / "out" / "rawfiles-mixed" / "sources.json").read_text())
    assert {Path(s["path"]).name for s in sources["skipped"]} == {"pipe.png", "zero.png"}


def test_5_fifo_as_an_imported_source_fails_verify(small_folder, tmp_path):
    out = tmp_path / "out"
    result = bounded(["import", str(small_folder), "--out", str(out), "--formats", "rawfiles",
                      "--quiet"])
    assert result.returncode == 0, result.stderr
    source = sorted(small_folder.rglob("*.png"))[0]
    source.unlink()
    os.mkfifo(source)
    result = bounded(["verify", str(out), "--quiet"])
    assert_one_line_error(result, source.name, "FIFO")


def test_6_rawfiles_sample_linked_to_dev_zero_is_refused(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("rawfiles", "raw"), tmp_path / "rawfiles-raw")
    sample = sorted((copy / "0").iterdir())[0]
    sample.unlink()
    sample.symlink_to("/dev/zero")
    reseal(copy)
    result = bounded(["verify", str(copy), "--quiet"])
    assert_one_line_error(result, sample.name)
    with pytest.raises(ManifestError, match="outside"):
        open_dataset(copy, verify=False)


# -- 7: symbolic link loops in an import folder ---------------------------------------------
def test_7_link_loops_import_each_image_once_and_end(small_folder):
    from storebench.importer import scan_source

    before = scan_source(small_folder).paths
    classes = sorted(p for p in small_folder.iterdir() if p.is_dir() and p.name[0] != ".")
    (classes[0] / "loop").symlink_to("..")  # back up to the root: every class again
    (classes[1] / "a").symlink_to("b")
    (classes[1] / "b").symlink_to("a")  # a loop of two links to nothing
    (classes[2] / "self").symlink_to(".")
    (classes[2] / "again").symlink_to(classes[2])  # a second link to one real folder
    after = scan_source(small_folder)
    assert after.paths == before
    assert len(after.paths) == len(set(after.paths)) == 9


# -- 8: headers are checked against real sizes before anything is allocated -----------------
@pytest.mark.parametrize("format_name", ["rawfiles", "tfrecord", "webdataset"])
def test_8_a_manifest_claiming_10_to_the_12_samples_is_refused(ci_dataset, tmp_path,
                                                               format_name):
    copy = copy_dataset(ci_dataset(format_name, "raw"), tmp_path / "data")

    def edit(manifest):
        manifest["num_samples"] = manifest["spec"]["num_samples"] = 10**12

    edit_manifest(copy, edit)
    result = python_bounded(
        "from storebench.formats import open_dataset, ManifestError\n"
        f"try:\n    open_dataset({str(copy)!r})\n"
        "except ManifestError as err:\n    print('refused:', err)\n")
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "checksums.npy" in result.stdout, result.stdout


@pytest.mark.parametrize("format_name", ["rawfiles", "tfrecord", "webdataset"])
def test_8_a_huge_image_shape_is_refused(ci_dataset, tmp_path, format_name):
    copy = copy_dataset(ci_dataset(format_name, "raw"), tmp_path / "data")

    def edit(manifest):
        manifest["spec"]["height"] = manifest["spec"]["width"] = 1 << 20

    edit_manifest(copy, edit)
    result = bounded(["verify", str(copy), "--quiet"])
    assert_one_line_error(result, "exceeds the cap")


def test_8_a_sparse_webdataset_member_of_100_gb_is_refused(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("webdataset", "jpeg"), tmp_path / "wds")
    index = np.load(copy / "index.npy")
    last = len(index) - 1
    index[last, 2] = 100 * 10**9  # the last member's size: the index and the shard agree
    np.save(copy / "index.npy", index)
    shard = sorted(copy.glob("*.tar"))[-1]
    os.truncate(shard, int(index[last, 1]) + 100 * 10**9 + 4096)  # sparse: no disk used

    def edit(manifest):
        from storebench.formats.base import crc32c_of_ints

        # JPEG members are the stored bytes themselves (no .npy header to subtract).
        manifest["integrity"]["sizes_crc32c"] = crc32c_of_ints(index[:, 2])

    reseal(copy)
    edit_manifest(copy, edit)
    result = python_bounded(
        "from storebench.formats import open_dataset, DatasetError\n"
        f"try:\n    r = open_dataset({str(copy)!r}, verify=False); r[{last}]\n"
        "except DatasetError as err:\n    print('refused:', err)\n")
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "index.npy" in result.stdout, result.stdout


def _png_header_claiming(width: int, height: int) -> bytes:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b""))
            + chunk(b"IEND", b""))


def _jpeg_claiming(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="JPEG")
    data = bytearray(buffer.getvalue())
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


@pytest.mark.parametrize("decode,maker", [("pil", _png_header_claiming),
                                          ("simplejpeg", _jpeg_claiming)])
def test_8_decoders_refuse_a_decompression_bomb_by_its_header(ci_dataset, tmp_path, decode,
                                                              maker):
    if decode == "simplejpeg":
        pytest.importorskip("simplejpeg")
    encoding = "png" if decode == "pil" else "jpeg"
    (tmp_path / "bomb").write_bytes(maker(65000, 65000))
    # In a bounded child: unchecked, simplejpeg would ask for 12 GB here.
    result = python_bounded(
        "from pathlib import Path\n"
        "from storebench.formats import open_dataset, CorruptSampleError\n"
        "from storebench.loaders.datasets import LazyDataset\n"
        f"reader = open_dataset({str(ci_dataset('rawfiles', encoding))!r})\n"
        f"with LazyDataset(reader, decode={decode!r}) as ds:\n"
        "    try:\n"
        f"        ds._decode(Path({str(tmp_path / 'bomb')!r}).read_bytes(), 0, None)\n"
        "    except CorruptSampleError as err:\n"
        "        print('refused:', err)\n")
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "exceeds" in result.stdout, result.stdout


# -- 9: integer labels of a listing are bounded ---------------------------------------------
def test_9_an_integer_label_of_10_to_the_12_is_refused(small_folder, tmp_path):
    image = sorted(small_folder.rglob("*.png"))[0]
    listing = tmp_path / "list.csv"
    listing.write_text(f"path,label\n{image},{10**12}\n")
    result = bounded(["import", str(listing), "--out", str(tmp_path / "out"), "--quiet"])
    assert_one_line_error(result, "integer labels must be in", str(10**12))


# -- 10: the stale-build sweep takes only its own names, following no link -------------------
def test_10_sweep_leaves_user_folders_and_links_alone(tmp_path):
    out = tmp_path / "out"
    kept = [out / ".tmp-notes", out / ".tmp-hdf5-raw-notes"]
    for folder in kept:
        folder.mkdir(parents=True)
        (folder / "mine.txt").write_text("keep me")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    link = out / ".tmp-hdf5-raw-999999-deadbeef"
    link.symlink_to(target)
    stale = out / ".tmp-hdf5-raw-999998-0123abcd"
    stale.mkdir()
    remove_stale_builds(out)
    assert all((folder / "mine.txt").read_text() == "keep me" for folder in kept)
    assert link.is_symlink() and (target / "precious.txt").read_text() == "keep me"
    assert not stale.exists()


# -- 11: HDF5 keeps every byte in its own file ------------------------------------------------
def test_11_hdf5_external_storage_is_refused(ci_dataset, tmp_path):
    import h5py

    copy = copy_dataset(ci_dataset("hdf5", "raw"), tmp_path / "hdf5-raw")
    outside = tmp_path / "outside-labels.bin"
    with h5py.File(copy / "data.h5", "a") as f:
        labels = f["labels"][:]
        outside.write_bytes(labels.astype("<i8").tobytes())
        del f["labels"]
        f.create_dataset("labels", shape=labels.shape, dtype="<i8",
                         external=[(str(outside), 0, labels.nbytes)])
    reseal(copy)
    with pytest.raises(DatasetError, match="external file"):
        open_dataset(copy, verify=False)


# -- 12: open and verify touch nothing outside the directory ---------------------------------
@pytest.mark.parametrize("name", ["../outside.npy", "/etc/hostname", "a/../../outside.npy",
                                  "..\\outside.npy", "labels.npy\0"])
def test_12_a_manifest_name_out_of_the_dataset_is_refused(ci_dataset, tmp_path, name):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    (tmp_path / "outside.npy").write_bytes((copy / "labels.npy").read_bytes())
    edit_manifest(copy, lambda m: [m[k].__setitem__(name, m[k].pop("labels.npy"))
                                   for k in ("files", "fingerprints")])
    with pytest.raises(ManifestError, match="must stay inside it"):
        open_dataset(copy)


def test_12_a_data_file_linked_out_of_the_dataset_is_refused(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    outside = tmp_path / "labels.npy"
    (copy / "labels.npy").rename(outside)
    (copy / "labels.npy").symlink_to(outside)  # the very same bytes, outside
    with pytest.raises(ManifestError, match="outside"):
        open_dataset(copy)


# -- 13: verify checks checksums.npy ------------------------------------------------------------
def test_13_verify_fails_a_truncated_checksums_file(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    path = copy / "checksums.npy"
    os.truncate(path, path.stat().st_size - 8)
    result = bounded(["verify", str(copy), "--quiet"])
    assert result.returncode == 1 and "checksums.npy" in result.stdout, result.stdout


def test_13_verify_fails_a_replaced_checksums_file(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    checksums = np.load(copy / "checksums.npy")
    np.save(copy / "checksums.npy", checksums[::-1].copy())
    result = bounded(["verify", str(copy), "--quiet"])
    assert result.returncode == 1 and "checksums.npy" in result.stdout, result.stdout


# -- 14: S3Config keeps its secrets out of repr -------------------------------------------------
def test_14_s3config_repr_hides_the_secret_and_the_token():
    from storebench.remote.s3 import S3Config

    config = S3Config(endpoint_url="http://127.0.0.1:1", access_key="AKIAEXAMPLE",
                      secret_key="s3cr3t-KEY-value", session_token="t0ken-VALUE")
    text = repr(config) + str(config)
    assert "s3cr3t-KEY-value" not in text and "t0ken-VALUE" not in text
    assert "AKIAEXAMPLE" in text  # the key id names the account, it is no secret


# -- 15: verify refuses / and does not wander --------------------------------------------------
def test_15_verify_refuses_the_filesystem_root():
    result = bounded(["verify", "/", "--quiet"], timeout_s=60)
    assert_one_line_error(result, "filesystem root")


def test_15_finding_datasets_follows_no_link(ci_dataset, tmp_path):
    other = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "other" / "memmap-raw")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "theirs").symlink_to(other.parent)
    assert find_datasets(mine) == []
    assert find_datasets(tmp_path / "other") == [other]


# -- 16: a folder 1,500 levels deep is no RecursionError --------------------------------------
def test_16_a_very_deep_folder_is_walked_without_recursion(small_folder, tmp_path):
    from storebench.importer import scan_source

    cls = sorted(p for p in small_folder.iterdir() if p.is_dir() and p.name[0] != ".")[0]
    image = sorted(small_folder.rglob("*.png"))[0]
    folders = [os.fspath(cls)]
    for _ in range(1500):  # past Python's recursion limit of 1,000 frames (mkdir, one by one)
        folders.append(os.path.join(folders[-1], "d"))
        os.mkdir(folders[-1])
    deep = Path(folders[-1]) / "deep.png"
    deep.write_bytes(image.read_bytes())
    try:
        listing = scan_source(small_folder)
        assert sum(p.endswith("deep.png") for p in listing.paths) == 1
        assert find_datasets(small_folder) == []
    finally:  # bottom up: shutil.rmtree (and pytest's cleanup) recurse and would fail
        deep.unlink()
        for folder in reversed(folders[1:]):
            os.rmdir(folder)


# -- 17: --out inside the source is refused -----------------------------------------------------
def test_17_import_refuses_an_out_inside_the_source(small_folder):
    result = bounded(["import", str(small_folder), "--out", str(small_folder / "out"),
                      "--force", "--quiet"])
    assert_one_line_error(result, "inside the source folder")
    assert not (small_folder / "out").exists()


# -- 18: --workers is at least 1 -----------------------------------------------------------------
@pytest.mark.parametrize("command", ["build", "import", "verify", "fuzz"])
@pytest.mark.parametrize("workers", ["0", "-3"])
def test_18_workers_below_one_are_refused(tmp_path, command, workers):
    args = {"build": ["build", "--out", str(tmp_path)], "import": ["import", str(tmp_path),
            "--out", str(tmp_path / "o")], "verify": ["verify", str(tmp_path)],
            "fuzz": ["fuzz", str(tmp_path)]}[command]
    result = bounded([*args, "--workers", workers], timeout_s=60)
    assert result.returncode == 2 and "must be at least 1" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- the CLI: MemoryError and RecursionError in one line -----------------------------------------
@pytest.mark.parametrize("error", ["MemoryError", "RecursionError"])
def test_cli_turns_memory_and_recursion_errors_into_one_line(tmp_path, error):
    code = ("import sys, storebench.cli as cli\n"
            f"def boom(args):\n    raise {error}()\n"
            "cli._verify = boom\n"
            f"sys.exit(cli.main(['verify', {str(tmp_path)!r}]))\n")
    result = python_bounded(code)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_manifest_nested_200000_deep_is_a_manifest_error(ci_dataset, tmp_path):
    copy = copy_dataset(ci_dataset("memmap", "raw"), tmp_path / "memmap-raw")
    (copy / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    result = bounded(["verify", str(copy), "--quiet"])
    assert_one_line_error(result, "manifest")


def test_sys_executable_is_the_tests_interpreter():
    # The bounded probes run the storebench this suite tests, not another install.
    result = python_bounded("import storebench; print(storebench.__file__)")
    import storebench

    assert result.stdout.strip() == storebench.__file__, (result.stdout, sys.executable)
