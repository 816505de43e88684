-- +goose Up
-- Batch acquire: many acquires decided in one statement, so in one round trip and one
-- transaction (one commit, one WAL flush for all of them). Items are decided in order by the
-- single-item function itself, so a batch follows exactly the rules of a single acquire, and
-- an item sees the items before it (two items with one key: the second is decided after the
-- first). Arguments are one array per parameter of idemgate_acquire, index i being item i;
-- p_metadata is text (JSON or NULL) per item. Each result row is idemgate_acquire's row for
-- item ord (1-based). p_lock_timeout, when given (e.g. '20ms'), bounds every row-lock wait of the
-- batch; past it the whole statement fails with lock_not_available and nothing is decided.
-- +goose StatementBegin
CREATE FUNCTION idemgate_acquire_batch(
  p_tenant_ids bigint[], p_keys text[], p_ttl_seconds integer[], p_operation_names text[],
  p_fingerprints text[], p_correlation_ids text[], p_metadata text[], p_attempt_ids text[],
  p_callers text[], p_operation_ids uuid[], p_owner_token_hashes text[], p_api_key_ids bigint[],
  p_lock_timeout text DEFAULT NULL)
RETURNS TABLE (
  ord integer, result text, readmitted boolean, db_now timestamptz,
  prev_id uuid, prev_state text, prev_fencing_token bigint, prev_outcome_status text,
  prev_outcome_receipt text,
  op_id uuid, op_key text, op_operation_name text, op_fingerprint text, op_correlation_id text,
  op_metadata json, op_state text, op_state_reason text, op_fencing_token bigint,
  op_acquired_at timestamptz, op_expires_at timestamptz, op_outcome_status text,
  op_outcome_receipt text, op_outcome_response json, op_outcome_note text, op_outcome_by text,
  op_outcome_at timestamptz, op_released_at timestamptz, op_release_reason text,
  op_duplicate_attempts bigint, op_conflict_attempts bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF p_lock_timeout IS NOT NULL THEN
    -- Group admission (services/group.go) batches different callers' acquires: none of them may
    -- wait long on a row lock for another's key. The setting lasts until the statement's
    -- transaction ends.
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
  END IF;
  FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
    RETURN QUERY
      SELECT i, f.* FROM idemgate_acquire(p_tenant_ids[i], p_keys[i], p_ttl_seconds[i],
        p_operation_names[i], p_fingerprints[i], p_correlation_ids[i], p_metadata[i]::json,
        p_attempt_ids[i], p_callers[i], p_operation_ids[i], p_owner_token_hashes[i],
        p_api_key_ids[i]) f;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION idemgate_acquire_batch(bigint[], text[], integer[], text[], text[], text[], text[], text[],
                                     text[], uuid[], text[], bigint[], text);
