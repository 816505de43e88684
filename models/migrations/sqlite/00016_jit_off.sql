-- +goose Up
-- ../postgres/00016_jit_off.sql turns PostgreSQL's JIT compilation off; SQLite has none. This
-- file keeps the two dialects' migration versions in step.
SELECT 1;

-- +goose Down
SELECT 1;
