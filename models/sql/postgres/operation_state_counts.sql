-- Operation counts by (tenant, state) for the Overview, kept in the transaction that changes
-- the operations: the triggers only append to operation_state_deltas (no lock another writer
-- waits for), the reaper folds them into operation_state_counts (services/counters.go), and
-- readers add both. Transition tables need one trigger per event (PostgreSQL refuses them on a
-- trigger of several events or with a column list), so there are three; an UPDATE that changes
-- no state (renew, a flag) appends nothing: HAVING drops the zero sums.

CREATE OR REPLACE FUNCTION idemgate_count_inserted_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO operation_state_deltas (tenant_id, state, n)
  SELECT tenant_id, state, count(*) FROM idemgate_new GROUP BY tenant_id, state;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION idemgate_count_updated_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO operation_state_deltas (tenant_id, state, n)
  SELECT tenant_id, state, sum(d) FROM (
    SELECT tenant_id, state, 1 AS d FROM idemgate_new
    UNION ALL
    SELECT tenant_id, state, -1 FROM idemgate_old) c
  GROUP BY tenant_id, state HAVING sum(d) <> 0;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION idemgate_count_deleted_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO operation_state_deltas (tenant_id, state, n)
  SELECT tenant_id, state, -count(*) FROM idemgate_old GROUP BY tenant_id, state;
  RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER operations_count_insert AFTER INSERT ON operations
  REFERENCING NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_inserted_operations();
CREATE OR REPLACE TRIGGER operations_count_update AFTER UPDATE ON operations
  REFERENCING OLD TABLE AS idemgate_old NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_updated_operations();
CREATE OR REPLACE TRIGGER operations_count_delete AFTER DELETE ON operations
  REFERENCING OLD TABLE AS idemgate_old FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_deleted_operations();
