-- +goose Up
-- SQLite twin of ../postgres/00015_keys_by_state.sql (read it for the why).
CREATE INDEX operations_listed ON operations (tenant_id, state, acquired_at DESC, key_id DESC)
  WHERE state IN ('in_progress', 'failed', 'uncertain', 'released');
CREATE INDEX operations_listed_all ON operations (state, acquired_at DESC, key_id DESC)
  WHERE state IN ('in_progress', 'failed', 'uncertain', 'released');
DROP INDEX operations_uncertain;

-- +goose Down
CREATE INDEX operations_uncertain ON operations (tenant_id) WHERE state = 'uncertain';
DROP INDEX operations_listed_all;
DROP INDEX operations_listed;
