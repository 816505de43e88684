package services

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOverviewCountsAndHours(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		// One of each: in_progress (with a duplicate and a conflict), succeeded, failed (released
		// with it), released, and uncertain (expired, then re-acquired: in_progress again).
		prog := mustAcquire(t, b, "prog", 60)
		dup, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "prog", TTLSeconds: 60})
		require.NoError(t, err)
		require.False(t, dup.Admitted)
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "prog", TTLSeconds: 60, Fingerprint: ptr("other")})
		require.ErrorIs(t, err, ErrFingerprintMismatch)
		mustRecord(t, b, mustAcquire(t, b, "ok", 60), OutcomeInput{Status: StateSucceeded})
		mustRecord(t, b, mustAcquire(t, b, "bad", 60), OutcomeInput{Status: StateFailed})
		_, err = release(b, mustAcquire(t, b, "rel", 60))
		require.NoError(t, err)
		mustAcquire(t, b, "late", 1)
		b.elapse(t, time.Second)
		mustAcquire(t, b, "late", 60)
		_ = prog

		// Another tenant's operations are not counted.
		other := otherTenant(t, b)
		_, err = b.adm.Acquire(bg, other, AcquireInput{Key: "prog", TTLSeconds: 60})
		require.NoError(t, err)

		ov, err := b.dash.Overview(bg, &b.p.TenantID)
		require.NoError(t, err)
		require.Equal(t, []StateCount{
			{StateInProgress, 2}, {StateUncertain, 1}, {StateSucceeded, 1},
			{StateFailed, 1}, {StateReleased, 1},
		}, ov.Counts)
		require.EqualValues(t, 1, ov.NeedsReconciliation)
		require.WithinDuration(t, time.Now(), ov.Now, 5*time.Second)

		require.Len(t, ov.Hours, 24)
		for i, h := range ov.Hours {
			require.Equal(t, time.UTC, h.Start.Location())
			require.Zero(t, h.Start.Sub(h.Start.Truncate(time.Hour)), "bucket %d starts on the hour", i)
			if i > 0 {
				require.Equal(t, time.Hour, h.Start.Sub(ov.Hours[i-1].Start))
			}
		}
		last := ov.Hours[23]
		require.False(t, ov.Now.Before(last.Start))
		require.True(t, ov.Now.Before(last.Start.Add(time.Hour)))
		var admitted, dups, conflicts int64
		for _, h := range ov.Hours {
			admitted, dups, conflicts = admitted+h.Admitted, dups+h.Duplicates, conflicts+h.Conflicts
		}
		// All attempts were made seconds ago, though possibly on both sides of an hour boundary.
		require.EqualValues(t, 6, admitted)
		require.EqualValues(t, 1, dups)
		require.EqualValues(t, 1, conflicts)
		require.EqualValues(t, 6, last.Admitted+ov.Hours[22].Admitted)

		// A global view counts at least this tenant's operations too.
		all, err := b.dash.Overview(bg, nil)
		require.NoError(t, err)
		require.GreaterOrEqual(t, all.Counts[0].Count, int64(3))
	})
}

func TestOverviewEmptyTenantHasZeros(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ov, err := b.dash.Overview(bg, &b.p.TenantID)
		require.NoError(t, err)
		require.Len(t, ov.Counts, 5)
		for _, c := range ov.Counts {
			require.Zero(t, c.Count, c.State)
		}
		require.Zero(t, ov.NeedsReconciliation)
		require.Len(t, ov.Hours, 24)
	})
}
