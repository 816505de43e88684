-- SQLite twin of ../postgres/operation_state_counts.sql. SQLite has one writer and no
-- statement-level triggers, so row triggers add to the totals directly and
-- operation_state_deltas stays empty; it exists so that the readers' SQL is the same on both
-- dialects.

DROP TRIGGER IF EXISTS operations_count_insert;
CREATE TRIGGER operations_count_insert AFTER INSERT ON operations
BEGIN
  INSERT INTO operation_state_counts (tenant_id, state, n) VALUES (NEW.tenant_id, NEW.state, 1)
    ON CONFLICT (tenant_id, state) DO UPDATE SET n = n + 1;
END;

DROP TRIGGER IF EXISTS operations_count_update;
CREATE TRIGGER operations_count_update AFTER UPDATE OF state, tenant_id ON operations
  FOR EACH ROW WHEN OLD.state <> NEW.state OR OLD.tenant_id <> NEW.tenant_id
BEGIN
  UPDATE operation_state_counts SET n = n - 1 WHERE tenant_id = OLD.tenant_id AND state = OLD.state;
  INSERT INTO operation_state_counts (tenant_id, state, n) VALUES (NEW.tenant_id, NEW.state, 1)
    ON CONFLICT (tenant_id, state) DO UPDATE SET n = n + 1;
END;

DROP TRIGGER IF EXISTS operations_count_delete;
CREATE TRIGGER operations_count_delete AFTER DELETE ON operations
BEGIN
  UPDATE operation_state_counts SET n = n - 1 WHERE tenant_id = OLD.tenant_id AND state = OLD.state;
END;
