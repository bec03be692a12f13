"""A verdict must survive the choice of learning rate.

Each arm of a training study is read at its chosen LR (:mod:`attnscale.audit.selection`). Where
the data do not show that LR clearly better than its better grid neighbour, the runner-up, the
arm also carries its seeds' values at the runner-up (:attr:`attnscale.audit.evidence.Arm.alt`).
A rule applied at the chosen LRs answers one question among several the data cannot tell apart;
the report therefore applies it again with arms read at their runner-ups, and keeps its verdict
only if every such reading agrees. Otherwise the verdict is ``inconclusive``, and the page says
which arm's LR changes it. This is an intersection-union reading (Berger 1982, Technometrics
24(4)): a verdict kept only if it holds at every LR read needs no correction for the number of
readings. It protects the verdict as far as each arm's best LR is among those read: the other
neighbour is never read, and each arm's screen errs on its own.

Readings: every combination of arms at their runner-ups when at most :data:`MAX_PRODUCT` arms have
one (at most 255 readings); beyond that, each arm alone and all of them together. An arm is
one (cell, arm) of one study: the tables that read the same runs (loss and accuracy, say) switch
together.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from attnscale.audit.evidence import Arm
from attnscale.audit.verdicts import INCONCLUSIVE, Verdict

MAX_PRODUCT = 8  # arms with a runner-up up to which every combination is read
Path = tuple[str, ...]
Key = tuple[Any, ...]  # one arm: (cell, arm name, its LRs, its runner-up LRs)

RULE = (" A verdict stands only if the rule gives it again with any arm read at its runner-up "
        "LR (the better grid neighbour of its chosen LR) unless that LR is clearly worse: the "
        "one-sided 95% lower bound of its paired loss gap over the reported seeds (for the LR "
        "sweep, the other seeds) above 0.02 nats, or, for a tuned study, every tuning seed "
        "putting it more than 0.02 nats above (then it is not trained); otherwise "
        "inconclusive.")


def arms(ev: Any, path: Path = ()) -> Iterator[tuple[Path, Arm]]:
    """Every :class:`Arm` in typed evidence ``ev`` with its path of field names and keys."""
    if isinstance(ev, Arm):
        yield path, ev
    elif isinstance(ev, BaseModel):
        for name in type(ev).model_fields:
            yield from arms(getattr(ev, name), (*path, name))
    elif isinstance(ev, dict):
        for k, v in ev.items():
            yield from arms(v, (*path, str(k)))
    elif isinstance(ev, list | tuple):
        for i, v in enumerate(ev):
            yield from arms(v, (*path, str(i)))


def key(path: Path, arm: Arm) -> Key:
    """Which runs an arm reads: its ``source`` (study, cell, arm), shared by every table of the
    same runs; an arm without one (built by hand) is its own group, by its path."""
    return tuple(arm.source) if arm.source else ("", "/".join(path), "")


def switchable(ev: Any) -> dict[Key, list[Path]]:
    """key -> the paths of the arms that have a runner-up, in evidence order."""
    out: dict[Key, list[Path]] = {}
    for path, arm in arms(ev):
        if arm.alt:
            out.setdefault(key(path, arm), []).append(path)
    return out


def first_arms(ev: Any) -> dict[Key, Arm]:
    """key -> the first arm with a runner-up of that key (for labels)."""
    out: dict[Key, Arm] = {}
    for path, arm in arms(ev):
        if arm.alt:
            out.setdefault(key(path, arm), arm)
    return out


def readings(groups: list[Key]) -> list[tuple[Key, ...]]:
    """The combinations of arms read at their runner-ups (see the module docstring)."""
    if len(groups) <= MAX_PRODUCT:
        return [c for k in range(1, len(groups) + 1) for c in itertools.combinations(groups, k)]
    return [(g,) for g in groups] + [tuple(groups)]


def switched(ev: BaseModel, paths: list[Path]) -> dict[str, Any]:
    """``ev`` as a plain dict with the arms at ``paths`` read at their runner-ups."""
    out = ev.model_dump()
    for path in paths:
        node = out
        for k in path[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = int(path[-1]) if isinstance(node, list) else path[-1]
        node[last] = Arm.model_validate(node[last]).at_runner_up().model_dump()
    return out


def label(combo: tuple[Key, ...], groups: Mapping[Key, Arm]) -> str:
    """``scaled_dot (all) at 0.03`` for each arm of a combination (``groups``: key -> one of
    its arms)."""
    def one(k: Key) -> str:
        arm = groups[k]
        lrs = sorted(set(arm.alt_lrs.values()) - set(arm.lrs.values())) or sorted(
            set(arm.alt_lrs.values()))
        return f"{k[2] or k[1]} ({k[1] if k[2] else 'as read'}) at " + "/".join(
            f"{x:g}" for x in lrs)
    return ", ".join(one(k) for k in combo)


def decide(judge: Callable[[Any], Verdict], read: Callable[[Any], Any], ev: Any) -> Verdict:
    """``judge(ev)``, kept only if every runner-up reading (``judge(read(switched))``) gives the
    same verdict; otherwise ``inconclusive``, saying which reading changes it."""
    base = judge(ev)
    groups = switchable(ev)
    if not groups or base.verdict == INCONCLUSIVE:  # undecided already: nothing to keep
        return base
    named = first_arms(ev)
    combos = readings(list(groups))
    results = [(c, judge(read(switched(ev, [p for k in c for p in groups[k]])))) for c in combos]
    other = [(c, v) for c, v in results if v.verdict != base.verdict]
    note = (f"Read again with arms at their runner-up LRs ({len(results)} readings, "
            f"{len(groups)} arms):")
    if not other:
        plain = [*base.plain, f"The verdict is the same with any of the {len(groups)} arms "
                 "whose LR the tuning could not pin down read at its runner-up LR."]
        return replace(base, rule=base.rule + RULE, plain=plain,
                       because=f"{base.because} | {note} every one is {base.verdict}")
    combo, v = min(other, key=lambda cv: len(cv[0]))
    which = label(combo, named)
    def rest(x: Verdict) -> str:
        return f" ({x.headline.split(': ', 1)[1]})" if ": " in x.headline else ""
    changed = ", ".join(sorted({x.verdict for _, x in other}))
    return Verdict(
        INCONCLUSIVE, base.rule + RULE,
        f"{base.because} | {note} {len(other)} differ ({changed}); e.g. with {which}: "
        f"{v.headline}", base.numbers,
        headline=f"{INCONCLUSIVE}: {base.verdict} at the chosen LRs, {v.verdict} with "
                 f"{which}",
        plain=[f"Not decided by the choice of LR: at each arm's chosen LR the rule reads "
               f"{base.verdict}{rest(base)}, but with {which} it reads "
               f"{v.verdict}{rest(v)}.",
               "The seeds cannot separate those LRs (the runner-up is not clearly more than 0.02 "
               "nats worse than the choice), so the study cannot say which reading holds; "
               "seeds that separate them, or a comparison at matched LRs, would."],
        regime=base.regime, smallest=base.smallest, by_lr_choice=True)
