-- The webhook outbox's operation.possible_duplicate_effect event: a key admitted again
-- (fencing token > 1) while an earlier generation is succeeded or uncertain, naming the newest
-- such one, the generation acquire's previous_operation names (services/rules.go
-- warnedGeneration; released and failed generations in between did nothing, issue 32). New
-- keys never call the function.

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
   WHERE o.key_id = NEW.key_id AND o.fencing_token < NEW.fencing_token
     AND idemgate_may_duplicate_effect(o.state)
   ORDER BY o.fencing_token DESC LIMIT 1;
  IF NOT FOUND THEN
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

CREATE OR REPLACE TRIGGER operations_webhook_admitted AFTER INSERT ON operations
  FOR EACH ROW WHEN (NEW.fencing_token > 1)
  EXECUTE FUNCTION idemgate_webhook_admitted();
