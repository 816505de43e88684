-- SQLite twin of ../postgres/operations_uncertain_at.sql: uncertain_at is the time an
-- operation became uncertain, set on every path that makes it so, kept after reconciliation.
-- SQLite triggers cannot assign NEW, so this one updates the row after the fact, in the same
-- statement. The value is written in the driver's own text layout for times
-- ("2006-01-02 15:04:05.999999999-07:00" in UTC: trailing zeros of the fraction dropped, and
-- the dot with them), so it compares as text with the times the driver binds, which the queue's
-- keyset relies on. SQLite's clock is the process clock, the one the SQLite dialect judges time
-- by everywhere; its resolution is a millisecond.

DROP TRIGGER IF EXISTS operations_uncertain_at;
CREATE TRIGGER operations_uncertain_at AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN NEW.state = 'uncertain' AND OLD.state <> 'uncertain' AND NEW.uncertain_at IS NULL
BEGIN
  UPDATE operations
     SET uncertain_at = rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
   WHERE id = NEW.id;
END;
