package services

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// store is the seam between the domain rules and the two databases idemgate runs on, in the
// manner of River's riverdriver: everything that differs between PostgreSQL and SQLite sits
// behind it, and the rest of this package is written once against GORM and this interface. The
// rules themselves (which attempt is admitted, when an operation becomes uncertain, which moves
// the state machine allows, what counts as a possible duplicate effect) are decided in rules.go;
// a store only carries them out. The conformance suite is this package's tests, every one of
// which runs on both stores (eachDB).
type store interface {
	// acquire decides one validated acquire in one transaction, by the rules of rules.go, and
	// logs it as an attempt in that transaction. Errors are database errors (the caller maps
	// them with storeError); the decision itself is never an error.
	acquire(ctx context.Context, a acquireArgs) (decision, error)
	// acquireBatch decides each of as, in order, in one transaction and one round trip: an
	// item sees the items before it (two items with one key: the second is decided after the
	// first). It returns one decision per item, in order; an error means nothing was
	// decided (or, for an error cut off at commit, nothing is known).
	acquireBatch(ctx context.Context, as []acquireArgs) ([]decision, error)
	// grouper returns a new group admission over this store's statements (group.go) that
	// lingers as mode says.
	grouper(mode LingerMode) *grouper
	// lock makes q's SELECT take the row locks a read-modify-write needs: FOR UPDATE on
	// PostgreSQL; nothing on SQLite, whose immediate transactions already hold the database's
	// single write lock from BEGIN.
	lock(q *gorm.DB) *gorm.DB
	// hourOf returns an SQL expression for the UTC hour of the timestamp column col as text
	// "YYYY-MM-DD HH" (Go layout "2006-01-02 15"): the dialects truncate times differently.
	hourOf(col string) string
	// foldCounters adds the kept counters' deltas into their totals and drops attempt hours
	// past attemptHoursKept, in tx (counters.go).
	foldCounters(tx *gorm.DB, now time.Time) error

	// listens reports whether the database announces that an operation left in_progress
	// (NOTIFY from the operations_notify trigger, on PostgreSQL), so waiters can listen as well
	// as poll (await.go).
	listens() bool
	// skipLocked returns the locking clause that ends a claim's SELECT over alias, so that
	// concurrent claims pass each other instead of waiting or taking the same row: FOR UPDATE
	// OF alias SKIP LOCKED on PostgreSQL; nothing on SQLite, where one writer at a time makes
	// the claim's UPDATE alone atomic (webhook_dispatch.go).
	skipLocked(alias string) string
	// probeJoin returns "JOIN table AS alias ON cond" such that the join is run as a probe of
	// table for each row of the walk, never planned as a hash of the whole table (reads.go).
	// On PostgreSQL that is a LATERAL subquery with OFFSET 0, which the planner cannot flatten;
	// SQLite's planner always probes along the index cond names.
	probeJoin(table, alias, cond string) string
	// inEveryTenant returns a condition that col is one of the tenants' ids, written so the
	// database reads it as one index scan over each tenant's range whatever its statistics say
	// (reads.go's prefix search over every tenant).
	inEveryTenant(col string) string
	// purgeBatch is how many ended operations one purge transaction deletes with their
	// evidence (each batch one transaction, so a kill -9 leaves whole operations or none),
	// and reapTxBatch how
	// many holds or leases one reaper transaction expires (reaper.go): on SQLite a
	// transaction holds the only write lock, which every acquire waits for, so they are
	// smaller there.
	purgeBatch() int
	reapTxBatch() int
}

// newStore returns the store for db's dialect: the one place services asks which database it
// runs on.
func newStore(db *models.DB) store {
	if db.Dialect == models.Postgres {
		return &pgStore{db: db}
	}
	return sqliteStore{db: db}
}

// acquireArgs is one validated acquire as a store carries it out: the caller, the request, its
// compacted metadata, and the id and owner-token hash the new operation gets if admitted
// (chosen before the transaction, so a retried statement reuses them).
type acquireArgs struct {
	p         Principal
	in        AcquireInput
	meta      json.RawMessage
	opID      string
	ownerHash string
	// life is the retention and horizon stored on the operation if it is admitted.
	life lifecycle
}

// decision is a store's answer to acquire, in domain values.
type decision struct {
	// result is ResultAdmitted (also for an attempt_id retry: readmitted), ResultDuplicate or
	// ResultConflict.
	result     string
	readmitted bool
	// op is the operation the attempt was answered about: the new (or re-admitted) one when
	// admitted, the key's holder otherwise. Held is true: it holds the key.
	op Operation
	// prev is the key's previous operation when this admission took over a free or expired
	// key that had one; nil otherwise. Acquire decides whether the caller is told about it.
	prev *PreviousOperation
}

// operationFromModel maps a stored operation to the API's operation object; held says whether
// it holds its key right now.
func operationFromModel(m *models.Operation, held bool) Operation {
	op := Operation{
		ID: m.ID, Key: m.Key, Operation: m.OperationName, State: m.State, StateReason: m.StateReason,
		FencingToken: m.FencingToken, CorrelationID: m.CorrelationID, Fingerprint: m.Fingerprint,
		Metadata: rawJSON(m.Metadata), AcquiredAt: m.AcquiredAt.UTC(), ExpiresAt: m.ExpiresAt.UTC(), Held: held,
		ReleasedAt: utcPtr(m.ReleasedAt), ReleaseReason: m.ReleaseReason,
		DuplicateAttempts: m.DuplicateAttempts, ConflictAttempts: m.ConflictAttempts,
		LeaseExpiresAt: m.LeaseEnd().UTC(), OnExpiry: m.OnExpiry,
		RetentionSeconds: m.RetentionSeconds, HorizonSeconds: m.HorizonSeconds, EvidenceUntil: utcPtr(m.PurgeAfter),
		ProtectedUntil: protectedUntil(m),
	}
	if op.OnExpiry == "" {
		op.OnExpiry = OnExpiryReadmit
	}
	if m.OutcomeStatus != nil {
		op.Outcome = &Outcome{Status: *m.OutcomeStatus, Receipt: m.OutcomeReceipt, Response: rawJSON(m.OutcomeResponse),
			Note: m.OutcomeNote, RecordedBy: deref(m.OutcomeBy), RecordedAt: derefTime(m.OutcomeAt)}
	}
	return op
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func rawJSON(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}

// jsonArg passes raw JSON as a text parameter (or NULL), which both drivers accept for
// jsonb/text columns.
func jsonArg(raw json.RawMessage) *string {
	if raw == nil {
		return nil
	}
	s := string(raw)
	return &s
}

// addCounters adds to each of ms the duplicate and conflict attempts counted in its
// OperationCounter rows (PostgreSQL's acquire counts there, one row per connection, so a retry
// storm on one key never waits on a shared row; see operation_counters in models/migrations/postgres/00016_baseline.sql), with one query for all
// of them. An operation's counts are its own columns plus these.
func addCounters(tx *gorm.DB, ms ...*models.Operation) error {
	if len(ms) == 0 {
		return nil
	}
	byID := make(map[string]*models.Operation, len(ms))
	ids := make([]string, 0, len(ms))
	for _, m := range ms {
		byID[strings.ToLower(m.ID)] = m
		ids = append(ids, m.ID)
	}
	var sums []struct {
		OperationID string
		D, C        int64
	}
	if err := tx.Model(&models.OperationCounter{}).
		Select("operation_id, SUM(duplicate_attempts) AS d, SUM(conflict_attempts) AS c").
		Where("operation_id IN ?", ids).Group("operation_id").Scan(&sums).Error; err != nil {
		return err
	}
	for _, s := range sums {
		if m := byID[strings.ToLower(s.OperationID)]; m != nil {
			m.DuplicateAttempts += s.D
			m.ConflictAttempts += s.C
		}
	}
	return nil
}

// pointers returns pointers to the elements of s, for functions that update them in place.
func pointers[T any](s []T) []*T {
	out := make([]*T, len(s))
	for i := range s {
		out[i] = &s[i]
	}
	return out
}
