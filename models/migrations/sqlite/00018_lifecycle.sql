-- +goose Up
-- SQLite twin of ../postgres/00018_lifecycle.sql: lifecycle policies, what each operation was
-- admitted under, its purge time, and the key rows' protection past the TTL and tombstones.
CREATE TABLE policies (
  id                INTEGER  PRIMARY KEY AUTOINCREMENT,
  tenant_id         INTEGER  NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
  operation_name    TEXT     NOT NULL DEFAULT '',
  ttl_seconds       INTEGER  CHECK (ttl_seconds >= 1),
  lease_seconds     INTEGER  CHECK (lease_seconds >= 1),
  on_expiry         TEXT     CHECK (on_expiry IN ('readmit', 'hold_until_reconciled')),
  retention_seconds INTEGER  CHECK (retention_seconds >= 1),
  horizon_seconds   INTEGER  CHECK (horizon_seconds >= 1),
  updated_at        DATETIME NOT NULL,
  updated_by        TEXT     NOT NULL,
  UNIQUE (tenant_id, operation_name),
  CHECK (horizon_seconds IS NULL OR retention_seconds IS NULL OR horizon_seconds >= retention_seconds)
);

ALTER TABLE operations ADD COLUMN retention_seconds INTEGER;
ALTER TABLE operations ADD COLUMN horizon_seconds INTEGER;
ALTER TABLE operations ADD COLUMN purge_after DATETIME;
CREATE INDEX operations_purge ON operations (purge_after, id) WHERE purge_after IS NOT NULL;
DROP INDEX operations_ended;
CREATE INDEX operations_ended ON operations (ended_at, id) WHERE ended_at IS NOT NULL AND purge_after IS NULL;

ALTER TABLE idem_keys ADD COLUMN protected_until DATETIME;
ALTER TABLE idem_keys ADD COLUMN protected_by TEXT;
ALTER TABLE idem_keys ADD COLUMN tomb_fencing_token INTEGER;
ALTER TABLE idem_keys ADD COLUMN tomb_state TEXT;
ALTER TABLE idem_keys ADD COLUMN tomb_outcome_status TEXT;
ALTER TABLE idem_keys ADD COLUMN tomb_outcome_receipt TEXT;
ALTER TABLE idem_keys ADD COLUMN tomb_request_hash INTEGER;

-- +goose Down
DROP INDEX operations_ended;
CREATE INDEX operations_ended ON operations (ended_at) WHERE ended_at IS NOT NULL;
DROP INDEX operations_purge;
ALTER TABLE idem_keys DROP COLUMN tomb_request_hash;
ALTER TABLE idem_keys DROP COLUMN tomb_outcome_receipt;
ALTER TABLE idem_keys DROP COLUMN tomb_outcome_status;
ALTER TABLE idem_keys DROP COLUMN tomb_state;
ALTER TABLE idem_keys DROP COLUMN protected_until;
ALTER TABLE idem_keys DROP COLUMN protected_by;
ALTER TABLE idem_keys DROP COLUMN tomb_fencing_token;
ALTER TABLE operations DROP COLUMN purge_after;
ALTER TABLE operations DROP COLUMN horizon_seconds;
ALTER TABLE operations DROP COLUMN retention_seconds;
DROP TABLE policies;
