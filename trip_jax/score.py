"""Scores any system's TRIP predictions with this project's metrics and writes the full report.

``python -m trip_jax.score --predictions=FILE --out=DIR [--format=...] [--split=test] ...`` reads,
matches and scores the entries and writes what ``--mode=evaluate`` writes; any problem with the
input is one line per problem, exit 2, nothing scored. Details: docs/scoring.md.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import flags
from etils import epath

from trip_jax import cli
from trip_jax.data import curated, schema
from trip_jax.evaluation import explain, explorer, metrics, random_baseline, reports
from trip_jax.runtime import paths
from trip_jax.scoring import prediction_formats as formats
from trip_jax.scoring import prediction_matching as matching
from trip_jax.data import readers
from trip_jax.data.record_checks import TripDataWarning
from trip_jax.data.types import StoryPair
from trip_jax.scoring.prediction_formats import Problem

SCHEMES: tuple[str, ...] = ("paper",)
MISSING: tuple[str, ...] = ("error", "wrong")
MAX_PROBLEMS = 50
NOT_APPLICABLE: dict[str, str] = {
    "precondition_f1": "needs a predicted label for every (entity, sentence, attribute) of both "
                       "stories; a predictions file states some states only",
    "effect_f1": "as precondition_f1",
    "conflict_f1": "needs a conflict belief for every (entity, sentence); a predictions file "
                   "names sentences only",
    "conflict_f1_positive": "as conflict_f1",
    "decodings": "the decodings side by side (trip_jax/evaluation/decoding.py) need the model's logits; a "
                 "predictions file holds one set of answers",
}


class ScoreError(ValueError):
    """Bad input to scoring; ``problems`` lists every one found (each names where and field)."""

    def __init__(self, problems: Sequence[Problem], source: str):
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(self.problems)} problem(s), first: {self.problems[0]}")

    def lines(self, limit: int = MAX_PROBLEMS) -> list[str]:
        """One line per problem (at most ``limit``, then a count of the rest)."""
        out = [f"{self.source}: {p}" for p in self.problems[:limit]]
        if len(self.problems) > limit:
            out.append(f"{self.source}: ... and {len(self.problems) - limit} more problems")
        return out


def prediction_arrays(matched: Sequence[matching.Matched], pairs: Sequence[StoryPair]
                      ) -> metrics.TieredArrays:
    """The gold labels of every pair and the matched predictions, as the metrics take them.

    A pair without an entry is predicted wrong: the other story, no conflict, no states. A
    predicted conflicting sentence is flagged for every entity of its story.
    """
    labels = random_baseline.label_arrays(pairs)
    mask = labels["mask"]
    story_pred = 1 - labels["story_label"]
    conflict_prob = np.zeros(mask.shape, dtype=np.float32)
    pre_pred = np.zeros_like(labels["pre_label"])
    eff_pred = np.zeros_like(labels["eff_label"])
    for m in matched:
        pair = pairs[m.n]
        story_pred[m.n] = m.story_pred
        for s in m.entry.conflict:
            conflict_prob[m.n, m.conflict_story, :, s] = mask[m.n, m.conflict_story, :, s]
        entities = pair.stories[m.states_story].entities
        for state in m.entry.states:
            target = pre_pred if state.side == "precondition" else eff_pred
            target[m.n, m.states_story, entities.index(state.entity), state.sentence,
                   schema.ATTRIBUTE_INDEX[state.attribute]] = state.label
    return metrics.TieredArrays(labels["story_label"], story_pred, labels["conflict_label"],
                                conflict_prob, labels["pre_label"], pre_pred, labels["eff_label"],
                                eff_pred, mask)


def _mark_not_applicable(scores: dict[str, Any]) -> dict[str, Any]:
    """The metrics with every F1 set to NaN (written as null / "–"): module docstring."""
    scores = dict(scores)
    for key in ("precondition_f1", "effect_f1", "conflict_f1", "conflict_f1_positive"):
        scores[key] = float("nan")
    for key in ("precondition_f1_per_attribute", "effect_f1_per_attribute"):
        scores[key] = {attr: float("nan") for attr in scores[key]}
    scores["state_contribution"] = {attr: {**value, "f1": float("nan")}
                                    for attr, value in scores["state_contribution"].items()}
    return scores


def _stated(m: matching.Matched, pair: StoryPair) -> dict[str, Any]:
    """The entry's predictions in the data's story order (the minimal format's fields)."""
    return {"plausible_story": m.story_pred, "conflict": list(m.entry.conflict),
            "states_story": m.states_story,
            "states": [{"entity": s.entity, "sentence": s.sentence, "side": s.side,
                        "attribute": s.attribute, "label": s.label,
                        "value": schema.label_name(s.attribute, s.label)}
                       for s in m.entry.states]}


def pair_records(matched: Sequence[matching.Matched], pairs: Sequence[StoryPair],
                 arrays: metrics.TieredArrays, outcomes: dict[str, np.ndarray]
                 ) -> list[dict[str, Any]]:
    """One record per data pair, in data order: id, where in the file, gold story, outcome
    (``metrics.outcome_record``), the stated predictions, the states that decide verifiability
    (``explain.deciding_states``) and, where the conflict is a pair of the story predicted
    implausible, ``explain.explain_pair``'s explanation."""
    by_pair = {m.n: m for m in matched}
    records = []
    for n, pair in enumerate(pairs):
        m = by_pair.get(n)
        record = {"pair_id": pair.pair_id, "source": m.entry.where if m else None,
                  "file_pair_id": m.entry.pair_id if m else None, "label": pair.label,
                  "predicted_story": int(arrays.story_pred[n]),
                  **metrics.outcome_record(outcomes, n)}
        if m is None:
            record["missing"] = True
            records.append(record)
            continue
        record["prediction"] = _stated(m, pair)
        k = 1 - pair.label
        record["deciding_states"] = explain.deciding_states(
            k, record["gold_conflict"], arrays.pre_label[n], arrays.pre_pred[n],
            arrays.eff_label[n], arrays.eff_pred[n], pair.stories[k].entities,
            pair.stories[k].num_sentences)
        if m.entry.flags:
            record["file_flags"] = dict(m.entry.flags)
        if len(m.entry.conflict) == 2 and m.conflict_story == 1 - m.story_pred:
            record["explanation"] = explain.explain_pair(
                m.story_pred, arrays.conflict_prob[n], arrays.pre_pred[n], arrays.eff_pred[n],
                [s.entities for s in pair.stories], [s.sentences for s in pair.stories])
        records.append(record)
    return records


@dataclasses.dataclass
class Scored:
    """The result of ``score_predictions``: metrics, per-pair records, report metadata."""

    scores: dict[str, Any]
    records: list[dict[str, Any]]
    metadata: dict[str, Any]

    def summary(self, split: str) -> str:
        """The one line the command prints."""
        s = self.scores
        return (f"{split}: {s['num_pairs']} pairs, accuracy / consistency / verifiability "
                f"{100 * s['accuracy']:.1f} / {100 * s['consistency']:.1f} / "
                f"{100 * s['verifiability']:.1f} %")


def _position(problem: Problem) -> float:
    """Sort key: the line or element number of a problem; file-level problems last."""
    digits = "".join(c for c in problem.where if c.isdigit())
    return int(digits) if digits else math.inf


def score_predictions(text: str, pairs: Sequence[StoryPair], format: str = "auto",
                      missing: str = "error", scheme: str = "paper", source: str = "predictions"
                      ) -> Scored:
    """Reads, checks, matches and scores a predictions file's ``text`` against ``pairs``.

    Raises ``ScoreError`` listing every problem (module docstring) and ``ValueError`` for an
    unknown ``format``, ``missing`` or ``scheme``.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")
    if missing not in MISSING:
        raise ValueError(f"unknown --missing {missing!r}; expected one of {MISSING}")
    if not text.strip():
        raise ScoreError([Problem("file", "-", "the file is empty")], source)
    if format == "auto":
        format = formats.detect_format(text)
        if format is None:
            raise ScoreError([Problem("line 1", "-", "cannot tell the format from the first "
                                      f"entry; pass --format (one of {formats.FORMATS})")], source)
    entries, problems = formats.read_predictions(text, format)
    matched, match_problems = matching.match_entries(entries, pairs)
    problems += match_problems + matching.check_against_data(matched, pairs)
    absent = matching.missing_pairs(matched, pairs)
    if absent and missing == "error" and entries:
        ids = ", ".join(pairs[n].pair_id for n in absent[:5]) + (", ..." if len(absent) > 5
                                                                  else "")
        problems.append(Problem("file", "-", f"{len(absent)} of the {len(pairs)} pairs of the "
                                f"split are missing ({ids}); pass --missing=wrong to count them "
                                "as wrong" + ("; some may be entries with the problems above"
                                              if problems else "")))
    if problems:
        raise ScoreError(sorted(problems, key=_position), source)
    arrays = prediction_arrays(matched, pairs)
    scores, outcomes = metrics.scored_pairs(arrays)
    scores = _mark_not_applicable(scores)
    found = matching.disagreements(matched, pairs, outcomes)
    how = collections.Counter(m.how for m in matched)
    notes = [f"predictions read from a file ({format} format) and scored with the paper's "
             f"metrics (scheme {scheme}, trip_jax/evaluation/metrics.py); gold labels from the data files "
             "above",
             f"{len(matched)} pairs matched: {how['id']} by id, {how['text']} by the stories' "
             f"text; {sum(m.swapped for m in matched)} given with the stories in the other order"]
    unflaggable = sum(1 for m in matched if m.entry.conflict
                      and not pairs[m.n].stories[m.conflict_story].entities)
    if unflaggable:
        notes.append(f"{unflaggable} pairs name conflicting sentences in a story without "
                     "entities, where the metrics cannot flag a sentence (scored as no conflict)")
    if absent:
        notes.append(f"{len(absent)} pairs of the split are missing from the file and are "
                     "counted as wrong at every tier (--missing=wrong)")
    notes += [f"not applicable: {key} ({why})" for key, why in NOT_APPLICABLE.items()]
    counts = collections.Counter(d["field"].split("[")[0] for d in found)
    by_field = ", ".join(f"{field}: {count}" for field, count in sorted(counts.items()))
    notes.append(f"disagreements between the file's own labels or flags and the data or this "
                 f"scoring: {len(found)}"
                 + (f" ({by_field}; each is listed in the JSON report)" if found else ""))
    metadata = {"format": format, "scheme": scheme, "missing": missing,
                "matching": {"by_id": how["id"], "by_text": how["text"],
                             "stories_swapped": sum(m.swapped for m in matched)},
                "missing_pairs": [pairs[n].pair_id for n in absent],
                "not_applicable": NOT_APPLICABLE, "disagreements": found, "notes": notes}
    return Scored(scores, pair_records(matched, pairs, arrays, outcomes), metadata)


# ------------------------------------------------------------------------------------------
# Command line.

def define_flags(values: flags.FlagValues) -> None:
    """The command's flags (module docstring), defined in ``values``."""
    flags.DEFINE_string("predictions", None, "the predictions file", flag_values=values)
    flags.DEFINE_enum("format", "auto", ("auto", *formats.FORMATS), "the file's format",
                      flag_values=values)
    flags.DEFINE_string("data_dir", None, "TRIP data (default $TRIP_DATA_DIR)",
                        flag_values=values)
    flags.DEFINE_string("data_file", None, "one TRIP file to score against instead of "
                        "--data_dir's split (e.g. a subset such as test_curated.har.jsonl)",
                        flag_values=values)
    flags.DEFINE_string("split", "test", "the split (train/dev/test); with --data_file only "
                        "the report name", flag_values=values)
    flags.DEFINE_enum("scheme", "paper", SCHEMES, "the scoring rule: the paper's metrics (the "
                      "only one)", flag_values=values)
    flags.DEFINE_enum("missing", "error", MISSING, "pairs of the split absent from the file: an "
                      "error, or wrong", flag_values=values)
    flags.DEFINE_string("name", None, "the system's row name in the report", flag_values=values)
    flags.DEFINE_string("out", None, "directory for the report", flag_values=values)
    flags.mark_flags_as_required(["predictions", "out"], flag_values=values)


parse_flags = cli.command_parser(
    define_flags, doc=__doc__,
    check=lambda command: cli.check_paths(command.values, ["predictions"]))


def _load_pairs(args: flags.FlagValues) -> tuple[list[StoryPair], list[str], list[str]]:
    """The split's pairs, the data files read and the readers' warnings (as notes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TripDataWarning)
        if args.data_file:
            path = args.data_file
            pairs = readers.read_pairs(path, split=args.split if os.path.basename(path) ==
                                       readers.RELEASE_FILENAME else None)
        else:
            if args.split not in readers.SPLITS:
                raise readers.TripDataError(f"unknown split {args.split!r}; expected one of "
                                            f"{readers.SPLITS} (read other files with --data_file)")
            data_dir = readers.default_data_dir(args.data_dir)
            path = readers.find_split_files(data_dir).get(args.split, "")
            pairs = readers.load_split(data_dir, args.split)
    notes = [f"data reader: {w.message}" for w in caught
             if issubclass(w.category, TripDataWarning)]
    return pairs, [path], notes


def _marker_split(args: flags.FlagValues, pairs: Sequence[StoryPair],
                  records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``curated.marker_split`` of the scored pairs: the marker of ``--split`` in the data
    directory (that of ``--data_file`` when given); "marker not found" without it."""
    return curated.split_pairs_by_marker(pairs, records, _marker_dir(args), args.split)


def _marker_dir(args: flags.FlagValues) -> str:
    """The directory of the curated marker: that of ``--data_file``, else the data directory."""
    return (os.path.dirname(os.path.abspath(args.data_file)) if args.data_file
            else readers.default_data_dir(args.data_dir))


def main(command: cli.Command) -> int:
    """Runs the parsed command (``parse_flags``); returns the exit status (0, 1 for missing
    data, 2 for bad input)."""
    args = command.values
    try:
        with open(args.predictions, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        print(f"error: --predictions: cannot read {args.predictions}: {err}", file=sys.stderr)
        return cli.USAGE_EXIT_CODE
    try:
        pairs, data_files, reader_notes = _load_pairs(args)
    except readers.TripDataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        scored = score_predictions(text, pairs, args.format, args.missing, args.scheme,
                                   source=args.predictions)
    except ScoreError as err:
        for line in err.lines():
            print(f"error: {line}", file=sys.stderr)
        return cli.USAGE_EXIT_CODE
    name = args.name or f"system ({os.path.basename(args.predictions)})"
    baseline = random_baseline.random_baseline(pairs, seeds=random_baseline.SEEDS)
    metadata = {"model": name, "predictions_file": args.predictions,
                "predictions_sha256": paths.file_sha256(args.predictions),
                "data_files": paths.data_file_hashes(data_files), **scored.metadata}
    metadata["notes"] = metadata["notes"] + reader_notes
    try:
        by_marker = _marker_split(args, pairs, scored.records)
        curated_ids = curated.curated_ids(pairs, _marker_dir(args), args.split)[0]
    except readers.TripDataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    baselines = {random_baseline.report_name(): baseline}
    try:
        written = reports.write_report(epath.Path(args.out), args.split, scored.scores, metadata,
                                       scored.records, baselines=baselines, by_marker=by_marker)
        written["explorer"] = explorer.write_page(
            epath.Path(args.out) / f"{args.split}.html", f"TRIP explorer: {name}, {args.split}",
            scored.records, pairs=pairs, curated=curated_ids,
            plot_paths=explorer.report_plots(written), metrics=scored.scores,
            metadata=metadata, baselines=baselines, by_marker=by_marker)
    except OSError as err:
        print(f"error: --out: cannot write the report to {args.out}: {err}", file=sys.stderr)
        return 1
    print(scored.summary(args.split))
    found = scored.metadata["disagreements"]
    if found:
        print(f"warning: {len(found)} disagreements between the file's own labels or flags and "
              f"the data or this scoring, listed in {written['json']}", file=sys.stderr)
    print(f"wrote {written['markdown']} and the other {args.split}.* reports", file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(main, parse_flags)
