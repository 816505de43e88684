-- +goose Up
-- An attempt_id retry is honoured only for the API key that created the hold and only while the
-- operation is in_progress (services/store_sqlite.go). operations.api_key_id records the
-- creating key; rows from before this migration have none, so their attempt_id is never honoured
-- again (a retry of such a hold is an ordinary duplicate: the safe reading).
ALTER TABLE operations ADD COLUMN api_key_id INTEGER;

-- +goose Down
ALTER TABLE operations DROP COLUMN api_key_id;
