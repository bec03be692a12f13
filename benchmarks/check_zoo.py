"""How well does ``attnscale check`` tell healthy checkpoints from broken ones?

    python benchmarks/check_zoo.py [--root /tmp/check_zoo] [--out results/check_zoo.json]

Builds the labelled zoo of :mod:`attnscale.integrations.zoo` (MiniLM as shipped; its layer-3 q
and k scaled by 3, 10, 30; a NaN weight; a fresh init; character BERTs trained at LRs from
healthy to diverging, a tuning set and a report set) and checks every member with the default
thresholds and with the old ones (logit std > 1·s_c, every near-uniform head, saturated rows >
50%), on the check's 64 default sentences. Prints, per member, its label, the exit status check
would give and its flags, then for each rule set the share of broken members caught and of
healthy ones flagged (degraded ones, past their stable LR but not diverged, apart). The README's
table comes from this (recorded in ``benchmarks/recorded/check_zoo_2core.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnscale.integrations import checkup as C
from attnscale.integrations.zoo import REPORT_SET, TUNE_SET, build_zoo, score_zoo, train_zoo
from attnscale.util.provenance import git_revision, versions

RULES = {"default": C.Thresholds(), "old (1·s_c, saturated > 50%)":
         C.Thresholds(std_factor=1.0, saturated_above=0.5, uniform_share=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/check_zoo", help="where the zoo is written")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    made = build_zoo(args.root)
    tune, report = train_zoo(args.root, TUNE_SET), train_zoo(args.root, REPORT_SET)
    sets = {"MiniLM and its copies": made, "trained, tuning set (seed 0)": tune,
            "trained, report set (seed 1)": report}
    results = {f"{rules} | {where}": score_zoo(zoo, t) for rules, t in RULES.items()
               for where, zoo in sets.items()}
    for name, res in results.items():
        print(f"\n{name}: caught {res['caught']}/{res['broken']} broken, "
              f"false alarms {res['false_alarms']}/{res['healthy']} healthy, degraded flagged "
              f"{res['degraded_flagged']}/{res['degraded']}")
        for m in res["members"]:
            code = 0 if m["healthy"] else 1
            print(f"  {m['name']:<12} {m['label']:<8} exit {code}  max std/s_c "
                  f"{m['max_std_over_s_c']:8.1f}  {m['flags'] or '-'}  ({m['what']})")
    if args.out:
        record = {"rules": {k: vars(v) for k, v in RULES.items()}, "results": results,
                  "versions": versions(), "git_rev": git_revision()}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
