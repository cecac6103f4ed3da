r"""Imports a TRIP authors' saved model into a workdir, reading the pickle without torch.

``python -m trip_jax.convert --authors_model=PATH/classifiers.pth --workdir=W`` writes W as a
training run leaves it (config, tokenizer, ``checkpoints/selected/0``) for ``--mode=evaluate`` /
``predict`` and ``trip_jax.score``; bad input is one line, exit 2. Details: docs/convert.md.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from absl import flags, logging

from trip_jax import cli
from trip_jax.interop import authors_model, torch_pickle
from trip_jax.runtime import paths

STEP = 0
# jax, flax, orbax and transformers are imported once the file has been read and checked, so
# that a bad file is refused in a fraction of a second.


def define_flags(values: flags.FlagValues) -> None:
    """The command's flags, defined in ``values``."""
    flags.DEFINE_string("authors_model", None, "The authors' torch.save(model) file "
                        "(classifiers.pth).", flag_values=values)
    flags.DEFINE_string("workdir", None, "The new workdir to write (must not exist, or be "
                        "empty).", flag_values=values)
    flags.DEFINE_string("encoder", None, "Hub name or directory of the encoder's tokenizer; "
                        "default: the name the pickled encoder config records.",
                        flag_values=values)
    flags.DEFINE_string("config", None, "Config file (PATH[:ARG]) the workdir is evaluated "
                        "with; default configs/FAMILY.py of the pickled encoder.",
                        flag_values=values)
    flags.mark_flags_as_required(["authors_model", "workdir"], flag_values=values)


class ConvertError(ValueError):
    """Bad input to the conversion; the message is the one line shown."""


def check_workdir(workdir: str) -> None:
    """ConvertError when ``workdir`` exists and holds anything (another run's files)."""
    path = Path(workdir)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        held = sorted(p.name for p in path.iterdir())[:4] if path.is_dir() else []
        raise ConvertError(f"--workdir={workdir} already holds {', '.join(held) or 'a file'}; "
                           "pass a new directory (the import writes a fresh run)")


def _config(argument: str | None, model: authors_model.AuthorsModel, encoder: str):
    """The run's typed config: the config file, at exact fidelity, with the pickle's model
    keys (``trip_jax.config.typed``: ConfigError for a value the schema refuses)."""
    from trip_jax.config.typed import typed

    argument = argument or f"configs/{model.model_type}.py"
    config = cli.load_config_file(argument)
    base = importlib.import_module("configs.base")  # importable: the config file just used it
    if base.fidelity_of(config) != "exact" or config.decoding.method != "independent":
        raise ConvertError(f"--config={argument} is not exact fidelity with independent "
                           "decoding, which the authors' model computes")
    config.model.encoder = encoder
    config.model.tokenizer = ""
    config.model.tiered.update(model.tiered)
    config.data.max_sentences = model.max_sentences
    for key, weight in zip(("pre_weight", "eff_weight", "conflict_weight", "story_weight"),
                           model.loss_weights):
        config.loss[key] = weight
    return typed(config), argument


def _overrides(argument: str, config) -> list[str]:
    """``--config.KEY=VALUE`` for each model key where ``config`` (typed) differs from the
    file."""
    from trip_jax.config.migrate import flatten
    from trip_jax.config.typed import as_dict

    fresh = flatten(cli.load_config_file(argument).to_dict())
    mine = flatten(as_dict(config))
    keys = [k for k in mine if k.startswith(("model.", "data.max_sentences"))
            and mine[k] != fresh.get(k)]
    return [f"--config.{k}={mine[k]}" for k in sorted(keys)]


def convert(authors_file: str, workdir: str, *, encoder: str | None = None,
            config_argument: str | None = None) -> dict:
    """Writes ``workdir`` from ``authors_file`` (module docstring); returns {"config_argument",
    "overrides", "dropped", "encoder"}. ConvertError (and the reader's errors, all ValueError)
    for bad input, before anything is written."""
    check_workdir(workdir)
    obj = torch_pickle.load(authors_file)
    model = authors_model.read_pipeline(obj, authors_file)
    import jax
    from flax import traverse_util

    from trip_jax.config.typed import as_dict
    from trip_jax.data import tokenizers
    from trip_jax.models import builders

    name = encoder or model.name_or_path
    if not name:
        raise ConvertError(f"{authors_file}: the pickled encoder config does not name the model "
                           "it was loaded from; pass --encoder=HUB_NAME_OR_DIR (its tokenizer)")
    try:
        tokenizer = tokenizers.load_tokenizer(name)
    except (OSError, ValueError) as err:
        raise ConvertError(f"--encoder={name}: no tokenizer loads from it "
                           f"({str(err).splitlines()[0] if str(err) else type(err).__name__})"
                           ) from None
    hf_config = authors_model.hf_config(model)
    vocab = tokenizers.tokenizer_info(tokenizer).vocab_size
    if vocab > hf_config.vocab_size:
        raise ConvertError(f"--encoder={name}: its tokenizer has {vocab} tokens but the pickled "
                           f"encoder embeds {hf_config.vocab_size}: not this model's tokenizer")
    config, argument = _config(config_argument, model, name)
    tiered_model = builders.build_model(config, hf_config)
    abstract = jax.eval_shape(
        lambda rng: builders.init_params(tiered_model, rng, config.data.max_sentences),
        jax.random.key(0))
    expected = traverse_util.flatten_dict(abstract)
    flat = authors_model.to_params(model, expected, authors_file)
    params = traverse_util.unflatten_dict(flat)
    meta = {"step": STEP, "epoch": None, "protocol": None, "metrics": {},
            "config": as_dict(config),
            "encoder_config": hf_config.to_dict(),
            "imported_from": {"file": os.path.abspath(authors_file),
                              "sha256": paths.file_sha256(authors_file),
                              "ablation": list(model.ablation), "dropped": list(model.dropped)}}
    _write(workdir, config, hf_config, tokenizer, params, meta)
    return {"config_argument": argument, "overrides": _overrides(argument, config),
            "dropped": model.dropped, "encoder": name}


def _write(workdir: str, config, hf_config, tokenizer, params, meta) -> None:
    """Writes the run into a temporary sibling, restores and compares the checkpoint, then
    renames it to ``workdir`` (so a failure leaves nothing at ``workdir``)."""
    import jax
    from flax import traverse_util

    from trip_jax.training import checkpoints

    target = Path(workdir).absolute()
    staging = target.with_name(f".{target.name}.converting")
    if staging.exists():
        shutil.rmtree(staging)
    try:
        checkpoints.write_run_files(str(staging), config, hf_config, tokenizer)
        checkpoints.save_selected(str(staging), STEP, params, meta)
        restored = checkpoints.restore_for_eval(str(staging))
        saved = traverse_util.flatten_dict(jax.device_get(restored.params))
        for path, value in traverse_util.flatten_dict(params).items():
            if not np.array_equal(np.asarray(saved[path]), value):
                raise RuntimeError(f"the saved checkpoint differs at {'/'.join(path)}")
        if target.exists():
            target.rmdir()  # empty: check_workdir passed
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


parse_flags = cli.command_parser(
    define_flags, doc=__doc__,
    check=lambda command: cli.check_paths(command.values, ["authors_model"]))


def main(command: cli.Command) -> None:
    """Runs the conversion of the parsed flags (``parse_flags``); bad input is one line and exit
    status 2."""
    values = command.values
    try:
        result = convert(values.authors_model, values.workdir, encoder=values.encoder,
                         config_argument=values.config)
    except (ValueError, cli.UsageError) as err:  # ConvertError, TorchFileError, ...
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        sys.exit(cli.USAGE_EXIT_CODE)
    logging.info("dropped (unused by the authors' forward pass): %s",
                 ", ".join(result["dropped"]) or "nothing")
    command_line = " ".join(["python -m trip_jax.main", f"--config={result['config_argument']}",
                             f"--workdir={values.workdir}", *result["overrides"],
                             "--mode=evaluate --split=test"])
    print(f"wrote {values.workdir} (encoder {result['encoder']}; dropped "
          f"{len(result['dropped'])} unused tensors: {', '.join(result['dropped']) or 'none'})")
    print(f"evaluate it with: {command_line}")


if __name__ == "__main__":
    cli.run(main, parse_flags)
