package modeltest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
)

// Elapse lets d pass for one tenant's holds, without waiting (models.DB.Elapse, which says
// which deadlines move): the next acquire, renew, release, read or reaper pass finds each hold,
// TTL and lease as it would have after d of wall time. With keys named, only those keys move;
// with none, every key of the tenant.
//
// A clock offset for the whole database would move the clock of every test running in
// parallel on the package database. A tenant is one test's own (Tenant), so moving its
// deadlines moves that test's clock alone.
func Elapse(tb testing.TB, db *models.DB, tenantID int64, d time.Duration, keys ...string) {
	tb.Helper()
	if d <= 0 {
		tb.Fatalf("Elapse: %v is not a duration that can pass", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	found, err := db.Elapse(ctx, tenantID, d, keys...)
	if err != nil {
		tb.Fatalf("Elapse %v for tenant %d: %v", d, tenantID, err)
	}
	// A misspelt key fails the test instead of quietly leaving its hold in place.
	if distinct := len(slices.Compact(slices.Sorted(slices.Values(keys)))); found < distinct {
		tb.Fatalf("Elapse: tenant %d has %d of the keys %q", tenantID, found, keys)
	}
}
