package services

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Issue 28 item 1: an attempt_id retry answers what the first answer said, previous_operation
// included (docs/reference.md §4): the retry exists for a caller that lost the first answer, and
// without the warning it would run an effect that already happened. Single and batch, on a key
// whose earlier generation succeeded and on one whose earlier generation went uncertain.
func TestAttemptIDRetryKeepsPreviousOperation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		succ := mustAcquire(t, b, "rp:succeeded", 1)
		mustRecord(t, b, succ, OutcomeInput{Status: StateSucceeded, Receipt: ptr("rcpt-1")})
		unc := mustAcquire(t, b, "rp:uncertain", 1) // its TTL lapses without an outcome
		bs := mustAcquire(t, b, "rp:batch-succeeded", 1)
		mustRecord(t, b, bs, OutcomeInput{Status: StateSucceeded, Receipt: ptr("rcpt-b")})
		bu := mustAcquire(t, b, "rp:batch-uncertain", 1)
		b.elapse(t, time.Second)

		for _, c := range []struct {
			key  string
			want *PreviousOperation
		}{
			{"rp:succeeded", &PreviousOperation{ID: succ.OperationID, State: StateSucceeded, FencingToken: 1,
				OutcomeStatus: ptr(StateSucceeded), OutcomeReceipt: ptr("rcpt-1")}},
			{"rp:uncertain", &PreviousOperation{ID: unc.OperationID, State: StateUncertain, FencingToken: 1}},
		} {
			in := AcquireInput{Key: c.key, TTLSeconds: 60, AttemptID: ptr("try-1")}
			first, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
			require.True(t, first.Admitted)
			require.Equal(t, c.want, first.PreviousOperation, c.key)
			again, err := b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
			require.True(t, again.Readmitted)
			require.Equal(t, first.OperationID, again.OperationID)
			require.Equal(t, c.want, again.PreviousOperation, "%s: the retry lost its warning", c.key)
		}

		items := []AcquireInput{
			{Key: "rp:batch-succeeded", TTLSeconds: 60, AttemptID: ptr("b-1")},
			{Key: "rp:batch-uncertain", TTLSeconds: 60, AttemptID: ptr("b-2")},
		}
		want := []*PreviousOperation{
			{ID: bs.OperationID, State: StateSucceeded, FencingToken: 1, OutcomeStatus: ptr(StateSucceeded), OutcomeReceipt: ptr("rcpt-b")},
			{ID: bu.OperationID, State: StateUncertain, FencingToken: 1},
		}
		for round := 0; round < 2; round++ { // the first answer, then its retry
			out, err := b.adm.AcquireBatch(bg, b.p, items)
			require.NoError(t, err)
			for i, it := range out {
				require.NoError(t, it.Err)
				require.True(t, it.Acquisition.Admitted)
				require.Equal(t, round == 1, it.Acquisition.Readmitted)
				require.Equal(t, want[i], it.Acquisition.PreviousOperation, "round %d item %d", round, i)
			}
		}

		// The earlier generation outlives retention while its successor holds the key, so the
		// retry can still name it: the purge keeps it until the successor ends.
		require.NoError(t, b.db.Exec("UPDATE operations SET ended_at = ? WHERE id = ?",
			time.Now().Add(-48*time.Hour), succ.OperationID).Error)
		short := NewReaper(b.db, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour)
		_, err := short.RunOnce(bg)
		require.NoError(t, err)
		again, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "rp:succeeded", TTLSeconds: 60, AttemptID: ptr("try-1")})
		require.NoError(t, err)
		require.True(t, again.Readmitted)
		require.NotNil(t, again.PreviousOperation, "purged under the retry")
		require.Equal(t, succ.OperationID, again.PreviousOperation.ID)
	})
}

// Issue 28 item 3: a batch that carries the same key and attempt_id twice admits the first item
// and answers the second as a duplicate naming it (docs/reference.md §9): two 201s would tell
// the caller to run the effect twice, and the second owner token would kill the first.
func TestBatchRepeatedAttemptIDIsADuplicate(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		in := AcquireInput{Key: "rb:twice", TTLSeconds: 60, AttemptID: ptr("same")}
		out, err := b.adm.AcquireBatch(bg, b.p, []AcquireInput{in, in})
		require.NoError(t, err)
		require.NoError(t, out[0].Err)
		require.NoError(t, out[1].Err)
		first, second := out[0].Acquisition, out[1].Acquisition
		require.True(t, first.Admitted)
		require.False(t, second.Admitted, "the repeat inside the batch is a duplicate")
		require.Empty(t, second.OwnerToken)
		require.Equal(t, first.OperationID, second.Operation.ID)
		// The first item's owner token is the live one.
		mustRecord(t, b, first, OutcomeInput{Status: StateSucceeded})

		page, err := b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Key: "rb:twice"})
		require.NoError(t, err)
		var got []string
		for _, a := range page.Items {
			got = append(got, a.Result+":"+deref(a.AttemptID))
		}
		// The repeat is logged as what it was decided as: the request without its attempt_id.
		require.Equal(t, []string{"duplicate:", "admitted:same"}, got)
	})
}
