package models_test

// Behind PgBouncer in transaction pooling mode a client connection gets whichever server
// connection is free for each transaction, so nothing tied to a server session survives from one
// transaction to the next: not named prepared statements, not session advisory locks. These
// tests start a real pgbouncer (Debian's package; .ci/pgbouncer.sh installs it, and so does the
// test itself when missing and running as root) in front of the test PostgreSQL and use
// idemgate through it exactly as configured by default.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// freshDB creates an empty PostgreSQL database for this test alone and returns its direct URL.
// Create databases before starting pgbouncer: cleanups run last-in first-out, and dropping a
// database that pgbouncer still holds server connections to takes seconds.
func freshDB(t *testing.T) string {
	t.Helper()
	u, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	return u
}

func openDB(t *testing.T, dbURL string) *models.DB {
	t.Helper()
	db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: dbURL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestPgBouncerConcurrentAcquires: 48 concurrent acquires (12 keys, 4 callers each) through
// PgBouncer in transaction mode, by an idemgate configured by default (DATABASE_URL names only
// the database), all succeed and admit exactly one caller per key. pgx's default statement
// cache names prepared statements per client connection; behind the pooler another client's
// server connection already has that name (42P05) or lacks it (26000), which answered 500.
func TestPgBouncerConcurrentAcquires(t *testing.T) {
	direct := freshDB(t)
	bouncer := modeltest.StartPgBouncer(t, 4)
	// The schema is laid directly: this test is about the acquires; migrating through the
	// pooler is TestPgBouncerConcurrentMigrations.
	mig := openDB(t, direct)
	_, err := models.Migrate(context.Background(), mig, nil)
	require.NoError(t, err)

	db := openDB(t, bouncer.Through(t, direct))
	// The pooler is detected, so statements go unnamed through it; a direct connection keeps
	// the faster named prepared statements.
	require.Equal(t, "cache_describe", db.QueryExecMode())
	require.Equal(t, "cache_statement", mig.QueryExecMode())
	adm := services.NewAdmission(db, slog.New(slog.DiscardHandler), 0)
	p := services.Principal{TenantID: modeltest.Tenant(t, db), Prefix: "idg_pgbouncer"}

	const keys, callers = 12, 4
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted = map[string]int{}
		errs     []error
		start    = make(chan struct{})
	)
	for k := range keys {
		for range callers {
			wg.Go(func() {
				<-start
				key := fmt.Sprintf("bouncer-%d", k)
				acq, err := adm.Acquire(context.Background(), p, services.AcquireInput{Key: key, TTLSeconds: 60})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				if acq.Admitted {
					admitted[key]++
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d acquires through PgBouncer failed; the first: %v", len(errs), keys*callers, errs[0])
	}
	for k := range keys {
		require.Equal(t, 1, admitted[fmt.Sprintf("bouncer-%d", k)], "admitted for key bouncer-%d", k)
	}
}

// TestPgBouncerConcurrentMigrations: two instances starting at once on a fresh database, both
// through PgBouncer in transaction mode, both migrate without error and every migration runs
// exactly once (one row per version in goose's version table). A session advisory lock does
// not hold across pooled connections: the lock and the unlock may land on different server
// sessions, and a second instance may find the lock already "held" by its own server session.
// Several rounds, each on a fresh database, because which interleaving happens varies.
func TestPgBouncerConcurrentMigrations(t *testing.T) {
	var fresh []string
	for range 3 {
		fresh = append(fresh, freshDB(t))
	}
	bouncer := modeltest.StartPgBouncer(t, 4)
	for round, direct := range fresh {
		a, b := openDB(t, bouncer.Through(t, direct)), openDB(t, bouncer.Through(t, direct))
		var (
			wg      sync.WaitGroup
			applied [2]int
			errs    [2]error
			start   = make(chan struct{})
		)
		for i, db := range []*models.DB{a, b} {
			wg.Go(func() {
				<-start
				applied[i], errs[i] = models.Migrate(context.Background(), db, slog.New(slog.NewTextHandler(io.Discard, nil)))
			})
		}
		close(start)
		wg.Wait()
		require.NoError(t, errs[0], "round %d: first instance", round)
		require.NoError(t, errs[1], "round %d: second instance", round)

		check := openDB(t, direct)
		var rows []struct {
			VersionID int64
			N         int
		}
		require.NoError(t, check.Raw(`SELECT version_id, count(*) AS n FROM goose_db_version
			WHERE version_id > 0 GROUP BY version_id ORDER BY version_id`).Scan(&rows).Error)
		require.NotEmpty(t, rows)
		for _, r := range rows {
			require.Equal(t, 1, r.N, "round %d: migration %d recorded %d times", round, r.VersionID, r.N)
		}
		require.Equal(t, len(rows), applied[0]+applied[1], "round %d: migrations applied by the two instances", round)

		// A later instance starting through the pooler finds nothing to do and starts.
		n, err := models.Migrate(context.Background(), openDB(t, bouncer.Through(t, direct)), nil)
		require.NoError(t, err, "round %d: a third instance", round)
		require.Zero(t, n)
	}
}
