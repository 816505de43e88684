-- +goose Up
-- Leases (docs/reference.md §8). An operation's lease (lease_expires_at) is how long its attempt
-- may run without an outcome before it is presumed crashed; expires_at stays the protection
-- window. on_expiry is the policy after the TTL: readmit (as before) or hold_until_reconciled.
-- Both live on the operation row only: the hold (idem_keys) names its operation, and reading
-- the lease from there leaves one copy to fence a renew against. NULL lease_expires_at (rows
-- written before this migration) means a lease equal to the TTL.
ALTER TABLE operations ADD COLUMN lease_expires_at timestamptz;
ALTER TABLE operations ADD COLUMN on_expiry text NOT NULL DEFAULT 'readmit'
  CHECK (on_expiry IN ('readmit', 'hold_until_reconciled'));

-- The reaper's lease pass: in_progress operations whose lease ran out before their TTL.
CREATE INDEX operations_lease ON operations (lease_expires_at) WHERE state = 'in_progress';

-- Waiters (GET /v1/operations/{id}?wait=) learn that an operation left in_progress through
-- NOTIFY on channel idemgate_operation, payload the operation id. A trigger sends it, so every
-- path that records an outcome, releases or makes an operation uncertain (API, dashboard,
-- reaper, takeover inside the acquire functions) notifies, in its own transaction: the
-- notification is delivered only if that commits.
-- +goose StatementBegin
CREATE FUNCTION idemgate_notify_operation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('idemgate_operation', NEW.id::text);
  RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER operations_notify AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (OLD.state = 'in_progress' AND NEW.state <> 'in_progress')
  EXECUTE FUNCTION idemgate_notify_operation();

-- The acquire functions take each item's lease_seconds and on_expiry and return the operation's
-- lease and policy. New signatures, so the old ones are dropped (the batch one first: it calls
-- the single one).
DROP FUNCTION idemgate_acquire_batch(bigint[], text[], integer[], text[], text[], text[], text[], text[],
  text[], uuid[], text[], bigint[], text);
DROP FUNCTION idemgate_acquire(bigint, text, integer, text, text, text, json, text, text, uuid, text, bigint);

-- +goose StatementBegin
CREATE FUNCTION idemgate_acquire(
  p_tenant_id bigint, p_key text, p_ttl_seconds integer, p_operation_name text,
  p_fingerprint text, p_correlation_id text, p_metadata json, p_attempt_id text,
  p_caller text, p_operation_id uuid, p_owner_token_hash text, p_api_key_id bigint,
  p_lease_seconds integer, p_on_expiry text)
RETURNS TABLE (
  result text, readmitted boolean, db_now timestamptz,
  prev_id uuid, prev_state text, prev_fencing_token bigint, prev_outcome_status text,
  prev_outcome_receipt text,
  op_id uuid, op_key text, op_operation_name text, op_fingerprint text, op_correlation_id text,
  op_metadata json, op_state text, op_state_reason text, op_fencing_token bigint,
  op_acquired_at timestamptz, op_expires_at timestamptz, op_outcome_status text,
  op_outcome_receipt text, op_outcome_response json, op_outcome_note text, op_outcome_by text,
  op_outcome_at timestamptz, op_released_at timestamptz, op_release_reason text,
  op_duplicate_attempts bigint, op_conflict_attempts bigint,
  op_lease_expires_at timestamptz, op_on_expiry text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now     timestamptz;
  v_k       idem_keys%ROWTYPE;
  v_h       operations%ROWTYPE;
  v_prev    operations%ROWTYPE;
  v_result  text;
  v_readmit boolean := false;
  v_op      uuid;
  v_lease   integer := COALESCE(p_lease_seconds, p_ttl_seconds);
  v_policy  text := COALESCE(p_on_expiry, 'readmit');
BEGIN
  v_now := clock_timestamp();
  INSERT INTO idem_keys AS k (tenant_id, key, fencing_token, holder_operation_id, expires_at,
                              last_operation_id, acquired_at)
  VALUES (p_tenant_id, p_key, 1, p_operation_id, v_now + make_interval(secs => p_ttl_seconds),
          p_operation_id, v_now)
  ON CONFLICT (tenant_id, key) DO NOTHING;

  IF FOUND THEN
    INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                            attempt_id, api_key_id, metadata, state, fencing_token,
                            owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry)
    VALUES (p_operation_id, p_tenant_id, p_key, p_operation_name, p_fingerprint, p_correlation_id,
            p_attempt_id, p_api_key_id, p_metadata, 'in_progress', 1, p_owner_token_hash,
            v_now, v_now + make_interval(secs => p_ttl_seconds), v_now + make_interval(secs => v_lease),
            v_policy);
    v_result := 'admitted';
    v_op := p_operation_id;
  ELSE
    LOOP
      SELECT * INTO v_k FROM idem_keys k WHERE k.tenant_id = p_tenant_id AND k.key = p_key;
      v_now := clock_timestamp();
      IF v_k.holder_operation_id IS NOT NULL AND v_k.expires_at > v_now THEN
        -- Held: the holder and its hold read in one statement, so in one snapshot, unlocked
        -- (see 00005).
        SELECT o.* INTO v_h FROM operations o
         WHERE o.id = v_k.holder_operation_id
           AND EXISTS (SELECT 1 FROM idem_keys k WHERE k.id = v_k.id
                          AND k.holder_operation_id = v_k.holder_operation_id AND k.expires_at > v_now);
        IF NOT FOUND THEN
          CONTINUE;
        END IF;
        IF v_h.state = 'in_progress' AND COALESCE(v_h.lease_expires_at, v_h.expires_at) <= v_now THEN
          -- docs/reference.md §8: the holder's lease lapsed without an outcome. It becomes
          -- uncertain now, in this transaction; the key stays protected until its TTL. The
          -- UPDATE re-checks state and lease on the row it locks (an outcome committed
          -- meanwhile wins): if either changed, look again.
          UPDATE operations o SET state = 'uncertain', state_reason = 'lease_expired_without_outcome'
           WHERE o.id = v_h.id AND o.state = 'in_progress'
             AND COALESCE(o.lease_expires_at, o.expires_at) <= v_now
          RETURNING o.* INTO v_h;
          IF NOT FOUND THEN
            CONTINUE;
          END IF;
          INSERT INTO events (operation_id, tenant_id, kind, actor, detail, created_at)
          VALUES (v_h.id, p_tenant_id, 'state_changed', 'system',
                  'in_progress -> uncertain: lease_expired_without_outcome', v_now);
        END IF;
        IF v_h.operation_name IS NOT DISTINCT FROM p_operation_name
           AND v_h.fingerprint IS NOT DISTINCT FROM p_fingerprint THEN
          IF p_attempt_id IS NOT NULL AND v_h.attempt_id = p_attempt_id
             AND v_h.api_key_id = p_api_key_id AND v_h.state = 'in_progress' THEN
            -- The creating API key's retry while the effect may still run (see 00003).
            UPDATE operations o SET owner_token_hash = p_owner_token_hash
             WHERE o.id = v_h.id AND o.state = 'in_progress'
               AND EXISTS (SELECT 1 FROM idem_keys k WHERE k.id = v_k.id
                              AND k.holder_operation_id = v_h.id AND k.expires_at > v_now)
            RETURNING o.* INTO v_h;
            IF NOT FOUND THEN
              CONTINUE;
            END IF;
            v_result := 'admitted';
            v_readmit := true;
          ELSE
            v_result := 'duplicate';
          END IF;
        ELSE
          v_result := 'conflict';
        END IF;
        IF v_result <> 'admitted' THEN
          INSERT INTO operation_counters AS c (operation_id, shard, duplicate_attempts, conflict_attempts)
          VALUES (v_h.id, pg_backend_pid(), (v_result = 'duplicate')::int, (v_result = 'conflict')::int)
          ON CONFLICT (operation_id, shard) DO UPDATE
             SET duplicate_attempts = c.duplicate_attempts + excluded.duplicate_attempts,
                 conflict_attempts = c.conflict_attempts + excluded.conflict_attempts;
        END IF;
        v_op := v_h.id;
        EXIT;
      END IF;
      -- Free or expired: lock the key row and look again.
      SELECT * INTO v_k FROM idem_keys k WHERE k.id = v_k.id FOR UPDATE;
      v_now := clock_timestamp();
      CONTINUE WHEN v_k.holder_operation_id IS NOT NULL AND v_k.expires_at > v_now;

      SELECT * INTO v_prev FROM operations o WHERE o.id = v_k.last_operation_id;
      IF FOUND AND v_prev.on_expiry = 'hold_until_reconciled'
         AND v_prev.state IN ('in_progress', 'uncertain', 'succeeded') THEN
        -- docs/reference.md §8: the newest operation holds its key until it is reconciled,
        -- whatever the TTL. Not admitted: answered about that operation (uncertain: 409
        -- outcome_uncertain; succeeded: a duplicate with its outcome).
        IF v_prev.state = 'in_progress' THEN
          UPDATE operations o SET state = 'uncertain', state_reason =
                 CASE WHEN o.lease_expires_at < o.expires_at THEN 'lease_expired_without_outcome'
                      ELSE 'ttl_expired_without_outcome' END
           WHERE o.id = v_prev.id AND o.state = 'in_progress'
          RETURNING o.* INTO v_prev;
          IF NOT FOUND THEN
            CONTINUE;
          END IF;
          INSERT INTO events (operation_id, tenant_id, kind, actor, detail, created_at)
          VALUES (v_prev.id, p_tenant_id, 'state_changed', 'system',
                  'in_progress -> uncertain: ' || v_prev.state_reason, v_now);
        END IF;
        v_h := v_prev;
        v_prev := NULL;
        IF v_h.operation_name IS NOT DISTINCT FROM p_operation_name
           AND v_h.fingerprint IS NOT DISTINCT FROM p_fingerprint THEN
          v_result := 'duplicate';
        ELSE
          v_result := 'conflict';
        END IF;
        INSERT INTO operation_counters AS c (operation_id, shard, duplicate_attempts, conflict_attempts)
        VALUES (v_h.id, pg_backend_pid(), (v_result = 'duplicate')::int, (v_result = 'conflict')::int)
        ON CONFLICT (operation_id, shard) DO UPDATE
           SET duplicate_attempts = c.duplicate_attempts + excluded.duplicate_attempts,
               conflict_attempts = c.conflict_attempts + excluded.conflict_attempts;
        v_op := v_h.id;
        EXIT;
      END IF;

      IF v_k.holder_operation_id IS NOT NULL THEN
        -- docs/reference.md §3, §8: an expired in_progress hold becomes uncertain in the same
        -- transaction in which another attempt takes the key over; the reason says whether a
        -- lease shorter than the TTL ran out first.
        UPDATE operations o SET state = 'uncertain', state_reason =
               CASE WHEN o.lease_expires_at < o.expires_at THEN 'lease_expired_without_outcome'
                    ELSE 'ttl_expired_without_outcome' END
         WHERE o.id = v_k.holder_operation_id AND o.state = 'in_progress'
        RETURNING o.* INTO v_h;
        IF FOUND THEN
          INSERT INTO events (operation_id, tenant_id, kind, actor, detail, created_at)
          VALUES (v_k.holder_operation_id, p_tenant_id, 'state_changed', 'system',
                  'in_progress -> uncertain: ' || v_h.state_reason, v_now);
        END IF;
        SELECT * INTO v_prev FROM operations o WHERE o.id = v_k.last_operation_id;
      END IF;

      UPDATE idem_keys k
         SET fencing_token = v_k.fencing_token + 1, holder_operation_id = p_operation_id,
             expires_at = v_now + make_interval(secs => p_ttl_seconds),
             last_operation_id = p_operation_id, acquired_at = v_now
       WHERE k.id = v_k.id;
      INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                              attempt_id, api_key_id, metadata, state, fencing_token,
                              owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry)
      VALUES (p_operation_id, p_tenant_id, p_key, p_operation_name, p_fingerprint,
              p_correlation_id, p_attempt_id, p_api_key_id, p_metadata, 'in_progress',
              v_k.fencing_token + 1, p_owner_token_hash, v_now,
              v_now + make_interval(secs => p_ttl_seconds), v_now + make_interval(secs => v_lease),
              v_policy);
      v_result := 'admitted';
      v_op := p_operation_id;
      EXIT;
    END LOOP;
  END IF;

  INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                        fingerprint, correlation_id, caller, attempted_at)
  VALUES (p_tenant_id, p_key, v_op, v_result, p_attempt_id, p_operation_name, p_fingerprint,
          p_correlation_id, p_caller, v_now);

  IF v_result = 'admitted' AND NOT v_readmit THEN
    SELECT o.* INTO v_h FROM operations o WHERE o.id = v_op;
  END IF;
  RETURN QUERY
    SELECT v_result, v_readmit, v_now, v_prev.id, v_prev.state, v_prev.fencing_token,
           v_prev.outcome_status, v_prev.outcome_receipt, v_h.id, v_h.key, v_h.operation_name,
           v_h.fingerprint, v_h.correlation_id, v_h.metadata, v_h.state, v_h.state_reason,
           v_h.fencing_token, v_h.acquired_at, v_h.expires_at, v_h.outcome_status,
           v_h.outcome_receipt, v_h.outcome_response, v_h.outcome_note, v_h.outcome_by,
           v_h.outcome_at, v_h.released_at, v_h.release_reason,
           v_h.duplicate_attempts + COALESCE(c.d, 0), v_h.conflict_attempts + COALESCE(c.c, 0),
           COALESCE(v_h.lease_expires_at, v_h.expires_at), v_h.on_expiry
      FROM (SELECT SUM(duplicate_attempts)::bigint AS d, SUM(conflict_attempts)::bigint AS c
              FROM operation_counters WHERE operation_id = v_op) c;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin

CREATE FUNCTION idemgate_acquire_batch(
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
LANGUAGE plpgsql VOLATILE AS $$
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
                                owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry)
        SELECT p_operation_ids[u.x_i], p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_names[u.x_i],
               p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_attempt_ids[u.x_i], p_api_key_ids[u.x_i],
               p_metadata[u.x_i]::json, 'in_progress', 1, p_owner_token_hashes[u.x_i], v_now,
               v_now + make_interval(secs => p_ttl_seconds[u.x_i]),
               v_now + make_interval(secs => COALESCE(p_lease_seconds[u.x_i], p_ttl_seconds[u.x_i])),
               COALESCE(p_on_expiry[u.x_i], 'readmit')
          FROM unnest(v_first) AS u(x_i)
        RETURNING *
      )
      SELECT u.x_i, 'admitted'::text, false, v_now, NULL::uuid, NULL::text, NULL::bigint, NULL::text,
             NULL::text, o.id, o.key, o.operation_name, o.fingerprint, o.correlation_id, o.metadata,
             o.state, o.state_reason, o.fencing_token, o.acquired_at, o.expires_at, NULL::text,
             NULL::text, NULL::json, NULL::text, NULL::text, NULL::timestamptz, NULL::timestamptz,
             NULL::text, 0::bigint, 0::bigint, o.lease_expires_at, o.on_expiry
        FROM unnest(v_first) AS u(x_i) JOIN o ON o.id = p_operation_ids[u.x_i];
    INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                          fingerprint, correlation_id, caller, attempted_at)
    SELECT p_tenant_ids[u.x_i], p_keys[u.x_i], p_operation_ids[u.x_i], 'admitted', p_attempt_ids[u.x_i],
           p_operation_names[u.x_i], p_fingerprints[u.x_i], p_correlation_ids[u.x_i], p_callers[u.x_i], v_now
      FROM unnest(v_first) AS u(x_i);
  END IF;
  v_first := coalesce(v_first, '{}');

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
DROP FUNCTION idemgate_acquire_batch(bigint[], text[], integer[], text[], text[], text[], text[], text[],
  text[], uuid[], text[], bigint[], integer[], text[], text);
DROP FUNCTION idemgate_acquire(bigint, text, integer, text, text, text, json, text, text, uuid, text, bigint,
  integer, text);
-- +goose StatementBegin
CREATE FUNCTION idemgate_acquire(
  p_tenant_id bigint, p_key text, p_ttl_seconds integer, p_operation_name text,
  p_fingerprint text, p_correlation_id text, p_metadata json, p_attempt_id text,
  p_caller text, p_operation_id uuid, p_owner_token_hash text, p_api_key_id bigint)
RETURNS TABLE (
  result text, readmitted boolean, db_now timestamptz,
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
  v_now     timestamptz;
  v_k       idem_keys%ROWTYPE;
  v_h       operations%ROWTYPE;
  v_prev    operations%ROWTYPE;
  v_result  text;
  v_readmit boolean := false;
  v_op      uuid;
BEGIN
  v_now := clock_timestamp();
  INSERT INTO idem_keys AS k (tenant_id, key, fencing_token, holder_operation_id, expires_at,
                              last_operation_id, acquired_at)
  VALUES (p_tenant_id, p_key, 1, p_operation_id, v_now + make_interval(secs => p_ttl_seconds),
          p_operation_id, v_now)
  ON CONFLICT (tenant_id, key) DO NOTHING;

  IF FOUND THEN
    INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                            attempt_id, api_key_id, metadata, state, fencing_token,
                            owner_token_hash, acquired_at, expires_at)
    VALUES (p_operation_id, p_tenant_id, p_key, p_operation_name, p_fingerprint, p_correlation_id,
            p_attempt_id, p_api_key_id, p_metadata, 'in_progress', 1, p_owner_token_hash,
            v_now, v_now + make_interval(secs => p_ttl_seconds));
    v_result := 'admitted';
    v_op := p_operation_id;
  ELSE
    LOOP
      SELECT * INTO v_k FROM idem_keys k WHERE k.tenant_id = p_tenant_id AND k.key = p_key;
      v_now := clock_timestamp();
      IF v_k.holder_operation_id IS NOT NULL AND v_k.expires_at > v_now THEN
        -- Held. Read the holder's operation and re-check the hold in ONE statement, so in one
        -- snapshot: the answer to a duplicate is the holder as it was at one instant (a
        -- release committing meanwhile cannot tear it), and reading it takes no lock. Before,
        -- the duplicate locked the holder's row to bump its counter and re-check, and a retry
        -- storm on one key queued on that lock.
        SELECT o.* INTO v_h FROM operations o
         WHERE o.id = v_k.holder_operation_id
           AND EXISTS (SELECT 1 FROM idem_keys k WHERE k.id = v_k.id
                          AND k.holder_operation_id = v_k.holder_operation_id AND k.expires_at > v_now);
        IF NOT FOUND THEN
          -- Released or taken over since the read above: look again.
          CONTINUE;
        END IF;
        IF v_h.operation_name IS NOT DISTINCT FROM p_operation_name
           AND v_h.fingerprint IS NOT DISTINCT FROM p_fingerprint THEN
          IF p_attempt_id IS NOT NULL AND v_h.attempt_id = p_attempt_id
             AND v_h.api_key_id = p_api_key_id AND v_h.state = 'in_progress' THEN
            -- A retry of the call that created the hold, by the API key that made it, while
            -- the effect may still be running: hand out a fresh owner token (see 00003). The
            -- UPDATE re-checks the state and the hold on the row it locks; if either changed,
            -- look again.
            UPDATE operations o SET owner_token_hash = p_owner_token_hash
             WHERE o.id = v_h.id AND o.state = 'in_progress'
               AND EXISTS (SELECT 1 FROM idem_keys k WHERE k.id = v_k.id
                              AND k.holder_operation_id = v_h.id AND k.expires_at > v_now)
            RETURNING o.* INTO v_h;
            IF NOT FOUND THEN
              CONTINUE;
            END IF;
            v_result := 'admitted';
            v_readmit := true;
          ELSE
            v_result := 'duplicate';
          END IF;
        ELSE
          v_result := 'conflict';
        END IF;
        IF v_result <> 'admitted' THEN
          -- Counted in this connection's own counter row (shard = backend pid: a backend runs
          -- one transaction at a time, so no two transactions ever wait on the same row; the
          -- same holds behind a transaction-mode pooler). The operation's counters are its
          -- columns plus the sum of its counter rows.
          INSERT INTO operation_counters AS c (operation_id, shard, duplicate_attempts, conflict_attempts)
          VALUES (v_h.id, pg_backend_pid(), (v_result = 'duplicate')::int, (v_result = 'conflict')::int)
          ON CONFLICT (operation_id, shard) DO UPDATE
             SET duplicate_attempts = c.duplicate_attempts + excluded.duplicate_attempts,
                 conflict_attempts = c.conflict_attempts + excluded.conflict_attempts;
        END IF;
        v_op := v_h.id;
        EXIT;
      END IF;
      -- Free or expired: lock the key row and look again, since a concurrent acquire may have
      -- taken it between our read and the lock.
      SELECT * INTO v_k FROM idem_keys k WHERE k.id = v_k.id FOR UPDATE;
      v_now := clock_timestamp();
      CONTINUE WHEN v_k.holder_operation_id IS NOT NULL AND v_k.expires_at > v_now;

      IF v_k.holder_operation_id IS NOT NULL THEN
        -- docs/reference.md §3: an expired in_progress hold becomes uncertain in the same transaction in
        -- which another attempt takes the key over.
        UPDATE operations o SET state = 'uncertain', state_reason = 'ttl_expired_without_outcome'
         WHERE o.id = v_k.holder_operation_id AND o.state = 'in_progress';
        IF FOUND THEN
          INSERT INTO events (operation_id, tenant_id, kind, actor, detail, created_at)
          VALUES (v_k.holder_operation_id, p_tenant_id, 'state_changed', 'system',
                  'in_progress -> uncertain: ttl_expired_without_outcome', v_now);
        END IF;
      END IF;
      SELECT * INTO v_prev FROM operations o WHERE o.id = v_k.last_operation_id;

      UPDATE idem_keys k
         SET fencing_token = v_k.fencing_token + 1, holder_operation_id = p_operation_id,
             expires_at = v_now + make_interval(secs => p_ttl_seconds),
             last_operation_id = p_operation_id, acquired_at = v_now
       WHERE k.id = v_k.id;
      INSERT INTO operations (id, tenant_id, key, operation_name, fingerprint, correlation_id,
                              attempt_id, api_key_id, metadata, state, fencing_token,
                              owner_token_hash, acquired_at, expires_at)
      VALUES (p_operation_id, p_tenant_id, p_key, p_operation_name, p_fingerprint,
              p_correlation_id, p_attempt_id, p_api_key_id, p_metadata, 'in_progress',
              v_k.fencing_token + 1, p_owner_token_hash, v_now,
              v_now + make_interval(secs => p_ttl_seconds));
      v_result := 'admitted';
      v_op := p_operation_id;
      EXIT;
    END LOOP;
  END IF;

  INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name,
                        fingerprint, correlation_id, caller, attempted_at)
  VALUES (p_tenant_id, p_key, v_op, v_result, p_attempt_id, p_operation_name, p_fingerprint,
          p_correlation_id, p_caller, v_now);

  IF v_result = 'admitted' AND NOT v_readmit THEN
    SELECT o.* INTO v_h FROM operations o WHERE o.id = v_op;
  END IF;
  RETURN QUERY
    SELECT v_result, v_readmit, v_now, v_prev.id, v_prev.state, v_prev.fencing_token,
           v_prev.outcome_status, v_prev.outcome_receipt, v_h.id, v_h.key, v_h.operation_name,
           v_h.fingerprint, v_h.correlation_id, v_h.metadata, v_h.state, v_h.state_reason,
           v_h.fencing_token, v_h.acquired_at, v_h.expires_at, v_h.outcome_status,
           v_h.outcome_receipt, v_h.outcome_response, v_h.outcome_note, v_h.outcome_by,
           v_h.outcome_at, v_h.released_at, v_h.release_reason,
           v_h.duplicate_attempts + COALESCE(c.d, 0), v_h.conflict_attempts + COALESCE(c.c, 0)
      FROM (SELECT SUM(duplicate_attempts)::bigint AS d, SUM(conflict_attempts)::bigint AS c
              FROM operation_counters WHERE operation_id = v_op) c;
END
$$;
-- +goose StatementEnd
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
  v_first := coalesce(v_first, '{}');

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
     WHERE k.tenant_id = v_tenant AND k.key = v_key AND k.expires_at > v_now;
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
               + count(*) FILTER (WHERE u.x_r = 'conflict') OVER (PARTITION BY o.id ORDER BY u.x_i)
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
        p_api_key_ids[i]) f;
  END LOOP;
END
$$;
-- +goose StatementEnd
DROP TRIGGER operations_notify ON operations;
DROP FUNCTION idemgate_notify_operation;
DROP INDEX operations_lease;
ALTER TABLE operations DROP COLUMN on_expiry;
ALTER TABLE operations DROP COLUMN lease_expires_at;
