-- SQLite twin of ../postgres/operations_possible_duplicate.sql. SQLite cannot change NEW in a
-- BEFORE trigger, so the admission's flag is set by an UPDATE after the insert, in the same
-- transaction. The key's generations are found by (tenant_id, key): the UNIQUE (tenant_id,
-- key, fencing_token) serves it, and it does not depend on which AFTER INSERT trigger
-- (this one or operations_key_id) runs first.
-- SQLite has no functions written in SQL (one registered from Go would break every other tool
-- that opens the file), so the state list of ../postgres/idemgate_rules.sql's
-- idemgate_may_duplicate_effect is written out here; TestDuplicateEffectRule holds it to
-- services/rules.go's duplicateEffectStates.

DROP TRIGGER IF EXISTS operations_possible_duplicate;
CREATE TRIGGER operations_possible_duplicate AFTER INSERT ON operations
  FOR EACH ROW WHEN NEW.fencing_token > 1
BEGIN
  UPDATE operations SET possible_duplicate_effect = EXISTS (
    SELECT 1 FROM operations e WHERE e.tenant_id = NEW.tenant_id AND e.key = NEW.key
       AND e.fencing_token < NEW.fencing_token AND e.state IN ('succeeded', 'uncertain'))
   WHERE id = NEW.id;
END;
