-- The possible duplicate effect (docs/reference.md §5 "Audit"), decided once when an operation
-- is admitted instead of for every admitted attempt an audit reads: set when an earlier
-- operation of the key (a lower fencing token) is succeeded or uncertain. New keys (fencing
-- token 1) never call the function. operations_reflag_later.sql keeps it up to date.

CREATE OR REPLACE FUNCTION idemgate_admitted_possible_duplicate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- The newest such generation, rather than EXISTS: with a key's many released generations
  -- among the most common key_id values, the planner expected a sequential scan to meet a
  -- match at once and chose it over operations_effect (TestWarnedGenerationPlans); ORDER BY
  -- … LIMIT 1 can only be served early by the index.
  NEW.possible_duplicate_effect := (
    SELECT e.fencing_token FROM operations e
     WHERE e.key_id = NEW.key_id AND e.fencing_token < NEW.fencing_token
       AND idemgate_may_duplicate_effect(e.state)
     ORDER BY e.fencing_token DESC LIMIT 1) IS NOT NULL;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER operations_possible_duplicate BEFORE INSERT ON operations
  FOR EACH ROW WHEN (NEW.fencing_token > 1) EXECUTE FUNCTION idemgate_admitted_possible_duplicate();
