-- +goose Up
-- SQLite twin of ../postgres/00012_acquire_batch_generic.sql: nothing to change (SQLite's
-- batch acquire is Go, services/store_sqlite.go); keeps the two version sequences in step.
SELECT 1;

-- +goose Down
SELECT 1;
