-- uncertain_at is when an operation became uncertain, for the reconciliation queue's order; kept
-- after reconciliation as evidence, never cleared. A trigger sets it rather than each writer, so
-- every way an operation becomes uncertain sets it (the reaper, the owner's "uncertain"
-- outcome, the takeover inside idemgate_acquire), and it keeps the first time: reporting
-- uncertain again does not move the operation back in the queue. It fires only on UPDATEs that
-- name state, so the acquire's other updates pay nothing.

CREATE OR REPLACE FUNCTION idemgate_set_uncertain_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.uncertain_at := COALESCE(NEW.uncertain_at, clock_timestamp());
  RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER operations_uncertain_at BEFORE UPDATE OF state ON operations
  FOR EACH ROW WHEN (NEW.state = 'uncertain' AND OLD.state <> 'uncertain')
  EXECUTE FUNCTION idemgate_set_uncertain_at();
