"""What the inspector reads from disk: ``config.json`` files and safetensors headers.

Only the 8-byte length + JSON header of each ``*.safetensors`` file is read (or of the shards
named by ``model.safetensors.index.json``); the only tensor data read are small index tables
(:func:`read_small`). No torch, no weights.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

_NP_DTYPES = {
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
}
#: Bytes per element of the safetensors dtypes (the format's own list): a header whose
#: ``data_offsets`` span another size than shape x this is lying about the tensor.
_DTYPE_BYTES = {
    **{k: np.dtype(v).itemsize for k, v in _NP_DTYPES.items()},
    **{"BF16": 2, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1},
}


@dataclass
class TensorInfo:
    """One tensor of a safetensors header: its dtype name (``F32``, ``I64``, ...), shape, file
    and the absolute byte range ``[begin, end)`` of its data in that file."""

    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one ``.safetensors`` file, from its header only.

    Raises:
        InputError: not a safetensors file.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise InputError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000:
                raise InputError(f"{path}: not a safetensors file (header length {n})")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a safetensors file (the header is not a JSON object)")
    size = path.stat().st_size
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        t = _tensor_info(path, name, v, 8 + n)
        if t.end > size:
            raise InputError(
                f"{path}: truncated: tensor {name!r} ends at byte {t.end}, the file has {size}"
            )
        out[name] = t
    return out


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor_info(path: Path, name: str, v: object, base: int) -> TensorInfo:
    """One header entry as a :class:`TensorInfo` (``base``: where the data starts).

    Raises:
        InputError: the entry lacks a string dtype, a shape of ints >= 0 or two ordered
            ``data_offsets`` (names the tensor and the field).
    """
    d = v if isinstance(v, dict) else {}
    shape, offsets, dtype = d.get("shape"), d.get("data_offsets"), d.get("dtype")
    bad = (
        "dtype" if not isinstance(dtype, str)
        else "shape" if not isinstance(shape, list) or not all(map(_is_int, shape))
        else "data_offsets" if not isinstance(offsets, list) or len(offsets) != 2
        or not all(map(_is_int, offsets)) or offsets[0] > offsets[1]
        else None
    )  # fmt: skip
    if bad is not None:
        got = d.get(bad) if isinstance(v, dict) else v
        raise InputError(
            f"{path}: not a safetensors header: tensor {name!r} (field={bad}, value={got!r})"
        )
    need, span = _nbytes(dtype, shape), offsets[1] - offsets[0]  # type: ignore[arg-type,index]
    if need is not None and span != need:
        raise InputError(
            f"{path}: not a safetensors header: tensor {name!r} spans {span} bytes, its "
            f"shape {shape} of {dtype} needs {need} (field=data_offsets, value={offsets!r})"
        )
    return TensorInfo(dtype, tuple(shape), path, base + offsets[0], base + offsets[1])  # type: ignore


def _nbytes(dtype: str, shape: list[int]) -> int | None:
    """The data size of a tensor of ``dtype`` and ``shape`` (None: a dtype of unknown size)."""
    size = _DTYPE_BYTES.get(dtype)
    return None if size is None else size * math.prod(shape)


def read_small(t: TensorInfo) -> np.ndarray:
    """The data of one small tensor (d2t, t2d): reads only its byte range.

    Raises:
        InputError: a dtype numpy cannot hold (e.g. BF16).
    """
    dt = _NP_DTYPES.get(t.dtype)
    if dt is None:
        raise InputError(f"{t.file}: cannot read a {t.dtype} tensor")
    with open(t.file, "rb") as f:
        f.seek(t.begin)
        buf = f.read(t.end - t.begin)
    return np.frombuffer(buf, dtype=dt).reshape(t.shape)


def read_tensors(ckpt: Path) -> tuple[dict[str, TensorInfo], list[str]]:
    """All tensors of a checkpoint folder (single file, shards, or every ``*.safetensors``).

    Returns:
        (name -> info with a leading ``model.`` stripped, the weight file names).
    Raises:
        InputError: an unreadable shard index or safetensors header.
    """
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{index}: unreadable index ({exc})") from None
        if not all(isinstance(f, str) and f for f in files):
            raise InputError(f"{index}: unreadable index (weight_map values are not file names)")
    else:
        files = sorted(p.name for p in ckpt.glob("*.safetensors"))
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        for k, v in read_header(ckpt / name).items():
            tensors[k[len("model.") :] if k.startswith("model.") else k] = v
    return tensors, files


def load_config(path: Path) -> dict:
    """A ``config.json`` as a dict.

    Raises:
        InputError: unreadable, not JSON, not a JSON object, or a size field of
            :data:`INT_FIELDS` that is not an integer.
    """
    try:
        d = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: not a JSON object")
    _check_sizes(path, d)
    return d


#: Config fields the checks compare as integers (sizes, counts, ids), at any nesting level
#: (``text_config``, ``transformer_layer_config``, ``speculators_config``); null is unknown.
INT_FIELDS = frozenset(
    {
        "vocab_size", "draft_vocab_size", "hidden_size", "target_hidden_size",
        "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "block_size",
        "dspark_block_size", "mask_token_id", "dspark_noise_token_id", "markov_rank",
        "full_attention_interval",
    }
)  # fmt: skip


def _check_sizes(path: Path, d: dict, where: str = "") -> None:
    """Raises InputError naming the first field of :data:`INT_FIELDS` that holds no integer
    (``"vocab_size": "big"`` was a TypeError deep inside a check)."""
    for key, v in d.items():
        if isinstance(v, dict):
            _check_sizes(path, v, f"{where}{key}.")
        elif (
            key in INT_FIELDS and v is not None and (isinstance(v, bool) or not isinstance(v, int))
        ):
            raise InputError(f"{path}: {key} is not an integer (field={where}{key}, value={v!r})")


def text_config(d: dict) -> dict:
    """The language-model part of an HF config (``text_config`` of multimodal models)."""
    for key in ("text_config", "thinker_config"):
        sub = d.get(key)
        if isinstance(sub, dict):
            return text_config(sub) if "text_config" in sub else sub
    return d


def target_layer_types(t: dict) -> list[str] | None:
    """Per-layer type names of a target config (``layer_types``, ``layers_block_type`` or a
    ``full_attention_interval``), or None when the config names none (all attention)."""
    n = t.get("num_hidden_layers")
    for key in ("layer_types", "layers_block_type"):
        v = t.get(key)
        if isinstance(v, list) and v:
            return [str(x) for x in v]
    interval = t.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and isinstance(n, int):
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    return None
