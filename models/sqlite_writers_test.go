package models_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// TestSQLiteWritersQueueInOrder: many goroutines writing through DB.Tx at once on SQLite all
// commit, none failing with SQLITE_BUSY while the others' transactions are short. Before
// transactions queued in Go (DB.writer) they contended in SQLite's busy handler, which serves
// no one in order: with a 1 s store timeout (busy_timeout follows it) 1 to 4 of these 960
// transactions, each holding the lock for milliseconds, failed in every run; one such failure
// turned a CI run red (a 32-goroutine retry storm on one key, 10 s busy_timeout).
func TestSQLiteWritersQueueInOrder(t *testing.T) {
	const workers, each = 32, 30
	db, err := models.Open(context.Background(), models.OpenOptions{
		SQLitePath: filepath.Join(t.TempDir(), "writers.db"), StoreTimeout: time.Second})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Exec("CREATE TABLE w (id INTEGER PRIMARY KEY, seen INTEGER NOT NULL)").Error)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errs    []error
		longest time.Duration
	)
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				start := time.Now()
				// A read then a write that depends on it, as an acquire does.
				err := db.Tx(context.Background(), func(tx *gorm.DB) error {
					var n int64
					if err := tx.Raw("SELECT count(*) FROM w").Scan(&n).Error; err != nil {
						return err
					}
					return tx.Exec("INSERT INTO w (seen) VALUES (?)", n).Error
				})
				mu.Lock()
				longest = max(longest, time.Since(start))
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("longest transaction, waiting included: %s", longest)
	require.Empty(t, errs)
	// Serialised: each transaction saw every one committed before it, so seen runs 0..n-1.
	var n, distinct int64
	require.NoError(t, db.Raw("SELECT count(*), count(DISTINCT seen) FROM w").Row().Scan(&n, &distinct))
	require.EqualValues(t, workers*each, n)
	require.Equal(t, n, distinct)
}
