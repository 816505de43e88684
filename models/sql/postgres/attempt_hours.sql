-- Attempts per (tenant, UTC hour, result) for the Overview's chart, kept like the operation
-- counts (operation_state_counts.sql). UPDATE is counted too, although idemgate never updates
-- an attempt, so that a database edited by hand (make scale moves times back) keeps exact
-- counts.

CREATE OR REPLACE FUNCTION idemgate_count_inserted_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO attempt_hour_deltas (tenant_id, hour, result, n)
  SELECT tenant_id, to_char(attempted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24'), result, count(*)
    FROM idemgate_new GROUP BY 1, 2, 3;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION idemgate_count_updated_attempts() RETURNS trigger
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

CREATE OR REPLACE TRIGGER attempts_count_insert AFTER INSERT ON attempts
  REFERENCING NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_inserted_attempts();
CREATE OR REPLACE TRIGGER attempts_count_update AFTER UPDATE ON attempts
  REFERENCING OLD TABLE AS idemgate_old NEW TABLE AS idemgate_new FOR EACH STATEMENT EXECUTE FUNCTION idemgate_count_updated_attempts();
