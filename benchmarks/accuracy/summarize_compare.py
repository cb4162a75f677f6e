"""Summarise `python -m fisher_ref compare --json` files as one markdown table.

    python benchmarks/accuracy/summarize_compare.py docs/gpu/*.json

One row per (task, dtype): rows passing, the worst relative error and the
quantity it came from, the tolerance; and the Monte Carlo statistic.
"""
import json


def summarize(paths):
    lines = ["| config | dtype | rows pass | worst rel. error (quantity) | tolerance |",
             "|---|---|---|---|---|"]
    mc = []
    for path in paths:
        d = json.load(open(path))
        if "rows" not in d:  # a bench or big-task record, not a compare run
            continue
        for dtype in d["dtypes"]:
            rows = [r for r in d["rows"] if r["dtype"] == dtype and r["test"] == "rel"]
            worst = max(rows, key=lambda r: r["max_rel_error"])
            npass = sum(r["passed"] for r in rows)
            lines.append(f"| {d['task']} | {dtype} | {npass}/{len(rows)} | "
                         f"{worst['max_rel_error']:.1e} ({worst['quantity']}) | "
                         f"{d['tolerances'][dtype]:g} |")
        mc += [f"{d['task']} {r['quantity']}: {r['statistic']:.2f}"
               for r in d["rows"] if r["test"] != "rel"]
    lines.append("")
    lines.append("Monte Carlo rows (Bernstein statistic, passes at <= 1): " + "; ".join(mc))
    return "\n".join(lines)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", metavar="FILE", help="compare --json records")
    print(summarize(ap.parse_args(argv).paths))


if __name__ == "__main__":
    main()
