-- +goose Up
-- SQLite twin of ../postgres/00014_read_side.sql (read it for the why). SQLite has one writer
-- and no statement-level triggers, so row triggers add to the totals directly and the delta
-- tables stay empty; they exist so that the readers' SQL is the same on both dialects.
CREATE TABLE operation_state_counts (
  tenant_id INTEGER NOT NULL,
  state     TEXT    NOT NULL,
  n         INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, state)
);
CREATE TABLE operation_state_deltas (
  tenant_id INTEGER NOT NULL,
  state     TEXT    NOT NULL,
  n         INTEGER NOT NULL
);
INSERT INTO operation_state_counts (tenant_id, state, n)
SELECT tenant_id, state, count(*) FROM operations GROUP BY tenant_id, state;
-- +goose StatementBegin
CREATE TRIGGER operations_count_insert AFTER INSERT ON operations
BEGIN
  INSERT INTO operation_state_counts (tenant_id, state, n) VALUES (NEW.tenant_id, NEW.state, 1)
    ON CONFLICT (tenant_id, state) DO UPDATE SET n = n + 1;
END;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER operations_count_update AFTER UPDATE OF state, tenant_id ON operations
  FOR EACH ROW WHEN OLD.state <> NEW.state OR OLD.tenant_id <> NEW.tenant_id
BEGIN
  UPDATE operation_state_counts SET n = n - 1 WHERE tenant_id = OLD.tenant_id AND state = OLD.state;
  INSERT INTO operation_state_counts (tenant_id, state, n) VALUES (NEW.tenant_id, NEW.state, 1)
    ON CONFLICT (tenant_id, state) DO UPDATE SET n = n + 1;
END;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER operations_count_delete AFTER DELETE ON operations
BEGIN
  UPDATE operation_state_counts SET n = n - 1 WHERE tenant_id = OLD.tenant_id AND state = OLD.state;
END;
-- +goose StatementEnd

CREATE TABLE attempt_hours (
  tenant_id INTEGER NOT NULL,
  hour      TEXT    NOT NULL,
  result    TEXT    NOT NULL,
  n         INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, hour, result)
);
CREATE INDEX attempt_hours_hour ON attempt_hours (hour);
CREATE TABLE attempt_hour_deltas (
  tenant_id INTEGER NOT NULL,
  hour      TEXT    NOT NULL,
  result    TEXT    NOT NULL,
  n         INTEGER NOT NULL
);
INSERT INTO attempt_hours (tenant_id, hour, result, n)
SELECT tenant_id, strftime('%Y-%m-%d %H', attempted_at), result, count(*)
  FROM attempts WHERE attempted_at >= datetime('now', '-8 days') GROUP BY 1, 2, 3;
-- +goose StatementBegin
CREATE TRIGGER attempts_count_insert AFTER INSERT ON attempts
BEGIN
  INSERT INTO attempt_hours (tenant_id, hour, result, n)
  VALUES (NEW.tenant_id, strftime('%Y-%m-%d %H', NEW.attempted_at), NEW.result, 1)
    ON CONFLICT (tenant_id, hour, result) DO UPDATE SET n = n + 1;
END;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER attempts_count_update AFTER UPDATE OF tenant_id, attempted_at, result ON attempts
BEGIN
  UPDATE attempt_hours SET n = n - 1
   WHERE tenant_id = OLD.tenant_id AND hour = strftime('%Y-%m-%d %H', OLD.attempted_at) AND result = OLD.result;
  INSERT INTO attempt_hours (tenant_id, hour, result, n)
  VALUES (NEW.tenant_id, strftime('%Y-%m-%d %H', NEW.attempted_at), NEW.result, 1)
    ON CONFLICT (tenant_id, hour, result) DO UPDATE SET n = n + 1;
END;
-- +goose StatementEnd

-- The possible duplicate effect, decided at admission and kept in step with the earlier
-- operations' states. SQLite cannot change NEW in a BEFORE trigger, so the admission's flag is
-- set by an UPDATE after the insert, in the same transaction. The key's generations are found
-- by (tenant_id, key): the UNIQUE (tenant_id, key, fencing_token) serves it, and it does not
-- depend on which of the AFTER INSERT triggers (this one or operations_key_id) runs first.
ALTER TABLE operations ADD COLUMN possible_duplicate_effect INTEGER NOT NULL DEFAULT 0;
UPDATE operations SET possible_duplicate_effect = 1
 WHERE fencing_token > 1
   AND EXISTS (SELECT 1 FROM operations e WHERE e.tenant_id = operations.tenant_id AND e.key = operations.key
                 AND e.fencing_token < operations.fencing_token AND e.state IN ('succeeded', 'uncertain'));
-- +goose StatementBegin
CREATE TRIGGER operations_possible_duplicate AFTER INSERT ON operations
  FOR EACH ROW WHEN NEW.fencing_token > 1
BEGIN
  UPDATE operations SET possible_duplicate_effect = EXISTS (
    SELECT 1 FROM operations e WHERE e.tenant_id = NEW.tenant_id AND e.key = NEW.key
       AND e.fencing_token < NEW.fencing_token AND e.state IN ('succeeded', 'uncertain'))
   WHERE id = NEW.id;
END;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE TRIGGER operations_reflag_later AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (OLD.state IN ('succeeded', 'uncertain')) <> (NEW.state IN ('succeeded', 'uncertain'))
BEGIN
  UPDATE operations SET possible_duplicate_effect = EXISTS (
    SELECT 1 FROM operations e WHERE e.tenant_id = operations.tenant_id AND e.key = operations.key
       AND e.fencing_token < operations.fencing_token AND e.state IN ('succeeded', 'uncertain'))
   WHERE tenant_id = NEW.tenant_id AND key = NEW.key AND fencing_token > NEW.fencing_token;
END;
-- +goose StatementEnd

CREATE INDEX attempts_audited ON attempts (attempted_at, id) WHERE result <> 'admitted';
CREATE INDEX operations_flagged ON operations (acquired_at) WHERE possible_duplicate_effect;
CREATE INDEX idem_keys_holder ON idem_keys (holder_operation_id) WHERE holder_operation_id IS NOT NULL;
CREATE INDEX webhook_events_operation ON webhook_events (operation_id);
-- SQLite compares text byte by byte (BINARY) already: a prefix is a range of the unique
-- (tenant_id, key) index as it is.

-- +goose Down
DROP INDEX webhook_events_operation;
DROP INDEX idem_keys_holder;
DROP INDEX operations_flagged;
DROP INDEX attempts_audited;
DROP TRIGGER operations_reflag_later;
DROP TRIGGER operations_possible_duplicate;
ALTER TABLE operations DROP COLUMN possible_duplicate_effect;
DROP TRIGGER attempts_count_update;
DROP TRIGGER attempts_count_insert;
DROP TABLE attempt_hour_deltas;
DROP TABLE attempt_hours;
DROP TRIGGER operations_count_delete;
DROP TRIGGER operations_count_update;
DROP TRIGGER operations_count_insert;
DROP TABLE operation_state_deltas;
DROP TABLE operation_state_counts;
