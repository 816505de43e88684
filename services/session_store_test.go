package services

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// TestSessionStore covers the session storage the dashboard's session middleware uses: a
// value round-trips and is replaced, an expired or missing one reads as nil without error,
// and Delete and Reset remove rows. Reset removes every session, so the test runs on its own
// databases.
func TestSessionStore(t *testing.T) {
	t.Parallel()
	adminIsolated(t, func(t *testing.T, _ *Accounts, db *models.DB) {
		s := NewSessionStore(db).WithTimeout(30 * time.Second)
		require.NoError(t, s.Close(), "Close leaves the database to its owner")

		got, err := s.Get("missing")
		require.NoError(t, err)
		require.Nil(t, got)

		require.NoError(t, s.Set("a", []byte("one"), time.Hour))
		got, err = s.Get("a")
		require.NoError(t, err)
		require.Equal(t, []byte("one"), got)
		require.NoError(t, s.Set("a", []byte("two"), 0), "Set replaces, and 0 means no expiry")
		got, err = s.Get("a")
		require.NoError(t, err)
		require.Equal(t, []byte("two"), got)
		var row models.Session
		require.NoError(t, db.Where("id = ?", "a").Take(&row).Error)
		require.Nil(t, row.ExpiresAt)

		require.NoError(t, s.Set("short", []byte("x"), time.Millisecond))
		time.Sleep(20 * time.Millisecond)
		got, err = s.Get("short")
		require.NoError(t, err)
		require.Nil(t, got, "an expired session reads as none before the reaper deletes it")

		require.NoError(t, s.Delete("a"))
		require.NoError(t, s.Delete("a"), "deleting a missing key is not an error")
		got, err = s.Get("a")
		require.NoError(t, err)
		require.Nil(t, got)

		require.NoError(t, s.Set("b", []byte("b"), time.Hour))
		require.NoError(t, s.Reset())
		var n int64
		require.NoError(t, db.Model(&models.Session{}).Count(&n).Error)
		require.Zero(t, n, "Reset removes every session, expired ones too")
	})
}

// TestSessionStoreTimeout: WithTimeout ignores a non-positive deadline, which keeps the default.
func TestSessionStoreTimeout(t *testing.T) {
	s := NewSessionStore(nil)
	require.Equal(t, DefaultSessionStoreTimeout, s.timeout)
	require.Equal(t, DefaultSessionStoreTimeout, s.WithTimeout(0).timeout)
	require.Equal(t, time.Second, s.WithTimeout(time.Second).timeout)
}

// TestSessionStoreWritesDuringSQLiteStorm: signing in while acquires keep SQLite's write lock
// busy. Transactions of one process queue for the lock in order (models.DB.Tx); a session
// write outside that queue was left to SQLite's busy handler, which polls every 100 ms or so
// and found the lock free only in the gaps between queued transactions: with a 1 s deadline
// 1 to 13 of these 40 writes failed with SQLITE_BUSY in every run.
func TestSessionStoreWritesDuringSQLiteStorm(t *testing.T) {
	ctx := context.Background()
	db, err := models.Open(ctx, models.OpenOptions{SQLitePath: filepath.Join(t.TempDir(), "storm.db"), StoreTimeout: time.Second})
	require.NoError(t, err)
	defer db.Close()
	_, err = models.Migrate(ctx, db, nil)
	require.NoError(t, err)
	adm := NewAdmission(db, slog.New(slog.NewTextHandler(io.Discard, nil)), 0)
	p := Principal{TenantID: modeltest.Tenant(t, db), Prefix: "idg_testtest"}

	var stormOK, stormErrs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Errors are not this test's subject; the storm only keeps the lock busy.
				_, err := adm.Acquire(ctx, p, AcquireInput{Key: fmt.Sprintf("storm-%d", i%4), TTLSeconds: 60})
				if err != nil {
					stormErrs.Add(1)
				} else {
					stormOK.Add(1)
				}
			}
		}()
	}
	for stormOK.Load()+stormErrs.Load() < 50 { // the storm is on before the first session write
		runtime.Gosched()
	}
	s := NewSessionStore(db).WithTimeout(time.Second)
	var errs []error
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("session-%d", i)
		if err := s.Set(key, []byte("data"), time.Hour); err != nil {
			errs = append(errs, err)
		}
		if err := s.Delete(key); err != nil {
			errs = append(errs, err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("storm ok %d errs %d; session errors %d", stormOK.Load(), stormErrs.Load(), len(errs))
	require.Empty(t, errs)
	require.Zero(t, stormErrs.Load(), "the storm's own acquires")
}
