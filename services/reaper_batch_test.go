package services

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// The reaper expires holds many to a transaction (reapTxBatch), locking their key rows in the
// order batch acquires lock theirs. Here a pass over 300 expired holds runs while 8 callers take
// the same keys over in shuffled batches (a takeover locks the key row, then marks the old
// operation uncertain, as the reaper does): no deadlock, and every old operation is expired
// exactly once, by whichever came first.
func TestReaperBatchesBesideBatchTakeovers(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		drain(t, b)
		const nKeys, callers, rounds, per = 300, 8, 6, 40
		items := make([]AcquireInput, nKeys)
		for i := range items {
			items[i] = AcquireInput{Key: fmt.Sprintf("reap-batch:%03d", i), TTLSeconds: 1}
		}
		first := map[string]string{} // key -> the operation the reaper or a takeover expires
		out, err := b.adm.AcquireBatch(bg, b.p, items)
		require.NoError(t, err)
		for i, it := range out {
			require.NoError(t, it.Err)
			require.True(t, it.Acquisition.Admitted)
			first[items[i].Key] = it.Acquisition.OperationID
		}
		b.elapse(t, time.Second)

		before := deadlocks.Load()
		var wg sync.WaitGroup
		var mu sync.Mutex
		again := map[string]bool{} // keys admitted again (fencing token 2), after the reaper or by a takeover
		errs := make(chan error, callers*rounds+1)
		wg.Add(1)
		var res ReapResult
		go func() {
			defer wg.Done()
			var err error
			if res, err = b.reaper.RunOnce(bg); err != nil {
				errs <- err
			}
		}()
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					batch := make([]AcquireInput, per)
					for i, j := range rand.Perm(nKeys)[:per] {
						batch[i] = AcquireInput{Key: items[j].Key, TTLSeconds: 600}
					}
					out, err := b.adm.AcquireBatch(bg, b.p, batch)
					if err != nil {
						errs <- err
						continue
					}
					for _, it := range out {
						if it.Err != nil {
							errs <- it.Err
						} else if it.Acquisition.Admitted && it.Acquisition.FencingToken == 2 {
							mu.Lock()
							if again[it.Acquisition.Key] {
								errs <- fmt.Errorf("%s admitted twice at fencing token 2", it.Acquisition.Key)
							}
							again[it.Acquisition.Key] = true
							mu.Unlock()
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Zero(t, deadlocks.Load()-before, "deadlocks between the reaper and batches")
		// The reaper scanned every expired hold, so a key no batch admitted again was reaped.
		require.GreaterOrEqual(t, res.HoldsExpired, int64(nKeys-len(again)), "reaped %d, admitted again %d", res.HoldsExpired, len(again))
		require.LessOrEqual(t, res.HoldsExpired, int64(nKeys))
		require.EqualValues(t, res.HoldsExpired, res.MarkedUncertain)
		for key, opID := range first {
			m := opRow(t, b, opID)
			require.Equal(t, StateUncertain, m.State, key)
			var events int64
			require.NoError(t, b.db.Model(&models.Event{}).Where("operation_id = ?", opID).Count(&events).Error)
			require.EqualValues(t, 1, events, "%s: expired once", key)
			if k := keyRow(t, b, key); !again[key] {
				require.Nil(t, k.HolderOperationID, key)
			}
		}
	})
}

// One purge pass walks the candidates in batches, each scan going on from where the last
// ended (keyset on ended_at, id), past operations it must keep: here more than two batches
// of released operations and every tenth a failed one still holding its key, all ended at the
// same instant, so that the walk's order rests on the id alone.
func TestPurgeWalksEveryBatchPastKeptOperations(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		drain(t, b)
		n := 2*newStore(b.db).purgeBatch() + 50
		items := make([]AcquireInput, 0, MaxBatchItems)
		for i := 0; i < n; i++ {
			items = append(items, AcquireInput{Key: fmt.Sprintf("purge-walk:%05d", i), TTLSeconds: 600})
			if len(items) == MaxBatchItems || i == n-1 {
				out, err := b.adm.AcquireBatch(bg, b.p, items)
				require.NoError(t, err)
				for _, it := range out {
					require.NoError(t, it.Err)
				}
				items = items[:0]
			}
		}
		old := time.Now().UTC().Add(-DefaultRetention - time.Hour)
		ended := b.db.Model(&models.Operation{}).Where("tenant_id = ? AND key LIKE 'purge-walk:%'", b.p.TenantID)
		require.NoError(t, ended.Session(&gorm.Session{}).Where("key NOT LIKE '%0'").
			Updates(map[string]any{"state": StateReleased, "ended_at": old}).Error)
		require.NoError(t, ended.Session(&gorm.Session{}).Where("key LIKE '%0'").
			Updates(map[string]any{"state": StateFailed, "ended_at": old}).Error)
		require.NoError(t, b.db.Model(&models.IdemKey{}).
			Where("tenant_id = ? AND key LIKE 'purge-walk:%' AND key NOT LIKE '%0'", b.p.TenantID).
			Updates(map[string]any{"holder_operation_id": nil, "expires_at": nil}).Error)

		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		kept := (n + 9) / 10
		require.EqualValues(t, n-kept, res.OperationsPurged)
		var left []string
		require.NoError(t, b.db.Model(&models.Operation{}).Where("tenant_id = ? AND key LIKE 'purge-walk:%'", b.p.TenantID).
			Order("key").Pluck("key", &left).Error)
		require.Len(t, left, kept)
		for _, k := range left {
			require.True(t, strings.HasSuffix(k, "0"), "%s was kept: it does not hold its key", k)
		}
	})
}

// One reaper pass clears a backlog of expired holds larger than its scan, each scan going on
// from where the last ended (keyset on expires_at, id): here more than two scans' worth, all
// expired at the same instant, so that the walk's order rests on the key row id alone.
func TestReaperClearsABacklogInOnePass(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		drain(t, b)
		n := 2*reapBatch + 100
		items := make([]AcquireInput, 0, MaxBatchItems)
		for i := 0; i < n; i++ {
			items = append(items, AcquireInput{Key: fmt.Sprintf("backlog:%05d", i), TTLSeconds: 600})
			if len(items) == MaxBatchItems || i == n-1 {
				out, err := b.adm.AcquireBatch(bg, b.p, items)
				require.NoError(t, err)
				for _, it := range out {
					require.NoError(t, it.Err)
				}
				items = items[:0]
			}
		}
		past := time.Now().UTC().Add(-time.Minute)
		require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key LIKE 'backlog:%'", b.p.TenantID).
			Update("expires_at", past).Error)

		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		// At least: the reaper works on every tenant, and a hold another test left may expire
		// during the pass.
		require.GreaterOrEqual(t, res.HoldsExpired, int64(n))
		require.GreaterOrEqual(t, res.MarkedUncertain, int64(n))
		var uncertain int64
		require.NoError(t, b.db.Model(&models.Operation{}).
			Where("tenant_id = ? AND key LIKE 'backlog:%' AND state = ?", b.p.TenantID, StateUncertain).Count(&uncertain).Error)
		require.EqualValues(t, n, uncertain)
		var held int64
		require.NoError(t, b.db.Model(&models.IdemKey{}).
			Where("tenant_id = ? AND key LIKE 'backlog:%' AND holder_operation_id IS NOT NULL", b.p.TenantID).Count(&held).Error)
		require.Zero(t, held)
	})
}
