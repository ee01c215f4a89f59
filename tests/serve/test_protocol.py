"""The Open Inference Protocol's messages: requests parsed and checked, replies Triton reads."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from eatta.serve.protocol import (
    ModelSpec,
    ProtocolError,
    Requested,
    encode_reply,
    model_metadata,
    parse_infer,
)

SPEC = ModelSpec("digits", (3, 4, 4), num_classes=5, max_rows=8)


def _json(x: torch.Tensor, **extra: object) -> bytes:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}
    return json.dumps({"inputs": [tensor], **extra}).encode()


def _binary(x: torch.Tensor, **extra: object) -> tuple[bytes, str]:
    raw = struct.pack(f"<{x.numel()}f", *x.flatten().tolist())
    tensor = {
        "name": "input",
        "shape": list(x.shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": len(raw)},
    }
    head = json.dumps({"inputs": [tensor], **extra}).encode()
    return head + raw, str(len(head))


def test_json_and_binary_requests_give_the_same_tensor() -> None:
    x = torch.randn(3, 3, 4, 4)
    from_json = parse_infer(_json(x, id="a-1"), None, SPEC)
    body, length = _binary(x)
    from_binary = parse_infer(body, length, SPEC)
    assert torch.equal(from_json.x, x) and torch.equal(from_binary.x, x)
    assert from_json.id == "a-1" and from_binary.id is None
    assert [o.name for o in from_json.outputs] == ["logits", "class"]  # all, as JSON
    assert not any(o.binary for o in from_json.outputs)
    flat = json.loads(_json(x))
    flat["inputs"][0]["data"] = x.flatten().tolist()  # flat data, row-major, is taken too
    assert torch.equal(parse_infer(json.dumps(flat).encode(), None, SPEC).x, x)


def test_the_model_name_and_version_kserves_client_repeats_in_the_body_are_taken() -> None:
    x = torch.zeros(1, 3, 4, 4)
    parsed = parse_infer(_json(x, model_name="digits", model_version="1", id="k"), None, SPEC)
    assert parsed.id == "k" and torch.equal(parsed.x, x)


def test_outputs_asked_for_by_name_and_binary_flags() -> None:
    x = torch.zeros(1, 3, 4, 4)
    asked = [{"name": "class"}, {"name": "logits", "parameters": {"binary_data": True}}]
    parsed = parse_infer(_json(x, outputs=asked), None, SPEC)
    assert parsed.outputs == (Requested("class", False), Requested("logits", True))
    all_binary = parse_infer(_json(x, parameters={"binary_data_output": True}), None, SPEC)
    assert all(o.binary for o in all_binary.outputs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["inputs"][0].update(name="image"), "unknown input 'image'"),
        (lambda d: d["inputs"][0].update(datatype="FP16"), "is FP32"),
        (lambda d: d["inputs"][0].update(shape=[2, 3, 4, 5]), "has shape"),
        (lambda d: d["inputs"][0].update(shape=[0, 3, 4, 4]), "N >= 1"),
        (lambda d: d["inputs"][0].update(data=[1.0, 2.0]), "needs 96 values"),
        (lambda d: d["inputs"][0].update(data=["a"] * 96), "must be numbers"),
        (lambda d: d["inputs"][0]["data"].__setitem__(0, float("nan")), "NaN"),
        (lambda d: d.update(outputs=[{"name": "probabilities"}]), "unknown output"),
        (lambda d: d.update(outputs=[{"name": "class"}, {"name": "class"}]), "twice"),
        (lambda d: d.update(parameters={"sequence_id": 3}), "unknown key"),
        (
            lambda d: d.update(outputs=[{"name": "class", "parameters": {"class_count": 2}}]),
            "unknown key",
        ),
        (lambda d: d.update(id=7), "id must be a string"),
        (lambda d: d.update(extra=1), "unknown key"),
        (lambda d: d.update(inputs=[]), "exactly one input"),
        (lambda d: d.update(model_name="other"), "model_name is 'other'; this model is 'digits'"),
    ],
)
def test_a_bad_request_is_refused_naming_what_is_wrong(change, message: str) -> None:
    doc = json.loads(_json(torch.zeros(2, 3, 4, 4)))
    doc["inputs"][0]["data"] = torch.zeros(96).tolist()
    change(doc)
    with pytest.raises(ProtocolError, match=message) as err:
        parse_infer(json.dumps(doc).encode(), None, SPEC)
    assert err.value.status == 400


def test_binary_sizes_and_lengths_are_checked() -> None:
    body, length = _binary(torch.zeros(2, 3, 4, 4))
    with pytest.raises(ProtocolError, match="bytes of binary data"):
        parse_infer(body[:-4], length, SPEC)
    with pytest.raises(ProtocolError, match="not a length"):
        parse_infer(body, str(len(body) + 1), SPEC)
    with pytest.raises(ProtocolError, match="not valid JSON"):
        parse_infer(body, str(int(length) - 1), SPEC)
    with pytest.raises(ProtocolError, match="no input says binary_data_size"):
        parse_infer(
            _json(torch.zeros(1, 3, 4, 4)) + b"\x00" * 4,
            str(len(_json(torch.zeros(1, 3, 4, 4)))),
            SPEC,
        )
    with pytest.raises(ProtocolError, match="at most 8 rows"):
        parse_infer(_json(torch.zeros(9, 3, 4, 4)), None, SPEC)


def test_a_reply_is_what_tritons_client_decodes() -> None:
    from tritonclient.http import InferResult

    logits = torch.tensor([[0.1, 2.0, -1.0, 0.0, 0.5], [3.0, 0.0, 0.0, 0.0, -2.5]])
    asked = (Requested("logits", True), Requested("class", False))
    body, headers = encode_reply(SPEC, "r-9", asked, logits, {"served_by": "blend"})
    assert headers["content-type"] == "application/octet-stream"
    result = InferResult.from_response_body(
        body, header_length=int(headers["inference-header-content-length"])
    )
    assert result.get_response()["id"] == "r-9"
    assert result.get_response()["parameters"] == {"served_by": "blend"}
    assert torch.equal(torch.tensor(result.as_numpy("logits").tolist()), logits)
    assert result.as_numpy("class").tolist() == [1, 0]
    plain, headers = encode_reply(SPEC, None, (Requested("class", False),), logits)
    assert headers == {"content-type": "application/json"}
    doc = json.loads(plain)
    assert "id" not in doc and doc["outputs"] == [
        {"name": "class", "datatype": "INT64", "shape": [2], "data": [1, 0]}
    ]


def test_metadata_names_the_input_and_outputs() -> None:
    meta = model_metadata(SPEC)
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 4, 4]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("logits", "FP32", [-1, 5]),
        ("class", "INT64", [-1]),
    ]
