"""Tests of evaluation reports: files, JSON strictness, tables, plots, predictions, hashes."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from trip_jax.data import schema
from trip_jax.evaluation import metrics, reports
from trip_jax.runtime import paths

E, S, A = 2, 4, schema.NUM_ATTRIBUTES


def scored():
    """Metrics and per-pair records of two hand-built pairs (one verifiable, one wrong story)."""
    conflict = np.zeros((2, 2, E, S), dtype=np.int32)
    conflict[:, 1, 0, [1, 3]] = 1
    pre = np.zeros((2, 2, E, S, A), dtype=np.int32)
    eff = np.zeros_like(pre)
    eff[:, 1, 0, 1, schema.ATTRIBUTE_INDEX["power"]] = 1
    story_label = np.array([0, 0])
    story_pred = np.array([0, 1])
    args = metrics.TieredArrays(story_label, story_pred, conflict, conflict * 0.8, pre, pre, eff,
                                eff)
    scores, outcomes = metrics.scored_pairs(args)
    records = [{"pair_id": f"p{n}", **metrics.outcome_record(outcomes, n)} for n in range(2)]
    return scores, records


def test_write_report_writes_every_file(tmp_path):
    result, records = scored()
    data = tmp_path / "test.jsonl"
    data.write_text("{}\n")
    metadata = {"model": "tiny", "checkpoint_step": 7, "protocol": "dev-trained",
                "data_files": paths.data_file_hashes([data])}
    baseline = {"accuracy": 0.495, "consistency": 0.107, "verifiability": 0.0}
    written = reports.write_report(tmp_path / "eval", "test", result, metadata, records,
                                 baselines={"random": baseline})
    assert sorted(written) == ["attributes_plot", "failure_modes_plot", "json", "markdown",
                             "predictions"]
    document = json.loads(written["json"].read_text())  # strict: NaN shares became null
    assert document["split"] == "test" and document["checkpoint_step"] == 7
    assert document["metrics"]["accuracy"] == 0.5
    assert document["metrics"]["state_contribution"]["wet"]["share"] is None
    assert document["data_files"] == {"test.jsonl": hashlib.sha256(b"{}\n").hexdigest()}
    assert f"- data file `test.jsonl` sha256 `{document['data_files']['test.jsonl']}`" in (
        written["markdown"].read_text())
    assert str(tmp_path) not in written["markdown"].read_text()
    assert document["baselines"]["random"]["consistency"] == 0.107

    md = written["markdown"].read_text()
    assert "| Model | Accuracy (%) | Consistency (%) | Verifiability (%) |" in md
    assert "| random | 49.5 | 10.7 | 0.0 |" in md
    assert "| tiny | 50.0 | 50.0 | 50.0 |" in md
    assert "| random | – | – | – |" in md  # baseline without F1s
    assert "| right | right | right | 1 | 50.0 |" in md
    assert "| wrong | right | right | 1 | 50.0 |" in md
    assert "| power | 100.0 | 100.0 | 2 | 50.0 |" in md
    assert "checkpoint step: 7" in md and "dev-trained" in md

    for key in ("failure_modes_plot", "attributes_plot"):
        assert written[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = written["predictions"].read_text().splitlines()
    assert [json.loads(line)["pair_id"] for line in lines] == ["p0", "p1"]
    assert json.loads(lines[1])["correct"] is False and json.loads(lines[0])["verifiable"]


def test_report_without_records_and_json_conversion(tmp_path):
    result, _ = scored()
    written = reports.write_report(tmp_path, "dev", result)
    assert "predictions" not in written and written["markdown"].exists()
    converted = paths.to_jsonable({"a": np.float32(np.nan), "b": (np.int64(2), np.bool_(True)),
                                     "c": np.arange(2)})
    assert converted == {"a": None, "b": [2, True], "c": [0, 1]}


def test_file_sha256_reads_large_files_in_chunks(tmp_path):
    blob = bytes(range(256)) * 9000  # over one 1 MiB chunk
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    assert paths.file_sha256(path) == hashlib.sha256(blob).hexdigest()
