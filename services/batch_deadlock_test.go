package services

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Issue 28 item 4: batches that share keys in different orders lock the key rows in one
// canonical order, so no two of them ever wait for each other. Every item here is the creating
// API key's attempt_id retry of an in_progress holder, the path that locks its key row until
// the batch commits; 16 callers send the same 10 keys shuffled. Before the canonical order
// PostgreSQL picked deadlock victims within a few rounds (each costing deadlock_timeout, 1 s,
// and after five a 503); now it must pick none. SQLite has one writer and no row locks.
func TestConcurrentBatchesNeverDeadlock(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		const nKeys, callers, rounds = 10, 16, 12
		items := make([]AcquireInput, nKeys)
		for i := range items {
			items[i] = AcquireInput{Key: fmt.Sprintf("dl:%d", i), TTLSeconds: 600, AttemptID: ptr(fmt.Sprintf("att-%d", i))}
			acq, err := b.adm.Acquire(bg, b.p, items[i])
			require.NoError(t, err)
			require.True(t, acq.Admitted)
		}
		before := deadlocks.Load()
		var wg sync.WaitGroup
		errs := make(chan error, callers*rounds)
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The first deadlock already fails the test; without the canonical order every
				// batch would go on paying deadlock_timeout for each victim, for minutes.
				for r := 0; r < rounds && deadlocks.Load() == before; r++ {
					batch := append([]AcquireInput(nil), items...)
					rand.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
					out, err := b.adm.AcquireBatch(bg, b.p, batch)
					if err != nil {
						errs <- err
						continue
					}
					for i, it := range out {
						switch {
						case it.Err != nil:
							errs <- it.Err
						case !it.Acquisition.Readmitted || it.Acquisition.Key != batch[i].Key:
							errs <- fmt.Errorf("item %d (%s): not its own retry: %+v", i, batch[i].Key, it.Acquisition)
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
		require.Zero(t, deadlocks.Load()-before, "deadlocks between batches")
	})
}
