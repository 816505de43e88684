-- +goose Up
-- The reconciliation queue lists operations in state uncertain, superseded or not, oldest first
-- by the time each became uncertain. That time is uncertain_at: kept after reconciliation as
-- evidence, never cleared.
--
-- It is set by a trigger rather than by each writer, so every way an operation becomes
-- uncertain sets it: the reaper, the owner's "uncertain" outcome, and the takeover inside
-- idemgate_acquire. The trigger leaves that function's text alone (migrations may redefine the
-- function independently of this one). It fires only on UPDATEs that name state, so the
-- acquire's counter updates pay nothing, and keeps the first time: reporting uncertain again
-- for an operation already uncertain does not move it back in the queue.
ALTER TABLE operations ADD COLUMN uncertain_at timestamptz;

-- +goose StatementBegin
CREATE FUNCTION idemgate_set_uncertain_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.uncertain_at := COALESCE(NEW.uncertain_at, clock_timestamp());
  RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER operations_uncertain_at BEFORE UPDATE OF state ON operations
  FOR EACH ROW WHEN (NEW.state = 'uncertain' AND OLD.state <> 'uncertain')
  EXECUTE FUNCTION idemgate_set_uncertain_at();

-- Backfill from the event log: the first event that moved the operation to uncertain (the
-- reaper's and the takeover's "in_progress -> uncertain: …", the owner's outcome
-- "in_progress -> uncertain: outcome uncertain"). An uncertain operation without such an event
-- falls back to its outcome time, then to the end of its hold.
UPDATE operations o
   SET uncertain_at = COALESCE(
         (SELECT MIN(e.created_at) FROM events e
           WHERE e.operation_id = o.id AND e.detail LIKE 'in_progress -> uncertain%'),
         CASE WHEN o.state = 'uncertain' THEN COALESCE(o.outcome_at, o.expires_at) END)
 WHERE o.uncertain_at IS NULL;

-- The queue's keyset, per tenant and across tenants (global dashboard accounts). Partial, like
-- operations_uncertain, so only operations needing reconciliation are indexed.
CREATE INDEX operations_uncertain_queue ON operations (tenant_id, uncertain_at, id) WHERE state = 'uncertain';
CREATE INDEX operations_uncertain_queue_all ON operations (uncertain_at, id) WHERE state = 'uncertain';

-- +goose Down
DROP INDEX operations_uncertain_queue_all;
DROP INDEX operations_uncertain_queue;
DROP TRIGGER operations_uncertain_at ON operations;
DROP FUNCTION idemgate_set_uncertain_at;
ALTER TABLE operations DROP COLUMN uncertain_at;
