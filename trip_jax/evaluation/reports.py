"""Evaluation reports: metrics as JSON and Markdown tables, plots, predictions, data-file hashes.

``write_report(out_dir, split, metrics, metadata, records)`` writes ``SPLIT.json``, ``SPLIT.md``,
two plots and ``SPLIT.predictions.jsonl``, each whole or not at all and anywhere ``etils.epath``
reaches; plots never touch pyplot's global state. Details: README.md#evaluation-and-explanations.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from etils import epath
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from trip_jax.data import schema
from trip_jax.evaluation import decoding
from trip_jax.runtime.paths import to_jsonable, write_atomic

RIGHT, WRONG = "#4c9a5b", "#c8553d"


def write_predictions(path: epath.PathLike,
                      records: Iterable[Mapping[str, Any]]) -> epath.Path:
    """Writes one compact JSON object per line (e.g. ``metrics.outcome_record`` + an
    explanation), the whole file at once (``paths.write_atomic``)."""
    return write_atomic(path, "".join(json.dumps(to_jsonable(record), allow_nan=False,
                                                 separators=(",", ":")) + "\n"
                                      for record in records))


def pct(value: Any) -> str:
    """A fraction as a percentage with one decimal, or '–' when missing/undefined."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{100 * value:.1f}"


def markdown_summary(split: str, metrics: Mapping[str, Any], metadata: Mapping[str, Any],
                     baselines: Mapping[str, Mapping[str, Any]] | None = None,
                     by_marker: Mapping[str, Any] | None = None) -> str:
    """Returns the Markdown report: run facts, Tables 2-4 layout, failure modes, attributes.

    ``metadata`` keys shown when present: ``model`` (row name, default "model"),
    ``checkpoint_step``, ``checkpoint``, ``protocol``, ``data_files`` ({path: sha256}),
    ``notes`` (lines listed under "Notes", e.g. what a scored file could not give),
    ``story_loss_weight`` (0 marks the decodings whose story choice is then untrained),
    an ensemble's ``members``, ``members_spread`` and ``members_agree`` (``_members_table``).
    ``baselines`` ({row name: metrics-like dict}) adds comparison rows, e.g. the random baseline;
    ``by_marker`` (``trip_jax.data.curated.marker_split``) the curated / implicit table.
    """
    name = str(metadata.get("model", "model"))
    rows = {**(baselines or {}), name: metrics}
    lines = [f"# TRIP evaluation: {split}", ""]
    for key, label in (("model", "model"), ("checkpoint", "checkpoint"),
                       ("checkpoint_step", "checkpoint step"), ("protocol", "protocol")):
        if key in metadata:
            lines.append(f"- {label}: {metadata[key]}")
    lines.append(f"- pairs: {metrics['num_pairs']}")
    for path, digest in metadata.get("data_files", {}).items():
        lines.append(f"- data file `{path}` sha256 `{digest}`")
    if metadata.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {note}" for note in metadata["notes"]]
    lines += ["", "## Tiered metrics (layout of Tables 2-3)", "",
              "| Model | Accuracy (%) | Consistency (%) | Verifiability (%) |",
              "|---|---:|---:|---:|"]
    for row, m in rows.items():
        lines.append(f"| {row} | {pct(m.get('accuracy'))} | {pct(m.get('consistency'))} "
                     f"| {pct(m.get('verifiability'))} |")
    lines += _members_table(metrics, metadata)
    lines += _decoding_table(metrics, metadata.get("story_loss_weight"))
    lines += _marker_table(by_marker)
    lines += ["", "## Low-level tasks, macro-F1 (layout of Table 4)", "",
              "| Model | Prec. F1 (%) | Eff. F1 (%) | Confl. F1 (%) |", "|---|---:|---:|---:|"]
    for row, m in rows.items():
        lines.append(f"| {row} | {pct(m.get('precondition_f1'))} | {pct(m.get('effect_f1'))} "
                     f"| {pct(m.get('conflict_f1'))} |")
    lines += ["", "## Failure modes (Figure 3)", "",
              "| Story | Conflict | States | Pairs | Share (%) |", "|---|---|---|---:|---:|"]
    for mode in metrics["failure_modes"]:
        marks = ["right" if mode[k] else "wrong" for k in ("story", "conflict", "states")]
        lines.append(f"| {' | '.join(marks)} | {mode['count']} | {pct(mode['fraction'])} |")
    lines += _tier_loss_tables(metrics)
    lines += ["", "## Per attribute (Figure 5)", "",
              "Correct states: nontrivial (non-zero, non-default) correct predictions, "
              "preconditions and effects; in conflicts: the share of them at the evidence or "
              "breakpoint sentence of a consistent pair's implausible story.", "",
              "| Attribute | Prec. F1 (%) | Eff. F1 (%) | Correct states | In conflicts (%) |",
              "|---|---:|---:|---:|---:|"]
    for attr in schema.ATTRIBUTES:
        c = metrics["state_contribution"][attr]
        lines.append(f"| {attr} | {pct(metrics['precondition_f1_per_attribute'][attr])} "
                     f"| {pct(metrics['effect_f1_per_attribute'][attr])} | {c['correct']} "
                     f"| {pct(c['share'])} |")
    return "\n".join(lines) + "\n"


def _members_table(metrics: Mapping[str, Any], metadata: Mapping[str, Any]) -> list[str]:
    """An ensemble's members (``trip_jax.evaluation.ensemble``): each member's tiers and F1s,
    their mean and min-max, the ensemble's, and the pairs on which every member agrees."""
    members = metadata.get("members")
    if not members:
        return []
    keys = ("accuracy", "consistency", "verifiability", "precondition_f1", "effect_f1")
    lines = ["", f"## Ensemble members ({len(members)})", "",
             "| Member | Workdir | Checkpoint | Accuracy (%) | Consistency (%) "
             "| Verifiability (%) | Prec. F1 (%) | Eff. F1 (%) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for member in members:
        m = member["metrics"]
        lines.append(f"| {member['name']} | {member['workdir']} | {member['checkpoint']}-"
                     f"{member['checkpoint_step']} | " + " | ".join(pct(m[k]) for k in keys)
                     + " |")
    spread = metadata["members_spread"]
    lines.append("| members' mean (min–max) | | | " + " | ".join(
        f"{pct(spread[k]['mean'])} ({pct(spread[k]['min'])}–{pct(spread[k]['max'])})"
        for k in keys) + " |")
    lines.append("| **ensemble** | | | " + " | ".join(f"**{pct(metrics[k])}**" for k in keys)
                 + " |")
    agree = metadata.get("members_agree")
    if agree is not None:
        lines += ["", f"Every member chose the same story and the same conflicting sentences on "
                  f"{agree} of {metrics['num_pairs']} pairs."]
    return lines


def _decoding_table(metrics: Mapping[str, Any], story_loss_weight: float | None = None
                    ) -> list[str]:
    """The tiers of every decoding of the same outputs (trip_jax/evaluation/decoding.py), side
    by side; with ``story_loss_weight`` 0 the decodings of ``decoding.READS_STORY_LOGITS`` other
    than the headline one are marked "story choice untrained", with a note saying why."""
    methods = [key.split("/")[0] for key in metrics if key.endswith("/accuracy")]
    if not methods:
        return []
    # Marked only beside another headline: a run that reports it as its headline (the paper's
    # omit_story model) chose it knowingly.
    untrained = [m for m in methods if story_loss_weight == 0 and m != metrics.get("decoding")
                 and m in decoding.READS_STORY_LOGITS]
    lines = ["", "## Decodings of the same outputs", "",
             f"The scores above are those of the `{metrics.get('decoding')}` decoding.", "",
             "| Decoding | Accuracy (%) | Consistency (%) | Verifiability (%) |",
             "|---|---:|---:|---:|"]
    for method in methods:
        label = f"{method} (story choice untrained)" if method in untrained else method
        lines.append(f"| {label} | {pct(metrics[f'{method}/accuracy'])} "
                     f"| {pct(metrics[f'{method}/consistency'])} "
                     f"| {pct(metrics[f'{method}/verifiability'])} |")
    if untrained:
        lines += ["", f"Story choice untrained ({', '.join(f'`{m}`' for m in untrained)}): the "
                  "run's loss preset gives the story loss weight 0 (as `omit_story` does), so "
                  "no loss trains the story logits this decoding chooses the story by (the "
                  "summed conflict beliefs, −Σp/2); they pick the plausible story only as far "
                  "as the conflict loss happens to shape them, and a wrong story makes the "
                  "pair inconsistent and unverifiable too."]
    return lines


def _marker_table(by_marker: Mapping[str, Any] | None) -> list[str]:
    """The tiers of the curated and the implicit pairs (``curated.marker_split``'s result), of
    the reported decoding and of every decoding; "marker not found" without a marker."""
    if by_marker is None:
        return []
    lines = ["", "## Curated and implicit pairs (HAR's marker)", ""]
    if not by_marker.get("found"):
        return lines + [f"Marker not found (no `{by_marker['marker']}` in the data directory): "
                        "no split by the curated marker."]
    lines += [f"Curated: the pairs of `{by_marker['marker']}`; implicit: the other pairs.", "",
              "| Pairs | Decoding | Count | Accuracy (%) | Consistency (%) | Verifiability (%) |",
              "|---|---|---:|---:|---:|---:|"]
    for subset in ("curated", "implicit"):
        half = by_marker[subset]
        for method, tiers in {"(reported)": half, **half.get("by_decoding", {})}.items():
            cells = " | ".join(pct(tiers[key])
                               for key in ("accuracy", "consistency", "verifiability"))
            lines.append(f"| {subset} | {method} | {half['num_pairs']} | {cells} |")
    return lines


def _tier_loss_tables(metrics: Mapping[str, Any]) -> list[str]:
    """Where pairs are lost tier by tier, and the wrong attributes of consistent but not
    verifiable pairs (``metrics.tiered_metrics``' ``tier_losses``)."""
    losses = metrics.get("tier_losses")
    if not losses:
        return []
    shares = losses["shares"]
    lines = ["", "## Where pairs are lost, tier by tier", "",
             "| Lost at | Share of pairs (%) |", "|---|---:|",
             f"| story (wrong story) | {pct(shares['story'])} |",
             f"| conflict (right story, wrong conflicting pair) | {pct(shares['conflict'])} |",
             f"| states (consistent, states not right) | {pct(shares['states'])} |",
             f"| none (verifiable) | {pct(shares['verifiable'])} |", "",
             f"Consistent but not verifiable: {losses['unverified_pairs']} pairs, "
             f"{losses['unverified_without_states']} of them without any nontrivial state "
             "prediction at the two sentences. Attributes with a wrong nontrivial prediction "
             "(pairs; an effect at the evidence sentence, a precondition at the breakpoint):", "",
             "| Attribute | Wrong effect | Wrong precondition |", "|---|---:|---:|"]
    wrong = losses["unverified_wrong_attributes"]
    for attr in sorted(wrong, key=lambda a: -(wrong[a]["effect"] + wrong[a]["precondition"])):
        if wrong[attr]["effect"] or wrong[attr]["precondition"]:
            lines.append(f"| {attr} | {wrong[attr]['effect']} | {wrong[attr]['precondition']} |")
    return lines


def _save_png(fig: Figure, path: epath.PathLike) -> epath.Path:
    """Renders ``fig`` as PNG bytes and writes them to ``path`` (local or remote)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    return write_atomic(path, buffer.getvalue())


def plot_failure_modes(metrics: Mapping[str, Any], path: epath.PathLike,
                       title: str = "") -> epath.Path:
    """Draws Figure 3's breakdown as a sunburst: story (inner), conflict, states (outer ring)."""
    modes = metrics["failure_modes"]
    counts = np.array([m["count"] for m in modes], dtype=float)  # story, conflict, states order
    if counts.sum() == 0:
        raise ValueError("no pairs in the failure modes")
    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    rings = [(counts.reshape(2, 4).sum(1), [RIGHT, WRONG], 0.3),
             (counts.reshape(4, 2).sum(1), [RIGHT, WRONG] * 2, 0.6),
             (counts, [RIGHT, WRONG] * 4, 0.9)]
    for values, colors, radius in rings:
        ax.pie(values, radius=radius, colors=colors, startangle=90, counterclock=False,
               wedgeprops={"width": 0.3, "edgecolor": "white", "alpha": 0.55 + radius / 2})
    total = counts.sum()
    labels = [f"story {'✓' if m['story'] else '✗'}  conflict {'✓' if m['conflict'] else '✗'}  "
              f"states {'✓' if m['states'] else '✗'}: {100 * m['count'] / total:.1f}%"
              for m in modes]
    handles = [ax.patches[len(ax.patches) - 8 + x] for x in range(8)]
    ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
              title="inner: story · middle: conflict · outer: states", title_fontsize=8)
    ax.set_title(title or "Failure modes")
    ax.set_aspect("equal")
    return _save_png(fig, path)


def plot_attribute_f1(metrics: Mapping[str, Any], path: epath.PathLike,
                      title: str = "") -> epath.Path:
    """Draws Figure 5: per attribute, correct states in/out of detected conflicts, F1 as stars."""
    contribution = metrics["state_contribution"]
    attrs = list(schema.ATTRIBUTES)
    share = np.array([contribution[a]["share"] for a in attrs], dtype=float)
    has = np.isfinite(share)
    inside = np.where(has, share, 0.0)
    outside = np.where(has, 1.0 - share, 0.0)
    f1 = np.array([contribution[a]["f1"] for a in attrs], dtype=float)
    x = np.arange(len(attrs))
    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.bar(x, inside, color=RIGHT, label="in a detected conflict")
    ax.bar(x, outside, bottom=inside, color="#b9c4cc", label="elsewhere")
    ax.scatter(x, f1, marker="*", s=120, color="#1f4e9c", zorder=3,
               label="macro-F1 (precondition, effect mean)")
    for xi, a in zip(x, attrs, strict=True):
        ax.text(xi, 1.02, str(contribution[a]["correct"]), ha="center", fontsize=7)
    ax.set_xticks(x, attrs, rotation=60, ha="right")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("share of correct nontrivial states / F1")
    ax.set_title(title or "Correct states by attribute (numbers: count)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=8)
    return _save_png(fig, path)


def write_report(out_dir: epath.PathLike, split: str, metrics: Mapping[str, Any],
                 metadata: Mapping[str, Any] | None = None,
                 records: Iterable[Mapping[str, Any]] | None = None,
                 baselines: Mapping[str, Mapping[str, Any]] | None = None,
                 stem: str | None = None, by_marker: Mapping[str, Any] | None = None
                 ) -> dict[str, epath.Path]:
    """Writes the JSON, Markdown, plots and (if ``records``) predictions of one split.

    Args:
      out_dir: directory to write into (created if missing), local or remote.
      split: split name, used as the file stem (``test`` -> ``test.json`` ...).
      metrics: ``tiered_metrics(...)`` output.
      metadata: run facts stored in the JSON and shown in the Markdown, e.g. ``model``,
        ``checkpoint_step``, ``protocol``, ``data_files`` (see ``data_file_hashes``).
      records: per-pair JSON-ready dicts for ``SPLIT.predictions.jsonl``.
      baselines: extra table rows ({name: metrics-like dict}), e.g. the random baseline.
      stem: the files' name stem (default ``split``), e.g. ``test.best_accuracy-1016``.
      by_marker: the tiers of the curated and implicit pairs (``curated.marker_split``), stored
        as "by_marker" in the JSON and shown in the Markdown.

    Returns {"json", "markdown", "failure_modes_plot", "attributes_plot"[, "predictions"]: path}.
    """
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metadata = dict(metadata or {})
    stem = stem or split
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md",
             "failure_modes_plot": out / f"{stem}.failure_modes.png",
             "attributes_plot": out / f"{stem}.attributes.png"}
    document = {"split": split, **metadata, "metrics": metrics}
    if baselines:
        document["baselines"] = baselines
    if by_marker is not None:
        document["by_marker"] = by_marker
    write_atomic(paths["json"],
                 json.dumps(to_jsonable(document), indent=2, allow_nan=False) + "\n")
    write_atomic(paths["markdown"],
                 markdown_summary(split, metrics, metadata, baselines, by_marker))
    plot_failure_modes(metrics, paths["failure_modes_plot"], f"Failure modes ({split})")
    plot_attribute_f1(metrics, paths["attributes_plot"],
                      f"Correct states by attribute ({split}; numbers: count)")
    if records is not None:
        paths["predictions"] = write_predictions(out / f"{stem}.predictions.jsonl", records)
    return paths
