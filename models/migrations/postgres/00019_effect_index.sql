-- +goose NO TRANSACTION
-- +goose Up
-- The generations of a key whose effect may have happened (succeeded or uncertain), newest
-- first: what an admission is warned about (previous_operation, docs/reference.md §4;
-- services/rules.go warnedGeneration) and what flags it a possible duplicate effect
-- (operations_possible_duplicate.sql). Without it each of those walked every earlier
-- generation of the key through operations_key_generation, and a key acquired and released
-- once a second (a lock-like use) keeps about 600,000 of them over a week's retention.
--
-- CONCURRENTLY, so an upgrade of a large table does not stop admissions while it builds; hence
-- outside a transaction. A build cut off leaves an invalid index behind: dropping it first makes
-- the migration safe to run again.
DROP INDEX CONCURRENTLY IF EXISTS operations_effect;
CREATE INDEX CONCURRENTLY operations_effect ON operations (key_id, fencing_token)
  WHERE state IN ('succeeded', 'uncertain');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS operations_effect;
