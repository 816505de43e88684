-- +goose Up
-- idemgate_acquire_batch (00006) without reading operations back: the new keys' operations are
-- returned by their own INSERT. The join it replaces was planned as a sequential scan of
-- operations while the table was small and the plan stayed cached on each connection as the
-- table grew: on a database without autovacuum (so without the ANALYZE that would have
-- replanned it), group admission fell from 1.2x to 0.2x of single acquires within a minute of
-- load. Everything else is 00006 unchanged.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemgate_acquire_batch(
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
DECLARE
  v_now   timestamptz := clock_timestamp();
  v_first integer[];
BEGIN
  IF p_lock_timeout IS NOT NULL THEN
    -- Group admission (services/group.go) batches different callers' acquires: none of them may
    -- wait long on a row lock for another's key. The setting lasts until the statement's
    -- transaction ends.
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
  END IF;
  WITH x AS (
    SELECT s.x_i, p_tenant_ids[s.x_i] AS x_tenant, p_keys[s.x_i] AS x_key
      FROM generate_subscripts(p_keys, 1) AS s(x_i)
  ), firsts AS (
    SELECT DISTINCT ON (x.x_tenant, x.x_key) x.x_i, x.x_tenant, x.x_key
      FROM x ORDER BY x.x_tenant, x.x_key, x.x_i
  ), ins AS (
    INSERT INTO idem_keys AS k (tenant_id, key, fencing_token, holder_operation_id, expires_at,
                                last_operation_id, acquired_at)
    SELECT f.x_tenant, f.x_key, 1, p_operation_ids[f.x_i],
           v_now + make_interval(secs => p_ttl_seconds[f.x_i]), p_operation_ids[f.x_i], v_now
      FROM firsts f ORDER BY f.x_tenant, f.x_key
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING k.holder_operation_id AS x_op
  )
  SELECT array_agg(f.x_i) INTO v_first FROM firsts f JOIN ins ON ins.x_op = p_operation_ids[f.x_i];
  IF v_first IS NOT NULL THEN
    -- The operations are returned from their own INSERT, not read back: a join against
    -- operations here was planned once per connection, while the table was small, as a
    -- sequential scan, and kept that plan as the table grew (until an ANALYZE invalidates it).
    RETURN QUERY
      WITH o AS (
        INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                                attempt_id, api_key_id, metadata, state, fencing_token,
                                owner_token_hash, acquired_at, expires_at)
        SELECT p_operation_ids[u.x_i], p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
               p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_attempt_ids[u.x_i], p_api_key_ids[u.x_i],
               p_metadata[u.x_i]::json, 'in_progress', 1, p_owner_token_hashes[u.x_i], v_now,
               v_now + make_interval(secs => p_ttl_seconds[u.x_i])
          FROM unnest(v_first) AS u(x_i)
        RETURNING *
      )
      SELECT u.x_i, 'admitted'::text, false, v_now, NULL::uuid, NULL::text, NULL::bigint, NULL::text,
             NULL::text, o.id, o.key, o.operation_name, o.fingerprint, o.correlation_id, o.metadata,
             o.state, o.state_reason, o.fencing_token, o.acquired_at, o.expires_at, NULL::text,
             NULL::text, NULL::json, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
             NULL::text, 0::bigint, 0::bigint
        FROM unnest(v_first) AS u(x_i) JOIN o ON o.id = p_operation_ids[u.x_i];
    INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                          fingerprint, correlation_id, caller, attempted_at)
    SELECT p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_ids[u.x_i], 'admitted', p_attempt_ids[u.x_i],
           p_operation_names[u.x_i], p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_callers[u.x_i], v_now
      FROM unnest(v_first) AS u(x_i);
  END IF;
  FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
    CONTINUE WHEN i = ANY(v_first);
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemgate_acquire_batch(
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
DECLARE
  v_now   timestamptz := clock_timestamp();
  v_first integer[];
BEGIN
  IF p_lock_timeout IS NOT NULL THEN
    -- Group admission (services/group.go) batches different callers' acquires: none of them may
    -- wait long on a row lock for another's key. The setting lasts until the statement's
    -- transaction ends.
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
  END IF;
  WITH x AS (
    SELECT s.x_i, p_tenant_ids[s.x_i] AS x_tenant, p_keys[s.x_i] AS x_key
      FROM generate_subscripts(p_keys, 1) AS s(x_i)
  ), firsts AS (
    SELECT DISTINCT ON (x.x_tenant, x.x_key) x.x_i, x.x_tenant, x.x_key
      FROM x ORDER BY x.x_tenant, x.x_key, x.x_i
  ), ins AS (
    INSERT INTO idem_keys AS k (tenant_id, key, fencing_token, holder_operation_id, expires_at,
                                last_operation_id, acquired_at)
    SELECT f.x_tenant, f.x_key, 1, p_operation_ids[f.x_i],
           v_now + make_interval(secs => p_ttl_seconds[f.x_i]), p_operation_ids[f.x_i], v_now
      FROM firsts f ORDER BY f.x_tenant, f.x_key
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING k.holder_operation_id AS x_op
  )
  SELECT array_agg(f.x_i) INTO v_first FROM firsts f JOIN ins ON ins.x_op = p_operation_ids[f.x_i];
  IF v_first IS NOT NULL THEN
    INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                            attempt_id, api_key_id, metadata, state, fencing_token,
                            owner_token_hash, acquired_at, expires_at)
    SELECT p_operation_ids[u.x_i], p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
           p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_attempt_ids[u.x_i], p_api_key_ids[u.x_i],
           p_metadata[u.x_i]::json, 'in_progress', 1, p_owner_token_hashes[u.x_i], v_now,
           v_now + make_interval(secs => p_ttl_seconds[u.x_i])
      FROM unnest(v_first) AS u(x_i);
    INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                          fingerprint, correlation_id, caller, attempted_at)
    SELECT p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_ids[u.x_i], 'admitted', p_attempt_ids[u.x_i],
           p_operation_names[u.x_i], p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_callers[u.x_i], v_now
      FROM unnest(v_first) AS u(x_i);
    RETURN QUERY
      SELECT u.x_i, 'admitted'::text, false, v_now, NULL::uuid, NULL::text, NULL::bigint, NULL::text,
             NULL::text, o.id, o.key, o.operation_name, o.fingerprint, o.correlation_id, o.metadata,
             o.state, o.state_reason, o.fencing_token, o.acquired_at, o.expires_at, NULL::text,
             NULL::text, NULL::json, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
             NULL::text, 0::bigint, 0::bigint
        FROM unnest(v_first) AS u(x_i) JOIN operations o ON o.id = p_operation_ids[u.x_i];
  END IF;
  FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
    CONTINUE WHEN i = ANY(v_first);
    RETURN QUERY
      SELECT i, f.* FROM idemgate_acquire(p_tenant_ids[i], p_keys[i], p_ttl_seconds[i],
        p_operation_names[i], p_fingerprints[i], p_correlation_ids[i], p_metadata[i]::json,
        p_attempt_ids[i], p_callers[i], p_operation_ids[i], p_owner_token_hashes[i],
        p_api_key_ids[i]) f;
  END LOOP;
END
$$;
-- +goose StatementEnd
