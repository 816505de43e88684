-- +goose Up
-- SQLite twin of ../postgres/00001_init.sql: same tables, columns and indexes, SQLite types.
-- Times are stored by the driver as UTC text in one fixed layout, so they compare as text.
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
-- The dashboard's global accounts list all tenants newest first with the same keyset.
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
  UNIQUE (tenant_id, key, fencing_token)
);
-- Partial: only operations needing reconciliation are indexed, so the hot insert path pays nothing.
CREATE INDEX operations_uncertain ON operations (tenant_id) WHERE state = 'uncertain';
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

-- +goose Down
DROP TABLE events;
DROP TABLE attempts;
DROP TABLE operations;
DROP TABLE idem_keys;
DROP TABLE sessions;
DROP TABLE operators;
DROP TABLE api_keys;
DROP TABLE tenants;
