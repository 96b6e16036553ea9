"""State trees as data: JSON for the structure, safetensors for tensors and arrays.

A checkpoint's state (the orchestrator's, the gate's, the controller's, the learner's) is a
tree of dicts, lists, tuples, numbers, strings, torch tensors, numpy arrays and a few message
types. ``encode_state`` splits it into a JSON-able tree and two flat tables of tensors
(``torch`` and ``numpy``); ``decode_state`` puts it back together, exactly: tuples stay
tuples, integer dict keys stay integers, tensors keep their dtype, shape and bits.

Nothing in the encoded form can run code when it is read. Everything that JSON cannot hold
directly is a *marker*, a JSON object with the key ``"__rg__"`` naming its kind:

=============  ===============================================================
``tuple``      ``{"__rg__": "tuple", "items": [...]}``
``dict``       a dict with a non-string key (or a key starting ``__rg``): ``items: [[k, v], ...]``
``odict``      an ``OrderedDict`` (``items``, and torch's ``_metadata`` when it has one)
``set``        ``set`` / ``frozenset`` (``frozen``), ``items``
``deque``      ``items`` and ``maxlen``
``bytes``      ``b64``: base64 text
``tensor``     ``key`` into the torch table
``ndarray``    ``key`` into the numpy table (numeric and boolean dtypes only)
``np_scalar``  ``key`` into the numpy table (a 0-d array read back as a numpy scalar)
``dataclass``  ``type`` (a name from ``ALLOWED_TYPES``) and ``fields``
``enum``       ``type`` (a name from ``ALLOWED_TYPES``) and ``value``
=============  ===============================================================

Types are looked up by name in the fixed ``ALLOWED_TYPES`` table; a name that is not there
is an error, never an import.

>>> from pipeline.types import FinishReason
>>> state = {"step": 3, "ids": (1, 2), "by_id": {0: "a"}, "why": FinishReason.STOP, "x": float("nan")}
>>> tree, tensors, arrays = encode_state(state)
>>> tree["ids"], tree["why"]
({'__rg__': 'tuple', 'items': [1, 2]}, {'__rg__': 'enum', 'type': 'pipeline.types.FinishReason', 'value': 0})
>>> back = decode_state(tree, tensors, arrays)
>>> back["ids"], back["by_id"], back["why"] is FinishReason.STOP
((1, 2), {0: 'a'}, True)
>>> decode_state({"__rg__": "dataclass", "type": "os.system", "fields": {}}, {}, {})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
railgate.state_codec.StateFormatError: at state: type 'os.system' is not one a checkpoint may hold (allowed: ...)
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import enum
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.types import (
    BranchSpec,
    CommittedGroup,
    FinishReason,
    Prompt,
    Rollout,
    SamplingParams,
    TrainBatch,
    Turns,
)

MARK = "__rg__"

ALLOWED_TYPES: dict[str, type] = {
    f"{cls.__module__}.{cls.__qualname__}": cls
    for cls in (BranchSpec, CommittedGroup, FinishReason, Prompt, Rollout, SamplingParams, TrainBatch, Turns)
}
"""The only classes a state may hold besides plain data, tensors and arrays (by full name)."""


class StateFormatError(ValueError):
    """A state tree that cannot be encoded, or an encoded one that is malformed."""


def encode_state(state: Any) -> tuple[Any, dict[str, Any], dict[str, np.ndarray]]:
    """``(tree, torch_tensors, numpy_arrays)``: a JSON-able tree and the tensors it refers to."""
    encoder = _Encoder()
    return encoder.encode(state, "state"), encoder.tensors, encoder.arrays


def decode_state(tree: Any, tensors: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    """The state that ``encode_state`` split into ``tree``, ``tensors`` and ``arrays``."""
    try:
        return _Decoder(tensors, arrays).decode(tree, "state")
    except RecursionError:
        raise StateFormatError("the state tree is nested too deeply to be a railgate state") from None


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self._storages: set[int] = set()

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, enum.Enum):
            return {MARK: "enum", "type": _allowed_name(value, path), "value": self.encode(value.value, path)}
        if isinstance(value, np.generic):
            return {MARK: "np_scalar", "key": self._array(np.asarray(value), path)}
        if type(value) in (int, float):
            return value
        if isinstance(value, np.ndarray):
            return {MARK: "ndarray", "key": self._array(value, path)}
        torch = sys.modules.get("torch")  # no tensor can exist unless torch was imported
        if torch is not None and isinstance(value, torch.Tensor):
            return {MARK: "tensor", "key": self._tensor(value, torch, path)}
        if isinstance(value, (bytes, bytearray)):
            return {MARK: "bytes", "b64": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return {MARK: "tuple", "items": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, collections.deque):
            return {
                MARK: "deque",
                "items": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)],
                "maxlen": value.maxlen,
            }
        if isinstance(value, (set, frozenset)):
            return {
                MARK: "set",
                "frozen": isinstance(value, frozenset),
                "items": [self.encode(v, f"{path}{{}}") for v in value],
            }
        if isinstance(value, dict) and type(value) in (dict, collections.OrderedDict):
            return self._dict(value, path)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = _allowed_name(value, path)
            fields = {
                f.name: self.encode(getattr(value, f.name), f"{path}.{f.name}")
                for f in dataclasses.fields(value)
                if f.init
            }
            return {MARK: "dataclass", "type": name, "fields": fields}
        raise StateFormatError(
            f"at {path}: a checkpoint cannot hold a {type(value).__module__}.{type(value).__qualname__}; "
            "state dicts must hold plain data, tensors, arrays or a type listed in railgate.state_codec.ALLOWED_TYPES"
        )

    def _dict(self, value: dict, path: str) -> Any:
        plain = type(value) is dict and all(isinstance(k, str) and not k.startswith("__rg") for k in value)
        if plain:
            return {k: self.encode(v, f"{path}.{k}") for k, v in value.items()}
        items = [[self.encode(k, f"{path}<key>"), self.encode(v, f"{path}.{k}")] for k, v in value.items()]
        if type(value) is dict:
            return {MARK: "dict", "items": items}
        out: dict[str, Any] = {MARK: "odict", "items": items}
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            out["metadata"] = self.encode(metadata, f"{path}._metadata")
        return out

    def _array(self, array: np.ndarray, path: str) -> str:
        if array.dtype.kind not in "biufc":
            raise StateFormatError(
                f"at {path}: a numpy array of dtype {array.dtype} cannot go into a checkpoint; "
                "only numeric and boolean arrays can"
            )
        key = f"a{len(self.arrays)}"
        self.arrays[key] = array if array.flags.c_contiguous else array.copy(order="C")  # keeps 0-d arrays 0-d
        return key

    def _tensor(self, tensor: Any, torch: Any, path: str) -> str:
        if tensor.is_sparse or tensor.is_quantized:
            raise StateFormatError(f"at {path}: sparse and quantized tensors cannot go into a checkpoint")
        t = tensor.detach().to("cpu")
        storage = t.untyped_storage().data_ptr() if t.numel() else None
        if not t.is_contiguous() or (storage is not None and storage in self._storages):
            t = t.clone(memory_format=torch.contiguous_format)  # safetensors stores each tensor's own bytes
            storage = t.untyped_storage().data_ptr() if t.numel() else None
        if storage is not None:
            self._storages.add(storage)
        key = f"t{len(self.tensors)}"
        self.tensors[key] = t
        return key


def _allowed_name(value: Any, path: str) -> str:
    cls = type(value)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if ALLOWED_TYPES.get(name) is not cls:
        raise StateFormatError(
            f"at {path}: a checkpoint cannot hold a {name}; add it to railgate.state_codec.ALLOWED_TYPES "
            "if it is plain data"
        )
    return name


class _Decoder:
    def __init__(self, tensors: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.tensors = tensors
        self.arrays = arrays
        self._handlers = {
            "tuple": self._tuple,
            "set": self._set,
            "deque": self._deque,
            "dict": self._dict,
            "odict": self._odict,
            "bytes": self._bytes,
            "tensor": self._tensor,
            "ndarray": self._ndarray,
            "np_scalar": self._np_scalar,
            "enum": self._enum,
            "dataclass": self._dataclass,
        }

    def decode(self, node: Any, path: str) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict):
            raise StateFormatError(f"at {path}: unexpected {type(node).__name__} in the state tree")
        if MARK not in node:
            return {k: self.decode(v, f"{path}.{k}") for k, v in node.items()}
        kind = node[MARK]
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise StateFormatError(f"at {path}: unknown marker {str(kind)[:40]!r}")
        try:
            return handler(node, path)
        except StateFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise StateFormatError(
                f"at {path}: malformed {kind} marker ({type(exc).__name__}: {str(exc)[:120]})"
            ) from None

    def _items(self, node: dict, path: str) -> list:
        items = node["items"]
        if not isinstance(items, list):
            raise StateFormatError(f"at {path}: 'items' must be a list")
        return [self.decode(v, f"{path}[{i}]") for i, v in enumerate(items)]

    def _pairs(self, node: dict, path: str) -> list[tuple[Any, Any]]:
        pairs = []
        for i, pair in enumerate(node["items"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise StateFormatError(f"at {path}[{i}]: a dict item must be a [key, value] pair")
            pairs.append((self.decode(pair[0], f"{path}<key>"), self.decode(pair[1], f"{path}[{i}]")))
        return pairs

    def _tuple(self, node: dict, path: str) -> tuple:
        return tuple(self._items(node, path))

    def _set(self, node: dict, path: str) -> set | frozenset:
        items = self._items(node, path)
        return frozenset(items) if node.get("frozen") is True else set(items)

    def _deque(self, node: dict, path: str) -> collections.deque:
        maxlen = node.get("maxlen")
        if maxlen is not None and (not isinstance(maxlen, int) or isinstance(maxlen, bool) or maxlen < 0):
            raise StateFormatError(f"at {path}: deque maxlen {maxlen!r} must be a non-negative integer or null")
        return collections.deque(self._items(node, path), maxlen=maxlen)

    def _dict(self, node: dict, path: str) -> dict:
        return dict(self._pairs(node, path))

    def _odict(self, node: dict, path: str) -> collections.OrderedDict:
        out = collections.OrderedDict(self._pairs(node, path))
        if "metadata" in node:
            out._metadata = self.decode(node["metadata"], f"{path}._metadata")  # type: ignore[attr-defined]
        return out

    def _bytes(self, node: dict, path: str) -> bytes:
        return base64.b64decode(node["b64"], validate=True)

    def _table(self, table: Mapping[str, Any], node: dict, path: str, what: str) -> Any:
        key = node["key"]
        if not isinstance(key, str) or key not in table:
            raise StateFormatError(f"at {path}: {what} {str(key)[:40]!r} is not in the checkpoint's {what} table")
        return table[key]

    def _tensor(self, node: dict, path: str) -> Any:
        return self._table(self.tensors, node, path, "tensor")

    def _ndarray(self, node: dict, path: str) -> np.ndarray:
        return np.array(self._table(self.arrays, node, path, "array"))

    def _np_scalar(self, node: dict, path: str) -> Any:
        array = self._table(self.arrays, node, path, "array")
        if array.ndim != 0:
            raise StateFormatError(f"at {path}: a numpy scalar must be stored as a 0-d array")
        return array[()]

    def _type(self, node: dict, path: str) -> type:
        name = node["type"]
        cls = ALLOWED_TYPES.get(name) if isinstance(name, str) else None
        if cls is None:
            raise StateFormatError(
                f"at {path}: type {str(name)[:80]!r} is not one a checkpoint may hold "
                f"(allowed: {', '.join(sorted(ALLOWED_TYPES))})"
            )
        return cls

    def _enum(self, node: dict, path: str) -> enum.Enum:
        cls = self._type(node, path)
        if not issubclass(cls, enum.Enum):
            raise StateFormatError(f"at {path}: {node['type']} is not an enum")
        return cls(self.decode(node["value"], path))

    def _dataclass(self, node: dict, path: str) -> Any:
        cls = self._type(node, path)
        fields = node["fields"]
        if not dataclasses.is_dataclass(cls) or not isinstance(fields, dict):
            raise StateFormatError(f"at {path}: {node['type']} needs a 'fields' object")
        expected = {f.name for f in dataclasses.fields(cls) if f.init}
        if set(fields) - expected:
            raise StateFormatError(f"at {path}: {node['type']} has no field(s) {sorted(set(fields) - expected)}")
        return cls(**{k: self.decode(v, f"{path}.{k}") for k, v in fields.items()})
