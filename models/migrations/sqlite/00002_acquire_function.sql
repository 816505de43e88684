-- +goose Up
-- Placeholder so both dialects share version numbers: on SQLite, acquire runs as an ordinary
-- immediate transaction in Go (services/store_sqlite.go), as SQLite has no stored functions.
SELECT 1;

-- +goose Down
SELECT 1;
