package services

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// DefaultRetention is how long evidence is kept after an operation ends (docs/reference.md §6).
const DefaultRetention = 90 * 24 * time.Hour

// reapBatch bounds the rows one reaper statement touches, so a large backlog never holds locks
// or a transaction for long.
const reapBatch = 500

// Reaper expires holds and purges old evidence (docs/reference.md §3, §6). Several reapers (one per
// server process) may run at once: every change is a compare-and-set, so they never undo each
// other's or an acquire's work.
type Reaper struct {
	db        *models.DB
	st        store
	log       *slog.Logger
	retention time.Duration
	obs       Observer

	// afterScan, when set (tests only), runs between reading the expired holds and clearing
	// them, to prove that a hold re-acquired in between survives.
	afterScan func()
}

// NewReaper returns a Reaper over db that purges evidence older than retention (0 means
// DefaultRetention). log may be nil. It reports its passes to nobody; see WithObserver.
func NewReaper(db *models.DB, log *slog.Logger, retention time.Duration) *Reaper {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reaper{db: db, st: newStore(db), log: log, retention: retention, obs: nopObserver{}}
}

// ReapResult counts what one reaper pass changed, in rows.
type ReapResult struct {
	HoldsExpired     int64 // expired holds cleared
	MarkedUncertain  int64 // in_progress operations moved to uncertain (ttl_ or lease_expired_without_outcome)
	OperationsPurged int64 // ended operations older than the retention
	AttemptsPurged   int64 // attempts of the purged operations
	EventsPurged     int64 // events of the purged operations
	// TombstonesWritten counts the purged operations whose key keeps a tombstone (their
	// horizon is not over: docs/reference.md §2 "Lifecycle").
	TombstonesWritten int64
	SessionsPurged    int64 // expired dashboard sessions
}

// RunOnce makes one pass: mark uncertain every in_progress operation whose lease ran out
// before its TTL (lease_expired_without_outcome; its key stays protected), clear every expired hold (by compare on its operation id), mark its
// operation uncertain if it was still in_progress, then purge evidence of operations that ended
// more than the retention ago, in batches. Errors: ErrStoreUnavailable or a wrapped database
// error; work done before the error stays done.
//
// The pass is reported to the Reaper's Observer, unless ctx ended during it.
func (r *Reaper) RunOnce(ctx context.Context) (res ReapResult, err error) {
	defer func() {
		if ctx.Err() == nil {
			r.obs.ReaperPassed(ctx, res, err)
		}
	}()
	if err := r.expireLeases(ctx, &res); err != nil {
		return res, storeError("reap leases", err)
	}
	if err := r.expireHolds(ctx, &res); err != nil {
		return res, storeError("reap holds", err)
	}
	if err := r.purge(ctx, &res); err != nil {
		return res, storeError("purge evidence", err)
	}
	if err := r.foldCounters(ctx); err != nil {
		return res, storeError("fold counters", err)
	}
	return res, nil
}

// expireLeases makes uncertain, in batches, the in_progress operations whose lease ended
// before their TTL (docs/reference.md §8). Operations whose lease runs to the TTL are left to
// expireHolds, which also clears their holds. Each change is a compare on state and lease, so a
// renew or an outcome committed since the scan wins.
func (r *Reaper) expireLeases(ctx context.Context, res *ReapResult) error {
	var after *models.Operation
	for {
		scanCtx, cancel := r.db.Bounded(ctx)
		db := r.db.WithContext(scanCtx)
		now, err := r.db.Now(scanCtx, db)
		if err != nil {
			cancel()
			return err
		}
		// Keyset on (lease_expires_at, id), for the reason expireHolds gives: the operations
		// made uncertain leave operations_lease as dead entries.
		q := db.Select("id", "tenant_id", "lease_expires_at").
			Where("state = ? AND lease_expires_at <= ? AND lease_expires_at < expires_at", StateInProgress, now)
		if after != nil {
			q = q.Where("lease_expires_at >= ? AND (lease_expires_at, id) > (?, ?)", *after.LeaseExpiresAt, *after.LeaseExpiresAt, after.ID)
		}
		var ops []models.Operation
		err = q.Order("lease_expires_at, id").Limit(reapBatch).Find(&ops).Error
		cancel()
		if len(ops) > 0 {
			last := ops[len(ops)-1]
			after = &last
		}
		if err != nil {
			return err
		}
		for _, chunk := range chunks(ops, r.st.reapTxBatch()) {
			var marked int64
			err := r.reapTx(ctx, func(tx *gorm.DB) error {
				marked = 0
				for _, op := range chunk {
					ok, err := expireLease(tx, op.TenantID, op.ID, now)
					if err != nil {
						return err
					}
					if ok {
						marked++
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			res.MarkedUncertain += marked // counted only once committed
		}
		if len(ops) < reapBatch {
			return nil
		}
	}
}

func (r *Reaper) expireHolds(ctx context.Context, res *ReapResult) error {
	var after *models.IdemKey
	for {
		// Every statement of the pass has a deadline (the store timeout; each transaction below
		// gets its own through Tx), so a stalled connection fails the pass, which is logged and
		// counted, instead of stopping the reaper unseen.
		scanCtx, cancel := r.db.Bounded(ctx)
		db := r.db.WithContext(scanCtx)
		now, err := r.db.Now(scanCtx, db)
		if err != nil {
			cancel()
			return err
		}
		// Each scan goes on from where the last one ended (keyset on expires_at, id): the holds
		// the last batch cleared stay in idem_keys_expiring as dead entries until a vacuum, and
		// a scan from the start would step over all of them again, work growing with the
		// square of a backlog (the purge's scan measured it: 11,000 buffers to pass 10,000
		// dead entries). No hold appears behind the cursor: a new or renewed one expires after
		// the pass's first now.
		q := db.Where("holder_operation_id IS NOT NULL AND expires_at <= ?", now)
		if after != nil {
			q = q.Where("expires_at >= ? AND (expires_at, id) > (?, ?)", *after.ExpiresAt, *after.ExpiresAt, after.ID)
		}
		var ks []models.IdemKey
		err = q.Order("expires_at, id").Limit(reapBatch).Find(&ks).Error
		cancel()
		if err != nil {
			return err
		}
		if len(ks) > 0 {
			last := ks[len(ks)-1]
			after = &last
		}
		if r.afterScan != nil {
			r.afterScan()
		}
		for _, chunk := range chunks(ks, r.st.reapTxBatch()) {
			var expired, marked int64
			err := r.reapTx(ctx, func(tx *gorm.DB) (err error) {
				expired, marked, err = r.expireHoldChunk(tx, chunk, now)
				return err
			})
			if err != nil {
				return err
			}
			// Counted only once committed.
			res.HoldsExpired += expired
			res.MarkedUncertain += marked
		}
		if len(ks) < reapBatch {
			return nil
		}
	}
}

// expireHoldChunk clears, in tx, the holds of ks that are still held by the operation read in
// the scan and expired at now, and makes uncertain those of their operations still
// in_progress. It returns how many holds it cleared and how many operations it made uncertain.
//
// A statement per chunk, not per hold: nearly every expired hold is one whose operation has
// ended (a succeeded operation holds its key until the TTL), and clearing such holds one at a
// time (an update and a read of the operation each), even many to a transaction, cleared fewer a
// second than a busy service creates (make scale's reaper pass:
// docs/operations.md "Figures behind the code"). The key rows are first locked in (tenant, key)
// order, the order batch acquires lock theirs (acquireMany), and the operations after them, as
// every writer does, so the chunk cannot close a cycle of lock waits with a batch, a release or
// a takeover.
func (r *Reaper) expireHoldChunk(tx *gorm.DB, ks []models.IdemKey, now time.Time) (expired, marked int64, err error) {
	scanned := make(map[int64]string, len(ks)) // key row id -> the holder the scan read
	keyIDs := make([]int64, 0, len(ks))
	for _, k := range ks {
		scanned[k.ID] = *k.HolderOperationID
		keyIDs = append(keyIDs, k.ID)
	}
	var rows []models.IdemKey
	if err := r.st.lock(tx.Select("id", "holder_operation_id")).
		Where("id IN ? AND holder_operation_id IS NOT NULL AND expires_at <= ?", keyIDs, now).
		Order("tenant_id, key").Find(&rows).Error; err != nil {
		return 0, 0, err
	}
	// Compare on the operation id read in the scan: a key another attempt took over since
	// (whose new hold may have expired too: the next pass clears it) is left alone.
	ids, ops := make([]int64, 0, len(rows)), make([]string, 0, len(rows))
	for _, k := range rows {
		if *k.HolderOperationID == scanned[k.ID] {
			ids, ops = append(ids, k.ID), append(ops, *k.HolderOperationID)
		}
	}
	if len(ids) == 0 {
		return 0, 0, nil
	}
	u := tx.Model(&models.IdemKey{}).Where("id IN ?", ids).
		Updates(map[string]any{"holder_operation_id": nil, "expires_at": nil})
	if u.Error != nil {
		return 0, 0, u.Error
	}
	// Only the holders still in progress change state: the rest ended before their TTL.
	var live []models.Operation
	if err := tx.Select("id", "tenant_id").Where("id IN ? AND state = ?", ops, StateInProgress).
		Order("id").Find(&live).Error; err != nil {
		return 0, 0, err
	}
	for _, op := range live {
		ok, err := expireToUncertain(tx, op.TenantID, op.ID, now)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			marked++
		}
	}
	return u.RowsAffected, marked, nil
}

// purgeCandidate is an operation the purge may delete, and its place in the scan (Mark: the
// value of the column the scan walks).
type purgeCandidate struct {
	ID           string
	Mark         time.Time
	KeyID        int64
	FencingToken int64
}

// purgeSource is one walk of the purge: the operations whose column (purge_after, or ended_at
// for those ended without one) is before cutoff, along the index that serves where.
type purgeSource struct {
	column string
	where  string
	cutoff time.Time
}

// purgeYield is how long the purge pauses after each batch, as a multiple of the time the batch
// took: 1 keeps it to about half of the time, whatever the machine, so a backlog is cleared
// steadily without taking the database from acquires. What a batch costs acquires is mostly its
// WAL (most of it full-page images after a checkpoint): every acquire's commit waits for the WAL
// flush that carries it. Pausing trades some of the purge's rate for the acquires' p99; alone
// the purge runs at about half its unpaused rate (measured:
// docs/operations.md "Figures behind the code").
const purgeYield = 1.0

// sleepCtx waits for d, or returns ctx's error if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// chunks cuts s into consecutive pieces of at most n.
func chunks[T any](s []T, n int) [][]T {
	var out [][]T
	for len(s) > n {
		out = append(out, s[:n:n])
		s = s[n:]
	}
	if len(s) > 0 {
		out = append(out, s)
	}
	return out
}

// reapTx runs fn in a transaction, again (after a short jittered pause) when PostgreSQL rolled
// it back as a deadlock's victim or a serialization failure: it then changed nothing, and fn
// must reset whatever it counts. Every change the reaper makes is a compare-and-set, so the
// next try simply finds what others committed meanwhile.
func (r *Reaper) reapTx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	var err error
	for try := 0; try < maxStatementTries; try++ {
		if err = r.db.Tx(ctx, fn); !isRetryable(err) {
			return err
		}
		if perr := retryPause(ctx, try); perr != nil {
			return perr
		}
	}
	return err
}

func (r *Reaper) purge(ctx context.Context, res *ReapResult) error {
	nowCtx, cancel := r.db.Bounded(ctx)
	now, err := r.db.Now(nowCtx, r.db.WithContext(nowCtx))
	cancel()
	if err != nil {
		return err
	}
	// docs/reference.md §2 "Lifecycle": an operation admitted with a retention is purged at
	// its purge_after (ended_at + its retention); one that ended without a purge_after
	// (admitted before lifecycles, or ended by an older build during a rolling upgrade) by
	// ended_at and the reaper's retention, as before. Each walk has an index of its own
	// (operations_purge, operations_ended), so the second costs nothing once those are gone.
	for _, src := range purgeSources(now, r.retention) {
		if err := r.purgeWalk(ctx, res, src, now); err != nil {
			return err
		}
	}
	return r.db.Write(ctx, func(db *gorm.DB) error {
		s := db.Where("expires_at IS NOT NULL AND expires_at < ?", now).Delete(&models.Session{})
		res.SessionsPurged = s.RowsAffected
		return s.Error
	})
}

// purgeWalk purges the operations of src, oldest first, in batches: each batch one
// transaction that writes the tombstones of those whose key is still within its horizon and
// deletes them with their attempts, events, counters and finished webhook deliveries.
func (r *Reaper) purgeWalk(ctx context.Context, res *ReapResult, src purgeSource, now time.Time) error {
	batchSize := r.st.purgeBatch()
	var after *purgeCandidate
	for {
		t0 := time.Now()
		scanCtx, cancel := r.db.Bounded(ctx)
		db := r.db.WithContext(scanCtx)
		// An operation that still holds its key (a failed one within its TTL) is kept, and so
		// is any earlier generation of a key a later one holds: an attempt_id retry of the
		// holder's admission may name it as previous_operation again (docs/reference.md §4,
		// warnedGeneration), and the operator who follows that warning must find it. Released
		// and failed ones are kept too, for at most the holder's TTL, so the scan need not
		// read states. The candidates come off
		// operations_ended, oldest first, with the hold check as a probe of idem_keys_holder
		// (idem_keys_holder; before it, a scan of every key row per batch); the successor check
		// is a second statement over the candidates' key rows by primary key. As a second
		// NOT EXISTS in the scan it was planned from statistics taken when few keys were held
		// (after a reaper pass, always): every held key row was read once per candidate, 14.7
		// million rows for a batch of 1,000 beside 300 acquires/s, and the purge ran at 1,200
		// operations/s instead of 12,000 (make scale at 200,000 keys).
		//
		// Each scan goes on from where the last one ended (keyset on the column, id): the
		// operations the last batch deleted stay in the index as dead entries until a vacuum,
		// and a scan from the start visited every one of them again.
		var cands []purgeCandidate
		err := purgeScan(db, src, after, batchSize).Find(&cands).Error
		if err != nil {
			cancel()
			return err
		}
		if len(cands) == 0 {
			cancel()
			break
		}
		after = &cands[len(cands)-1]
		keyIDs := make([]int64, 0, len(cands))
		for _, c := range cands {
			keyIDs = append(keyIDs, c.KeyID)
		}
		var held []models.IdemKey
		err = db.Select("id", "fencing_token").Where("id IN ? AND holder_operation_id IS NOT NULL", keyIDs).Find(&held).Error
		cancel()
		if err != nil {
			return err
		}
		holderToken := make(map[int64]int64, len(held))
		for _, k := range held {
			holderToken[k.ID] = k.FencingToken
		}
		ids := make([]string, 0, len(cands))
		for _, c := range cands {
			if tok, ok := holderToken[c.KeyID]; !ok || tok <= c.FencingToken {
				ids = append(ids, c.ID)
			}
		}
		if len(ids) == 0 {
			if len(cands) < batchSize {
				break
			}
			continue
		}
		var batch ReapResult
		err = r.db.Tx(ctx, func(tx *gorm.DB) error {
			tombs, err := writeTombstones(tx, ids, now)
			if err != nil {
				return err
			}
			batch.TombstonesWritten = tombs
			e := tx.Where("operation_id IN ?", ids).Delete(&models.Event{})
			if e.Error != nil {
				return e.Error
			}
			a := tx.Where("operation_id IN ?", ids).Delete(&models.Attempt{})
			if a.Error != nil {
				return a.Error
			}
			if err := tx.Where("operation_id IN ?", ids).Delete(&models.OperationCounter{}).Error; err != nil {
				return err
			}
			// Their webhook deliveries go too, once finished: a pending one (of a disabled
			// endpoint) is still owed to its receiver.
			if err := tx.Where("operation_id IN ? AND status <> ?", ids, DeliveryPending).Delete(&models.WebhookEvent{}).Error; err != nil {
				return err
			}
			d := tx.Where("id IN ?", ids).Delete(&models.Operation{})
			batch.OperationsPurged, batch.AttemptsPurged, batch.EventsPurged = d.RowsAffected, a.RowsAffected, e.RowsAffected
			return d.Error
		})
		if err != nil {
			return err
		}
		// Yield as long as the batch took (see purgeYield).
		if err := sleepCtx(ctx, time.Duration(float64(time.Since(t0))*purgeYield)); err != nil {
			return err
		}
		// Counted only once committed: a rolled-back batch deleted nothing.
		res.OperationsPurged += batch.OperationsPurged
		res.AttemptsPurged += batch.AttemptsPurged
		res.EventsPurged += batch.EventsPurged
		res.TombstonesWritten += batch.TombstonesWritten
		if len(cands) < batchSize {
			break
		}
	}
	return nil
}

// purgeSources are the purge's walks at now, with retention the installation's: operations
// with a purge_after, then those ended without one.
func purgeSources(now time.Time, retention time.Duration) []purgeSource {
	return []purgeSource{
		{column: "purge_after", where: "purge_after IS NOT NULL", cutoff: now},
		{column: "ended_at", where: "ended_at IS NOT NULL AND purge_after IS NULL", cutoff: now.Add(-retention)},
	}
}

// purgeScan is the query of one batch of src's candidates after the keyset after (nil: from
// the start), at most limit, in the order of src's index (TestPurgePlansUseTheirIndexes).
func purgeScan(db *gorm.DB, src purgeSource, after *purgeCandidate, limit int) *gorm.DB {
	q := db.Model(&models.Operation{}).Where(src.where).Where(src.column+" < ?", src.cutoff).
		Where("NOT EXISTS (SELECT 1 FROM idem_keys k WHERE k.holder_operation_id = operations.id)")
	if after != nil {
		q = q.Where(src.column+" >= ? AND ("+src.column+", id) > (?, ?)", after.Mark, after.Mark, after.ID)
	}
	return q.Select("id", src.column+" AS mark", "key_id", "fencing_token").Order(src.column + ", id").Limit(limit)
}

// writeTombstones writes, in tx, the tombstone of each of the operations ids (about to be
// purged) that protects its key past now (protected_by and protected_until: docs/reference.md
// §2 "Lifecycle"): its fencing token, state, outcome status and receipt, and request hash, on
// the key row. In the purge's transaction, so an operation is never gone
// without its tombstone: a crash leaves both or neither.
func writeTombstones(tx *gorm.DB, ids []string, now time.Time) (int64, error) {
	var ops []models.Operation
	if err := tx.Select("id", "key_id", "fencing_token", "state", "outcome_status", "outcome_receipt", "operation_name",
		"fingerprint").
		Where("id IN ?", ids).
		Where("EXISTS (SELECT 1 FROM idem_keys k WHERE k.id = operations.key_id AND k.protected_by = operations.id AND k.protected_until > ?)", now).
		Find(&ops).Error; err != nil {
		return 0, err
	}
	for _, o := range ops {
		if err := tx.Model(&models.IdemKey{}).Where("id = ? AND protected_by = ?", o.KeyID, o.ID).
			Updates(map[string]any{"tomb_fencing_token": o.FencingToken, "tomb_state": o.State, "tomb_outcome_status": o.OutcomeStatus,
				"tomb_outcome_receipt": o.OutcomeReceipt, "tomb_request_hash": requestHash(o.OperationName, o.Fingerprint)}).Error; err != nil {
			return 0, err
		}
	}
	return int64(len(ops)), nil
}

// foldCounters folds the kept counters' deltas into their totals (counters.go), in one
// transaction of its own.
func (r *Reaper) foldCounters(ctx context.Context) error {
	return r.db.Tx(ctx, func(tx *gorm.DB) error {
		now, err := r.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		return r.st.foldCounters(tx, now)
	})
}

// Run calls RunOnce at once and then every interval until ctx ends, logging each pass that
// changed something and each failure (a failed pass is simply retried at the next tick).
func (r *Reaper) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	// The first pass runs at once: work left by a crash is not left for another interval, and
	// the last-success metric means something from the start.
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		res, err := r.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "reaper pass failed", "err", err)
			continue
		}
		if res != (ReapResult{}) {
			r.log.InfoContext(ctx, "reaper pass", "holds_expired", res.HoldsExpired, "marked_uncertain", res.MarkedUncertain,
				"operations_purged", res.OperationsPurged, "attempts_purged", res.AttemptsPurged,
				"events_purged", res.EventsPurged, "tombstones_written", res.TombstonesWritten, "sessions_purged", res.SessionsPurged)
		}
	}
}
