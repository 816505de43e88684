-- +goose Up
-- SQLite twin of ../postgres/00013_operations_key_id.sql: operations carry key_id =
-- idem_keys.id, unique with the fencing token, and the lookups of a key's generations go
-- through it on both dialects. The old UNIQUE (tenant_id, key, fencing_token) stays here:
-- SQLite drops a table constraint only by rebuilding the table, and this store is not bound
-- by index writes (one writer; see services/store_sqlite.go). The column is nullable because
-- SQLite adds a NOT NULL column only with a default; services/store_sqlite.go names key_id on
-- every operation it writes, and the trigger below fills it for any INSERT that does not.
ALTER TABLE operations ADD COLUMN key_id INTEGER;
INSERT INTO idem_keys (tenant_id, key, fencing_token, holder_operation_id, expires_at, last_operation_id, acquired_at)
SELECT o.tenant_id, o.key, o.fencing_token, NULL, NULL, o.id, o.acquired_at
  FROM operations o
 WHERE NOT EXISTS (SELECT 1 FROM idem_keys k WHERE k.tenant_id = o.tenant_id AND k.key = o.key)
   AND o.fencing_token = (SELECT MAX(p.fencing_token) FROM operations p WHERE p.tenant_id = o.tenant_id AND p.key = o.key);
UPDATE operations SET key_id = (SELECT k.id FROM idem_keys k WHERE k.tenant_id = operations.tenant_id AND k.key = operations.key);
CREATE UNIQUE INDEX operations_key_generation ON operations (key_id, fencing_token);
-- +goose StatementBegin
CREATE TRIGGER operations_key_id AFTER INSERT ON operations
  FOR EACH ROW WHEN NEW.key_id IS NULL
BEGIN
  UPDATE operations SET key_id = (SELECT k.id FROM idem_keys k WHERE k.tenant_id = NEW.tenant_id AND k.key = NEW.key)
   WHERE id = NEW.id;
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER operations_key_id;
DROP INDEX operations_key_generation;
ALTER TABLE operations DROP COLUMN key_id;
