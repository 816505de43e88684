-- +goose Up
-- No just-in-time compilation for this database's sessions. idemgate's statements are short and
-- read a few rows along indexes, but PostgreSQL decides to JIT-compile a statement from its
-- estimated cost (jit_above_cost, 100,000 by default), and estimates taken from stale or
-- missing statistics cross it: then a statement that reads three buffers spends 25-340 ms
-- compiling. Measured (make scale at 200,000 keys, December 2026): the trigger that re-flags a
-- key's later generations (00014) compiled on every operation the reaper made uncertain, 26 ms
-- each instead of 3, which held the reaper's pass over 190,000 expired holds to 2,060 a second;
-- the Keys page's capped count and the purge's candidate scan compiled too (44 and 339 ms).
-- PostgreSQL's documentation says as much: JIT pays for long-running, CPU-bound queries.
--
-- ALTER DATABASE needs the database's owner (or a superuser); a migration run by another role
-- leaves the setting alone and says so, rather than failing: the operator can run the
-- statement (docs/operations.md, "Several instances on one PostgreSQL"). Sessions opened after this take
-- it; those already open keep their setting until they reconnect.
-- +goose StatementBegin
DO $$
BEGIN
  EXECUTE format('ALTER DATABASE %I SET jit = off', current_database());
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'idemgate: could not set jit = off for database %: run ALTER DATABASE % SET jit = off as its owner',
    current_database(), current_database();
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
  EXECUTE format('ALTER DATABASE %I RESET jit', current_database());
EXCEPTION WHEN insufficient_privilege THEN
  NULL;
END $$;
-- +goose StatementEnd
