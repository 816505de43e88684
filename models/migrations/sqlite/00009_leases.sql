-- +goose Up
-- SQLite twin of ../postgres/00009_leases.sql: each operation's lease and expiry policy
-- (docs/reference.md §8). SQLite's acquire is Go code (services/store_sqlite.go), and waiters
-- learn of outcomes by polling, so there is no function or notification here.
ALTER TABLE operations ADD COLUMN lease_expires_at DATETIME;
ALTER TABLE operations ADD COLUMN on_expiry TEXT NOT NULL DEFAULT 'readmit'
  CHECK (on_expiry IN ('readmit', 'hold_until_reconciled'));
CREATE INDEX operations_lease ON operations (lease_expires_at) WHERE state = 'in_progress';

-- +goose Down
DROP INDEX operations_lease;
ALTER TABLE operations DROP COLUMN on_expiry;
ALTER TABLE operations DROP COLUMN lease_expires_at;
