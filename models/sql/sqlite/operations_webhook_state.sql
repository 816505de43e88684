-- SQLite twin of ../postgres/operations_webhook_state.sql: the outbox's operation.uncertain and
-- operation.reconciled events, written in the transaction of the state change. The msg_id is
-- 'msg_' and a random version 4 UUID, as gen_random_uuid() makes on PostgreSQL.

DROP TRIGGER IF EXISTS operations_webhook_uncertain;
CREATE TRIGGER operations_webhook_uncertain AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN NEW.state = 'uncertain' AND OLD.state <> 'uncertain'
BEGIN
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, next_attempt_at)
  SELECT 'msg_' || lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
         substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
         NEW.tenant_id, w.id, 'operation.uncertain', NEW.id,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00',
         NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.uncertain,%';
END;

DROP TRIGGER IF EXISTS operations_webhook_reconciled;
CREATE TRIGGER operations_webhook_reconciled AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN OLD.state = 'uncertain' AND NEW.state IN ('succeeded', 'failed', 'released')
BEGIN
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, next_attempt_at)
  SELECT 'msg_' || lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
         substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
         NEW.tenant_id, w.id, 'operation.reconciled', NEW.id,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00',
         NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.reconciled,%';
END;
