package services

import (
	"context"
	"errors"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// sqliteStore is the SQLite store: the same decisions as the PostgreSQL one, taken in Go by
// the rules of rules.go inside one immediate transaction (the DSN sets _txlock=immediate, so
// the write lock is taken at BEGIN; transactions queue for it in arrival order in models.DB.Tx
// before they begin, and no row locks are needed).
type sqliteStore struct {
	db *models.DB
}

func (sqliteStore) foldCounters(tx *gorm.DB, now time.Time) error {
	return foldCounters(tx, false, now)
}

func (sqliteStore) lock(q *gorm.DB) *gorm.DB { return q }

func (sqliteStore) listens() bool { return false }

func (sqliteStore) skipLocked(string) string { return "" }

func (sqliteStore) probeJoin(table, alias, cond string) string {
	return "JOIN " + table + " " + alias + " ON " + cond
}

func (sqliteStore) inEveryTenant(col string) string { return col + " IN (SELECT id FROM tenants)" }

// purgeBatch: a batch holds the only write lock, which every acquire waits for, so it is a
// tenth of PostgreSQL's and an acquire arriving mid-purge waits about a tenth as long.
// Acquires' p99 beside the purge is still many times their p99 without it, and what holds the
// lock that long is not yet profiled (make scale DB=sqlite: docs/operations.md "Figures behind
// the code").
func (sqliteStore) purgeBatch() int { return 100 }

func (sqliteStore) reapTxBatch() int { return 20 }

// grouper gathers concurrent acquires into one immediate transaction: SQLite has one writer
// anyway, so they queue in Go, in arrival order, and share one commit (one fsync under
// synchronous=FULL). No row locks, so nothing is contended.
func (s sqliteStore) grouper(mode LingerMode) *grouper {
	g := newGrouper(mode, groupMaxInFlight, groupMaxItems)
	g.single = func(ctx context.Context, a acquireArgs, _ bool) (decision, error) { return s.acquire(ctx, a) }
	g.batch = s.acquireBatch
	g.bound = func() (context.Context, context.CancelFunc) { return s.db.Bounded(context.Background()) }
	return g
}

func (sqliteStore) hourOf(col string) string { return "strftime('%Y-%m-%d %H', " + col + ")" }

func (s sqliteStore) acquire(ctx context.Context, a acquireArgs) (decision, error) {
	var d decision
	err := s.db.Tx(ctx, func(tx *gorm.DB) (err error) {
		d, err = s.acquireTx(tx, a)
		return err
	})
	return d, err
}

func (s sqliteStore) acquireBatch(ctx context.Context, as []acquireArgs) ([]decision, error) {
	var ds []decision
	err := s.db.Tx(ctx, func(tx *gorm.DB) error {
		ds = make([]decision, 0, len(as))
		for _, a := range as {
			d, err := s.acquireTx(tx, a)
			if err != nil {
				return err
			}
			ds = append(ds, d)
		}
		return nil
	})
	return ds, err
}

// acquireTx decides one acquire inside tx, an immediate transaction.
func (sqliteStore) acquireTx(tx *gorm.DB, a acquireArgs) (decision, error) {
	p, in := a.p, a.in
	var d decision
	err := func() error {
		now := time.Now().UTC().Truncate(time.Microsecond)
		expires := now.Add(time.Duration(in.TTLSeconds) * time.Second)
		newOp := models.Operation{
			ID: a.opID, TenantID: p.TenantID, Key: in.Key, OperationName: in.Operation,
			Fingerprint: in.Fingerprint, CorrelationID: in.CorrelationID, AttemptID: in.AttemptID,
			APIKeyID: &p.APIKeyID, Metadata: jsonArg(a.meta), State: StateInProgress, OwnerTokenHash: a.ownerHash,
			AcquiredAt: now, ExpiresAt: expires, OnExpiry: in.onExpiry(),
		}
		newOp.RetentionSeconds, newOp.HorizonSeconds = a.life.args()
		lease := now.Add(time.Duration(in.leaseSeconds()) * time.Second)
		newOp.LeaseExpiresAt = &lease
		opID := newOp.ID
		var k models.IdemKey
		err := tx.Where("tenant_id = ? AND key = ?", p.TenantID, in.Key).Take(&k).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			newOp.FencingToken = 1
			k = models.IdemKey{TenantID: p.TenantID, Key: in.Key, FencingToken: 1, HolderOperationID: &opID,
				ExpiresAt: &expires, LastOperationID: opID, AcquiredAt: now}
			if err := tx.Create(&k).Error; err != nil {
				return err
			}
			newOp.KeyID = k.ID
			if err := tx.Create(&newOp).Error; err != nil {
				return err
			}
			d.result = ResultAdmitted
		case err != nil:
			return err
		case holdIsLive(k.HolderOperationID, k.ExpiresAt, now):
			var h models.Operation
			if err := tx.Where("id = ?", *k.HolderOperationID).Take(&h).Error; err != nil {
				return err
			}
			if leaseLapsed(&h, now) {
				// docs/reference.md §8: the lease ran out without an outcome; uncertain now,
				// the key still protected until its TTL.
				if _, err := expireLease(tx, p.TenantID, h.ID, now); err != nil {
					return err
				}
				if err := tx.Where("id = ?", h.ID).Take(&h).Error; err != nil {
					return err
				}
			}
			newOp = h
			d.result, d.readmitted = answerOnLiveHold(&h, in, p.APIKeyID)
			update := map[string]any{}
			switch {
			case d.readmitted:
				update["owner_token_hash"] = a.ownerHash
			case d.result == ResultConflict:
				update["conflict_attempts"] = gorm.Expr("conflict_attempts + 1")
			default:
				update["duplicate_attempts"] = gorm.Expr("duplicate_attempts + 1")
			}
			if err := tx.Model(&models.Operation{}).Where("id = ?", h.ID).Updates(update).Error; err != nil {
				return err
			}
		case tombstoned(&k, now) && tx.Where("id = ?", *k.ProtectedBy).Take(&models.Operation{}).Error != nil:
			// docs/reference.md §2 "Lifecycle": the operation that protects the key was purged
			// within its horizon; its tombstone answers (as PostgreSQL's idemgate_acquire does).
			d.result = ResultConflict
			if k.TombRequestHash != nil && *k.TombRequestHash == requestHash(in.Operation, in.Fingerprint) {
				d.result = ResultDuplicate
			}
			d.op = tombstoneOperation(&k)
			return tx.Create(&models.Attempt{
				TenantID: p.TenantID, Key: in.Key, OperationID: k.ProtectedBy, Result: d.result,
				AttemptID: in.AttemptID, OperationName: in.Operation, Fingerprint: in.Fingerprint,
				CorrelationID: in.CorrelationID, Caller: p.Prefix, AttemptedAt: now,
			}).Error
		case holdsAfterTTL(tx, &k, now, &newOp):
			// docs/reference.md §8: hold_until_reconciled keeps the key past its TTL until the
			// operation is reconciled, and §2 "Lifecycle": a success keeps it until its horizon
			// ends, whether or not it is the key's newest; answered about that operation, never
			// admitted.
			h := newOp
			if h.State == StateInProgress {
				if _, err := expireToUncertain(tx, p.TenantID, h.ID, now); err != nil {
					return err
				}
			}
			d.result = ResultDuplicate
			update := map[string]any{"duplicate_attempts": gorm.Expr("duplicate_attempts + 1")}
			if !sameRequest(&h, in) {
				d.result = ResultConflict
				update = map[string]any{"conflict_attempts": gorm.Expr("conflict_attempts + 1")}
			}
			if err := tx.Model(&models.Operation{}).Where("id = ?", h.ID).Updates(update).Error; err != nil {
				return err
			}
		default:
			if k.HolderOperationID != nil {
				if _, err := expireToUncertain(tx, p.TenantID, *k.HolderOperationID, now); err != nil {
					return err
				}
			}
			// docs/reference.md §4: warned about the newest earlier generation whose effect
			// may have happened, skipping released and failed ones (see warnedGeneration).
			var prev models.Operation
			if err := warnedGeneration(tx, k.ID, k.FencingToken+1).Take(&prev).Error; err == nil {
				d.prev = &PreviousOperation{ID: prev.ID, State: prev.State, FencingToken: prev.FencingToken,
					OutcomeStatus: prev.OutcomeStatus, OutcomeReceipt: prev.OutcomeReceipt}
			} else if !errors.Is(err, gorm.ErrRecordNotFound) {
				return err
			}
			newOp.FencingToken, newOp.KeyID = k.FencingToken+1, k.ID
			if err := tx.Model(&models.IdemKey{}).Where("id = ?", k.ID).Updates(map[string]any{
				"fencing_token": newOp.FencingToken, "holder_operation_id": opID, "expires_at": expires,
				"last_operation_id": opID, "acquired_at": now, "protected_until": nil, "protected_by": nil,
				"tomb_fencing_token": nil, "tomb_state": nil,
				"tomb_outcome_status": nil, "tomb_outcome_receipt": nil, "tomb_request_hash": nil,
			}).Error; err != nil {
				return err
			}
			if err := tx.Create(&newOp).Error; err != nil {
				return err
			}
			d.result = ResultAdmitted
		}
		if err := tx.Create(&models.Attempt{
			TenantID: p.TenantID, Key: in.Key, OperationID: &newOp.ID, Result: d.result,
			AttemptID: in.AttemptID, OperationName: in.Operation, Fingerprint: in.Fingerprint,
			CorrelationID: in.CorrelationID, Caller: p.Prefix, AttemptedAt: now,
		}).Error; err != nil {
			return err
		}
		var op models.Operation
		if err := tx.Where("id = ?", newOp.ID).Take(&op).Error; err != nil {
			return err
		}
		// Held, unless a hold_until_reconciled operation answers past its TTL (as on PostgreSQL).
		d.op = operationFromModel(&op, op.ExpiresAt.After(now))
		return nil
	}()
	return d, err
}

// protected reports whether key row k refuses new admissions at now because of its last
// operation's horizon (docs/reference.md §2 "Lifecycle").
func protected(k *models.IdemKey, now time.Time) bool {
	return k.ProtectedUntil != nil && k.ProtectedUntil.After(now)
}

// holdsAfterTTL reports whether key row k is kept from a new admission after its TTL at now: by
// the horizon of the operation that protects it (protected_by, while protected_until is
// ahead), or by its newest operation's hold_until_reconciled policy (holdsUntilReconciled);
// if so, *into is that operation. A lookup error counts as not held: the takeover that follows
// reads the same row and reports it.
func holdsAfterTTL(tx *gorm.DB, k *models.IdemKey, now time.Time, into *models.Operation) bool {
	var m models.Operation
	if protected(k, now) && k.ProtectedBy != nil && tx.Where("id = ?", *k.ProtectedBy).Take(&m).Error == nil {
		*into = m
		return true
	}
	if err := tx.Where("id = ?", k.LastOperationID).Take(&m).Error; err != nil || !holdsUntilReconciled(&m) {
		return false
	}
	*into = m
	return true
}
