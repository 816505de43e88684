package services

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestStormCountersStayExact sends a retry storm at one key (many goroutines, duplicates and
// conflicts mixed) and requires the operation's counters, as every read shows them, to equal
// the attempts logged.
func TestStormCountersStayExact(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		const workers, each = 32, 25
		holder, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "storm", TTLSeconds: 600, Fingerprint: ptr("fp")})
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < each; i++ {
					fp := "fp"
					if (w+i)%5 == 0 {
						fp = "other" // a conflict
					}
					acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "storm", TTLSeconds: 600, Fingerprint: &fp})
					if fp == "other" {
						if err != ErrFingerprintMismatch {
							errs <- fmt.Errorf("conflict answered %v, %v", acq, err)
							return
						}
						continue
					}
					if err != nil || acq.Admitted || acq.Operation.ID != holder.OperationID {
						errs <- fmt.Errorf("duplicate answered %+v, %v", acq, err)
						return
					}
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		var dup, conf int64
		require.NoError(t, b.db.Model(&models.Attempt{}).Where("operation_id = ? AND result = ?", holder.OperationID, ResultDuplicate).Count(&dup).Error)
		require.NoError(t, b.db.Model(&models.Attempt{}).Where("operation_id = ? AND result = ?", holder.OperationID, ResultConflict).Count(&conf).Error)
		require.EqualValues(t, workers*each, dup+conf)
		d, err := b.reads.GetOperation(bg, b.p.TenantID, holder.OperationID)
		require.NoError(t, err)
		require.Equal(t, [2]int64{dup, conf}, [2]int64{d.DuplicateAttempts, d.ConflictAttempts}, "GetOperation")
		k, err := b.reads.GetKey(bg, b.p.TenantID, "storm")
		require.NoError(t, err)
		require.Equal(t, [2]int64{dup, conf}, [2]int64{k.Operation.DuplicateAttempts, k.Operation.ConflictAttempts}, "GetKey")
		acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "storm", TTLSeconds: 600, Fingerprint: ptr("fp")})
		require.NoError(t, err)
		require.Equal(t, [2]int64{dup + 1, conf}, [2]int64{acq.Operation.DuplicateAttempts, acq.Operation.ConflictAttempts}, "the duplicate's own answer")
	})
}

// TestDuplicateTakesNoLockOnTheHolder holds the holder's operation row locked in an open
// transaction (as a release or an outcome does while it commits) and requires duplicate and
// conflicting acquires of the key to be answered anyway: a retry storm must not queue on the
// holder's row. PostgreSQL only: SQLite serialises every writer on the database's one lock.
// Whether an acquire waits on a lock is read from pg_stat_activity (any backend of the test's
// database waiting on a lock: only the acquire can be), not from a clock.
func TestDuplicateTakesNoLockOnTheHolder(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		holder, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "locked-holder", TTLSeconds: 600, Fingerprint: ptr("fp")})
		require.NoError(t, err)
		// Its own connection for watching pg_stat_activity: the test pool may be exhausted by
		// the locker and a waiting acquire.
		watch, err := pgx.ConnectConfig(bg, b.db.Pool.Config().ConnConfig.Copy())
		require.NoError(t, err)
		defer watch.Close(bg)
		locker := b.db.Begin()
		require.NoError(t, locker.Error)
		defer locker.Rollback()
		require.NoError(t, locker.Exec("SELECT 1 FROM operations WHERE id = ? FOR UPDATE", holder.OperationID).Error)

		for _, fp := range []string{"fp", "other"} {
			done := make(chan error, 1)
			go func() {
				_, err := b.adm.Acquire(context.Background(), b.p, AcquireInput{Key: "locked-holder", TTLSeconds: 600, Fingerprint: &fp})
				if err == ErrFingerprintMismatch {
					err = nil
				}
				done <- err
			}()
		wait:
			for {
				select {
				case err := <-done:
					require.NoError(t, err)
					break wait
				case <-time.After(20 * time.Millisecond):
					var n int64
					require.NoError(t, watch.QueryRow(bg,
						`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
						    AND wait_event_type = 'Lock'`).Scan(&n))
					if n > 0 {
						locker.Rollback() // let it finish, then fail
						t.Fatalf("acquire (fingerprint %q) waits on the holder's row lock", fp)
					}
				}
			}
		}
	})
}
