-- The webhook outbox (docs/reference.md §10 "Webhooks"): operation.uncertain and
-- operation.reconciled events, one webhook_events row per live endpoint of the tenant that
-- subscribes, written in the transaction of the state change, so an event exists exactly when
-- its change committed.

-- operation.uncertain (any path: the reaper, a takeover inside idemgate_acquire, the owner's
-- "uncertain" outcome) and operation.reconciled (uncertain -> succeeded, failed or released).
-- A trigger rather than Go code so that no path, SQL function or Go, can change the state
-- without its event. The WHEN clause keeps every other state change (the hot path's release
-- and outcomes) from calling the function at all.
CREATE OR REPLACE FUNCTION idemgate_webhook_state_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  v_type text;
  v_now  timestamptz := clock_timestamp();
BEGIN
  IF NEW.state = 'uncertain' THEN
    v_type := 'operation.uncertain';
  ELSIF NEW.state IN ('succeeded', 'failed', 'released') THEN
    v_type := 'operation.reconciled';
  ELSE
    RETURN NULL;
  END IF;
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, next_attempt_at)
  SELECT 'msg_' || gen_random_uuid(), NEW.tenant_id, w.id, v_type, NEW.id, v_now, NEW.key,
         NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token, NEW.outcome_status,
         NEW.outcome_receipt, v_now
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE ('%,' || v_type || ',%');
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER operations_webhook_state AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND (NEW.state = 'uncertain' OR OLD.state = 'uncertain'))
  EXECUTE FUNCTION idemgate_webhook_state_changed();
