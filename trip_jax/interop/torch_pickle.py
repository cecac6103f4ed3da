"""Reads a ``torch.save`` file (zip format) into plain records and numpy arrays, running nothing.

``load(path)`` returns the pickled object with allowed classes as inert ``Record`` s and tensors
as numpy arrays; any global outside the allow-list raises ``UnsafePickleError``, a bad file
``TorchFileError``. Why this is safe: docs/convert.md#what-is-read.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

# Storage classes (torch.FloatStorage, ...) -> numpy dtype of their elements.
_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
    "BFloat16Storage": "bfloat16",
}
# torch dtypes a pickle may name (a config's torch_dtype, a typed storage's dtype).
_TORCH_DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
                 "bfloat16": "bfloat16", "int64": np.int64, "int32": np.int32,
                 "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}
# Namespaces whose classes (modules, configs, activations) become inert Records.
RECORD_NAMESPACES: tuple[str, ...] = (
    "torch.nn.modules.",           # Linear, LayerNorm, TransformerEncoder, ...
    "www.model.",                  # the TRIP authors' TieredModelPipeline, ClassificationHead
    "transformers.models.",        # transformers >= 4.0: transformers.models.bert.modeling_bert
    "transformers.modeling_",      # older layout: transformers.modeling_roberta
    "transformers.configuration_",  # configuration_utils, configuration_bert, ...
    "transformers.activations",
)
# Single globals that are data (or functions kept as names, never called).
_NAMED_FUNCTIONS = frozenset({
    "torch.nn.functional.relu", "torch.nn.functional.gelu", "torch._C._nn.gelu",
    "transformers.activations.gelu", "transformers.activations.gelu_new",
    "transformers.activations._gelu_python", "transformers.activations.gelu_python",
})
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class TorchFileError(ValueError):
    """The file is not a readable torch.save archive (its message is one line)."""


class UnsafePickleError(TorchFileError):
    """The pickle names a global outside the allow-list; nothing it names was run."""


class Record:
    """An inert stand-in for an instance of ``qualname``: ``args`` it was built with, ``state``
    it was given (a module's ``__dict__``: ``_parameters``, ``_buffers``, ``_modules``, ...)."""

    qualname = "?"
    args: tuple = ()
    kwargs: dict = {}
    state: dict = {}  # replaced, never changed in place

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.state: dict[str, Any] = {}

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.state = dict(state) if isinstance(state, dict) else {"__state__": state}

    def __getitem__(self, key):
        return self.state[key]

    def get(self, key, default=None):
        """``state[key]``, or ``default``."""
        return self.state.get(key, default)

    @property
    def class_name(self) -> str:
        """The last component of the qualified class name (``BertModel``)."""
        return self.qualname.rsplit(".", 1)[-1]

    def __repr__(self):
        return f"Record({self.qualname})"


class NamedFunction:
    """A function a pickle names (an activation), kept as its name; never called."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __repr__(self):
        return f"NamedFunction({self.qualname})"


class _StorageType:
    def __init__(self, name: str, dtype):
        self.name, self.dtype = name, dtype


_record_classes: dict[str, type] = {}


def _record_class(qualname: str) -> type:
    if qualname not in _record_classes:
        _record_classes[qualname] = type(qualname.rsplit(".", 1)[-1], (Record,),
                                         {"qualname": qualname})
    return _record_classes[qualname]


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None,
                       metadata=None):
    array = storage
    if not isinstance(array, np.ndarray):
        raise TorchFileError(f"a tensor is built from {type(array).__name__}, not a storage")
    size, stride, offset = tuple(map(int, size)), tuple(map(int, stride)), int(offset)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride) if n > 0)
    if (len(size) != len(stride) or min(size + stride + (offset,), default=0) < 0
            or (all(size) and last >= len(array)) or offset > len(array)):
        raise TorchFileError(f"a tensor of size {size}, stride {stride} and offset {offset} "
                             f"reaches past its storage of {len(array)} elements")
    itemsize = array.dtype.itemsize
    if not size:
        return np.array(array[offset])
    if not all(size):
        return np.zeros(size, array.dtype)
    return np.lib.stride_tricks.as_strided(
        array[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)).copy()


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    return func(*args)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler of one torch archive's ``data.pkl``: globals only from the allow-list,
    storages read from ``archive`` (``prefix/data/KEY``) as numpy arrays."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, source: str):
        super().__init__(file)
        self._archive, self._prefix, self._source = archive, prefix, source
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        """The stand-in of ``module.name``; UnsafePickleError for a name outside the list."""
        module = "builtins" if module == "__builtin__" else module
        full = f"{module}.{name}"
        if full == "collections.OrderedDict":
            return collections.OrderedDict
        if full in ("builtins.set", "builtins.frozenset"):
            return set if name == "set" else frozenset
        if full == "torch._utils._rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if full in ("torch._utils._rebuild_parameter",
                    "torch._utils._rebuild_parameter_with_state"):
            return _rebuild_parameter
        if full == "torch._tensor._rebuild_from_type_v2":
            return _rebuild_from_type_v2
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name, _STORAGE_DTYPES[name])
        if module == "torch" and name in _TORCH_DTYPES:
            return _StorageType(name, _TORCH_DTYPES[name])
        if full in ("torch.Tensor", "torch.nn.parameter.Parameter", "torch.device",
                    "torch.Size"):
            return _record_class(full)
        if full in _NAMED_FUNCTIONS:
            return NamedFunction(full)
        if any(full.startswith(ns) for ns in RECORD_NAMESPACES):
            return _record_class(full)
        raise UnsafePickleError(
            f"{self._source}: refused to load: the pickle names {full}, which is not on the "
            f"allow-list of data-only names (nothing it names was imported or run)")

    def persistent_load(self, pid):
        """A storage reference ('storage', type, key, location, numel) -> numpy array."""
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise TorchFileError(f"{self._source}: unknown persistent id {str(pid)[:80]!r}")
        storage_type, key = pid[1], str(pid[2])
        dtype = storage_type.dtype if isinstance(storage_type, _StorageType) else None
        if dtype is None:
            raise TorchFileError(f"{self._source}: storage {key} has an unknown type")
        cache_key = f"{key}:{dtype}"
        if cache_key not in self._storages:
            name = f"{self._prefix}data/{key}"
            try:
                raw = self._archive.read(name)
            except KeyError:
                raise TorchFileError(f"{self._source}: storage {name} is missing from the "
                                     "archive (a truncated or damaged file)") from None
            if dtype == "bfloat16":  # upper 16 bits of a float32
                halves = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
                array = halves.view(np.float32)
            else:
                array = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"))
            self._storages[cache_key] = array
        return self._storages[cache_key]


def load(path: str | Path) -> Any:
    """The object ``torch.save`` wrote to ``path``, as Records and numpy arrays (module
    docstring). TorchFileError (one line) for a file that cannot be read this way."""
    source = str(path)
    path = Path(path)
    if not path.is_file():
        raise TorchFileError(f"{source}: no such file")
    with open(path, "rb") as f:
        head = f.read(16)
    if not zipfile.is_zipfile(path):
        if head[:1] == b"\x80" and _legacy_magic(path):
            raise TorchFileError(
                f"{source}: a legacy (pre-1.6) torch file; only the zip format (torch >= 1.6, "
                "the default since then) is read: re-save it with torch.save(model, path)")
        raise TorchFileError(f"{source}: not a torch.save file (not a zip archive: the file "
                             "is damaged, cut short, or of another kind)")
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")
                       or n == "data.pkl"]
            if len(pickles) != 1:
                raise TorchFileError(f"{source}: not a torch.save file (a zip archive without "
                                     "one data.pkl)")
            prefix = pickles[0][:-len("data.pkl")]
            if prefix + "byteorder" in archive.namelist() and \
                    archive.read(prefix + "byteorder").strip() != b"little":
                raise TorchFileError(f"{source}: written on a big-endian machine; only "
                                     "little-endian files are read")
            with archive.open(pickles[0]) as data:
                return RestrictedUnpickler(data, archive, prefix, source).load()
    except TorchFileError as err:
        if str(err).startswith(source):
            raise
        raise TorchFileError(f"{source}: {err}") from None
    except (zipfile.BadZipFile, EOFError, pickle.UnpicklingError, zipfile.LargeZipFile,
            OSError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise TorchFileError(f"{source}: unreadable torch file ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else 'no detail'})"
                             ) from None


def _legacy_magic(path: Path) -> bool:
    """Whether the file starts with the legacy format's pickled magic number."""
    try:
        with open(path, "rb") as f:
            return _NoGlobals(f).load() == _LEGACY_MAGIC
    except Exception:  # any unreadable start (or a global): not a legacy file
        return False


class _NoGlobals(pickle.Unpickler):
    """Reads a pickle that may name no global at all (the legacy magic number)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name}")
