-- SQLite twin of ../postgres/operations_reflag_later.sql.
-- SQLite has no functions written in SQL (one registered from Go would break every other tool
-- that opens the file), so the state list of ../postgres/idemgate_rules.sql's
-- idemgate_may_duplicate_effect is written out here; TestDuplicateEffectRule holds it to
-- services/rules.go's duplicateEffectStates.

DROP TRIGGER IF EXISTS operations_reflag_later;
CREATE TRIGGER operations_reflag_later AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (OLD.state IN ('succeeded', 'uncertain')) <> (NEW.state IN ('succeeded', 'uncertain'))
BEGIN
  UPDATE operations SET possible_duplicate_effect = EXISTS (
    SELECT 1 FROM operations e WHERE e.tenant_id = operations.tenant_id AND e.key = operations.key
       AND e.fencing_token < operations.fencing_token AND e.state IN ('succeeded', 'uncertain'))
   WHERE tenant_id = NEW.tenant_id AND key = NEW.key AND fencing_token > NEW.fencing_token;
END;
