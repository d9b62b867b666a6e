#!/usr/bin/env python3
"""`kvtier report` (analysis/report.py) end to end through the built binary.

Databases are built in a temporary directory with the real commands: `kvtier sim` on a tiny
generated trace for four systems (Cake and the ablation baseline among them), a `kvtier sweep`
over two keys, `kvtier validate` (hw host backend and sim) on a tiny SmolLM2-shaped trace, and
`kvtier eval` on two COPA items when the SmolLM2 model is present (else the eval run and its
accuracy rows are inserted with SQL, in the schema's columns: the test is of the report, not of
eval). Then:
  - every figure of FIGURES is drawn, its CSV equals the result of its SQL query run here on the
    database, and the .sql beside it is that query with the selected run ids;
  - index.html parses as HTML5 (html5lib when installed, else a strict html.parser check), every
    file it references exists in the report directory, and nothing outside it is referenced;
  - an incomplete run is never plotted; --runs limits the runs;
  - the new views hold what SCHEMA.md says (exposed I/O sums to the exposed I/O, swept keys are
    the --set keys, Cake's split adds up);
  - empty, one-run, interrupted and failed-run databases, and a file without the new views,
    give a report that says what is missing; bad input exits 2 with a message;
  - a headless Chromium renders the page without console messages and the screenshot is not
    blank (skipped, exit 77, where no browser is installed).

Run by ctest (tests/analysis/CMakeLists.txt, label `report`):
    python3 report_test.py ClassName      (KVTIER_BIN, KVTIER_SOURCE_DIR from the environment)
"""

import csv
import glob
import hashlib
import html.parser
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # never write __pycache__ into the source tree

SOURCE = os.environ.get("KVTIER_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
KVTIER = os.environ.get("KVTIER_BIN", os.path.join(SOURCE, "build", "cli", "kvtier"))
sys.path.insert(0, os.path.join(SOURCE, "analysis"))
import report  # noqa: E402  (analysis/report.py: FIGURES, the queries the CSVs must equal)

MODEL = os.environ.get("KVTIER_MODEL") or os.path.expanduser(
    "~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def run(args, cwd, env=None, check=True):
    """Runs `kvtier <args>`; returns (exit code, stdout, stderr)."""
    full_env = dict(os.environ)
    full_env.update({"KVTIER_CONFIG_DIR": os.path.join(SOURCE, "configs"),
                     "KVTIER_SELECTION_MEMO": os.path.join(cwd, "selections"),
                     "PYTHONDONTWRITEBYTECODE": "1"})
    full_env.update(env or {})
    p = subprocess.run([KVTIER] + args, cwd=cwd, env=full_env, capture_output=True, text=True,
                       timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"kvtier {' '.join(args)} exited {p.returncode}\n{p.stdout}\n"
                             f"{p.stderr}")
    return p.returncode, p.stdout, p.stderr


def opt_trace(d, name="t.kvt", requests=12):
    """A small few-shot OPT-13B trace: a system runs in well under a second."""
    path = os.path.join(d, name)
    run(["trace", "gen", "-o", path, "--requests", str(requests), "--rate", "20", "--prompts", "4",
         "--examples_min", "2", "--examples_max", "3", "--example_tokens", "200",
         "--example_tokens_sd", "20", "--calibration_tokens", "256", "--quiet"], d)
    return path


def opt_experiment(d, trace):
    path = os.path.join(d, "e.ini")
    with open(path, "w") as f:
        f.write("[include]\nmodel = opt-13b\nhardware = a100-pcie4-nvme\n[experiment]\nname = t\n"
                f"[workload]\ntrace = {trace}\n[run]\nwarmup_requests = 2\n")
    return path


def smol_experiment(d):
    """A tiny SmolLM2-shaped trace and an experiment the hw host backend runs in seconds."""
    trace = os.path.join(d, "smol.kvt")
    run(["trace", "gen", "--quiet", "--out", trace, "--requests", "6", "--prompts", "2",
         "--tasks", "1", "--examples_min", "1", "--examples_max", "2", "--example_tokens", "200",
         "--example_tokens_sd", "20", "--rate", "50", "--model-name", "smollm2-135m",
         "--model-layers", "30", "--model-heads", "9", "--model-kv-heads", "3", "--vocab",
         "49152", "--calibration_tokens", "256"], d)
    path = os.path.join(d, "x.ini")
    with open(path, "w") as f:
        f.write("[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\n"
                "[experiment]\nname = hw-test\nsystems = as,spec\n"
                f"[workload]\ntrace = {trace}\n[itf]\nprobe_heads = 2\n"
                "[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n[run]\nwarmup_requests = 1\n"
                "[hw]\nbackend = host\nmax_memory = 256MiB\n")
    return path


def add_eval(d, db):
    """An eval run: the real `kvtier eval` when the model is present, else the same rows by SQL."""
    if os.path.exists(MODEL):
        run(["eval", "--out", db, "--tasks", "copa", "--items", "2", "--selectors", "itf,h2o",
             "--retentions", "0.25,0.5", "--alphas", "0.6", "--threads", "1", "--quiet"], d)
        return "kvtier eval"
    con = sqlite3.connect(db)
    with con:
        cur = con.execute(
            "INSERT INTO runs (mode, experiment, system, model, hardware, trace, trace_sha256, "
            "config, config_sha256, git_commit, started_at, wall_s, complete, status) VALUES "
            "('eval', 'eval', 'eval', 'smollm2-135m', 'cpu', 'copa', 'x', 'eval.items = 2', 'y', "
            "'test', '2025-01-01T00:00:00Z', 1.0, 1, 'ok')")
        rid = cur.lastrowid
        rows = [("full", None, 1.0, 1, 0.5, None), ("itf", 0.6, 0.25, 1, 0.5, 0.25),
                ("itf", 0.6, 0.5, 2, 1.0, 0.0), ("h2o", None, 0.25, 0, 0.0, None),
                ("h2o", None, 0.5, 1, 0.5, None)]
        for sel, alpha, ret, correct, acc, fb in rows:
            con.execute("INSERT INTO accuracy VALUES (?, 'copa', ?, ?, ?, 2, ?, ?, 1.0, ?, ?)",
                        (rid, sel, alpha, ret, correct, acc, ret, fb))
    con.close()
    return "SQL stand-in (no model at %s)" % MODEL


def build_sim_db(d, db):
    """Four systems on the OPT trace (experiment t) and a 2x2 sweep of spec (experiment sw)."""
    e = opt_experiment(d, opt_trace(d))
    run(["sim", "--config", e, "--out", db, "--systems", "as_h2o_lfu,spec,cake,recomp", "-j", "2"],
        d)
    run(["sweep", "--config", e, "--out", db, "--systems", "spec", "--set",
         "cache.gpu_capacity=1GiB,16GiB", "--set", "itf.alpha=0,1", "--experiment.name=sw",
         "-j", "2"], d)


def report_dir(d, db, name, extra=(), env=None, check=True):
    out = os.path.join(d, name)
    code, stdout, stderr = run(["report", db, "--out", out] + list(extra), d, env=env,
                               check=check)
    return out, code, stdout, stderr


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.reader(f)
        return next(r), list(r)


def same_cell(text, value):
    """A CSV cell against the SQLite value it was written from (floats exactly: repr)."""
    if value is None:
        return text == ""
    if isinstance(value, float):
        return float(text) == value
    if isinstance(value, int):
        return text == str(value)
    return text == value


class StrictHtmlChecker(html.parser.HTMLParser):
    """Python's parser with the structure checks an HTML5 parser's errors would catch: a
    doctype first, every non-void element closed in order, nothing after </html>."""
    VOID = {"meta", "link", "img", "br", "hr", "input", "col", "source", "wbr", "area", "base"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.doctype, self.refs = [], [], False, []

    def handle_decl(self, decl):
        self.doctype = decl.lower() == "doctype html"

    def handle_starttag(self, tag, attrs):
        if not self.doctype:
            self.errors.append(f"<{tag}> before <!DOCTYPE html>")
        for k, v in attrs:
            if k in ("src", "href"):
                self.refs.append(v)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def check_html(test, out_dir):
    """index.html is HTML5 and self-contained: every src/href names a file in out_dir."""
    path = os.path.join(out_dir, "index.html")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        import html5lib
        parser = html5lib.HTMLParser(strict=True)
        parser.parse(text)  # raises ParseError on the first error
    except ImportError:
        pass
    checker = StrictHtmlChecker()
    checker.feed(text)
    checker.close()
    test.assertTrue(checker.doctype, "no <!DOCTYPE html>")
    test.assertEqual(checker.errors, [])
    test.assertEqual(checker.stack, [])
    for ref in checker.refs:
        if ref.startswith("#") or ref.startswith("data:"):
            continue
        test.assertNotRegex(ref, r"^[a-z]+:|^//|^/", f"{ref}: not a file inside the report")
        test.assertTrue(os.path.isfile(os.path.join(out_dir, ref)), f"{ref} referenced, missing")
    return text, checker.refs


class FullReport(unittest.TestCase):
    """The report of a database with every kind of run."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvtier_report_full_")
        d = cls.tmp
        cls.db = os.path.join(d, "r.sqlite")
        build_sim_db(d, cls.db)
        run(["validate", "--config", smol_experiment(d), "--out", cls.db, "--quiet",
             "--preset", "compute-bound", "--repeats", "1"], d)  # one hw + one sim run each
        cls.eval_source = add_eval(d, cls.db)
        # An interrupted run beside the others: a copy of run 1 marked as a killed run leaves
        # it (complete = 0, status 'running'). It must appear in no figure.
        con = sqlite3.connect(cls.db)
        with con:
            cols = [r[1] for r in con.execute("PRAGMA table_info(runs)") if r[1] != "run_id"]
            cur = con.execute(f"INSERT INTO runs ({', '.join(cols)}) SELECT {', '.join(cols)} "
                              "FROM runs WHERE run_id = 1")
            cls.incomplete = cur.lastrowid
            con.execute("UPDATE runs SET complete = 0, status = 'running' WHERE run_id = ?",
                        (cls.incomplete,))
            for table in ("requests", "layers", "transfers", "decisions"):
                tcols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")
                         if r[1] != "run_id"]
                con.execute(f"INSERT INTO {table} (run_id, {', '.join(tcols)}) SELECT ?, "
                            f"{', '.join(tcols)} FROM {table} WHERE run_id = 1",
                            (cls.incomplete,))
        cls.complete_ids = [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE complete = 1 AND status = 'ok' ORDER BY run_id")]
        con.close()
        cls.out, _, cls.stdout, _ = report_dir(d, cls.db, "report")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_figure_is_drawn_as_png_svg_csv_and_sql(self):
        for f in report.FIGURES:
            for ext in ("png", "svg", "csv", "sql"):
                path = os.path.join(self.out, f"{f.id}.{ext}")
                self.assertTrue(os.path.isfile(path), f"{path} missing ({self.eval_source})")
                self.assertGreater(os.path.getsize(path), 100, path)
            with open(os.path.join(self.out, f.id + ".png"), "rb") as p:
                self.assertEqual(p.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertIn("index.html", self.stdout)

    def test_every_csv_equals_its_query(self):
        con = sqlite3.connect(self.db)
        for f in report.FIGURES:
            sql = report.figure_sql(f.sql, self.complete_ids)
            with open(os.path.join(self.out, f.id + ".sql"), encoding="utf-8") as q:
                self.assertIn(sql, q.read(), f.id)
            cur = con.execute(sql)
            columns = [c[0] for c in cur.description]
            rows = cur.fetchall()
            header, cells = read_csv(os.path.join(self.out, f.id + ".csv"))
            self.assertEqual(header, columns, f.id)
            self.assertEqual(len(cells), len(rows), f.id)
            self.assertGreater(len(rows), 0, f.id)
            for i, (text_row, row) in enumerate(zip(cells, rows)):
                self.assertEqual(len(text_row), len(row), f"{f.id} row {i}")
                for t, v in zip(text_row, row):
                    self.assertTrue(same_cell(t, v), f"{f.id} row {i}: CSV {t!r} vs SQL {v!r}")
        con.close()

    def test_the_ttft_figure_holds_run_summary_of_every_complete_sim_and_hw_run(self):
        con = sqlite3.connect(self.db)
        want = {r[0]: (r[1], r[2]) for r in con.execute(
            "SELECT s.run_id, s.mean_ttft_s, s.p99_ttft_s FROM run_summary s JOIN runs r "
            "USING (run_id) WHERE r.mode IN ('sim', 'hw') AND r.complete = 1")}
        con.close()
        header, cells = read_csv(os.path.join(self.out, "ttft_by_system.csv"))
        got = {int(c[0]): (float(c[header.index("mean_ttft_s")]),
                           float(c[header.index("p99_ttft_s")])) for c in cells}
        self.assertEqual(sorted(got), sorted(want))
        self.assertEqual(len(got), 4 + 4 + 4)  # sim systems, sweep points, validate's hw + sim
        for run_id, (mean, p99) in want.items():  # AVG's last bit depends on the query plan
            self.assertAlmostEqual(got[run_id][0], mean, delta=1e-12 * mean)
            self.assertEqual(got[run_id][1], p99)

    def test_an_incomplete_run_is_in_no_figure(self):
        for path in glob.glob(os.path.join(self.out, "*.csv")):
            header, cells = read_csv(path)
            for col in ("run_id", "sim_run_id", "hw_run_id", "eval_run_id", "latency_run_id"):
                if col in header:
                    ids = {int(c[header.index(col)]) for c in cells}
                    self.assertNotIn(self.incomplete, ids, f"{path}: {col}")
        with open(os.path.join(self.out, "index.html"), encoding="utf-8") as f:
            text = f.read()
        self.assertIn("incomplete (status &#x27;running&#x27;)", text)

    def test_index_is_html5_and_self_contained(self):
        text, refs = check_html(self, self.out)
        for f in report.FIGURES:
            self.assertIn(f'src="{f.id}.png"', text)
            for ext in ("svg", "csv", "sql"):
                self.assertIn(f"{f.id}.{ext}", refs)
        self.assertIn("<details>", text)  # run configurations, collapsed
        self.assertIn("Run summary", text)

    def test_runs_option_limits_the_runs(self):
        out, code, _, _ = report_dir(self.tmp, self.db, "subset", ["--runs", "1-2", "--quiet"])
        self.assertEqual(code, 0)
        header, cells = read_csv(os.path.join(out, "ttft_by_system.csv"))
        self.assertEqual(sorted(int(c[0]) for c in cells), [1, 2])
        with open(os.path.join(out, "index.html"), encoding="utf-8") as f:
            self.assertIn("Not drawn", f.read())  # no sweep, validate or eval among runs 1-2

    def test_exposed_io_parts_sum_to_the_exposed_io(self):
        con = sqlite3.connect(self.db)
        rows = con.execute(
            "SELECT s.run_id, s.mean_io_stall_s, SUM(e.mean_exposed_s), "
            "SUM(e.tier = 'none') FROM run_summary s JOIN exposed_io e USING (run_id) "
            "GROUP BY s.run_id").fetchall()
        self.assertEqual(len(rows), len(con.execute("SELECT * FROM run_summary").fetchall()))
        for run_id, stall, parts, unattributed_rows in rows:
            self.assertAlmostEqual(parts, stall, delta=1e-12 + 1e-9 * stall, msg=run_id)
            self.assertEqual(unattributed_rows, 1)
        # spec waits on the SSD or CPU cache for what it loads: most of it is attributed.
        spec = con.execute("SELECT SUM(CASE WHEN e.tier <> 'none' THEN e.mean_exposed_s END), "
                           "SUM(e.mean_exposed_s) FROM exposed_io e JOIN runs r USING (run_id) "
                           "WHERE r.system = 'spec' AND r.experiment = 't'").fetchone()
        self.assertGreater(spec[1], 0)
        self.assertGreater(spec[0], 0.5 * spec[1])
        con.close()

    def test_swept_keys_are_the_set_keys(self):
        con = sqlite3.connect(self.db)
        rows = con.execute("SELECT key, COUNT(*), COUNT(DISTINCT value), MIN(value_num), "
                           "MAX(value_num) FROM swept_keys WHERE experiment = 'sw' "
                           "GROUP BY key ORDER BY key").fetchall()
        self.assertEqual(rows, [("cache.gpu_capacity", 4, 2, 2.0 ** 30, 16 * 2.0 ** 30),
                                ("itf.alpha", 4, 2, 0.0, 1.0)])
        # Systems of one experiment differ in many keys but are not sweeps of them.
        self.assertEqual(con.execute("SELECT COUNT(*) FROM swept_keys WHERE experiment IN "
                                     "('t', 'hw-test')").fetchone()[0], 0)
        con.close()

    def test_cake_split_adds_up(self):
        con = sqlite3.connect(self.db)
        rows = con.execute("SELECT c.requests, c.computed_chunks + c.loaded_chunks, "
                           "c.prefix_chunks, c.computed_fraction + c.loaded_fraction, "
                           "(SELECT COUNT(*) FROM measured_requests m WHERE m.run_id = c.run_id "
                           "AND m.reused_tokens > 0) FROM cake_split c").fetchall()
        self.assertEqual(len(rows), 1)
        requests, both, prefix, fractions, reusing = rows[0]
        self.assertEqual(requests, reusing)  # one cake_meet per measured request that reuses
        self.assertGreater(requests, 0)
        self.assertEqual(both, prefix)
        self.assertAlmostEqual(fractions, 1.0)
        con.close()


class WhatIsMissing(unittest.TestCase):
    """Reports of databases with little in them say what is missing and exit 0."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvtier_report_missing_")
        d = cls.tmp
        e = opt_experiment(d, opt_trace(d))
        cls.one = os.path.join(d, "one.sqlite")
        run(["sim", "--config", e, "--out", cls.one, "--systems", "spec"], d)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def copy(self, name):
        path = os.path.join(self.tmp, name)
        shutil.copy(self.one, path)
        return path

    def index(self, out):
        check_html(self, out)
        with open(os.path.join(out, "index.html"), encoding="utf-8") as f:
            return f.read()

    def test_empty_database(self):
        db = self.copy("empty.sqlite")
        con = sqlite3.connect(db)
        con.execute("PRAGMA foreign_keys = ON")
        with con:
            con.execute("DELETE FROM runs")
        con.close()
        out, code, stdout, _ = report_dir(self.tmp, db, "empty")
        self.assertEqual(code, 0)
        text = self.index(out)
        self.assertIn("The database has no runs", text)
        self.assertIn("The database has no runs", stdout)
        self.assertEqual(glob.glob(os.path.join(out, "*.png")), [])
        for f in report.FIGURES:
            self.assertIn(f"<b>{report.e(f.title)}</b>", text)  # each listed as not drawn

    def test_one_run(self):
        out, code, stdout, _ = report_dir(self.tmp, self.one, "one")
        self.assertEqual(code, 0)
        text = self.index(out)
        for drawn in ("ttft_by_system", "exposed_io", "hit_ratios", "ttft_cdf", "layer_retention",
                      "itf_fallback"):
            self.assertTrue(os.path.isfile(os.path.join(out, drawn + ".png")), drawn)
        for f in report.FIGURES:
            if f.id in ("sweeps", "ablation", "cake_split", "sim_vs_hw", "accuracy_retention"):
                self.assertFalse(os.path.exists(os.path.join(out, f.id + ".png")), f.id)
                self.assertIn(report.e(f.missing), text)
                self.assertIn(f"not drawn: {f.id}: {f.missing}", stdout)

    def test_interrupted_run(self):
        db = self.copy("interrupted.sqlite")
        con = sqlite3.connect(db)
        with con:  # what a killed run leaves: its rows so far, complete = 0, status 'running'
            con.execute("UPDATE runs SET complete = 0, status = 'running'")
        con.close()
        out, code, stdout, _ = report_dir(self.tmp, db, "interrupted")
        self.assertEqual(code, 0)
        text = self.index(out)
        self.assertIn("No run is complete", text)
        self.assertIn("incomplete (status &#x27;running&#x27;): interrupted", text)
        self.assertEqual(glob.glob(os.path.join(out, "*.png")), [])

    def test_failed_run(self):
        db = self.copy("failed.sqlite")
        con = sqlite3.connect(db)
        with con:  # what a run stopped by an I/O error leaves (kvtier exits 3)
            con.execute("UPDATE runs SET complete = 0, status = 'failed', "
                        "error = 'ssd_read demand request 7 layer 3: EIO'")
        con.close()
        out, code, _, _ = report_dir(self.tmp, db, "failed")
        self.assertEqual(code, 0)
        text = self.index(out)
        self.assertIn("failed: ssd_read demand request 7 layer 3: EIO", text)
        self.assertEqual(glob.glob(os.path.join(out, "*.png")), [])

    def test_a_file_without_the_new_views_is_reported_and_not_changed(self):
        db = self.copy("old.sqlite")
        con = sqlite3.connect(db)
        with con:
            for v in ("exposed_io", "swept_keys", "run_config", "cake_split"):
                con.execute(f"DROP VIEW {v}")
        con.close()
        before = hashlib.sha256(open(db, "rb").read()).hexdigest()
        out, code, _, _ = report_dir(self.tmp, db, "old")
        self.assertEqual(code, 0)
        self.assertTrue(os.path.isfile(os.path.join(out, "exposed_io.png")))
        self.assertIn("older kvtier", self.index(out))
        self.assertEqual(hashlib.sha256(open(db, "rb").read()).hexdigest(), before)
        con = sqlite3.connect(db)
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        con.close()
        self.assertNotIn("exposed_io", names)


class BadInput(unittest.TestCase):
    """Bad input exits 2 with a message naming what is wrong."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvtier_report_bad_")
        d = cls.tmp
        cls.db = os.path.join(d, "r.sqlite")
        run(["sim", "--config", opt_experiment(d, opt_trace(d, requests=4)), "--out", cls.db,
             "--systems", "as"], d)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def expect_error(self, args, message, env=None):
        code, _, stderr = run(["report"] + args, self.tmp, env=env, check=False)
        self.assertEqual(code, 2, stderr)
        self.assertIn(message, stderr)

    def test_missing_database(self):
        self.expect_error(["nope.sqlite", "--out", "o"], "nope.sqlite: no such file")

    def test_not_sqlite(self):
        path = os.path.join(self.tmp, "text.sqlite")
        with open(path, "w") as f:
            f.write("not a database\n")
        self.expect_error([path, "--out", "o"], "text.sqlite: not an SQLite database")

    def test_a_fifo_is_refused_not_waited_on(self):
        # Regression (probing, 2026-12-02): `report FIFO` blocked forever reading the header.
        path = os.path.join(self.tmp, "pipe.sqlite")
        os.mkfifo(path)
        self.expect_error([path, "--out", "o"], "must be a regular file, not a FIFO")

    def test_sqlite_without_runs_table(self):
        path = os.path.join(self.tmp, "other.sqlite")
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE t (x)")
        con.close()
        self.expect_error([path, "--out", "o"], "not a kvtier results database (no runs table)")

    def test_out_not_writable(self):
        blocker = os.path.join(self.tmp, "a_file")
        with open(blocker, "w") as f:
            f.write("x")
        self.expect_error([self.db, "--out", blocker], "--out " + blocker + ": not a directory")
        self.expect_error([self.db, "--out", os.path.join(blocker, "sub")],
                          "cannot create the directory")

    def test_unknown_runs(self):
        self.expect_error([self.db, "--out", "o", "--runs", "1,7"],
                          "--runs: no run 7 in the database (it has runs 1)")
        self.expect_error([self.db, "--out", "o", "--runs", "x"], "--runs: cannot parse 'x'")

    def test_missing_out(self):
        self.expect_error([self.db], "--out DIR is required")

    def test_matplotlib_missing_says_how_to_install_it(self):
        # /usr/bin/python3 -S: Debian's Python without site-packages, so without matplotlib.
        python = shutil.which("python3", path="/usr/bin") or shutil.which("python3")
        wrapper = os.path.join(self.tmp, "python-without-site")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec {python} -S \"$@\"\n")
        os.chmod(wrapper, 0o755)
        self.expect_error([self.db, "--out", "o"], "apt-get install python3-matplotlib",
                          env={"KVTIER_PYTHON": wrapper})


def find_browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser(unittest.TestCase):
    """A real headless browser renders the report."""

    def setUp(self):
        self.browser = find_browser()
        if self.browser is None:
            self.skipTest("no headless browser (chromium) on this machine: install it with "
                          "`apt-get install chromium` (scripts/test.sh does)")
        self.tmp = tempfile.mkdtemp(prefix="kvtier_report_browser_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def render(self, html_path, png):
        """Screenshot of a page; returns the browser's console messages."""
        p = subprocess.run(
            [self.browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0", f"--user-data-dir={self.tmp}/profile",
             "--window-size=1280,2000", f"--screenshot={png}", "file://" + html_path],
            capture_output=True, text=True, timeout=180)
        self.assertTrue(os.path.isfile(png), p.stderr[-3000:])
        return [line for line in p.stderr.splitlines() if ":CONSOLE" in line]

    def test_the_report_renders_without_console_messages(self):
        # The check can fail: a page that logs an error is caught.
        bad = os.path.join(self.tmp, "bad.html")
        with open(bad, "w") as f:
            f.write('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>x</title>'
                    '</head><body><script>console.error("kvtier-probe")</script></body></html>')
        console = self.render(bad, os.path.join(self.tmp, "bad.png"))
        self.assertTrue(any("kvtier-probe" in line for line in console), console)

        db = os.path.join(self.tmp, "r.sqlite")
        build_sim_db(self.tmp, db)
        out, _, _, _ = report_dir(self.tmp, db, "report", ["--quiet"])
        png = os.path.join(self.tmp, "screenshot.png")
        self.assertEqual(self.render(os.path.join(out, "index.html"), png), [])
        import matplotlib.image
        pixels = matplotlib.image.imread(png)[:, :, :3]
        flat = pixels.reshape(-1, 3)
        non_white = (flat.min(axis=1) < 0.95).mean()
        colours = len({tuple(p) for p in (flat[::97] * 255).astype(int).tolist()})
        self.assertGreater(non_white, 0.03, "screenshot is blank")
        self.assertGreater(colours, 20, "screenshot has no figure colours")


if __name__ == "__main__":
    # Exit 77 (ctest's SKIP_RETURN_CODE) when every selected test was skipped.
    prog = unittest.main(exit=False, verbosity=2)
    result = prog.result
    if result.testsRun and len(result.skipped) == result.testsRun and result.wasSuccessful():
        sys.exit(77)
    sys.exit(0 if result.wasSuccessful() else 1)
