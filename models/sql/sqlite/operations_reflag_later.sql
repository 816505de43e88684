-- SQLite twin of ../postgres/operations_reflag_later.sql.

DROP TRIGGER IF EXISTS operations_reflag_later;
CREATE TRIGGER operations_reflag_later AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (OLD.state IN ('succeeded', 'uncertain')) <> (NEW.state IN ('succeeded', 'uncertain'))
BEGIN
  UPDATE operations SET possible_duplicate_effect = EXISTS (
    SELECT 1 FROM operations e WHERE e.tenant_id = operations.tenant_id AND e.key = operations.key
       AND e.fencing_token < operations.fencing_token AND e.state IN ('succeeded', 'uncertain'))
   WHERE tenant_id = NEW.tenant_id AND key = NEW.key AND fencing_token > NEW.fencing_token;
END;
