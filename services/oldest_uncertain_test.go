package services

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestOldestUncertainAge: the overview and the metrics' per-tenant query report how long the
// oldest uncertain operation has been uncertain, 0 when none is, and a reconciled operation
// stops counting.
func TestOldestUncertainAge(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		name, err := b.dash.TenantName(bg, b.p.TenantID)
		require.NoError(t, err)
		ageOf := func() (time.Duration, time.Duration) {
			ov, err := b.dash.Overview(bg, &b.p.TenantID)
			require.NoError(t, err)
			counts, err := b.dash.NeedsReconciliationByTenant(bg)
			require.NoError(t, err)
			for _, c := range counts {
				if c.Tenant == name {
					return ov.OldestUncertainAge, c.OldestUncertainAge
				}
			}
			t.Fatalf("tenant %s not counted", name)
			return 0, 0
		}
		ov, m := ageOf()
		require.Zero(t, ov)
		require.Zero(t, m)

		old := mustAcquire(t, b, "age-old", 600)
		mustRecord(t, b, old, OutcomeInput{Status: StateUncertain})
		recent := mustAcquire(t, b, "age-recent", 600)
		mustRecord(t, b, recent, OutcomeInput{Status: StateUncertain})
		require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ?", old.OperationID).
			Update("uncertain_at", time.Now().UTC().Add(-3*time.Hour-12*time.Minute)).Error)
		ov, m = ageOf()
		for _, age := range []time.Duration{ov, m} {
			require.InDelta(t, (3*time.Hour + 12*time.Minute).Seconds(), age.Seconds(), 30)
		}

		_, err = b.recon.ReconcileOutcome(bg, &OperatorAccount{Username: "op", Role: RoleOperator}, old.OperationID,
			ReconcileInput{Status: StateFailed, Note: "no charge at the bank"})
		require.NoError(t, err)
		ov, m = ageOf()
		for _, age := range []time.Duration{ov, m} {
			require.Less(t, age, time.Minute, "the reconciled one no longer counts")
		}
	})
}
