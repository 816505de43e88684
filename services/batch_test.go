package services

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
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
			{Key: "new-2", TTLSeconds: 60, AttemptID: ptr("att")},     // alone, its attempt_id retry: admitted again
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
		require.Equal(t, answer{"readmitted", 1, StateInProgress}, singles[9])
		// In one batch the same key and attempt_id again is a repeat, not a retry of a lost
		// answer: a duplicate of the item before (docs/reference.md §9; issue 28 item 3).
		singles[9] = answer{"duplicate", 1, StateInProgress}
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
			"invalid", "admitted", "duplicate"}, kinds)
		require.Equal(t, items[0].Acquisition.OperationID, items[1].Acquisition.Operation.ID, "the second item sees the first")
		require.Equal(t, items[8].Acquisition.OperationID, items[9].Acquisition.Operation.ID)
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

// TestAcquireBatchOfNewKeysReadsNothing checks that a batch of new keys only writes, as a
// single new-key acquire does: it must not read operations or attempts back. It used to join
// operations to return the new rows, and PL/pgSQL planned that join once per connection,
// while the table was small, as a sequential scan, then kept the plan as the table grew: group
// admission fell to a quarter of its speed within a minute of load on a database without
// autovacuum (make bench). The transaction's own scan counters (pg_stat_xact_user_tables)
// show every read, whatever plan was chosen; eight rounds take PL/pgSQL past its five custom
// plans into the cached generic one.
func TestAcquireBatchOfNewKeysReadsNothing(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		conn, err := b.db.Pool.Acquire(bg)
		require.NoError(t, err)
		defer conn.Release()
		tx, err := conn.Begin(bg)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(bg) }()
		// The counters of a pooled connection may still hold its earlier transactions' scans
		// (they are flushed at most once a second), so only the difference counts.
		reads := func() map[string]int64 {
			got := map[string]int64{}
			rows, err := tx.Query(bg, `SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
				FROM pg_stat_xact_user_tables WHERE relname IN ('operations', 'attempts')`)
			require.NoError(t, err)
			for rows.Next() {
				var name string
				var n int64
				require.NoError(t, rows.Scan(&name, &n))
				got[name] = n
			}
			require.NoError(t, rows.Err())
			return got
		}
		before := reads()
		for round := 0; round < 8; round++ {
			var as []acquireArgs
			for i := 0; i < 5; i++ {
				in := AcquireInput{Key: fmt.Sprintf("reads-%d-%d", round, i), TTLSeconds: 60}
				as = append(as, acquireArgs{p: b.p, in: in, opID: uuid.NewString(), ownerHash: "h"})
			}
			rows, err := tx.Query(bg, acquireBatchSQL, batchArgs(as, "")...)
			require.NoError(t, err)
			admitted := 0
			for rows.Next() {
				vals, err := rows.Values()
				require.NoError(t, err)
				if vals[1] == ResultAdmitted {
					admitted++
				}
			}
			require.NoError(t, rows.Err())
			require.Equal(t, len(as), admitted, "round %d", round)
		}
		after := reads()
		for _, tbl := range []string{"operations", "attempts"} {
			require.Equal(t, before[tbl], after[tbl], "scans of %s during 8 batches of 5 new keys", tbl)
		}
	})
}

// TestAcquireBatchCountsDuplicatesAsSingles: duplicates and conflicts decided together in a
// batch (PostgreSQL decides a live hold's items set-based) carry the counters their single
// acquires would have, item by item, and leave the same totals on the operation. Each key
// space starts with a held key that already has a duplicate and a conflict counted.
func TestAcquireBatchCountsDuplicatesAsSingles(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		for _, space := range []string{"s-", "b-"} {
			_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: space + "hot", TTLSeconds: 600, AttemptID: ptr("creator")})
			require.NoError(t, err)
			_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: space + "hot", TTLSeconds: 600})
			require.NoError(t, err)
			_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: space + "hot", TTLSeconds: 600, Operation: ptr("other")})
			require.ErrorIs(t, err, ErrFingerprintMismatch)
		}
		seq := []AcquireInput{
			{Key: "hot", TTLSeconds: 60},
			{Key: "fresh", TTLSeconds: 60},
			{Key: "hot", TTLSeconds: 60, Fingerprint: ptr("f")}, // conflict
			{Key: "hot", TTLSeconds: 60},
			{Key: "fresh", TTLSeconds: 60},                          // duplicate of the item before
			{Key: "hot", TTLSeconds: 60, AttemptID: ptr("creator")}, // the creator's retry: admitted again
			{Key: "fresh", TTLSeconds: 60, Operation: ptr("x")},     // conflict
			{Key: "hot", TTLSeconds: 60, AttemptID: ptr("someone-else")},
			{Key: "fresh", TTLSeconds: 60},
		}
		type answer struct {
			Kind       string
			Duplicates int64
			Conflicts  int64
		}
		run := func(acq *Acquisition, err error) answer {
			switch {
			case errors.Is(err, ErrFingerprintMismatch):
				return answer{Kind: "conflict"}
			case err != nil:
				return answer{Kind: "error " + err.Error()}
			case acq.Admitted && acq.Readmitted:
				return answer{Kind: "readmitted"}
			case acq.Admitted:
				return answer{Kind: "admitted"}
			}
			return answer{"duplicate", acq.Operation.DuplicateAttempts, acq.Operation.ConflictAttempts}
		}
		var singles, batched []answer
		batch := make([]AcquireInput, len(seq))
		for i, in := range seq {
			s := in
			s.Key = "s-" + in.Key
			singles = append(singles, run(b.adm.Acquire(bg, b.p, s)))
			batch[i] = in
			batch[i].Key = "b-" + in.Key
		}
		items, err := b.adm.AcquireBatch(bg, b.p, batch)
		require.NoError(t, err)
		for _, it := range items {
			batched = append(batched, run(it.Acquisition, it.Err))
		}
		require.Equal(t, singles, batched)
		require.Equal(t, answer{"duplicate", 4, 2}, batched[7], "the hot key's last duplicate counts every earlier one")
		for _, key := range []string{"hot", "fresh"} {
			s, err := b.reads.GetKey(bg, b.p.TenantID, "s-"+key)
			require.NoError(t, err)
			bk, err := b.reads.GetKey(bg, b.p.TenantID, "b-"+key)
			require.NoError(t, err)
			require.Equal(t, s.Operation.DuplicateAttempts, bk.Operation.DuplicateAttempts, key)
			require.Equal(t, s.Operation.ConflictAttempts, bk.Operation.ConflictAttempts, key)
		}
	})
}

// TestAcquireBatchStormReadsEachHolderOnce: a batch of 20 duplicates of one held key (a retry
// storm as group admission gathers it) reads the key and its holder once, not once per item:
// the pre-release batch function decided each item through idemgate_acquire, six statements apiece, and
// scanned idem_keys 488 times in these 8 batches (16 now, operations 8). Eight rounds take
// PL/pgSQL past its five custom plans into the cached generic one.
func TestAcquireBatchStormReadsEachHolderOnce(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		mustAcquire(t, b, "storm", 600)
		conn, err := b.db.Pool.Acquire(bg)
		require.NoError(t, err)
		defer conn.Release()
		tx, err := conn.Begin(bg)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(bg) }()
		scans := func() map[string]int64 {
			got := map[string]int64{}
			rows, err := tx.Query(bg, `SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0)
				FROM pg_stat_xact_user_tables WHERE relname IN ('idem_keys', 'operations')`)
			require.NoError(t, err)
			for rows.Next() {
				var name string
				var n int64
				require.NoError(t, rows.Scan(&name, &n))
				got[name] = n
			}
			require.NoError(t, rows.Err())
			return got
		}
		const rounds, items = 8, 20
		before := scans()
		for round := 0; round < rounds; round++ {
			var as []acquireArgs
			for i := 0; i < items; i++ {
				as = append(as, acquireArgs{p: b.p, in: AcquireInput{Key: "storm", TTLSeconds: 60}, opID: uuid.NewString(), ownerHash: "h"})
			}
			rows, err := tx.Query(bg, acquireBatchSQL, batchArgs(as, "")...)
			require.NoError(t, err)
			dups := 0
			for rows.Next() {
				vals, err := rows.Values()
				require.NoError(t, err)
				if vals[1] == ResultDuplicate {
					dups++
				}
			}
			require.NoError(t, rows.Err())
			require.Equal(t, items, dups, "round %d", round)
		}
		after := scans()
		for _, tbl := range []string{"idem_keys", "operations"} {
			// Per round: the key's first-item insert finds it (no scan counted) and one lookup
			// reads the key by its unique index and the holder by its primary key.
			require.LessOrEqual(t, after[tbl]-before[tbl], int64(2*rounds), "scans of %s during %d batches of %d duplicates", tbl, rounds, items)
		}
	})
}
