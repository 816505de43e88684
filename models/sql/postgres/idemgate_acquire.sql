-- idemgate_acquire is the whole admission decision of docs/reference.md §4 "POST /v1/acquire" in
-- one round trip, for a key that may exist (a new key is admitted by acquireSQL in
-- services/store_postgres.go, which calls this function only when its INSERT finds the key).
-- It is a PL/pgSQL function rather than one data-modifying CTE because a CTE runs on a single
-- snapshot: when two acquires race for a free key, the loser's INSERT … ON CONFLICT waits for
-- the winner, but the loser's own SELECTs cannot see the winner's hold or operation, so it could
-- not answer "duplicate" or "conflict" without a second round trip. Each statement in a PL/pgSQL
-- function takes a fresh snapshot (READ COMMITTED), so after waiting it sees the winner.
--
-- Expiry is judged by clock_timestamp() of the database, never by a server's clock, and read
-- after any lock wait, so a hold that expires while we wait is seen as expired.
--
-- result is 'admitted', 'duplicate' or 'conflict'; readmitted is true when an attempt_id retry
-- got its own operation back. op_* describe the operation the caller is answered about (the new
-- one when admitted, the holder otherwise); prev_* the generation an admission is warned about,
-- if any (below). The rules are services/rules.go's; TestAdmissionRulesAgree holds the two to
-- one table.
--
-- A duplicate or conflict locks nothing: it reads the hold in one snapshot and counts itself in
-- operation_counters, in a row of its own backend, so a retry storm on one key never queues on
-- the holder's row.

CREATE OR REPLACE FUNCTION idemgate_acquire(
  p_tenant_id bigint, p_key text, p_ttl_seconds integer, p_operation_name text,
  p_fingerprint text, p_correlation_id text, p_metadata json, p_attempt_id text,
  p_caller text, p_operation_id uuid, p_owner_token_hash text, p_api_key_id bigint,
  p_lease_seconds integer, p_on_expiry text, p_retention_seconds bigint, p_horizon_seconds bigint)
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
  op_lease_expires_at timestamptz, op_on_expiry text, op_retention_seconds bigint,
  op_horizon_seconds bigint, op_purge_after timestamptz, op_protected_until timestamptz,
  op_evidence_purged boolean)
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
  v_tomb    boolean := false;
BEGIN
  -- A new key is never decided here: acquireSQL (services/store_postgres.go) and the first
  -- step of idemgate_acquire_batch insert it, and call this function only when their INSERT
  -- found the key row, committed. Should the row be gone (a statement run by hand, say), the
  -- caller's retry of the whole statement inserts it.
  LOOP
    SELECT * INTO v_k FROM idem_keys k WHERE k.tenant_id = p_tenant_id AND k.key = p_key;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'idemgate: key row missing during acquire; retry'
        USING ERRCODE = 'serialization_failure';
    END IF;
    v_now := clock_timestamp();
    IF v_k.holder_operation_id IS NOT NULL AND v_k.expires_at > v_now THEN
      -- Held: the holder and its hold read in one statement, so in one snapshot, unlocked
      -- (a retry storm must not queue on the holder's row; see operation_counters).
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
      IF idemgate_same_request(v_h.operation_name, v_h.fingerprint, p_operation_name, p_fingerprint) THEN
        IF p_attempt_id IS NOT NULL AND v_h.attempt_id = p_attempt_id
           AND v_h.api_key_id = p_api_key_id AND v_h.state = 'in_progress' THEN
          -- The creating API key's retry while the effect may still run (services/rules.go).
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

    IF v_k.protected_until > v_now AND v_k.protected_by IS NOT NULL THEN
      -- docs/reference.md §2 "Lifecycle": a success keeps its key until its horizon ends,
      -- whether or not it is the key's newest operation. Answered about it while its evidence
      -- is kept; once purged, by its tombstone: a duplicate of it, or a conflict for another
      -- request, nothing counted (its counters went with it), the attempt naming it.
      SELECT * INTO v_h FROM operations o WHERE o.id = v_k.protected_by;
      IF NOT FOUND THEN
        v_tomb := true;
        v_result := CASE WHEN v_k.tomb_request_hash = idemgate_request_hash(p_operation_name, p_fingerprint)
                         THEN 'duplicate' ELSE 'conflict' END;
        v_h.id := v_k.protected_by;
        v_h.key := p_key;
        v_h.state := COALESCE(v_k.tomb_state, 'succeeded');
        v_h.fencing_token := COALESCE(v_k.tomb_fencing_token, v_k.fencing_token);
        v_h.acquired_at := v_k.acquired_at;
        v_h.expires_at := v_k.protected_until;
        v_h.outcome_status := v_k.tomb_outcome_status;
        v_h.outcome_receipt := v_k.tomb_outcome_receipt;
        v_h.on_expiry := 'readmit';
        v_h.duplicate_attempts := 0;
        v_h.conflict_attempts := 0;
        v_op := v_k.protected_by;
        EXIT;
      END IF;
      v_result := CASE WHEN idemgate_same_request(v_h.operation_name, v_h.fingerprint, p_operation_name, p_fingerprint)
                       THEN 'duplicate' ELSE 'conflict' END;
      INSERT INTO operation_counters AS c (operation_id, shard, duplicate_attempts, conflict_attempts)
      VALUES (v_h.id, pg_backend_pid(), (v_result = 'duplicate')::int, (v_result = 'conflict')::int)
      ON CONFLICT (operation_id, shard) DO UPDATE
         SET duplicate_attempts = c.duplicate_attempts + excluded.duplicate_attempts,
             conflict_attempts = c.conflict_attempts + excluded.conflict_attempts;
      v_op := v_h.id;
      EXIT;
    END IF;

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
      IF idemgate_same_request(v_h.operation_name, v_h.fingerprint, p_operation_name, p_fingerprint) THEN
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
    END IF;
    -- docs/reference.md §4 previous_operation: the newest earlier generation whose effect may
    -- have happened (succeeded or uncertain, as now: the holder just made uncertain included).
    -- Not simply the key's last operation: after an uncertain generation, a later one that was
    -- released or failed did nothing, and naming it would drop the warning about the one still
    -- in doubt (issue 32). Along operations_effect, one index probe however many released
    -- generations the key has had.
    SELECT * INTO v_prev FROM operations o
     WHERE o.key_id = v_k.id AND o.fencing_token <= v_k.fencing_token
       AND idemgate_may_duplicate_effect(o.state)
     ORDER BY o.fencing_token DESC LIMIT 1;

    UPDATE idem_keys k
       SET fencing_token = v_k.fencing_token + 1, holder_operation_id = p_operation_id,
           expires_at = v_now + make_interval(secs => p_ttl_seconds),
           last_operation_id = p_operation_id, acquired_at = v_now, protected_until = NULL,
           protected_by = NULL, tomb_fencing_token = NULL, tomb_state = NULL,
           tomb_outcome_status = NULL, tomb_outcome_receipt = NULL, tomb_request_hash = NULL
     WHERE k.id = v_k.id;
    INSERT INTO operations (id, key_id, tenant_id, key, operation_name, fingerprint, correlation_id,
                            attempt_id, api_key_id, metadata, state, fencing_token,
                            owner_token_hash, acquired_at, expires_at, lease_expires_at, on_expiry,
                            retention_seconds, horizon_seconds)
    VALUES (p_operation_id, v_k.id, p_tenant_id, p_key, p_operation_name, p_fingerprint,
            p_correlation_id, p_attempt_id, p_api_key_id, p_metadata, 'in_progress',
            v_k.fencing_token + 1, p_owner_token_hash, v_now,
            v_now + make_interval(secs => p_ttl_seconds), v_now + make_interval(secs => v_lease),
            v_policy, p_retention_seconds, p_horizon_seconds);
    v_result := 'admitted';
    v_op := p_operation_id;
    EXIT;
  END LOOP;

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
           COALESCE(v_h.lease_expires_at, v_h.expires_at), v_h.on_expiry, v_h.retention_seconds,
           v_h.horizon_seconds, v_h.purge_after,
           CASE WHEN v_tomb THEN v_k.protected_until
                ELSE idemgate_protected_until(v_h.state, v_h.ended_at, v_h.horizon_seconds) END,
           v_tomb
      FROM (SELECT SUM(duplicate_attempts)::bigint AS d, SUM(conflict_attempts)::bigint AS c
              FROM operation_counters WHERE operation_id = v_op) c;
END
$$;

-- The signature revision 2 called (14 arguments, 31 columns), for an instance of that revision
-- during a rolling upgrade: its operations are admitted without a retention (kept for
-- IDEMGATE_RETENTION) or horizon, as before. Drop it once no revision-2 instance can run.
CREATE OR REPLACE FUNCTION idemgate_acquire(
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
LANGUAGE sql VOLATILE AS $$
  SELECT f.result, f.readmitted, f.db_now, f.prev_id, f.prev_state, f.prev_fencing_token,
         f.prev_outcome_status, f.prev_outcome_receipt, f.op_id, f.op_key, f.op_operation_name,
         f.op_fingerprint, f.op_correlation_id, f.op_metadata, f.op_state, f.op_state_reason,
         f.op_fencing_token, f.op_acquired_at, f.op_expires_at, f.op_outcome_status,
         f.op_outcome_receipt, f.op_outcome_response, f.op_outcome_note, f.op_outcome_by,
         f.op_outcome_at, f.op_released_at, f.op_release_reason, f.op_duplicate_attempts,
         f.op_conflict_attempts, f.op_lease_expires_at, f.op_on_expiry
    FROM idemgate_acquire(p_tenant_id, p_key, p_ttl_seconds, p_operation_name, p_fingerprint,
                          p_correlation_id, p_metadata, p_attempt_id, p_caller, p_operation_id,
                          p_owner_token_hash, p_api_key_id, p_lease_seconds, p_on_expiry,
                          NULL::bigint, NULL::bigint) f
$$;
