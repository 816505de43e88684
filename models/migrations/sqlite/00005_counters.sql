-- +goose Up
-- SQLite twin of ../postgres/00005_counters.sql, for a schema both stores share. SQLite's
-- acquire runs under the database's one write lock, so it keeps counting in the operation's
-- own columns and never writes here; reads add this table's rows (none) all the same.
CREATE TABLE operation_counters (
  operation_id       TEXT    NOT NULL,
  shard              INTEGER NOT NULL,
  duplicate_attempts INTEGER NOT NULL DEFAULT 0,
  conflict_attempts  INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (operation_id, shard)
);

-- +goose Down
DROP TABLE operation_counters;
