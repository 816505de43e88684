package services

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestAcquireBatchAnswersAsSingles runs one sequence of acquires twice, on two key spaces: one
// by one with Acquire, and as one AcquireBatch. Every item must get the answer its single
// acquire got (admitted, duplicate, conflict or invalid; fencing token; the operation a
// duplicate names, by position in the sequence), items with one key are decided in order, and
// every valid item is logged as an attempt.
func TestAcquireBatchAnswersAsSingles(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		// A key already held before the batch, and one whose hold expired.
		for _, space := range []string{"s-", "b-"} {
			_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: space + "held", TTLSeconds: 600, Fingerprint: ptr("x")})
			require.NoError(t, err)
			old, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: space + "expired", TTLSeconds: 600})
			require.NoError(t, err)
			require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key = ?", b.p.TenantID, space+"expired").
				Update("expires_at", old.ExpiresAt.Add(-700e9)).Error)
		}
		seq := []AcquireInput{
			{Key: "new-1", TTLSeconds: 60},
			{Key: "new-1", TTLSeconds: 60},                            // duplicate of the item before
			{Key: "new-1", TTLSeconds: 60, Fingerprint: ptr("other")}, // conflict with it
			{Key: "", TTLSeconds: 60},                                 // invalid: refused alone
			{Key: "held", TTLSeconds: 60, Fingerprint: ptr("x")},      // duplicate of the earlier hold
			{Key: "held", TTLSeconds: 60},                             // conflict
			{Key: "expired", TTLSeconds: 60},                          // takeover, fencing token 2
			{Key: "new-2", TTLSeconds: 0},                             // invalid ttl
			{Key: "new-2", TTLSeconds: 60, AttemptID: ptr("att")},     // admitted
			{Key: "new-2", TTLSeconds: 60, AttemptID: ptr("att")},     // its attempt_id retry: admitted again
		}
		with := func(space string, in AcquireInput) AcquireInput {
			if in.Key != "" {
				in.Key = space + in.Key
			}
			return in
		}
		type answer struct {
			Kind         string
			FencingToken int64
			State        string
		}
		summarise := func(acq *Acquisition, err error) answer {
			switch {
			case err == ErrFingerprintMismatch:
				return answer{Kind: "conflict"}
			case errors.Is(err, ErrInvalidRequest):
				return answer{Kind: "invalid"}
			case err != nil:
				return answer{Kind: "error " + err.Error()}
			case acq.Admitted && acq.Readmitted:
				return answer{"readmitted", acq.FencingToken, acq.State}
			case acq.Admitted:
				return answer{"admitted", acq.FencingToken, acq.State}
			}
			return answer{"duplicate", acq.Operation.FencingToken, acq.Operation.State}
		}
		var singles []answer
		for _, in := range seq {
			acq, err := b.adm.Acquire(bg, b.p, with("s-", in))
			singles = append(singles, summarise(acq, err))
		}
		batch := make([]AcquireInput, len(seq))
		for i, in := range seq {
			batch[i] = with("b-", in)
		}
		before := countRows(t, b).Attempts
		items, err := b.adm.AcquireBatch(bg, b.p, batch)
		require.NoError(t, err)
		require.Len(t, items, len(seq))
		var got []answer
		for _, it := range items {
			got = append(got, summarise(it.Acquisition, it.Err))
		}
		require.Equal(t, singles, got)
		var kinds []string
		for _, a := range got {
			kinds = append(kinds, a.Kind)
		}
		require.Equal(t, []string{"admitted", "duplicate", "conflict", "invalid", "duplicate", "conflict", "admitted",
			"invalid", "admitted", "readmitted"}, kinds)
		require.Equal(t, items[0].Acquisition.OperationID, items[1].Acquisition.Operation.ID, "the second item sees the first")
		require.Equal(t, items[8].Acquisition.OperationID, items[9].Acquisition.OperationID)
		require.Equal(t, before+8, countRows(t, b).Attempts, "every valid item is one attempt")

		_, err = b.adm.AcquireBatch(bg, b.p, nil)
		require.True(t, errors.Is(err, ErrInvalidRequest))
		_, err = b.adm.AcquireBatch(bg, b.p, make([]AcquireInput, MaxBatchItems+1))
		require.True(t, errors.Is(err, ErrInvalidRequest))
	})
}

// TestAcquireBatchLarge admits MaxBatchItems new keys in one batch.
func TestAcquireBatchLarge(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		items := make([]AcquireInput, MaxBatchItems)
		for i := range items {
			items[i] = AcquireInput{Key: fmt.Sprintf("large-%d", i), TTLSeconds: 60}
		}
		got, err := b.adm.AcquireBatch(bg, b.p, items)
		require.NoError(t, err)
		for i, it := range got {
			require.NoError(t, it.Err)
			require.True(t, it.Acquisition.Admitted, "item %d", i)
			require.Equal(t, items[i].Key, it.Acquisition.Key)
		}
	})
}
