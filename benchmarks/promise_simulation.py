"""The promise of ``eatta-safe`` on simulated streams: the rule in :mod:`eatta.monitor.promise`
(each served batch certified by its own answer) against the pooled rule it replaced (one bound on
the harm per disagreement over every answer since the start, assumed to hold for unanswered
batches too), over many seeds, at every kind of annotator.

A simulated batch has ``n`` samples, ``D`` of them where the adapted model differs from the given
one; on each of those the adapted model is right where the given one errs (``h = -1``), wrong
where it is right (``h = +1``) or both err (``h = 0``), with probabilities that drift along the
stream, and a label-free score (the blend's lean toward the adapted class) that is higher, on
average, where the adapted model is right. The blend takes the adapted model's side where the
score is positive; a part serves the adapted class on the highest scores only. One request a
batch is drawn as :class:`eatta.selection.drawn.DisagreementDraw` draws it (``explore`` of it
uniform over the batch, the rest uniform over the disagreements), answered at once, ``delay``
batches late, at a person's pace (one answer every ``PACE`` batches, the newest request first,
requests older than 64 batches dropped) or never.

Reported per scenario, annotator and rule: the kept share of the adapted model's gain (the
served excess over the given model, against the adapted model served everywhere; '-' where the
adapted model gains nothing), the largest running excess over the given model at any batch (worst
seed), and the runs whose running excess passed the tolerance. The scenarios are built, not
measured: they tune the bets (:data:`eatta.monitor.promise.BETS`) and choose the options; no real
stream does.

    python benchmarks/promise_simulation.py --seeds 40 \
        --out benchmarks/results/safety_study_simulation.md
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eatta.monitor.promise import Promise, psi_e

EXPLORE, N = 0.25, 64
#: Batches per answer at a person's pace (docs/real-annotators.md: about one answer in twelve).
PACE = 12
PATIENCE = 64


@dataclass(frozen=True)
class Phase:
    """Batches of a stretch: mean disagreements and the chances of ``h = -1`` and ``+1``."""

    batches: int
    disagree: float
    helps: float
    harms: float
    signal: float = 1.0  # how far the score moves with h (a normal of sd 1)
    blend_at: float = 0.0  # the blend takes the adapted side above this score


SCENARIOS: dict[str, list[Phase]] = {
    # the adapted model helps throughout
    "helps": [Phase(300, 10, 0.6, 0.15)],
    # worse than the given model for 100 batches, then better
    "bad-then-good": [Phase(100, 10, 0.2, 0.5), Phase(300, 10, 0.6, 0.15)],
    # wrong on every disagreement: the adversary
    "adversarial": [Phase(300, 12, 0.0, 1.0)],
    # 76 batches, mostly clean (a few disagreements, a toss-up), four corrupted stretches of four
    # batches where it helps a lot: the shape of the deployed digits
    "deployed-like": [
        *(p for _ in range(4) for p in (Phase(12, 2, 0.35, 0.3), Phase(4, 25, 0.75, 0.05))),
        Phase(12, 2, 0.35, 0.3),
    ],
    # long, many disagreements, a slow start: the shape of the mixed digits-C
    "mixed-like": [Phase(40, 35, 0.3, 0.3), Phase(380, 35, 0.45, 0.2)],
    # as measured on the mixed digits-C (seed 0, eatta-safe): 32 disagreements a batch, a harm
    # of -0.2 per disagreement, the blend on about 4 of them at -0.5, the ranking's best at -0.6
    "mixed-measured": [Phase(422, 32, 0.35, 0.15, signal=0.5, blend_at=1.5)],
    # short and clear: 140 batches of a few disagreements, the adapted model right on most (the
    # shape of a model trained elsewhere on a small clean stream)
    "short-clear": [Phase(140, 8, 0.85, 0.05)],
    # harmful exactly on the batches whose answer never comes (1 in PACE answered): what pooling
    # cannot see at a person's pace
    "hidden-harm": [Phase(300, 10, -1.0, -1.0)],
}


@dataclass
class Batch:
    h: list[int]  # per disagreement
    score: list[float]  # the blend's lean to the adapted class, per disagreement
    served: frozenset[int] = frozenset()  # the disagreements the adapted model served
    q: float = 0.0  # the inclusion probability per draw of each of them


def _stream(
    phases: Sequence[Phase], rng: random.Random, answered: Callable[[int], bool]
) -> list[Batch]:
    out, t = [], 0
    for ph in phases:
        for _ in range(ph.batches):
            d = min(N, _poisson(rng, ph.disagree))
            helps, harms = ph.helps, ph.harms
            if helps < 0:  # hidden harm: helps on the answered batches, harms on the others
                helps, harms = (0.8, 0.05) if answered(t) else (0.05, 0.8)
            h = []
            for _ in range(d):
                u = rng.random()
                h.append(-1 if u < helps else (1 if u < helps + harms else 0))
            score = [rng.gauss(-x * ph.signal, 1.0) - ph.blend_at for x in h]
            out.append(Batch(h, score))
            t += 1
    return out


def _poisson(rng: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    k, p, target = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p < target:
            return k
        k += 1


# -- the pooled rule (the one replaced), kept here to compare ------------------------------------

_POOLED_BETS = (("h", 2.0, 0.2), ("eb", 0.9, 0.25), ("eb", 0.6, 0.15), ("eb", 0.35, 0.15))
_POOLED_BETS += (("eb", 0.2, 0.15), ("eb", 0.1, 0.1))


class _Rate:
    """An anytime-valid upper bound on the mean harm per disagreement of the answered draws."""

    def __init__(self, level: float) -> None:
        self.level, self.c = level, 2.0 / (1.0 - EXPLORE)
        self.draws, self.total, self.spread, self.centre, self.upper = 0, 0.0, 0.0, 0.0, 1.0

    def add(self, r: float) -> None:
        y = max(-0.5, min(0.5, -r / self.c))
        d = max(-0.5, min(0.5, self.centre / (self.draws + 1)))
        self.spread += (y - d) ** 2
        self.centre += y
        self.total += r
        self.draws += 1
        terms = [
            (lam, w, psi_e(lam) * self.spread if k == "eb" else self.draws * lam * lam / 8)
            for k, lam, w in _POOLED_BETS
        ]
        target = 1.0 / self.level

        def mix(t: float) -> float:
            return sum(w * math.exp(min(700.0, lam * t / self.c - p)) for lam, w, p in terms)

        hi = min((math.log(target / w) + p) * self.c / lam for lam, w, p in terms)
        lo = 0.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if mix(mid) < target else (lo, mid)
        self.upper = max(-1.0, min(1.0, (self.total + hi) / self.draws))


class _Pooled:
    def __init__(self, tolerance: float, level: float) -> None:
        self.tol = tolerance
        self.a, self.b = _Rate(level / 2), _Rate(level / 2)
        self.samples, self.ledger, self.da, self.db = 0, 0.0, 0, 0

    def choose(self, d: int, db: int) -> str:
        room = self.tol / 100 * (self.samples + N)

        def rate(da: int = 0, dbb: int = 0) -> float:
            return self.a.upper * (self.da + da) + self.b.upper * (self.db + dbb)

        options = [
            ("adapted", min(rate(d, 0), self.ledger + d)),
            ("blend", min(rate(0, d), self.ledger + db)),
            ("given", min(rate(), self.ledger)),
        ]
        what, bound = next(o for o in options if o[1] <= room + 1e-12 or o[0] == "given")
        self.da += d if what == "adapted" else 0
        self.db += d if what == "blend" else 0
        self.samples += N
        self.ledger = bound
        return what


# -- one run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    name: str
    pooled: bool = False
    blend: bool = True
    part: bool = True
    focus: bool = True
    stake: float = 1.0  # the share of the room a batch may take (1: the library's, STAKE)


RULES = (
    Rule("pooled", pooled=True),
    Rule("own", blend=False),
    Rule("own, whole room", blend=False, stake=1.0 + 1e-12),
    Rule("own, and the blend", blend=True),
    Rule("own, no part", blend=True, part=False),
    Rule("own, draw unfocused", blend=False, focus=False),
)
ANNOTATORS = ("at once", "16 late", "person", "never", "1 step in 3")


def _answer_times(annotator: str, batches: int) -> dict[int, int]:
    """Batch -> the batch after which its answer arrives (absent: never)."""
    if annotator == "at once":
        return {t: t for t in range(batches)}
    if annotator == "16 late":
        return {t: t + 16 for t in range(batches)}
    if annotator == "never":
        return {}
    if annotator == "1 step in 3":  # a slow method: the other batches served without a step
        return {t: t for t in range(0, batches, 3)}
    out, free, waiting = {}, 0.0, []
    for now in range(batches + PACE * 2):
        if now < batches:
            waiting.append(now)
        while free <= now:
            waiting = [w for w in waiting if now - w <= PATIENCE]
            if not waiting:
                free = now + 1
                break
            pick = max(waiting)
            waiting.remove(pick)
            free = max(free, pick) + PACE
            out[pick] = math.ceil(free)
    return out


def run(
    rule: Rule, phases: Sequence[Phase], annotator: str, seed: int, tol: float, level: float
) -> tuple[float, float, float]:
    """``(served excess, the adapted model's excess, largest running excess in points)``."""
    total = sum(p.batches for p in phases)
    times = _answer_times(annotator, total)
    rng = random.Random(seed)
    stream = _stream(phases, rng, lambda t: t in times)
    arrivals: dict[int, list[tuple[int, ...]]] = {}
    promise = Promise(tol, level) if not rule.pooled else None
    pooled = _Pooled(tol, level) if rule.pooled else None
    excess = full = 0
    worst = -math.inf
    for t, b in enumerate(stream):
        d = len(b.h)
        blend = [i for i in range(d) if b.score[i] > 0]
        if promise is not None:
            whole = promise.room(N)
            skipped = annotator == "1 step in 3" and t % 3 != 0  # known when it is served
            room = promise.stake(N, measured=not skipped)
            if rule.stake != 1.0:
                room = max(rule.stake * whole, min(whole, 1))
            if d <= room:
                served = list(range(d))
            elif rule.blend and len(blend) <= room:
                served = blend
            elif rule.part and room >= 1:
                order = sorted(range(d), key=lambda i: -b.score[i])
                served = order[: math.floor(room + 1e-9)]
            else:
                served = []
            promise.serve(N, len(served))
        else:
            assert pooled is not None
            what = pooled.choose(d, len(blend))
            served = {"adapted": list(range(d)), "blend": blend, "given": []}[what]
        x = sum(b.h[i] for i in served)
        excess += x
        full += sum(b.h)
        # the draw: explore uniform over the batch, the rest over the disagreements, or over the
        # samples where what served differs from the given model (the rule's focus)
        focus = (
            sorted(served) if (rule.focus and served and promise is not None) else list(range(d))
        )
        f = len(focus)
        qd = EXPLORE / N + ((1 - EXPLORE) / f if f else 0.0)
        pick = None
        if f and rng.random() < (1 - EXPLORE) + EXPLORE * f / N:
            pick = focus[rng.randrange(f)]
        elif d and f < d and rng.random() < (d - f) / (N - f):  # an explore draw off the focus
            pick = rng.choice([i for i in range(d) if i not in set(focus)])
        if t in times:
            arrivals.setdefault(times[t], []).append((t, -1 if pick is None else pick))
        b.served, b.q = frozenset(served), qd
        for bt, i in arrivals.pop(t, []):
            ob = stream[bt]
            sv, dd, q = ob.served, len(ob.h), ob.q
            if promise is not None:
                share = len(sv)
                if share == 0:
                    continue
                h = ob.h[i] if i >= 0 and i in sv else 0
                bound = 1.0 / q  # every served sample is in the focus
                promise.answer(share, h / q, bound, share)
            else:
                assert pooled is not None
                if dd == 0:
                    continue
                ha = ob.h[i] if i >= 0 else 0
                hb = ha if i >= 0 and ob.score[i] > 0 else 0
                pooled.a.add(ha / (q * dd))
                pooled.b.add(hb / (q * dd))
        worst = max(worst, 100.0 * excess / ((t + 1) * N))
    return excess, full, worst


def table(
    seeds: int,
    tol: float,
    level: float,
    rules: Sequence[Rule],
    scenarios: Sequence[str],
    annotators: Sequence[str],
) -> str:
    head = "| scenario | annotator | " + " | ".join(r.name for r in rules) + " |"
    lines = [head, "|" + "---|" * (2 + len(rules))]
    for name in scenarios:
        phases = SCENARIOS[name]
        for ann in annotators:
            cells = []
            for rule in rules:
                kept, worst, over = [], -math.inf, 0
                for s in range(seeds):
                    e, f, w = run(rule, phases, ann, s, tol, level)
                    if f < 0:
                        kept.append(e / f)
                    worst = max(worst, w)
                    over += w > tol
                k = f"{100 * sum(kept) / len(kept):.0f} %" if len(kept) == seeds else "-"
                cells.append(f"{k}, {worst:+.2f}, {over}")
            lines.append(f"| {name} | {ann} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--tolerance", type=float, default=0.5)
    p.add_argument("--level", type=float, default=0.05)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--annotators", default=",".join(ANNOTATORS))
    p.add_argument("--rules", default="", help="indices into RULES (default: all)")
    p.add_argument("--out", help="write the table here too")
    args = p.parse_args(argv)
    rules = [RULES[int(i)] for i in args.rules.split(",")] if args.rules else list(RULES)
    text = table(
        args.seeds,
        args.tolerance,
        args.level,
        rules,
        args.scenarios.split(","),
        args.annotators.split(","),
    )
    text = (
        f"Kept share of the adapted model's gain (mean over {args.seeds} seeds), the largest "
        f"running excess over the given model in points (worst seed), runs past "
        f"{args.tolerance} points; tolerance {args.tolerance}, level {args.level}.\n\n{text}"
    )
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
