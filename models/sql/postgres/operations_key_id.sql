-- An INSERT into operations that does not name key_id gets it from the key row. Every
-- statement of idemgate's names it (acquireSQL, both acquire functions, services/store_*.go);
-- this is for rows written by hand or by a model without KeyID, and the WHEN clause keeps the
-- function from being called otherwise. No key row leaves key_id NULL, and the NOT NULL
-- constraint refuses the operation. BEFORE triggers run in name order, so this one fills key_id
-- before operations_possible_duplicate reads it.

CREATE OR REPLACE FUNCTION idemgate_operation_key_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  SELECT k.id INTO NEW.key_id FROM idem_keys k WHERE k.tenant_id = NEW.tenant_id AND k.key = NEW.key;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER operations_key_id BEFORE INSERT ON operations
  FOR EACH ROW WHEN (NEW.key_id IS NULL)
  EXECUTE FUNCTION idemgate_operation_key_id();
