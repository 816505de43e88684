package modeltest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Elapse lets d pass for one tenant's holds, without waiting: every deadline the expiry rules
// compare with the database's clock comes d sooner, so the next acquire, renew, release, read
// or reaper pass finds each hold, TTL and lease as it would have after d of wall time. With
// keys named, only those keys move; with none, every key of the tenant.
//
// The deadlines are the key row's expires_at (the hold: acquires and the reaper compare it)
// and protected_until (its horizon), and, for each operation of the key, expires_at (its TTL:
// Held, hold_until_reconciled), lease_expires_at (its lease: lapses to uncertain) and
// purge_after (its retention: the reaper purges it). Times of what happened (acquired_at, the
// attempts, the events, outcome and release times) keep their values: they are evidence, and
// the audit and the hourly counters are built from them.
//
// Expiry runs on the database's clock (PostgreSQL's clock_timestamp(), SQLite's Go clock), so
// a test cannot move time by faking a Go clock, and a clock offset for the whole database
// would move the clock of every test running in parallel on the package database. A tenant
// is one test's own (Tenant), so moving its deadlines moves that test's clock alone.
func Elapse(tb testing.TB, db *models.DB, tenantID int64, d time.Duration, keys ...string) {
	tb.Helper()
	if d <= 0 {
		tb.Fatalf("Elapse: %v is not a duration that can pass", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var found int
	err := db.Tx(ctx, func(tx *gorm.DB) error {
		// The key rows first and then the operations, locked, as every writer takes them, so a
		// reaper pass or an acquire running meanwhile waits instead of deadlocking.
		ofKeys := func(q *gorm.DB) *gorm.DB {
			q = q.Where("tenant_id = ?", tenantID)
			if len(keys) > 0 {
				q = q.Where("key IN ?", keys)
			}
			if db.Dialect == models.Postgres {
				q = q.Clauses(clause.Locking{Strength: "UPDATE"})
			}
			return q
		}
		var ks []models.IdemKey
		if err := ofKeys(tx.Select("id", "expires_at", "protected_until")).Order("tenant_id, key").Find(&ks).Error; err != nil {
			return err
		}
		found = len(ks)
		for _, k := range ks {
			set := map[string]any{}
			if k.ExpiresAt != nil { // nil: no hold
				set["expires_at"] = k.ExpiresAt.Add(-d)
			}
			if k.ProtectedUntil != nil {
				set["protected_until"] = k.ProtectedUntil.Add(-d)
			}
			if len(set) == 0 {
				continue
			}
			if err := tx.Model(&models.IdemKey{}).Where("id = ?", k.ID).Updates(set).Error; err != nil {
				return err
			}
		}
		var ops []models.Operation
		if err := ofKeys(tx.Select("id", "expires_at", "lease_expires_at", "purge_after")).Order("id").Find(&ops).Error; err != nil {
			return err
		}
		for _, op := range ops {
			set := map[string]any{"expires_at": op.ExpiresAt.Add(-d)}
			if op.LeaseExpiresAt != nil {
				set["lease_expires_at"] = op.LeaseExpiresAt.Add(-d)
			}
			if op.PurgeAfter != nil {
				set["purge_after"] = op.PurgeAfter.Add(-d)
			}
			if err := tx.Model(&models.Operation{}).Where("id = ?", op.ID).Updates(set).Error; err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("Elapse %v for tenant %d: %v", d, tenantID, err)
	}
	// A misspelt key fails the test instead of quietly leaving its hold in place.
	if distinct := len(slices.Compact(slices.Sorted(slices.Values(keys)))); found < distinct {
		tb.Fatalf("Elapse: tenant %d has %d of the keys %q", tenantID, found, keys)
	}
}
