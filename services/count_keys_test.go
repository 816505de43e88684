package services

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCountKeysCapped: CountKeys is exact up to KeyCountCap and says "more" past it, under the
// same filters as the list, over one tenant or all of them.
func TestCountKeysCapped(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		first := mustAcquire(t, b, "count-first", 60)
		mustAcquire(t, b, "count-second", 60)
		n, err := b.dash.CountKeys(bg, &b.p.TenantID, KeyFilter{})
		require.NoError(t, err)
		require.Equal(t, KeyCount{N: 2}, n)
		n, err = b.dash.CountKeys(bg, &b.p.TenantID, KeyFilter{KeyPrefix: "count-f"})
		require.NoError(t, err)
		require.Equal(t, KeyCount{N: 1}, n)
		n, err = b.dash.CountKeys(bg, &b.p.TenantID, KeyFilter{State: StateSucceeded})
		require.NoError(t, err)
		require.Equal(t, KeyCount{N: 0}, n)

		// KeyCountCap more keys, written straight to the table (admitting them one by one
		// would take minutes): the count stops at the cap.
		require.NoError(t, b.db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
			WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
			SELECT ?, 'bulk-' || i, 1, ?, ? FROM n`, KeyCountCap, b.p.TenantID, first.OperationID, time.Now().UTC()).Error)
		n, err = b.dash.CountKeys(bg, &b.p.TenantID, KeyFilter{})
		require.NoError(t, err)
		require.Equal(t, KeyCount{N: KeyCountCap, Capped: true}, n)
		n, err = b.dash.CountKeys(bg, nil, KeyFilter{})
		require.NoError(t, err)
		require.True(t, n.Capped, "every tenant")
		n, err = b.dash.CountKeys(bg, &b.p.TenantID, KeyFilter{KeyPrefix: "count-"})
		require.NoError(t, err)
		require.Equal(t, KeyCount{N: 2}, n, "a filter is counted exactly below the cap")
		other := otherTenant(t, b).TenantID
		n, err = b.dash.CountKeys(bg, &other, KeyFilter{})
		require.NoError(t, err)
		require.Equal(t, KeyCount{}, n)
	})
}
