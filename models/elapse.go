package models

import (
	"context"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Elapse lets dur pass for one tenant's holds without waiting: every deadline the expiry rules
// compare with the database's clock comes dur sooner, so the next acquire, renew, release,
// read or reaper pass finds each hold, TTL and lease as it would have after dur of wall time.
// With keys named, only those keys move; with none, every key of the tenant. It returns how
// many key rows it found (a caller that named keys can tell a misspelt one).
//
// It rewrites deadlines, so it is only for a store whose clock nobody else relies on: tests
// (modeltest.Elapse, one test's own tenant) and the dashboard's playback sandbox
// (services/playback, a private SQLite file). Never a deployment's store.
//
// The deadlines are the key row's expires_at (the hold: acquires and the reaper compare it)
// and protected_until (its horizon), and, for each operation of the key, expires_at (its TTL:
// Held, hold_until_reconciled), lease_expires_at (its lease: lapses to uncertain) and
// purge_after (its retention: the reaper purges it). Times of what happened (acquired_at, the
// attempts, the events, outcome and release times) keep their values: they are evidence, and
// the audit and the hourly counters are built from them.
//
// Expiry runs on the database's clock (PostgreSQL's clock_timestamp(), SQLite's Go clock), so
// time cannot be moved by faking a Go clock, and a clock offset for the whole database would
// move every tenant's clock. Errors: the database's.
func (d *DB) Elapse(ctx context.Context, tenantID int64, dur time.Duration, keys ...string) (found int, err error) {
	err = d.Tx(ctx, func(tx *gorm.DB) error {
		// The key rows first and then the operations, locked, as every writer takes them, so a
		// reaper pass or an acquire running meanwhile waits instead of deadlocking.
		ofKeys := func(q *gorm.DB) *gorm.DB {
			q = q.Where("tenant_id = ?", tenantID)
			if len(keys) > 0 {
				q = q.Where("key IN ?", keys)
			}
			if d.Dialect == Postgres {
				q = q.Clauses(clause.Locking{Strength: "UPDATE"})
			}
			return q
		}
		var ks []IdemKey
		if err := ofKeys(tx.Select("id", "expires_at", "protected_until")).Order("tenant_id, key").Find(&ks).Error; err != nil {
			return err
		}
		found = len(ks)
		for _, k := range ks {
			set := map[string]any{}
			if k.ExpiresAt != nil { // nil: no hold
				set["expires_at"] = k.ExpiresAt.Add(-dur)
			}
			if k.ProtectedUntil != nil {
				set["protected_until"] = k.ProtectedUntil.Add(-dur)
			}
			if len(set) == 0 {
				continue
			}
			if err := tx.Model(&IdemKey{}).Where("id = ?", k.ID).Updates(set).Error; err != nil {
				return err
			}
		}
		var ops []Operation
		if err := ofKeys(tx.Select("id", "expires_at", "lease_expires_at", "purge_after")).Order("id").Find(&ops).Error; err != nil {
			return err
		}
		for _, op := range ops {
			set := map[string]any{"expires_at": op.ExpiresAt.Add(-dur)}
			if op.LeaseExpiresAt != nil {
				set["lease_expires_at"] = op.LeaseExpiresAt.Add(-dur)
			}
			if op.PurgeAfter != nil {
				set["purge_after"] = op.PurgeAfter.Add(-dur)
			}
			if err := tx.Model(&Operation{}).Where("id = ?", op.ID).Updates(set).Error; err != nil {
				return err
			}
		}
		return nil
	})
	return found, err
}
