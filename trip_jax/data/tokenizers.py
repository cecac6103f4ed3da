"""Tokenizers: a Hugging Face fast tokenizer by name or directory, or a word-level one built here.

``load_tokenizer(spec, texts)`` takes ``word_level:bert`` / ``word_level:roberta``, a directory
(local or remote) or a hub name; ``save_tokenizer`` / ``load_saved_tokenizer`` write and read a
run's ``WORKDIR/tokenizer``. Details: docs/reference.md#task-and-data ("Side tools").
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
from collections.abc import Iterable

from etils import epath
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from trip_jax.encoder_registry import collapse_roles, tokenizer_styles
from trip_jax.runtime import hub, paths, pypi_copies

WORD_LEVEL_PREFIX = "word_level:"


@dataclasses.dataclass(frozen=True)
class TokenizerInfo:
    """What downstream code needs to know about a tokenizer besides its vocabulary."""

    style: str                  # a registry style: "bert" ([CLS] a [SEP] b [SEP]), "roberta", ...
    pad_id: int
    vocab_size: int
    uses_token_type_ids: bool   # False: token_type_ids are all zeros (RoBERTa)


def load_tokenizer(spec: str, texts: Iterable[str] | None = None, *,
                   local_files_only: bool = False, flag: str = "--config.model.tokenizer"
                   ) -> PreTrainedTokenizerFast:
    """Returns a fast tokenizer for ``spec`` (see the module docstring for the accepted forms).

    ``texts`` is required for (and only used by) the word-level specs. ``local_files_only`` skips
    the hub and looks only in the transformers cache for a hub name. A hub name found neither in
    the cache nor on the hub is a one-line ``hub.HubUnavailableError`` naming ``flag``.
    """
    if spec.startswith(WORD_LEVEL_PREFIX):
        style = spec[len(WORD_LEVEL_PREFIX):]
        if style not in tokenizer_styles():
            raise ValueError(f"unknown word-level tokenizer style {style!r} in {spec!r}; use one "
                             f"of: {', '.join(WORD_LEVEL_PREFIX + s for s in tokenizer_styles())}")
        if texts is None:
            raise ValueError(f"tokenizer {spec!r} builds its vocabulary from texts; pass texts=")
        return build_word_level_tokenizer(texts, style=style)
    return _load_pretrained(spec, local_files_only=local_files_only, flag=flag)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: epath.PathLike) -> None:
    """Writes ``tokenizer`` (``save_pretrained``) into ``directory``, local or remote."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        paths.copy_tree(tmp, directory)


def load_saved_tokenizer(directory: epath.PathLike) -> PreTrainedTokenizerFast:
    """Loads the tokenizer saved in ``directory`` (local or remote) by ``save_tokenizer``."""
    if paths.is_local(directory):
        return AutoTokenizer.from_pretrained(os.fspath(directory), use_fast=True)
    with tempfile.TemporaryDirectory() as tmp:
        paths.copy_tree(directory, tmp)
        return AutoTokenizer.from_pretrained(tmp, use_fast=True)


def _load_pretrained(spec: str, *, local_files_only: bool, flag: str
                     ) -> PreTrainedTokenizerFast:
    """Loads a Hugging Face fast tokenizer from a directory or the hub, with clear errors."""
    if not paths.is_local(spec):
        if not epath.Path(spec).is_dir():
            raise FileNotFoundError(f"tokenizer directory {spec!r} does not exist")
        return load_saved_tokenizer(spec)
    looks_like_path = spec.startswith(("/", "./", "../", "~")) or os.path.isdir(spec)
    path = os.path.expanduser(spec)
    copy = None if looks_like_path else pypi_copies.local_copy(spec)
    if copy is not None:
        looks_like_path, path = True, str(copy)
    if looks_like_path and not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {spec!r} does not exist")
    def load(local_files_only: bool) -> PreTrainedTokenizerFast:
        return AutoTokenizer.from_pretrained(path if looks_like_path else spec, use_fast=True,
                                             local_files_only=local_files_only)

    try:
        if looks_like_path or local_files_only:
            tokenizer = load(local_files_only)
        else:
            tokenizer = hub.fetch(spec, load, flag=flag)
    except hub.HubUnavailableError:
        raise
    except (OSError, ValueError) as err:
        where = "the directory" if looks_like_path else "the Hugging Face hub or its local cache"
        cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise OSError(
            f"could not load tokenizer {spec!r} from {where}: {cause}; pass a directory that "
            f"holds it with {flag}=DIR, or use a word-level tokenizer ('word_level:bert' / "
            "'word_level:roberta')") from err
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"tokenizer {spec!r} has no fast (Rust) implementation; "
                         "the feature code needs a tokenizers-backed tokenizer")
    return tokenizer


def _backend(style: str, vocab: dict[str, int] | None = None) -> Tokenizer:
    """Returns a word-level backend tokenizer of ``style``: lower-cased, punctuation split."""
    spec = tokenizer_styles()[style]
    special = spec.special_tokens
    vocab = vocab if vocab is not None else {t: i for i, t in enumerate(special.values())}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=special["unk_token"]))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    marks = [t for t in (spec.cls, spec.sep) if t is not None]
    backend.post_processor = processors.TemplateProcessing(
        single=spec.single, pair=spec.pair, special_tokens=[(t, vocab[t]) for t in marks])
    return backend


def build_word_level_tokenizer(texts: Iterable[str], *, style: str | None = None
                               ) -> PreTrainedTokenizerFast:
    """Builds a word-level tokenizer whose vocabulary is every word of ``texts``, in ``style``
    (a ``registry.tokenizer_styles`` name; None: the first).

    Ids: the special tokens first, then words by decreasing count, ties in alphabetical order, so
    the same texts (in any order) always give the same vocabulary. Unknown words map to the unk
    token.
    """
    styles = tokenizer_styles()
    style = next(iter(styles)) if style is None else style
    if style not in styles:
        raise ValueError(f"unknown tokenizer style {style!r}; expected one of {tuple(styles)}")
    special = styles[style].special_tokens
    # Count words exactly as the finished tokenizer will split them.
    splitter = _backend(style)
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        normalized = splitter.normalizer.normalize_str(text)
        counts.update(word for word, _ in splitter.pre_tokenizer.pre_tokenize_str(normalized))
    vocab = {token: i for i, token in enumerate(special.values())}
    for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        vocab.setdefault(word, len(vocab))
    input_names = (["input_ids", "token_type_ids", "attention_mask"]
                   if styles[style].token_types else ["input_ids", "attention_mask"])
    return PreTrainedTokenizerFast(tokenizer_object=_backend(style, vocab),
                                   model_input_names=input_names, **special)


def tokenizer_info(tokenizer: PreTrainedTokenizerFast) -> TokenizerInfo:
    """Returns the style, pad id, vocabulary size and token-type use of ``tokenizer``.

    The style is the first registry style (``registry.tokenizer_styles``) whose sentence-pair
    template and token type use the tokenizer's own match, else the first whose template does,
    else the first.
    """
    if tokenizer.pad_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no pad token")
    types = "token_type_ids" in tokenizer.model_input_names
    roles = _pair_roles(tokenizer)
    styles = list(tokenizer_styles().values())
    found = ([s for s in styles if s.roles() == roles and s.token_types == types]
             or [s for s in styles if s.roles() == roles] or styles)
    return TokenizerInfo(
        style=found[0].name,
        pad_id=int(tokenizer.pad_token_id),
        vocab_size=len(tokenizer),
        uses_token_type_ids=types,
    )


def _pair_roles(tokenizer: PreTrainedTokenizerFast) -> tuple[str, ...]:
    """The tokenizer's encoding of the pair ("a", "b") as roles (``TokenizerStyle.roles``): its
    cls token, its sep token (else its eos token), runs of other tokens."""
    ids = tokenizer("a", "b", add_special_tokens=True)["input_ids"]
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return collapse_roles("cls" if i == tokenizer.cls_token_id and i is not None
                          else "sep" if i == sep and i is not None else "x" for i in ids)


def tokenizer_spec(model_config) -> str:
    """The tokenizer a config uses: ``model.tokenizer``, else the encoder's own."""
    spec = model_config.tokenizer or model_config.encoder
    if not spec:
        raise ValueError("a random encoder needs a tokenizer: set config.model.tokenizer "
                         "(e.g. 'word_level:bert')")
    return spec


def build_tokenizer(model_config, texts):
    """Loads (or, for word-level specs, builds from ``texts``) the config's tokenizer."""
    flag = "--config.model.tokenizer" if model_config.tokenizer else "--config.model.encoder"
    return load_tokenizer(tokenizer_spec(model_config), texts, flag=flag)
