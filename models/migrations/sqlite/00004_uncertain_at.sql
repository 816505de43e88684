-- +goose Up
-- SQLite twin of ../postgres/00004_uncertain_at.sql: uncertain_at is the time an operation
-- became uncertain, set by a trigger on every path that makes it so, kept after reconciliation.
ALTER TABLE operations ADD COLUMN uncertain_at DATETIME;

-- SQLite triggers cannot assign NEW, so this one updates the row after the fact, in the same
-- statement. The value is written in the driver's own text layout for times
-- ("2006-01-02 15:04:05.999999999-07:00" in UTC: trailing zeros of the fraction dropped, and
-- the dot with them), so it compares as text with the times the driver binds, which the queue's
-- keyset relies on. SQLite's clock is the process clock, the one the SQLite dialect judges time
-- by everywhere; its resolution is a millisecond.
-- +goose StatementBegin
CREATE TRIGGER operations_uncertain_at AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN NEW.state = 'uncertain' AND OLD.state <> 'uncertain' AND NEW.uncertain_at IS NULL
BEGIN
  UPDATE operations
     SET uncertain_at = rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
   WHERE id = NEW.id;
END;
-- +goose StatementEnd

UPDATE operations
   SET uncertain_at = COALESCE(
         (SELECT MIN(e.created_at) FROM events e
           WHERE e.operation_id = operations.id AND e.detail LIKE 'in_progress -> uncertain%'),
         CASE WHEN operations.state = 'uncertain' THEN COALESCE(operations.outcome_at, operations.expires_at) END)
 WHERE uncertain_at IS NULL;

CREATE INDEX operations_uncertain_queue ON operations (tenant_id, uncertain_at, id) WHERE state = 'uncertain';
CREATE INDEX operations_uncertain_queue_all ON operations (uncertain_at, id) WHERE state = 'uncertain';

-- +goose Down
DROP INDEX operations_uncertain_queue_all;
DROP INDEX operations_uncertain_queue;
DROP TRIGGER operations_uncertain_at;
ALTER TABLE operations DROP COLUMN uncertain_at;
