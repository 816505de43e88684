-- +goose Up
-- SQLite twin of ../postgres/00006_acquire_batch.sql: nothing to create. SQLite's batch
-- acquire is the single-item decision in Go, looped in one immediate transaction
-- (services/store_sqlite.go); this migration keeps the two version sequences in step.
SELECT 1;

-- +goose Down
SELECT 1;
