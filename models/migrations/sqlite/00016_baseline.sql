-- +goose Up
-- SQLite twin of ../postgres/00016_baseline.sql (read it for the why of each table): the
-- pre-release migrations 00001-00016 squashed, tables and indexes only, in the same version so
-- a database the pre-release chain migrated has nothing to apply. Triggers live in
-- models/sql/sqlite, applied after the migrations (models/sqlfuncs.go). SQLite has no
-- functions: the admission decision is Go in services/store_sqlite.go, under the single writer.
-- Columns are in the order the pre-release chain added them (ALTER TABLE appends), so a squashed
-- and an upgraded database agree.

CREATE TABLE tenants (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  name       TEXT     NOT NULL UNIQUE,
  created_at DATETIME NOT NULL
);

CREATE TABLE api_keys (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant_id    INTEGER  NOT NULL REFERENCES tenants (id),
  prefix       TEXT     NOT NULL,
  secret_hash  TEXT     NOT NULL UNIQUE,
  label        TEXT     NOT NULL DEFAULT '',
  created_at   DATETIME NOT NULL,
  last_used_at DATETIME,
  revoked_at   DATETIME
);

CREATE TABLE operators (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  username      TEXT     NOT NULL UNIQUE,
  password_hash TEXT     NOT NULL,
  role          TEXT     NOT NULL CHECK (role IN ('admin', 'operator', 'auditor')),
  tenant_id     INTEGER  REFERENCES tenants (id),
  created_at    DATETIME NOT NULL
);

CREATE TABLE sessions (
  id         TEXT PRIMARY KEY,
  data       BLOB NOT NULL,
  expires_at DATETIME
);
CREATE INDEX sessions_expires_at ON sessions (expires_at);

CREATE TABLE idem_keys (
  id                  INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant_id           INTEGER  NOT NULL,
  key                 TEXT     NOT NULL,
  fencing_token       INTEGER  NOT NULL,
  holder_operation_id TEXT,
  expires_at          DATETIME,
  last_operation_id   TEXT     NOT NULL,
  acquired_at         DATETIME NOT NULL,
  UNIQUE (tenant_id, key)
);
CREATE INDEX idem_keys_tenant_acquired ON idem_keys (tenant_id, acquired_at DESC, id DESC);
CREATE INDEX idem_keys_acquired ON idem_keys (acquired_at DESC, id DESC);
CREATE INDEX idem_keys_expiring ON idem_keys (expires_at) WHERE holder_operation_id IS NOT NULL;

CREATE TABLE operations (
  id               TEXT PRIMARY KEY,
  tenant_id        INTEGER  NOT NULL,
  key              TEXT     NOT NULL,
  operation_name   TEXT,
  fingerprint      TEXT,
  correlation_id   TEXT,
  attempt_id       TEXT,
  metadata         TEXT,
  state            TEXT     NOT NULL CHECK (state IN ('in_progress', 'succeeded', 'failed', 'uncertain', 'released')),
  state_reason     TEXT,
  fencing_token    INTEGER  NOT NULL,
  owner_token_hash TEXT     NOT NULL,
  acquired_at      DATETIME NOT NULL,
  expires_at       DATETIME NOT NULL,
  outcome_status   TEXT,
  outcome_receipt  TEXT,
  outcome_response TEXT,
  outcome_note     TEXT,
  outcome_by       TEXT,
  outcome_at       DATETIME,
  released_at      DATETIME,
  release_reason   TEXT,
  ended_at         DATETIME,
  duplicate_attempts INTEGER NOT NULL DEFAULT 0,
  conflict_attempts  INTEGER NOT NULL DEFAULT 0,
  api_key_id       INTEGER,
  uncertain_at     DATETIME,
  lease_expires_at DATETIME,
  on_expiry        TEXT     NOT NULL DEFAULT 'readmit' CHECK (on_expiry IN ('readmit', 'hold_until_reconciled')),
  -- Filled by the operations_key_id trigger when an INSERT does not name it (SQLite cannot
  -- add NOT NULL to a column of an existing table, so the pre-release chain left it nullable).
  key_id           INTEGER,
  possible_duplicate_effect INTEGER NOT NULL DEFAULT 0,
  -- The possible-duplicate triggers find a key's generations along this index.
  UNIQUE (tenant_id, key, fencing_token)
);
CREATE INDEX operations_ended ON operations (ended_at) WHERE ended_at IS NOT NULL;

CREATE TABLE attempts (
  id             INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant_id      INTEGER  NOT NULL,
  key            TEXT     NOT NULL,
  operation_id   TEXT,
  result         TEXT     NOT NULL CHECK (result IN ('admitted', 'duplicate', 'conflict')),
  attempt_id     TEXT,
  operation_name TEXT,
  fingerprint    TEXT,
  correlation_id TEXT,
  caller         TEXT     NOT NULL DEFAULT '',
  attempted_at   DATETIME NOT NULL
);
CREATE INDEX attempts_operation ON attempts (operation_id);
CREATE INDEX attempts_tenant_id ON attempts (tenant_id, id DESC);

CREATE TABLE events (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  operation_id TEXT     NOT NULL,
  tenant_id    INTEGER  NOT NULL,
  kind         TEXT     NOT NULL,
  actor        TEXT     NOT NULL,
  detail       TEXT     NOT NULL DEFAULT '',
  created_at   DATETIME NOT NULL
);
CREATE INDEX events_operation ON events (operation_id, id);
CREATE INDEX operations_uncertain_queue ON operations (tenant_id, uncertain_at, id) WHERE state = 'uncertain';
CREATE INDEX operations_uncertain_queue_all ON operations (uncertain_at, id) WHERE state = 'uncertain';

CREATE TABLE operation_counters (
  operation_id       TEXT    NOT NULL,
  shard              INTEGER NOT NULL,
  duplicate_attempts INTEGER NOT NULL DEFAULT 0,
  conflict_attempts  INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (operation_id, shard)
);
CREATE INDEX operations_lease ON operations (lease_expires_at) WHERE state = 'in_progress';

CREATE TABLE webhook_endpoints (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant_id   INTEGER  NOT NULL REFERENCES tenants (id),
  url         TEXT     NOT NULL,
  events      TEXT     NOT NULL,
  secret      TEXT     NOT NULL,
  created_by  TEXT     NOT NULL,
  created_at  DATETIME NOT NULL,
  disabled_at DATETIME,
  deleted_at  DATETIME,
  deleted_by  TEXT
);
CREATE INDEX webhook_endpoints_live ON webhook_endpoints (tenant_id)
  WHERE disabled_at IS NULL AND deleted_at IS NULL;

CREATE TABLE webhook_events (
  id                    INTEGER PRIMARY KEY AUTOINCREMENT,
  msg_id                TEXT     NOT NULL UNIQUE,
  tenant_id             INTEGER  NOT NULL,
  endpoint_id           INTEGER  NOT NULL REFERENCES webhook_endpoints (id),
  event_type            TEXT     NOT NULL,
  operation_id          TEXT     NOT NULL,
  occurred_at           DATETIME NOT NULL,
  op_key                TEXT     NOT NULL,
  op_name               TEXT,
  op_state              TEXT     NOT NULL,
  op_state_reason       TEXT,
  op_fencing_token      INTEGER  NOT NULL,
  op_outcome_status     TEXT,
  op_outcome_receipt    TEXT,
  previous_operation_id TEXT,
  previous_state        TEXT,
  status                TEXT     NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts              INTEGER  NOT NULL DEFAULT 0,
  next_attempt_at       DATETIME NOT NULL,
  claimed_until         DATETIME,
  claimed_by            TEXT,
  last_attempt_at       DATETIME,
  last_status           INTEGER,
  last_error            TEXT,
  delivered_at          DATETIME
);
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_events_tenant ON webhook_events (tenant_id, id DESC);

CREATE TABLE reconciliation_jobs (
  id            TEXT     PRIMARY KEY,
  scope         TEXT     NOT NULL,
  job_key       TEXT     NOT NULL,
  tenant_id     INTEGER,
  actor         TEXT     NOT NULL,
  status        TEXT     NOT NULL,
  outcome       TEXT     NOT NULL,
  note          TEXT     NOT NULL,
  selection     TEXT     NOT NULL,
  filter        TEXT,
  operation_ids TEXT     NOT NULL,
  request_hash  TEXT     NOT NULL,
  limited       BOOLEAN  NOT NULL DEFAULT 0,
  total         INTEGER  NOT NULL DEFAULT 0,
  done          INTEGER  NOT NULL DEFAULT 0,
  skipped       INTEGER  NOT NULL DEFAULT 0,
  created_at    DATETIME NOT NULL,
  finished_at   DATETIME
);
CREATE UNIQUE INDEX reconciliation_jobs_key ON reconciliation_jobs (scope, job_key);

CREATE TABLE reconciliation_job_items (
  job_id       TEXT     NOT NULL,
  operation_id TEXT     NOT NULL,
  result       TEXT     NOT NULL,
  detail       TEXT     NOT NULL DEFAULT '',
  created_at   DATETIME NOT NULL,
  PRIMARY KEY (job_id, operation_id)
);
CREATE UNIQUE INDEX operations_key_generation ON operations (key_id, fencing_token);

CREATE TABLE operation_state_counts (
  tenant_id INTEGER NOT NULL,
  state     TEXT    NOT NULL,
  n         INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, state)
);

CREATE TABLE operation_state_deltas (
  tenant_id INTEGER NOT NULL,
  state     TEXT    NOT NULL,
  n         INTEGER NOT NULL
);

CREATE TABLE attempt_hours (
  tenant_id INTEGER NOT NULL,
  hour      TEXT    NOT NULL,
  result    TEXT    NOT NULL,
  n         INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, hour, result)
);
CREATE INDEX attempt_hours_hour ON attempt_hours (hour);

CREATE TABLE attempt_hour_deltas (
  tenant_id INTEGER NOT NULL,
  hour      TEXT    NOT NULL,
  result    TEXT    NOT NULL,
  n         INTEGER NOT NULL
);
CREATE INDEX attempts_audited ON attempts (attempted_at, id) WHERE result <> 'admitted';
CREATE INDEX operations_flagged ON operations (acquired_at) WHERE possible_duplicate_effect;
CREATE INDEX idem_keys_holder ON idem_keys (holder_operation_id) WHERE holder_operation_id IS NOT NULL;
CREATE INDEX webhook_events_operation ON webhook_events (operation_id);
CREATE INDEX operations_listed ON operations (tenant_id, state, acquired_at DESC, key_id DESC)
  WHERE state IN ('in_progress', 'failed', 'uncertain', 'released');
CREATE INDEX operations_listed_all ON operations (state, acquired_at DESC, key_id DESC)
  WHERE state IN ('in_progress', 'failed', 'uncertain', 'released');

-- +goose Down
-- No Down: this is the first version. Delete the file to start again.
