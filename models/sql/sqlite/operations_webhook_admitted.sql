-- SQLite twin of ../postgres/operations_webhook_admitted.sql: the outbox's
-- operation.possible_duplicate_effect event, naming the newest earlier generation that is
-- succeeded or uncertain (services/rules.go warnedGeneration). Found by (tenant_id, key), as
-- operations_possible_duplicate.sql does: NEW.key_id may not be filled yet.
-- SQLite has no functions written in SQL (one registered from Go would break every other tool
-- that opens the file), so the state list of ../postgres/idemgate_rules.sql's
-- idemgate_may_duplicate_effect is written out here; TestDuplicateEffectRule holds it to
-- services/rules.go's duplicateEffectStates.

DROP TRIGGER IF EXISTS operations_webhook_admitted;
-- Only later generations can have a previous operation, and only a tenant with a live endpoint
-- can want the event: a new key's admission, and any admission of a tenant without webhooks,
-- never runs the body (about 1 µs of CPU per later-generation admission otherwise).
CREATE TRIGGER operations_webhook_admitted AFTER INSERT ON operations
  FOR EACH ROW WHEN NEW.fencing_token > 1 AND EXISTS (SELECT 1 FROM webhook_endpoints w
    WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL)
BEGIN
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, previous_operation_id,
                              previous_state, next_attempt_at)
  SELECT 'msg_' || lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
         substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
         NEW.tenant_id, w.id, 'operation.possible_duplicate_effect', NEW.id,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00',
         NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt, p.id, p.state,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
    FROM webhook_endpoints w
    JOIN operations p ON p.id = (SELECT e.id FROM operations e
                                   WHERE e.tenant_id = NEW.tenant_id AND e.key = NEW.key
                                     AND e.fencing_token < NEW.fencing_token
                                     AND e.state IN ('succeeded', 'uncertain')
                                   ORDER BY e.fencing_token DESC LIMIT 1)
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.possible_duplicate_effect,%';
END;
