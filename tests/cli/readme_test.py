#!/usr/bin/env python3
"""Every `kvtier ...` line of README.md's "Using it" block runs and exits 0.

The block is read from README.md itself, so the documentation cannot drift from the code: a
renamed flag, subcommand or config file fails this test. Each line runs with its flags kept
verbatim, in a temporary directory (its relative outputs land there, never in the repository),
with these documented changes only:

  - PLACEHOLDERS: a README word that stands for the user's own file is replaced;
  - repository inputs (an argument starting with configs/ or data/ that names a file of the
    source tree) are made absolute, since the commands do not run in the checkout;
  - CAPS: flags appended to keep the run short on 2 cores (a few minutes for the block): the
    README's defaults (240 requests, 8x4 recorded prompts, 20 eval items per task, the full
    calibration) would take many minutes; each cap is a flag the command documents.

Lines that need the SmolLM2 model (lm, trace record, eval) are skipped, with a note, where
scripts/fetch_model.sh could not fetch it, as the other real-model tests are. The test checks
that every table entry was used (a stale entry fails) and that the repository is unchanged.

Run by ctest (tests/cli/CMakeLists.txt, label `readme`); KVTIER_BIN and KVTIER_SOURCE_DIR come
from the environment.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE = os.environ.get("KVTIER_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
KVTIER = os.environ.get("KVTIER_BIN", os.path.join(SOURCE, "build", "cli", "kvtier"))
MODEL = os.environ.get("KVTIER_MODEL") or os.path.expanduser(
    "~/.cache/kvtier/models/SmolLM2-135M-Instruct.Q4_1.gguf")

# README word -> what the test passes instead ({tmp}: the test's directory), and why.
PLACEHOLDERS = {
    "X.ini": ("{tmp}/x.ini", "the user's experiment: a tiny SmolLM2-shaped one on the hw host "
                             "backend, written by the test (experiment_ini below)"),
    "configs/hardware/mybox.ini": ("{tmp}/mybox.ini", "an output: never written into the "
                                                      "repository"),
}

# Leading words of a command -> flags appended to it, and why.
CAPS = {
    ("trace", "gen"): (["--requests", "60"],
                       "60 of quickstart's 240 requests: the sim and the 9-point sweep that "
                       "replay q.kvt take seconds (40 warm-up, 20 measured)"),
    ("trace", "record"): (["--prompts", "2", "--queries", "2"],
                          "4 recorded requests instead of 32"),
    ("eval",): (["--items", "2", "--retentions", "0.25", "--alphas", "0.6", "--selectors",
                 "itf,h2o"], "2 items per task, one retention and alpha, two selectors"),
    ("calibrate",): (["--quick"], "a few seconds instead of up to a minute"),
}

NEEDS_MODEL = {("lm",), ("trace", "record"), ("eval",)}


def experiment_ini(tmp):
    """X.ini: a tiny SmolLM2-shaped trace on the hw host backend (runs in seconds)."""
    trace = os.path.join(tmp, "x.kvt")
    subprocess.run([KVTIER, "trace", "gen", "--quiet", "--out", trace, "--requests", "6",
                    "--prompts", "2", "--tasks", "1", "--examples_min", "1", "--examples_max",
                    "2", "--example_tokens", "200", "--example_tokens_sd", "20", "--rate", "50",
                    "--model-name", "smollm2-135m", "--model-layers", "30", "--model-heads", "9",
                    "--model-kv-heads", "3", "--vocab", "49152", "--calibration_tokens", "256"],
                   check=True, cwd=tmp)
    path = os.path.join(tmp, "x.ini")
    with open(path, "w") as f:
        f.write("[include]\nmodel = smollm2-135m\nhardware = a100-pcie4-nvme\n"
                "[experiment]\nname = readme\nsystems = as,spec\n"
                f"[workload]\ntrace = {trace}\n[itf]\nprobe_heads = 2\n"
                "[cache]\ngpu_capacity = 4MiB\ncpu_capacity = 16MiB\n[run]\nwarmup_requests = 1\n"
                "[hw]\nbackend = host\nmax_memory = 256MiB\n")


def readme_lines():
    """The commands of the "Using it" block, continuation lines joined, comments dropped."""
    with open(os.path.join(SOURCE, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Using it")
    block = text[text.index("```sh\n", start) + 6:]
    block = block[:block.index("```")]
    lines, current = [], ""
    for raw in block.splitlines():
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


def snapshot(root, skip):
    """The repository's files, build directories and .git left out. (Paths only: a developer
    may edit a file while the test runs; a README line would add one.)"""
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".git" and os.path.join(d, x) not in skip
                   and not x.startswith("build")]
        out.update(os.path.join(d, name) for name in files)
    return out


class ReadmeCommands(unittest.TestCase):
    def test_every_using_it_line_runs(self):
        lines = readme_lines()
        self.assertEqual(lines[0], "k=build/cli/kvtier", "the block starts by naming kvtier")
        commands = lines[1:]
        self.assertGreaterEqual(len(commands), 14)
        tmp = tempfile.mkdtemp(prefix="kvtier_readme_")
        skip = {os.path.abspath(os.environ.get("KVTIER_BINARY_DIR", os.path.join(SOURCE, "build")))}
        before = snapshot(SOURCE, skip)
        env = dict(os.environ)
        env.update({"KVTIER_CONFIG_DIR": os.path.join(SOURCE, "configs"),
                    "KVTIER_SELECTION_MEMO": os.path.join(tmp, "selections"),
                    "PYTHONDONTWRITEBYTECODE": "1"})
        used_placeholders, used_caps, skipped, timings = set(), set(), [], []
        try:
            experiment_ini(tmp)
            for line in commands:
                words = shlex.split(line, comments=True)
                self.assertEqual(words[0], "$k", f"not a kvtier line: {line}")
                args = []
                for w in words[1:]:
                    if w in PLACEHOLDERS:
                        used_placeholders.add(w)
                        w = PLACEHOLDERS[w][0].format(tmp=tmp)
                    elif (w.startswith("configs/") or w.startswith("data/")) and \
                            os.path.exists(os.path.join(SOURCE, w)):
                        w = os.path.join(SOURCE, w)
                    args.append(w)
                for lead, (flags, _) in CAPS.items():
                    if tuple(args[:len(lead)]) == lead:
                        used_caps.add(lead)
                        args += flags
                needs_model = any(tuple(args[:len(lead)]) == lead for lead in NEEDS_MODEL)
                if needs_model and not os.path.exists(MODEL):
                    skipped.append(line)
                    continue
                t0 = time.monotonic()
                p = subprocess.run([KVTIER] + args, cwd=tmp, env=env, capture_output=True,
                                   text=True, timeout=900)
                timings.append((time.monotonic() - t0, line))
                self.assertEqual(p.returncode, 0,
                                 f"README line failed:\n  {line}\nran as: kvtier "
                                 f"{shlex.join(args)}\nstdout:\n{p.stdout[-3000:]}\n"
                                 f"stderr:\n{p.stderr[-3000:]}")
            self.assertEqual(used_placeholders, set(PLACEHOLDERS), "a placeholder was not used")
            self.assertEqual(used_caps, set(CAPS), "a cap matched no README line")
            # What the lines say they write is there, in the temporary directory.
            for out in ("q.kvt", "mooncake.kvt", "r.sqlite", "sweep.sqlite", "v.sqlite",
                        "mybox.ini", os.path.join("report", "index.html")):
                self.assertTrue(os.path.isfile(os.path.join(tmp, out)), out)
        finally:
            for seconds, line in timings:
                print(f"{seconds:6.1f} s  {line}")
            for line in skipped:
                print(f"skipped (no model at {MODEL}; scripts/fetch_model.sh): {line}")
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertEqual(snapshot(SOURCE, skip) - before, set(),
                         "a README line wrote into the repository")


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    unittest.main(verbosity=2)
