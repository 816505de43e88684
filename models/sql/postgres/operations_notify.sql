-- Waiters (GET /v1/operations/{id}?wait=) learn that an operation left in_progress through
-- NOTIFY on channel idemgate_operation, payload the operation id. A trigger sends it, so every
-- path that records an outcome, releases or makes an operation uncertain (API, dashboard,
-- reaper, takeover inside the acquire functions) notifies, in its own transaction: the
-- notification is delivered only if that commits.

CREATE OR REPLACE FUNCTION idemgate_notify_operation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('idemgate_operation', NEW.id::text);
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER operations_notify AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (OLD.state = 'in_progress' AND NEW.state <> 'in_progress')
  EXECUTE FUNCTION idemgate_notify_operation();
