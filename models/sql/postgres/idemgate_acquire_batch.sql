-- idemgate_acquire_batch decides many acquires in one statement: one round trip, one
-- transaction, one commit (group admission sends every batch through it, services/group.go).
-- Arguments are one array per parameter of idemgate_acquire, index i being item i; p_metadata
-- is text (JSON or NULL) per item. Each result row is idemgate_acquire's row for item ord
-- (1-based). p_lock_timeout, when given (e.g. '20ms'), bounds every row-lock wait of the batch;
-- past it the whole statement fails with lock_not_available and nothing is decided.
--
-- The rules are idemgate_acquire's, step for step, and an item sees the items before it:
--   1. the first item of a key that does not exist yet is admitted for all such items at once,
--      set-based, in one data-modifying WITH (holds, operations, attempts), answered from the
--      arrays they came in; new keys are inserted in (tenant, key) order, so two batches never
--      deadlock on each other's new keys, and a batch of only new keys returns here;
--   2. duplicates and conflicts of live holds are decided set-based in one statement (a retry
--      storm fills batches with items of one key);
--   3. the rest (takeovers, free keys, attempt_id retries) calls idemgate_acquire in order.
--
-- plan_cache_mode = force_generic_plan: PostgreSQL otherwise planned every statement anew on
-- every call (the arrays' sizes made each custom plan look cheaper), and planning was most of a
-- small batch's time. Every statement is over the argument arrays or a lookup by a unique
-- index, so the generic plan is the one the custom plans picked; models' generic-plan test
-- checks with auto_explain that no statement scans a table. Measured with pgbench: one new key
-- 0.50 -> 0.27 ms a call, eight items of one held key 0.73 -> 0.53 ms.

CREATE OR REPLACE FUNCTION idemgate_acquire_batch(
  p_tenant_ids bigint[], p_keys text[], p_ttl_seconds integer[], p_operation_names text[],
  p_fingerprints text[], p_correlation_ids text[], p_metadata text[], p_attempt_ids text[],
  p_callers text[], p_operation_ids uuid[], p_owner_token_hashes text[], p_api_key_ids bigint[],
  p_lease_seconds integer[], p_on_expiry text[], p_retention_seconds bigint[],
  p_horizon_seconds bigint[], p_lock_timeout text DEFAULT NULL)
RETURNS TABLE (
  ord integer, result text, readmitted boolean, db_now timestamptz,
  prev_id uuid, prev_state text, prev_fencing_token bigint, prev_outcome_status text,
  prev_outcome_receipt text,
  op_id uuid, op_key text, op_operation_name text, op_fingerprint text, op_correlation_id text,
  op_metadata json, op_state text, op_state_reason text, op_fencing_token bigint,
  op_acquired_at timestamptz, op_expires_at timestamptz, op_outcome_status text,
  op_outcome_receipt text, op_outcome_response json, op_outcome_note text, op_outcome_by text,
  op_outcome_at timestamptz, op_released_at timestamptz, op_release_reason text,
  op_duplicate_attempts bigint, op_conflict_attempts bigint,
  op_lease_expires_at timestamptz, op_on_expiry text, op_retention_seconds bigint,
  op_horizon_seconds bigint, op_purge_after timestamptz, op_protected_until timestamptz,
  op_evidence_purged boolean)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  v_now   timestamptz := clock_timestamp();
  v_first integer[];
  v_dup_i integer[];
  v_dup_r text[];
  v_dup_o operations[];
  v_holders operations[] := '{}';
  v_h     operations%ROWTYPE;
  v_tenant bigint;
  v_key   text;
BEGIN
  IF p_lock_timeout IS NOT NULL THEN
    -- Group admission (services/group.go) batches different callers' acquires: none of them may
    -- wait long on a row lock for another's key. The setting lasts until the statement's
    -- transaction ends.
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
  END IF;
  -- Keys acquired for the first time, the common case, in one statement: the holds, their
  -- operations and their attempts. The items admitted here are answered from the arrays they
  -- came in (what was stored is exactly that), so no statement of this function reads
  -- operations by anything but an index it cannot do without.
  WITH f AS (
    SELECT DISTINCT ON (p_tenant_ids[s.x_i], p_keys[s.x_i]) s.x_i
      FROM generate_subscripts(p_keys, 1) AS s(x_i)
     ORDER BY p_tenant_ids[s.x_i], p_keys[s.x_i], s.x_i
  ), ins AS (
    INSERT INTO idem_keys AS k (tenant_id, key, fencing_token, holder_operation_id, expires_at,
                                last_operation_id, acquired_at)
    SELECT p_tenant_ids[f.x_i], p_keys[f.x_i], 1, p_operation_ids[f.x_i],
           v_now + make_interval(secs => p_ttl_seconds[f.x_i]), p_operation_ids[f.x_i], v_now
      FROM f ORDER BY p_tenant_ids[f.x_i], p_keys[f.x_i]
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING k.holder_operation_id AS x_op, k.id AS x_key_id
  ), u AS (
    SELECT f.x_i, ins.x_key_id FROM f JOIN ins ON ins.x_op = p_operation_ids[f.x_i]
  ), o AS (
    INSERT INTO operations (id, key_id, tenant_id, key, operation_name, fingerprint, correlation_id,
                            attempt_id, api_key_id, metadata, state, fencing_token,
                            owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry,
                            retention_seconds, horizon_seconds)
    SELECT p_operation_ids[u.x_i], u.x_key_id, p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
           p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_attempt_ids[u.x_i], p_api_key_ids[u.x_i],
           p_metadata[u.x_i]::json, 'in_progress', 1, p_owner_token_hashes[u.x_i], v_now,
           v_now + make_interval(secs => p_ttl_seconds[u.x_i]),
           v_now + make_interval(secs => COALESCE(p_lease_seconds[u.x_i], p_ttl_seconds[u.x_i])),
           COALESCE(p_on_expiry[u.x_i], 'readmit'), p_retention_seconds[u.x_i], p_horizon_seconds[u.x_i]
      FROM u
  ), a AS (
    INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                          fingerprint, correlation_id, caller, attempted_at)
    SELECT p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_ids[u.x_i], 'admitted', p_attempt_ids[u.x_i],
           p_operation_names[u.x_i], p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_callers[u.x_i], v_now
      FROM u
  )
  SELECT coalesce(array_agg(u.x_i), '{}') INTO v_first FROM u;
  IF cardinality(v_first) > 0 THEN
    RETURN QUERY
      SELECT u.x_i, 'admitted'::text, false, v_now, NULL::uuid, NULL::text, NULL::bigint, NULL::text,
             NULL::text, p_operation_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
             p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_metadata[u.x_i]::json, 'in_progress'::text,
             NULL::text, 1::bigint, v_now, v_now + make_interval(secs => p_ttl_seconds[u.x_i]), NULL::text,
             NULL::text, NULL::json, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
             NULL::text, 0::bigint, 0::bigint,
             v_now + make_interval(secs => COALESCE(p_lease_seconds[u.x_i], p_ttl_seconds[u.x_i])),
             COALESCE(p_on_expiry[u.x_i], 'readmit'), p_retention_seconds[u.x_i], p_horizon_seconds[u.x_i],
             NULL::timestamptz, NULL::timestamptz, false
        FROM unnest(v_first) AS u(x_i);
    IF cardinality(v_first) = cardinality(p_keys) THEN
      RETURN; -- every item a new key: nothing below has anything to do
    END IF;
  END IF;

  -- Duplicates and conflicts of live holds, set-based: a retry storm fills a batch with items
  -- of one key, and deciding each through idemgate_acquire cost six statements apiece (make
  -- bench: one hot key ran at 0.8x the new-key rate). Now each key's holder is read once, and
  -- all its items are decided, logged and counted together. The rule is idemgate_acquire's
  -- held branch: a holder and its hold are read in one statement, so in one snapshot, and
  -- nothing is locked; the same operation name and fingerprint make a duplicate, any
  -- difference a conflict. Left to the loop below: an item that may be the creating API key's
  -- attempt_id retry of an in_progress holder (it may be admitted again), and the items of
  -- keys without a live hold (free, expired or released: the first takes the key over, the
  -- rest see it). Items of a live-held key keep that holder whichever way they are decided, so
  -- splitting them changes no answer.
  --
  -- The holders are read one key at a time, each a unique-index lookup, on purpose: a join of
  -- the items against idem_keys and operations would be planned once per connection, maybe
  -- while the tables are small (as hash joins over sequential scans), and that plan would be
  -- kept as they grow. The join that follows is between arrays only.
  v_now := clock_timestamp();
  FOR v_tenant, v_key IN
    SELECT DISTINCT p_tenant_ids[s.x_i], p_keys[s.x_i] FROM generate_subscripts(p_keys, 1) AS s(x_i)
     WHERE NOT (s.x_i = ANY (v_first))
  LOOP
    SELECT o.* INTO v_h FROM idem_keys k JOIN operations o ON o.id = k.holder_operation_id
     WHERE k.tenant_id = v_tenant AND k.key = v_key AND k.expires_at > v_now
       -- A holder whose lease lapsed without an outcome is left to idemgate_acquire, which
       -- makes it uncertain first.
       AND NOT (o.state = 'in_progress' AND COALESCE(o.lease_expires_at, o.expires_at) <= v_now);
    IF FOUND THEN
      -- The holder's counters so far: its columns plus its counter rows (operation_counters).
      SELECT v_h.duplicate_attempts + COALESCE(SUM(c.duplicate_attempts), 0),
             v_h.conflict_attempts + COALESCE(SUM(c.conflict_attempts), 0)
        INTO v_h.duplicate_attempts, v_h.conflict_attempts
        FROM operation_counters c WHERE c.operation_id = v_h.id;
      v_holders := v_holders || v_h;
    END IF;
  END LOOP;
  SELECT array_agg(r.x_i ORDER BY r.x_i),
         array_agg(CASE WHEN idemgate_same_request(o.operation_name, o.fingerprint,
                                                   p_operation_names[r.x_i], p_fingerprints[r.x_i])
                        THEN 'duplicate' ELSE 'conflict' END ORDER BY r.x_i),
         array_agg(o ORDER BY r.x_i)
    INTO v_dup_i, v_dup_r, v_dup_o
    FROM generate_subscripts(p_keys, 1) AS r(x_i)
    JOIN unnest(v_holders) AS o ON o.tenant_id = p_tenant_ids[r.x_i] AND o.key = p_keys[r.x_i]
   WHERE NOT (r.x_i = ANY (v_first))
     AND NOT (p_attempt_ids[r.x_i] IS NOT NULL AND o.attempt_id = p_attempt_ids[r.x_i]
              AND o.api_key_id = p_api_key_ids[r.x_i] AND o.state = 'in_progress'
              AND idemgate_same_request(o.operation_name, o.fingerprint,
                                        p_operation_names[r.x_i], p_fingerprints[r.x_i]));
  IF v_dup_i IS NOT NULL THEN
    INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                          fingerprint, correlation_id, caller, attempted_at)
    SELECT p_tenant_ids[u.x_i], p_keys[u.x_i], o.id, u.x_r, p_attempt_ids[u.x_i],
           p_operation_names[u.x_i], p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_callers[u.x_i], v_now
      FROM unnest(v_dup_i, v_dup_r) WITH ORDINALITY AS u(x_i, x_r, x_n)
      JOIN unnest(v_dup_o) WITH ORDINALITY AS o ON o.ordinality = u.x_n;
    -- Each item's counters are its holder's before this batch (read with the holder above)
    -- plus this batch's items of that holder up to and including it, as deciding them one by
    -- one would have counted.
    RETURN QUERY
      SELECT u.x_i, u.x_r, false, v_now, NULL::uuid, NULL::text, NULL::bigint, NULL::text, NULL::text,
             o.id, o.key, o.operation_name, o.fingerprint, o.correlation_id, o.metadata, o.state,
             o.state_reason, o.fencing_token, o.acquired_at, o.expires_at, o.outcome_status,
             o.outcome_receipt, o.outcome_response, o.outcome_note, o.outcome_by, o.outcome_at,
             o.released_at, o.release_reason,
             o.duplicate_attempts
               + count(*) FILTER (WHERE u.x_r = 'duplicate') OVER (PARTITION BY o.id ORDER BY u.x_i),
             o.conflict_attempts
               + count(*) FILTER (WHERE u.x_r = 'conflict') OVER (PARTITION BY o.id ORDER BY u.x_i),
             COALESCE(o.lease_expires_at, o.expires_at), o.on_expiry, o.retention_seconds,
             o.horizon_seconds, o.purge_after, idemgate_protected_until(o.state, o.ended_at, o.horizon_seconds),
             false
        FROM unnest(v_dup_i, v_dup_r) WITH ORDINALITY AS u(x_i, x_r, x_n)
        JOIN unnest(v_dup_o) WITH ORDINALITY AS o ON o.ordinality = u.x_n;
    -- Counted in this connection's own counter row, as idemgate_acquire does: one row
    -- per holder, however many of its duplicates the batch held.
    INSERT INTO operation_counters AS c (operation_id, shard, duplicate_attempts, conflict_attempts)
    SELECT o.id, pg_backend_pid(), count(*) FILTER (WHERE u.x_r = 'duplicate'),
           count(*) FILTER (WHERE u.x_r = 'conflict')
      FROM unnest(v_dup_i, v_dup_r) WITH ORDINALITY AS u(x_i, x_r, x_n)
      JOIN unnest(v_dup_o) WITH ORDINALITY AS o ON o.ordinality = u.x_n
     GROUP BY o.id
    ON CONFLICT (operation_id, shard) DO UPDATE
       SET duplicate_attempts = c.duplicate_attempts + excluded.duplicate_attempts,
           conflict_attempts = c.conflict_attempts + excluded.conflict_attempts;
    v_first := v_first || v_dup_i;
  END IF;

  FOR i IN 1 .. coalesce(array_length(p_keys, 1), 0) LOOP
    CONTINUE WHEN i = ANY(v_first);
    RETURN QUERY
      SELECT i, f.* FROM idemgate_acquire(p_tenant_ids[i], p_keys[i], p_ttl_seconds[i],
        p_operation_names[i], p_fingerprints[i], p_correlation_ids[i], p_metadata[i]::json,
        p_attempt_ids[i], p_callers[i], p_operation_ids[i], p_owner_token_hashes[i],
        p_api_key_ids[i], p_lease_seconds[i], p_on_expiry[i], p_retention_seconds[i],
        p_horizon_seconds[i]) f;
  END LOOP;
END
$$;

-- The signature revision 2 called, for an instance of that revision during a rolling upgrade
-- (see idemgate_acquire's). Drop it once no revision-2 instance can run.
CREATE OR REPLACE FUNCTION idemgate_acquire_batch(
  p_tenant_ids bigint[], p_keys text[], p_ttl_seconds integer[], p_operation_names text[],
  p_fingerprints text[], p_correlation_ids text[], p_metadata text[], p_attempt_ids text[],
  p_callers text[], p_operation_ids uuid[], p_owner_token_hashes text[], p_api_key_ids bigint[],
  p_lease_seconds integer[], p_on_expiry text[], p_lock_timeout text DEFAULT NULL)
RETURNS TABLE (
  ord integer, result text, readmitted boolean, db_now timestamptz,
  prev_id uuid, prev_state text, prev_fencing_token bigint, prev_outcome_status text,
  prev_outcome_receipt text,
  op_id uuid, op_key text, op_operation_name text, op_fingerprint text, op_correlation_id text,
  op_metadata json, op_state text, op_state_reason text, op_fencing_token bigint,
  op_acquired_at timestamptz, op_expires_at timestamptz, op_outcome_status text,
  op_outcome_receipt text, op_outcome_response json, op_outcome_note text, op_outcome_by text,
  op_outcome_at timestamptz, op_released_at timestamptz, op_release_reason text,
  op_duplicate_attempts bigint, op_conflict_attempts bigint,
  op_lease_expires_at timestamptz, op_on_expiry text)
LANGUAGE sql VOLATILE AS $$
  SELECT f.ord, f.result, f.readmitted, f.db_now, f.prev_id, f.prev_state, f.prev_fencing_token,
         f.prev_outcome_status, f.prev_outcome_receipt, f.op_id, f.op_key, f.op_operation_name,
         f.op_fingerprint, f.op_correlation_id, f.op_metadata, f.op_state, f.op_state_reason,
         f.op_fencing_token, f.op_acquired_at, f.op_expires_at, f.op_outcome_status,
         f.op_outcome_receipt, f.op_outcome_response, f.op_outcome_note, f.op_outcome_by,
         f.op_outcome_at, f.op_released_at, f.op_release_reason, f.op_duplicate_attempts,
         f.op_conflict_attempts, f.op_lease_expires_at, f.op_on_expiry
    FROM idemgate_acquire_batch(p_tenant_ids, p_keys, p_ttl_seconds, p_operation_names, p_fingerprints,
                                p_correlation_ids, p_metadata, p_attempt_ids, p_callers, p_operation_ids,
                                p_owner_token_hashes, p_api_key_ids, p_lease_seconds, p_on_expiry,
                                array_fill(NULL::bigint, ARRAY[cardinality(p_keys)]),
                                array_fill(NULL::bigint, ARRAY[cardinality(p_keys)]), p_lock_timeout) f
$$;
