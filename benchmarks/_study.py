"""What the digits-C studies share (safety, late labels, real annotators, guard, HILTTA): running a
``--plan``, the study ``--report-only`` renders (several ``--out`` folders merged, or the
committed results), filling a page with per-stream blocks, a bar's verdict, writing the results.

Not part of the package; imported by the study scripts (run as scripts, so this folder is on
``sys.path``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from _common import Template, replace_section, write_tables

from eatta.bench import StreamProtocol
from eatta.bench.flags import split_csv
from eatta.bench.results import CellResult


def each_part(
    data: dict[str, Any], plan: Sequence[tuple[str, str]], protocols: Mapping[str, StreamProtocol]
) -> Iterator[tuple[str, str, StreamProtocol, dict[str, Any]]]:
    """The plan's ``(part, stream, protocol, the stream's entry in data)``, each announced."""
    for part, name in plan:
        proto = protocols[name]
        s = data["streams"].setdefault(name, {"protocol": proto.describe()})
        print(f"{part} / {name}: {proto}", flush=True)
        yield part, name, proto, s


def errors(results: Sequence[CellResult], method: str, last: bool = False) -> list[float]:
    """``method``'s error averaged over each run (``last``: over its last round), per seed."""
    return [
        float(r.round_errors[-1] if last else r.average_error)
        for r in results
        if r.spec.method == method
    ]


def chosen(flag: str, text: str, allowed: Sequence[Any]) -> list[Any]:
    """``flag``'s comma-separated items, each one of ``allowed`` (as text), else a SystemExit."""
    names = {str(a): a for a in allowed}
    if bad := [x for x in split_csv(text) if x not in names]:
        raise SystemExit(f"{flag} must be among {', '.join(names)}, got {', '.join(bad)}")
    return [names[x] for x in split_csv(text)]


def saved(folders: str, order: Sequence[str], committed: Path) -> dict[str, Any]:
    """``--report-only``'s study: those saved in ``folders`` merged (:func:`merged`), or the
    committed results where none of the folders holds one."""
    if any((Path(x) / "study.json").is_file() for x in split_csv(folders)):
        return merged(folders, order)
    print(f"no study.json in {folders}: rendering {committed}", flush=True)
    return json.loads(committed.read_text(encoding="utf-8"))


def merged(folders: str, order: Sequence[str]) -> dict[str, Any]:
    """The studies saved in ``folders`` (comma-separated) as one, its streams in ``order``: the
    seeds united, each stream's parts merged key by key, runs of the same cell list (one dict per
    seed) concatenated, so parts and seeds split across folders combine. The studies' other
    settings (a variant's, a source model's) are kept; folders that differ in them are refused."""
    paths = [Path(x) for x in split_csv(folders)]
    studies = [json.loads((p / "study.json").read_text(encoding="utf-8")) for p in paths]
    data, first = studies[0], _settings(studies[0])
    for folder, one in zip(paths[1:], studies[1:], strict=True):
        if _settings(one) != first:
            raise SystemExit(f"{folder} was run with {_settings(one)}, {paths[0]} with {first}")
        for name, s in one["streams"].items():
            _merge(data["streams"].setdefault(name, {}), s)
    data["seeds"] = sorted({seed for one in studies for seed in one["seeds"]})
    data["streams"] = dict(sorted(data["streams"].items(), key=lambda kv: order.index(kv[0])))
    return data


def _settings(study: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in study.items() if k not in ("streams", "seeds")}


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


def with_streams(
    page: Template, streams: dict[str, Any], block: Callable[[str, Any], str], **values: object
) -> str:
    """``page`` filled, its ``$streams`` each stream's heading (the fragment ``stream``: its name
    and protocol) and ``block(name, stream)``, where not empty (none: that line dropped)."""
    blocks = [
        f"{page('stream', name=name, protocol=json.dumps(s['protocol']))}\n\n{body}"
        for name, s in streams.items()
        if (body := block(name, s))
    ]
    text = page(streams="\n" + "\n\n".join(blocks) if blocks else "", **values)
    return text if blocks else text[:-1]


def publish(text: str, data: dict[str, Any], tables: str, doc: str = "", markers: str = "") -> None:
    """The study's tables and numbers (:func:`write_tables`) and, where ``doc`` is a file, its
    section between ``<!-- markers:begin -->`` and ``<!-- markers:end -->``."""
    write_tables(text, data, tables)
    if Path(doc).is_file():
        replace_section(Path(doc), f"<!-- {markers}:begin -->", f"<!-- {markers}:end -->", text)
        print(f"tables: {tables}; section of {doc} regenerated")
    else:
        print(f"tables: {tables}")


def verdict(ok: bool) -> str:
    """A bar's verdict."""
    return "met" if ok else "missed"
