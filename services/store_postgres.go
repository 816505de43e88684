package services

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// pgStore is the PostgreSQL store. Its acquire is one statement (acquireSQL) whose decision for
// an existing key is taken by the PL/pgSQL function idemgate_acquire, under row locks and in
// one round trip: the one place outside rules.go where the admission and expiry rules are
// written down again, in SQL, step for step. TestAdmissionRulesAgree runs the same cases
// through the rules and both stores.
type pgStore struct {
	db *models.DB
}

// groupLockTimeout is the lock timeout of the statements group admission sends from its slot
// (see grouper): a slot never waits longer than this on one key's row lock.
const groupLockTimeout = "20ms"

func (s *pgStore) grouper(mode LingerMode) *grouper {
	g := newGrouper(mode, groupMaxInFlight, groupMaxItems)
	g.single = func(ctx context.Context, a acquireArgs, bounded bool) (decision, error) {
		if bounded {
			return s.acquireAlone(ctx, a, groupLockTimeout)
		}
		return s.acquireAlone(ctx, a, "")
	}
	g.batch = func(ctx context.Context, as []acquireArgs) ([]decision, error) {
		return s.acquireMany(ctx, as, groupLockTimeout)
	}
	g.contended = isLockTimeout
	g.bound = func() (context.Context, context.CancelFunc) { return s.db.Bounded(context.Background()) }
	return g
}

func (s *pgStore) foldCounters(tx *gorm.DB, now time.Time) error { return foldCounters(tx, true, now) }

func (s *pgStore) lock(q *gorm.DB) *gorm.DB { return q.Clauses(clause.Locking{Strength: "UPDATE"}) }

func (*pgStore) listens() bool { return true }

func (*pgStore) skipLocked(alias string) string { return " FOR UPDATE OF " + alias + " SKIP LOCKED" }

func (*pgStore) probeJoin(table, alias, cond string) string {
	return "JOIN LATERAL (SELECT * FROM " + table + " " + alias + " WHERE " + cond + " OFFSET 0) AS " + alias + " ON true"
}

func (*pgStore) inEveryTenant(col string) string {
	return col + " = ANY(ARRAY(SELECT id FROM tenants))"
}

// purgeBatch: larger batches pay the per-transaction cost (the scan for candidates, five
// deletes, a commit) less often.
func (*pgStore) purgeBatch() int { return 1000 }

func (*pgStore) reapTxBatch() int { return 100 }

func (*pgStore) hourOf(col string) string {
	return "to_char(" + col + " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24')"
}

// acquireSQL is the PostgreSQL acquire, one round trip. A key acquired for the first time (the
// common case) is admitted by the plain data-modifying CTE `ins`/`op`/`att`; only when the key
// already exists (or a concurrent acquire inserted it first) does the statement call the
// idemgate_acquire function, which decides duplicate, conflict, attempt_id retry or takeover.
// The function sits behind a one-time filter on NOT EXISTS (ins), so it runs only then: skipping
// PL/pgSQL for new keys is faster (measured: docs/operations.md "Figures behind the code"). The
// operation names its key row (key_id, from `ins`), so the operations_key_id trigger is not
// called.
const acquireSQL = `WITH now AS (SELECT clock_timestamp() AS t,
  set_config('lock_timeout', COALESCE($13::text, current_setting('lock_timeout')), true) AS lock_timeout),
ins AS (
  INSERT INTO idem_keys (tenant_id, key, fencing_token, holder_operation_id, expires_at, last_operation_id, acquired_at)
  SELECT $1, $2, 1, $10::uuid, t + make_interval(secs => $3::integer), $10::uuid, t FROM now
  ON CONFLICT (tenant_id, key) DO NOTHING
  RETURNING id, acquired_at, expires_at
), op AS (
  INSERT INTO operations (id, key_id, tenant_id, key, operation_name, fingerprint, correlation_id, attempt_id, api_key_id,
                          metadata, state, fencing_token, owner_token_hash, acquired_at, expires_at,
                          lease_expires_at, on_expiry, retention_seconds, horizon_seconds)
  SELECT $10::uuid, id, $1, $2, $4, $5, $6, $8, $12::bigint, $7::json,
         'in_progress', 1, $11, acquired_at, expires_at, acquired_at + make_interval(secs => $14::integer),
         $15::text, $16::bigint, $17::bigint FROM ins
  RETURNING *
), att AS (
  INSERT INTO attempts (tenant_id, key, operation_id, result, attempt_id, operation_name, fingerprint,
                        correlation_id, caller, attempted_at)
  SELECT $1, $2, id, 'admitted', $8, $4, $5, $6, $9, acquired_at FROM op
)
SELECT 'admitted' AS result, false AS readmitted, op.acquired_at AS db_now, NULL::uuid AS prev_id,
       NULL::text AS prev_state, NULL::bigint AS prev_fencing_token, NULL::text AS prev_outcome_status,
       NULL::text AS prev_outcome_receipt,
       op.id AS op_id, op.key AS op_key, op.operation_name AS op_operation_name, op.fingerprint AS op_fingerprint,
       op.correlation_id AS op_correlation_id, op.metadata AS op_metadata, op.state AS op_state,
       op.state_reason AS op_state_reason, op.fencing_token AS op_fencing_token, op.acquired_at AS op_acquired_at,
       op.expires_at AS op_expires_at, NULL::text AS op_outcome_status, NULL::text AS op_outcome_receipt,
       NULL::json AS op_outcome_response, NULL::text AS op_outcome_note, NULL::text AS op_outcome_by,
       NULL::timestamptz AS op_outcome_at, NULL::timestamptz AS op_released_at, NULL::text AS op_release_reason,
       0::bigint AS op_duplicate_attempts, 0::bigint AS op_conflict_attempts,
       op.lease_expires_at AS op_lease_expires_at, op.on_expiry AS op_on_expiry,
       op.retention_seconds AS op_retention_seconds, op.horizon_seconds AS op_horizon_seconds,
       NULL::timestamptz AS op_purge_after, NULL::timestamptz AS op_protected_until, false AS op_evidence_purged
  FROM op
UNION ALL
SELECT f.* FROM idemgate_acquire($1::bigint, $2::text, $3::integer, $4::text, $5::text, $6::text, $7::json,
                                 $8::text, $9::text, $10::uuid, $11::text, $12::bigint, $14::integer,
                                 $15::text, $16::bigint, $17::bigint) f
 WHERE NOT EXISTS (SELECT 1 FROM ins)`

func (s *pgStore) acquire(ctx context.Context, a acquireArgs) (decision, error) {
	return s.acquireAlone(ctx, a, "")
}

// acquireAlone decides one acquire with acquireSQL; lockTimeout, when not "", bounds every
// row-lock wait of the statement (a 55P03 lock_not_available error then means nothing was
// decided).
func (s *pgStore) acquireAlone(ctx context.Context, a acquireArgs, lockTimeout string) (decision, error) {
	// A statement that lost a race it cannot resolve in place (serialization failure: the
	// holder released while we read it; or a deadlock victim) changed nothing, and the next try
	// sees the winner's committed state. A few tries always suffice in practice.
	var row acquireRow
	var err error
	for try := 0; try < maxStatementTries; try++ {
		if err = s.acquireOnce(ctx, a, lockTimeout, &row); !isRetryable(err) {
			break
		}
		if perr := retryPause(ctx, try); perr != nil {
			return decision{}, perr
		}
	}
	if err != nil {
		return decision{}, err
	}
	return row.decision(), nil
}

// acquireBatchSQL decides a batch with idemgate_acquire_batch (models/sql/postgres/idemgate_acquire_batch.sql): one statement, items in order.
const acquireBatchSQL = `SELECT * FROM idemgate_acquire_batch($1::bigint[], $2::text[], $3::integer[], $4::text[],
  $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::uuid[], $11::text[], $12::bigint[],
  $14::integer[], $15::text[], $16::bigint[], $17::bigint[], $13::text)`

func (s *pgStore) acquireBatch(ctx context.Context, as []acquireArgs) ([]decision, error) {
	return s.acquireMany(ctx, as, "")
}

// acquireMany decides as with acquireBatchSQL; lockTimeout, when not "", bounds every row-lock
// wait of the statement (a 55P03 lock_not_available error then means nothing was decided).
//
// The statement takes its key rows' locks in the order of its items, so two batches holding
// the same keys in different orders could each wait for the other (issue 28: 32 callers
// shuffling 10 shared keys, 36% of batches 503 after deadlocks). The items are sent in one
// canonical order, by tenant and key, items of one key keeping their order (a stable sort: the
// second sees the first), and the answers are put back in item order. Single acquires lock one
// key row, and bulk reconciliation and the reaper one operation per transaction, so with
// batches and group admission in this order no cycle of lock waits can form among them.
func (s *pgStore) acquireMany(ctx context.Context, as []acquireArgs, lockTimeout string) ([]decision, error) {
	order := make([]int, len(as))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool {
		a, b := as[order[x]], as[order[y]]
		if a.p.TenantID != b.p.TenantID {
			return a.p.TenantID < b.p.TenantID
		}
		return a.in.Key < b.in.Key
	})
	sorted := make([]acquireArgs, len(as))
	for j, i := range order {
		sorted[j] = as[i]
	}
	args := batchArgs(sorted, lockTimeout)
	var err error
	for try := 0; try < maxStatementTries; try++ {
		var ds []decision
		if ds, err = s.acquireBatchOnce(ctx, len(as), args...); err == nil {
			out := make([]decision, len(as))
			for j, i := range order {
				out[i] = ds[j]
			}
			return out, nil
		} else if !isRetryable(err) {
			return nil, err
		}
		if err := retryPause(ctx, try); err != nil {
			return nil, err
		}
	}
	return nil, err
}

// maxStatementTries bounds how often a statement rolled back whole by a serialization failure
// or a deadlock is sent again. It changed nothing each time, and the store timeout bounds the
// whole call anyway; the bound only stops a caller whose context has no deadline.
const maxStatementTries = 10

// retryPause waits before try+2 of a statement that lost a race: a few milliseconds, growing
// and jittered, so statements that deadlocked do not meet again in the same order at once.
// It returns ctx's error if ctx ends first.
func retryPause(ctx context.Context, try int) error {
	d := time.Duration(1+rand.IntN(2<<min(try, 5))) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// batchArgs is acquireBatchSQL's 17 arguments for as: one array per parameter of a single
// acquire, the lock timeout (NULL when "") as $13, then the leases, expiry policies, retentions
// and horizons.
func batchArgs(as []acquireArgs, lockTimeout string) []any {
	n := len(as)
	tenants, keys, ttls := make([]int64, n), make([]string, n), make([]int32, n)
	names, fps, corrs, metas, atts := make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
	callers, opIDs, owners, apiKeys := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	leases, policies := make([]int32, n), make([]string, n)
	retentions, horizons := make([]*int64, n), make([]*int64, n)
	for i, a := range as {
		leases[i], policies[i] = int32(a.in.leaseSeconds()), a.in.onExpiry()
		retentions[i], horizons[i] = a.life.args()
		tenants[i], keys[i], ttls[i] = a.p.TenantID, a.in.Key, int32(a.in.TTLSeconds)
		names[i], fps[i], corrs[i], metas[i], atts[i] = a.in.Operation, a.in.Fingerprint, a.in.CorrelationID, jsonArg(a.meta), a.in.AttemptID
		callers[i], opIDs[i], owners[i], apiKeys[i] = a.p.Prefix, a.opID, a.ownerHash, a.p.APIKeyID
	}
	var lt *string
	if lockTimeout != "" {
		lt = &lockTimeout
	}
	return []any{tenants, keys, ttls, names, fps, corrs, metas, atts, callers, opIDs, owners, apiKeys, lt, leases, policies,
		retentions, horizons}
}

func (s *pgStore) acquireBatchOnce(ctx context.Context, n int, args ...any) ([]decision, error) {
	rows, err := s.db.Pool.Query(ctx, acquireBatchSQL, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ds := make([]decision, n)
	seen := 0
	for rows.Next() {
		var ord int32
		var row acquireRow
		if err := rows.Scan(append([]any{&ord}, row.dest()...)...); err != nil {
			return nil, err
		}
		if ord < 1 || int(ord) > n {
			return nil, fmt.Errorf("acquire batch: result for item %d of %d", ord, n)
		}
		ds[ord-1] = row.decision()
		seen++
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if seen != n {
		return nil, fmt.Errorf("acquire batch: %d results for %d items", seen, n)
	}
	return ds, nil
}

// isLockTimeout reports a PostgreSQL lock_not_available error: a statement run with a lock
// timeout would have waited longer on a row lock, and was undone.
func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// isRetryable reports a PostgreSQL serialization failure or deadlock: the statement was rolled
// back whole and may simply run again. Deadlocks are counted in deadlocks.
func isRetryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	if pe.Code == "40P01" {
		deadlocks.Add(1)
	}
	return pe.Code == "40001" || pe.Code == "40P01"
}

// deadlocks counts the statements (acquires, reaper transactions) PostgreSQL chose as a deadlock's victim in this
// process, for the test that proves the canonical lock order (none happen).
var deadlocks atomic.Int64

func (s *pgStore) acquireOnce(ctx context.Context, a acquireArgs, lockTimeout string, row *acquireRow) error {
	// The hottest statement goes straight to the pgx pool under GORM: GORM's Raw rebuilt the
	// 3 KB statement and interpolated it for its trace logger on every call, which cost more CPU
	// than the rest of the request. pgx caches the prepared statement per connection.
	p, in := a.p, a.in
	var lt *string
	if lockTimeout != "" {
		lt = &lockTimeout
	}
	retention, horizon := a.life.args()
	return s.db.Pool.QueryRow(ctx, acquireSQL, p.TenantID, in.Key, in.TTLSeconds, in.Operation, in.Fingerprint,
		in.CorrelationID, jsonArg(a.meta), in.AttemptID, p.Prefix, a.opID, a.ownerHash, p.APIKeyID, lt,
		in.leaseSeconds(), in.onExpiry(), retention, horizon).Scan(row.dest()...)
}

// dest is the scan destinations of row's fields in the column order of the idemgate_acquire
// function's result, which acquireSQL's first branch and idemgate_acquire_batch (after its
// item number) return too.
func (row *acquireRow) dest() []any {
	return []any{&row.Result, &row.Readmitted, &row.DBNow, &row.PrevID, &row.PrevState, &row.PrevFencingToken,
		&row.PrevOutcomeStatus, &row.PrevOutcomeReceipt, &row.OpID, &row.OpKey, &row.OpOperationName, &row.OpFingerprint,
		&row.OpCorrelationID, &row.OpMetadata, &row.OpState, &row.OpStateReason, &row.OpFencingToken,
		&row.OpAcquiredAt, &row.OpExpiresAt, &row.OpOutcomeStatus, &row.OpOutcomeReceipt, &row.OpOutcomeResponse,
		&row.OpOutcomeNote, &row.OpOutcomeBy, &row.OpOutcomeAt, &row.OpReleasedAt, &row.OpReleaseReason,
		&row.OpDuplicateAttempts, &row.OpConflictAttempts, &row.OpLeaseExpiresAt, &row.OpOnExpiry,
		&row.OpRetentionSeconds, &row.OpHorizonSeconds, &row.OpPurgeAfter, &row.OpProtectedUntil, &row.OpEvidencePurged}
}

// acquireRow is the row acquireSQL returns, in the column order of the idemgate_acquire
// function (models/sql/postgres/idemgate_acquire.sql).
type acquireRow struct {
	Result              string
	Readmitted          bool
	DBNow               time.Time
	PrevID              *string
	PrevState           *string
	PrevFencingToken    *int64
	PrevOutcomeStatus   *string
	PrevOutcomeReceipt  *string
	OpID                string
	OpKey               string
	OpOperationName     *string
	OpFingerprint       *string
	OpCorrelationID     *string
	OpMetadata          *string
	OpState             string
	OpStateReason       *string
	OpFencingToken      int64
	OpAcquiredAt        time.Time
	OpExpiresAt         time.Time
	OpOutcomeStatus     *string
	OpOutcomeReceipt    *string
	OpOutcomeResponse   *string
	OpOutcomeNote       *string
	OpOutcomeBy         *string
	OpOutcomeAt         *time.Time
	OpReleasedAt        *time.Time
	OpReleaseReason     *string
	OpDuplicateAttempts int64
	OpConflictAttempts  int64
	OpLeaseExpiresAt    *time.Time
	OpOnExpiry          *string
	OpRetentionSeconds  *int64
	OpHorizonSeconds    *int64
	OpPurgeAfter        *time.Time
	OpProtectedUntil    *time.Time
	OpEvidencePurged    bool
}

// decision is the row as a store's answer.
func (r *acquireRow) decision() decision {
	d := decision{result: r.Result, readmitted: r.Readmitted, op: r.operation()}
	if r.PrevID != nil && r.PrevState != nil {
		d.prev = &PreviousOperation{
			ID: *r.PrevID, State: *r.PrevState, FencingToken: deref(r.PrevFencingToken),
			OutcomeStatus: r.PrevOutcomeStatus, OutcomeReceipt: r.PrevOutcomeReceipt,
		}
	}
	return d
}

func (r *acquireRow) operation() Operation {
	op := Operation{
		ID: r.OpID, Key: r.OpKey, Operation: r.OpOperationName, State: r.OpState,
		StateReason: r.OpStateReason, FencingToken: r.OpFencingToken, CorrelationID: r.OpCorrelationID,
		Fingerprint: r.OpFingerprint, Metadata: rawJSON(r.OpMetadata), AcquiredAt: r.OpAcquiredAt.UTC(),
		// Held: the operation holds its key, unless a hold_until_reconciled operation answers
		// past its TTL (docs/reference.md §8), as GET /v1/operations/{id} would say.
		ExpiresAt: r.OpExpiresAt.UTC(), Held: r.OpExpiresAt.After(r.DBNow), ReleasedAt: utcPtr(r.OpReleasedAt),
		ReleaseReason: r.OpReleaseReason, DuplicateAttempts: r.OpDuplicateAttempts,
		ConflictAttempts: r.OpConflictAttempts, LeaseExpiresAt: r.OpExpiresAt.UTC(), OnExpiry: OnExpiryReadmit,
		RetentionSeconds: r.OpRetentionSeconds, HorizonSeconds: r.OpHorizonSeconds, EvidenceUntil: utcPtr(r.OpPurgeAfter),
		ProtectedUntil: utcPtr(r.OpProtectedUntil), EvidencePurged: r.OpEvidencePurged,
	}
	if r.OpEvidencePurged {
		op.Held = false // a tombstone: the key is protected (ProtectedUntil), not held
	}
	if r.OpLeaseExpiresAt != nil {
		op.LeaseExpiresAt = r.OpLeaseExpiresAt.UTC()
	}
	if r.OpOnExpiry != nil {
		op.OnExpiry = *r.OpOnExpiry
	}
	if r.OpOutcomeStatus != nil {
		op.Outcome = &Outcome{
			Status: *r.OpOutcomeStatus, Receipt: r.OpOutcomeReceipt, Response: rawJSON(r.OpOutcomeResponse),
			Note: r.OpOutcomeNote, RecordedBy: deref(r.OpOutcomeBy), RecordedAt: derefTime(r.OpOutcomeAt),
		}
	}
	return op
}
