-- +goose Up
-- Retry storms without a lock. A duplicate (or conflicting) acquire used to lock the holder's
-- operation row to bump duplicate_attempts (and to re-check the hold under the lock), so a storm
-- on one key queued every duplicate on that one row, held pool connections while it waited, and
-- slowed every other tenant. Now a duplicate reads the hold in one snapshot, locks nothing, and
-- counts itself in operation_counters, in a row of its own connection: shard is the backend pid,
-- and a backend runs one transaction at a time, so no two transactions ever wait on one counter
-- row (also behind a transaction-mode pooler: a server connection is still one backend). An
-- operation's counters are its two columns (counts written before this migration, and SQLite's
-- way) plus the sum of its counter rows; reads add them up (services.addCounters). There is no
-- foreign key on purpose: its KEY SHARE lock on the hot operation row would turn a storm into a
-- MultiXact storm. The reaper deletes an operation's counter rows with it.
--
-- idemgate_acquire keeps its 12-argument signature, so instances of the previous release call
-- the new body too; until they are replaced, their reads show counters without the counter rows
-- (an under-count of duplicates and conflicts during the rolling upgrade; the attempt log, which
-- the audit reads, stays exact).
CREATE TABLE operation_counters (
  operation_id       uuid   NOT NULL,
  shard              bigint NOT NULL,
  duplicate_attempts bigint NOT NULL DEFAULT 0,
  conflict_attempts  bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (operation_id, shard)
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemgate_acquire(
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idemgate_acquire(
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
        -- Held. Lock the holder's operation row (the counter update below) and re-check that it
        -- was not released meanwhile: without the lock, a release committing between our read
        -- of the key and our read of the operation let us answer "duplicate" about an operation
        -- that no longer held the key (found by the history checker in e2e/history/). Holding the
        -- operation row, a concurrent release (key row, then operation row) waits for us, and we
        -- never lock the key row here, so the two cannot deadlock.
        SELECT * INTO v_h FROM operations o WHERE o.id = v_k.holder_operation_id;
        IF v_h.operation_name IS NOT DISTINCT FROM p_operation_name
           AND v_h.fingerprint IS NOT DISTINCT FROM p_fingerprint THEN
          IF p_attempt_id IS NOT NULL AND v_h.attempt_id = p_attempt_id
             AND v_h.api_key_id = p_api_key_id AND v_h.state = 'in_progress' THEN
            -- A retry of the call that created the hold, by the API key that made it, while
            -- the effect may still be running: hand out a fresh owner token. Anyone else's
            -- attempt_id counts as absent (every key of the tenant can read it from the attempt
            -- log), and once the operation has an outcome a 201 would tell the caller to run
            -- the effect again. The UPDATE re-checks the state on the row it locks, since an
            -- outcome may have committed since our read; then it is a duplicate after all.
            UPDATE operations o SET owner_token_hash = p_owner_token_hash
             WHERE o.id = v_h.id AND o.state = 'in_progress';
            IF FOUND THEN
              v_result := 'admitted';
              v_readmit := true;
            END IF;
          END IF;
          IF v_result IS NULL THEN
            UPDATE operations o SET duplicate_attempts = o.duplicate_attempts + 1
             WHERE o.id = v_h.id AND o.state <> 'released';
            v_result := 'duplicate';
          END IF;
        ELSE
          UPDATE operations o SET conflict_attempts = o.conflict_attempts + 1
           WHERE o.id = v_h.id AND o.state <> 'released';
          v_result := 'conflict';
        END IF;
        IF NOT FOUND THEN
          -- Released between our reads, so the key is free now. Deciding again here would lock
          -- the key row after the operation row (PostgreSQL keeps the row lock it took to
          -- re-check our UPDATE), the reverse of release's order, and could deadlock; the
          -- caller re-runs the whole statement instead (services/admission.go).
          RAISE EXCEPTION 'idemgate: hold released during acquire; retry'
            USING ERRCODE = 'serialization_failure';
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

  RETURN QUERY
    SELECT v_result, v_readmit, v_now, v_prev.id, v_prev.state, v_prev.fencing_token,
           v_prev.outcome_status, v_prev.outcome_receipt, o.id, o.key, o.operation_name, o.fingerprint, o.correlation_id,
           o.metadata, o.state, o.state_reason, o.fencing_token, o.acquired_at, o.expires_at,
           o.outcome_status, o.outcome_receipt, o.outcome_response, o.outcome_note, o.outcome_by,
           o.outcome_at, o.released_at, o.release_reason, o.duplicate_attempts, o.conflict_attempts
      FROM operations o WHERE o.id = v_op;
END
$$;
-- +goose StatementEnd
DROP TABLE operation_counters;
