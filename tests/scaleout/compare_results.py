#!/usr/bin/env python3
"""Compares two kvtier results files row by row, each row keyed by its run's point.

usage: compare_results.py A.sqlite B.sqlite

Every table with a run_id column is compared as a multiset of rows in which run_id is replaced
by the run's (config_sha256, trace_sha256, mode); `runs` itself without run_id, started_at,
wall_s and git_commit (when and by which build a run ran, not what it computed). Two kinds of
metrics are left out for the same reason: wall_s (the run's wall time), and selection_memo_*,
which count the ITF decisions read from the selection memo rather than computed, and so depend
on which run of the trace came first, not on the results (the memo changes no decision). Exit 0 when equal, 1 otherwise
(the first differences printed), 2 on bad input.
"""
import collections
import sqlite3
import sys

IGNORED_RUN_COLUMNS = {"run_id", "started_at", "wall_s", "git_commit"}


def rows(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    point = {rid: (c, t, m) for rid, c, t, m in
             db.execute("SELECT run_id, config_sha256, trace_sha256, mode FROM runs")}
    tables = [r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    out = {}
    for table in tables:
        columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
        if "run_id" not in columns:
            continue
        keep = [c for c in columns if not (table == "runs" and c in IGNORED_RUN_COLUMNS)]
        counter = collections.Counter()
        for row in db.execute(f"SELECT {', '.join(columns)} FROM {table}"):
            record = dict(zip(columns, row))
            if table == "metrics" and (record["name"] == "wall_s" or
                                       record["name"].startswith("selection_memo_")):
                continue
            key = point[record["run_id"]]
            counter[(key,) + tuple(record[c] for c in keep if c != "run_id")] += 1
        out[table] = counter
    db.close()
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = rows(sys.argv[1]), rows(sys.argv[2])
    equal = True
    for table in sorted(set(a) | set(b)):
        ra, rb = a.get(table, collections.Counter()), b.get(table, collections.Counter())
        if ra == rb:
            print(f"{table}: {sum(ra.values())} rows equal")
            continue
        equal = False
        only_a, only_b = ra - rb, rb - ra
        print(f"{table}: {sum(only_a.values())} rows only in {sys.argv[1]}, "
              f"{sum(only_b.values())} only in {sys.argv[2]}")
        for row in list(only_a)[:3]:
            print(f"  < {row}")
        for row in list(only_b)[:3]:
            print(f"  > {row}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
