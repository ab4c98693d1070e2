"""Command line: ``storebench build | import | verify | upload | download | run | study |
topup | findings | consistency | compare | advise | recipes | plot | readme``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import data_gen

DEFAULT_DATA_ROOT = Path("data")
DEFAULT_RESULTS_ROOT = Path("results")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (``--workers 0`` or ``-3`` is refused)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _progress(args: argparse.Namespace) -> bool:
    """Progress bars on a terminal only: redrawn in a log (``make study > log 2>&1``) they
    would be thousands of carriage-return frames; the commands print plain lines there."""
    return not args.quiet and sys.stderr.isatty()


def _build(args: argparse.Namespace) -> int:
    from .bench.plan import family_data_dir
    from .study import build_peer_sets, build_profile

    profile = data_gen.get_profile(args.profile)
    out = Path(args.out) if args.out else DEFAULT_DATA_ROOT / profile.name
    options = {"knob_variants": False, "workers": args.workers, "progress": _progress(args),
               "force": args.force, "log": lambda line: print(line, flush=True)}
    if args.peer_sets:
        if args.encodings or args.samples is not None:
            raise ValueError("--peer-sets builds the peers study's cut raw and JPEG sets: "
                             "it takes neither --encodings nor --samples")
        if not args.out:
            out = family_data_dir(out, args.family)
        build_peer_sets(profile.name, out, formats=args.formats, family=args.family, **options)
        return 0
    if not args.out:
        out = family_data_dir(out, args.family)  # its dataset names would clash otherwise
    build_profile(profile.name, out, formats=args.formats, encodings=args.encodings,
                  samples=args.samples, family=args.family, **options)
    return 0


def _import(args: argparse.Namespace) -> int:
    from .importer import import_images, parse_resize

    results = import_images(
        Path(args.source),
        Path(args.out),
        formats=args.formats,
        resize=parse_resize(args.resize),
        limit=args.limit,
        on_error=args.on_error,
        workers=args.workers,
        progress=_progress(args),
        force=args.force,
        log=lambda line: print(line, flush=True),
        engine=args.engine,
        address=args.address,
    )
    print(f"imported into {args.out}: {len(results)} dataset(s); next: storebench verify "
          f"{args.out}, then storebench study --dataset {args.out}", flush=True)
    return 0


def _upload(args: argparse.Namespace) -> int:
    from .formats import find_datasets
    from .remote.dataset import upload_dataset
    from .remote.s3 import S3Path

    source, url = Path(args.source), S3Path.parse(args.url)
    datasets = find_datasets(source)
    if not datasets:
        raise ValueError(f"{source}: holds no built dataset (no manifest.json)")
    for path in datasets:
        # A directory of datasets keeps its layout under the prefix.
        target = url if path == source else url / path.relative_to(source).as_posix()
        done = upload_dataset(path, target, progress=_progress(args))
        print(f"{path} -> {done.target}: {done.files} files, {done.bytes / 1e6:.1f} MB in "
              f"{done.seconds:.1f} s", flush=True)
    return 0


def _download(args: argparse.Namespace) -> int:
    from .formats import FORMATS, read_manifest, untrusted_files
    from .remote.dataset import download_dataset

    done = download_dataset(args.url, Path(args.out), progress=_progress(args))
    print(f"{done.source} -> {done.target}: {done.files} files, {done.bytes / 1e6:.1f} MB in "
          f"{done.seconds:.1f} s", flush=True)
    module = FORMATS.get(read_manifest(Path(args.out))["format"])
    if module is not None and untrusted_files(Path(args.out), module):
        print(f"{module.NAME} is trusted input only: run storebench verify {args.out} before "
              "opening it", flush=True)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .formats import find_datasets
    from .verify import verify_dataset

    root = Path(args.path)
    if not root.exists():
        print(f"storebench verify: {root}: no such directory", file=sys.stderr)
        return 2
    datasets = find_datasets(root)
    if not datasets:
        print(f"storebench verify: no dataset (manifest.json) under {root}", file=sys.stderr)
        return 2
    failures = 0
    for path in datasets:
        result = verify_dataset(path, workers=args.workers, progress=_progress(args))
        status = "OK  " if result.ok else "FAIL"
        print(f"{status} {path}  {result.samples_checked} samples  {result.message}", flush=True)
        failures += not result.ok
    return 1 if failures else 0


def _run(args: argparse.Namespace) -> int:
    from .study import run_study

    run_study(
        args.study,
        profile=args.profile,
        data_root=args.data,
        results_root=args.results,
        repeats=args.repeats,
        resume=not args.fresh,
        drop_caches=args.drop_caches,
        progress=_progress(args),
        dataset=args.dataset,
        family=args.family,
    )
    return 0


def _study(args: argparse.Namespace) -> int:
    from .study import run_full_study

    if args.quick:
        from .quick_study import run_quick_study

        given = [flag for flag, value in (("--dataset", args.dataset),
                                          ("--family", args.family),
                                          ("--repeats", args.repeats)) if value is not None]
        if args.profile != data_gen.DEFAULT_PROFILE:
            given.append("--profile")
        if given:
            raise ValueError(f"--quick measures the reference's own cases on its own sets; "
                             f"it takes no {', '.join(given)}")

        run_quick_study(reference_dir=args.reference, data_root=args.data,
                        results_root=args.results, resume=not args.fresh,
                        drop_caches=args.drop_caches, progress=_progress(args))
        return 0
    run_full_study(
        dataset=args.dataset,
        profile=args.profile,
        data_root=args.data,
        results_root=args.results,
        repeats=args.repeats,
        resume=not args.fresh,
        drop_caches=args.drop_caches,
        notebooks=not args.no_notebooks,
        progress=_progress(args),
        family=args.family,
    )
    return 0


def _plot(args: argparse.Namespace) -> int:
    from .report.figures import plot_all

    written = plot_all(Path(args.results_dir))
    for path in written:
        print(path)
    if not written:
        print(f"storebench plot: no results under {args.results_dir}", file=sys.stderr)
        return 1
    return 0


def _findings(args: argparse.Namespace) -> int:
    import json

    from .guide import guide_text
    from .report.guide import decision_guide
    from .results import Results

    results = Results.load(Path(args.results_dir))
    rows = decision_guide(results)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows], indent=2))
    else:
        from .text import machine_text

        if results.env:
            print(f"Measured on: {machine_text(results.env)}\n")
        print(guide_text(rows))
    return 0


def _advise(args: argparse.Namespace) -> int:
    from .report.advise import advise_command

    values = dict(images=args.images, count=args.count, mean_bytes=args.mean_bytes,
                  storage=args.storage, rtt_ms=args.rtt_ms, disk=args.disk,
                  ram_gb=args.ram_gb, cores=args.cores, accelerators=args.accelerators,
                  nodes=args.nodes, demand=args.demand, workload=args.workload,
                  dataset=args.dataset, resize=args.resize)
    if args.measure_samples is not None and not args.measure:
        raise ValueError("--measure-samples goes with --measure")
    if args.measure:
        from .advise_measure import MEASURE_SAMPLES, measure_advice

        # The plan and the progress go to stderr, so that --json's stdout stays one object.
        print(measure_advice(
            args.results, as_json=args.json, data_root=args.data,
            samples=(MEASURE_SAMPLES if args.measure_samples is None
                     else args.measure_samples),
            log=lambda line: print(line, file=sys.stderr, flush=True), **values))
        return 0
    print(advise_command(args.results, as_json=args.json, **values))
    return 0


def _fuzz(args: argparse.Namespace) -> int:
    from .fuzz import fuzz_command

    return fuzz_command(Path(args.data_dir), copies_per_dataset=args.copies, seed=args.seed,
                        out=args.out, timeout_s=args.timeout, workers=args.workers,
                        formats=args.formats, progress=_progress(args))


def _consistency(args: argparse.Namespace) -> int:
    from .report.consistency import consistency_command

    code, text = consistency_command(Path(args.results_dir))
    print(text)
    return code


def _topup(args: argparse.Namespace) -> int:
    from .study import top_up_timed

    results_dir = Path(args.results_dir)
    profile = args.profile
    if profile is None:
        env = results_dir / "env.json"
        if not env.exists():
            raise FileNotFoundError(f"{env}: no such file; name the run's --profile")
        import json

        recorded = json.loads(env.read_text())
        profile = recorded.get("plan") or recorded.get("profile")
    if profile not in data_gen.PROFILES:
        raise ValueError(f"{results_dir}: profile {profile!r} is not a synthetic profile; "
                         f"name one of {sorted(data_gen.PROFILES)} with --profile")
    top_up_timed(results_dir, profile=profile, data_root=args.data, family=args.family,
                 budget_s=args.budget, drop_caches=args.drop_caches)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .report.compare import compare_command

    print(compare_command(Path(args.run_a), Path(args.run_b)))
    return 0


def _readme(args: argparse.Namespace) -> int:
    from .report.readme import update_readme

    changed = update_readme(Path(args.readme), Path(args.results_dir))
    print(f"{args.readme}: findings {'updated' if changed else 'already current'}")
    return 0


def _describe_set(args: argparse.Namespace) -> int:
    from data_gen.describe import describe, quantile_table, replace_table

    spec = data_gen.get_profile(args.profile).spec_for("jpeg", "imagenet")
    table = quantile_table(describe(spec, args.samples))
    if args.write:
        page = Path(args.write)
        page.write_text(replace_table(page.read_text(encoding="utf-8"), table), encoding="utf-8")
        print(f"{page}: table rewritten from {args.samples} images")
    else:
        print(table)
    return 0


def parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="storebench", description=__doc__)
    p.add_argument("--version", action="version", version=f"storebench {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="write the profile's datasets in every format")
    b.add_argument("--profile", default=data_gen.DEFAULT_PROFILE, choices=sorted(data_gen.PROFILES))
    b.add_argument("--out", help="output directory (default: data/<profile>)")
    b.add_argument("--formats", nargs="+", help="formats to build (default: all)")
    b.add_argument("--encodings", nargs="+", choices=data_gen.ENCODINGS)
    b.add_argument("--workers", type=positive_int, default=None,
                   help="generator processes (default: cores)")
    b.add_argument("--samples", type=int, default=None,
                   help="build each set's first N samples only (the same bytes as the whole "
                        "set's)")
    b.add_argument("--peer-sets", action="store_true",
                   help="build the sets the peers study reads: the raw and JPEG sets cut to "
                        "one count (at most 2,048 samples), in OUT/peers")
    b.add_argument("--family", default="synthetic", choices=data_gen.FAMILIES,
                   help="the profile's synthetic sets, or its ImageNet-like JPEG set and "
                        "224x224 raw copy (in OUT/imagenet)")
    b.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_build)

    from .importer import DEFAULT_ENGINE, IMPORT_ENGINES

    im = sub.add_parser(
        "import", help="import your own images (an ImageFolder tree or a CSV/Parquet listing "
                       "of path,label) into every format that can hold them")
    im.add_argument("source", help="a folder with one subfolder per class, or a .csv/.parquet "
                                   "listing with columns path,label")
    im.add_argument("--out", required=True, help="output directory, e.g. data/mypets")
    im.add_argument("--formats", nargs="+", help="formats to write (default: all that fit)")
    im.add_argument("--resize", metavar="HxW",
                    help="also write raw arrays resized to HxW (needed for memmap)")
    im.add_argument("--limit", type=int, help="import N images spread evenly over the source")
    im.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                    help="a damaged or unreadable image stops the import (fail, the default) "
                         "or is left out and counted (skip)")
    im.add_argument("--workers", type=positive_int, default=None,
                    help="threads checking images (with --engine ray: the CPUs of the local Ray)")
    im.add_argument("--engine", choices=sorted(IMPORT_ENGINES), default=DEFAULT_ENGINE,
                    help="who reads, checks and resizes the images: this process (the default) "
                         "or Ray tasks; the datasets written are the same bytes")
    im.add_argument("--address", help="with --engine ray: the Ray cluster to use (host:port; "
                                      "default RAY_ADDRESS, else a Ray started here on loopback)")
    im.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    im.add_argument("--quiet", action="store_true", help="no progress bars")
    im.set_defaults(func=_import)

    v = sub.add_parser("verify", help="re-read every sample and compare with data_gen (or, for "
                                      "an imported dataset, with its source files)")
    v.add_argument("path", help="a dataset directory or a directory of datasets")
    v.add_argument("--workers", type=positive_int, default=None)
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=_verify)

    up = sub.add_parser(
        "upload", help="copy a built dataset (or a directory of them) to s3://bucket/prefix; "
        "the endpoint and keys come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY")
    up.add_argument("source", help="a dataset directory or a directory of datasets")
    up.add_argument("url", help="s3://bucket/prefix")
    up.add_argument("--quiet", action="store_true", help="no progress bars")
    up.set_defaults(func=_upload)

    down = sub.add_parser(
        "download", help="stage a dataset from s3://bucket/prefix on local disk (what LMDB "
        "and memmap need)")
    down.add_argument("url", help="s3://bucket/prefix of one uploaded dataset")
    down.add_argument("out", help="a new local directory")
    down.add_argument("--quiet", action="store_true", help="no progress bars")
    down.set_defaults(func=_download)

    for name, func, text in (
        ("run", _run, "run one study and write results/<profile>/<study>.csv"),
        ("study", _study, "build, run every study, plot, execute the notebooks"),
    ):
        s = sub.add_parser(name, help=text)
        if name == "run":
            from .studies import STUDIES

            s.add_argument("--study", required=True, choices=list(STUDIES))
        s.add_argument(
            "--profile", default=data_gen.DEFAULT_PROFILE, choices=sorted(data_gen.PROFILES),
            help="the synthetic profile to build and study; with --dataset, the plan that "
                 "sizes the study (repeats, grid): ci is quick, small is the default",
        )
        s.add_argument(
            "--dataset", type=Path, default=None,
            help="study your own images instead: a directory written by storebench import; "
                 "results go to <results>/<its name>/",
        )
        s.add_argument(
            "--family", choices=data_gen.FAMILIES, default=None,
            help="the profile's sets the training-set studies read: the ImageNet-like set "
                 "(imagenet) or the synthetic sets (default: the profile's, imagenet on "
                 "small, medium and large; the synthetic-only studies read synthetic sets)",
        )
        s.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT, help="dataset root")
        s.add_argument("--results", type=Path, default=DEFAULT_RESULTS_ROOT, help="results root")
        s.add_argument("--repeats", type=int, default=None, help="timed repeats per case")
        s.add_argument(
            "--fresh", action="store_true", help="discard earlier rows, rerun every case"
        )
        s.add_argument(
            "--drop-caches",
            action="store_true",
            help="also write /proc/sys/vm/drop_caches for cold cases (root only)",
        )
        s.add_argument("--quiet", action="store_true")
        if name == "study":
            s.add_argument("--no-notebooks", action="store_true", help="skip executing notebooks")
            s.add_argument(
                "--quick", action="store_true",
                help="answer the README's table for this machine in minutes: measure only "
                     "the two best candidates of each decision the reference's answer rests "
                     "on, into <results>/quick/ (--profile, --dataset, --family and "
                     "--repeats do not apply)")
            s.add_argument("--reference", type=Path, default=DEFAULT_RESULTS_ROOT / "reference",
                           help="with --quick: the results whose answer is measured again")
        s.set_defaults(func=func)

    f = sub.add_parser("findings", help="print this machine's decision guide from results")
    f.add_argument("results_dir", help="e.g. results/reference or results/small")
    f.add_argument("--json", action="store_true",
                   help="one object per guide row, with its candidates and their medians")
    f.set_defaults(func=_findings)

    c = sub.add_parser("consistency", help="check every figure the pages quote against its "
                                          "rows (one value and one case per key), and that "
                                          "keys two studies measured agree within 10%%")
    c.add_argument("results_dir", help="e.g. results/reference")
    c.set_defaults(func=_consistency)

    t = sub.add_parser("topup", help="a finished study's two best candidates of every guide "
                                     "question taken to the plan's decision repeats, then "
                                     "more repeats where a question is undecided")
    t.add_argument("results_dir", help="a finished study's results, e.g. results/small")
    t.add_argument("--profile", choices=sorted(data_gen.PROFILES), default=None,
                   help="the profile it ran (default: the one its env.json records)")
    t.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT, help="dataset root")
    t.add_argument("--family", choices=data_gen.FAMILIES, default=None,
                   help="the sets its training-set studies read (default: the profile's)")
    t.add_argument("--budget", type=float, default=None,
                   help="planned case seconds to spend (default: the profile's plan)")
    t.add_argument("--drop-caches", action="store_true",
                   help="also write /proc/sys/vm/drop_caches for cold cases (root only)")
    t.set_defaults(func=_topup)

    cm = sub.add_parser("compare", help="which of RUN_A's guide decisions hold in RUN_B")
    cm.add_argument("run_a", help="a results directory, e.g. results/reference")
    cm.add_argument("run_b", help="another run's results directory")
    cm.set_defaults(func=_compare)

    _advise_parser(sub)
    _recipes_parser(sub)

    fz = sub.add_parser("fuzz", help="damage copies of built datasets; check that every read "
                                     "fails loudly (no silently wrong sample, hang or crash)")
    fz.add_argument("data_dir", help="a directory of built datasets, e.g. data/ci")
    fz.add_argument("--copies", type=int, default=50, help="damaged copies per dataset")
    fz.add_argument("--seed", type=int, default=0)
    fz.add_argument("--out", help="CSV, one row per damaged copy and verify mode")
    fz.add_argument("--timeout", type=float, default=30.0,
                    help="seconds per read before it counts as a hang")
    fz.add_argument("--workers", type=positive_int, default=2)
    fz.add_argument("--formats", nargs="+")
    fz.add_argument("--quiet", action="store_true")
    fz.set_defaults(func=_fuzz)

    pl = sub.add_parser("plot", help="regenerate every figure from a results directory")
    pl.add_argument("results_dir")
    pl.set_defaults(func=_plot)

    ds = sub.add_parser("describe-set", help="measure the ImageNet-like JPEG set: quantiles of "
                        "width, height and bytes, as a Markdown table")
    ds.add_argument("--profile", default="small", choices=sorted(data_gen.PROFILES),
                    help="whose set (the images are the same in every profile; it has more)")
    ds.add_argument("--samples", type=positive_int, default=300, help="images measured")
    ds.add_argument("--write", help="rewrite the table in this page (docs/imagenet-like.md)")
    ds.set_defaults(func=_describe_set)

    r = sub.add_parser("readme", help="rewrite the README's findings block from results")
    r.add_argument("results_dir", help="e.g. results/reference")
    r.add_argument("--readme", default="README.md")
    r.set_defaults(func=_readme)
    return p


def _recipes(args: argparse.Namespace) -> int:
    from .report.recipes import recipe_text, recipes_table
    from .text import markdown_table

    if args.name is None:
        print(markdown_table(recipes_table()))
    else:
        print(recipe_text(args.name))
    return 0


def _recipes_parser(sub) -> None:
    from .recipes import RECIPES

    r = sub.add_parser("recipes", help="every training input pipeline measured: its layout, "
                                       "decoder, transform, loader and where it cannot serve; "
                                       "with NAME, one recipe in full with its code")
    r.add_argument("name", nargs="?", choices=list(RECIPES), metavar="NAME",
                   help=f"one of: {', '.join(RECIPES)}")
    r.set_defaults(func=_recipes)


def _advise_parser(sub) -> None:
    from .report.advise import DISK_KINDS, IMAGE_KINDS, RESIZE_FILTERS, STORAGES, WORKLOADS

    a = sub.add_parser(
        "advise", help="which format, loader and cores for your images, storage and "
        "accelerators: answered from measured results plus the capacity model")
    a.add_argument("--images", choices=IMAGE_KINDS, help="what the samples are")
    a.add_argument("--count", type=int, help="how many samples")
    a.add_argument("--mean-bytes", type=float, help="mean stored bytes of a sample")
    a.add_argument("--dataset", type=Path,
                   help="a directory written by storebench import: the images, count and "
                        "mean bytes from its manifest")
    a.add_argument("--storage", choices=STORAGES, default="local",
                   help="where the data lives (default: local)")
    a.add_argument("--rtt-ms", type=float, help="round trip to nfs or s3 storage, ms")
    a.add_argument("--disk", choices=DISK_KINDS,
                   help="the local disk's kind; not given, the measured disk's is assumed")
    a.add_argument("--resize", choices=RESIZE_FILTERS, default="antialiased",
                   help="the training crop's resize filter: antialiased (Pillow's and "
                        "torchvision's, the default) or plain (tf.image.resize's); recipes "
                        "are compared within one filter")
    a.add_argument("--ram-gb", type=float, help="RAM per node, GB")
    a.add_argument("--cores", type=int, help="CPU cores per node")
    a.add_argument("--accelerators", type=int, default=1, help="accelerators per node")
    a.add_argument("--nodes", type=int, default=1)
    demand = a.add_mutually_exclusive_group()
    demand.add_argument("--demand", type=float, metavar="SAMPLES_PER_S",
                        help="samples/s each accelerator consumes")
    demand.add_argument("--workload", metavar="NAME",
                        help=f"a named demand: {', '.join(sorted(WORKLOADS))}")
    a.add_argument("--results", type=Path, default=Path("results/reference"),
                   help="the measured results to answer from (default: results/reference)")
    a.add_argument("--json", action="store_true", help="the same answer as one JSON object")
    a.add_argument("--measure", action="store_true",
                   help="time the recipes the answer names and its runner-up on this machine "
                        "(over --dataset, else 2,000 training-set images built once), in "
                        "RAM, and answer again with those rates")
    a.add_argument("--measure-samples", type=int, metavar="N",
                   help="with --measure: the images read per repeat (default 2,000)")
    a.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT,
                   help="with --measure: where the training-set images are built")
    a.set_defaults(func=_advise)


def main(argv: list[str] | None = None) -> int:
    from .formats import DatasetError

    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("storebench: interrupted; finished work is kept", file=sys.stderr)
        return 130
    except (MemoryError, RecursionError) as err:
        # A dataset or folder that asks for more than this machine has, or nests deeper than
        # Python recurses: one line, never a traceback (docs/security.md).
        what = "out of memory" if isinstance(err, MemoryError) else "nested too deeply"
        print(f"storebench {args.command}: {what} ({type(err).__name__}): the input is larger "
              "or deeper than storebench accepts", file=sys.stderr)
        return 2
    except (KeyError, ValueError, TypeError, OSError, DatasetError) as err:
        # User errors (a bad name, a missing or unwritable path, a damaged dataset) end in
        # one line and exit code 2, never a traceback.
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        if isinstance(err, OSError) and err.filename and str(err.filename) not in str(message):
            message = f"{err.filename}: {err.strerror or message}"
        print(f"storebench {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
