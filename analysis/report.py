#!/usr/bin/env python3
"""kvtier report: the papers' figures and a browsable page from a kvtier results database.

    python3 analysis/report.py R.sqlite --out DIR [--runs 1,3-5]
    (normally through `kvtier report R.sqlite --out DIR`, which finds this script and a Python
    with matplotlib)

Every figure is one entry of FIGURES: an SQL query over the documented tables and views
(analysis/SCHEMA.md) and a plot kind. For each figure whose query returns rows, DIR gets
<id>.png, <id>.svg, <id>.csv (exactly the query's result: the plotted data) and <id>.sql (the
query as run, with the selected run ids written in). DIR/index.html shows the figures, the
summary tables, the runs and their configurations; it needs nothing outside DIR.

Only complete runs with status 'ok' are plotted (an interrupted or failed run is listed with the
reason it was left out). A figure whose tables or views are absent, or whose query returns no
row, is listed under "Not drawn" with what it needs. Views that an older results file lacks are
created as TEMP views from analysis/views.sql (found beside this script) for this connection
only: the file is opened read-only and never written.

Adding a figure is adding one Figure(...) to FIGURES. Exit codes: 0 written (figures or not),
2 bad input (missing or non-SQLite database, not a kvtier database, unknown run ids, --out not
writable, matplotlib missing).
"""

import argparse
import csv
import datetime
import html
import math
import os
import re
import sqlite3
import sys
from dataclasses import dataclass

EXIT_BAD_INPUT = 2

# A run's panel in the per-run figures: the runs that are comparable (same experiment, model,
# hardware and mode). Its label in the panel: the system, plus the run id when the panel holds
# the same system more than once (reruns, sweep points).
PANEL = ("r.experiment || ' · ' || r.model || ' · ' || r.hardware || "
         "CASE WHEN r.mode = 'sim' THEN '' ELSE ' (' || r.mode || ')' END")
# Bars and lines of a panel in the order of the run's experiment.systems (the order the user
# listed them; run ids of parallel runs are assigned in whatever order the runs start), then by
# system and run id.
RANK = ("instr(',' || (SELECT substr(v, 1, instr(v || char(10), char(10)) - 1) FROM "
        "(SELECT substr(char(10) || r.config, instr(char(10) || r.config, char(10) || "
        "'experiment.systems = ') + 22) AS v)) || ',', ',' || r.system || ','), r.system")
LABEL = ("r.system || CASE WHEN (SELECT COUNT(*) FROM runs o WHERE o.run_id IN {runs} AND "
         "o.experiment = r.experiment AND o.model = r.model AND o.hardware = r.hardware AND "
         "o.mode = r.mode AND o.system = r.system) > 1 THEN ' #' || r.run_id ELSE '' END")


@dataclass
class Figure:
    """One figure: its query and how to draw the query's rows.

    sql: SELECT over documented tables/views; {runs} is replaced by the parenthesised list of
         selected run ids (complete, status 'ok'), {panel}/{label} by PANEL/LABEL over `r`.
    plot: a key of PLOTS; params: the plot's column names and labels (see the plot functions).
    needs: tables and views the query reads (a figure is skipped when one is absent).
    missing: what the database lacks when the query returns no row, and how to get it.
    """
    id: str
    title: str
    caption: str
    needs: tuple
    sql: str
    plot: str
    params: dict
    missing: str


# Figure definitions. Each query's result is exactly what is plotted (and written as CSV).
FIGURES = [
    Figure(
        id="ttft_by_system",
        title="TTFT per system (SPEC Fig. 16)",
        caption="Mean and p99 (nearest rank) time to first token of the measured requests "
                "(warm-up excluded), service time without queueing (view run_summary).",
        needs=("run_summary", "runs"),
        sql="""SELECT s.run_id, {panel} AS panel, {label} AS label, s.requests,
       s.mean_ttft_s, s.p99_ttft_s
FROM run_summary s JOIN runs r USING (run_id)
WHERE s.run_id IN {runs} AND r.mode IN ('sim', 'hw')
ORDER BY panel, {rank}, s.run_id""",
        plot="bars",
        params=dict(panel="panel", x="label",
                    values=[("mean_ttft_s", "mean"), ("p99_ttft_s", "p99")],
                    scale=1e3, ylabel="TTFT (ms)"),
        missing="no complete sim or hw run with measured requests (kvtier sim, kvtier hw)"),
    Figure(
        id="exposed_io",
        title="Exposed I/O per system, by tier and purpose (SPEC Fig. 17)",
        caption="Mean time per measured request that the GPU waited for KV (requests.io_stall_s), "
                "split over what it waited on (view exposed_io): each layer's stall is shared "
                "among the transfers of that layer in proportion to the time each was "
                "outstanding (submitted, not finished) in the layer's window; the stall that no "
                "transfer of the layer covers (waits on other layers' transfers, stores, Cake's "
                "loads, or runs with log.transfers = false) is 'unattributed'. An attribution by "
                "overlap, not a measurement of which transfer was critical.",
        needs=("exposed_io", "runs"),
        sql="""SELECT e.run_id, {panel} AS panel, {label} AS label,
       CASE WHEN e.tier = 'none' THEN e.purpose ELSE e.tier || ' ' || e.purpose END AS part,
       e.mean_exposed_s
FROM exposed_io e JOIN runs r USING (run_id)
WHERE e.run_id IN {runs}
ORDER BY panel, {rank}, e.run_id, e.tier = 'none', part""",
        plot="stacked",
        params=dict(panel="panel", x="label", series="part", value="mean_exposed_s",
                    scale=1e3, ylabel="exposed I/O per request (ms)"),
        missing="no complete sim or hw run with measured requests"),
    Figure(
        id="ablation",
        title="Ablation: TTFT normalised to AS+H2O+LFU (SPEC Fig. 18)",
        caption="Mean TTFT of each run divided by that of the as_h2o_lfu run of the same "
                "experiment, model, hardware, mode and trace (view ablation_delta); the "
                "paper's steps are as_h2o_lfu, ablation_itf (+ITF), ablation_ro (+RO), spec (All).",
        needs=("ablation_delta",),
        sql="""SELECT a.run_id, {panel} AS panel, {label} AS label, a.normalized_ttft
FROM ablation_delta a JOIN runs r USING (run_id)
WHERE a.run_id IN {runs}
ORDER BY panel, {rank}, a.run_id""",
        plot="bars",
        params=dict(panel="panel", x="label", values=[("normalized_ttft", "TTFT / baseline")],
                    scale=1, ylabel="normalised mean TTFT", hline=1.0),
        missing="no as_h2o_lfu baseline run beside the other runs of an experiment "
                "(configs/experiments/fig18.ini)"),
    Figure(
        id="hit_ratios",
        title="Where reused chunks came from (SPEC Fig. 21)",
        caption="Share of chunk uses of the measured requests served by the GPU cache, the CPU "
                "cache and the SSD (view hit_ratios); runs that use no chunk (recomp) are left out.",
        needs=("hit_ratios", "runs"),
        sql="""SELECT h.run_id, {panel} AS panel, {label} AS label,
       h.gpu_hit_ratio, h.cpu_hit_ratio, h.ssd_ratio
FROM hit_ratios h JOIN runs r USING (run_id)
WHERE h.run_id IN {runs} AND h.gpu_hit_ratio IS NOT NULL
ORDER BY panel, {rank}, h.run_id""",
        plot="stacked",
        params=dict(panel="panel", x="label",
                    values=[("gpu_hit_ratio", "GPU"), ("cpu_hit_ratio", "CPU"),
                            ("ssd_ratio", "SSD")],
                    scale=1, ylabel="share of chunk uses", colors=["#2ca02c", "#1f77b4", "#d62728"]),
        missing="no complete run that reused cached chunks"),
    Figure(
        id="sweeps",
        title="Sweeps: mean TTFT against each swept key (SPEC Figs. 22-23, Cake Fig. 5)",
        caption="Runs of one experiment, mode and system whose resolved configurations differ "
                "in a key (view swept_keys: what `kvtier sweep --set` varies, or separate "
                "`kvtier sim` runs with different overrides or traces); one line per system and "
                "combination of the other swept keys. Numeric values with units are placed on a "
                "numeric axis (value_num, in bytes, bytes/s or seconds), others in run order.",
        needs=("swept_keys", "run_summary"),
        sql="""WITH k AS MATERIALIZED (SELECT * FROM swept_keys WHERE run_id IN {runs})
SELECT p.run_id, p.experiment || ' · ' || p.key || CASE WHEN p.mode = 'sim' THEN ''
         ELSE ' (' || p.mode || ')' END AS panel,
       p.system || COALESCE(' ' || (SELECT group_concat(kv, ' ') FROM
         (SELECT o.key || '=' || o.value AS kv FROM k o
          WHERE o.run_id = p.run_id AND o.key <> p.key ORDER BY o.key)), '') AS series,
       p.value, p.value_num, s.mean_ttft_s
FROM k p JOIN run_summary s USING (run_id)
ORDER BY panel, MIN(p.run_id) OVER (PARTITION BY panel, series), p.value_num, p.run_id""",
        plot="lines",
        params=dict(panel="panel", x="value_num", xtext="value", y="mean_ttft_s",
                    series="series", scale=1e3, ylabel="mean TTFT (ms)", marker="o"),
        missing="no sweep: no two complete runs of one experiment and system whose "
                "configurations differ (kvtier sweep --set key=v1,v2)"),
    Figure(
        id="ttft_cdf",
        title="TTFT distribution",
        caption="Cumulative fraction of measured requests against TTFT (view ttft_cdf).",
        needs=("ttft_cdf", "runs"),
        sql="""SELECT c.run_id, {panel} AS panel, {label} AS label, c.ttft_s, c.fraction
FROM ttft_cdf c JOIN runs r USING (run_id)
WHERE c.run_id IN {runs}
ORDER BY panel, {rank}, c.run_id, c.fraction""",
        plot="lines",
        params=dict(panel="panel", x="ttft_s", y="fraction", series="label", xscale=1e3,
                    xlabel="TTFT (ms)", ylabel="fraction of requests", steps=True,
                    xlog="auto"),
        missing="no complete run with measured requests"),
    Figure(
        id="layer_retention",
        title="Share of the reused prefix kept, per layer",
        caption="Tokens kept of the reused prefix R per layer, mean over measured requests "
                "(view layer_retention); 1 for systems that load the whole prefix.",
        needs=("layer_retention", "runs"),
        sql="""SELECT l.run_id, {panel} AS panel, {label} AS label, l.layer, l.retention
FROM layer_retention l JOIN runs r USING (run_id)
WHERE l.run_id IN {runs} AND l.retention IS NOT NULL
ORDER BY panel, {rank}, l.run_id, l.layer""",
        plot="lines",
        params=dict(panel="panel", x="layer", y="retention", series="label",
                    xlabel="layer", ylabel="retention (kept / reused tokens)"),
        missing="no complete run whose requests reused a prefix"),
    Figure(
        id="itf_fallback",
        title="ITF fallback rate per layer",
        caption="Share of measured requests in which ITF fell back to all heads' keys, per layer "
                "(view layer_retention), for runs where ITF ran (mean_itf_similarity not NULL).",
        needs=("layer_retention", "runs"),
        sql="""SELECT l.run_id, {panel} AS panel, {label} AS label, l.layer, l.itf_fallback_rate
FROM layer_retention l JOIN runs r USING (run_id)
WHERE l.run_id IN {runs} AND l.mean_itf_similarity IS NOT NULL
ORDER BY panel, {rank}, l.run_id, l.layer""",
        plot="lines",
        params=dict(panel="panel", x="layer", y="itf_fallback_rate", series="label",
                    xlabel="layer", ylabel="ITF fallback rate"),
        missing="no complete run with ITF (select.policy = itf: impress, spec, ablation_itf)"),
    Figure(
        id="cake_split",
        title="Cake: prefix chunks computed vs loaded",
        caption="Share of the reused prefix's chunks that Cake computed (front to back on the "
                "GPU) and loaded (back to front from the caches and the SSD) before the two met, "
                "over measured requests (view cake_split, from the cake_meet decisions).",
        needs=("cake_split", "runs"),
        sql="""SELECT c.run_id, {panel} AS panel, {label} AS label,
       c.computed_fraction, c.loaded_fraction
FROM cake_split c JOIN runs r USING (run_id)
WHERE c.run_id IN {runs}
ORDER BY panel, {rank}, c.run_id""",
        plot="stacked",
        params=dict(panel="panel", x="label",
                    values=[("computed_fraction", "computed"), ("loaded_fraction", "loaded")],
                    scale=1, ylabel="share of prefix chunks", colors=["#ff7f0e", "#1f77b4"]),
        missing="no complete cake run (systems = cake)"),
    Figure(
        id="sim_vs_hw",
        title="Simulator against hardware: TTFT per request",
        caption="Each measured request's TTFT in the simulator against the same request on the "
                "hardware (view sim_vs_hw, written by kvtier validate); on the dashed identity "
                "line the simulator is exact.",
        needs=("sim_vs_hw",),
        sql="""SELECT v.system || ' (sim #' || v.sim_run_id || ', hw #' || v.hw_run_id || ')'
         AS series, v.request_id, v.hw_ttft_s, v.sim_ttft_s
FROM sim_vs_hw v
WHERE v.sim_run_id IN {runs} AND v.hw_run_id IN {runs}
ORDER BY series, v.request_id""",
        plot="scatter",
        params=dict(x="hw_ttft_s", y="sim_ttft_s", series="series", scale=1e3,
                    xlabel="hardware TTFT (ms)", ylabel="simulated TTFT (ms)", identity=True),
        missing="no complete sim and hw runs of the same experiment, system and trace "
                "(kvtier validate)"),
    Figure(
        id="sim_vs_hw_stages",
        title="Simulator against hardware: error per stage",
        caption="(sim − hw) / hw busy time of each stage over the whole run: SSD reads, H2D "
                "copies, CPU gathers, layer compute (view sim_vs_hw_stages).",
        needs=("sim_vs_hw_stages",),
        sql="""SELECT v.system || ' (sim #' || v.sim_run_id || ', hw #' || v.hw_run_id || ')'
         AS series, v.stage, v.rel_error
FROM sim_vs_hw_stages v
WHERE v.sim_run_id IN {runs} AND v.hw_run_id IN {runs}
ORDER BY v.stage, series""",
        plot="bars",
        params=dict(x="stage", series="series", value="rel_error", scale=100,
                    ylabel="(sim − hw) / hw busy time (%)", hline=0.0),
        missing="no complete sim and hw runs of the same experiment, system and trace "
                "(kvtier validate)"),
    Figure(
        id="accuracy_retention",
        title="Accuracy against retention, per selector",
        caption="Few-shot multiple-choice accuracy (lm-eval acc) with the KV each selector keeps "
                "at each retention ratio (table accuracy, written by kvtier eval); the dashed line "
                "is the full prefix KV.",
        needs=("accuracy", "runs"),
        sql="""SELECT a.run_id, a.task || CASE WHEN (SELECT COUNT(DISTINCT b.run_id) FROM accuracy b
         WHERE b.task = a.task AND b.run_id IN {runs}) > 1 THEN ' #' || a.run_id ELSE '' END
         AS panel,
       a.selector || CASE WHEN a.alpha IS NULL THEN '' ELSE ' α=' || a.alpha END AS series,
       a.retention, a.accuracy
FROM accuracy a JOIN runs r USING (run_id)
WHERE a.run_id IN {runs} AND a.task NOT IN ('texts', 'greedy', 'niah')
ORDER BY panel, series, a.retention""",
        plot="lines",
        params=dict(panel="panel", x="retention", y="accuracy", series="series",
                    xlabel="retention (kept / prefix tokens)", ylabel="accuracy",
                    hline_series="full", marker="o"),
        missing="no complete kvtier eval run"),
    Figure(
        id="accuracy_latency",
        title="Accuracy against latency",
        caption="Each eval configuration's accuracy beside the mean TTFT of the sim/hw runs with "
                "the same model, selector class, retention and alpha (view accuracy_latency).",
        needs=("accuracy_latency",),
        sql="""SELECT x.task AS panel,
       x.system || ' / ' || x.selector || CASE WHEN x.alpha IS NULL THEN ''
         ELSE ' α=' || x.alpha END || ' @' || x.retention AS series,
       x.eval_run_id, x.latency_run_id, x.mean_ttft_s, x.accuracy
FROM accuracy_latency x
WHERE x.eval_run_id IN {runs} AND x.latency_run_id IN {runs}
ORDER BY panel, series, x.latency_run_id""",
        plot="scatter",
        params=dict(panel="panel", x="mean_ttft_s", y="accuracy", series="series", xscale=1e3,
                    xlabel="mean TTFT (ms)", ylabel="accuracy"),
        missing="no kvtier eval run and sim/hw run of the same model, selector, retention and "
                "alpha (e.g. configs/experiments/smollm2-piqa.ini beside kvtier eval)"),
]

# Summary tables in index.html (also written as CSV). Same {runs} substitution.
TABLES = [
    dict(id="summary", title="Run summary", needs=("run_summary",),
         sql="""SELECT s.run_id, s.mode, s.experiment, s.system, s.model, s.hardware, s.requests,
       round(s.mean_ttft_s * 1e3, 2) AS mean_ttft_ms, round(s.p50_ttft_s * 1e3, 2) AS p50_ttft_ms,
       round(s.p99_ttft_s * 1e3, 2) AS p99_ttft_ms,
       round(s.mean_io_stall_s * 1e3, 2) AS exposed_io_ms,
       round(s.gpu_hit_ratio, 3) AS gpu_hit, round(s.cpu_hit_ratio, 3) AS cpu_hit,
       round(s.itf_fallback_rate, 3) AS itf_fallback
FROM run_summary s WHERE s.run_id IN {runs} ORDER BY s.run_id"""),
    dict(id="accuracy", title="Accuracy (kvtier eval)", needs=("accuracy", "runs"),
         sql="""SELECT a.run_id, a.task, a.selector, a.alpha, a.retention, a.items,
       round(a.accuracy, 4) AS accuracy, round(a.first_token_agreement, 4) AS first_token_agreement
FROM accuracy a JOIN runs r USING (run_id) WHERE a.run_id IN {runs}
  AND a.task NOT IN ('texts', 'greedy', 'niah')
ORDER BY a.run_id, a.task, a.selector, a.alpha, a.retention"""),
    dict(id="decode_accuracy", title="Decode accuracy against the 16-bit cache (kvtier eval "
         "--tasks decode)", needs=("accuracy", "runs"),
         sql="""SELECT a.run_id, a.task, a.selector, a.kv_bits, a.kv_group, a.kv_residual, a.kv_quant,
       a.topk, a.items, round(a.accuracy, 4) AS accuracy, round(a.perplexity, 3) AS perplexity,
       round(a.token_agreement, 4) AS token_agreement, round(a.hit_rate, 4) AS hit_rate,
       round(a.oracle_hit_rate, 4) AS oracle_hit_rate, round(a.kv_size_ratio, 4) AS kv_size_ratio
FROM accuracy a JOIN runs r USING (run_id) WHERE a.run_id IN {runs} AND a.kv_bits IS NOT NULL
ORDER BY a.run_id, a.task, a.kv_bits DESC, a.selector, a.kv_quant, a.topk"""),
]


class BadInput(Exception):
    """Bad input: printed as `kvtier report: error: ...`, exit 2."""


# ---------------------------------------------------------------------------------------------
# Database

def open_db(path):
    if not os.path.exists(path):
        raise BadInput(f"{path}: no such file")
    if os.path.isdir(path):
        raise BadInput(f"{path}: is a directory, not a results database")
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}")
    if head != b"SQLite format 3\x00":
        raise BadInput(f"{path}: not an SQLite database (a kvtier results file is written by "
                       "kvtier sim, hw, sweep, validate or eval --out)")
    from urllib.parse import quote
    try:
        db = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
        names = objects(db)
    except sqlite3.Error as e:
        raise BadInput(f"{path}: cannot open: {e}")
    if "runs" not in names:
        raise BadInput(f"{path}: not a kvtier results database (no runs table)")
    return db


def objects(db):
    """Names of the tables and views, the temporary ones included."""
    rows = db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') UNION "
                      "SELECT name FROM sqlite_temp_master WHERE type IN ('table', 'view')")
    return {r[0] for r in rows}


def add_missing_views(db, views_sql):
    """Creates, as TEMP views, the views of analysis/views.sql that the file lacks (a file
    written by an older kvtier). Returns their names. Views whose tables are missing stay absent."""
    if not os.path.exists(views_sql):
        return []
    have = objects(db)
    added = []
    statement = ""
    with open(views_sql, encoding="utf-8") as f:
        for line in f:
            if not statement and (line.startswith("--") or not line.strip()):
                continue
            statement += line
            if not sqlite3.complete_statement(statement):
                continue
            m = re.match(r"\s*CREATE VIEW IF NOT EXISTS (\w+)", statement)
            if m and m.group(1) not in have:
                try:
                    db.execute(statement.replace("CREATE VIEW", "CREATE TEMP VIEW", 1))
                    db.execute(f"SELECT * FROM {m.group(1)} LIMIT 0")
                    added.append(m.group(1))
                except sqlite3.Error:
                    db.execute(f"DROP VIEW IF EXISTS temp.{m.group(1)}")
            statement = ""
    return added


def parse_run_list(text):
    """'1,3-5' -> [1, 3, 4, 5]."""
    ids = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise BadInput(f"--runs: cannot parse '{part}' (expected ids and ranges: 1,3-5)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise BadInput(f"--runs: empty range '{part}'")
        ids.extend(range(lo, hi + 1))
    return ids


@dataclass
class Run:
    run_id: int
    mode: str
    experiment: str
    system: str
    model: str
    hardware: str
    trace: str
    config: str
    started_at: str
    wall_s: object
    complete: int
    status: str
    error: object       # runs.error: what stopped a failed run (NULL otherwise)
    excluded: str = ""  # why it is not plotted ("" = plotted)


def load_runs(db, wanted):
    # runs.error (the failure of a failed run) is absent from files older than it.
    has_error = any(r[1] == "error" for r in db.execute("PRAGMA table_info(runs)"))
    rows = db.execute("SELECT run_id, mode, experiment, system, model, hardware, trace, config, "
                      "started_at, wall_s, complete, status, " +
                      ("error" if has_error else "NULL") + " FROM runs ORDER BY run_id").fetchall()
    runs = [Run(*r) for r in rows]
    if wanted is not None:
        known = {r.run_id for r in runs}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise BadInput("--runs: no run " + ", ".join(map(str, unknown)) + " in the database "
                           f"(it has {describe_ids(sorted(known))})")
        runs = [r for r in runs if r.run_id in set(wanted)]
    for r in runs:
        if r.status == "failed":
            r.excluded = "failed: " + (r.error or "no error recorded")
        elif not r.complete:
            r.excluded = (f"incomplete (status '{r.status}'): interrupted or still running; "
                          "rerun it (kvtier sweep resumes)")
        elif r.status != "ok":
            r.excluded = f"not ok: status '{r.status}'"
    return runs


def describe_ids(ids):
    if not ids:
        return "no runs"
    return "runs " + ", ".join(map(str, ids)) if len(ids) <= 12 else \
        f"{len(ids)} runs, ids {ids[0]}-{ids[-1]}"


def figure_sql(template, run_ids):
    runs = "(" + ", ".join(str(i) for i in run_ids) + ")"
    return template.format(runs=runs, panel=PANEL, label=LABEL.format(runs=runs), rank=RANK)


def query(db, sql):
    cur = db.execute(sql)
    return [d[0] for d in cur.description], cur.fetchall()


def csv_cell(v):
    """CSV text of one SQLite value: NULL as empty, floats as repr (round-trips exactly)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def write_csv(path, columns, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([csv_cell(v) for v in r])


# ---------------------------------------------------------------------------------------------
# Plotting (matplotlib, Agg backend). Each plot kind draws one panel per distinct value of its
# `panel` column (one panel when the figure has none), in the order of the query's rows.

SYSTEM_COLORS = {
    "recomp": "#7f7f7f", "as": "#8c564b", "as_h2o_lru": "#e377c2", "as_h2o_lfu": "#bcbd22",
    "impress": "#17becf", "spec": "#d62728", "cake": "#1f77b4", "ablation_itf": "#ff7f0e",
    "ablation_ro": "#9467bd", "full": "#000000",
}
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def series_colors(names):
    """A colour per series: a system's own colour when the name starts with a known system and
    that colour is still free, else the next palette colour."""
    out, used = {}, set()
    for n in names:
        c = SYSTEM_COLORS.get(re.split(r"[ #(/]", str(n), 1)[0])
        if c is None or c in used:
            c = next((p for p in PALETTE if p not in used), PALETTE[len(out) % len(PALETTE)])
        out[n] = c
        used.add(c)
    return out


def ordered(values):
    seen = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def split_panels(columns, rows, panel):
    if panel is None:
        return [("", rows)]
    i = columns.index(panel)
    groups = {}
    for r in rows:
        groups.setdefault(r[i], []).append(r)
    return list(groups.items())


def new_figure(n_panels, width=5.2, height=3.4, max_cols=3):
    import matplotlib.pyplot as plt
    cols = min(max_cols, n_panels)
    nrows = math.ceil(n_panels / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows + 0.4),
                             squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n_panels:]:
        a.set_visible(False)
    return fig, flat[:n_panels]


def legend_outside(ax):
    """The legend right of the panel, where it hides no data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              frameon=False)


def num(v, scale=1.0):
    return float("nan") if v is None else float(v) * scale


def long_series(columns, rows, p):
    """(x categories, series names, {(x, series): value}) of a bar plot, from either `values`
    (wide: one series per column) or `series` + `value` (long) params."""
    xi = columns.index(p["x"])
    xs = ordered(r[xi] for r in rows)
    data = {}
    if "values" in p:
        names = [label for _, label in p["values"]]
        for r in rows:
            for col, label in p["values"]:
                data[(r[xi], label)] = r[columns.index(col)]
    else:
        si, vi = columns.index(p["series"]), columns.index(p["value"])
        names = ordered(r[si] for r in rows)
        for r in rows:
            data[(r[xi], r[si])] = r[vi]
    return xs, names, data


def plot_bars(columns, rows, p, stacked=False):
    panels = split_panels(columns, rows, p.get("panel"))
    widest = max(len(ordered(r[columns.index(p["x"])] for r in g)) for _, g in panels)
    fig, axes = new_figure(len(panels), width=max(4.2, 1.2 + 0.55 * widest))
    all_names = long_series(columns, rows, p)[1]
    colors = dict(zip(all_names, p["colors"])) if "colors" in p else series_colors(all_names)
    scale = p.get("scale", 1)
    for ax, (title, group) in zip(axes, panels):
        xs, names, data = long_series(columns, group, p)
        pos = list(range(len(xs)))
        if stacked:
            bottom = [0.0] * len(xs)
            for n in names:
                h = [0.0 if data.get((x, n)) is None else num(data[(x, n)], scale) for x in xs]
                ax.bar(pos, h, 0.7, bottom=bottom, label=str(n), color=colors[n])
                bottom = [b + v for b, v in zip(bottom, h)]
        else:
            w = 0.8 / max(1, len(names))
            for j, n in enumerate(names):
                h = [num(data.get((x, n)), scale) for x in xs]
                ax.bar([q - 0.4 + w * (j + 0.5) for q in pos], h, w, label=str(n),
                       color=colors[n])
        if "hline" in p:
            ax.axhline(p["hline"], color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(pos)
        ax.set_xticklabels([str(x) for x in xs], rotation=30 if len(xs) > 3 else 0,
                           ha="right" if len(xs) > 3 else "center", fontsize=8)
        ax.set_ylabel(p.get("ylabel", ""))
        ax.set_title(str(title), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        if len(names) > 1:
            legend_outside(ax)
    return fig


def plot_stacked(columns, rows, p):
    return plot_bars(columns, rows, p, stacked=True)


def plot_lines(columns, rows, p):
    panels = split_panels(columns, rows, p.get("panel"))
    fig, axes = new_figure(len(panels))
    xi, yi, si = columns.index(p["x"]), columns.index(p["y"]), columns.index(p["series"])
    ti = columns.index(p["xtext"]) if "xtext" in p else None
    colors = series_colors(ordered(r[si] for r in rows))
    xscale, yscale = p.get("xscale", 1), p.get("scale", 1)
    for ax, (title, group) in zip(axes, panels):
        categorical = any(r[xi] is None for r in group)
        if categorical:  # text values (e.g. trace paths): positions in order of appearance
            cats = ordered(r[ti] for r in group)
            where = {c: i for i, c in enumerate(cats)}
        for name in ordered(r[si] for r in group):
            pts = [r for r in group if r[si] == name]
            if p.get("hline_series") == name:
                for r in pts:
                    ax.axhline(num(r[yi], yscale), color="black", linestyle="--",
                               linewidth=1, label=str(name))
                continue
            xs = [where[r[ti]] if categorical else num(r[xi], xscale) for r in pts]
            ys = [num(r[yi], yscale) for r in pts]
            ax.plot(xs, ys, label=str(name), color=colors[name],
                    drawstyle="steps-post" if p.get("steps") else "default",
                    marker=p.get("marker", "o" if len(pts) <= 12 and not p.get("steps") else None),
                    markersize=4, linewidth=1.3)
        if p.get("xlog") == "auto" and not categorical:
            xs_all = [num(r[xi], xscale) for r in group if r[xi] is not None]
            if xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 50:
                ax.set_xscale("log")
        if ti is not None:
            if categorical:
                ax.set_xticks(range(len(cats)))
                ax.set_xticklabels([os.path.basename(str(c)) for c in cats], rotation=30,
                                   ha="right", fontsize=7)
            else:
                ticks = ordered((r[xi], r[ti]) for r in group)
                vals = [t[0] for t in ticks]
                if min(vals) > 0 and max(vals) / min(vals) >= 10:
                    ax.set_xscale("log")
                ax.set_xticks(vals)
                ax.set_xticklabels([str(t[1]) for t in ticks], fontsize=7,
                                   rotation=30 if len(ticks) > 5 else 0)
                ax.minorticks_off()
        ax.set_xlabel(p.get("xlabel", str(title).split(" · ")[-1] if ti is not None else ""))
        ax.set_ylabel(p.get("ylabel", ""))
        ax.set_title(str(title), fontsize=9)
        ax.grid(alpha=0.3)
        if len(ordered(r[si] for r in group)) > 1 or p.get("hline_series"):
            legend_outside(ax)
    return fig


def plot_scatter(columns, rows, p):
    panels = split_panels(columns, rows, p.get("panel"))
    fig, axes = new_figure(len(panels), width=4.8, height=4.2)
    xi, yi, si = columns.index(p["x"]), columns.index(p["y"]), columns.index(p["series"])
    colors = series_colors(ordered(r[si] for r in rows))
    xscale = p.get("xscale", p.get("scale", 1))
    yscale = p.get("scale", 1)
    for ax, (title, group) in zip(axes, panels):
        for name in ordered(r[si] for r in group):
            pts = [r for r in group if r[si] == name]
            ax.scatter([num(r[xi], xscale) for r in pts], [num(r[yi], yscale) for r in pts],
                       s=12, label=str(name), color=colors[name], alpha=0.8)
        if p.get("identity"):
            vals = [num(r[xi], xscale) for r in group] + [num(r[yi], yscale) for r in group]
            vals = [v for v in vals if not math.isnan(v)]
            lo, hi = min(vals), max(vals)
            pad = 0.05 * (hi - lo or 1)
            ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", linewidth=0.8,
                    label="sim = hw")
            ax.set_xlim(lo - pad, hi + pad)
            ax.set_ylim(lo - pad, hi + pad)
            ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel(p.get("xlabel", ""))
        ax.set_ylabel(p.get("ylabel", ""))
        ax.set_title(str(title), fontsize=9)
        ax.grid(alpha=0.3)
        legend_outside(ax)
    return fig


PLOTS = {"bars": plot_bars, "stacked": plot_stacked, "lines": plot_lines,
         "scatter": plot_scatter}


def save(fig, title, out_dir, stem):
    import matplotlib.pyplot as plt
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, stem + ".png"), dpi=90, bbox_inches="tight",
                metadata={"Software": None})
    fig.savefig(os.path.join(out_dir, stem + ".svg"), bbox_inches="tight",
                metadata={"Date": None})
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The page

CSS = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 60em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
td.n { text-align: right; } .note { background: #fff6d5; padding: 0.5em 1em; }
pre { background: #f6f6f6; padding: 0.5em; font-size: 0.8em; overflow-x: auto; }
details { margin: 0.3em 0; }
"""


def e(text):
    return html.escape(str(text), quote=True)


def html_table(columns, rows):
    out = ["<table>", "<thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in columns) +
           "</tr></thead>", "<tbody>"]
    for r in rows:
        cells = []
        for v in r:
            if v is None:
                cells.append("<td></td>")
            elif isinstance(v, (int, float)):
                cells.append(f'<td class="n">{e(v)}</td>')
            else:
                cells.append(f"<td>{e(v)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def write_index(out_dir, db_path, runs, drawn, not_drawn, tables, notes, temp_views):
    included = [r for r in runs if not r.excluded]
    p = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         '<link rel="icon" href="data:,">',
         f"<title>kvtier report: {e(os.path.basename(db_path))}</title>",
         f"<style>{CSS}</style>", "</head>", "<body>",
         f"<h1>kvtier report: {e(os.path.basename(db_path))}</h1>",
         f"<p>Database <code>{e(os.path.abspath(db_path))}</code>: {len(runs)} run(s) selected, "
         f"{len(included)} plotted; {len(drawn)} figure(s) drawn, {len(not_drawn)} not drawn. "
         f"Generated {e(datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'))}"
         " by <code>kvtier report</code>. Each figure links its SVG, the CSV of exactly the "
         "plotted data and the SQL that produced it.</p>"]
    for n in notes:
        p.append(f'<p class="note">{e(n)}</p>')
    if temp_views:
        p.append('<p class="note">This file was written by an older kvtier and lacks the views '
                 + e(", ".join(temp_views)) + "; the report read them as temporary views from "
                 "analysis/views.sql (the file was not changed).</p>")
    if drawn:
        p.append('<h2 id="figures">Figures</h2>')
        p.append("<ul>" + "".join(f'<li><a href="#{e(f.id)}">{e(f.title)}</a></li>'
                                  for f in drawn) + "</ul>")
    for f in drawn:
        p += [f'<figure id="{e(f.id)}">', f"<h3>{e(f.title)}</h3>",
              f'<img src="{e(f.id)}.png" alt="{e(f.title)}">',
              f"<figcaption>{e(f.caption)} [<a href=\"{e(f.id)}.svg\">SVG</a>] "
              f"[<a href=\"{e(f.id)}.csv\">CSV</a>] [<a href=\"{e(f.id)}.sql\">SQL</a>]"
              "</figcaption>", "</figure>"]
    if not_drawn:
        p.append('<h2 id="not-drawn">Not drawn</h2><ul>')
        for f, why in not_drawn:
            p.append(f"<li><b>{e(f.title)}</b>: {e(why)}</li>")
        p.append("</ul>")
    p.append('<h2 id="tables">Summary tables</h2>')
    if not tables:
        p.append("<p>No summary table: no plotted run.</p>")
    for t, columns, rows in tables:
        p.append(f"<h3>{e(t['title'])}</h3>")
        p.append(html_table(columns, rows))
        p.append(f'<p>[<a href="{e(t["id"])}.csv">CSV</a>]</p>')
    p.append('<h2 id="runs">Runs</h2>')
    if runs:
        p.append(html_table(
            ["run", "mode", "experiment", "system", "model", "hardware", "trace", "started",
             "wall s", "plotted"],
            [(r.run_id, r.mode, r.experiment, r.system, r.model, r.hardware,
              os.path.basename(r.trace), r.started_at,
              None if r.wall_s is None else round(r.wall_s, 2), r.excluded or "yes")
             for r in runs]))
        p.append("<h3>Configurations</h3>")
        for r in runs:
            p.append(f"<details><summary>run {r.run_id}: {e(r.system)} ({e(r.experiment)}, "
                     f"{e(r.mode)})</summary><pre>{e(r.config)}</pre></details>")
    else:
        p.append("<p>No runs.</p>")
    p += ["</body>", "</html>", ""]
    with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
        f.write("\n".join(p))


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="kvtier report",
        description="Figures (PNG, SVG, CSV, SQL) and index.html from a kvtier results database.")
    ap.add_argument("database", help="results SQLite file (kvtier sim/hw/sweep/validate/eval --out)")
    ap.add_argument("--out", required=True, help="directory to write (created if absent)")
    ap.add_argument("--runs", help="run ids to report, e.g. 1,3-5 (default: all runs)")
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    args = ap.parse_args(argv)
    try:
        return report(args)
    except BadInput as err:
        print(f"kvtier report: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def check_out_dir(out):
    if os.path.exists(out) and not os.path.isdir(out):
        raise BadInput(f"--out {out}: not a directory")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {out}: cannot create the directory: {err.strerror}")
    if not os.path.isdir(out):
        raise BadInput(f"--out {out}: not a directory")
    probe = os.path.join(out, ".kvtier-report-write-test")
    try:
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as err:
        raise BadInput(f"--out {out}: not writable: {err.strerror}")


def report(args):
    wanted = parse_run_list(args.runs) if args.runs else None
    db = open_db(args.database)
    check_out_dir(args.out)
    try:
        import matplotlib
    except ImportError:
        raise BadInput(f"matplotlib is missing for {sys.executable}: install it with "
                       "`sudo apt-get install python3-matplotlib` (Debian; scripts/setup.sh "
                       "does) or `pip install matplotlib`")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "kvtier"  # stable ids: the same data gives the same SVG

    temp_views = add_missing_views(
        db, os.path.join(os.path.dirname(os.path.abspath(__file__)), "views.sql"))
    have = objects(db)
    runs = load_runs(db, wanted)
    ids = [r.run_id for r in runs if not r.excluded]
    notes = []
    if not runs:
        notes.append("The database has no runs: nothing to plot. Write some with kvtier sim, "
                     "sweep, hw, validate or eval (--out this file)." if wanted is None else
                     "No run selected.")
    elif not ids:
        notes.append("No run is complete with status 'ok', so nothing is plotted; the runs "
                     "table below says why each run was left out.")
    elif len(ids) < len(runs):
        notes.append(f"{len(runs) - len(ids)} run(s) left out (incomplete or failed); the runs "
                     "table below says why.")

    drawn, not_drawn = [], []
    for f in FIGURES:
        absent = [n for n in f.needs if n not in have]
        if absent:
            not_drawn.append((f, "the database has no " + ", ".join(absent) +
                              " (written by an older or newer kvtier)"))
            continue
        sql = figure_sql(f.sql, ids)
        try:
            columns, rows = query(db, sql)
        except sqlite3.Error as err:
            not_drawn.append((f, f"query failed: {err}"))
            continue
        if not rows:
            not_drawn.append((f, f.missing))
            continue
        write_csv(os.path.join(args.out, f.id + ".csv"), columns, rows)
        with open(os.path.join(args.out, f.id + ".sql"), "w", encoding="utf-8") as out:
            out.write(f"-- {f.title}\n-- {f.caption}\n{sql};\n")
        save(PLOTS[f.plot](columns, rows, f.params), f.title, args.out, f.id)
        drawn.append(f)
        if not args.quiet:
            print(f"  {f.id:<20} {len(rows):>6} rows  {f.title}")

    tables = []
    for t in TABLES:
        if any(n not in have for n in t["needs"]):
            continue
        try:
            columns, rows = query(db, figure_sql(t["sql"], ids))
        except sqlite3.Error as err:  # a file from another kvtier version: say so, go on
            notes.append(f"table {t['title']}: query failed: {err}")
            continue
        if rows:
            write_csv(os.path.join(args.out, t["id"] + ".csv"), columns, rows)
            tables.append((t, columns, rows))
    write_index(args.out, args.database, runs, drawn, not_drawn, tables, notes, temp_views)
    index = os.path.join(os.path.abspath(args.out), "index.html")
    if not args.quiet:
        for n in notes:
            print(f"note: {n}")
        for f, why in not_drawn:
            print(f"  not drawn: {f.id}: {why}")
        print(f"report: {len(drawn)} figure(s), {len(not_drawn)} not drawn -> {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
