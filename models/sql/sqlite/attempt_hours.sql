-- SQLite twin of ../postgres/attempt_hours.sql, kept like operation_state_counts.sql.

DROP TRIGGER IF EXISTS attempts_count_insert;
CREATE TRIGGER attempts_count_insert AFTER INSERT ON attempts
BEGIN
  INSERT INTO attempt_hours (tenant_id, hour, result, n)
  VALUES (NEW.tenant_id, strftime('%Y-%m-%d %H', NEW.attempted_at), NEW.result, 1)
    ON CONFLICT (tenant_id, hour, result) DO UPDATE SET n = n + 1;
END;

DROP TRIGGER IF EXISTS attempts_count_update;
CREATE TRIGGER attempts_count_update AFTER UPDATE OF tenant_id, attempted_at, result ON attempts
BEGIN
  UPDATE attempt_hours SET n = n - 1
   WHERE tenant_id = OLD.tenant_id AND hour = strftime('%Y-%m-%d %H', OLD.attempted_at) AND result = OLD.result;
  INSERT INTO attempt_hours (tenant_id, hour, result, n)
  VALUES (NEW.tenant_id, strftime('%Y-%m-%d %H', NEW.attempted_at), NEW.result, 1)
    ON CONFLICT (tenant_id, hour, result) DO UPDATE SET n = n + 1;
END;
