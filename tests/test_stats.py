"""Table-1 statistics: counts on the shared TRIP copies and on a hand-made pair list."""

from __future__ import annotations

import json

import pytest

from trip_jax.data import readers, record_checks
from trip_jax.datatools import stats
from trip_jax.datatools import __main__ as data_command


def main(argv: list[str]) -> int:
    """``python -m trip_jax.datatools ARGV``, in process: parse, then run."""
    return data_command.main(data_command.parse_flags(["trip_jax.datatools", *argv]))


def test_shared_plausible_story_is_counted_once(fx, tmp_path):
    pairs = readers.read_pairs(fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records()))
    got = stats.split_stats(pairs)
    # Both pairs share the plausible story and the implausible text: one story of each kind.
    assert got["pairs"] == 2 and got["plausible_stories"] == 1 and got["implausible_stories"] == 1
    assert got["avg_sentences"] == 3.0 and got["avg_entities"] == 2.0
    assert got["avg_sentence_length_words"] == pytest.approx((4 + 4 + 4 + 4 + 4 + 5) / 6, abs=1e-4)
    assert got["conflicting_sentence_pairs"] == 1 and got["avg_conflicting_sentence_pairs"] == 1.0
    # Per story: "ball" is moveable (label 2) before and after each of its 3 sentences.
    assert got["physical_state_labels"] == 2 * 3 * 2
    assert got["physical_state_annotations"] == 2 * 3


def test_shared_data_matches_table_1(capsys, data_dir):
    with pytest.warns(record_checks.TripDataWarning, match="5 stories have states for fewer"):
        assert main(["stats", f"--data_dir={data_dir}", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == {"dev", "test"}  # subset files are not taken for splits
    assert (got["dev"]["plausible_stories"], got["dev"]["implausible_stories"]) == (152, 322)
    assert (got["test"]["plausible_stories"], got["test"]["implausible_stories"]) == (153, 351)
    assert got["dev"]["pairs"] == 322 and got["test"]["pairs"] == 351
    assert round(got["dev"]["avg_sentences"], 1) == 5.0
    assert round(got["test"]["avg_sentences"], 1) == 5.1
    assert round(got["dev"]["avg_sentence_length_words"], 1) == 8.0
    assert got["dev"]["conflicting_sentence_pairs"] == 322
    assert got["dev"]["physical_state_labels"] == 37908
    assert got["test"]["physical_state_annotations"] == 21310


def test_table_output_and_missing_split_note(capsys, monkeypatch, data_dir):
    monkeypatch.setenv(readers.DATA_DIR_ENV, data_dir)
    with pytest.warns(record_checks.TripDataWarning):
        assert main(["stats"]) == 0
    out = capsys.readouterr().out
    assert "not found: train" in out
    plausible_row = next(line for line in out.splitlines() if line.startswith("# plausible"))
    assert plausible_row.split()[-2:] == ["152", "153"]


def test_stats_without_data_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(readers.DATA_DIR_ENV, raising=False)
    assert main(["stats"]) == 1
    assert "TRIP_DATA_DIR" in capsys.readouterr().err
    assert main(["stats", f"--data_dir={tmp_path}"]) == 1
    assert "no TRIP split files" in capsys.readouterr().err
