"""What the digits-C studies share (safety, late labels, real annotators, guard): running a
``--plan``, merging the studies saved in several ``--out`` folders, filling a page with
per-stream blocks, a bar's verdict.

Not part of the package; imported by the study scripts (run as scripts, so this folder is on
``sys.path``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from _common import Template

from eatta.bench import StreamProtocol


def each_part(
    data: dict[str, Any], plan: Sequence[tuple[str, str]], protocols: Mapping[str, StreamProtocol]
) -> Iterator[tuple[str, str, StreamProtocol, dict[str, Any]]]:
    """The plan's ``(part, stream, protocol, the stream's entry in data)``, each announced."""
    for part, name in plan:
        proto = protocols[name]
        s = data["streams"].setdefault(name, {"protocol": proto.describe()})
        print(f"{part} / {name}: {proto}", flush=True)
        yield part, name, proto, s


def merged(folders: str, order: Sequence[str]) -> dict[str, Any]:
    """The studies saved in ``folders`` (comma-separated) as one, its streams in ``order``: the
    seeds united, each stream's parts merged key by key, runs of the same cell list (one dict per
    seed) concatenated, so parts and seeds split across folders combine. The studies' other
    settings (a variant's, a source model's) are kept; folders that differ in them are refused."""
    data: dict[str, Any] = {"streams": {}, "seeds": []}
    first: dict[str, Any] | None = None
    for folder in (Path(x) for x in folders.split(",") if x):
        one = json.loads((folder / "study.json").read_text(encoding="utf-8"))
        data["seeds"] = sorted(set(data["seeds"]) | set(one["seeds"]))
        settings = {k: v for k, v in one.items() if k not in ("streams", "seeds")}
        if first is None:
            first = settings
            data.update(settings)
        elif settings != first:
            raise SystemExit(f"{folder} was run with {settings}, an earlier folder with {first}")
        for name, s in one["streams"].items():
            _merge(data["streams"].setdefault(name, {}), s)
    data["streams"] = dict(sorted(data["streams"].items(), key=lambda kv: order.index(kv[0])))
    return data


def _runs(value: object) -> TypeGuard[list[dict[str, Any]]]:
    """Whether ``value`` is a part's runs (a list of cells, one per seed)."""
    return isinstance(value, list) and all(isinstance(c, dict) for c in value)


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        old = into.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _merge(old, value)
        elif _runs(value) and _runs(old):
            seen = {c["seed"] for c in old}
            old += [c for c in value if c["seed"] not in seen]
        else:
            into[key] = value


def with_streams(page: Template, blocks: Sequence[str], **values: object) -> str:
    """``page`` filled, its ``$streams`` the non-empty ``blocks`` (none: that line dropped)."""
    blocks = [b for b in blocks if b]
    text = page(streams="\n" + "\n\n".join(blocks) if blocks else "", **values)
    return text if blocks else text[:-1]


def verdict(ok: bool) -> str:
    """A bar's verdict."""
    return "met" if ok else "missed"
