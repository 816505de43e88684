-- +goose Up
-- SQLite twin of ../postgres/00011_reconciliation_jobs.sql: same tables and indexes.
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

-- +goose Down
DROP TABLE reconciliation_job_items;
DROP TABLE reconciliation_jobs;
