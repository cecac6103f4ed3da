"""The curated marker (trip_jax/data/curated.py): matching HAR's curated pairs to a split's pairs, the
tiers of each half, and the split in reports and run summaries; on small files, no training."""

from __future__ import annotations

import json
import pathlib

import pytest

from trip_jax.data import curated
from trip_jax import run_summary
from trip_jax.evaluation import reports
from trip_jax.data import readers
from trip_jax.data.readers import TripDataError

REPO = pathlib.Path(__file__).resolve().parents[1]


def marker_record(first: list[str], second: list[str]) -> dict:
    """A HAR line of a pair whose two stories have these sentences (other fields as HAR's)."""
    return {"example_id": "dev_7", "pair_plausible_story": 0,
            "stories": [{"sentences": first, "plausible": 1}, {"sentences": second}]}


@pytest.fixture
def data(tmp_path, fx):
    """A data dir with dev and test (CGLI, two pairs each) and a dev marker holding the first
    pair only (the second pair has the same two stories in the other order)."""
    fx.write_jsonl(tmp_path / "dev.cgli.jsonl", fx.cgli_records())
    fx.write_jsonl(tmp_path / "test.cgli.jsonl", fx.cgli_records())
    implausible = fx.SENTENCES[:2] + ["John threw the ball again."]
    fx.write_jsonl(tmp_path / "dev_curated.har.jsonl",
                   [marker_record(fx.SENTENCES, implausible)])
    return tmp_path


def test_curated_pairs_are_matched_by_content(data):
    pairs = readers.load_split(str(data), "dev")
    ids, path = curated.curated_ids(pairs, str(data), "dev")
    assert path == str(data / "dev_curated.har.jsonl")
    assert ids == {pairs[0].pair_id} and pairs[0].pair_id == "1-C0-1-C0"
    # No marker for test: None, never an error.
    assert curated.curated_ids(pairs, str(data), "test") == (
        None, str(data / "test_curated.har.jsonl"))


def test_protocol_splits_read_the_marker_of_their_source():
    assert curated.source_split("dev_holdout", "dev_train") == "dev"
    assert curated.source_split("train", "dev_train") == "dev"
    assert curated.source_split("train", "standard") == "train"
    assert curated.source_split("test", "dev_train") == "test"
    assert curated.source_split("dev", "standard") == "dev"


def test_a_damaged_marker_is_an_error_naming_the_file_and_line(data):
    path = data / "dev_curated.har.jsonl"
    path.write_text(path.read_text() + '{"stories": [{"text": []}]}\n')
    with pytest.raises(TripDataError, match=r"dev_curated.har.jsonl: line 2: .*KeyError"):
        curated.read_marker(str(path))
    path.write_text(json.dumps(marker_record(["a"], ["b"]) | {"stories": [{"sentences": []}]}))
    with pytest.raises(TripDataError, match="line 1: field 'stories': expected two"):
        curated.read_marker(str(path))


def records() -> list[dict]:
    """Three pairs' records: a verifiable one, a consistent one, a wrong story."""
    def record(pair_id, correct, consistent, verifiable, independent):
        tiers = {"correct": correct, "consistent": consistent, "verifiable": verifiable}
        return {"pair_id": pair_id, **tiers,
                "by_decoding": {"coherent": tiers, "independent": {
                    "correct": independent, "consistent": False, "verifiable": False}}}
    return [record("a", True, True, True, True), record("b", True, True, False, False),
            record("c", False, False, False, True)]


def test_the_tiers_of_each_half():
    split = curated.marker_split(records(), {"a", "c"}, "test_curated.har.jsonl")
    assert split["found"] and split["marker"] == "test_curated.har.jsonl"
    half = split["curated"]
    assert half["num_pairs"] == 2
    assert (half["accuracy"], half["consistency"], half["verifiability"]) == (0.5, 0.5, 0.5)
    assert half["by_decoding"]["independent"] == {"accuracy": 1.0, "consistency": 0.0,
                                                  "verifiability": 0.0}
    other = split["implicit"]
    assert other["num_pairs"] == 1 and other["verifiability"] == 0.0 and other["accuracy"] == 1.0
    empty = curated.marker_split(records(), set(), "m")["curated"]
    assert empty["num_pairs"] == 0 and empty["accuracy"] is None
    assert curated.marker_split(records(), None, "m") == {"marker": "m", "found": False}


def minimal_metrics() -> dict:
    """The keys ``reports.markdown_summary`` reads, for a report of no particular pairs."""
    per_attribute = {a: 0.5 for a in ("wet",)}
    return {"num_pairs": 3, "accuracy": 2 / 3, "consistency": 2 / 3, "verifiability": 1 / 3,
            "precondition_f1": 0.5, "effect_f1": 0.5, "conflict_f1": 0.5,
            "precondition_f1_per_attribute": per_attribute, "effect_f1_per_attribute":
            per_attribute, "failure_modes": [], "state_contribution": {}}


def test_reports_show_the_halves_or_say_the_marker_was_not_found():
    split = curated.marker_split(records(), {"a", "c"}, "test_curated.har.jsonl")
    table = reports._marker_table(split)
    assert "| curated | (reported) | 2 | 50.0 | 50.0 | 50.0 |" in table
    assert "| curated | independent | 2 | 100.0 | 0.0 | 0.0 |" in table
    assert "| implicit | coherent | 1 | 100.0 | 100.0 | 0.0 |" in table
    missing = reports._marker_table(curated.marker_split(records(), None, "dev_curated.har.jsonl"))
    assert any("Marker not found" in line and "dev_curated.har.jsonl" in line for line in missing)
    assert reports._marker_table(None) == []


def test_write_report_stores_the_split(tmp_path):
    from test_reports import scored

    result, pair_records = scored()
    split = curated.marker_split(pair_records, {"p0"}, "test_curated.har.jsonl")
    paths = reports.write_report(tmp_path, "test", result, {}, pair_records, by_marker=split)
    document = json.loads(paths["json"].read_text())
    assert document["by_marker"]["curated"]["verifiability"] == 1.0
    assert document["by_marker"]["implicit"]["accuracy"] == 0.0
    assert "| implicit | (reported) | 1 | 0.0 | 0.0 | 0.0 |" in paths["markdown"].read_text()
    plain = reports.write_report(tmp_path / "plain", "test", result)  # without: no section
    assert "by_marker" not in json.loads(plain["json"].read_text())
    assert "Curated and implicit" not in plain["markdown"].read_text()


def finished_run(path, by_marker=None, predictions=None):
    """A run directory with what ``run_summary`` reads: reports/test.json (with "by_marker"
    when given), reports/test.predictions.jsonl (when given), metrics.jsonl, config.json."""
    (path / "reports").mkdir(parents=True)
    metrics = {"accuracy": 0.5, "consistency": 0.5, "verifiability": 0.5, "decoding": "coherent",
               "coherent/accuracy": 0.5, "coherent/consistency": 0.5,
               "coherent/verifiability": 0.5, "precondition_f1": 0.6, "effect_f1": 0.6}
    report = {"checkpoint_step": 4, "epoch": 1.0, "metrics": metrics}
    if by_marker is not None:
        report["by_marker"] = by_marker
    (path / "reports" / "test.json").write_text(json.dumps(report))
    if predictions is not None:
        (path / "reports" / "test.predictions.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in predictions))
    (path / "metrics.jsonl").write_text(json.dumps({"step": 4, "split": "wall_time",
                                                    "seconds": 10.0}) + "\n")
    (path / "config.json").write_text(json.dumps({"train": {"seed": 1}}))
    return path


def test_run_summary_splits_by_the_marker(tmp_path, data, fx, monkeypatch):
    monkeypatch.delenv(readers.DATA_DIR_ENV, raising=False)
    stored = curated.marker_split(records(), {"a"}, "test_curated.har.jsonl")
    first = finished_run(tmp_path / "one", by_marker=stored)
    # A report written before the split: from its predictions and the data's test marker.
    pairs = readers.load_split(str(data), "test")
    rows = [{"pair_id": p.pair_id, "correct": True, "consistent": True, "verifiable": n == 0}
            for n, p in enumerate(pairs)]
    second = finished_run(tmp_path / "two", predictions=rows)
    without = run_summary.summarize([first, second])
    assert without["runs"][1]["by_marker"]["found"] is False
    assert "by_marker" not in without["spread"]
    assert "| two | marker not found | marker not found |" in run_summary.markdown(without)
    (data / "test_curated.har.jsonl").write_text(
        (data / "dev_curated.har.jsonl").read_text())  # holds test's first pair
    summary = run_summary.summarize([first, second], str(data))
    derived = summary["runs"][1]["by_marker"]
    assert derived["curated"]["verifiability"] == 1.0
    assert derived["implicit"]["verifiability"] == 0.0
    spread = summary["spread"]["by_marker"]["curated"]["verifiability"]
    assert (spread["min"], spread["max"], spread["mean"]) == (1.0, 1.0, 1.0)
    text = run_summary.markdown(summary)
    assert "| two | 100.0 / 100.0 / 100.0 (1 pairs) | 100.0 / 100.0 / 0.0 (1 pairs) |" in text
    assert "| mean (min–max) |" in text
    assert run_summary.main(run_summary.parse_flags([
        "run_summary", str(first), str(second), f"--out={tmp_path}", f"--data_dir={data}"])) == 0
    assert "Curated and implicit" in (tmp_path / "summary.md").read_text()


def test_run_summary_reads_a_run_of_removed_options(data_dir):
    # A run of the tuned recipe before issue 24's ablation (state_transitions=True; the files of
    # results/archive/minilm_coherent/seed22): its config no longer migrates, its report still
    # summarises, its "reference/..." metrics (issue 45 stage 3's old name) as "independent".
    runs = [REPO / "tests" / "fixtures" / "run_of_removed_options" / "seed22"]
    summary = run_summary.summarize(runs, data_dir)
    assert [r["seed"] for r in summary["runs"]] == [22]
    assert summary["spread"]["coherent"]["accuracy"]["mean"] == pytest.approx(269 / 351)
    assert {"coherent", "independent"} <= set(summary["spread"])
