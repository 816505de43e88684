-- SQLite twin of ../postgres/operations_key_id.sql. key_id is nullable on SQLite (a NOT NULL
-- column is added only with a default); services/store_sqlite.go names key_id on every
-- operation it writes, and this trigger fills it for any INSERT that does not.

DROP TRIGGER IF EXISTS operations_key_id;
CREATE TRIGGER operations_key_id AFTER INSERT ON operations
  FOR EACH ROW WHEN NEW.key_id IS NULL
BEGIN
  UPDATE operations SET key_id = (SELECT k.id FROM idem_keys k WHERE k.tenant_id = NEW.tenant_id AND k.key = NEW.key)
   WHERE id = NEW.id;
END;
