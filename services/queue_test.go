package services

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// uncertainAt reads the stored uncertain_at of operation id.
func uncertainAt(t *testing.T, b *testBundle, id string) *time.Time {
	t.Helper()
	var m models.Operation
	require.NoError(t, b.db.Where("id = ?", id).Take(&m).Error)
	return m.UncertainAt
}

// TestReconciliationQueue: every path that makes an operation uncertain (a takeover of its
// expired key — PostgreSQL's acquire function or SQLite's Go transaction —, a reaper pass, the
// owner's "uncertain" outcome) sets uncertain_at, so ListOperations serves them all, superseded
// or not, oldest first; the count agrees with the Overview and the metric's query; a
// reconciled operation leaves the queue and keeps its uncertain_at as evidence.
func TestReconciliationQueue(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		count := func(want int) {
			t.Helper()
			ov, err := b.dash.Overview(bg, &b.p.TenantID)
			require.NoError(t, err)
			require.EqualValues(t, want, ov.NeedsReconciliation)
			byTenant, err := b.dash.NeedsReconciliationByTenant(bg)
			require.NoError(t, err)
			var name string
			require.NoError(t, b.db.Model(&models.Tenant{}).Where("id = ?", b.p.TenantID).Pluck("name", &name).Error)
			for _, tc := range byTenant {
				if tc.Tenant == name {
					require.EqualValues(t, want, tc.Count)
				}
			}
		}
		walk := func() []string {
			t.Helper()
			var ids []string
			f := OperationFilter{State: StateUncertain, Limit: 1}
			for {
				page, err := b.reads.ListOperations(bg, b.p.TenantID, f)
				require.NoError(t, err)
				for _, op := range page.Items {
					ids = append(ids, op.ID)
				}
				if page.NextCursor == "" {
					return ids
				}
				f.Cursor = page.NextCursor
			}
		}
		taken := mustAcquire(t, b, "taken", 1)
		reaped := mustAcquire(t, b, "reaped", 1)
		b.elapse(t, time.Second)
		mustAcquire(t, b, "taken", 60)
		_, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		unsure := mustAcquire(t, b, "unsure", 60)
		mustRecord(t, b, unsure, OutcomeInput{Status: StateUncertain})
		// Reporting uncertain again changes nothing, uncertain_at included.
		before := uncertainAt(t, b, unsure.OperationID)
		require.NotNil(t, before)
		mustRecord(t, b, unsure, OutcomeInput{Status: StateUncertain})
		require.True(t, before.Equal(*uncertainAt(t, b, unsure.OperationID)))

		want := []string{taken.OperationID, reaped.OperationID, unsure.OperationID}
		for _, id := range want {
			require.NotNil(t, uncertainAt(t, b, id), id)
		}
		require.Equal(t, want, walk())
		count(3)
		// The global queue holds every parallel test's uncertain operations on this shared
		// database, more than one page of them: walk it all (one page missed this tenant's).
		superseded := map[string]bool{}
		for f := (OperationFilter{Limit: MaxListLimit}); ; {
			page, err := b.dash.ReconciliationQueue(bg, nil, f)
			require.NoError(t, err)
			for _, q := range page.Items {
				if q.TenantID == b.p.TenantID {
					superseded[q.ID] = q.Superseded
					require.NotEmpty(t, q.TenantName)
					require.False(t, q.UncertainAt.IsZero())
				}
			}
			if page.NextCursor == "" {
				break
			}
			f.Cursor = page.NextCursor
		}
		require.Equal(t, map[string]bool{taken.OperationID: true, reaped.OperationID: false, unsure.OperationID: false}, superseded)

		// Another tenant sees none of them.
		other, err := b.reads.ListOperations(bg, otherTenant(t, b).TenantID, OperationFilter{State: StateUncertain})
		require.NoError(t, err)
		require.Empty(t, other.Items)

		mustRecord(t, b, taken, OutcomeInput{Status: StateSucceeded})
		require.Equal(t, want[1:], walk())
		count(2)
		require.NotNil(t, uncertainAt(t, b, taken.OperationID), "kept as evidence after reconciliation")
		// An operation never uncertain has none.
		var m models.Operation
		require.NoError(t, b.db.Where("tenant_id = ? AND key = ? AND fencing_token = 2", b.p.TenantID, "taken").Take(&m).Error)
		require.Nil(t, m.UncertainAt)
	})
}

func TestListOperationsRejectsBadInput(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for name, f := range map[string]OperationFilter{
			"no state":        {},
			"other state":     {State: StateFailed},
			"limit too large": {State: StateUncertain, Limit: MaxListLimit + 1},
			"negative limit":  {State: StateUncertain, Limit: -1},
			"bad cursor":      {State: StateUncertain, Cursor: "!!"},
			"keys cursor":     {State: StateUncertain, Cursor: encodeCursor(time.Now(), 7)},
		} {
			_, err := b.reads.ListOperations(bg, b.p.TenantID, f)
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}
	})
}
