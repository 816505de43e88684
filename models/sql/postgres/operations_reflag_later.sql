-- possible_duplicate_effect follows the earlier operations' states: a reconciliation to failed
-- clears it on the key's later operations, one to succeeded keeps it; a purge of the earlier
-- operation leaves it set, so the warning outlives the evidence that raised it. Only when the
-- operation moves into or out of {succeeded, uncertain}, and only for a key with later
-- operations; the common move (in_progress to succeeded of the newest operation) costs one
-- probe of operations_key_generation that finds nothing.

CREATE OR REPLACE FUNCTION idemgate_reflag_later_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- One scan of the key's later generations along operations_key_generation (a join of
  -- operations with itself was planned as a sequential scan: TestAcquireBatchGenericPlansUseIndexes).
  UPDATE operations l SET possible_duplicate_effect = NOT l.possible_duplicate_effect
   WHERE l.key_id = NEW.key_id AND l.fencing_token > NEW.fencing_token
     AND l.possible_duplicate_effect <> EXISTS (
           SELECT 1 FROM operations e WHERE e.key_id = l.key_id AND e.fencing_token < l.fencing_token
              AND idemgate_may_duplicate_effect(e.state));
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER operations_reflag_later AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN (idemgate_may_duplicate_effect(OLD.state) <> idemgate_may_duplicate_effect(NEW.state))
  EXECUTE FUNCTION idemgate_reflag_later_operations();
