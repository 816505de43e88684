-- +goose Up
-- Bulk reconciliation (docs/reference.md §10): one job per (scope, job_key), so submitting
-- the same form or POST /v1/reconciliations again with the same job id is the same job.
-- scope is "tenant:<id>" for an API key or a tenant-restricted account and "global" for a
-- global account, so two tenants' clients may pick the same job id. operation_ids is the
-- selection frozen when the job was created (a filter is resolved then), request_hash the
-- request it was created from: a job id reused for another request is refused.
CREATE TABLE reconciliation_jobs (
  id            uuid        PRIMARY KEY,
  scope         text        NOT NULL,
  job_key       text        NOT NULL,
  tenant_id     bigint,
  actor         text        NOT NULL,
  status        text        NOT NULL,
  outcome       text        NOT NULL,
  note          text        NOT NULL,
  selection     text        NOT NULL,
  filter        json,
  operation_ids json        NOT NULL,
  request_hash  text        NOT NULL,
  limited       boolean     NOT NULL DEFAULT false,
  total         integer     NOT NULL DEFAULT 0,
  done          integer     NOT NULL DEFAULT 0,
  skipped       integer     NOT NULL DEFAULT 0,
  created_at    timestamptz NOT NULL,
  finished_at   timestamptz
);
CREATE UNIQUE INDEX reconciliation_jobs_key ON reconciliation_jobs (scope, job_key);

-- One row per operation of a job, written in the same transaction as that operation's
-- outcome and event: the primary key makes each operation of a job reconciled at most once
-- however many requests work on the job at the same time.
CREATE TABLE reconciliation_job_items (
  job_id       uuid        NOT NULL,
  operation_id text        NOT NULL,
  result       text        NOT NULL,
  detail       text        NOT NULL DEFAULT '',
  created_at   timestamptz NOT NULL,
  PRIMARY KEY (job_id, operation_id)
);

-- +goose Down
DROP TABLE reconciliation_job_items, reconciliation_jobs;
