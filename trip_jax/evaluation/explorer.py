"""The explorer page: one self-contained HTML file per report set, every pair as a card.

``write_page(path, title, records, ...)`` writes ``NAME.html`` beside a report set: the scores and
plots at the top, a card per pair with filters and search; it opens from disk, the pairs inline
as JSON rendered by ``templates/explorer.js``. Details: docs/explorer.md.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jinja2
from etils import epath

from trip_jax.data.types import StoryPair
from trip_jax.runtime.paths import to_jsonable, write_atomic
from trip_jax.evaluation.reports import pct

TEMPLATE = "explorer.html.j2"
# Outcome of a pair, tier by tier: the first tier it fails, or "verifiable".
OUTCOMES: tuple[str, ...] = ("wrong story", "inconsistent", "unverifiable", "verifiable")
# The 8 failure modes of Figure 3 in metrics.tiered_metrics' order: (story, conflict, states).
FAILURE_MODES: tuple[tuple[bool, bool, bool], ...] = tuple(
    itertools.product((True, False), repeat=3))
TIERS: tuple[tuple[str, str], ...] = (("accuracy", "Accuracy"), ("consistency", "Consistency"),
                                      ("verifiability", "Verifiability"))


def outcome(flags: Mapping[str, Any]) -> str:
    """The first tier a pair fails (``OUTCOMES``) from its ``correct`` / ``consistent`` /
    ``verifiable`` flags."""
    if not flags["correct"]:
        return OUTCOMES[0]
    if not flags["consistent"]:
        return OUTCOMES[1]
    return OUTCOMES[3] if flags["verifiable"] else OUTCOMES[2]


def failure_mode_name(mode: tuple[bool, bool, bool]) -> str:
    """'story ✓ · conflict ✗ · states ✗'."""
    return " · ".join(f"{tier} {'✓' if right else '✗'}"
                      for tier, right in zip(("story", "conflict", "states"), mode, strict=True))


def state_mark(state: Mapping[str, Any]) -> str:
    """'wrong' / 'right' (a nontrivial prediction the metric checks), 'missed' (a gold state the
    model left trivial, which the metric does not count)."""
    if not state["counted"]:
        return "missed"
    return "wrong" if state["wrong"] else "right"


def _scored_card(record: Mapping[str, Any], pair: StoryPair,
                 curated: set[str] | None) -> dict[str, Any]:
    """The card of an evaluated or scored pair: gold beside the prediction."""
    explanation = record.get("explanation") or {}
    mode = (record["correct"], record["conflict_correct"], record["states_correct"])
    card = {"id": record["pair_id"], "cur": None if curated is None else pair.pair_id in curated,
            "lab": record["label"], "pred": record["predicted_story"],
            "out": outcome(record), "fm": FAILURE_MODES.index(mode),
            "s": [list(story.sentences) for story in pair.stories],
            "gc": record["gold_conflict"], "pc": record["predicted_conflict"],
            "ex": explanation.get("text", ""),
            "st": [[s["entity"], s["attribute"], s["side"], s["sentence"], s["gold_value"],
                    s["predicted_value"], state_mark(s)]
                   for s in record.get("deciding_states", ())],
            "dec": {method: outcome(flags)
                    for method, flags in record.get("by_decoding", {}).items()}}
    if record.get("missing"):
        card["note"] = "missing from the predictions file: counted wrong at every tier"
    return {**card, **_votes(record)}


def _votes(record: Mapping[str, Any]) -> dict[str, Any]:
    """An ensemble's member votes (``ensemble.votes``): "mv" [[name, story, conflict, outcome
    or None]], "agr" whether all agree; nothing for one model."""
    if "members" not in record:
        return {}
    return {"mv": [[m["name"], m["story"], m["conflict"],
                    outcome(m) if "correct" in m else None] for m in record["members"]],
            "agr": bool(record["members_agree"])}


def _predicted_card(record: Mapping[str, Any]) -> dict[str, Any]:
    """The card of a ``--mode=predict`` answer (no gold), or of a line it skipped."""
    card: dict[str, Any] = {"id": str(record["id"]) if record.get("id") is not None
                            else f"line-{record['line']}"}
    if "error" in record:
        return {**card, "s": [[], []], "note": f"line {record['line']} skipped: {record['error']}"}
    conflict = record["conflict"]
    return {**card, "pred": record["plausible_story"], "s": [list(s) for s in record["stories"]],
            "ec": [conflict["evidence"], conflict["breakpoint"]], "weak": not conflict["detected"],
            "ex": record["text"],
            "ps": [[s["entity"], s["attribute"], s["side"], s["sentence"], s["value"]]
                   for s in record["states"]], **_votes(record)}


def pair_cards(records: Iterable[Mapping[str, Any]], pairs: Sequence[StoryPair] | None = None,
               curated: set[str] | None = None) -> list[dict[str, Any]]:
    """One card's data per record, in the records' order (the keys ``templates/explorer.js``
    reads; docs/explorer.md). With ``pairs`` (the records' pairs, matched by ``pair_id``)
    records are an evaluation's or a scoring's, else ``--mode=predict``'s answers. ``curated``:
    the curated pair ids (None: no marker)."""
    if pairs is None:
        return [_predicted_card(record) for record in records]
    by_id = {pair.pair_id: pair for pair in pairs}
    cards = []
    for record in records:
        if record["pair_id"] not in by_id:
            raise KeyError(f"record of pair {record['pair_id']!r}: no such pair in the data given")
        cards.append(_scored_card(record, by_id[record["pair_id"]], curated))
    return cards


def _tier_rows(metrics: Mapping[str, Any], name: str,
               baselines: Mapping[str, Mapping[str, Any]] | None) -> list[list[str]]:
    """[row name, accuracy, consistency, verifiability] of the baselines and the model."""
    rows = {**(baselines or {}), name: metrics}
    return [[row, *(pct(m.get(key)) for key, _ in TIERS)] for row, m in rows.items()]


def _member_rows(metadata: Mapping[str, Any]) -> list[list[str]]:
    """[member name, three tiers] of an ensemble's members, then their mean (min-max)."""
    members = metadata.get("members") or []
    rows = [[f"member {m['name']}", *(pct(m["metrics"][key]) for key, _ in TIERS)]
            for m in members]
    if members:
        spread = metadata["members_spread"]
        rows.append(["members' mean (min–max)", *(
            f"{pct(spread[key]['mean'])} ({pct(spread[key]['min'])}–{pct(spread[key]['max'])})"
            for key, _ in TIERS)])
    return rows


def _decoding_rows(metrics: Mapping[str, Any]) -> list[list[str]]:
    """[decoding, three tiers] for every decoding scored side by side (none for a file)."""
    methods = [key.split("/")[0] for key in metrics if key.endswith("/accuracy")]
    return [[method, *(pct(metrics[f"{method}/{key}"]) for key, _ in TIERS)]
            for method in methods]


def _marker_rows(by_marker: Mapping[str, Any] | None) -> list[list[str]]:
    """[subset, decoding, count, three tiers] of the curated / implicit split."""
    if not by_marker or not by_marker.get("found"):
        return []
    rows = []
    for subset in ("curated", "implicit"):
        half = by_marker[subset]
        for method, tiers in {"(reported)": half, **half.get("by_decoding", {})}.items():
            rows.append([subset, method, str(half["num_pairs"]),
                         *(pct(tiers[key]) for key, _ in TIERS)])
    return rows


def _inline_json(value: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' characters."""
    text = json.dumps(to_jsonable(value), ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _environment() -> jinja2.Environment:
    """The package's templates, HTML-escaped."""
    return jinja2.Environment(loader=jinja2.PackageLoader("trip_jax.evaluation", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True)


def render_page(title: str, cards: Sequence[Mapping[str, Any]], *,
                metrics: Mapping[str, Any] | None = None,
                metadata: Mapping[str, Any] | None = None,
                baselines: Mapping[str, Mapping[str, Any]] | None = None,
                by_marker: Mapping[str, Any] | None = None,
                plots: Mapping[str, bytes] | None = None) -> str:
    """The page's HTML: ``title``; with ``metrics`` (gold known) the tiers of the model and the
    ``baselines``, of every decoding and (``by_marker``) of the curated / implicit pairs;
    ``metadata``'s facts and notes; ``plots`` ({caption: PNG bytes}) inline; then ``cards``
    (``pair_cards``)."""
    metadata = dict(metadata or {})
    facts = [(label, metadata[key]) for key, label in (
        ("model", "model"), ("checkpoint", "checkpoint"), ("checkpoint_step", "checkpoint step"),
        ("protocol", "protocol"), ("predictions_file", "predictions file"),
        ("input", "input")) if metadata.get(key) is not None]
    if metrics is not None:
        facts.append(("decoding", metrics.get("decoding") or "as the file gives"))
    facts.append(("pairs", len(cards)))
    return _environment().get_template(TEMPLATE).render(
        title=title, facts=facts, gold=metrics is not None, tiers=TIERS,
        members=any("mv" in card for card in cards),
        tier_rows=_member_rows(metadata)
        + _tier_rows(metrics, str(metadata.get("model", "model")), baselines)
        if metrics is not None else [],
        decoding_rows=_decoding_rows(metrics) if metrics is not None else [],
        reported_decoding=(metrics or {}).get("decoding"),
        marker=by_marker, marker_rows=_marker_rows(by_marker),
        notes=list(metadata.get("notes", ())),
        plots=[(caption, base64.b64encode(png).decode("ascii"))
               for caption, png in (plots or {}).items()],
        data=_inline_json({"gold": metrics is not None, "pairs": list(cards),
                           "outcomes": OUTCOMES,
                           "modes": [failure_mode_name(m) for m in FAILURE_MODES]}))


def report_plots(paths: Mapping[str, epath.PathLike]) -> dict[str, epath.PathLike]:
    """The plots of a report set for ``write_page`` ({caption: file}), from
    ``reports.write_report``'s paths."""
    return {"Failure modes (Figure 3)": paths["failure_modes_plot"],
            "Correct states by attribute (Figure 5)": paths["attributes_plot"]}


def write_page(path: epath.PathLike, title: str, records: Iterable[Mapping[str, Any]], *,
               pairs: Sequence[StoryPair] | None = None, curated: set[str] | None = None,
               plot_paths: Mapping[str, epath.PathLike] | None = None,
               **summary: Any) -> epath.Path:
    """Writes the explorer page of ``records`` to ``path`` (whole or not at all; local or
    remote). ``pairs`` and ``curated`` as ``pair_cards`` takes them; ``plot_paths`` ({caption:
    PNG file}) are read and inlined; ``summary``: ``render_page``'s keyword arguments
    (``metrics``, ``metadata``, ``baselines``, ``by_marker``)."""
    plots = {caption: epath.Path(p).read_bytes() for caption, p in (plot_paths or {}).items()}
    html = render_page(title, pair_cards(records, pairs, curated), plots=plots, **summary)
    return write_atomic(path, html)
