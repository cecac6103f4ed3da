"""Importing the TRIP authors' pickled models (``python -m trip_jax.convert``).

Fixtures are files in the authors' format: a ``TieredModelPipeline`` and ``ClassificationHead``
registered under the authors' qualified names (``www.model.transformers_ext``) with the authors'
attribute names, around a tiny Hugging Face BertModel / RobertaModel (pooler included), saved
whole with ``torch.save(model)``. Their ``forward`` follows the authors' tiered forward pass for
the paper's ablation (["attributes", "states-logits"]) with transformers 4.x's additive -10000
mask. Equality is checked on real TRIP test pairs.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess
import sys
import types
import zipfile

import jax
import numpy as np
import pytest
import torch
import transformers
from torch import nn

from trip_jax import convert
from trip_jax.data import batching, features, input_pipeline, layouts, schema
from trip_jax.data.tokenizers import load_tokenizer, save_tokenizer, tokenizer_info
from trip_jax.evaluation import metrics
from trip_jax.interop import torch_pickle
from trip_jax.interop import torch_reference as ref
from trip_jax.training import checkpoints

S, CUT, PROJ, LAYERS, HEADS = 7, 16, 16, 2, 4
AUTHORS_MODULE = "www.model.transformers_ext"
pytestmark = pytest.mark.usefixtures("compilation_cache")


class ClassificationHead(nn.Module):
    """The authors' state head: dropout -> dense -> tanh -> dropout -> out_proj."""

    def __init__(self, hidden: int, num_labels: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden, num_labels)
        self.num_labels = num_labels
        self.input_all_tokens = False

    def forward(self, x):
        x = torch.tanh(self.dense(self.dropout(x)))
        return self.out_proj(self.dropout(x))


class TieredModelPipeline(nn.Module):
    """The authors' tiered model with their attribute names (sizes small for the tests)."""

    def __init__(self, embedding, ablation=("attributes", "states-logits"),
                 loss_weights=(0.0, 0.4, 0.4, 0.2, 0.0)):
        super().__init__()
        hidden = embedding.config.hidden_size
        drop = embedding.config.hidden_dropout_prob
        self.embedding = embedding
        self.dropout = nn.Dropout(drop)
        self.num_attributes = schema.NUM_ATTRIBUTES
        self.labels_per_att = dict(enumerate(schema.NUM_CLASSES))
        self.num_state_labels = sum(schema.NUM_CLASSES)
        self.attribute_classifier = nn.Linear(hidden, self.num_attributes)
        self.precondition_classifiers = nn.ModuleList(
            [ClassificationHead(hidden, n, drop) for n in schema.NUM_CLASSES])
        self.effect_classifiers = nn.ModuleList(
            [ClassificationHead(hidden, n, drop) for n in schema.NUM_CLASSES])
        self.states_size = 2 * self.num_state_labels
        self.embedding_proj = nn.Linear(hidden, PROJ)
        self.states_proj = nn.Linear(self.states_size, PROJ)
        self.encoding_size, self.encoding_pad_zeros = 2 * PROJ, 0
        layer = nn.TransformerEncoderLayer(d_model=2 * PROJ, nhead=HEADS,
                                           dim_feedforward=8 * PROJ, dropout=drop,
                                           activation="relu")
        self.detector = nn.TransformerEncoder(layer, num_layers=LAYERS,
                                              enable_nested_tensor=False)
        self.num_sents = S
        self.decoder = nn.Linear(S * 2 * PROJ, S)
        self.ablation = list(ablation)
        self.loss_weights = list(loss_weights)

    def forward(self, input_ids, attention_mask, cell_mask):
        """Inputs [B, 2, E, S, T] (every cell a row), cell_mask [B, 2, E, S]."""
        b, _, e, s, t = input_ids.shape
        mask = attention_mask.reshape(-1, t)
        out = self.embedding(input_ids.reshape(-1, t).long(),
                             attention_mask=ref.legacy_attention_mask(mask)
                             ).last_hidden_state[:, 0]
        pre = [head(out) for head in self.precondition_classifiers]
        eff = [head(out) for head in self.effect_classifiers]
        states = torch.cat(pre + eff, dim=-1).detach()
        x = torch.cat((self.embedding_proj(self.dropout(out)),
                       self.states_proj(self.dropout(states))), dim=-1)
        x = self.dropout(x.reshape(b * 2 * e, s, -1))
        x = self.detector(x.transpose(0, 1)).transpose(0, 1).reshape(b * 2 * e, -1)
        p = torch.sigmoid(self.decoder(self.dropout(x))) * cell_mask.reshape(b * 2 * e, s)
        p = p.reshape(b, 2, e, s)
        grid = (b, 2, e, s)
        return {"pre": [z.reshape(*grid, -1) for z in pre],
                "eff": [z.reshape(*grid, -1) for z in eff],
                "conflict_prob": p, "story_logits": -p.sum(dim=(2, 3)) / 2}


def _register_authors_module():
    for name in ("www", "www.model", AUTHORS_MODULE):
        sys.modules.setdefault(name, types.ModuleType(name))
    for cls in (ClassificationHead, TieredModelPipeline):
        cls.__module__ = AUTHORS_MODULE
        setattr(sys.modules[AUTHORS_MODULE], cls.__name__, cls)


_register_authors_module()


# ------------------------------------------------------------------------------------------
# Fixtures: real test pairs, tokenizers, the pickled models.

@pytest.fixture(scope="module")
def pairs(tiny_config):
    config = tiny_config()
    return input_pipeline.split_pairs(input_pipeline.load_splits(config.data), "test")


@pytest.fixture(scope="module")
def authors_files(tmp_path_factory, pairs):
    """{family: (pickle path, tokenizer dir)}; the RoBERTa config records its tokenizer dir
    as ``_name_or_path`` (no --encoder needed), the BERT one records nothing."""
    root = tmp_path_factory.mktemp("authors")
    out = {}
    for family in ("bert", "roberta"):
        tokenizer = load_tokenizer(f"word_level:{family}",
                                   texts=features.vocabulary_texts(pairs))
        tok_dir = root / f"{family}_tokenizer"
        save_tokenizer(tokenizer, tok_dir)
        info = tokenizer_info(tokenizer)
        common = dict(vocab_size=info.vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, pad_token_id=info.pad_id)
        if family == "bert":
            hf = transformers.BertConfig(max_position_embeddings=32, **common)
        else:
            hf = transformers.RobertaConfig(max_position_embeddings=40, type_vocab_size=1,
                                            **common)
            hf._name_or_path = str(tok_dir)
        hf._attn_implementation = "eager"
        torch.manual_seed(0 if family == "bert" else 1)
        encoder = transformers.AutoModel.from_config(hf, attn_implementation="eager")
        model = TieredModelPipeline(encoder)
        with torch.no_grad():  # no zero biases, no unit scales: every mapping shows
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        path = root / family / "classifiers.pth"
        path.parent.mkdir()
        torch.save(model, path)
        out[family] = (path, tok_dir)
    return out


def dense_batches(pairs, tokenizer):
    encoded = features.encode_pairs(pairs, tokenizer, max_sentences=S, max_length=CUT,
                                    token_types="zeros")
    layout = layouts.Dense(seq_len=CUT, buckets=features.Buckets(8, 4, 8), max_sentences=S,
                           max_length=CUT, token_types="zeros", entity_padding="data_max",
                           num_entities=features.max_entities(encoded))
    return list(layout.batches(encoded, batching.Epoch(4))), encoded[0].pad_id


def pickled_outputs(path, batch, pad_id):
    """The pickled model's own forward (torch.load of the whole model) on a dense batch."""
    model = torch.load(path, weights_only=False).eval()
    inputs = ref.padded_inputs(batch, pad_id=pad_id, seq_len=CUT)
    with torch.no_grad():
        out = model(inputs["input_ids"], inputs["attention_mask"],
                    torch.as_tensor(np.asarray(batch["row_mask"], np.float32)))
    return {"pre": np.concatenate([z.numpy() for z in out["pre"]], -1),
            "eff": np.concatenate([z.numpy() for z in out["eff"]], -1),
            "conflict_prob": out["conflict_prob"].numpy(),
            "story_logits": out["story_logits"].numpy(),
            "pre_pred": np.stack([z.argmax(-1).numpy() for z in out["pre"]], -1),
            "eff_pred": np.stack([z.argmax(-1).numpy() for z in out["eff"]], -1)}


def real_logits(logits):
    """[..., A, C] padded head logits -> [..., sum n_a] (the real classes, attribute-major)."""
    columns = np.flatnonzero(np.arange(max(schema.NUM_CLASSES))[None, :]
                             < np.asarray(schema.NUM_CLASSES)[:, None])
    return np.asarray(logits).reshape(*logits.shape[:-2], -1)[..., columns]


def run_convert(*flags, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "trip_jax.convert", *map(str, flags)],
                          cwd=cwd or convert_repo(), env=env, capture_output=True, text=True,
                          timeout=600)


def convert_repo():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def converted(authors_files, tmp_path_factory):
    """{family: workdir} converted in process; the BERT one with --encoder."""
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for family, (path, tok_dir) in authors_files.items():
        out[family] = root / family
        convert.convert(str(path), str(out[family]),
                        encoder=str(tok_dir) if family == "bert" else None)
    return out


# ------------------------------------------------------------------------------------------
# Equality with the pickled model.

@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_imported_model_equals_the_pickled_models_forward(family, authors_files, converted,
                                                          pairs):
    path, _ = authors_files[family]
    restored = checkpoints.restore_for_eval(str(converted[family]))
    config = restored.config
    assert (config.model.tiered.detector_layers, config.model.tiered.detector_heads,
            config.model.tiered.embedding_projection, config.data.max_sentences) == (
        LAYERS, HEADS, PROJ, S)
    assert config.model.tiered.padding_rows == "encoded" and config.decoding.method == "independent"
    assert restored.meta["encoder_config"]["model_type"] == family
    # The state: every pickled tensor the forward pass uses is in the tree, values unchanged.
    state = torch.load(path, weights_only=False).state_dict()
    params = jax.device_get(restored.params)
    np.testing.assert_array_equal(params["detector"]["conflict_out"]["kernel"],
                                  state["decoder.weight"].numpy().T)
    np.testing.assert_array_equal(params["state_heads"]["heads"]["out_proj"]["kernel"][25, :, :3],
                                  state["effect_classifiers.5.out_proj.weight"].numpy().T[:, :3])
    np.testing.assert_array_equal(
        params["encoder"]["embeddings"]["word_embeddings"]["embedding"],
        state["embedding.embeddings.word_embeddings.weight"].numpy())

    batches, pad_id = dense_batches(pairs, restored.tokenizer)
    apply = jax.jit(restored.model.apply)
    compared = 0
    for batch in batches:
        ours = jax.device_get(apply({"params": params}, batch))
        theirs = pickled_outputs(path, batch, pad_id)
        real = np.asarray(batch["row_mask"], bool)
        pair = np.asarray(batch["pair_mask"], bool)
        np.testing.assert_allclose(ours["conflict_prob"][pair], theirs["conflict_prob"][pair],
                                   atol=1e-4)
        np.testing.assert_allclose(ours["story_logits"][pair], theirs["story_logits"][pair],
                                   atol=1e-4)
        np.testing.assert_allclose(real_logits(ours["pre_logits"])[real], theirs["pre"][real],
                                   atol=1e-4)
        np.testing.assert_allclose(real_logits(ours["eff_logits"])[real], theirs["eff"][real],
                                   atol=1e-4)
        # Decoded predictions: identical.
        np.testing.assert_array_equal(ours["story_pred"][pair],
                                      theirs["story_logits"][pair].argmax(-1))
        np.testing.assert_array_equal(ours["pre_pred"][real], theirs["pre_pred"][real])
        np.testing.assert_array_equal(ours["eff_pred"][real], theirs["eff_pred"][real])
        np.testing.assert_array_equal(ours["conflict_prob"][pair] >= 0.5,
                                      theirs["conflict_prob"][pair] >= 0.5)
        compared += int(pair.sum())
    assert compared == len(pairs) == 8


def test_convert_then_evaluate_gives_the_pickled_models_predictions(
        authors_files, pairs, tmp_path, data_dir, main_job_env):
    """The commands a user runs: convert (RoBERTa: the tokenizer named by the pickle), then
    ``--mode=evaluate`` with the printed command; each pair's story, conflicting sentences and
    tier outcome equal what the pickled model decodes; ``--mode=predict`` on the same pairs
    gives its story scores."""
    path, tok_dir = authors_files["roberta"]
    workdir = tmp_path / "run"
    env = main_job_env()
    result = run_convert(f"--authors_model={path}", f"--workdir={workdir}", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "embedding.pooler.dense.weight" in result.stdout
    assert "attribute_classifier.weight" in result.stdout
    command = result.stdout.split("evaluate it with: ", 1)[1].split()
    assert command[:3] == ["python", "-m", "trip_jax.main"]
    assert command[3] == "--config=configs/roberta.py"
    evaluated = subprocess.run(
        [sys.executable, *command[1:], f"--config.data.data_dir={data_dir}",
         "--config.data.max_pairs=8", "--config.train.eval_batch_size=4"],
        cwd=convert_repo(), env=env, capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    # The encoder is a local directory (the tokenizer's): the reports name it by its folder.
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["encoder"] == str(tok_dir)
    name = f"{tok_dir.name} ({saved['recipe']}, seed {saved['train']['seed']})"
    report = (workdir / "eval" / "test.selected-0.md").read_text()
    page = (workdir / "eval" / "test.selected-0.html").read_text()
    assert f"- model: {name}\n" in report and f"| {name} |" in report and name in page
    assert str(tok_dir) not in report + page
    lines = (workdir / "eval" / "test.selected-0.predictions.jsonl").read_text().splitlines()
    records = {r["pair_id"]: r for r in map(json.loads, lines)}
    assert len(records) == len(pairs) == 8

    # --mode=predict on the same pairs (entities given): the pickled model's story scores.
    request = tmp_path / "pairs.jsonl"
    request.write_text("".join(json.dumps({
        "id": p.pair_id, "stories": [list(s.sentences) for s in p.stories],
        "entities": [list(s.entities) for s in p.stories]}) + "\n" for p in pairs))
    predicted = subprocess.run(
        [sys.executable, *command[1:-2], "--mode=predict", f"--input={request}",
         "--config.train.eval_batch_size=4"],
        cwd=convert_repo(), env=env, capture_output=True, text=True, timeout=600)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    answers = {a["id"]: a for a in map(json.loads, (workdir / "predict" / "pairs.jsonl")
                                       .read_text().splitlines())}
    assert len(answers) == 8

    restored = checkpoints.restore_for_eval(str(workdir))
    batches, pad_id = dense_batches(pairs, restored.tokenizer)
    encoded_ids = [p.pair_id for p in pairs]
    seen = 0
    for batch in batches:
        theirs = pickled_outputs(path, batch, pad_id)
        pair = np.asarray(batch["pair_mask"], bool)
        arrays = metrics.TieredArrays(
            story_label=batch["story_label"][pair],
            story_pred=theirs["story_logits"][pair].argmax(-1),
            conflict_label=batch["conflict_label"][pair],
            conflict_prob=theirs["conflict_prob"][pair],
            pre_label=batch["pre_label"][pair], pre_pred=theirs["pre_pred"][pair]
            * batch["row_mask"][pair][..., None],
            eff_label=batch["eff_label"][pair], eff_pred=theirs["eff_pred"][pair]
            * batch["row_mask"][pair][..., None],
            mask=batch["row_mask"][pair])
        outcomes = metrics.pair_outcomes(arrays)
        for n, index in enumerate(np.asarray(batch["pair_index"])[pair]):
            record = records[encoded_ids[int(index)]]
            expected = metrics.outcome_record(outcomes, n)
            assert record["predicted_story"] == int(arrays.story_pred[n])
            answer = answers[encoded_ids[int(index)]]
            assert answer["plausible_story"] == int(arrays.story_pred[n])
            np.testing.assert_allclose(answer["story_logits"],
                                       theirs["story_logits"][pair][n], atol=1e-4)
            for key in ("predicted_conflict", "gold_conflict", "correct", "consistent",
                        "verifiable"):
                assert record[key] == expected[key], (record["pair_id"], key)
            seen += 1
    assert seen == 8


# ------------------------------------------------------------------------------------------
# Other module paths, other files.

def rewrite_pickle(path, out, replace: dict[bytes, bytes] | None = None,
                   data: bytes | None = None, cut_storages: bool = False):
    """A copy of the torch zip ``path`` at ``out`` with data.pkl's bytes replaced (or every
    tensor storage cut to 8 bytes)."""
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            content = source.read(item.filename)
            if cut_storages and "/data/" in item.filename:
                content = content[:8]
            if item.filename.endswith("data.pkl"):
                if data is not None:
                    content = data
                for old, new in (replace or {}).items():
                    assert old in content
                    content = content.replace(old, new)
            target.writestr(item, content)
    return out


def test_transformers_4_2_module_paths_load(authors_files, converted, tmp_path):
    """transformers 4.2.2's layout: flat module paths, and the activation a plain function
    attribute (torch.nn.functional.gelu, pickled as torch._C._nn.gelu) instead of a GELUActivation module."""
    path, tok_dir = authors_files["bert"]
    model = torch.load(path, weights_only=False)
    for layer in model.embedding.encoder.layer:
        del layer.intermediate.intermediate_act_fn
        layer.intermediate.intermediate_act_fn = torch.nn.functional.gelu
    torch.save(model, tmp_path / "classifiers.pth")
    old = rewrite_pickle(tmp_path / "classifiers.pth", tmp_path / "old.pth", {
        b"transformers.models.bert.modeling_bert\n": b"transformers.modeling_bert\n",
        b"transformers.models.bert.configuration_bert\n": b"transformers.configuration_bert\n"})
    data = zipfile.ZipFile(old).read("classifiers/data.pkl")
    globals_ = {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert "transformers.modeling_bert BertModel" in globals_
    assert "torch._C._nn gelu" in globals_  # torch.nn.functional.gelu
    assert not any("GELUActivation" in g for g in globals_)
    convert.convert(str(old), str(tmp_path / "run"), encoder=str(tok_dir))
    new = jax.device_get(checkpoints.restore_for_eval(str(tmp_path / "run")).params)
    reference = jax.device_get(checkpoints.restore_for_eval(str(converted["bert"])).params)
    jax.tree.map(np.testing.assert_array_equal, new, reference)


def test_reader_never_imports_or_runs_what_the_pickle_names(authors_files):
    path, _ = authors_files["bert"]
    before = set(sys.modules)
    loaded = torch_pickle.load(path)
    assert loaded.qualname == f"{AUTHORS_MODULE}.TieredModelPipeline"
    assert not {m for m in set(sys.modules) - before if m.startswith(("www", "transformers"))}


def test_the_converter_runs_without_torch(authors_files, converted, tmp_path):
    """torch is a test dependency only: with ``import torch`` failing, the same workdir."""
    path, tok_dir = authors_files["bert"]
    workdir = tmp_path / "run"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trip_jax import convert\n"
            f"convert.convert({str(path)!r}, {str(workdir)!r}, encoder={str(tok_dir)!r})\n"
            "assert sys.modules['torch'] is None\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=convert_repo(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    new = jax.device_get(checkpoints.restore_for_eval(str(workdir)).params)
    reference = jax.device_get(checkpoints.restore_for_eval(str(converted["bert"])).params)
    jax.tree.map(np.testing.assert_array_equal, new, reference)


class _System:
    """Pickles as ``os.system(COMMAND)``."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _bad_files(authors_files, tmp_path):
    path, tok_dir = authors_files["bert"]
    marker = tmp_path / "EXECUTED"
    not_torch = tmp_path / "notes.pth"
    not_torch.write_text("not a model\n")
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    evil = rewrite_pickle(path, tmp_path / "evil.pth",
                          data=pickle.dumps(_System(f"touch {marker}"), protocol=2))
    short = rewrite_pickle(path, tmp_path / "short.pth", cut_storages=True)
    heads = tmp_path / "encoder_only.pth"
    torch.save(torch.load(path, weights_only=False).embedding, heads)
    deberta = rewrite_pickle(path, tmp_path / "deberta.pth", {
        b"transformers.models.bert.configuration_bert\nBertConfig":
        b"transformers.models.deberta.configuration_deberta\nDebertaConfig"})
    held = tmp_path / "held"
    (held / "checkpoints").mkdir(parents=True)
    return marker, {
        "not_torch": ([not_torch, tmp_path / "w1"], "not a torch.save file"),
        "truncated": ([truncated, tmp_path / "w2"], "not a torch.save file"),
        "short_storages": ([short, tmp_path / "w6"], "reaches past its storage"),
        "os_system": ([evil, tmp_path / "w3"], "names posix.system"),
        "no_heads": ([heads, tmp_path / "w4"], "without precondition/effect state heads"),
        "deberta": ([deberta, tmp_path / "w5"], "unsupported encoder family"),
        "held_workdir": ([path, held], "already holds checkpoints"),
    }, tok_dir


@pytest.mark.parametrize("case", ["not_torch", "truncated", "short_storages", "os_system",
                                  "no_heads", "deberta", "held_workdir"])
def test_bad_files_are_one_line_exit_2_and_nothing_written(case, authors_files, tmp_path):
    marker, cases, tok_dir = _bad_files(authors_files, tmp_path)
    (source, workdir), message = cases[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run_convert(f"--authors_model={source}", f"--workdir={workdir}",
                         f"--encoder={tok_dir}")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    if case == "held_workdir":
        assert sorted(p.name for p in workdir.iterdir()) == ["checkpoints"]
