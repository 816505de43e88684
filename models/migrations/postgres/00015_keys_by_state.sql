-- +goose Up
-- The Keys list filtered by a state other than succeeded (issue 27). Those states are rare at
-- size: live holds, failed, uncertain and released are a few percent of the operations a year
-- accumulates. Walking every key newest first and joining its newest operation to find them
-- read the whole table (249 ms at 200,000 keys, 26 times the figure at 10,000); these partial
-- indexes hold only the operations in those states, newest first in the list's own order
-- ((acquired_at, key_id) pages like (idem_keys.acquired_at, idem_keys.id), see keyFilterQuery
-- in services/reads.go), one per tenant and one over every tenant for the dashboard's global
-- accounts. The predicate lists the states rather than saying state <> 'succeeded' because
-- PostgreSQL can prove state = 'uncertain' implies an IN list, not an inequality.
--
-- Every admission enters them (in_progress) and its outcome leaves them: two more index
-- entries per acquire. Cost measured with make bench in the issue 27 note.
CREATE INDEX operations_listed ON operations (tenant_id, state, acquired_at DESC, key_id DESC)
  WHERE state IN ('in_progress', 'failed', 'uncertain', 'released');
CREATE INDEX operations_listed_all ON operations (state, acquired_at DESC, key_id DESC)
  WHERE state IN ('in_progress', 'failed', 'uncertain', 'released');
-- operations_uncertain_queue (tenant_id, uncertain_at, id) has the same predicate and the same
-- leading column: every read this one served, it serves.
DROP INDEX operations_uncertain;

-- +goose Down
CREATE INDEX operations_uncertain ON operations (tenant_id) WHERE state = 'uncertain';
DROP INDEX operations_listed_all;
DROP INDEX operations_listed;
