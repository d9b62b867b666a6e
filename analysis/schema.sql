-- kvtier results schema (both modes). Units are in column names: _s seconds, _bytes bytes.
-- Documented column by column in analysis/SCHEMA.md. Applied by ResultsDb to a new file, which
-- then records kResultsSchemaVersion (analysis/results_db.h) in PRAGMA user_version: bump it
-- with any change here or in views.sql.

CREATE TABLE IF NOT EXISTS runs (
  -- AUTOINCREMENT: an id is never reused, even after its run was deleted (an interrupted sweep
  -- point), so a late writer of a deleted run can never add rows to another run.
  run_id        INTEGER PRIMARY KEY AUTOINCREMENT,
  mode          TEXT NOT NULL CHECK (mode IN ('sim', 'hw', 'eval')),
  experiment    TEXT NOT NULL,
  system        TEXT NOT NULL,
  model         TEXT NOT NULL,
  hardware      TEXT NOT NULL,
  trace         TEXT NOT NULL,
  trace_sha256  TEXT NOT NULL,
  config        TEXT NOT NULL,   -- fully resolved configuration, "key = value" lines
  config_sha256 TEXT NOT NULL,   -- identifies a configuration point (sweep resume)
  git_commit    TEXT NOT NULL,
  started_at    TEXT NOT NULL,   -- UTC, ISO 8601
  wall_s        REAL,            -- wall-clock duration of the run
  complete      INTEGER NOT NULL DEFAULT 0,  -- 1 once every request was logged
  status        TEXT NOT NULL DEFAULT 'running',  -- running | ok | failed
  error         TEXT             -- status 'failed': the failure that stopped the run
);

CREATE TABLE IF NOT EXISTS requests (
  run_id              INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  request_id          INTEGER NOT NULL,
  arrival_s           REAL NOT NULL,
  start_s             REAL NOT NULL,
  end_s               REAL NOT NULL,
  prefix_tokens       INTEGER NOT NULL,
  reused_tokens       INTEGER NOT NULL,
  query_tokens        INTEGER NOT NULL,
  important_tokens    INTEGER NOT NULL,
  ttft_s              REAL NOT NULL,
  ttft_arrival_s      REAL NOT NULL,
  queue_s             REAL NOT NULL,
  io_stall_s          REAL NOT NULL,
  ssd_read_bytes      INTEGER NOT NULL,
  ssd_write_bytes     INTEGER NOT NULL,
  pcie_h2d_bytes      INTEGER NOT NULL,
  pcie_d2h_bytes      INTEGER NOT NULL,
  gpu_hit_chunks      INTEGER NOT NULL,
  cpu_hit_chunks      INTEGER NOT NULL,
  ssd_read_chunks     INTEGER NOT NULL,
  itf_layers          INTEGER NOT NULL,
  itf_fallback_layers INTEGER NOT NULL,
  warmup              INTEGER NOT NULL,
  status              TEXT NOT NULL,
  PRIMARY KEY (run_id, request_id)
);

CREATE TABLE IF NOT EXISTS layers (
  run_id               INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  request_id           INTEGER NOT NULL,
  layer                INTEGER NOT NULL,
  itf_similarity       REAL,     -- NULL when ITF did not run
  itf_threshold        REAL,
  itf_fallback         INTEGER NOT NULL,
  selected_tokens      INTEGER NOT NULL,
  loaded_chunks        INTEGER NOT NULL,
  prefetched_chunks    INTEGER NOT NULL,
  prefetch_used_chunks INTEGER NOT NULL,
  start_s              REAL NOT NULL,
  end_s                REAL NOT NULL,
  stall_s              REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS transfers (
  run_id     INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  request_id INTEGER NOT NULL,
  layer      INTEGER NOT NULL,   -- -1: not tied to one layer
  src        TEXT NOT NULL,      -- gpu | cpu | ssd
  dst        TEXT NOT NULL,
  kind       TEXT NOT NULL,      -- ssd_read | ssd_write | h2d | d2h | cpu_gather
  purpose    TEXT NOT NULL,      -- probe | demand | prefetch | cake_load | store | reorder | promote | demote
  bytes      INTEGER NOT NULL,
  ios        INTEGER NOT NULL,
  method     TEXT NOT NULL DEFAULT 'dma',  -- dma | batched | device_gather (h2d/d2h; else dma)
  descriptors INTEGER NOT NULL DEFAULT 0,  -- batched: descriptors; device_gather: row runs
  submit_s   REAL NOT NULL,
  start_s    REAL NOT NULL,
  end_s      REAL NOT NULL,
  status     TEXT NOT NULL DEFAULT 'ok'  -- ok | failed | aborted (bytes: what moved)
);

CREATE TABLE IF NOT EXISTS decisions (
  run_id           INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  request_id       INTEGER NOT NULL,
  layer            INTEGER NOT NULL,
  kind             TEXT NOT NULL,  -- itf | admit | evict | promote | demote | prefetch | store | reorder | cake_load | cake_meet
  chunk            INTEGER NOT NULL,
  detail           TEXT NOT NULL,
  timing_dependent INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS metrics (
  run_id INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  name   TEXT NOT NULL,
  value  REAL NOT NULL,
  PRIMARY KEY (run_id, name)
);

-- `kvtier eval` (mode 'eval' runs): accuracy of a KV selector on a multiple-choice task, per
-- retention ratio (and ITF alpha), and of a low-bit decode method (KIVI, SpeCache) on a decode
-- task against the 16-bit cache. One row per (run, task, selector, retention, alpha, kv_bits,
-- kv_quant, topk). The kv_* ... oracle_hit_rate columns are NULL for multiple-choice rows.
CREATE TABLE IF NOT EXISTS accuracy (
  run_id                INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  task                  TEXT NOT NULL,   -- piqa | copa | rte | openbookqa | texts | greedy | niah
  selector              TEXT NOT NULL CHECK (selector IN ('full', 'itf', 'h2o', 'spi', 'random',
                                                          'kivi', 'specache', 'specache_nospec')),
  alpha                 REAL,            -- ITF threshold exponent; NULL for other selectors
  retention             REAL NOT NULL,   -- fraction of prefix tokens kept (1 for full and decode rows)
  items                 INTEGER NOT NULL,
  correct               INTEGER NOT NULL,
  accuracy              REAL NOT NULL,   -- correct / items (acc: sum of choice log-probs)
  first_token_agreement REAL NOT NULL,   -- share of items whose first generated token = full KV's
  mean_kept_fraction    REAL NOT NULL,   -- mean over items, layers, KV heads of kept / prefix
  itf_fallback_rate     REAL,            -- ITF layers that fell back to per-head H2O; NULL if not ITF
  kv_bits               INTEGER,         -- decode rows: 16 (full), 1 or 2
  kv_group              INTEGER,         -- KIVI group size g
  kv_residual           INTEGER,         -- KIVI residual window R (tokens kept in 16 bits)
  kv_quant              TEXT,            -- 'improved' (SpeCache eq. 3 at 1 bit) or 'kivi' (eq. 2)
  topk                  INTEGER,         -- 16-bit pairs fetched per layer and KV head (specache*)
  perplexity            REAL,            -- texts: exp(mean NLL) of the decoded tokens
  token_agreement       REAL,            -- decode: tokens agreeing with the 16-bit cache's
  hit_rate              REAL,            -- specache*: share of low-bit attention mass fetched
  oracle_hit_rate       REAL,            -- specache*: the same for the exact top-k
  kv_size_ratio         REAL             -- decode: GPU-resident KV bytes / 16-bit KV bytes
);

-- Decode (core/decode.h; systems with decode.policy): one row per step of the continuous
-- batch, and one per request when it produced its last token.
CREATE TABLE IF NOT EXISTS decode_steps (
  run_id         INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  step           INTEGER NOT NULL,  -- 0, 1, ... in the run
  start_s        REAL NOT NULL,
  end_s          REAL NOT NULL,
  batch          INTEGER NOT NULL,  -- sequences in the step
  tokens         INTEGER NOT NULL,  -- output tokens produced (SpeCache pre-decoding rows: none)
  rows           INTEGER NOT NULL,  -- token rows computed (SpeCache's speculative rows included)
  context_tokens INTEGER NOT NULL,  -- cached positions summed over the batch
  gpu_bytes      INTEGER NOT NULL,  -- GPU memory the batch's sequences hold
  compute_s      REAL NOT NULL,     -- GPU busy with the step's computes
  stall_s        REAL NOT NULL,     -- (end - start) - compute: waiting for KV
  h2d_bytes      INTEGER NOT NULL,  -- KV fetched or prefetched
  d2h_bytes      INTEGER NOT NULL,  -- new KV offloaded
  PRIMARY KEY (run_id, step)
);

CREATE TABLE IF NOT EXISTS decode_requests (
  run_id         INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  request_id     INTEGER NOT NULL,
  warmup         INTEGER NOT NULL,
  prompt_tokens  INTEGER NOT NULL,  -- prefix + query
  output_tokens  INTEGER NOT NULL,  -- the first token included
  first_token_s  REAL NOT NULL,     -- = requests.end_s
  join_s         REAL NOT NULL,     -- start of its first decode step
  end_s          REAL NOT NULL,     -- its last token
  steps          INTEGER NOT NULL,
  tpot_s         REAL NOT NULL,     -- (end - first_token) / (output_tokens - 1)
  stall_s        REAL NOT NULL,     -- stalls of the steps it was in
  PRIMARY KEY (run_id, request_id)
);

CREATE INDEX IF NOT EXISTS accuracy_by_run ON accuracy(run_id);
CREATE INDEX IF NOT EXISTS requests_by_run ON requests(run_id);
CREATE INDEX IF NOT EXISTS layers_by_run ON layers(run_id, request_id);
CREATE INDEX IF NOT EXISTS transfers_by_run ON transfers(run_id, request_id);
CREATE INDEX IF NOT EXISTS decisions_by_run ON decisions(run_id, request_id);
CREATE INDEX IF NOT EXISTS runs_by_config ON runs(config_sha256, mode);
