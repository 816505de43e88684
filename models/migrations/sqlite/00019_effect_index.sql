-- +goose Up
-- SQLite twin of ../postgres/00019_effect_index.sql: the generations of a key whose effect
-- may have happened, for the previous_operation warning and the possible duplicate flag.
CREATE INDEX operations_effect ON operations (key_id, fencing_token)
  WHERE state IN ('succeeded', 'uncertain');

-- +goose Down
DROP INDEX operations_effect;
