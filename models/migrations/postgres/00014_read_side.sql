-- +goose Up
-- The read side at the size of a real deployment (issue 27): every page reads a bounded number
-- of rows whatever the number of keys. Measured before this migration at 4,000,000 keys: the
-- audit answered 503 after the 5 s store deadline, the overview took 3.8 s, a key-prefix search
-- 2.5 s and the purge ran at about 200 operations/s. Each part below says what it serves.
--
-- Run it at a quiet hour on a large database: the backfills read operations and the last 8 days
-- of attempts once, and the collation change below rebuilds the (tenant_id, key) index, in one
-- transaction that holds the tables' locks until it commits.

-- 1. Operation counts by (tenant, state), kept by statement-level triggers in the transaction
--    that changes the operations, so the Overview reads a few rows instead of counting every
--    operation. The triggers only append to operation_state_deltas: an INSERT takes no lock
--    another writer waits for, so no admission, outcome, purge or reconciliation ever queues
--    (or deadlocks) behind a shared counter row. The reaper folds the deltas into
--    operation_state_counts (services/counters.go); readers add both, in one statement, so a
--    count is exact at every snapshot, folded or not.
CREATE TABLE operation_state_counts (
  tenant_id bigint NOT NULL,
  state text NOT NULL,
  n bigint NOT NULL,
  PRIMARY KEY (tenant_id, state)
);
CREATE TABLE operation_state_deltas (
  tenant_id bigint NOT NULL,
  state text NOT NULL,
  n bigint NOT NULL
);
-- Transition tables need one trigger per event (PostgreSQL refuses them on a trigger of
-- several events or with a column list), so there are three, and an UPDATE that changes no
-- state (renew, the key_id fill, a flag) appends nothing: HAVING drops the zero sums.
-- +goose StatementBegin
CREATE FUNCTION idemgate_count_inserted_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO operation_state_deltas (tenant_id, state, n)
  SELECT tenant_id, state, count(*) FROM idemgate_new GROUP BY tenant_id, state;
  RETURN NULL;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION idemgate_count_updated_operations() RETURNS trigger
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
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION idemgate_count_deleted_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO operation_state_deltas (tenant_id, state, n)
  SELECT tenant_id, state, -count(*) FROM idemgate_old GROUP BY tenant_id, state;
  RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER operations_count_insert AFTER INSERT ON operations
  REFERENCING NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_inserted_operations();
CREATE TRIGGER operations_count_update AFTER UPDATE ON operations
  REFERENCING OLD TABLE AS idemgate_old NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_updated_operations();
CREATE TRIGGER operations_count_delete AFTER DELETE ON operations
  REFERENCING OLD TABLE AS idemgate_old FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_deleted_operations();
INSERT INTO operation_state_counts (tenant_id, state, n)
SELECT tenant_id, state, count(*) FROM operations GROUP BY tenant_id, state;

-- 2. Attempts per (tenant, UTC hour, result), for the Overview's chart (24 hours or 7 days),
--    kept the same way. The hour is text 'YYYY-MM-DD HH' as services' hourOf writes it on both
--    dialects. Attempts are counted as they were made: the purge deletes no count (the chart
--    is traffic, not retained evidence), and the reaper drops hours older than 8 days. UPDATE
--    is counted too, although idemgate never updates an attempt, so that a database edited by
--    hand (make scale moves times back) keeps exact counts.
CREATE TABLE attempt_hours (
  tenant_id bigint NOT NULL,
  hour text NOT NULL,
  result text NOT NULL,
  n bigint NOT NULL,
  PRIMARY KEY (tenant_id, hour, result)
);
CREATE INDEX attempt_hours_hour ON attempt_hours (hour);
CREATE TABLE attempt_hour_deltas (
  tenant_id bigint NOT NULL,
  hour text NOT NULL,
  result text NOT NULL,
  n bigint NOT NULL
);
-- +goose StatementBegin
CREATE FUNCTION idemgate_count_inserted_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO attempt_hour_deltas (tenant_id, hour, result, n)
  SELECT tenant_id, to_char(attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24'), result, count(*)
    FROM idemgate_new GROUP BY 1, 2, 3;
  RETURN NULL;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION idemgate_count_updated_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO attempt_hour_deltas (tenant_id, hour, result, n)
  SELECT tenant_id, hour, result, sum(d) FROM (
    SELECT tenant_id, to_char(attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24') AS hour, result, 1 AS d FROM idemgate_new
    UNION ALL
    SELECT tenant_id, to_char(attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24'), result, -1 FROM idemgate_old) c
  GROUP BY 1, 2, 3 HAVING sum(d) <> 0;
  RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER attempts_count_insert AFTER INSERT ON attempts
  REFERENCING NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_inserted_attempts();
CREATE TRIGGER attempts_count_update AFTER UPDATE ON attempts
  REFERENCING OLD TABLE AS idemgate_old NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_updated_attempts();
INSERT INTO attempt_hours (tenant_id, hour, result, n)
SELECT tenant_id, to_char(attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24'), result, count(*)
  FROM attempts WHERE attempted_at >= now() - interval '8 days' GROUP BY 1, 2, 3;

-- 3. The possible duplicate effect (docs/reference.md §5 "Audit"), decided once when an
--    operation is admitted instead of for every admitted attempt an audit reads: set when an
--    earlier operation of the key (a lower fencing token) is succeeded or uncertain. It follows
--    the earlier operations' states (a reconciliation to failed clears it, one to succeeded
--    keeps it) through the second trigger; a purge of the earlier operation leaves it set, so
--    the warning outlives the evidence that raised it. New keys (fencing token 1) never reach
--    either trigger function. operations_key_id fills key_id first: BEFORE triggers run in name
--    order.
ALTER TABLE operations ADD COLUMN possible_duplicate_effect boolean NOT NULL DEFAULT false;
UPDATE operations l SET possible_duplicate_effect = true
 WHERE l.fencing_token > 1
   AND EXISTS (SELECT 1 FROM operations e WHERE e.key_id = l.key_id AND e.fencing_token < l.fencing_token
                 AND e.state IN ('succeeded', 'uncertain'));
-- +goose StatementBegin
CREATE FUNCTION idemgate_admitted_possible_duplicate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.possible_duplicate_effect := EXISTS (
    SELECT 1 FROM operations e WHERE e.key_id = NEW.key_id AND e.fencing_token < NEW.fencing_token
       AND e.state IN ('succeeded', 'uncertain'));
  RETURN NEW;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION idemgate_reflag_later_operations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- One scan of the key's later generations along operations_key_generation (a join of
  -- operations with itself was planned as a sequential scan: TestAcquireBatchGenericPlansUseIndexes).
  UPDATE operations l SET possible_duplicate_effect = NOT l.possible_duplicate_effect
   WHERE l.key_id = NEW.key_id AND l.fencing_token > NEW.fencing_token
     AND l.possible_duplicate_effect <> EXISTS (
           SELECT 1 FROM operations e WHERE e.key_id = l.key_id AND e.fencing_token < l.fencing_token
              AND e.state IN ('succeeded', 'uncertain'));
  RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER operations_possible_duplicate BEFORE INSERT ON operations
  FOR EACH ROW WHEN (NEW.fencing_token > 1) EXECUTE FUNCTION idemgate_admitted_possible_duplicate();
-- Only when the operation moves into or out of {succeeded, uncertain}, and only for a key with
-- later operations; the common move (in_progress to succeeded of the newest operation) costs
-- one probe of operations_key_generation that finds nothing.
CREATE TRIGGER operations_reflag_later AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN ((OLD.state IN ('succeeded', 'uncertain')) IS DISTINCT FROM (NEW.state IN ('succeeded', 'uncertain')))
  EXECUTE FUNCTION idemgate_reflag_later_operations();

-- 4. Indexes the pages read along (each named in the query that uses it; models'
--    plan tests fail when a query stops using its index).
-- The audit's duplicate and conflicting attempts in a time range, newest first: admitted
-- attempts (about one per key) are left out, so the index holds the retries only.
CREATE INDEX attempts_audited ON attempts (attempted_at, id) WHERE result <> 'admitted';
-- The audit's flagged admissions in a time range.
CREATE INDEX operations_flagged ON operations (acquired_at) WHERE possible_duplicate_effect;
-- The purge's "does a key still hold this operation" (it was a scan of every key row per batch).
CREATE INDEX idem_keys_holder ON idem_keys (holder_operation_id) WHERE holder_operation_id IS NOT NULL;
-- The purge's finished deliveries of the purged operations (it was a scan of the outbox).
CREATE INDEX webhook_events_operation ON webhook_events (operation_id);
-- A key-prefix search is a range of the (tenant_id, key) index: key >= prefix AND key <
-- the prefix's successor. That is only a prefix match under byte order, so keys compare in the
-- "C" collation (they are opaque bytes; equality is unchanged, since every deterministic
-- collation compares equal strings byte for byte). This rebuilds the unique index.
ALTER TABLE idem_keys ALTER COLUMN key TYPE text COLLATE "C";

-- +goose Down
ALTER TABLE idem_keys ALTER COLUMN key TYPE text COLLATE "default";
DROP INDEX webhook_events_operation;
DROP INDEX idem_keys_holder;
DROP INDEX operations_flagged;
DROP INDEX attempts_audited;
DROP TRIGGER operations_reflag_later ON operations;
DROP TRIGGER operations_possible_duplicate ON operations;
DROP FUNCTION idemgate_reflag_later_operations();
DROP FUNCTION idemgate_admitted_possible_duplicate();
ALTER TABLE operations DROP COLUMN possible_duplicate_effect;
DROP TRIGGER attempts_count_update ON attempts;
DROP TRIGGER attempts_count_insert ON attempts;
DROP FUNCTION idemgate_count_updated_attempts();
DROP FUNCTION idemgate_count_inserted_attempts();
DROP TABLE attempt_hour_deltas;
DROP TABLE attempt_hours;
DROP TRIGGER operations_count_delete ON operations;
DROP TRIGGER operations_count_update ON operations;
DROP TRIGGER operations_count_insert ON operations;
DROP FUNCTION idemgate_count_deleted_operations();
DROP FUNCTION idemgate_count_updated_operations();
DROP FUNCTION idemgate_count_inserted_operations();
DROP TABLE operation_state_deltas;
DROP TABLE operation_state_counts;
