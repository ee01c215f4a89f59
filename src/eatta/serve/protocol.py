"""The Open Inference Protocol (KServe v2, Triton) over REST: parsing a request, writing a reply.

An inference request names one input, ``input`` (FP32, ``[N, *sample]``), as JSON data or, with
the binary tensor extension (``Inference-Header-Content-Length``: the JSON header's length; the
raw little-endian bytes follow), as ``binary_data_size`` bytes after the header. The reply holds
``logits`` (FP32 ``[N, K]``) and ``class`` (INT64 ``[N]``), or the outputs the request names, each
as JSON or as binary data (the output's ``binary_data`` parameter, or the request's
``binary_data_output``), and echoes the request's ``id``. Everything is checked before the
request reaches a model; a :class:`ProtocolError` carries the HTTP status and the message the
reply's ``{"error": ...}`` gives. This module knows no web framework.
"""

from __future__ import annotations

import ctypes
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "INPUT",
    "MAX_REQUEST_ID",
    "OUTPUTS",
    "InferRequest",
    "ModelSpec",
    "ProtocolError",
    "Requested",
    "encode_reply",
    "model_metadata",
    "parse_infer",
]

#: The input tensor's name.
INPUT = "input"
#: The outputs, in the order they are returned when a request names none.
OUTPUTS = ("logits", "class")
#: The longest request ``id`` taken (it is stored with the label requests it leads to).
MAX_REQUEST_ID = 200
_DATATYPE = {"logits": "FP32", "class": "INT64"}
#: A request's keys: the protocol's four, and the model's name and version that KServe's client
#: repeats in the body (checked against the URL's).
_REQUEST_KEYS = {"id", "parameters", "inputs", "outputs", "model_name", "model_version"}
_INPUT_KEYS = {"name", "shape", "datatype", "parameters", "data"}
_OUTPUT_KEYS = {"name", "parameters"}


class ProtocolError(ValueError):
    """A request the server does not take: ``status`` is the HTTP status of the reply."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelSpec:
    """What the served model takes and gives: its name, version, one sample's shape (``C, H,
    W`` for an image) and its number of classes, and the most rows one request may hold."""

    name: str
    sample_shape: tuple[int, ...]
    num_classes: int
    max_rows: int
    version: str = "1"
    platform: str = "pytorch_eatta"


@dataclass(frozen=True)
class Requested:
    """One output a request asks for, and whether it is returned as binary data."""

    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    """A checked inference request: its ``id`` (None when it gave none), the input ``x``
    (float32, ``[N, *sample_shape]``, finite) and the outputs to return, in order."""

    id: str | None
    x: Tensor
    outputs: tuple[Requested, ...]


def model_metadata(spec: ModelSpec) -> dict[str, Any]:
    """The model's metadata (``GET /v2/models/{name}``)."""
    return {
        "name": spec.name,
        "versions": [spec.version],
        "platform": spec.platform,
        "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, *spec.sample_shape]}],
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [-1, spec.num_classes]},
            {"name": "class", "datatype": "INT64", "shape": [-1]},
        ],
    }


def _unknown(given: Mapping[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(given) - known)
    if extra:
        raise ProtocolError(f"unknown key(s) {extra} in {where}; known: {sorted(known)}")


def _flag(params: Mapping[str, Any], key: str, where: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"{where} parameter {key!r} must be true or false, got {value!r}")
    return value


def _header(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the binary data after it."""
    if header_length is None:
        head, rest = body, b""
    else:
        if not header_length.strip().isdigit() or int(header_length) > len(body):
            raise ProtocolError(
                f"Inference-Header-Content-Length {header_length!r} is not a length within the "
                f"body ({len(body)} bytes)"
            )
        n = int(header_length)
        head, rest = body[:n], body[n:]
    try:
        doc = json.loads(head)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("the request's header is not valid JSON") from None
    if not isinstance(doc, dict):
        raise ProtocolError("an inference request is a JSON object with inputs")
    return doc, rest


def _request_id(doc: Mapping[str, Any]) -> str | None:
    rid = doc.get("id")
    if rid is None or rid == "":
        return None
    if not isinstance(rid, str) or len(rid) > MAX_REQUEST_ID:
        raise ProtocolError(f"the request's id must be a string of at most {MAX_REQUEST_ID} chars")
    return rid


def _input_tensor(doc: Mapping[str, Any], rest: bytes, spec: ModelSpec) -> Tensor:
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(f"a request has exactly one input, {INPUT!r}")
    tensor = inputs[0]
    _unknown(tensor, _INPUT_KEYS, "the input")
    if tensor.get("name") != INPUT:
        raise ProtocolError(f"unknown input {tensor.get('name')!r}; the model takes {INPUT!r}")
    if tensor.get("datatype") != "FP32":
        raise ProtocolError(f"input {INPUT!r} is FP32, got {tensor.get('datatype')!r}")
    shape = tensor.get("shape")
    want = [-1, *spec.sample_shape]
    if (
        not isinstance(shape, list)
        or len(shape) != len(want)
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or list(shape[1:]) != want[1:]
        or shape[0] < 1
    ):
        raise ProtocolError(f"input {INPUT!r} has shape {want} (N >= 1), got {shape!r}")
    rows = shape[0]
    if rows > spec.max_rows:
        raise ProtocolError(
            f"a request holds at most {spec.max_rows} rows (the server's --max-batch), got {rows}"
        )
    count = math.prod(shape)
    params = tensor.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError("the input's parameters must be an object")
    _unknown(params, {"binary_data_size"}, "the input's parameters")
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in tensor:
            raise ProtocolError("the input gives both data and binary_data_size")
        if not isinstance(size, int) or isinstance(size, bool) or size != 4 * count:
            raise ProtocolError(
                f"input {INPUT!r} of shape {shape} is {4 * count} bytes of FP32, "
                f"binary_data_size says {size!r}"
            )
        if len(rest) != size:
            raise ProtocolError(f"the body holds {len(rest)} bytes of binary data, expected {size}")
        x = torch.frombuffer(bytearray(rest), dtype=torch.float32)
    else:
        if rest:
            raise ProtocolError("binary data after the header, but no input says binary_data_size")
        data = tensor.get("data")
        if data is None:
            raise ProtocolError(f"input {INPUT!r} has neither data nor binary_data_size")
        try:
            x = torch.tensor(data, dtype=torch.float32).flatten()
        except (TypeError, ValueError, RuntimeError):
            raise ProtocolError(
                f"input {INPUT!r}'s data must be numbers (nested or flat)"
            ) from None
        if x.numel() != count:
            raise ProtocolError(
                f"input {INPUT!r} of shape {shape} needs {count} values, got {x.numel()}"
            )
    x = x.reshape(shape)
    lo, hi = torch.aminmax(x)
    if not (math.isfinite(lo.item()) and math.isfinite(hi.item())):
        raise ProtocolError(f"input {INPUT!r} holds NaN or infinite values")
    return x


def _outputs(doc: Mapping[str, Any]) -> tuple[Requested, ...]:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError("the request's parameters must be an object")
    _unknown(params, {"binary_data_output"}, "the request's parameters")
    binary = _flag(params, "binary_data_output", "the request's")
    asked = doc.get("outputs")
    if asked is None:
        return tuple(Requested(name, binary) for name in OUTPUTS)
    if not isinstance(asked, list) or not asked:
        raise ProtocolError("outputs must be a non-empty list of {name, parameters}")
    out: list[Requested] = []
    for item in asked:
        if not isinstance(item, dict):
            raise ProtocolError("each requested output is an object {name, parameters}")
        _unknown(item, _OUTPUT_KEYS, "a requested output")
        name = item.get("name")
        if name not in OUTPUTS:
            raise ProtocolError(f"unknown output {name!r}; the model gives {list(OUTPUTS)}")
        if any(o.name == name for o in out):
            raise ProtocolError(f"output {name!r} is asked for twice")
        oparams = item.get("parameters") or {}
        if not isinstance(oparams, dict):
            raise ProtocolError(f"output {name!r}'s parameters must be an object")
        _unknown(oparams, {"binary_data"}, f"output {name!r}'s parameters")
        out.append(Requested(name, _flag(oparams, "binary_data", f"output {name!r}'s") or binary))
    return tuple(out)


def parse_infer(body: bytes, header_length: str | None, spec: ModelSpec) -> InferRequest:
    """The checked request in ``body`` (``header_length``: the value of the
    ``Inference-Header-Content-Length`` header, None without one); a :class:`ProtocolError`
    naming what is wrong otherwise."""
    doc, rest = _header(body, header_length)
    _unknown(doc, _REQUEST_KEYS, "the request")
    for key, served in (("model_name", spec.name), ("model_version", spec.version)):
        named = doc.get(key)
        if named not in (None, "", served):
            raise ProtocolError(f"the request's {key} is {named!r}; this model is {served!r}")
    rid = _request_id(doc)
    outputs = _outputs(doc)
    return InferRequest(rid, _input_tensor(doc, rest, spec), outputs)


def _raw(t: Tensor) -> bytes:
    """A CPU tensor's bytes (little-endian on the machines torch runs on), without numpy."""
    t = t.detach().to("cpu").contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def encode_reply(
    spec: ModelSpec,
    request_id: str | None,
    outputs: Sequence[Requested],
    logits: Tensor,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The reply's body and headers: the outputs asked for, from ``logits`` ``[N, K]``;
    ``parameters``: the reply's own (e.g. what served it)."""
    values = {"logits": logits.detach().float().cpu(), "class": logits.detach().argmax(1).cpu()}
    shapes = {"logits": list(values["logits"].shape), "class": [int(values["logits"].shape[0])]}
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for out in outputs:
        t = values[out.name].to(torch.float32 if out.name == "logits" else torch.int64)
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": _DATATYPE[out.name],
            "shape": shapes[out.name],
        }
        if out.binary:
            blob = _raw(t)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = t.flatten().tolist()
        tensors.append(entry)
    doc: dict[str, Any] = {"model_name": spec.name, "model_version": spec.version}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    doc["outputs"] = tensors
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    headers = {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(head)),
    }
    return head + b"".join(blobs), headers
