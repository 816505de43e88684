-- +goose Up
-- Operations are keyed by their key row: key_id = idem_keys.id, unique with the fencing token,
-- instead of (tenant_id, key, fencing_token). That unique index took every new key's operation
-- at a random place in a B-tree of (bigint, text, bigint) entries; key ids are handed out in
-- order, so (key_id, fencing_token) entries of new keys go to the right edge of a narrow index,
-- in pages already in memory. Dropping the old index measured +7% acquires/s at 16
-- connections and +11% at 64 (new keys, random names; one database per binary, in turns). The
-- lookups it served (a key's generations, the possible-duplicate checks of the audit and of the
-- operation.possible_duplicate_effect webhook) go through key_id. Key rows are never deleted
-- (the reaper clears a hold, it keeps the row so that fencing tokens keep increasing), so
-- key_id stays valid for as long as the operation exists.
ALTER TABLE operations ADD COLUMN key_id bigint;

-- Every version writes an operation's key row before the operation, so every operation has
-- one; should a database still hold an operation without (written by hand, say), the key row
-- is made here as the reaper leaves a released one: no hold, the newest operation's token.
INSERT INTO idem_keys (tenant_id, key, fencing_token, holder_operation_id, expires_at, last_operation_id, acquired_at)
SELECT DISTINCT ON (o.tenant_id, o.key) o.tenant_id, o.key, o.fencing_token, NULL, NULL, o.id, o.acquired_at
  FROM operations o
 WHERE NOT EXISTS (SELECT 1 FROM idem_keys k WHERE k.tenant_id = o.tenant_id AND k.key = o.key)
 ORDER BY o.tenant_id, o.key, o.fencing_token DESC;
UPDATE operations o SET key_id = k.id FROM idem_keys k WHERE k.tenant_id = o.tenant_id AND k.key = o.key;
ALTER TABLE operations ALTER COLUMN key_id SET NOT NULL;
ALTER TABLE operations ADD CONSTRAINT operations_key_generation UNIQUE (key_id, fencing_token);
ALTER TABLE operations DROP CONSTRAINT operations_tenant_id_key_fencing_token_key;

-- An INSERT that does not name key_id gets it from the key row: idemgate_acquire's takeover
-- of an expired or released key (rare; not worth another copy of that function), and an
-- instance of the previous release still running during a rolling upgrade. The new-key paths,
-- the hot ones, name it (acquireSQL in services/store_postgres.go, idemgate_acquire_batch
-- below), and the WHEN clause keeps the function from being called for them. No key row
-- leaves key_id NULL, and the NOT NULL constraint refuses the operation.
-- +goose StatementBegin
CREATE FUNCTION idemgate_operation_key_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  SELECT k.id INTO NEW.key_id FROM idem_keys k WHERE k.tenant_id = NEW.tenant_id AND k.key = NEW.key;
  RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER operations_key_id BEFORE INSERT ON operations
  FOR EACH ROW WHEN (NEW.key_id IS NULL)
  EXECUTE FUNCTION idemgate_operation_key_id();

-- operation.possible_duplicate_effect (00010): the previous generation found by key_id.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemgate_webhook_admitted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  v_prev operations%ROWTYPE;
  v_now  timestamptz := clock_timestamp();
BEGIN
  IF NOT EXISTS (SELECT 1 FROM webhook_endpoints w
                  WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
                    AND (',' || w.events || ',') LIKE '%,operation.possible_duplicate_effect,%') THEN
    RETURN NULL;
  END IF;
  SELECT * INTO v_prev FROM operations o
   WHERE o.key_id = NEW.key_id AND o.fencing_token = NEW.fencing_token - 1;
  IF NOT FOUND OR v_prev.state NOT IN ('succeeded', 'uncertain') THEN
    RETURN NULL;
  END IF;
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, previous_operation_id,
                              previous_state, next_attempt_at)
  SELECT 'msg_' || gen_random_uuid(), NEW.tenant_id, w.id, 'operation.possible_duplicate_effect', NEW.id,
         v_now, NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt, v_prev.id, v_prev.state, v_now
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.possible_duplicate_effect,%';
  RETURN NULL;
END $$;
-- +goose StatementEnd

-- idemgate_acquire_batch (00012) naming each new key's operation's key_id, from the key row
-- the same statement inserts. Otherwise unchanged.
-- +goose StatementBegin
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
                            owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry)
    SELECT p_operation_ids[u.x_i], u.x_key_id, p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
           p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_attempt_ids[u.x_i], p_api_key_ids[u.x_i],
           p_metadata[u.x_i]::json, 'in_progress', 1, p_owner_token_hashes[u.x_i], v_now,
           v_now + make_interval(secs => p_ttl_seconds[u.x_i]),
           v_now + make_interval(secs => COALESCE(p_lease_seconds[u.x_i], p_ttl_seconds[u.x_i])),
           COALESCE(p_on_expiry[u.x_i], 'readmit')
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
             COALESCE(p_on_expiry[u.x_i], 'readmit')
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
  -- kept as they grow (see 00007). The join that follows is between arrays only.
  v_now := clock_timestamp();
  FOR v_tenant, v_key IN
    SELECT DISTINCT p_tenant_ids[s.x_i], p_keys[s.x_i] FROM generate_subscripts(p_keys, 1) AS s(x_i)
     WHERE NOT (s.x_i = ANY (v_first))
  LOOP
    SELECT o.* INTO v_h FROM idem_keys k JOIN operations o ON o.id = k.holder_operation_id
     WHERE k.tenant_id = v_tenant AND k.key = v_key AND k.expires_at > v_now
       -- A holder whose lease lapsed without an outcome is left to idemgate_acquire, which
       -- makes it uncertain first (00009).
       AND NOT (o.state = 'in_progress' AND COALESCE(o.lease_expires_at, o.expires_at) <= v_now);
    IF FOUND THEN
      -- The holder's counters so far: its columns plus its counter rows (00005).
      SELECT v_h.duplicate_attempts + COALESCE(SUM(c.duplicate_attempts), 0),
             v_h.conflict_attempts + COALESCE(SUM(c.conflict_attempts), 0)
        INTO v_h.duplicate_attempts, v_h.conflict_attempts
        FROM operation_counters c WHERE c.operation_id = v_h.id;
      v_holders := v_holders || v_h;
    END IF;
  END LOOP;
  SELECT array_agg(r.x_i ORDER BY r.x_i),
         array_agg(CASE WHEN o.operation_name IS NOT DISTINCT FROM p_operation_names[r.x_i]
                         AND o.fingerprint IS NOT DISTINCT FROM p_fingerprints[r.x_i]
                        THEN 'duplicate' ELSE 'conflict' END ORDER BY r.x_i),
         array_agg(o ORDER BY r.x_i)
    INTO v_dup_i, v_dup_r, v_dup_o
    FROM generate_subscripts(p_keys, 1) AS r(x_i)
    JOIN unnest(v_holders) AS o ON o.tenant_id = p_tenant_ids[r.x_i] AND o.key = p_keys[r.x_i]
   WHERE NOT (r.x_i = ANY (v_first))
     AND NOT (p_attempt_ids[r.x_i] IS NOT NULL AND o.attempt_id = p_attempt_ids[r.x_i]
              AND o.api_key_id = p_api_key_ids[r.x_i] AND o.state = 'in_progress'
              AND o.operation_name IS NOT DISTINCT FROM p_operation_names[r.x_i]
              AND o.fingerprint IS NOT DISTINCT FROM p_fingerprints[r.x_i]);
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
             COALESCE(o.lease_expires_at, o.expires_at), o.on_expiry
        FROM unnest(v_dup_i, v_dup_r) WITH ORDINALITY AS u(x_i, x_r, x_n)
        JOIN unnest(v_dup_o) WITH ORDINALITY AS o ON o.ordinality = u.x_n;
    -- Counted in this connection's own counter row, as idemgate_acquire does (00005): one row
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
        p_api_key_ids[i], p_lease_seconds[i], p_on_expiry[i]) f;
  END LOOP;
END
$$;
-- +goose StatementEnd


-- +goose Down
-- The previous schema: the old unique constraint back before anything that relies on key_id
-- goes, 00012's batch function and 00010's webhook function, then the column.
ALTER TABLE operations ADD CONSTRAINT operations_tenant_id_key_fencing_token_key UNIQUE (tenant_id, key, fencing_token);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemgate_webhook_admitted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  v_prev operations%ROWTYPE;
  v_now  timestamptz := clock_timestamp();
BEGIN
  IF NOT EXISTS (SELECT 1 FROM webhook_endpoints w
                  WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
                    AND (',' || w.events || ',') LIKE '%,operation.possible_duplicate_effect,%') THEN
    RETURN NULL;
  END IF;
  SELECT * INTO v_prev FROM operations o
   WHERE o.tenant_id = NEW.tenant_id AND o.key = NEW.key AND o.fencing_token = NEW.fencing_token - 1;
  IF NOT FOUND OR v_prev.state NOT IN ('succeeded', 'uncertain') THEN
    RETURN NULL;
  END IF;
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, previous_operation_id,
                              previous_state, next_attempt_at)
  SELECT 'msg_' || gen_random_uuid(), NEW.tenant_id, w.id, 'operation.possible_duplicate_effect', NEW.id,
         v_now, NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt, v_prev.id, v_prev.state, v_now
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.possible_duplicate_effect,%';
  RETURN NULL;
END $$;
-- +goose StatementEnd

-- +goose StatementBegin
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
    RETURNING k.holder_operation_id AS x_op
  ), u AS (
    SELECT f.x_i FROM f JOIN ins ON ins.x_op = p_operation_ids[f.x_i]
  ), o AS (
    INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                            attempt_id, api_key_id, metadata, state, fencing_token,
                            owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry)
    SELECT p_operation_ids[u.x_i], p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
           p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_attempt_ids[u.x_i], p_api_key_ids[u.x_i],
           p_metadata[u.x_i]::json, 'in_progress', 1, p_owner_token_hashes[u.x_i], v_now,
           v_now + make_interval(secs => p_ttl_seconds[u.x_i]),
           v_now + make_interval(secs => COALESCE(p_lease_seconds[u.x_i], p_ttl_seconds[u.x_i])),
           COALESCE(p_on_expiry[u.x_i], 'readmit')
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
             COALESCE(p_on_expiry[u.x_i], 'readmit')
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
  -- kept as they grow (see 00007). The join that follows is between arrays only.
  v_now := clock_timestamp();
  FOR v_tenant, v_key IN
    SELECT DISTINCT p_tenant_ids[s.x_i], p_keys[s.x_i] FROM generate_subscripts(p_keys, 1) AS s(x_i)
     WHERE NOT (s.x_i = ANY (v_first))
  LOOP
    SELECT o.* INTO v_h FROM idem_keys k JOIN operations o ON o.id = k.holder_operation_id
     WHERE k.tenant_id = v_tenant AND k.key = v_key AND k.expires_at > v_now
       -- A holder whose lease lapsed without an outcome is left to idemgate_acquire, which
       -- makes it uncertain first (00009).
       AND NOT (o.state = 'in_progress' AND COALESCE(o.lease_expires_at, o.expires_at) <= v_now);
    IF FOUND THEN
      -- The holder's counters so far: its columns plus its counter rows (00005).
      SELECT v_h.duplicate_attempts + COALESCE(SUM(c.duplicate_attempts), 0),
             v_h.conflict_attempts + COALESCE(SUM(c.conflict_attempts), 0)
        INTO v_h.duplicate_attempts, v_h.conflict_attempts
        FROM operation_counters c WHERE c.operation_id = v_h.id;
      v_holders := v_holders || v_h;
    END IF;
  END LOOP;
  SELECT array_agg(r.x_i ORDER BY r.x_i),
         array_agg(CASE WHEN o.operation_name IS NOT DISTINCT FROM p_operation_names[r.x_i]
                         AND o.fingerprint IS NOT DISTINCT FROM p_fingerprints[r.x_i]
                        THEN 'duplicate' ELSE 'conflict' END ORDER BY r.x_i),
         array_agg(o ORDER BY r.x_i)
    INTO v_dup_i, v_dup_r, v_dup_o
    FROM generate_subscripts(p_keys, 1) AS r(x_i)
    JOIN unnest(v_holders) AS o ON o.tenant_id = p_tenant_ids[r.x_i] AND o.key = p_keys[r.x_i]
   WHERE NOT (r.x_i = ANY (v_first))
     AND NOT (p_attempt_ids[r.x_i] IS NOT NULL AND o.attempt_id = p_attempt_ids[r.x_i]
              AND o.api_key_id = p_api_key_ids[r.x_i] AND o.state = 'in_progress'
              AND o.operation_name IS NOT DISTINCT FROM p_operation_names[r.x_i]
              AND o.fingerprint IS NOT DISTINCT FROM p_fingerprints[r.x_i]);
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
             COALESCE(o.lease_expires_at, o.expires_at), o.on_expiry
        FROM unnest(v_dup_i, v_dup_r) WITH ORDINALITY AS u(x_i, x_r, x_n)
        JOIN unnest(v_dup_o) WITH ORDINALITY AS o ON o.ordinality = u.x_n;
    -- Counted in this connection's own counter row, as idemgate_acquire does (00005): one row
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
        p_api_key_ids[i], p_lease_seconds[i], p_on_expiry[i]) f;
  END LOOP;
END
$$;
-- +goose StatementEnd

DROP TRIGGER operations_key_id ON operations;
DROP FUNCTION idemgate_operation_key_id;
ALTER TABLE operations DROP COLUMN key_id;
