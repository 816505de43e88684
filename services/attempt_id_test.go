package services

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// newestAttempt returns "result:attempt_id:caller" of the newest attempt logged for key.
func newestAttempt(t *testing.T, b *testBundle, key string) string {
	t.Helper()
	page, err := b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Key: key})
	require.NoError(t, err)
	require.NotEmpty(t, page.Items)
	a := page.Items[0]
	return a.Result + ":" + deref(a.AttemptID) + ":" + a.Caller
}

// A 201 means "you may run the effect now", so an attempt_id retry of an operation that
// already has an outcome, whoever set it, is an ordinary duplicate: 200 with the operation,
// no owner token, the holder's token untouched, logged as a duplicate attempt.
func TestAttemptIDRetryAfterOutcomeIsDuplicate(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, &b.p.TenantID)
		cases := []struct {
			name  string
			state string
			set   func(acq *Acquisition)
		}{
			{"owner succeeded", StateSucceeded, func(acq *Acquisition) {
				mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded, Receipt: ptr("ch_1")})
			}},
			{"owner failed, hold kept", StateFailed, func(acq *Acquisition) {
				mustRecord(t, b, acq, OutcomeInput{Status: StateFailed})
			}},
			{"owner uncertain", StateUncertain, func(acq *Acquisition) {
				mustRecord(t, b, acq, OutcomeInput{Status: StateUncertain})
			}},
			{"operator failed", StateFailed, func(acq *Acquisition) {
				_, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, ReconcileInput{Status: StateFailed, Note: "declined"})
				require.NoError(t, err)
			}},
			{"operator succeeded", StateSucceeded, func(acq *Acquisition) {
				_, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, ReconcileInput{Status: StateSucceeded, Note: "seen at the PSP"})
				require.NoError(t, err)
			}},
		}
		for i, tc := range cases {
			key := fmt.Sprintf("retry-after-outcome-%d", i)
			in := AcquireInput{Key: key, TTLSeconds: 60, Operation: ptr("charge"), Fingerprint: ptr("fp"), AttemptID: ptr("att-1")}
			first, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
			require.True(t, first.Admitted)
			tc.set(first)
			hash := opRow(t, b, first.OperationID).OwnerTokenHash

			again, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err, tc.name)
			require.False(t, again.Admitted, "%s: a retry after the outcome must not be told to run the effect", tc.name)
			require.Empty(t, again.OwnerToken, tc.name)
			require.NotNil(t, again.Operation, tc.name)
			require.Equal(t, first.OperationID, again.Operation.ID, tc.name)
			require.Equal(t, tc.state, again.Operation.State, tc.name)
			require.NotNil(t, again.Operation.Outcome, tc.name)
			require.EqualValues(t, 1, again.Operation.DuplicateAttempts, tc.name)
			require.Equal(t, hash, opRow(t, b, first.OperationID).OwnerTokenHash, "%s: no new owner token", tc.name)
			require.Equal(t, "duplicate:att-1:"+b.p.Prefix, newestAttempt(t, b, key), tc.name)
		}

		// Released: the key is free, so the same attempt_id is a new admission of a new
		// operation, in progress, with the next fencing token: still "run it now" and true.
		in := AcquireInput{Key: "retry-after-release", TTLSeconds: 60, AttemptID: ptr("att-r")}
		first, err := b.adm.Acquire(bg, b.p, in)
		require.NoError(t, err)
		_, err = release(b, first)
		require.NoError(t, err)
		again, err := b.adm.Acquire(bg, b.p, in)
		require.NoError(t, err)
		require.True(t, again.Admitted)
		require.False(t, again.Readmitted)
		require.NotEqual(t, first.OperationID, again.OperationID)
		require.Equal(t, StateInProgress, again.State)
		require.EqualValues(t, 2, again.FencingToken)
	})
}

// An outcome racing an attempt_id retry: the retry is admitted only while the operation is in
// progress, never with another state, and once the outcome is committed every retry is a
// duplicate. Run as many rounds of the race as the test budget allows (counts, not time).
func TestAttemptIDRetryRacingOutcomeNeverAdmitsAnOutcome(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		const rounds, retriers = 20, 4
		admittedInProgress, duplicates := 0, 0
		for r := 0; r < rounds; r++ {
			in := AcquireInput{Key: fmt.Sprintf("race-%d", r), TTLSeconds: 60, AttemptID: ptr("att")}
			first, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
			var wg sync.WaitGroup
			results := make([]*Acquisition, retriers)
			errs := make([]error, retriers+1)
			wg.Add(retriers + 1)
			go func() {
				defer wg.Done()
				// The owner token may be replaced by a concurrent retry; the operator path
				// needs none and records the outcome regardless.
				_, errs[retriers] = b.recon.ReconcileOutcome(bg, operatorAcct(RoleOperator, &b.p.TenantID),
					first.OperationID, ReconcileInput{Status: StateSucceeded, Note: "race"})
			}()
			for i := 0; i < retriers; i++ {
				go func() {
					defer wg.Done()
					results[i], errs[i] = b.adm.Acquire(bg, b.p, in)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "round %d goroutine %d", r, i)
			}
			for _, res := range results {
				if res.Admitted {
					require.Equal(t, StateInProgress, res.State, "round %d: a 201 with state %s", r, res.State)
					require.Equal(t, first.OperationID, res.OperationID)
					admittedInProgress++
				} else {
					require.Equal(t, first.OperationID, res.Operation.ID)
					require.Equal(t, StateSucceeded, res.Operation.State)
					duplicates++
				}
			}
			after, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
			require.False(t, after.Admitted, "round %d: a retry after the committed outcome", r)
		}
		require.Equal(t, rounds*retriers, admittedInProgress+duplicates)
		t.Logf("%d retries admitted while in progress, %d answered duplicate after the outcome", admittedInProgress, duplicates)
	})
}

// attempt_id is no credential: an attempt_id retry is honoured only for the API key that
// created the hold. Any other key of the tenant (which can read the attempt_id from the
// attempt log) gets what it would get without one: a duplicate, or a fingerprint mismatch,
// and never a new owner token.
func TestAttemptIDIsBoundToTheCreatingAPIKey(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		pa, pb := b.p, b.p
		pa.APIKeyID, pa.Prefix = 101, "idg_keyaaaaa"
		pb.APIKeyID, pb.Prefix = 202, "idg_keybbbbb"
		in := AcquireInput{Key: "bound-1", TTLSeconds: 60, Operation: ptr("charge"), Fingerprint: ptr("fp"), AttemptID: ptr("X")}
		first, err := b.adm.Acquire(bg, pa, in)
		require.NoError(t, err)
		require.True(t, first.Admitted)
		hash := opRow(t, b, first.OperationID).OwnerTokenHash

		stolen, err := b.adm.Acquire(bg, pb, in)
		require.NoError(t, err)
		require.False(t, stolen.Admitted, "another API key replaying the attempt_id must not be admitted")
		require.Empty(t, stolen.OwnerToken)
		require.Equal(t, first.OperationID, stolen.Operation.ID)
		require.Equal(t, hash, opRow(t, b, first.OperationID).OwnerTokenHash, "no new owner token")
		require.Equal(t, "duplicate:X:idg_keybbbbb", newestAttempt(t, b, "bound-1"))

		mismatch := in
		mismatch.Fingerprint = ptr("fp2")
		_, err = b.adm.Acquire(bg, pb, mismatch)
		require.ErrorIs(t, err, ErrFingerprintMismatch)

		// The same key may still retry, and the real owner's token keeps working.
		again, err := b.adm.Acquire(bg, pa, in)
		require.NoError(t, err)
		require.True(t, again.Admitted)
		require.True(t, again.Readmitted)
		require.Equal(t, first.OperationID, again.OperationID)
		op, err := b.adm.RecordOutcome(bg, pa, first.OperationID, OutcomeInput{OwnerToken: again.OwnerToken, Status: StateFailed})
		require.NoError(t, err)
		require.Equal(t, StateFailed, op.State)
		op, err = b.adm.Release(bg, pa, ReleaseInput{Key: "bound-1", OwnerToken: again.OwnerToken})
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)

		// And with no replay in between, the first owner token works as issued.
		first2, err := b.adm.Acquire(bg, pa, AcquireInput{Key: "bound-2", TTLSeconds: 60, AttemptID: ptr("Y")})
		require.NoError(t, err)
		_, err = b.adm.Acquire(bg, pb, AcquireInput{Key: "bound-2", TTLSeconds: 60, AttemptID: ptr("Y")})
		require.NoError(t, err)
		_, err = b.adm.Release(bg, pa, ReleaseInput{Key: "bound-2", OwnerToken: first2.OwnerToken})
		require.NoError(t, err, "the owner's token must survive another key's replay")

		require.Equal(t, int64(101), deref(opRow(t, b, first.OperationID).APIKeyID), "the creating API key is stored")
	})
}
