-- +goose Up
-- SQLite twin of ../postgres/00018_policies.sql.
CREATE TABLE policies (
  id             INTEGER  PRIMARY KEY AUTOINCREMENT,
  tenant_id      INTEGER  NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
  operation_name TEXT     NOT NULL DEFAULT '',
  ttl_seconds    INTEGER  CHECK (ttl_seconds >= 1),
  lease_seconds  INTEGER  CHECK (lease_seconds >= 1),
  on_expiry      TEXT     CHECK (on_expiry IN ('readmit', 'hold_until_reconciled')),
  updated_at     DATETIME NOT NULL,
  updated_by     TEXT     NOT NULL,
  UNIQUE (tenant_id, operation_name)
);

-- +goose Down
DROP TABLE policies;
