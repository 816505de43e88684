package services

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// Issue 32: the warning about a generation still in doubt must survive a later generation that
// did nothing. Op 1's TTL lapses without an outcome (uncertain); op 2 is admitted, warned about
// op 1, and released (it ran nothing) or records failed; op 3 must still be warned about op 1.
// Before the fix op 3's previous_operation was op 2 (released or failed), which is not a
// possible duplicate, so op 3 got no warning at all, and neither did its attempt_id retry, its
// batch twin or the webhook receiver: the uncertain effect vanished from the caller's sight.
func TestWarningSurvivesGenerationsWithoutEffect(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ep := newEndpoint(t, b, "https://warn.example/", EventPossibleDuplicateEffect)
		for _, end := range []string{"released", "failed"} {
			for _, via := range []string{"single", "batch"} {
				key := fmt.Sprintf("wg:%s:%s", end, via)
				op1 := mustAcquire(t, b, key, 1)
				b.elapse(t, time.Second, key)
				op2 := mustAcquire(t, b, key, 1)
				require.NotNil(t, op2.PreviousOperation, "%s: op 2 was not warned", key)
				require.Equal(t, op1.OperationID, op2.PreviousOperation.ID)
				if end == "released" {
					_, err := release(b, op2)
					require.NoError(t, err)
				} else {
					mustRecord(t, b, op2, OutcomeInput{Status: StateFailed})
					b.elapse(t, time.Second, key)
				}
				want := &PreviousOperation{ID: op1.OperationID, State: StateUncertain, FencingToken: 1}
				in := AcquireInput{Key: key, TTLSeconds: 60, AttemptID: ptr("try-3")}
				for round := 0; round < 2; round++ { // the admission, then its attempt_id retry
					var got *Acquisition
					if via == "single" {
						a, err := b.adm.Acquire(bg, b.p, in)
						require.NoError(t, err)
						got = a
					} else {
						out, err := b.adm.AcquireBatch(bg, b.p, []AcquireInput{in})
						require.NoError(t, err)
						require.NoError(t, out[0].Err)
						got = out[0].Acquisition
					}
					require.True(t, got.Admitted)
					require.Equal(t, int64(3), got.FencingToken)
					require.Equal(t, round == 1, got.Readmitted)
					require.Equal(t, want, got.PreviousOperation,
						"%s round %d: op 3 lost the warning about op 1 through op 2 (%s)", key, round, end)
				}

				// The outbox names op 1 too, as the event for op 3's admission.
				var evs []models.WebhookEvent
				require.NoError(t, b.db.Where("endpoint_id = ? AND op_key = ? AND op_fencing_token = 3",
					ep.Endpoint.ID, key).Find(&evs).Error)
				require.Len(t, evs, 1, key)
				require.NotNil(t, evs[0].PreviousOperationID)
				require.Equal(t, op1.OperationID, *evs[0].PreviousOperationID, key)
			}
		}

		// Once op 1 is reconciled failed, nothing is in doubt: the next admission after a
		// released generation carries no warning.
		key := "wg:reconciled"
		op1 := mustAcquire(t, b, key, 1)
		b.elapse(t, time.Second, key)
		op2 := mustAcquire(t, b, key, 60)
		_, err := release(b, op2)
		require.NoError(t, err)
		_, err = b.recon.ReconcileOutcome(bg, operatorAcct(RoleOperator, &b.p.TenantID), op1.OperationID,
			ReconcileInput{Status: StateFailed, Note: "not at the destination"})
		require.NoError(t, err)
		op3 := mustAcquire(t, b, key, 60)
		require.Nil(t, op3.PreviousOperation)

		// Of two generations in doubt, the newer is named.
		key = "wg:two"
		mustAcquire(t, b, key, 1)
		b.elapse(t, time.Second, key)
		op2 = mustAcquire(t, b, key, 1)
		b.elapse(t, time.Second, key)
		op3 = mustAcquire(t, b, key, 60)
		require.NotNil(t, op3.PreviousOperation)
		require.Equal(t, op2.OperationID, op3.PreviousOperation.ID)
	})
}
